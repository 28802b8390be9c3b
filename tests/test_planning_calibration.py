"""The live planner's corrections learned from the campaign's steps (flows/planning/calibration.py)."""

from __future__ import annotations

import random

import pytest

from flows.planning.calibration import LENGTH_MISS_ABSORBED, WINDOW, Calibration, calibration_memory
from flows.planning.calibration import calibrate as _calibrate
from flows.planning.plan import ClusterSpec
from flows.planning.record import PhaseObservation
from flows.planning.timeline import prefill_seconds
from flows.planning.tpot import TpotProfile


def calibrate(steps, **kw):
    """The calibration of steps given as committed metrics (``PhaseObservation.from_metrics``)."""
    return _calibrate([o for m in steps if (o := PhaseObservation.from_metrics(m)) is not None], **kw)


A = 0.007  # the measured round trip of an empty activation, seconds
TRUE_SCALE, TRUE_PREFILL = 1.8, 0.060  # how much slower decoding really is; the prefill's own fixed work


def _step(used: Calibration, decode: float, prefill_compute: float, *, prefill_ran: bool = True,
          noise: float = 0.0) -> dict[str, float]:
    """A step planned with ``used`` whose profile says ``decode`` seconds of decoding."""
    return {"plan/decode_scale": used.decode_scale, "plan/prefill_fixed_s": used.prefill_fixed_s,
            "plan/activation_s": A,
            "plan/predicted_generate_s": used.decode_scale * decode + A,
            "plan/predicted_prefill_s": prefill_compute + A + used.prefill_fixed_s,
            "timing_s/generate": TRUE_SCALE * decode + A + noise,
            "timing_s/prefill": (prefill_compute + A + TRUE_PREFILL + noise) if prefill_ran else 0.0,
            "prefill/unique_prefixes": 4.0 if prefill_ran else 0.0}


def test_the_planted_corrections_are_recovered_and_stay_put_once_learned():
    rng = random.Random(0)
    used, steps = Calibration(), []
    for _ in range(10):
        steps.append(_step(used, rng.uniform(0.05, 0.3), rng.uniform(0.01, 0.05)))
        used = calibrate(steps)
        assert used.decode_scale == pytest.approx(TRUE_SCALE) and used.prefill_fixed_s == pytest.approx(TRUE_PREFILL)
    # planned with what was learned, the predictions equal the measurements
    last = steps[-1]
    assert last["plan/predicted_generate_s"] == pytest.approx(last["timing_s/generate"])
    assert last["plan/predicted_prefill_s"] == pytest.approx(last["timing_s/prefill"])


def test_one_disturbed_step_does_not_move_the_medians():
    steps = [_step(Calibration(), 0.1, 0.02) for _ in range(6)] + [_step(Calibration(), 0.1, 0.02, noise=3.0)]
    learned = calibrate(steps)
    assert learned.decode_scale == pytest.approx(TRUE_SCALE) and learned.prefill_fixed_s == pytest.approx(TRUE_PREFILL)


def test_only_the_window_counts():
    old = [_step(Calibration(), 0.1, 0.02, noise=1.0) for _ in range(8)]  # an earlier, slower regime
    new = [_step(Calibration(), 0.1, 0.02) for _ in range(8)]
    assert calibrate(old + new, window=8).decode_scale == pytest.approx(TRUE_SCALE)


def test_without_recorded_steps_nothing_is_corrected():
    assert calibrate([]) == Calibration()
    legacy = {"timing_s/generate": 9.0, "plan/predicted_generate_s": 0.1}  # planned before this was recorded
    assert calibrate([legacy]) == Calibration()


def test_the_prefill_cost_is_kept_once_the_prefill_action_stops_running():
    ran = [_step(Calibration(), 0.1, 0.02) for _ in range(3)]
    skipped = [_step(Calibration(), 0.1, 0.02, prefill_ran=False) for _ in range(20)]
    assert calibrate(ran + skipped, window=8).prefill_fixed_s == pytest.approx(TRUE_PREFILL)


def test_prefill_only_when_it_ran_and_a_stalled_step_is_clamped():
    assert calibrate([_step(Calibration(), 0.1, 0.02, prefill_ran=False)]).prefill_fixed_s == 0.0
    assert calibrate([_step(Calibration(), 0.01, 0.02, noise=60.0)]).decode_scale == 50.0


def test_a_loaded_machines_slowdown_is_learned_whole():
    """25x the profile's decode steps (a quiet-moment profile, a loaded machine) is a speed,
    learned as such; a step stalled far beyond it is left out by the median."""
    used = Calibration()
    a = A
    steps = [{**_step(used, 0.1, 0.02), "timing_s/generate": a + 25.0 * 0.1} for _ in range(5)]
    steps.append({**_step(used, 0.1, 0.02), "timing_s/generate": a + 900.0 * 0.1})
    assert calibrate(steps).decode_scale == pytest.approx(25.0)


def test_the_corrected_profile_and_prefill_time():
    profile = TpotProfile((1, 2), (4.0, 8.0), ((0.001, 0.002), (0.002, 0.003)), 1000.0, name="m")
    scaled = Calibration(decode_scale=2.0).profile(profile)
    assert scaled.tpot(2, 8.0) == pytest.approx(2 * profile.tpot(2, 8.0))
    assert scaled.prefill_tokens_per_s == profile.prefill_tokens_per_s
    assert Calibration().profile(profile) is profile
    base = ClusterSpec(gpus_per_actor=1, max_actors=2, activation_s=0.01)
    with_fixed = ClusterSpec(gpus_per_actor=1, max_actors=2, activation_s=0.01, prefill_fixed_s=0.05)
    assert prefill_seconds(500, profile, with_fixed) - prefill_seconds(500, profile, base) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="prefill_fixed_s"):
        ClusterSpec(gpus_per_actor=1, max_actors=1, prefill_fixed_s=-1.0)


def test_each_fan_out_keeps_the_speed_measured_at_it():
    """On a pool whose actions share the cores, one actor decodes faster than two (it has all the
    cores): the scales learned per fan-out recover each, where the one overall scale is wrong
    for both; a fan-out never run falls back to the overall scale."""
    rng = random.Random(1)
    true = {1: 1.2, 2: 2.4}
    used, steps = Calibration(), []
    for i in range(16):
        n = 1 + i % 2
        decode = rng.uniform(0.05, 0.3)
        planned = used.for_actors(n)
        steps.append({"plan/decode_scale": planned.decode_scale, "plan/activation_s": A, "actors/n": float(n),
                      "plan/predicted_generate_s": planned.decode_scale * decode + A,
                      "timing_s/generate": true[n] * decode + A, "plan/predicted_prefill_s": 0.0,
                      "timing_s/prefill": 0.0, "prefill/unique_prefixes": 0.0})
        used = calibrate(steps)
    assert dict(used.by_actors) == pytest.approx(true)
    assert used.for_actors(1).decode_scale == pytest.approx(1.2)
    assert used.for_actors(2).decode_scale == pytest.approx(2.4)
    assert 1.2 < used.decode_scale < 2.4 and used.for_actors(3).decode_scale == used.decode_scale


def test_a_phase_spent_starting_an_engine_gives_no_decode_reading():
    """Three steps at one actor, then one at two that paid a vLLM engine's 18 s start, then
    twenty more at one: read as decoding, that start made two actors 46x slower for the rest of
    the run. A start under a quarter of the phase (a torch model loaded), or longer than the
    whole phase (a pre-warm's, reported with the next result), still gives a reading."""
    def step(n: int, decode: float, start: float = 0.0) -> dict[str, float]:
        return {"plan/decode_scale": 1.0, "plan/activation_s": A, "actors/n": float(n),
                "plan/predicted_generate_s": decode + A, "timing_s/generate": 1.1 * decode + A + start,
                "plan/predicted_prefill_s": 0.0, "timing_s/prefill": 0.0, "prefill/unique_prefixes": 0.0,
                "engine/start_s_max": start}

    steps = [step(1, 0.4)] * 3 + [step(2, 0.4, start=18.1)] + [step(1, 0.4)] * 20
    used = calibrate(steps)
    assert dict(used.by_actors) == pytest.approx({1: 1.1}) and used.for_actors(2).decode_scale == pytest.approx(1.1)
    steps.append(step(2, 0.4, start=0.05))  # 0.05 s of a 0.49 s phase: the phase still times decoding
    assert dict(calibrate(steps).by_actors)[2] == pytest.approx((1.1 * 0.4 + 0.05) / 0.4)
    prewarmed = {**step(3, 0.4), "engine/start_s_max": 5.0}  # longer than the phase: a pre-warm's, before it
    assert dict(calibrate([*steps, prewarmed]).by_actors)[3] == pytest.approx(1.1)
    observed = [PhaseObservation.from_metrics(m) for m in steps]
    assert _calibrate(calibration_memory(observed)) == _calibrate(observed)


def test_the_memory_a_campaign_keeps_calibrates_as_the_whole_history_and_stays_bounded():
    """``calibration_memory`` keeps only what ``calibrate`` reads: the same corrections as from
    every step, after every step of a long run, from a memory a few windows long."""
    rng = random.Random(2)
    every, memory = [], []
    for i in range(400):
        n = rng.choice([1, 1, 2, 4]) if i < 200 else 1  # fan-outs 2 and 4 stop being chosen
        ran = i < 50  # the prefill action stops running
        observed = PhaseObservation(num_actors=n, generate_s=rng.uniform(0.0, 2.0), prefill_s=rng.uniform(0, 0.2),
                                    ran_prefill=ran, predicted_generate_s=rng.uniform(0.0, 2.0),
                                    predicted_prefill_s=0.05, activation_s=rng.choice([0.0, 0.01, 0.5]),
                                    decode_scale=rng.uniform(0.5, 2.0), prefill_fixed_s=0.01)
        every.append(observed)
        memory = calibration_memory([*memory, observed])
        assert _calibrate(memory) == _calibrate(every), i
        assert len(memory) <= 5 * WINDOW  # last window, three fan-outs, prefills
    assert memory[-WINDOW:] == every[-WINDOW:]
    assert sum(m.ran_prefill for m in memory) == WINDOW and {m.num_actors for m in memory} == {1, 2, 4}


def _first_step(hindsight: float | None, predicted: float = 0.137, measured: float = 3.951) -> dict[str, float]:
    """A campaign's first step as measured (512 samples, up to 128 tokens, two actions): planned
    at scale 1 from no observed length, ``hindsight`` its phase timed at the observed lengths."""
    out = {**_step(Calibration(), 0.1, 0.02, prefill_ran=False), "plan/predicted_generate_s": predicted,
           "timing_s/generate": measured}
    return out if hindsight is None else {**out, "plan/hindsight_generate_s": hindsight}


def test_a_length_miss_beyond_a_steady_bias_is_not_read_as_speed():
    """Predicted 0.137 s, 2.726 s at the observed lengths (20x), measured 3.951 s: the speed is
    1.45x the profile's and the scale takes it with twice the lengths at most, not 29x."""
    speed = (3.951 - A) / (2.726 - A)
    assert calibrate([_first_step(2.726)]).decode_scale == pytest.approx(speed * LENGTH_MISS_ABSORBED)
    assert calibrate([_first_step(None)]).decode_scale == pytest.approx((3.951 - A) / (0.137 - A))  # no hindsight


@pytest.mark.parametrize("hindsight", [A, A + 1e-4, 0.05, 1.0])
def test_lengths_far_shorter_than_predicted_are_absorbed_whole(hindsight):
    """Lengths far shorter than predicted leave a phase timed mostly by what the profile does not
    time: the measured time over a small hindsight is no speed, so the reading stays measured
    over predicted, with no jump as the hindsight nears the activation's fixed cost."""
    step = _first_step(hindsight, predicted=2.0, measured=2.0)
    assert calibrate([step]).decode_scale == pytest.approx(1.0)


@pytest.mark.parametrize("bias", [0.3, 0.53, 0.65, 0.94, 1.6, LENGTH_MISS_ABSORBED])
def test_a_steady_length_bias_is_absorbed_with_the_speed_as_before(bias):
    """Up to ``LENGTH_MISS_ABSORBED`` the hindsight changes nothing: the scale is measured over
    predicted, the steady bias of the upper-quartile predictions corrected with the speed; the
    reading is continuous where the hold starts."""
    step = _step(Calibration(), 0.1, 0.02, prefill_ran=False)
    step["plan/hindsight_generate_s"] = A + bias * (step["plan/predicted_generate_s"] - A)
    expected = (step["timing_s/generate"] - A) / (step["plan/predicted_generate_s"] - A)
    assert calibrate([step]).decode_scale == pytest.approx(expected)
    step["plan/hindsight_generate_s"] = A + bias * 1.001 * (step["plan/predicted_generate_s"] - A)
    assert calibrate([step]).decode_scale == pytest.approx(expected, rel=2e-3)
