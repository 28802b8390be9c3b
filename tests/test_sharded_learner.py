"""The learner on several FSDP2 ranks (``train.world_size``, ``actions/rl/sharded_train.py``):
the same update as one rank within float round-off, a rank-independent store format, one
classified error when a rank fails."""

from __future__ import annotations

import json
import os

import pytest
import rank_functions
import torch

from actions.rl.ranks import RankFailed, run_on_ranks
from actions.rl.sharded_update import Job, rank_share
from actions.rl.world_size import check_world_size, resolve_world_size
from actions.store import open_store
from actions.store.weights import load_tensors
from flows.campaign.run import run_campaign
from flows.campaign.state import load_state_at

LOSS_RTOL = 1e-6
WEIGHT_ATOL = 1e-5


def _tensors_at(cfg, step: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(policy weights, optimizer state) committed at ``step``."""
    store = open_store(cfg.store.uri)
    state = load_state_at(store, cfg.resolved_run_id(), step)
    assert state is not None, f"no commit at step {step}"
    return load_tensors(store, state.policy_key)[0], load_tensors(store, state.optimizer_key)[0]


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str) -> float:
    assert a.keys() == b.keys(), what
    worst = 0.0
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, (what, name)
        if a[name].is_floating_point():
            worst = max(worst, float((a[name].double() - b[name].double()).abs().max()))
        else:
            assert torch.equal(a[name], b[name]), (what, name)
    assert worst <= WEIGHT_ATOL, f"{what}: largest difference {worst:.3g} > {WEIGHT_ATOL}"
    return worst


def test_two_ranks_train_as_one_and_a_run_resumes_on_another_rank_count(tiny_config, prefect_harness):
    """Steps 1-2 on two gloo ranks, step 3 resumed on one, against three steps on one rank: every
    step's loss within 1e-6 relative, every weight and optimizer moment within 1e-5 after each.
    The reward (completion length) varies within every group, so every step has a gradient."""
    base = ("invoker.kind=inprocess", "algorithm.lr=0.003", "store.keep_last=null",
            "reward.functions=[{name: 'trl_doc_reward_len:reward_func', weight: 0.1}]")
    one = tiny_config(*base, "run_id=one", "steps=3")
    ref = run_campaign(one, progress=lambda m: None)
    two = tiny_config(*base, "run_id=two", "steps=2", "train.world_size=2")
    first = run_campaign(two, progress=lambda m: None)
    assert [s["train/world_size"] for s in first["steps"]] == [2.0, 2.0]
    rest = run_campaign(tiny_config(*base, "run_id=two", "steps=3", "train.world_size=1"), resume=True,
                        progress=lambda m: None)
    assert rest["steps"][2]["train/world_size"] == 1.0
    store = open_store(two.store.uri)
    for step, (policy_at, optimizer_at) in enumerate([(0, None), (1, 1)]):  # what step n+1 read: commit n's
        at = load_state_at(store, two.resolved_run_id(), policy_at)
        keys = [at.policy_key] + ([at.optimizer_key] if optimizer_at is not None else [])
        stored = sum(e["size"] for k in keys for e in json.loads(store.get(k))["files"].values())
        assert first["steps"][step]["train/state_read_bytes"] == stored, step  # each blob once, by one rank
        assert first["steps"][step]["train/load_s"] > 0 and first["steps"][step]["train/gather_s"] > 0
        assert 0.001 < first["steps"][step]["train/spawn_s"] < first["steps"][step]["timing_s/train"], step
    for step in range(3):
        a, b = ref["steps"][step], rest["steps"][step]
        assert a["grad_norm"] > 0.01 and a["loss/policy"] != 0.0, (step, a)
        for key in ("loss/policy", "grad_norm", "entropy", "reward/mean"):
            assert b[key] == pytest.approx(a[key], rel=LOSS_RTOL, abs=1e-9), (step, key)
    after_first = _tensors_at(one, 1)[0]
    for step in (1, 2, 3):  # commit n holds the state after n steps
        (w1, o1), (w2, o2) = _tensors_at(one, step), _tensors_at(two, step)
        _assert_close(w1, w2, f"weights after step {step}")
        _assert_close(o1, o2, f"optimizer state after step {step}")
    moved = max(float((w1[k] - after_first[k]).abs().max()) for k in w1 if w1[k].is_floating_point())
    assert moved > 100 * WEIGHT_ATOL  # the tolerance is far below what two updates change


def test_rank_share_gives_every_rank_the_same_number_of_calls():
    jobs = [Job((i,), 1.0) for i in range(5)]
    shares = [rank_share(jobs, r, 2) for r in range(2)]
    assert [len(s) for s in shares] == [3, 3]
    assert sorted(j.rows for s in shares for j in s if j.weight_scale) == [(i,) for i in range(5)]
    assert [j.weight_scale for j in shares[1]] == [1.0, 1.0, 0.0]
    assert [len(rank_share(jobs[:1], r, 3)) for r in range(3)] == [1, 1, 1]


def test_a_rows_lora_dropout_masks_depend_on_the_step_and_the_row_only():
    """What makes LoRA dropout shard exactly: the one-rank pass's micro batches and the sharded
    pass's jobs, run in another order (as a rank runs its share), give every row the same
    log-probs bit for bit; another step's key draws other masks."""
    from test_learner_fidelity import _gpt2

    from actions.config.workload import AlgorithmConfig, LoraConfig
    from actions.models.lora import attach_adapter
    from actions.rl.batch import TrainBatch
    from actions.rl.sequences import pack, per_row_widths, response_logprobs
    from actions.rl.sharded_update import policy_jobs
    from actions.rl.update import call_masks, micro_batches, policy_logprobs

    algo = AlgorithmConfig(name="grpo", batch_size=8, group_size=2, num_minibatches=1, micro_batch_size=4)
    model = attach_adapter(_gpt2(), LoraConfig(r=2, alpha=4, dropout=0.5, target_modules=["c_attn"]), None)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # 0 at init, where no mask changes a log-prob
            torch.nn.init.normal_(p, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 64, (2 + i,), generator=g).tolist() for i in range(8)]
    responses = [torch.randint(2, 64, (n,), generator=g).tolist() for n in (3, 20, 5, 30, 2, 18, 7, 25)]
    batch = TrainBatch(pack(prompts, responses, 0), None, None, torch.zeros(8), None, ["stop"] * 8, prompts,
                       responses, 0)
    model.train()
    idx = torch.tensor([5, 0, 7, 2, 1, 6, 3, 4])
    with torch.no_grad():
        one = torch.zeros(batch.packed.response_mask.shape)
        for mb in micro_batches(idx, algo):
            one[mb] = policy_logprobs(model, batch, mb, masks=11)[0]
        jobs = policy_jobs(batch, idx, algo, None)
        assert len(jobs) > len(micro_batches(idx, algo))  # calls of several widths in a micro batch
        shared = torch.zeros_like(one)
        for job in reversed(jobs):
            rows = list(job.rows)
            (out,), _ = per_row_widths([lambda b: response_logprobs(model, b)], [batch.prompts[i] for i in rows],
                                       [batch.responses[i] for i in rows], 0,
                                       each_call=call_masks(11, rows, torch.device("cpu")))
            width = min(out.shape[1], one.shape[1])
            shared[rows, :width] = out[:, :width]
        other = torch.zeros_like(one)
        other[idx] = policy_logprobs(model, batch, idx, masks=12)[0]
    mask = batch.packed.response_mask.bool()
    assert torch.equal(shared[mask], one[mask])
    assert not torch.equal(other[mask], one[mask])  # the masks are live, and keyed on the step


def test_world_size_defaults_and_refusals():
    assert resolve_world_size(None, 4, "cuda") == 4 and resolve_world_size(None, 4, "cpu") == 1
    assert resolve_world_size(2, 4, "cuda") == 2
    with pytest.raises(ValueError, match=r"train.world_size=4096 needs 4096 processors.*at most"):
        check_world_size(4096, 1, "cpu")
    with pytest.raises(ValueError, match=r"scaling.gpus_per_actor \(train.world_size unset\)=64 needs 64 CUDA"):
        check_world_size(None, 64, "cuda")


def test_cpu_ranks_beyond_invoker_num_cores_are_refused_naming_both_settings(monkeypatch):
    """``invoker.num_cores`` is what the local actions share: more CPU ranks than that would
    oversubscribe it (each rank a process, with a thread at least), however many processors
    the machine has; 0 leaves the processors alone to limit them, and CUDA ranks ignore it."""
    import actions.rl.world_size as world_size

    monkeypatch.setattr(world_size, "devices_present", lambda kind: 8)  # this machine: 8 processors, 8 GPUs
    with pytest.raises(ValueError, match=r"^train.world_size=4 needs 4 cores \(one gloo rank each\), but "
                                         r"invoker.num_cores=2 gives the actions 2; set train.world_size to at most "
                                         r"2, or invoker.num_cores to 4 or more \(this machine has 8\)$"):
        check_world_size(4, 1, "cpu", num_cores=2)
    # more ranks than the machine has, too: the cores setting is the one to lower
    with pytest.raises(ValueError, match=r"^train.world_size=12 needs 12 cores .* at most 10$"):
        check_world_size(12, 1, "cpu", num_cores=10)
    assert check_world_size(4, 1, "cpu", num_cores=4) == check_world_size(4, 1, "cpu", num_cores=0) == 4
    assert check_world_size(4, 4, "cuda", num_cores=2) == 4


def _rank_processes() -> list[int]:
    """Live processes of this one's that run a rank."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if ppid == os.getpid() and b"actions.rl.ranks" in cmd:
            found.append(int(pid))
    return found


def test_stored_state_is_read_once_and_each_rank_gets_its_shard(tmp_path):
    """``state_scatter.scattered`` on 3 ranks gives each rank the shard ``distribute_tensor``
    gives (even, uneven, empty, replicated), the whole tensor of an unsharded parameter or of
    none, and the meta's scalars; and the ranks together fetch every blob exactly once."""
    failed, fetched = run_on_ranks(rank_functions.scattered_state_reads, 3, (str(tmp_path / "store"),))
    assert failed == []
    manifest = open_store(str(tmp_path / "store")).get("opt/manifest.json")
    sizes = [entry["size"] for entry in json.loads(manifest)["files"].values()]
    assert sum(fetched) == sum(sizes), (fetched, sizes)  # each blob once, by its owner
    assert all(0 < count < sum(sizes) for count in fetched), fetched


def test_blobs_are_dealt_out_to_owners_by_size(tmp_path):
    """Owners get near equal bytes where a few tensors hold most of them (an embedding beside
    norms): largest first, each to the least-loaded rank; every rank owns some bytes."""
    from actions.rl.state_scatter import owners
    from actions.store.weights import StoredTensors, publish_tensors

    store = open_store(str(tmp_path / "store"))
    sizes = {"embed": 1000, "head": 700, "q": 300, "k": 300, "norm1": 8, "norm2": 8, "norm3": 8}
    publish_tensors(store, "w/manifest.json", {n: torch.zeros(k) for n, k in sizes.items()})
    state = StoredTensors(store, "w/manifest.json")
    got = owners(state, list(state), 3)
    assert got == {"embed": 0, "head": 1, "q": 2, "k": 2, "norm1": 2, "norm2": 2, "norm3": 2}, got
    load = [sum(state.size(n) for n, r in got.items() if r == rank) for rank in range(3)]
    assert max(load) - min(load) <= max(state.size(n) for n in got), load
    assert owners(state, list(state), 3) == got and set(owners(state, list(state), 9).values()) == set(range(7))


def test_the_weights_every_rank_builds_are_read_from_the_store_once(tmp_path):
    """The ranks' reader of the policy (and its backbone, adapter, critic) gives every rank
    every tensor whole, in its dtype, on the host, while the ranks together fetch each blob
    once; a fingerprint the set does not have is refused on every rank."""
    failed, fetched = run_on_ranks(rank_functions.weights_read_once, 3, (str(tmp_path / "store"),))
    assert failed == []
    manifest = json.loads(open_store(str(tmp_path / "store")).get("policy/manifest.json"))
    sizes = [entry["size"] for entry in manifest["files"].values()]
    assert sum(fetched) == sum(sizes), (fetched, sizes)
    assert all(0 < count < sum(sizes) for count in fetched), fetched


def test_ranks_that_opened_different_sets_all_refuse_before_any_tensor(tmp_path):
    """A set re-published between two ranks' reads of its manifest: every rank raises the same
    IntegrityError (naming both fingerprints), none waits in a collective."""
    with pytest.raises(RankFailed) as info:
        run_on_ranks(rank_functions.reopened_set_is_refused, 3, (str(tmp_path / "store"),))
    text = str(info.value)
    assert "IntegrityError" in text and "re-published while the step read it" in text, text
    assert "rank 0 opened weights_sha256" in text and "rank 1 " in text, text


@pytest.mark.parametrize("how, error", [("corrupt", "IntegrityError: blob"), ("shape", "ValueError: optimizer state")])
def test_a_tensor_its_owner_cannot_read_fails_every_rank_with_the_owners_error(tmp_path, how, error):
    """A blob that fails its sha256, or has another shape than its parameter, on the rank that
    owns it: every rank stops (none waits in a collective), and the error raised is the owner's."""
    with pytest.raises(RankFailed) as info:
        run_on_ranks(rank_functions.scattered_read_fails, 2, (str(tmp_path / "store"), how))
    text = str(info.value)
    assert text.startswith("rank 1 of 2 failed: ") and error in text and "read by rank" not in text, text
    peer = json.loads((tmp_path / "store" / "peer.json").read_text())  # rank 0 was told, not left waiting
    assert peer["rank"] == 0 and peer["transient"] is False, peer
    assert peer["text"] == f"{text.removeprefix('rank 1 of 2 failed: ')} (read by rank 1)", peer


def test_spawn_seconds_is_how_long_starting_the_ranks_took():
    """``spawn_seconds`` inside a rank: from the supervisor starting the processes to that rank
    joining the group (a fresh interpreter importing torch: well above a millisecond), within
    the supervisor's own wall time; 0 outside a rank."""
    import time

    from actions.rl.ranks import spawn_seconds

    t0 = time.time()
    seen = run_on_ranks(rank_functions.spawn_times, 2)
    wall = time.time() - t0
    assert len(seen) == 2 and all(0.001 < s < wall for s in seen), (seen, wall)
    assert spawn_seconds() == 0.0


def test_a_failing_rank_fails_the_activation_once_and_stops_the_others():
    assert run_on_ranks(rank_functions.sum_of_ranks, 2) == 1.0
    with pytest.raises(RankFailed, match=r"^rank 1 of 2 failed: ValueError: bad shard$") as err:
        run_on_ranks(rank_functions.raise_on_rank_one, 2)
    assert err.value.transient is False
    with pytest.raises(RankFailed, match=r"^rank 1 of 2 killed by SIGKILL; the other ranks were stopped$") as err:
        run_on_ranks(rank_functions.killed_on_rank_one, 2)
    assert err.value.transient is True
    assert _rank_processes() == []  # no rank left running


@pytest.mark.slow
@pytest.mark.parametrize("extra", [("algorithm.name=ppo",), ("model.lora={r: 4, alpha: 8}",), ("model.dtype=bfloat16",),
                                   ("algorithm.loss_agg=seq_mean_token_sum_norm", "algorithm.micro_batch_size=4",
                                    "algorithm.mask_truncated=true"),
                                   ("algorithm.mask_truncated=true", "algorithm.micro_batch_size=4")],
                         ids=["ppo", "lora", "bf16", "dr_grpo", "masked"])
def test_two_ranks_train_ppo_lora_and_bf16_as_one(tiny_config, prefect_harness, extra):
    """One step on two ranks against one rank: PPO (the critic sharded too), LoRA (only the adapter
    sharded and trained), bf16 (fp32 shards as the master copy; weights within a bf16 spacing),
    Dr. GRPO's reduction over micro batches with truncated rows masked (each rank's jobs weighted by their
    share of rows), and the token mean with them masked (by their share of the counted tokens)."""
    base = ("invoker.kind=inprocess", "algorithm.lr=0.003", "steps=1",
            "reward.functions=[{name: 'trl_doc_reward_len:reward_func', weight: 0.1}]", *extra)
    runs = {ws: tiny_config(*base, f"run_id=w{ws}", f"train.world_size={ws}") for ws in (1, 2)}
    summaries = {ws: run_campaign(cfg, progress=lambda m: None)["steps"][0] for ws, cfg in runs.items()}
    assert summaries[2]["train/world_size"] == 2.0 and summaries[1]["grad_norm"] > 0.01
    if "ppo" in extra[0]:  # the same columns on any number of ranks: a first step kept nothing warm
        assert summaries[1]["train/reused_critic_state"] == summaries[2]["train/reused_critic_state"] == 0.0
    for key in ("loss/policy", "grad_norm", "entropy", "clipfrac") + (("loss/value",) if "ppo" in extra[0] else ()):
        assert summaries[2][key] == pytest.approx(summaries[1][key], rel=LOSS_RTOL, abs=1e-9), key
    if "algorithm.mask_truncated=true" in extra:  # rows to mask: the case tests the ranks' token weights
        assert summaries[1]["response_length/clip_ratio"] > 0
    (w1, o1), (w2, o2) = _tensors_at(runs[1], 1), _tensors_at(runs[2], 1)
    _assert_close(w1, w2, "weights")
    _assert_close(o1, o2, "optimizer state")
    if "lora" in extra[0]:
        assert all("lora_" in name for name in w1)  # the version is the adapter alone
    store = open_store(runs[2].store.uri)  # the ranks read the first version (and critic) once among them
    at = load_state_at(store, runs[2].resolved_run_id(), 0)
    keys = [k for k in (at.policy_key, at.critic_key) if k]
    stored = sum(e["size"] for k in keys for e in json.loads(store.get(k))["files"].values())
    assert summaries[2]["train/state_read_bytes"] == stored


@pytest.mark.slow
def test_a_bf16_step_on_two_ranks_reads_the_fp32_masters_of_the_last(tiny_config, prefect_harness):
    """bf16, step 1 on one rank, step 2 resumed on two, against two steps on one: step 2's
    ranks read step 1's optimizer state one tensor at a time and put each fp32 master copy
    into their shards (``fsdp.assign``). Masters rebuilt from the bf16 weights instead would
    lose what the first update added below a bf16 spacing, and step 2's state would differ."""
    base = ("invoker.kind=inprocess", "algorithm.lr=0.003", "store.keep_last=null", "model.dtype=bfloat16",
            "reward.functions=[{name: 'trl_doc_reward_len:reward_func', weight: 0.1}]")
    one = tiny_config(*base, "run_id=one", "steps=2")
    ref = run_campaign(one, progress=lambda m: None)
    run_campaign(tiny_config(*base, "run_id=two", "steps=1"), progress=lambda m: None)
    rest = run_campaign(tiny_config(*base, "run_id=two", "steps=2", "train.world_size=2"), resume=True,
                        progress=lambda m: None)
    assert rest["steps"][1]["train/world_size"] == 2.0
    for key in ("loss/policy", "grad_norm", "entropy"):
        assert rest["steps"][1][key] == pytest.approx(ref["steps"][1][key], rel=LOSS_RTOL, abs=1e-9), key
    (w1, o1), (w2, o2) = _tensors_at(one, 2), _tensors_at(tiny_config(*base, "run_id=two"), 2)
    assert any(name.endswith(".master") for name in o1)
    _assert_close(w1, w2, "weights after step 2")
    worst = _assert_close(o1, o2, "optimizer state after step 2")
    assert worst < 1e-6  # fp32 masters and moments, not values rounded through bf16


@pytest.mark.slow
def test_two_ranks_and_a_resume_draw_the_one_rank_lora_dropout_masks(tiny_config, prefect_harness):
    """LoRA dropout, micro batches of 2 rows dealt out to two ranks: each row's masks are seeded
    by the step and the row (``dropout.seeded_masks``), not by how many calls ran before it on
    its rank, so two ranks make the one-rank update (they differed by ~1e-2 when every rank drew
    its masks from one generator seeded per step), and a run stopped after step 1 and resumed
    ends where an uninterrupted one does."""
    base = ("invoker.kind=inprocess", "algorithm.lr=0.003", "algorithm.micro_batch_size=2", "store.keep_last=null",
            "model.lora={r: 4, alpha: 8, dropout: 0.3}",
            "reward.functions=[{name: 'trl_doc_reward_len:reward_func', weight: 0.1}]")
    one = tiny_config(*base, "run_id=d1", "steps=2")
    ref = run_campaign(one, progress=lambda m: None)["steps"]
    two = tiny_config(*base, "run_id=d2", "steps=1", "train.world_size=2")
    run_campaign(two, progress=lambda m: None)
    rest = run_campaign(tiny_config(*base, "run_id=d2", "steps=2", "train.world_size=2"), resume=True,
                        progress=lambda m: None)["steps"]
    assert rest[1]["train/world_size"] == 2.0
    for a, b in zip(ref, rest, strict=True):
        assert a["grad_norm"] > 0.01
        for key in ("loss/policy", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=LOSS_RTOL, abs=1e-9), (a["step"], key)
    for step in (1, 2):
        _assert_close(_tensors_at(one, step)[0], _tensors_at(two, step)[0], f"weights after step {step}")


def test_only_the_publishing_rank_keeps_host_copies_and_every_rank_gathers(monkeypatch):
    """Every rank enters each gather (a collective: a rank that skipped one would hang the
    others), and only rank 0, which publishes, keeps the whole tensors on the host."""
    from actions.rl import sharded_train

    calls = []
    monkeypatch.setattr(sharded_train, "full", lambda t: calls.append(t) or t)
    tensors = {"w": torch.randn(4, 3), "ids": torch.arange(5)}
    kept = sharded_train._gathered(tensors, {"w": torch.bfloat16}, keep=True)
    assert len(calls) == 2 and kept["w"].dtype == torch.bfloat16 and torch.equal(kept["ids"], tensors["ids"])
    assert sharded_train._gathered(tensors, {"w": torch.bfloat16}, keep=False) == {} and len(calls) == 4


def test_the_start_up_check_refuses_cpu_ranks_beyond_invoker_num_cores(tmp_path, monkeypatch):
    """``train`` checks ``train.world_size`` against ``invoker.num_cores`` before any write."""
    import actions.rl.world_size as world_size
    from flows.campaign.preflight import check_campaign
    from flows.config import load_config

    monkeypatch.setattr(world_size, "devices_present", lambda kind: 8)
    cfg = load_config(None, ["train.world_size=2", "invoker.num_cores=1", "invoker.kind=inprocess",
                             f"store.uri={tmp_path / 'store'}", "model.hidden_size=32", "model.num_heads=2",
                             "model.intermediate_size=64"])
    with pytest.raises(ValueError, match=r"^train.world_size=2 needs 2 cores .* invoker.num_cores=1"):
        check_campaign(cfg)
    assert not (tmp_path / "store").exists()
