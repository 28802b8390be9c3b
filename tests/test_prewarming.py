"""Pre-warming a live generation phase from call history (paper §3.7)."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from flows.step.prewarmer import PhasePrewarmer


class RecordingInvoker:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, dict, float]] = []
        self.fired = threading.Event()

    def prewarm(self, action: str, count: int, *, model: dict | None = None, decode=None) -> int:
        self.calls.append((action, count, model, time.time()))
        self.fired.set()
        return count


def test_fires_at_the_offset_with_the_plan_count_and_the_model():
    inv = RecordingInvoker()
    t0 = time.time()
    warm = PhasePrewarmer(inv, t0=t0, offset_s=0.3, action="generate", count=3, model={"policy_version": 4})
    assert not inv.calls  # armed, not fired
    assert inv.fired.wait(5)
    report = warm.report()
    (action, count, model, at), = inv.calls
    assert (action, count, model) == ("generate", 3, {"policy_version": 4})
    assert at - t0 >= 0.3 - 1e-3
    assert report["prewarm/started"] == 3 and report["prewarm/fired_s"] >= 0.3 - 1e-3
    assert report["prewarm/offset_s"] == 0.3 and report["prewarm/duration_s"] >= 0.0


def test_no_history_means_no_prewarm_and_an_unfired_one_is_cancelled():
    inv = RecordingInvoker()
    assert PhasePrewarmer(inv, t0=time.time(), offset_s=None, action="generate", count=2,
                          model={}).report() == {"prewarm/offset_s": -1.0, "prewarm/fired_s": -1.0,
                                                 "prewarm/duration_s": -1.0, "prewarm/started": 0.0}
    late = PhasePrewarmer(inv, t0=time.time(), offset_s=30.0, action="generate", count=2, model={})
    assert late.report()["prewarm/fired_s"] == -1.0  # the phase was over before the offset
    time.sleep(0.05)
    assert not inv.calls


def test_a_failing_prewarm_does_not_fail_the_step():
    class Broken(RecordingInvoker):
        def prewarm(self, action, count, *, model=None, decode=None):
            raise RuntimeError("pool unavailable")

    report = PhasePrewarmer(Broken(), t0=time.time(), offset_s=0.0, action="generate", count=2,
                            model={}).report()
    assert report["prewarm/started"] == 0.0 and report["prewarm/fired_s"] >= 0.0


def test_a_prewarm_warms_only_the_containers_the_gpu_limit_has_slots_for():
    held: list[str] = []

    @contextlib.contextmanager
    def one_free(count: int):
        held.append(f"hold {count}")
        yield 1
        held.append("release")

    inv = RecordingInvoker()
    PhasePrewarmer(inv, t0=time.time(), offset_s=0.0, action="generate", count=3, model={},
                   slots=one_free).report()
    assert [c[1] for c in inv.calls] == [1] and held == ["hold 3", "release"]
    none = RecordingInvoker()
    report = PhasePrewarmer(none, t0=time.time(), offset_s=0.0, action="generate", count=3, model={},
                            slots=lambda n: contextlib.nullcontext(0)).report()
    assert not none.calls and report["prewarm/started"] == 0.0 and report["prewarm/fired_s"] >= 0.0


def test_hook_offset_is_earliest_past_invocation_minus_buffer(tiny_config, tmp_path):
    from actions.contracts import PromptTokens
    from actions.store import LocalStore
    from flows.planning.lengths import LengthHistory
    from flows.step.context import RunContext
    from flows.step.phase import plan_generation_phase

    cfg = tiny_config("scaling.prewarm_buffer_s=0.25")
    ctx = RunContext(config=cfg, store=LocalStore(str(tmp_path / "s")), invoker=RecordingInvoker(), run_id="r")
    tokens = {p: PromptTokens(prompt=list(range(15)), answer_len=3) for p in range(4)}
    plan = lambda hist: plan_generation_phase(ctx, LengthHistory(), tokens, [0, 1, 2, 3], 3, hist)  # noqa: E731
    assert plan(None).prewarm_offset_s is None
    assert plan({"generate": [0.9, 0.6, 1.2], "score": [0.1]}).prewarm_offset_s == 0.6 - 0.25
    # one that could not be ready before the earliest call is not fired: it would hold the warm
    # containers that call needs
    assert plan({"generate": [0.1]}).prewarm_offset_s is None
    # on OpenWhisk a pre-warm holds its container PREWARM_HOLD_S at least: that much earlier
    ctx.config = tiny_config("scaling.prewarm_buffer_s=0.25", "invoker.kind=openwhisk")
    assert plan({"generate": [0.9]}).prewarm_offset_s == pytest.approx(0.9 - 0.25 - 0.5)
    assert plan({"generate": [0.7]}).prewarm_offset_s is None
    ctx.config = tiny_config("scaling.prewarm=false")
    assert plan({"generate": [0.9]}).prewarm_offset_s is None


def test_local_pool_prewarm_loads_the_policy_version_in_idle_workers(tmp_path):
    from actions.contracts import ModelRef
    from actions.prepare import prepare
    from actions.store import LocalStore
    from flows.config import load_config
    from flows.invokers.local_pool import LocalPoolInvoker
    from tests.conftest import TINY_OVERRIDES

    cfg = load_config(None, [*TINY_OVERRIDES, f"store.uri={tmp_path}"])
    p = prepare(cfg, LocalStore(tmp_path), "runs/w")
    ref = ModelRef(store_uri=str(tmp_path), base_key=p.base_key, policy_key=p.init_key, policy_version=0)
    pool = LocalPoolInvoker(3)
    try:
        assert pool.prewarm("generate", 2) == 0  # nothing to load without a model
        assert pool.prewarm("generate", 1, model=ref.model_dump()) == 1
        warmed = [w.name for w in pool._workers if w.warm.get("generate") == ref.policy_key]
        assert len(warmed) == 1
        # the activation that follows goes to the pre-warmed worker (the others were idle longer)
        act = pool.invoke("generate", {"model": ref.model_dump(), "dataset_key": p.train_key, "run_seed": 0,
                                       "step": 0, "shard": "g", "prompt_ids": [0], "group_size": 2,
                                       "max_new_tokens": 4, "temperature": 1.0, "output_key": "runs/w/g.json"})
        assert len(act.result["samples"]) == 2 and act.worker == warmed[0]
        assert pool.prewarm("generate", 5, model=ref.model_dump()) == 2  # only 3 workers exist
        assert pool.prewarm("generate", 3, model=ref.model_dump()) == 0  # already in memory
        assert pool.size == 3
    finally:
        pool.close()


def test_prewarm_false_leaves_the_local_pool_cold_too(tiny_config):
    """``scaling.prewarm: false`` asks for no pre-warm: the local pool's workers load no policy
    before the first step or after a step either (with it on, both happen)."""
    from flows.campaign.warming import PoolWarming

    for on in (True, False):
        inv = RecordingInvoker()
        warming = PoolWarming(tiny_config("invoker.kind=local", f"scaling.prewarm={str(on).lower()}"), inv, 3)
        warming.before_first_step({"policy_version": 0})
        warming.before_next_step(2, {"policy_version": 1})
        warming.join()
        assert [(a, n, m["policy_version"]) for a, n, m, _ in inv.calls] == (
            [("generate", 3, 0), ("generate", 2, 1)] if on else [])
