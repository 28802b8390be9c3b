"""The vLLM engine's starts in the planner (``flows/planning/engine_starts.py``): an action beyond
the workers known to hold an engine pays the start the calibration learned, which sizes the
fan-out; the torch engine's plans are as before."""

from __future__ import annotations

import json

import pytest

from flows.planning.calibration import WINDOW, Calibration, calibrate, calibration_memory
from flows.planning.engine_starts import DEFAULT_ENGINE_START_S, EngineStarts
from flows.planning.plan import ClusterSpec
from flows.planning.planner import PhaseInputs, Planner, PlannerRules, PlannerState
from flows.planning.record import PhaseObservation, StepRecord
from flows.planning.registry import parse_scaling_policy
from flows.planning.settings import PlannerSettings
from flows.planning.tpot import TpotProfile

PROFILE = TpotProfile((4, 16), (8.0, 64.0), ((0.01, 0.012), (0.03, 0.036)), 2000.0, name="t")
# the local pool's four workers, no prefill action (the vLLM engine runs none)
CLUSTER = ClusterSpec(gpus_per_actor=1, max_actors=4, num_warm_actors=4, activation_s=0.02,
                      max_concurrent_actors=4, prefill_action=False)
IDS = tuple(range(12))
INPUTS = PhaseInputs(prompt_ids=IDS, epoch=0, prompt_lengths={p: 20 for p in IDS},
                     reference_lengths={p: 100.0 + 10 * p for p in IDS})
POOL = EngineStarts(workers=4)


def rules(policy: str = "cost_aware", starts: EngineStarts | None = POOL) -> PlannerRules:
    settings = PlannerSettings(policy=parse_scaling_policy(policy), n_min=1, n_max=4, lam=0.7, assignment="ranked",
                               profile=PROFILE, cluster=CLUSTER, objective="value")
    return PlannerRules(settings=settings, group_size=4, length_window=2, max_length=300.0, first_epoch="reference",
                        cut_threshold=None, calibrated=True, engine_starts=starts)


def test_a_learned_engine_start_shrinks_the_fan_out_and_lengthens_the_prediction():
    """Without starts the planner fans out to three actions; each action past the one engine
    built paying 2 s, it takes two; with three engines built it fans out to three again."""
    free = Planner(rules(starts=None)).plan(INPUTS)
    assert free.plan.num_actors == 3 and free.engine_start_s == 0.0
    learned = Calibration(engine_start_s=2.0)
    priced = Planner(rules()).plan(INPUTS, calibration=learned)
    assert priced.plan.num_actors == 2 and priced.engine_start_s == 2.0
    assert priced.plan.predicted_time_s > free.plan.predicted_time_s
    warm = Planner(rules()).plan(INPUTS, calibration=Calibration(engine_start_s=2.0, max_fan_out=3))
    # every action on an engine built: the plan without starts (only the candidate of four pays one)
    assert (warm.plan.assignments, warm.plan.predicted_time_s, warm.engine_start_s) == (
        free.plan.assignments, free.plan.predicted_time_s, 0.0)
    # a fixed fan-out of three on one engine built: two starts, the slower prediction and the bill
    fixed_free = Planner(rules("fixed:3", starts=None)).plan(INPUTS)
    fixed = Planner(rules("fixed:3")).plan(INPUTS, calibration=learned)
    assert fixed.plan.num_actors == 3 and fixed.plan.predicted_time_s > fixed_free.plan.predicted_time_s
    assert fixed.plan.predicted_gpu_seconds == pytest.approx(fixed_free.plan.predicted_gpu_seconds + 2 * 2.0)
    # before any start is observed the default is priced: one action
    assert Planner(rules()).plan(INPUTS).plan.num_actors == 1


def test_the_warm_engines_and_the_start_priced():
    cluster = POOL.cluster(CLUSTER, Calibration())
    assert (cluster.cold_start_s, cluster.num_warm_actors) == (DEFAULT_ENGINE_START_S, 1)
    cluster = POOL.cluster(CLUSTER, Calibration(engine_start_s=7.5, max_fan_out=9))
    assert (cluster.cold_start_s, cluster.num_warm_actors) == (7.5, 4)  # at most the pool's workers
    remote = EngineStarts(workers=4, container_s=2.0)
    cluster = remote.cluster(CLUSTER, Calibration(engine_start_s=7.5, max_fan_out=2))
    assert (cluster.cold_start_s, cluster.num_warm_actors) == (9.5, 2)  # container, then engine
    assert (remote.priced_s(2, cluster), remote.priced_s(3, cluster)) == (0.0, 7.5)
    with pytest.raises(ValueError, match="workers=0"):
        EngineStarts(workers=0)


def _phase(n: int, *, start: float = 0.0, predicted: float = 1.0, measured: float = 1.0,
           priced: float = 0.0) -> PhaseObservation:
    return PhaseObservation(num_actors=n, generate_s=measured, prefill_s=0.0, ran_prefill=False,
                            predicted_generate_s=predicted, predicted_prefill_s=0.0, activation_s=0.02,
                            decode_scale=1.0, prefill_fixed_s=0.0, hindsight_generate_s=predicted,
                            engine_start_s=start, predicted_engine_start_s=priced)


def test_the_calibration_learns_the_start_and_the_widest_fan_out_and_keeps_them():
    """The median of the phases' longest starts over the last window that reported one, and the
    widest fan-out however old: a long run's bounded memory keeps both."""
    assert calibrate([_phase(1)]).engine_start_s is None  # no start reported: none learned
    steps = [_phase(1, start=18.1), _phase(3, start=25.0, measured=30.0), _phase(2, start=20.0)]
    learned = calibrate(steps)
    assert (learned.engine_start_s, learned.max_fan_out) == (20.0, 3)
    every = [*steps, *[_phase(1) for _ in range(10 * WINDOW)]]
    memory: list[PhaseObservation] = []
    for observed in every:
        memory = calibration_memory([*memory, observed])
    assert calibrate(memory) == calibrate(every) and calibrate(memory).engine_start_s == 20.0
    assert calibrate(memory).max_fan_out == 3 and len(memory) <= WINDOW + 3
    later = [*every, *[_phase(1, start=s) for s in (2.0, 3.0, 4.0, 2.5, 3.5, 3.0, 2.0, 4.0)]]
    assert calibrate(later).engine_start_s == pytest.approx(3.0)  # the last window's


def test_a_start_priced_and_not_made_gives_no_decode_reading():
    """Planned with a 30 s start for an engine that was built already: 31 s predicted, 1 s
    measured is no decoding 30x faster than the profile."""
    steady = [_phase(2, predicted=1.0, measured=1.5) for _ in range(2)]
    surprise = _phase(3, predicted=31.0, measured=1.0, priced=30.0)
    assert calibrate([*steady, surprise]).decode_scale == pytest.approx((1.5 - 0.02) / (1.0 - 0.02))
    assert 3 not in dict(calibrate([*steady, surprise]).by_actors)
    small = _phase(3, predicted=10.0, measured=10.0, priced=1.0)  # a tenth of the phase: still a reading
    assert dict(calibrate([small]).by_actors) == {3: pytest.approx(1.0)}
    metrics = {"plan/decode_scale": 1.0, "timing_s/generate": 1.0, "timing_s/prefill": 0.0,
               "plan/predicted_generate_s": 31.0, "plan/predicted_prefill_s": 0.0, "plan/engine_start_s": 30.0}
    assert PhaseObservation.from_metrics(metrics).predicted_engine_start_s == 30.0


def test_the_planner_prices_what_it_observed_and_a_resume_finds_the_engines_that_outlive_it():
    """The first step's pre-warmed engine reports a 2 s start: the next plan prices 2 s, not the
    default, for the actions past the one engine; after a phase of two, two engines are built. A
    resume plans alike on OpenWhisk, whose containers keep theirs; the local pool's are new."""
    planner = Planner(rules())
    first = planner.plan(INPUTS)
    assert first.plan.num_actors == 1

    def observe(phase, start: float) -> None:
        predicted = phase.plan.predicted_time_s - phase.predicted_prefill_s
        planner.plan(INPUTS)  # the phase the record measures
        planner.observe(StepRecord(step=0, epoch=0, lengths={}, phase=PhaseObservation(
            num_actors=phase.plan.num_actors, generate_s=predicted, prefill_s=0.0, ran_prefill=False,
            predicted_generate_s=predicted, predicted_prefill_s=0.0, activation_s=phase.activation_s,
            decode_scale=1.0, prefill_fixed_s=0.0, engine_start_s=start,
            predicted_engine_start_s=phase.engine_start_s)))

    observe(first, 2.0)
    second = planner.plan(INPUTS)
    assert (second.plan.num_actors, second.engine_start_s) == (2, 2.0)
    observe(second, 2.0)
    state = PlannerState.model_validate(json.loads(planner.state.model_dump_json()))
    third = planner.plan(INPUTS)
    assert third.calibration.max_fan_out == 2 and third.calibration.engine_start_s == 2.0
    # workers that outlive the flow's process (OpenWhisk's containers): a resume finds both engines
    assert Planner(rules(starts=EngineStarts(workers=4, outlives_process=True)), state).plan(INPUTS) == third
    # the local pool starts anew with the process: its one pre-warmed engine, so the resumed
    # planner prices a start for the second action that the uninterrupted one does not
    resumed = Planner(rules(), state).plan(INPUTS)
    assert resumed.calibration == third.calibration and third.engine_start_s == 0.0
    assert POOL.warm_actors(third.calibration, 0) == 1 and POOL.warm_actors(third.calibration, 2) == 2
    assert (resumed.plan.num_actors, resumed.engine_start_s) == (2, 2.0)
    assert resumed.plan.predicted_gpu_seconds > third.plan.predicted_gpu_seconds


def test_the_torch_engine_and_the_in_process_invoker_price_no_start(tiny_config, tmp_path):
    """cluster_spec and the rules: vLLM on the local pool and OpenWhisk prices its starts; the
    torch engine's cluster, rules and plans are those of before, whatever was learned."""
    from actions.contracts import PromptTokens
    from actions.store import LocalStore
    from flows.planning.lengths import LengthHistory
    from flows.step.context import RunContext
    from flows.step.phase import cluster_spec, plan_generation_phase, planner_rules

    def ctx(*overrides: str) -> RunContext:
        return RunContext(config=tiny_config(*overrides), store=LocalStore(str(tmp_path / "s")),
                          invoker=None, run_id="r")  # type: ignore[arg-type]

    learned = Calibration(engine_start_s=12.0, max_fan_out=2)
    for kind, cold in (("local", 0.0), ("openwhisk", 2.0), ("inprocess", 0.0)):
        torch = ctx(f"invoker.kind={kind}")
        spec = cluster_spec(torch, 4, learned)
        assert spec == cluster_spec(torch, 4) and (spec.cold_start_s, spec.num_warm_actors) == (cold, 4), kind
        assert planner_rules(torch, 4).engine_starts is None
    local, remote = ctx("generation.engine=vllm"), ctx("generation.engine=vllm", "invoker.kind=openwhisk")
    assert (cluster_spec(local, 4).cold_start_s, cluster_spec(local, 4).num_warm_actors) == (DEFAULT_ENGINE_START_S, 1)
    assert (cluster_spec(local, 4, learned).cold_start_s, cluster_spec(local, 4, learned).num_warm_actors) == (12.0, 2)
    assert cluster_spec(remote, 4, learned).cold_start_s == 2.0 + 12.0
    assert planner_rules(local, 4).engine_starts == EngineStarts(workers=4)
    assert planner_rules(remote, 4).engine_starts == EngineStarts(workers=4, container_s=2.0, outlives_process=True)
    threads = ctx("generation.engine=vllm", "invoker.kind=inprocess")  # one engine in the flow's process
    assert planner_rules(threads, 4).engine_starts is None and cluster_spec(threads, 4, learned).cold_start_s == 0.0
    tokens = {p: PromptTokens(prompt=list(range(12)), answer_len=40) for p in range(8)}
    fixed = ctx("scaling.policy=fixed:3")
    plans = [plan_generation_phase(fixed, LengthHistory(), tokens, sorted(tokens), 4, calibration=c)
             for c in (Calibration(), learned)]
    assert plans[0].plan == plans[1].plan and plans[1].engine_start_s == 0.0
