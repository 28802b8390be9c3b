"""A phase's prediction redone at the lengths it observed: the length predictor's part of the
planner's error (``flows/planning/hindsight.py``), reported beside the error against the
measured time (``flows/step/metrics.py: planner_fidelity``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_planner import IDS, inputs, rules

from flows.planning.calibration import LENGTH_MISS_ABSORBED, calibrate
from flows.planning.planner import PhaseInputs, Planner
from flows.planning.record import PhaseObservation, StepRecord
from flows.planning.registry import parse_scaling_policy
from flows.step.metrics import planner_fidelity


def _observation(phase, generate_s: float) -> PhaseObservation:
    return PhaseObservation(num_actors=phase.plan.num_actors, generate_s=generate_s, prefill_s=0.05,
                            ran_prefill=phase.prefill is not None,
                            predicted_generate_s=phase.plan.predicted_time_s - phase.predicted_prefill_s,
                            predicted_prefill_s=phase.predicted_prefill_s, activation_s=phase.activation_s,
                            decode_scale=phase.calibration.decode_scale,
                            prefill_fixed_s=phase.calibration.prefill_fixed_s)


def _planner(policy: str) -> Planner:
    r = rules(speculative=False)
    return Planner(replace(r, settings=replace(r.settings, policy=parse_scaling_policy(policy))))


@pytest.mark.parametrize("policy", ["cost_aware", "fixed:2"])
def test_lengths_as_predicted_leave_the_prediction_as_it_was(policy):
    planner = _planner(policy)
    lengths = {p: float(8 + 5 * p) for p in IDS}  # whole tokens: the observation can equal them
    phase = planner.plan(replace(inputs(0), known_lengths=lengths))
    record = StepRecord(step=0, epoch=0, lengths={p: (int(v), 3) for p, v in lengths.items()},
                        phase=_observation(phase, 1.0))
    assert planner.hindsight_generate_s(record) == pytest.approx(record.phase.predicted_generate_s, rel=1e-12)


@pytest.mark.parametrize("policy", ["cost_aware", "fixed:2"])
@pytest.mark.parametrize("factor, low, high", [(0.5, 0.3, 0.7), (2.0, 1.6, 2.6)])
def test_the_prediction_follows_the_lengths_observed(policy, factor, low, high):
    """Responses half (twice) as long as predicted: about half (twice) the decoding."""
    planner = _planner(policy)
    phase = planner.plan(replace(inputs(0), reference_lengths={p: 40.0 + 10 * p for p in IDS}))
    real = {p: (max(1, round(phase.predicted[p] * factor)), 1) for p in IDS}
    record = StepRecord(step=0, epoch=0, lengths=real, phase=_observation(phase, 1.0))
    a, pred = phase.activation_s, record.phase.predicted_generate_s
    assert low < (planner.hindsight_generate_s(record) - a) / (pred - a) < high


@pytest.mark.parametrize("factor", [0.7, 0.05, 3.0])
def test_the_calibration_learns_from_the_prediction_up_to_a_steady_bias(factor):
    """Lengths 0.7x the predicted (a steady bias, as the upper-quartile predictions have) or
    0.05x (a phase mostly what the profile does not time): the decode scale learned is
    measured / predicted, the miss absorbed with the speed (hindsight.py says why). Lengths 3x
    (no steady predictor misses so): the observation keeps its hindsight and the scale takes
    the speed with the miss held to ``LENGTH_MISS_ABSORBED``."""
    planner = _planner("fixed:2")
    phase = planner.plan(replace(inputs(0), reference_lengths={p: 40.0 + 10 * p for p in IDS}))
    a = phase.activation_s
    observed = _observation(phase, 0.0)
    observed = replace(observed, generate_s=a + 1.8 * (observed.predicted_generate_s - a))
    record = StepRecord(step=0, epoch=0, lengths={p: (max(1, round(v * factor)),) for p, v in phase.predicted.items()},
                        phase=observed)
    hindsight = planner.hindsight_generate_s(record)
    miss = (hindsight - a) / (observed.predicted_generate_s - a)
    assert (miss < 0.8) if factor < 1 else (miss > LENGTH_MISS_ABSORBED)
    planner.observe(record)
    kept = planner.state.phases[-1]
    assert kept.hindsight_generate_s == pytest.approx(hindsight)
    expected = 1.8 if factor < 1 else 1.8 / miss * LENGTH_MISS_ABSORBED  # the speed, 1.8 / miss, at twice the lengths
    assert calibrate(planner.state.phases).decode_scale == pytest.approx(expected)


def test_a_prompt_with_no_finished_sample_stays_at_its_prediction():
    planner = _planner("fixed:2")
    lengths = {p: float(8 + 5 * p) for p in IDS}
    phase = planner.plan(PhaseInputs(prompt_ids=IDS, epoch=0, prompt_lengths=inputs(0).prompt_lengths,
                                     reference_lengths=lengths, known_lengths=lengths))
    seen = {p: (int(v),) for p, v in lengths.items() if p != IDS[-1]}  # the last prompt: every sample cut
    record = StepRecord(step=0, epoch=0, lengths=seen, phase=_observation(phase, 1.0))
    assert planner.hindsight_generate_s(record) == pytest.approx(record.phase.predicted_generate_s, rel=1e-12)
    assert planner.hindsight_generate_s(replace(record, phase=None)) is None  # nothing measured


def test_fidelity_reports_the_length_predictors_part():
    steps = [{"plan/predicted_generate_s": p, "plan/hindsight_generate_s": h, "timing_s/generate": 1.0}
             for p, h in ((1.5, 1.0), (1.2, 1.0), (3.0, 2.0))]
    steps.append({"plan/predicted_generate_s": 9.0, "timing_s/generate": 1.0})  # an older revision's step
    lengths = planner_fidelity(steps)["lengths"]
    assert lengths["steps"] == 3 and lengths["median_relative_error"] == pytest.approx(0.5)
    assert planner_fidelity(steps)["generate"]["steps"] == 4


def test_fidelity_p90_is_the_90th_percentile_not_the_largest_error():
    steps = [{"plan/predicted_generate_s": 1.0 + k / 100, "timing_s/generate": 1.0} for k in range(1, 21)]
    g = planner_fidelity(steps)["generate"]
    assert g["p90_abs_relative_error"] == pytest.approx(0.18) and g["median_relative_error"] == pytest.approx(0.105)
