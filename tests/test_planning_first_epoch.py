"""Learned first-epoch length prediction (flows/planning/first_epoch.py) and its use by
``lengths.predict_lengths`` with the paper's rule as the fallback."""

import json
import math
import random

import numpy as np
import pytest

from flows.planning import first_epoch as fe
from flows.planning.first_epoch import fit_lengths, predict_group_max
from flows.planning.lengths import LengthHistory, predict_lengths, rank_correlation


def planted(n: int, seed: int, ref_power: float, prompt_power: float, sd: float,
            scale: float = 3.0, cap: float | None = None) -> list[tuple[float, float | None, float]]:
    """(reference, prompt, group max) rows with group max = scale * ref^ref_power *
    prompt^prompt_power * lognormal(0, sd), capped."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ref, prompt = rng.uniform(20, 600), rng.uniform(50, 700)
        y = scale * ref ** ref_power * prompt ** prompt_power * math.exp(rng.gauss(0.0, sd))
        out.append((ref, prompt, min(cap, y) if cap else y))
    return out


def fit_rows(rows, cap):
    """fit_lengths of (reference, prompt, group max) rows."""
    refs, prompts, maxes = zip(*rows) if rows else ((), (), ())
    return fit_lengths(refs, prompts, maxes, cap=cap)


def record(history: LengthHistory, rows, start: int = 0) -> None:
    for pid, (ref, prompt, top) in enumerate(rows, start=start):
        history.record(pid, 0, [round(top)], ref, prompt)


def test_fit_recovers_a_planted_relation():
    fit = fit_rows(planted(600, seed=1, ref_power=0.8, prompt_power=0.3, sd=0.2), cap=None)
    assert fit is not None and fit.num_observations == 600
    # The prior (16 pseudo-observations at b = 1, c = 0) biases the slopes by ~3% of the gap.
    assert fit.slope_ref == pytest.approx(0.8, abs=0.04)
    assert fit.slope_prompt == pytest.approx(0.3, abs=0.05)
    assert fit.sd == pytest.approx(0.2, abs=0.02)
    # Prediction: the fitted log-mean plus the upper quartile's z (0.674) times the spread.
    expected = 3.0 * 100 ** 0.8 * 400 ** 0.3 * math.exp(0.6745 * 0.2)
    assert predict_group_max(fit, 100, 400, cap=None) == pytest.approx(expected, rel=0.06)


def test_prompt_length_changes_the_ranking_only_when_it_carries_signal():
    rng = random.Random(5)
    queries = [(rng.uniform(20, 600), rng.uniform(50, 700)) for _ in range(200)]
    truth = [r ** 0.5 * p ** 0.5 for r, p in queries]
    by_ref = [r for r, _ in queries]
    with_signal = fit_rows(planted(400, 2, 0.5, 0.5, 0.1), cap=None)
    preds = [predict_group_max(with_signal, r, p, None) for r, p in queries]
    assert rank_correlation(preds, truth) > 0.98 > rank_correlation(by_ref, truth) + 0.2
    # No signal in prompt length: its slope stays near 0 and the ranking is the reference's.
    without = fit_rows(planted(400, 3, 1.0, 0.0, 0.3), cap=None)
    assert abs(without.slope_prompt) < 0.06
    preds = [predict_group_max(without, r, p, None) for r, p in queries]
    assert rank_correlation(preds, by_ref) > 0.99


def test_too_little_data_gives_no_fit_and_the_paper_rule():
    assert fit_rows([], cap=None) is None
    few = planted(fe.MIN_OBSERVATIONS - 1, 4, 0.8, 0.0, 0.2)
    assert fit_rows(few, cap=None) is None
    h = LengthHistory()
    record(h, few)
    new = {1000: 50, 1001: 300}
    learned = predict_lengths(h, list(new), new, first_epoch="learned", max_length=2048,
                              prompt_lengths={1000: 100, 1001: 100})
    assert learned == predict_lengths(h, list(new), new, first_epoch="reference", max_length=2048)
    # ... and with enough data the learned fit takes over.
    record(h, planted(64, 5, 0.8, 0.0, 0.2), start=100)
    assert predict_lengths(h, list(new), new, first_epoch="learned", max_length=2048) != \
        predict_lengths(h, list(new), new, first_epoch="reference", max_length=2048)
    with pytest.raises(ValueError, match="one of each per prompt"):
        fit_lengths([1.0], [], [2.0], cap=None)


def test_missing_features_fall_back_cleanly():
    # Prompt lengths never recorded: the fit uses the reference alone.
    rows = [(ref, None, top) for ref, _, top in planted(300, 6, 0.7, 0.0, 0.2)]
    fit = fit_rows(rows, cap=None)
    assert fit.slope_prompt == 0.0 and fit.slope_ref == pytest.approx(0.7, abs=0.04)
    # A query without a prompt length sits at the mean prompt length.
    fit = fit_rows(planted(300, 7, 0.8, 0.3, 0.2), cap=None)
    at_mean = predict_group_max(fit, 100, math.exp(fit.mean_prompt), None)
    assert predict_group_max(fit, 100, None, None) == pytest.approx(at_mean)
    # A prompt without a reference length (0 tokens) keeps the paper's rule: 0 x scale.
    h = LengthHistory()
    record(h, planted(100, 8, 0.8, 0.0, 0.2))
    pred = predict_lengths(h, [500, 501], {500: 0, 501: 100}, first_epoch="learned")
    assert pred[500] == 0.0 and pred[501] > 0
    with pytest.raises(ValueError, match="first_epoch"):
        predict_lengths(h, [500], {500: 1}, first_epoch="model")


def test_deterministic_and_independent_of_recording_order():
    rows = planted(200, 9, 0.8, 0.1, 0.25, cap=800)
    histories = []
    for order in (range(200), reversed(range(200))):
        h = LengthHistory()
        for pid in order:
            ref, prompt, top = rows[pid]
            h.record(pid, 0, [round(top)], ref, prompt)
        histories.append(h)
    new = {1000 + k: 10 * (k + 1) for k in range(40)}
    prompts = {pid: 100 + pid % 7 for pid in new}
    runs = [predict_lengths(h, list(new), new, max_length=800, first_epoch="learned",
                            prompt_lengths=prompts) for h in histories + histories]
    assert all(r == runs[0] for r in runs)
    assert len(set(runs[0].values())) == len(new)  # the fit ran: no two references tie


def test_cap_censored_fit_and_predictions_at_the_cap():
    cap = 1000.0
    rows = planted(800, 10, 1.0, 0.0, 0.3, scale=2.0, cap=cap)
    assert sum(top >= cap for _, _, top in rows) > 100  # a real share is censored
    fit = fit_rows(rows, cap=cap)
    # Least squares on the capped values flattens the slope; the censored fit recovers it.
    assert fit.slope_ref == pytest.approx(1.0, abs=0.06)
    assert fit.sd == pytest.approx(0.3, abs=0.04)
    naive = fit_rows(rows, cap=None)  # censoring ignored: flatter and narrower
    assert naive.slope_ref < fit.slope_ref - 0.03 and naive.sd < fit.sd - 0.015
    refs = [100, 300, 450, 500, 550, 600]
    preds = [predict_group_max(fit, r, 300, cap) for r in refs]
    assert all(p <= cap for p in preds)
    assert preds == sorted(preds) and len(set(preds)) == len(preds)  # ranking kept at the cap
    assert preds[-1] >= cap - 0.5 and preds[-2] >= cap - 0.5  # likely to reach it: the cap
    # Little mass at the cap: the base quantile (upper quartile, z = 0.674) of the fit.
    mu = (fit.intercept + fit.slope_ref * (math.log(100) - fit.mean_ref)
          + fit.slope_prompt * (math.log(300) - fit.mean_prompt))
    assert preds[0] == pytest.approx(math.exp(mu + 0.6745 * fit.sd), rel=1e-3)


def test_history_keeps_prompt_lengths_through_json():
    h = LengthHistory()
    h.record(3, 0, [9], reference_length=4, prompt_length=120)
    again = LengthHistory.from_dict(json.loads(json.dumps(h.to_dict())))
    assert again == h and again.prompt_lengths == {3: 120.0}
    old = {"observations": {"3": [[0, 9.0]]}, "references": {"3": 4.0}}  # written before the field
    assert LengthHistory.from_dict(old).fit_observations() == ([4.0], [None], [9.0])


def test_censored_moments_are_the_truncated_normal_ones():
    # Y ~ N(0.2, 0.8^2) above 0.6: a = 0.5, lambda = phi(0.5) / (1 - Phi(0.5)) = 1.14108
    from statistics import NormalDist

    lam = NormalDist().pdf(0.5) / (1 - NormalDist().cdf(0.5))
    mean, var = fe._censored_moments(np.array([0.2]), 0.8, 0.6)
    assert mean[0] == pytest.approx(0.2 + 0.8 * lam, rel=1e-12)
    assert var[0] == pytest.approx(0.64 * (1 + 0.5 * lam - lam * lam), rel=1e-12)
    # against a direct sum over a fine grid of the density above the cap
    grid = np.linspace(0.6, 0.2 + 12 * 0.8, 200_001)
    w = np.exp(-0.5 * ((grid - 0.2) / 0.8) ** 2)
    m = float((grid * w).sum() / w.sum())
    assert mean[0] == pytest.approx(m, rel=1e-4)
    assert var[0] == pytest.approx(float(((grid - m) ** 2 * w).sum() / w.sum()), rel=1e-3)


@pytest.mark.parametrize("cap, share", [(1500.0, 0.6), (4000.0, 0.2)])
def test_heavy_censoring_keeps_slope_and_spread(cap, share):
    """The M-step counts the censored groups' conditional variance: without it the spread,
    and then the slope, shrink as more groups reach the cap (0.76 and 0.31 here instead of
    1 and 0.5 at two thirds censored)."""
    rows = planted(2000, 4, 1.0, 0.0, 0.5, scale=10.0, cap=cap)
    assert sum(top >= cap for _, _, top in rows) / len(rows) > share
    fit = fit_rows(rows, cap=cap)
    assert fit.slope_ref == pytest.approx(1.0, abs=0.05)
    assert fit.slope_prompt == pytest.approx(0.0, abs=0.05)
    assert fit.sd == pytest.approx(0.5, abs=0.03)
    # the chance of reaching the cap follows: here for a reference of 150 tokens (median 1500)
    mu = fit.intercept + fit.slope_ref * (math.log(150) - fit.mean_ref)
    p_cap = 0.5 * math.erfc((math.log(cap) - mu) / fit.sd / math.sqrt(2.0))
    true = 0.5 * math.erfc((math.log(cap) - math.log(1500)) / 0.5 / math.sqrt(2.0))
    assert p_cap == pytest.approx(true, abs=0.05)
