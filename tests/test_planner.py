"""The planner as one object (``flows/planning/planner.py``): a resumed planner decides as the
uninterrupted one, and what it learns reaches its plans."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from flows.planning.plan import ClusterSpec
from flows.planning.planner import PhaseInputs, Planner, PlannerRules, PlannerState
from flows.planning.record import PhaseObservation, StepRecord
from flows.planning.registry import parse_scaling_policy, register_scaling_function
from flows.planning.settings import PlannerSettings
from flows.planning.tpot import TpotProfile

PROFILE = TpotProfile((4, 16), (8.0, 64.0), ((0.01, 0.012), (0.03, 0.036)), 2000.0, name="t")
CLUSTER = ClusterSpec(gpus_per_actor=1, max_actors=4, num_warm_actors=4, activation_s=0.02,
                      weight_bytes=1e6, kv_bytes_per_token=64.0, transfer_bandwidth_bytes_per_s=1e9)
IDS = tuple(range(12))
TEMPLATE = list(range(100, 160))  # a shared 60-token prefix: the prefill plan dedups it


def rules(**kw) -> PlannerRules:
    """The live planner's rules: every part of its memory is used (calibration, speculation,
    prefill, pre-warm, the measured tail error)."""
    settings = PlannerSettings(policy=parse_scaling_policy("cost_aware"), n_min=1, n_max=4, lam=0.7,
                               assignment="ranked", profile=PROFILE, cluster=CLUSTER, cut_threshold=0.7,
                               objective="value")
    args = dict(settings=settings, group_size=4, length_window=2, max_length=300.0, first_epoch="learned",
                cut_threshold=0.7, prefill_capacity=16, prefill_action="always", speculative=True, calibrated=True,
                prewarm_buffer_s=0.1, tail_error_steps=2, tail_quantile=0.5)
    return PlannerRules(**(args | kw))


def inputs(step: int) -> PhaseInputs:
    epoch = step // 2
    return PhaseInputs(prompt_ids=IDS[::-1] if epoch % 2 else IDS, epoch=epoch,
                       prompt_lengths={p: len(TEMPLATE) + 3 for p in IDS},
                       reference_lengths={p: 10.0 + 7 * p for p in IDS},
                       prompts={p: TEMPLATE + [p, p, p] for p in IDS})


def record(step: int, phase, rng: random.Random) -> StepRecord:
    """What a step could have measured: lengths around the reference, a phase slower than
    planned, a speculation report, the generation actions' first call offset and how long the
    pre-warm before them took."""
    lengths = {p: tuple(max(1, int(rng.gauss(12 + 9 * p, 6))) for _ in range(4)) for p in IDS}
    observed = PhaseObservation(num_actors=phase.plan.num_actors,
                                generate_s=rng.uniform(1.2, 2.5) * phase.plan.predicted_time_s,
                                prefill_s=0.05 + rng.random() / 20, ran_prefill=phase.prefill is not None,
                                predicted_generate_s=phase.plan.predicted_time_s - phase.predicted_prefill_s,
                                predicted_prefill_s=phase.predicted_prefill_s, activation_s=phase.activation_s,
                                decode_scale=phase.calibration.decode_scale,
                                prefill_fixed_s=phase.calibration.prefill_fixed_s)
    spec = {"rounds": 10, "forwards_saved": rng.randint(1, 6), "seconds": 1.0, "plain_seconds_est": 1.1,
            "accepted_by_strategy": {"history": rng.randint(1, 9)}, "rejections_by_strategy": {"history": 3}}
    return StepRecord(step=step, epoch=inputs(step).epoch, lengths=lengths, phase=observed,
                      call_offsets={"generate": rng.uniform(0.3, 0.9)},
                      prewarm_s=None if step % 3 == 2 else rng.uniform(0.01, 0.15),
                      spec=(spec, None))


def run(steps: int, resume_at: int | None = None) -> list:
    """The phases planned over ``steps`` steps; at ``resume_at`` the planner is dropped and a
    new one is built from its state's JSON, as a resumed campaign builds it from its commit."""
    rng = random.Random(7)
    planner, phases = Planner(rules()), []
    for step in range(steps):
        if step == resume_at:
            planner = Planner(rules(), PlannerState.model_validate(json.loads(planner.state.model_dump_json())))
        phase = planner.plan(inputs(step))
        phases.append(phase)
        planner.observe(record(step, phase, rng))
    return phases


def test_a_resumed_planner_decides_as_the_uninterrupted_one():
    straight = run(8)
    # what the planner learned reaches its decisions (so the comparison covers it): the
    # measured error, the calibration, the call offsets, the pre-warm time and the speculation speed-up
    planner = Planner(rules())
    rng = random.Random(7)
    for step in range(3):
        planner.observe(record(step, planner.plan(inputs(step)), rng))
    memory = planner.state
    assert planner.tail_error() is not None and len(memory.phases) == 3 and memory.spec_speedup != 1.0
    assert straight[3].calibration.decode_scale > 1.0 and straight[3].prewarm_offset_s is not None
    assert any(p.prefill is not None for p in straight)
    assert len({(p.plan.num_actors, p.cut_after) for p in straight}) > 1  # the plans move as it learns
    for k in range(1, 8):
        assert run(8, resume_at=k) == straight, f"resumed at step {k}"


def test_forgetting_any_part_of_the_state_changes_a_decision():
    """The test above can fail: a planner resumed without one part of its memory decides otherwise."""
    rng = random.Random(7)
    planner = Planner(rules())
    for step in range(4):
        planner.observe(record(step, planner.plan(inputs(step)), rng))
    full = planner.state
    reference = Planner(rules(), full).plan(inputs(4))
    for part in ("errors", "phases", "call_history", "prewarm_s", "spec_speedup", "length_history"):
        partial = full.model_copy(update={part: PlannerState.model_fields[part].default})
        assert Planner(rules(), partial).plan(inputs(4)) != reference, part


def test_a_slow_pre_warm_ages_out_and_the_floor_leads_until_one_is_measured():
    """The lead is the longest pre-warm of the last ``CALL_HISTORY`` steps, at least the floor:
    one slow start skips the pre-warms after it only until it ages out; then one fires again."""
    from flows.planning.planner import CALL_HISTORY

    planner = Planner(rules(prewarm_floor_s=0.5, speculative=False))
    offsets = []
    for step in range(CALL_HISTORY + 4):
        phase = planner.plan(inputs(step))
        offsets.append(phase.prewarm_offset_s)
        took = None if phase.prewarm_offset_s is None else (8.0 if step == 1 else 0.6)
        planner.observe(StepRecord(step=step, epoch=inputs(step).epoch, lengths={}, call_offsets={"generate": 5.0},
                                   prewarm_s=took))
    assert offsets[0] is None  # no history
    assert offsets[1] == pytest.approx(5.0 - 0.1 - 0.5)  # nothing measured: the floor
    # the 8 s start could not be ready in time while it is among the last CALL_HISTORY steps
    assert offsets[2:CALL_HISTORY + 2] == [None] * CALL_HISTORY
    assert offsets[CALL_HISTORY + 2] == pytest.approx(5.0 - 0.1 - 0.5)  # it aged out
    assert offsets[CALL_HISTORY + 3] == pytest.approx(5.0 - 0.1 - 0.6)  # measured again


def test_observe_needs_a_plan_first():
    with pytest.raises(ValueError, match="plan"):
        Planner(rules()).observe(StepRecord(step=0, epoch=0, lengths={}))


def test_a_registered_policy_plans_by_its_name(monkeypatch):
    from flows.config import load_config
    from flows.planning import registry
    from flows.planning.plan import GenerationPlan

    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))  # the registration ends with the test
    calls = []

    def halves(prompt_ids, predicted, **kw):
        calls.append(kw["policy"])
        ids = list(prompt_ids)
        return GenerationPlan(kw["policy"], 2, (tuple(ids[:6]), tuple(ids[6:])), 1.0, 2.0)

    register_scaling_function("halves", halves)
    strategy = load_config(None, ["scaling.policy=halves"]).scaling.strategy
    assert strategy.name == "halves" and not strategy.times_fan_outs
    phase = Planner(rules(settings=PlannerSettings(policy=strategy, n_min=1, n_max=4, lam=0.7, assignment="ranked",
                                                   profile=PROFILE, cluster=CLUSTER))).plan(inputs(0))
    assert calls == ["halves"] and phase.plan.num_actors == 2 and phase.plan.policy == "halves"
    with pytest.raises(ValueError, match="scaling.policy='nope'"):
        load_config(None, ["scaling.policy=nope"])


def test_a_record_of_an_earlier_revision_resumes_with_what_its_planner_had_learned():
    from flows.campaign.state import CampaignState

    metrics = {"actors/n": 2.0, "timing_s/generate": 1.5, "timing_s/prefill": 0.1, "prefill/unique_prefixes": 1.0,
               "plan/predicted_generate_s": 1.0, "plan/predicted_prefill_s": 0.05, "plan/activation_s": 0.02,
               "plan/decode_scale": 1.0, "plan/prefill_fixed_s": 0.0}
    old = {"run_id": "r", "steps": [metrics, {"timing_s/generate": 1.0}], "spec_speedup": 1.3,
           "length_history": {"observations": {"3": [[0, 40.0]]}}, "call_history": {"generate": [0.4]}}
    data = CampaignState._planner_of_older_records(old)
    memory = PlannerState.model_validate(data["planner"])
    assert memory.spec_speedup == 1.3 and memory.call_history == {"generate": [0.4]}
    assert memory.length_history["observations"] == {"3": [[0, 40.0]]}
    assert memory.phases == [PhaseObservation.from_metrics(metrics)]  # the step without a plan record is not one
    assert "length_history" not in data and CampaignState._planner_of_older_records(data) is data


def test_phases_committed_without_their_hindsight_take_it_from_their_steps():
    """A run committed before each kept phase carried its hindsight prediction resumes with it
    (the calibration's hold on a length miss then applies to its old steps too); a phase whose
    step recorded none, or was not found, stays as it was."""
    from dataclasses import asdict

    from flows.campaign.state import CampaignState

    metrics = {"actors/n": 2.0, "timing_s/generate": 3.951, "timing_s/prefill": 0.0, "prefill/unique_prefixes": 0.0,
               "plan/predicted_generate_s": 0.137, "plan/predicted_prefill_s": 0.0, "plan/activation_s": 0.0076,
               "plan/decode_scale": 1.0, "plan/prefill_fixed_s": 0.0, "plan/hindsight_generate_s": 2.726}
    phase = asdict(PhaseObservation.from_metrics({**metrics, "plan/hindsight_generate_s": None}))
    # no step was planned and measured as these: each differs from the step in one of the three
    others = [{**phase, "generate_s": 1.0}, {**phase, "predicted_generate_s": 0.2}, {**phase, "decode_scale": 2.0}]
    data = {"planner": {"phases": [phase, *others]}, "steps": [metrics, {"timing_s/generate": 1.0}]}
    out = CampaignState._hindsight_of_older_phases(data)
    assert out["planner"]["phases"] == [{**phase, "hindsight_generate_s": 2.726}, *others]
    assert PlannerState.model_validate(out["planner"]).phases[0] == PhaseObservation.from_metrics(metrics)
    assert CampaignState._hindsight_of_older_phases(out) is out  # nothing left to fill


def test_only_the_registry_reads_the_policy_text():
    """``scaling.policy`` is parsed once into a strategy; no other module compares or splits its text."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    inspects = re.compile(r"policy\s*==|==\s*\"cost_aware\"|policy\.(startswith|partition|split)\(|"
                          r"startswith\(\"fixed:")
    assert inspects.search('if s.policy.startswith("fixed:"):')  # what the check looks for
    found = [f"{p.relative_to(root)}:{n}" for p in sorted((root / "flows").rglob("*.py"))
             if p.name != "registry.py"
             for n, line in enumerate(p.read_text().splitlines(), start=1) if inspects.search(line)]
    assert not found, found


@pytest.mark.parametrize("no_plan", [dict(prefill_capacity=None), dict(prefill_action="never")])
def test_without_a_prefill_plan_no_prefill_action_is_timed(no_plan):
    """The flow runs the prefill action only for a dedup plan (``flows/step/flow.py``): with
    ``dedup_prefill`` off (no capacity) the plan is the one with the action turned off, no
    prefill time and no prefix KV sent to the remote actors."""
    off = Planner(rules(**no_plan)).plan(inputs(0))
    assert off.prefill is None and off.predicted_prefill_s == 0.0
    # the same decode-only timeline the KV-free cluster gives: no phantom prefill or KV transfer
    free = replace(CLUSTER, prefill_action=False, kv_bytes_per_token=0.0)
    settings = replace(rules().settings, cluster=free)
    alone = Planner(rules(settings=settings, prefill_capacity=None)).plan(inputs(0))
    assert off.plan.candidates == alone.plan.candidates and off.plan.num_actors == alone.plan.num_actors
    # the simulator's prefill actor computes every prompt in full: that one is still timed
    full = Planner(rules(prefill_capacity=None, full_prefill_action=True)).plan(inputs(0))
    assert full.prefill is None and full.predicted_prefill_s > 0.0


def test_the_prefill_action_is_timed_on_the_unique_prefixes_and_the_suffixes_on_the_actions():
    """Prompt 0 is the 60-token template alone and every other one adds 3 tokens: with
    capacity 1 the prefix is the template, which the prefill action computes once
    (``actions/prefill.py``), and the generation actions their prompts' suffixes; fixed:1
    holds all 12 prompts, so it ends 11 x 3 suffix tokens later than with none."""
    prompts = {p: TEMPLATE + [p] * 3 * (p > 0) for p in IDS}
    step = replace(inputs(0), prompts=prompts, prompt_lengths={p: len(t) for p, t in prompts.items()})
    settings = replace(rules().settings, policy=parse_scaling_policy("fixed:1"), objective="paper")
    phase = Planner(rules(settings=settings, prefill_capacity=1, speculative=False, calibrated=False)).plan(step)
    assert phase.prefill.prefix_len == 60 and phase.prefill.prefix_tokens == 60
    assert phase.predicted_prefill_s == pytest.approx(60 / 2000.0 + 0.02)  # + the activation
    from flows.planning.scaling import plan_generation
    decode_only = plan_generation(IDS, phase.predicted, group_size=4, prompt_lengths=step.prompt_lengths,
                                  settings=settings, prefill_tokens=60)
    assert phase.plan.predicted_time_s == pytest.approx(decode_only.predicted_time_s + 33 / 2000.0)
