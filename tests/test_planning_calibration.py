"""Fixed costs learned from the campaign's steps (flows/planning/calibration.py)."""

from __future__ import annotations

import random

import pytest

from flows.planning.calibration import FixedCosts, learn_fixed_costs
from flows.planning.plan import ClusterSpec
from flows.planning.timeline import prefill_seconds
from flows.planning.tpot import TpotProfile

TRUE_A, TRUE_P = 0.045, 0.060  # what activations really cost beyond compute, seconds


def _step(used: FixedCosts, gen_compute: float, prefill_compute: float, *, prefill_ran: bool = True,
          noise: float = 0.0) -> dict[str, float]:
    """A step planned with ``used`` whose phases really took compute + the true fixed costs."""
    return {"plan/activation_s": used.activation_s, "plan/prefill_fixed_s": used.prefill_fixed_s,
            "plan/predicted_generate_s": gen_compute + used.activation_s,
            "plan/predicted_prefill_s": prefill_compute + used.activation_s + used.prefill_fixed_s,
            "timing_s/generate": gen_compute + TRUE_A + noise,
            "timing_s/prefill": (prefill_compute + TRUE_A + TRUE_P + noise) if prefill_ran else 0.0,
            "prefill/unique_prefixes": 4.0 if prefill_ran else 0.0}


def test_the_planted_fixed_costs_are_recovered_and_stay_put_once_learned():
    rng = random.Random(0)
    used, steps = FixedCosts(0.007), []
    for _ in range(10):
        steps.append(_step(used, rng.uniform(0.05, 0.3), rng.uniform(0.01, 0.05)))
        used = learn_fixed_costs(steps, 0.007)
        assert used.activation_s == pytest.approx(TRUE_A) and used.prefill_fixed_s == pytest.approx(TRUE_P)
    # planned with the learned costs, the predictions now equal the measurements
    last = steps[-1]
    assert last["plan/predicted_generate_s"] == pytest.approx(last["timing_s/generate"])
    assert last["plan/predicted_prefill_s"] == pytest.approx(last["timing_s/prefill"])


def test_one_disturbed_step_does_not_move_the_median():
    used = FixedCosts(0.007)
    steps = [_step(used, 0.1, 0.02) for _ in range(6)] + [_step(used, 0.1, 0.02, noise=3.0)]  # a cold worker
    learned = learn_fixed_costs(steps, 0.007)
    assert learned.activation_s == pytest.approx(TRUE_A) and learned.prefill_fixed_s == pytest.approx(TRUE_P)


def test_only_the_window_counts():
    old = [_step(FixedCosts(0.007), 0.1, 0.02, noise=1.0) for _ in range(8)]  # an earlier, slower regime
    new = [_step(FixedCosts(0.007), 0.1, 0.02) for _ in range(8)]
    assert learn_fixed_costs(old + new, 0.007, window=8).activation_s == pytest.approx(TRUE_A)


def test_no_steps_and_steps_without_a_record_give_the_measured_round_trip():
    assert learn_fixed_costs([], 0.007) == FixedCosts(0.007, 0.0)
    legacy = {"timing_s/generate": 9.0, "plan/predicted_generate_s": 0.1}  # planned before this was recorded
    assert learn_fixed_costs([legacy], 0.007) == FixedCosts(0.007, 0.0)


def test_never_below_the_measured_round_trip_and_prefill_only_when_it_ran():
    fast = _step(FixedCosts(0.2, 0.3), 0.1, 0.02, prefill_ran=False)  # over-predicted, no prefill action
    learned = learn_fixed_costs([fast], 0.007)
    assert learned.activation_s == pytest.approx(TRUE_A) and learned.prefill_fixed_s == 0.0
    assert learn_fixed_costs([fast], 0.5).activation_s == 0.5


def test_the_prefill_prediction_includes_the_learned_cost():
    profile = TpotProfile((1, 2), (4.0, 8.0), ((0.001, 0.002), (0.002, 0.003)), 1000.0, name="m")
    base = ClusterSpec(gpus_per_actor=1, max_actors=2, activation_s=0.01)
    with_fixed = ClusterSpec(gpus_per_actor=1, max_actors=2, activation_s=0.01, prefill_fixed_s=0.05)
    assert prefill_seconds(500, profile, with_fixed) - prefill_seconds(500, profile, base) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="prefill_fixed_s"):
        ClusterSpec(gpus_per_actor=1, max_actors=1, prefill_fixed_s=-1.0)
