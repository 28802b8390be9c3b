"""Memory-bounded log-probs and updates: chunked output head, micro-batch accumulation, the
one-pass shortcut, fp32 master weights under bf16, gradient checkpointing."""

from __future__ import annotations

import copy

import pytest
import torch

from actions.config.workload import AlgorithmConfig
from actions.models.modeling import instantiate, read_model_dir
from actions.rl.batch import TrainBatch
from actions.rl.critic import build_critic
from actions.rl.optimizer import TrainOptimizer
from actions.rl.recompute import enable_checkpointing
from actions.rl.sequences import (
    MIN_CHUNK_TOKENS,
    chunk_bounds,
    pack,
    per_row_widths,
    response_logprobs,
    response_logprobs_full,
)
from actions.rl.update import needs_old_logp, needs_ref_logp, run_updates
from actions.store.weights import weights_sha256
from flows.commands.tiny_model_dir import write_tiny_model_dir

pytestmark = pytest.mark.usefixtures("one_thread")  # as an action runs (conftest)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """An untied tiny Qwen2 (fp32) and random prompt/response rows."""
    info = write_tiny_model_dir(tmp_path_factory.mktemp("m") / "q", "qwen2", tie_word_embeddings=False, seed=1)
    files, tensors = read_model_dir(info.path)
    return files, tensors, info


def _model(qwen, dtype=torch.float32):
    model, _ = instantiate(qwen[0], qwen[1])
    return model.to(dtype)


def _rows(n: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, 30, (n, 2), generator=g).tolist()
    return ([torch.randint(0, 500, (p,), generator=g).tolist() for p, _ in lens],
            [torch.randint(0, 500, (r,), generator=g).tolist() for _, r in lens])


def test_chunk_bounds_cover_every_token_once_without_short_chunks():
    for n in (1, 15, 16, 17, 31, 32, 33, 100, 1000):
        for step in (1, 7, 16, 40):
            bounds = chunk_bounds(n, step)
            assert [i for s, e in bounds for i in range(s, e)] == list(range(n))
            assert len(bounds) == 1 or min(e - s for s, e in bounds) >= MIN_CHUNK_TOKENS


def test_chunked_logprobs_match_the_full_vocabulary_path_and_do_not_depend_on_the_chunk(qwen):
    model = _model(qwen)
    prompts, responses = _rows(7)
    batch = pack(prompts, responses, 0)
    vocab = qwen[2].vocab_size
    with torch.no_grad():
        full_logp, full_ent = response_logprobs_full(model, batch, with_entropy=True)
        chunked = [response_logprobs(model, batch, with_entropy=True, chunk_elements=vocab * k)
                   for k in (1, 17, 40, 1 << 16)]
    for logp, ent in chunked:
        assert torch.equal(logp, chunked[-1][0]) and torch.equal(ent, chunked[-1][1])
    torch.testing.assert_close(chunked[-1][0], full_logp, atol=2e-6, rtol=0)
    torch.testing.assert_close(chunked[-1][1], full_ent, atol=5e-6, rtol=0)
    # Gradients through the checkpointed chunks equal the full path's to float tolerance.
    grads = []
    for fn in (lambda: response_logprobs(model, batch, chunk_elements=vocab * 20), lambda: response_logprobs_full(model, batch)):
        model.zero_grad()
        fn().sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4)


def _batch(model, prompts, responses, algo: AlgorithmConfig, *, with_old: bool = True) -> TrainBatch:
    """A training batch as gather_batch builds it, old/ref log-probs scored as the score action does."""
    packed = pack(prompts, responses, 0)
    T = packed.response_width
    with torch.no_grad():
        (old,), _ = per_row_widths([lambda b: response_logprobs(model, b)], prompts, responses, 0)
    old = old[:, :T] * packed.response_mask
    ref = old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(3)) * packed.response_mask
    rewards = torch.tensor([float(i % 3 == 0) for i in range(len(prompts))])
    values = (0.1 * torch.arange(T, dtype=torch.float32))[None].expand(len(prompts), T) * packed.response_mask
    return TrainBatch(packed, old if with_old else None, ref, rewards, values if algo.name == "ppo" else None,
                      ["stop"] * len(prompts), prompts, responses, 0, max_new_tokens=T + 3)


class _Recording(TrainOptimizer):
    """Keeps the accumulated gradients each optimizer step sees (Adam maps a near-zero gradient's
    round-off to a full-size step, so equal updates are checked on the gradients)."""

    def __init__(self, module, lr):
        super().__init__(module, lr)
        self.seen: list[list[torch.Tensor]] = []

    def step(self, max_grad_norm):
        self.seen.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in self.params])
        return super().step(max_grad_norm)


def _train(qwen, algo: AlgorithmConfig, *, with_old: bool = True, checkpointing: bool = False):
    torch.manual_seed(0)
    policy = _model(qwen)
    policy.train()
    if checkpointing:
        enable_checkpointing(policy)
    prompts, responses = _rows(algo.batch_size, seed=4)
    batch = _batch(policy, prompts, responses, algo, with_old=with_old)
    if algo.mask_truncated:  # some rows cut at the length limit, left out of the policy loss
        batch.finish_reasons[:] = ["length" if i % 3 == 0 else "stop" for i in range(len(prompts))]
    critic = critic_opt = None
    if algo.name == "ppo":
        critic = build_critic(copy.deepcopy(policy), None)
        critic_opt = _Recording(critic, algo.critic_lr)
    opt = _Recording(policy, algo.lr)
    metrics = run_updates(policy, opt, batch, algo, critic, critic_opt, seed=0, step=0)
    return policy.state_dict(), (opt, critic_opt), metrics


@pytest.mark.parametrize("name,loss_agg", [("grpo", "token_mean"), ("ppo", "token_mean"),
                                           ("grpo", "seq_mean_token_mean"), ("grpo", "seq_mean_token_sum_norm"),
                                           ("ppo", "seq_mean_token_mean"), ("grpo", "mask_truncated"),
                                           ("grpo", "seq_mean_token_mean+mask_truncated")])
def test_micro_batches_give_the_unsplit_update(qwen, name, loss_agg):
    """Micro batches weighted by their share (of the tokens, or of the rows for a per-sequence
    loss_agg) accumulate the mini-batch's gradient and its metrics."""
    mode = loss_agg.partition("mask_truncated")[0]
    base = dict(name=name, batch_size=16, group_size=4, num_minibatches=2, lr=1e-3, kl_coef=0.05,
                loss_agg=mode.rstrip("+") or "token_mean", mask_truncated=loss_agg.endswith("mask_truncated"),
                **({"critic_lr": 1e-3} if name == "ppo" else {}))
    _, whole, m_whole = _train(qwen, AlgorithmConfig(**base))
    _, split, m_split = _train(qwen, AlgorithmConfig(**base, micro_batch_size=2))
    for opt_whole, opt_split in zip(whole, split):
        if opt_whole is None:
            continue
        assert len(opt_whole.seen) == len(opt_split.seen) == 2  # one optimizer step per mini-batch
        for step_whole, step_split in zip(opt_whole.seen, opt_split.seen):
            assert max(float(g.abs().max()) for g in step_whole) > 1e-4  # a real gradient
            for g_whole, g_split in zip(step_whole, step_split):
                # fp32 round-off of a different summation order: gradients here are ~1e-3, a real
                # difference (a wrong token weight) is of their own size
                torch.testing.assert_close(g_split, g_whole, atol=1e-6, rtol=1e-4)
    for k in ("loss/policy", "entropy", "clipfrac", "ratio_mean", "grad_norm") + (
            ("loss/value",) if name == "ppo" else ("kl", "loss")):
        assert m_split[k] == pytest.approx(m_whole[k], rel=1e-4, abs=1e-6), k
    if name == "grpo" and mode.rstrip("+") in ("", "token_mean"):  # both token means, weighted alike
        assert m_whole["loss"] == pytest.approx(m_whole["loss/policy"] + 0.05 * m_whole["kl"], rel=1e-5)


def test_each_loss_agg_gives_its_own_gradient_and_the_same_token_metrics(qwen):
    """The reductions weigh the rows' tokens differently (the rows here have ragged lengths), so
    each one's first gradient differs from the others'; entropy is a token mean under all three."""
    base = dict(name="grpo", batch_size=16, group_size=4, num_minibatches=1, lr=1e-3, kl_coef=0.05)
    runs = {mode: _train(qwen, AlgorithmConfig(**base, loss_agg=mode))
            for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")}
    firsts = {mode: torch.cat([g.flatten() for g in opts[0].seen[0]]) for mode, (_, opts, _) in runs.items()}
    modes = list(firsts)
    for i, a in enumerate(modes):
        for b in modes[i + 1:]:
            assert (firsts[a] - firsts[b]).abs().max() > 1e-3 * firsts[a].abs().max(), (a, b)
    entropies = {mode: m["entropy"] for mode, (_, _, m) in runs.items()}
    assert len({round(v, 6) for v in entropies.values()}) == 1, entropies


def test_one_pass_shortcut_gives_the_same_weights_bit_for_bit(qwen):
    algo = AlgorithmConfig(name="grpo", batch_size=16, group_size=4, num_minibatches=1, epochs=1, lr=1e-3, kl_coef=0.05)
    assert not needs_old_logp(algo) and needs_ref_logp(algo)
    assert needs_old_logp(algo.model_copy(update={"num_minibatches": 2}))
    assert needs_old_logp(algo.model_copy(update={"epochs": 2})) and needs_old_logp(algo.model_copy(update={"name": "ppo"}))
    assert not needs_ref_logp(algo.model_copy(update={"kl_coef": 0.0}))
    scored, _, m1 = _train(qwen, algo, with_old=True)
    shortcut, _, m2 = _train(qwen, algo, with_old=False)
    assert weights_sha256(scored) == weights_sha256(shortcut)
    assert m1["ratio_mean"] == m2["ratio_mean"] == 1.0
    with pytest.raises(ValueError, match="no old_logp"):
        _train(qwen, algo.model_copy(update={"num_minibatches": 2}), with_old=False)


def test_gradient_checkpointing_gives_the_same_weights(qwen):
    algo = AlgorithmConfig(name="grpo", batch_size=8, group_size=4, num_minibatches=1, lr=1e-3)
    plain, _, _ = _train(qwen, algo)
    checkpointed, _, _ = _train(qwen, algo, checkpointing=True)
    assert weights_sha256(plain) == weights_sha256(checkpointed)


def test_bf16_training_keeps_fp32_master_weights_that_accumulate_small_updates():
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8, bias=False).to(torch.bfloat16)
    start = layer.weight.detach().float().clone()
    opt = TrainOptimizer(layer, lr=1e-4)  # an Adam step of ~1e-4 is below bf16's spacing near 0.1-0.3
    assert opt.mixed
    for _ in range(30):
        opt.zero_grad()
        layer(torch.ones(1, 8, dtype=torch.bfloat16)).sum().backward()
        opt.step(max_grad_norm=10.0)
    state = opt.state_tensors()
    master = torch.stack([state["p0.master"]])[0]
    assert master.dtype == torch.float32 and state["p0.exp_avg"].dtype == torch.float32
    assert float((start - master).mean()) == pytest.approx(30 * 1e-4, rel=0.05)  # every step counted
    assert layer.weight.dtype == torch.bfloat16 and torch.equal(layer.weight, master.to(torch.bfloat16))
    # A resumed optimizer continues from the fp32 master copy, not from the rounded weights.
    again = TrainOptimizer(layer, lr=1e-4)
    again.load_state_tensors(state)
    assert torch.equal(again.master[0], master)
    # In fp32 there is no copy: the optimizer steps the parameters themselves.
    plain = TrainOptimizer(torch.nn.Linear(2, 2), lr=1e-3)
    assert not plain.mixed and not any(k.endswith(".master") for k in plain.state_tensors())


def test_optimizer_state_of_another_precision_or_incomplete_is_refused_naming_the_fix(tmp_path):
    """A run resumed where ``model.dtype: auto`` resolves otherwise (CUDA against the CPU) meets
    state of another precision: refused, never continued from masters rebuilt out of rounded
    weights; a parameter whose moments are missing is named, not a KeyError inside torch."""
    from actions.rl.sharded_train import _stored_state
    from actions.store import LocalStore
    from actions.store.weights import publish_tensors

    def trained(dtype: torch.dtype) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        layer = torch.nn.Linear(4, 4).to(dtype)
        opt = TrainOptimizer(layer, lr=1e-3)
        layer(torch.ones(1, 4, dtype=dtype)).sum().backward()
        opt.step(max_grad_norm=1.0)
        return opt.state_tensors()

    fp32, bf16 = trained(torch.float32), trained(torch.bfloat16)
    fresh = {dt: TrainOptimizer(torch.nn.Linear(4, 4).to(dt), lr=1e-3) for dt in (torch.float32, torch.bfloat16)}
    with pytest.raises(ValueError, match=r"optimizer state 'k' was written by a run training in float32 \(no fp32 "
                                         r"master weights\), and this learner trains in bfloat16; resume with the "
                                         r"precision the run started with \(model.dtype, or RLHFLESS_DTYPE"):
        fresh[torch.bfloat16].load_state_tensors(fp32, where="k")
    with pytest.raises(ValueError, match=r"training in low precision \(with fp32 master weights\), and this "
                                         r"learner trains in float32"):
        fresh[torch.float32].load_state_tensors(bf16, where="k")
    with pytest.raises(ValueError, match=r"master weights for 1 of 2 parameters"):
        fresh[torch.bfloat16].load_state_tensors({k: v for k, v in bf16.items() if k != "p1.master"}, where="k")
    store = LocalStore(str(tmp_path))
    publish_tensors(store, "k", fp32, scalars_in_meta=True)
    with pytest.raises(ValueError, match=r"'k' was written by a run training in float32"):
        _stored_state(store, "k", [torch.bfloat16, torch.bfloat16])  # the sharded learner, before reading
    with pytest.raises(ValueError, match=r"optimizer state 'k': parameter p0 has no exp_avg or exp_avg_sq"):
        fresh[torch.float32].load_state_tensors({k: v for k, v in fp32.items() if "exp_avg" not in k}, where="k")
    fresh[torch.float32].load_state_tensors(fp32, where="k")  # the same precision resumes
    fresh[torch.bfloat16].load_state_tensors(bf16, where="k")


@pytest.fixture(scope="module")
def prepared(qwen, tmp_path_factory):
    from actions.prepare import prepare
    from actions.store import LocalStore
    from flows.config import load_config
    from tests.conftest import TINY_OVERRIDES

    root = tmp_path_factory.mktemp("store")
    cfg = load_config(None, [*TINY_OVERRIDES, f"store.uri={root}", f"model.path={qwen[2].path}"])
    store = LocalStore(root)
    prepared = prepare(cfg, store, "runs/s")
    from actions.contracts import ModelRef

    ref = ModelRef(store_uri=store.uri, base_key=prepared.base_key, policy_key=prepared.init_key, policy_version=0)
    gen = _call("generate", {"model": ref.model_dump(), "dataset_key": prepared.train_key, "run_seed": 0, "step": 0,
                             "shard": "g", "prompt_ids": [0, 1, 2, 3], "group_size": 4, "max_new_tokens": 6,
                             "temperature": 1.0, "output_key": "runs/s/roll.json"})
    return cfg, store, prepared, ref, gen["rollout_key"]


def _call(name, payload):
    import importlib
    import json

    result = importlib.import_module(f"actions.{name}").main(json.loads(json.dumps(payload)))
    assert "error" not in result, result
    return result


def _score_train(prepared, score_algo: AlgorithmConfig, train_algo: AlgorithmConfig, tag: str, dtype: str = "auto",
                 optimizer_key: str | None = None):
    from actions.store.weights import load_tensors

    cfg, store, p, ref, rollout = prepared
    ref = ref.model_copy(update={"dtype": dtype})
    score = _call("score", {"policy": ref.model_dump(), "reference_key": p.init_key, "dataset_key": p.train_key,
                            "rollout_keys": [rollout], "rewards": [{"name": "repeat"}], "algorithm": score_algo.model_dump(),
                            "output_key": f"runs/s/{tag}/scored/manifest.json"})
    tensors, meta = load_tensors(store, score["scored_key"])
    if not tensors["rewards"].std():  # a random policy rarely solves the task: mixed rewards give a gradient
        from actions.store.weights import publish_tensors

        tensors["rewards"] = torch.tensor([1.0, 0.0] * 8)
        publish_tensors(store, score["scored_key"], tensors, meta)
    train = _call("train_step", {"policy": ref.model_dump(), "optimizer_key": optimizer_key,
                                 "scored_keys": [score["scored_key"]], "algorithm": train_algo.model_dump(),
                                 "seed": 0, "step": 0, "output_prefix": f"runs/s/{tag}/train"})
    return set(tensors), train


def test_score_runs_only_the_forwards_the_update_needs_and_the_shortcut_is_exact(prepared, monkeypatch):
    import actions.score
    from actions.models import warm
    from actions.store.weights import load_tensors

    from actions.engines.torch_slot import close_torch_slot

    loads: list[str] = []
    real_load = actions.score.load_model
    monkeypatch.setattr(actions.score, "load_model", lambda ref, **kw: loads.append(ref.policy_key) or real_load(ref, **kw))
    warm.clear()  # nothing left from the other tests: a skipped load is not a warm hit
    close_torch_slot()  # nor a version the generation slot holds (score would read it there)
    one_pass = AlgorithmConfig(batch_size=16, group_size=4, num_minibatches=1, kl_coef=0.0, lr=1e-3)
    scored_names, shortcut = _score_train(prepared, one_pass, one_pass, "a")
    assert scored_names == {"rewards"}  # neither the policy's nor the reference's log-probs
    assert loads == []  # and no model: the rewards and the token rows need the tokenizer only
    full_scoring = one_pass.model_copy(update={"num_minibatches": 2, "kl_coef": 0.01})
    scored_names, reference = _score_train(prepared, full_scoring, one_pass, "b")
    # the reference is the sampling version (both the init here): one model serves both
    assert scored_names == {"rewards", "old_logp", "ref_logp"} and len(loads) == 1
    assert shortcut["weights_sha256"] == reference["weights_sha256"]
    # The rows the update trains on are the same with and without a model loaded for scoring
    # (the special tokens read without weights: tests/test_hf_models.py).
    store = prepared[1]
    rows = [load_tensors(store, f"runs/s/{tag}/scored/manifest.json")[1]["samples"] for tag in ("a", "b")]
    assert rows[0] == rows[1] and len(rows[0]) == 16


def test_bf16_train_step_publishes_bf16_weights_and_fp32_master_state(prepared):
    from actions.store.weights import load_tensors

    _, store, _, _, _ = prepared
    algo = AlgorithmConfig(batch_size=16, group_size=4, num_minibatches=2, lr=1e-3)
    _, first = _score_train(prepared, algo, algo, "bf16", dtype="bfloat16")
    weights, _ = load_tensors(store, first["policy_key"])
    state, _ = load_tensors(store, first["optimizer_key"])
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    masters = {k: v for k, v in state.items() if k.endswith(".master")}
    assert masters and {v.dtype for v in masters.values()} == {torch.float32}
    assert {state[k].dtype for k in state if k.endswith(".exp_avg")} == {torch.float32}
    embed = weights["model.embed_tokens.weight"]
    assert any(torch.equal(m.to(torch.bfloat16), embed) and not torch.equal(m, embed.float())
               for m in masters.values() if m.shape == embed.shape)  # published = the rounded master copy
