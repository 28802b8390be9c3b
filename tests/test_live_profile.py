"""The live planner's measured profile: the profile action's cache in the store, its rejection
of a corrupt entry, and the hook planning from what was measured (flows/campaign/live_profile.py)."""

from __future__ import annotations

import json

import pytest

from actions.contracts import PromptTokens, parse_result
from actions.store.profile_cache import PROFILE_PREFIX, ProfileResult
from flows.campaign.live_profile import LiveInputs, finish_profiling, profile_grid
from flows.planning.tpot import TpotProfile
from flows.step.invoke import Returned

GRID = {"batch_sizes": [1, 2], "contexts": [4, 8], "prefill_shape": [2, 4]}


@pytest.fixture
def published(tmp_path):
    """A store holding a tiny model's base files and weights: (store, ModelRef payload)."""
    from actions.models.modeling import base_files, build_tiny_model
    from actions.store import LocalStore, put_artifact
    from actions.store.weights import publish_tensors

    store = LocalStore(str(tmp_path / "store"))
    model, tok = build_tiny_model(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                                  max_positions=64, seed=0)
    put_artifact(store, "runs/r/base/manifest.json", base_files(model, tok))
    publish_tensors(store, "runs/r/init/manifest.json", model.state_dict())
    ref = {"store_uri": store.uri, "base_key": "runs/r/base/manifest.json",
           "policy_key": "runs/r/init/manifest.json", "policy_version": 0}
    return store, ref


def _profile(ref: dict, **extra) -> dict:
    from actions.profile import main

    out = main(json.loads(json.dumps({"model": ref, **GRID, **extra})))
    assert "error" not in out, out
    return out


def test_second_start_reuses_the_cached_profile_and_other_facts_measure_anew(published, monkeypatch):
    store, ref = published
    monkeypatch.setenv("RLHFLESS_THREADS", "1")
    first = _profile(ref)
    assert first["source"] == "measured" and first["measure_s"] > 0
    assert first["profile_key"].startswith(PROFILE_PREFIX + "/") and store.exists(first["profile_key"])
    TpotProfile.from_dict(first["profile"])  # a usable grid
    # the planner's locality inputs come from the model and the store, not zeros
    assert first["weight_bytes"] > 0 and first["store_read_bytes_per_s"] > 0
    assert first["kv_bytes_per_token"] == 2 * 1 * 2 * 8 * 4  # K+V x layers x kv heads x head_dim x fp32

    identity = first["profile"]["identity"]  # what it was measured on, in the profile itself
    assert identity == {**{k: first["facts"][k] for k in ("model_config_sha256", "dtype", "device", "engine")},
                        "model": "llama (hidden_size 16, num_hidden_layers 1, vocab_size 51)"}
    assert TpotProfile.from_dict(first["profile"]).identity.engine == "torch"

    again = _profile(ref)  # a second campaign start on the same store
    assert again["source"] == "cached" and again["measure_s"] == 0.0
    assert again["profile_key"] == first["profile_key"] and again["profile"] == first["profile"]

    bf16 = _profile({**ref, "dtype": "bfloat16"})
    assert bf16["source"] == "measured" and bf16["profile_key"] != first["profile_key"]
    assert bf16["facts"]["dtype"] == "bfloat16"
    monkeypatch.setenv("RLHFLESS_THREADS", "2")
    two = _profile(ref)
    assert two["source"] == "measured" and two["facts"]["threads"] == 2
    assert two["profile_key"] not in (first["profile_key"], bf16["profile_key"])
    monkeypatch.setenv("RLHFLESS_THREADS", "1")
    asked = _profile(ref, threads=2)  # the flow asks for the share of the widest fan-out
    assert asked["source"] == "cached" and asked["profile_key"] == two["profile_key"]


def test_a_corrupt_cached_profile_is_rejected_with_a_clear_message_and_measured_again(published):
    store, ref = published
    key = _profile(ref)["profile_key"]
    store.put(key, b'{"schema": "rlhfless.profile/1", "profile": trunc')
    out = _profile(ref)
    assert out["source"] == "measured"
    assert out["rejected"].startswith(f"cached profile '{key}' is not valid JSON")
    assert "measuring again" in out["rejected"]
    assert _profile(ref)["source"] == "cached"  # the re-measured profile replaced it

    record = json.loads(store.get(key))
    record["profile"]["seconds"] = [[0.001, -1.0], [0.002, 0.003]]
    store.put(key, json.dumps(record).encode())
    out = _profile(ref)
    assert out["source"] == "measured" and "not a positive finite number" in out["rejected"]


def test_the_profile_measures_the_decode_path_the_campaign_runs(published, monkeypatch):
    """Decode steps and row drops are timed on the ``kv_cache`` path asked for: the static
    path's shrink is its buffers' compaction, the dynamic path's ``DynamicCache``'s."""
    from transformers import DynamicCache

    from actions.engines import torch_engine
    from actions.engines.static_kv import StaticKV

    _, ref = published
    monkeypatch.setenv("RLHFLESS_THREADS", "1")
    calls = {"static_decode": 0, "compact": 0, "select": 0}

    def count(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(torch_engine, "decode_static", count("static_decode", torch_engine.decode_static))
    monkeypatch.setattr(StaticKV, "compact", count("compact", StaticKV.compact))
    monkeypatch.setattr(DynamicCache, "batch_select_indices", count("select", DynamicCache.batch_select_indices))

    static = _profile(ref)  # the default, as generation.kv_cache is
    assert static["facts"]["kv_cache"] == "static" and static["source"] == "measured"
    assert calls["static_decode"] > 0 and calls["compact"] > 0 and calls["select"] == 0
    calls.update(static_decode=0, compact=0)
    dynamic = _profile(ref, kv_cache="dynamic")
    assert dynamic["facts"]["kv_cache"] == "dynamic" and dynamic["source"] == "measured"
    assert dynamic["profile_key"] != static["profile_key"]
    # the shrink shapes: batch 2 (the only one above one row) at both contexts, 9 repeats each
    assert calls == {"static_decode": 0, "compact": 0, "select": 2 * 9}
    assert _profile(ref)["source"] == "cached" and _profile(ref, kv_cache="dynamic")["source"] == "cached"


def test_the_profile_decodes_with_the_campaigns_graphs_compilation_and_draws(published, monkeypatch):
    """The engine measured is built with the campaign's ``cuda_graphs``, ``compile_decode`` and
    ``fused_sampling``, and the facts say what they do on this device: settings that change
    nothing here share a profile, the others measure their own."""
    from actions.engines import profiling, sampling

    _, ref = published
    monkeypatch.setenv("RLHFLESS_THREADS", "1")
    built: list[dict] = []
    engine_cls = profiling.TorchEngine

    def recording(model, **kw):
        built.append(kw)
        # compiling the step costs a minute on these cores; that the engine was asked to is the point
        return engine_cls(model, **{**kw, "compile_decode": False})

    monkeypatch.setattr(profiling, "TorchEngine", recording)
    fused_calls = [0]
    draw = sampling._FusedDraw.__call__

    def counted(self, *args):
        fused_calls[0] += 1
        return draw(self, *args)

    monkeypatch.setattr(sampling._FusedDraw, "__call__", counted)
    plain = _profile(ref)
    assert plain["facts"] | {"graphs": False, "compiled": False, "fused": False} == plain["facts"]
    assert built and all(kw["cuda_graphs"] == "auto" and not kw["compile_decode"] for kw in built)
    assert fused_calls[0] == 0  # a 51-token vocabulary: auto draws unfused
    # no CUDA here: graphs off changes nothing, and fusion off is what auto does at this vocabulary
    assert _profile(ref, cuda_graphs="off", fused_sampling="off")["profile_key"] == plain["profile_key"]
    built.clear()
    compiled = _profile(ref, compile_decode=True)
    assert compiled["facts"]["compiled"] and compiled["source"] == "measured"
    assert compiled["profile_key"] != plain["profile_key"] and all(kw["compile_decode"] for kw in built)
    fused = _profile(ref, fused_sampling="on")
    assert fused["facts"]["fused"] and fused["source"] == "measured" and fused_calls[0] > 0
    assert fused["profile_key"] not in (plain["profile_key"], compiled["profile_key"])
    dynamic = _profile(ref, kv_cache="dynamic", compile_decode=True)  # compiles only the static path
    assert dynamic["facts"]["compiled"] is False and dynamic["facts"]["kv_cache"] == "dynamic"


def test_profiles_cached_before_a_decode_fact_existed_are_measured_anew(published):
    import hashlib

    import torch

    from actions.profile import decode_facts
    from actions.store.profile_cache import ProfileFacts, ProfileRequest, cache_record

    store, ref = published
    old_facts = {"model_config_sha256": "0" * 64, "dtype": "float32", "device": "cpu:x", "engine": "vllm",
                 "threads": 1, "batch_sizes": [1, 2], "contexts": [4, 8], "prefill_shape": [2, 4]}

    def old_key(facts: dict) -> str:  # the key as the previous revision derived it
        return f"{PROFILE_PREFIX}/{hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:40]}.json"

    assert ProfileFacts(**old_facts).cache_key() == old_key(old_facts)  # the digest itself is unchanged
    # a vLLM profile of the previous revision: vLLM's draws are a fact now, so its key moved
    vllm_req = ProfileRequest(model=ref, engine="vllm", batch_sizes=[1, 2], contexts=[4, 8])
    vllm = ProfileFacts(**old_facts, **decode_facts(vllm_req, torch.device("cpu"), 51))
    assert vllm.as_json() == {**old_facts, "fused": False} and vllm.cache_key() != old_key(old_facts)
    # a torch profile of the previous revision: its key is no longer asked for, nothing reads it
    first = _profile(ref)
    facts = {k: v for k, v in first["facts"].items() if k not in ("kv_cache", "graphs", "compiled", "fused")}
    store.put(old_key(facts), json.dumps(cache_record(ProfileFacts(**facts), first["profile"])).encode())
    assert old_key(facts) != first["profile_key"]
    assert _profile(ref)["profile_key"] == first["profile_key"]
    # and a result without the fact (an action of the previous revision) still parses in the flow
    assert parse_result("profile", _result(first["profile"]), ProfileResult).facts.kv_cache is None


def test_the_flow_asks_for_the_campaigns_decode_path(tiny_config):
    from actions.contracts import ModelRef
    from flows.campaign.live_profile import profile_request
    from flows.step.context import RunContext

    model = ModelRef(store_uri="s", base_key="b", policy_key="p", policy_version=0)
    for path in ("static", "dynamic"):
        ctx = RunContext(config=tiny_config(f"generation.kv_cache={path}"), store=None, invoker=None,  # type: ignore[arg-type]
                         run_id="r")
        assert profile_request(ctx, model, [5, 9]).kv_cache == path
    ctx = RunContext(config=tiny_config("generation.cuda_graphs=off", "generation.compile_decode=true",
                                        "generation.fused_sampling=on"), store=None, invoker=None,  # type: ignore[arg-type]
                     run_id="r")
    req = profile_request(ctx, model, [5, 9])
    assert (req.cuda_graphs, req.compile_decode, req.fused_sampling) == ("off", True, "on")


class _Done:
    def __init__(self, result: dict) -> None:
        # what invoke_action returns: the result validated against the profile contract
        self._out = Returned(parse_result("profile", result, ProfileResult), None)

    def result(self) -> Returned:
        return self._out


def _result(profile: dict, source: str = "cached") -> dict:
    facts = {"model_config_sha256": "0" * 64, "dtype": "float32", "device": "cpu:x", "engine": "torch",
             "threads": 1, "batch_sizes": [1, 2], "contexts": [4, 8], "prefill_shape": [2, 4]}
    return {"profile": profile, "profile_key": "profiles/k.json", "source": source, "facts": facts,
            "weight_bytes": 1000, "kv_bytes_per_token": 64, "store_read_bytes_per_s": 1e8, "measure_s": 0.0,
            "__warm": {"hits": 0, "misses": 0}}


@pytest.mark.parametrize("source", ["cached", "measured"])
def test_the_flow_measures_again_when_it_cannot_use_a_grid(tiny_config, monkeypatch, source):
    from actions.store.profile_cache import ProfileRequest
    from flows.step import invoke as tasks
    from flows.step.context import RunContext

    good = TpotProfile((1, 2), (4.0, 8.0), ((0.001, 0.002), (0.002, 0.003)), 1000.0, name="m").to_dict()
    bad = dict(good, batch_sizes=[2, 1])  # decreasing: TpotProfile refuses it
    calls = []

    def invoke(*, action, payload, shard):
        calls.append(payload)
        return _Done(_result(good, "measured")).result()

    monkeypatch.setattr(tasks, "invoke_action", invoke)
    ctx = RunContext(config=tiny_config(), store=None, invoker=None, run_id="r")  # type: ignore[arg-type]
    req = ProfileRequest(model={"store_uri": "s", "base_key": "b", "policy_key": "p", "policy_version": 0},
                         batch_sizes=[1, 2], contexts=[4, 8])
    lines: list[str] = []
    live = finish_profiling(ctx, (_Done(_result(bad, source)), req), lines.append)
    assert [p["refresh"] for p in calls if "probe" not in p] == [True]  # (the noop probes time the round trip)
    assert live.source == "measured" and live.profile.name == "m"
    # the line says where the grid came from: a measured one was never in the cache
    assert any(f"{source} profile 'profiles/k.json'" in line and "measuring again" in line for line in lines)


def test_a_profile_file_of_another_model_is_planned_with_after_one_warning(tiny_config, tmp_path, monkeypatch):
    """A scaling.profile whose identity differs from what the pool's profile action found (a
    roofline of Llama2-70B for the tiny CPU model) is used, a what-if, with one warning line;
    a file measured for this model, or one stating nothing (older files), gets none."""
    from actions.store.profile_cache import ProfileRequest
    from flows.planning.tpot import ProfileIdentity, parse_roofline_spec
    from flows.step import invoke as tasks
    from flows.step.context import RunContext

    monkeypatch.setattr(tasks, "invoke_action", lambda **kw: None)  # the round-trip probes
    req = ProfileRequest(model={"store_uri": "s", "base_key": "b", "policy_key": "p", "policy_version": 0},
                         batch_sizes=[1, 2], contexts=[4, 8], measure_grid=False)
    here = ProfileIdentity("tiny", "0" * 64, "float32", "cpu:x", "torch")  # as _result's facts say
    grid = TpotProfile((1, 2), (4.0, 8.0), ((0.001, 0.002), (0.002, 0.003)), 1000.0, name="m")
    cases = {"roofline": parse_roofline_spec("roofline:h100:llama2-70b", 2),
             "same": TpotProfile.from_dict({**grid.to_dict(), "identity": here.to_dict()}), "unstated": grid}
    warned: dict[str, list[str]] = {}
    for name, profile in cases.items():
        path = tmp_path / f"{name}.json"
        profile.save(path)
        ctx = RunContext(config=tiny_config(f"scaling.profile={path}"), store=None, invoker=None,  # type: ignore[arg-type]
                         run_id="r")
        lines: list[str] = []
        live = finish_profiling(ctx, (_Done(_result({}, "skipped")), req), lines.append)
        assert live.source == "file" and live.profile == profile
        # the store's cache entry was not used: the line names the file, the summary no key
        assert live.profile_key == "" and live.describe()["key"] == ""
        (start,) = [line for line in lines if line.startswith("profile: file")]
        assert f"({path})" in start and "profiles/" not in start, start
        warned[name] = [line for line in lines if "warning" in line]
    assert warned["same"] == warned["unstated"] == []
    (line,) = warned["roofline"]
    assert f"scaling.profile '{tmp_path / 'roofline.json'}' was measured for Llama2-70B" in line
    for fact in ("device H100-SXM (this campaign: cpu:x)", "engine roofline (this campaign: torch)",
                 "planning with it as given", "rlhfless profile"):
        assert fact in line, line
    # the same model measured on another engine: the line does not name the model twice
    from flows.campaign.live_profile import other_model_warning

    other = ProfileIdentity("tiny", "0" * 64, "float32", "cpu:x", "vllm")
    line = other_model_warning("p.json", TpotProfile.from_dict({**grid.to_dict(), "identity": other.to_dict()}),
                               None, "torch", "tiny")
    assert "was measured on another setup than this campaign's: engine vllm (this campaign: torch)" in line, line


def test_the_hook_plans_from_the_measured_profile_and_the_store_transfer_model(tiny_config, tmp_path):
    from actions.store import LocalStore
    from flows.planning.lengths import LengthHistory
    from flows.planning.tpot import CPU_TINY_PROFILE
    from flows.step.context import RunContext
    from flows.step.phase import cluster_spec, load_profile, plan_generation_phase

    # ten times slower than the built-in estimate at every point
    slow = TpotProfile(CPU_TINY_PROFILE.batch_sizes, CPU_TINY_PROFILE.contexts,
                       tuple(tuple(10 * v for v in row) for row in CPU_TINY_PROFILE.seconds),
                       CPU_TINY_PROFILE.prefill_tokens_per_s, name="measured-x")
    ctx = RunContext(config=tiny_config("scaling.policy=fixed:1"), store=LocalStore(str(tmp_path / "s")),
                     invoker=None, run_id="r")  # type: ignore[arg-type]
    tokens = {p: PromptTokens(prompt=list(range(12)), answer_len=6) for p in range(4)}
    plan = lambda: plan_generation_phase(ctx, LengthHistory(), tokens, [0, 1, 2, 3], 3).plan  # noqa: E731
    builtin = plan().predicted_time_s
    ctx.live = LiveInputs(slow, "measured", weight_bytes=4e6, kv_bytes_per_token=256.0,
                          transfer_bandwidth_bytes_per_s=2e8, threads=1)
    assert load_profile(ctx) is slow
    spec = cluster_spec(ctx, 3)
    assert (spec.weight_bytes, spec.kv_bytes_per_token, spec.transfer_bandwidth_bytes_per_s) == (4e6, 256.0, 2e8)
    assert plan().predicted_time_s > 5 * builtin  # decode dominates and is 10x slower


def test_the_profile_is_measured_at_one_generation_action_s_share_of_the_cores(tiny_config):
    from flows.campaign.live_profile import generation_threads

    # the cores but the control plane's one (flows.invokers.cores), shared by the widest fan-out
    assert generation_threads(tiny_config("invoker.num_cores=4", "scaling.n_max=4")) == 1
    assert generation_threads(tiny_config("invoker.num_cores=4", "scaling.n_max=2")) == 1
    assert generation_threads(tiny_config("invoker.num_cores=4", "scaling.n_max=1")) == 3
    assert generation_threads(tiny_config("invoker.num_cores=1", "scaling.n_max=1")) == 1


def test_profile_grid_covers_the_step():
    assert profile_grid(4, 16, [10, 12, 30], 10) == ([4, 8, 16], [12, 40])
    assert profile_grid(8, 8, [5], 3) == ([8, 9], [5, 8])  # one group per step still has two points


def test_every_activation_pays_the_measured_round_trip_once():
    from flows.planning.plan import ClusterSpec
    from flows.planning.timeline import evaluate_candidate, prefill_seconds

    profile = TpotProfile((1, 2), (4.0, 8.0), ((0.001, 0.002), (0.002, 0.003)), 1000.0)
    base = ClusterSpec(gpus_per_actor=1, max_actors=2, num_warm_actors=2)
    live = ClusterSpec(gpus_per_actor=1, max_actors=2, num_warm_actors=2, activation_s=0.05)
    p0, p1 = prefill_seconds(100, profile, base), prefill_seconds(100, profile, live)
    assert (p0, p1) == (0.1, 0.1 + 0.05)  # 100 tokens at 1000/s, plus the prefill's own round trip
    t0, gs0, _ = evaluate_candidate([1.0, 0.5], [10, 10], base, p0)
    t1, gs1, _ = evaluate_candidate([1.0, 0.5], [10, 10], live, p1)
    assert t1 == pytest.approx(t0 + 2 * 0.05)  # the prefill's and then actor 0's
    assert gs1 == pytest.approx(gs0 + 3 * 0.05)  # billed: prefill, actor 0, actor 1


def test_actors_beyond_the_local_pool_s_workers_queue_for_one_instead_of_a_cold_start(tiny_config, tmp_path):
    from actions.store import LocalStore
    from flows.planning.plan import ClusterSpec
    from flows.planning.timeline import evaluate_candidate
    from flows.step.context import RunContext
    from flows.step.phase import cluster_spec

    two = ClusterSpec(gpus_per_actor=1, max_actors=3, num_warm_actors=2, activation_s=0.1,
                      max_concurrent_actors=2)
    # actors 0 and 1 run at once and end at 1.1; actor 2 takes the first free worker then and
    # pays its own round trip again; the wait is not billed
    t, gs, _ = evaluate_candidate([1.0, 1.0, 1.0], [0, 0, 0], two, 0.0)
    assert (t, gs) == (pytest.approx(2.2), pytest.approx(3.3))
    unbounded = ClusterSpec(gpus_per_actor=1, max_actors=3, num_warm_actors=3, activation_s=0.1)
    assert evaluate_candidate([1.0, 1.0, 1.0], [0, 0, 0], unbounded, 0.0)[:2] == (pytest.approx(1.1),
                                                                                   pytest.approx(3.3))
    # the shortest running actor frees its worker first
    t, _, _ = evaluate_candidate([3.0, 1.0, 1.0, 1.0], [0] * 4, two, 0.0)
    assert t == pytest.approx(3.3)  # actors 2 and 3 one after the other beside actor 0 (ends 3.1)

    def spec(*overrides):
        ctx = RunContext(config=tiny_config("scaling.policy=fixed:3", *overrides),
                         store=LocalStore(str(tmp_path / "s")), invoker=None, run_id="r")  # type: ignore[arg-type]
        return cluster_spec(ctx, 1)

    local = spec()  # a fixed fan-out above the pool's one worker: no cold start, a queue
    assert (local.cold_start_s, local.max_concurrent_actors) == (0.0, 1)
    remote = spec("invoker.kind=openwhisk")
    assert (remote.cold_start_s, remote.max_concurrent_actors) == (2.0, 0)
    threads = spec("invoker.kind=inprocess")  # every action a call in its own thread
    assert (threads.cold_start_s, threads.max_concurrent_actors) == (0.0, 0)


def test_the_measured_fanout_follows_the_predicted_lengths(tiny_config, tmp_path, monkeypatch):
    """Short responses: a second action saves less than its round trip costs; long ones: it pays."""
    from actions.store import LocalStore
    from flows.planning.lengths import LengthHistory
    from flows.step import phase as hooks
    from flows.step.context import RunContext

    monkeypatch.setattr(hooks, "pool_cores", lambda cfg: 2)
    profile = TpotProfile((4, 16), (8.0, 64.0), ((0.01, 0.012), (0.03, 0.036)), 2000.0, name="measured-x")
    ctx = RunContext(config=tiny_config("generation.max_new_tokens=200"), store=LocalStore(str(tmp_path / "s")),
                     invoker=None, run_id="r",  # type: ignore[arg-type]
                     live=LiveInputs(profile, "measured", activation_s=0.1, threads=1))
    ids = [0, 1, 2, 3]

    def actions(answer_len: int) -> int:
        tokens = {p: PromptTokens(prompt=list(range(8)), answer_len=answer_len) for p in ids}
        return hooks.plan_generation_phase(ctx, LengthHistory(), tokens, ids, 4).plan.num_actors

    assert actions(2) == 1  # ~0.05 s of decoding: not worth a 0.1 s round trip
    assert actions(150) == 2  # seconds of decoding: a second action halves them; capacity is 2 cores


def test_planner_fidelity_reports_each_part_of_the_phase():
    from flows.step.metrics import planner_fidelity

    steps = [{"plan/predicted_time_s": 1.2, "plan/predicted_prefill_s": 0.2, "plan/predicted_generate_s": 1.0,
              "timing_s/prefill": 0.4, "timing_s/generate": g} for g in (0.8, 1.0, 1.25, 2.0)]
    fid = planner_fidelity(steps)
    assert fid["generate"]["steps"] == 4
    # errors +25%, 0%, -20%, -50%: median of the middle two, signed and in magnitude
    assert fid["generate"]["median_relative_error"] == pytest.approx((0.0 - 0.2) / 2)
    assert fid["generate"]["median_abs_relative_error"] == pytest.approx((0.2 + 0.25) / 2)
    assert fid["generate"]["p90_abs_relative_error"] == pytest.approx(0.5)
    assert fid["prefill"]["median_relative_error"] == pytest.approx(-0.5)
    no_prefill = dict(steps[0], **{"prefill/unique_prefixes": 0.0, "timing_s/prefill": 0.003})
    assert planner_fidelity(steps + [no_prefill])["prefill"]["steps"] == 4  # none ran: nothing to time
    assert planner_fidelity([{"timing_s/generate": 1.0}])["generate"]["steps"] == 0  # older steps


def test_the_hook_runs_the_prefill_action_only_where_it_pays(tiny_config, tmp_path):
    """Unique prompts: each generation action prefills its own (the plan has no prefill and
    times none); a long template shared by more prompts than one prefill holds: the action
    computes it once; ``always`` and ``never`` override the choice."""
    from actions.store import LocalStore
    from flows.planning.lengths import LengthHistory
    from flows.step import phase as hooks
    from flows.step.context import RunContext

    profile = TpotProfile((4, 16), (8.0, 64.0), ((0.01, 0.012), (0.03, 0.036)), 2000.0, name="measured-x")
    live = LiveInputs(profile, "measured", activation_s=0.01, threads=1)

    def phase(setting: str, prompts: dict[int, list[int]]):
        ctx = RunContext(config=tiny_config("generation.prefill_capacity=4", f"generation.prefill_action={setting}"),
                         store=LocalStore(str(tmp_path / "s")), invoker=None, run_id="r",  # type: ignore[arg-type]
                         live=live)
        tokens = {p: PromptTokens(prompt=v, answer_len=4) for p, v in prompts.items()}
        return hooks.plan_generation_phase(ctx, LengthHistory(), tokens, sorted(prompts), 2)

    unique = {p: [p] * 12 for p in range(4)}
    template = list(range(100, 300))  # 200 tokens 16 prompts share; prompt 0 is the template alone
    shared = {p: template + [p] * min(p, 1) for p in range(16)}
    skipped = phase("auto", unique)
    assert skipped.prefill is None and skipped.predicted_prefill_s == 0.0
    ran = phase("auto", shared)  # 15 x 200 tokens saved at 2000 tokens/s: 1.5 s against 0.01 s
    assert ran.prefill is not None and ran.prefill.prefix_len == 200
    # the action computes the 200-token template once; the 15 one-token suffixes are the
    # generation actions' own work (flows/planning/prefix.py)
    assert ran.prefill.prefix_tokens == 200
    assert ran.predicted_prefill_s == pytest.approx(ran.prefill.prefix_tokens / 2000.0 + 0.01)
    assert phase("always", unique).prefill is not None
    assert phase("never", shared).prefill is None


def test_the_vllm_engine_plans_no_prefill_action_nor_its_savings(tiny_config, tmp_path):
    """vLLM cannot import the prefill action's KV bundle (its prefix cache deduplicates inside
    the engine), so whatever ``prefill_action`` says the plan has no prefill action, times none
    and moves no prefix KV: it is timed as the torch engine's plan without one (once its pool's
    engines are built: ``flows/planning/engine_starts.py``)."""
    from actions.store import LocalStore
    from flows.planning.calibration import Calibration
    from flows.planning.lengths import LengthHistory
    from flows.step import phase as hooks
    from flows.step.context import RunContext

    profile = TpotProfile((4, 16), (8.0, 64.0), ((0.01, 0.012), (0.03, 0.036)), 2000.0, name="measured-x")
    live = LiveInputs(profile, "measured", activation_s=0.01, threads=1, kv_bytes_per_token=4096.0,
                      transfer_bandwidth_bytes_per_s=1e6)  # KV that travelled would cost seconds
    template = list(range(100, 300))  # 200 tokens 16 prompts share: a prefill action would pay
    tokens = {p: PromptTokens(prompt=template + [p] * min(p, 1), answer_len=4) for p in range(16)}

    def ctx(*extra: str) -> RunContext:
        return RunContext(config=tiny_config("generation.prefill_capacity=4", *extra),
                          store=LocalStore(str(tmp_path / "s")), invoker=None, run_id="r",  # type: ignore[arg-type]
                          live=live)

    for setting in ("auto", "never"):  # "always" with vllm is refused by the config
        vllm = ctx("generation.engine=vllm", f"generation.prefill_action={setting}")
        rules = hooks.planner_rules(vllm, 2)
        assert (rules.prefill_capacity, rules.prefill_action) == (None, "never")
        assert not rules.settings.cluster.prefill_action and rules.settings.cluster.kv_bytes_per_token == 0.0
        planned = hooks.plan_generation_phase(vllm, LengthHistory(), tokens, sorted(tokens), 2,
                                              calibration=Calibration(max_fan_out=2))  # both engines built
        assert planned.prefill is None and planned.predicted_prefill_s == 0.0
        torch_without = hooks.plan_generation_phase(ctx("generation.prefill_action=never"), LengthHistory(),
                                                    tokens, sorted(tokens), 2)
        assert planned.plan.predicted_time_s == pytest.approx(torch_without.plan.predicted_time_s)
    torch_with = hooks.plan_generation_phase(ctx("generation.prefill_action=always"), LengthHistory(), tokens,
                                             sorted(tokens), 2)
    assert torch_with.prefill is not None and torch_with.predicted_prefill_s > 0  # what vLLM no longer plans
    # without dedup_prefill the flow runs no prefill action either: none is timed, no KV moves
    no_dedup = ctx("generation.dedup_prefill=false", "generation.prefill_action=always")
    rules = hooks.planner_rules(no_dedup, 2)
    assert rules.prefill_capacity is None and not rules.settings.cluster.prefill_action
    planned = hooks.plan_generation_phase(no_dedup, LengthHistory(), tokens, sorted(tokens), 2)
    assert planned.prefill is None and planned.predicted_prefill_s == 0.0
    assert planned.plan.predicted_time_s == pytest.approx(torch_without.plan.predicted_time_s)


@pytest.mark.parametrize("objective", ["value", "slack", "budget", "paper"])
def test_the_hook_times_each_fan_out_at_the_speed_measured_at_it(tiny_config, tmp_path, monkeypatch, objective):
    """Long responses, where a second action pays at one speed for every fan-out: once the
    steps have measured two actions decoding 4x slower each than one (they share the cores),
    every objective keeps one, and the plan and its record carry the one-action speed."""
    from actions.store import LocalStore
    from flows.planning.calibration import Calibration
    from flows.planning.lengths import LengthHistory
    from flows.step import phase as hooks
    from flows.step.context import RunContext

    monkeypatch.setattr(hooks, "pool_cores", lambda cfg: 2)
    profile = TpotProfile((4, 16), (8.0, 64.0), ((0.01, 0.012), (0.03, 0.036)), 2000.0, name="measured-x")
    ctx = RunContext(config=tiny_config("generation.max_new_tokens=200", f"scaling.objective={objective}"),
                     store=LocalStore(str(tmp_path / "s")), invoker=None, run_id="r",  # type: ignore[arg-type]
                     live=LiveInputs(profile, "measured", activation_s=0.1, threads=1))
    ids = [0, 1, 2, 3]
    tokens = {p: PromptTokens(prompt=list(range(8)), answer_len=150) for p in ids}

    def phase(calibration: Calibration):
        return hooks.plan_generation_phase(ctx, LengthHistory(), tokens, ids, 4, calibration=calibration)

    one_speed = phase(Calibration(decode_scale=1.5))
    assert one_speed.plan.num_actors == 2
    measured = phase(Calibration(decode_scale=1.5, by_actors=((1, 1.0), (2, 4.0))))
    assert measured.plan.num_actors == 1
    assert measured.calibration.decode_scale == 1.0  # recorded as planned: calibrate() reads it back
    alone = phase(Calibration(decode_scale=1.0)).plan  # one speed, the one-action one
    chosen = measured.plan.candidates[measured.plan.chosen]
    same = [c for c in alone.candidates if (c.n, c.kind) == (chosen.n, chosen.kind)]
    assert same and chosen.time_s == pytest.approx(same[0].time_s, rel=1e-9)


def test_a_noisy_decode_timing_never_makes_a_step_of_zero_or_less(monkeypatch):
    """On a busy machine a 2-token call can take longer than a 10-token one: the step is then
    timed over more tokens, not returned negative (a CPU profile once cached -0.8 ms)."""
    import time

    import torch

    from actions.engines import profiling

    class NoisyEngine:  # the short call's fixed cost outweighs 8 and 16 steps, not 32
        def __init__(self, *args, **kwargs):
            pass

        def generate(self, specs, params):
            time.sleep(0.060 if params.max_new_tokens == 2 else 0.002 * params.max_new_tokens)

    monkeypatch.setattr(profiling, "TorchEngine", NoisyEngine)
    model = torch.nn.Linear(1, 1)
    model.config = type("Config", (), {"max_position_embeddings": 128})()
    assert profiling.decode_step_seconds(model, batch=1, context=8, vocab=16) > 0


def test_a_measured_grid_with_a_time_of_zero_or_less_is_never_cached(published, monkeypatch):
    from actions.engines import profiling

    store, ref = published
    measure = profiling.measure_grid

    def negative(*args, **kwargs):
        grid = measure(*args, **kwargs)
        return {**grid, "seconds": [[-0.0008, *row[1:]] if i == 0 else row for i, row in enumerate(grid["seconds"])]}

    monkeypatch.setattr(profiling, "measure_grid", negative)
    out = _profile(ref)
    assert out["source"] == "measured" and out["profile"]["seconds"][0][0] < 0
    assert not store.exists(out["profile_key"])  # the flow refuses it and measures again (refresh)
    monkeypatch.setattr(profiling, "measure_grid", measure)
    assert _profile(ref)["source"] == "measured" and _profile(ref)["source"] == "cached"


def test_on_this_machine_s_cores_the_profile_runs_alone_after_warm_up(tiny_config, prefect_harness, monkeypatch):
    """Beside warm-up on shared cores the profile measured steps 3-6x slower (60x in process),
    and the store's cache would keep that profile for every later campaign."""
    import time

    from flows.campaign.run import run_campaign
    from flows.invokers.inprocess import InProcessInvoker

    spans: dict[str, list[tuple[float, float]]] = {}
    invoke = InProcessInvoker.invoke

    def timed(self, action, *a, **k):
        start = time.monotonic()
        try:
            return invoke(self, action, *a, **k)
        finally:
            spans.setdefault(action, []).append((start, time.monotonic()))

    monkeypatch.setattr(InProcessInvoker, "invoke", timed)
    run_campaign(tiny_config("invoker.kind=inprocess", "run_id=alone", "steps=1"), progress=lambda m: None)
    (profile_start, profile_end), = spans["profile"]
    assert profile_start >= max(end for _, end in spans["warmup"])
    assert profile_end <= min(start for start, _ in spans["evaluate"])
