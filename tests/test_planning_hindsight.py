"""The calibration learns the decode speed, not the length predictor's error
(``flows/planning/hindsight.py``, ``flows/planning/calibration.py``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_planner import IDS, inputs, rules

from flows.planning.calibration import calibrate
from flows.planning.planner import PhaseInputs, Planner
from flows.planning.record import PhaseObservation, StepRecord
from flows.planning.registry import parse_scaling_policy

TRUE_SCALE = 1.8  # the machine decodes this much slower than the profile says


def _observation(phase, generate_s: float) -> PhaseObservation:
    return PhaseObservation(num_actors=phase.plan.num_actors, generate_s=generate_s, prefill_s=0.05,
                            ran_prefill=phase.prefill is not None,
                            predicted_generate_s=phase.plan.predicted_time_s - phase.predicted_prefill_s,
                            predicted_prefill_s=phase.predicted_prefill_s, activation_s=phase.activation_s,
                            decode_scale=phase.calibration.decode_scale,
                            prefill_fixed_s=phase.calibration.prefill_fixed_s)


def _planned(policy: str) -> Planner:
    r = rules(speculative=False)
    return Planner(replace(r, settings=replace(r.settings, policy=parse_scaling_policy(policy))))


@pytest.mark.parametrize("policy", ["cost_aware", "fixed:2"])
def test_lengths_as_predicted_leave_the_prediction_as_it_was(policy):
    planner = _planned(policy)
    lengths = {p: float(8 + 5 * p) for p in IDS}  # whole tokens: the observation can equal them
    phase = planner.plan(replace(inputs(0), known_lengths=lengths))
    observed = planner.observe(StepRecord(step=0, epoch=0, lengths={p: (int(v), 3) for p, v in lengths.items()},
                                          phase=_observation(phase, 1.0)))
    assert observed.hindsight_generate_s == pytest.approx(observed.predicted_generate_s, rel=1e-12)


@pytest.mark.parametrize("policy", ["cost_aware", "fixed:2"])
def test_an_over_predicted_length_is_not_taken_for_a_fast_machine(policy):
    """The references ran twice the real responses. The step took TRUE_SCALE x what its plan
    takes at the lengths it really had: the decode scale learned is TRUE_SCALE, not about half
    of it, so the next epoch, predicted from the history (the real lengths), is timed right."""
    planner = _planned(policy)
    first = planner.plan(replace(inputs(0), reference_lengths={p: 40.0 + 10 * p for p in IDS}))
    real = {p: (max(1, round(first.predicted[p] / 2)),) * 4 for p in IDS}
    # the measured phase, known here from the observation's hindsight (observe computes it)
    probe = Planner(planner.rules, planner.state)
    probe.plan(replace(inputs(0), reference_lengths={p: 40.0 + 10 * p for p in IDS}))
    pred = _observation(first, 1.0)
    h = probe.observe(StepRecord(step=0, epoch=0, lengths=real, phase=pred)).hindsight_generate_s
    a = first.activation_s
    assert 0.3 < (h - a) / (pred.predicted_generate_s - a) < 0.7  # about half the work
    measured = a + TRUE_SCALE * (h - a)
    observed = planner.observe(StepRecord(step=0, epoch=0, lengths=real, phase=_observation(first, measured)))
    assert observed.hindsight_generate_s == pytest.approx(h)
    assert calibrate([observed]).decode_scale == pytest.approx(TRUE_SCALE)
    # without the hindsight, the length error would have been learned as speed
    assert calibrate([replace(observed, hindsight_generate_s=None)]).decode_scale < 0.7 * TRUE_SCALE


def test_a_record_without_hindsight_calibrates_from_the_prediction():
    m = {"plan/decode_scale": 1.0, "plan/prefill_fixed_s": 0.0, "plan/activation_s": 0.0,
         "plan/predicted_generate_s": 2.0, "plan/predicted_prefill_s": 0.0, "timing_s/generate": 3.0,
         "timing_s/prefill": 0.0, "actors/n": 1.0}
    old = PhaseObservation.from_metrics(m)
    assert old.hindsight_generate_s is None and calibrate([old]).decode_scale == pytest.approx(1.5)
    new = PhaseObservation.from_metrics(m | {"plan/hindsight_generate_s": 1.0})
    assert calibrate([new]).decode_scale == pytest.approx(3.0)


def test_a_prompt_with_no_finished_sample_stays_at_its_prediction():
    planner = _planned("fixed:2")
    lengths = {p: float(8 + 5 * p) for p in IDS}
    phase = planner.plan(PhaseInputs(prompt_ids=IDS, epoch=0, prompt_lengths=inputs(0).prompt_lengths,
                                     reference_lengths=lengths, known_lengths=lengths))
    seen = {p: (int(v),) for p, v in lengths.items() if p != IDS[-1]}  # the last prompt: every sample cut
    observed = planner.observe(StepRecord(step=0, epoch=0, lengths=seen, phase=_observation(phase, 1.0)))
    assert observed.hindsight_generate_s == pytest.approx(observed.predicted_generate_s, rel=1e-12)
