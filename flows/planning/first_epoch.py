"""First-epoch length prediction learned online from prompt features (beyond paper §3.2).

The paper predicts a prompt it has not seen yet from its reference answer's length. Here the
relation between features and the observed group max is learned from the prompts already
seen, as the first steps of epoch 0 arrive, and refined every step:

- Model: ``log(group max) = a + b log(reference length) + c log(prompt length) + e`` with
  ``e ~ N(0, s^2)``, fitted by least squares in log space. The slopes are shrunk towards the
  paper's rule (``b = 1``, ``c = 0``) by ``PRIOR_WEIGHT`` pseudo-observations, so a small or
  uninformative sample stays close to "reference length times a scale", and a feature that
  carries no signal (prompt length on every trace measured) barely moves the ranking.
- Cap (``max_new_tokens``): a group that reached it is censored (its uncapped log length
  ``Y`` is at least ``log cap``). The fit is a Tobit regression by EM: the E-step takes, under
  the current fit ``Y ~ N(mu, s^2)``, with ``a = (log cap - mu) / s`` and the inverse Mills
  ratio ``lambda = phi(a) / (1 - Phi(a))``, the conditional mean ``E[Y | Y >= log cap] = mu +
  s lambda`` and variance ``Var[Y | Y >= log cap] = s^2 (1 + a lambda - lambda^2)``; the M-step
  regresses the conditional means (the slopes: the variance does not depend on them) and sets
  ``s^2`` to the mean expected squared residual, ``(E[Y] - mu')^2 + Var[Y]`` for a censored
  group. Without the variance term the spread, and with it the slope, shrink as more groups
  reach the cap. The passes stop when the fit moves less than ``EM_TOLERANCE`` (at most
  ``EM_PASSES``).
- Prediction: the ``BASE_QUANTILE`` quantile ``exp(mu + z_q s)`` (the upper quartile), not
  the median. An actor's time is set by the longest of its groups, and among a slice's groups,
  each uncertain, the longest runs above its own median; the median under-estimates the phase
  time and leads the planner to too few actors (measured in docs/results.md, with the median
  and the 0.9 quantile beside it). The same shift for every new prompt keeps their ranking.
  Where the distribution puts at least ``CAP_MASS`` of its mass at the cap, the group gets
  the ``CAP_QUANTILE`` quantile (usually the cap itself). Predictions at the cap are ordered
  by their chance of reaching it (a sub-token offset), so the ranking among them keeps its
  information instead of falling back to prompt ids.
- Fallback: fewer than ``MIN_OBSERVATIONS`` prompts observed with a reference length gives
  ``None`` (the caller then uses the paper's rule); a prompt without a prompt length is
  predicted from the reference alone (the prompt-length term at its mean).

Pure and deterministic: a function of the observations, no clock and no randomness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Sequence

import numpy as np

MIN_OBSERVATIONS = 32
"""Fewest observed prompts (with a reference length) before the fit replaces the paper's rule."""
PRIOR_WEIGHT = 16.0
"""Pseudo-observations pulling the slopes towards the paper's rule (b = 1, c = 0)."""
CAP_MASS = 0.25
"""Chance of reaching the cap above which a group is predicted at ``CAP_QUANTILE``."""
CAP_QUANTILE = 0.9
BASE_QUANTILE = 0.75
"""Quantile of the fitted distribution predicted for a group (module docstring)."""
EM_PASSES = 200
"""Most EM passes (with heavy censoring EM converges slowly: ~60 passes at 65% censored)."""
EM_TOLERANCE = 1e-6
"""EM stops once no parameter (slopes, intercept, log spread) moves by more than this."""


@dataclass(frozen=True)
class LengthFit:
    """``log(group max) ~ N(intercept + slope_ref (x - mean_ref) + slope_prompt (z - mean_prompt), sd^2)``
    with ``x = log(reference tokens)``, ``z = log(prompt tokens)``."""

    intercept: float
    slope_ref: float
    slope_prompt: float
    mean_ref: float
    mean_prompt: float
    sd: float
    num_observations: int


def _solve(sxx: float, sxz: float, szz: float, sxy: float, szy: float, prior_x: float,
           prior_z: float, weight: float) -> tuple[float, float]:
    """Slopes (b, c) minimising the squared error plus ``weight * prior * (slope - target)^2``
    with targets b = 1, c = 0 (a 2x2 ridge system on centred features)."""
    a11, a12, a22 = sxx + weight * prior_x, sxz, szz + weight * prior_z
    r1, r2 = sxy + weight * prior_x * 1.0, szy
    if a22 <= 0:  # no prompt length varies (all missing or equal): the reference term alone
        return (r1 / a11 if a11 > 0 else 1.0), 0.0
    det = a11 * a22 - a12 * a12
    if det <= 0:
        return 1.0, 0.0
    return (r1 * a22 - a12 * r2) / det, (a11 * r2 - a12 * r1) / det


def fit_lengths(reference_lengths: Sequence[float], prompt_lengths: Sequence[float | None],
                group_maxes: Sequence[float], cap: float | None) -> LengthFit | None:
    """The censored log-linear fit of observed prompts (one entry per prompt in each sequence,
    tokens; a prompt length of None or 0 is missing); None with fewer than
    ``MIN_OBSERVATIONS`` usable prompts (reference and group max > 0). O(prompts) in numpy:
    about a millisecond for thousands of prompts."""
    if not len(reference_lengths) == len(prompt_lengths) == len(group_maxes):
        raise ValueError(f"fit_lengths: {len(reference_lengths)} references, {len(prompt_lengths)} "
                         f"prompt lengths, {len(group_maxes)} group maxes; pass one of each per prompt")
    ref = np.asarray(reference_lengths, dtype=float)
    top = np.asarray(group_maxes, dtype=float)
    prompt = np.asarray([p or 0.0 for p in prompt_lengths], dtype=float)
    usable = (ref > 0) & (top > 0)
    n = int(usable.sum())
    if n < MIN_OBSERVATIONS:
        return None
    ref, top, prompt = ref[usable], top[usable], prompt[usable]
    x = np.log(ref)
    known = prompt > 0
    z_known = np.log(prompt[known])
    mz = float(z_known.mean()) if known.any() else 0.0
    # A missing prompt length sits at the mean: it then adds nothing to the prompt term.
    z = np.full(n, mz)
    z[known] = z_known
    mx = float(x.mean())
    cx, cz = x - mx, z - mz
    sxx, szz, sxz = float(cx @ cx), float(cz @ cz), float(cx @ cz)
    observed = np.log(top)
    log_cap = math.log(cap) if cap else math.inf
    censored = np.flatnonzero(observed >= log_cap)
    y = observed.copy()  # E[Y]: censored groups start at the cap
    spread = 0.0  # sum of the censored groups' Var[Y | Y >= log cap]
    fit = None
    for _ in range(EM_PASSES if len(censored) else 1):
        # M-step (module docstring): slopes on the conditional means, spread with their variance
        my = float(y.mean())
        b, c = _solve(sxx, sxz, szz, float(cx @ (y - my)), float(cz @ (y - my)), sxx / n, szz / n,
                      PRIOR_WEIGHT)
        resid = y - my - b * cx - c * cz
        sd = max(1e-3, math.sqrt((float(resid @ resid) + spread) / max(1, n - 3)))
        last, fit = fit, LengthFit(my, b, c, mx, mz, sd, n)
        if last is not None and _moved(last, fit) < EM_TOLERANCE:
            break
        # E-step: the censored groups' conditional mean and variance under this fit
        mean, var = _censored_moments(my + b * cx[censored] + c * cz[censored], sd, log_cap)
        y[censored], spread = mean, float(var.sum())
    return fit


def _moved(a: LengthFit, b: LengthFit) -> float:
    """Largest change of a fitted parameter between two EM passes (log spread for the spread)."""
    return max(abs(a.intercept - b.intercept), abs(a.slope_ref - b.slope_ref),
               abs(a.slope_prompt - b.slope_prompt), abs(math.log(a.sd / b.sd)))


@lru_cache(maxsize=8)
def _z(quantile: float) -> float:
    """The standard normal's ``quantile`` quantile."""
    return NormalDist().inv_cdf(quantile)


def _mu(fit: LengthFit, x: float, z: float) -> float:
    return fit.intercept + fit.slope_ref * (x - fit.mean_ref) + fit.slope_prompt * (z - fit.mean_prompt)


def _censored_moments(mu: np.ndarray, sd: float, lower: float) -> tuple[np.ndarray, np.ndarray]:
    """E[Y | Y >= lower] and Var[Y | Y >= lower] for Y ~ N(mu, sd^2), elementwise: with
    ``a = (lower - mu) / sd`` and ``lambda = phi(a) / (1 - Phi(a))``, ``mu + sd lambda`` and
    ``sd^2 (1 + a lambda - lambda^2)``. Where the tail is below 1e-12 (a > 7) the group is
    taken at ``lower`` with no spread (the moments' limits, which the formulas cannot reach in
    floating point)."""
    a = (lower - mu) / sd
    tail = 0.5 * np.array([math.erfc(v / math.sqrt(2.0)) for v in a.tolist()])  # 1 - Phi(a), accurate in the tail
    far = tail < 1e-12
    lam = np.exp(-0.5 * a * a) / math.sqrt(2.0 * math.pi) / np.where(far, 1.0, tail)
    mean = np.where(far, lower, mu + sd * lam)
    # 1 + a lambda - lambda^2 lies in (0, 1); clipped against rounding where lambda ~ a
    var = np.where(far, 0.0, sd * sd * np.clip(1.0 + a * lam - lam * lam, 0.0, 1.0))
    return mean, var


def predict_group_max(fit: LengthFit, reference_length: float, prompt_length: float | None,
                      cap: float | None) -> float:
    """Predicted group max (tokens) of an unseen prompt; see the module docstring."""
    x = math.log(max(reference_length, 1.0))
    z = math.log(prompt_length) if prompt_length and prompt_length > 0 else fit.mean_prompt
    mu = _mu(fit, x, z)
    if cap is None:
        return math.exp(mu + _z(BASE_QUANTILE) * fit.sd)
    p_cap = 0.5 * math.erfc((math.log(cap) - mu) / fit.sd / math.sqrt(2.0))  # P(Y >= log cap)
    quantile = CAP_QUANTILE if p_cap >= CAP_MASS else BASE_QUANTILE
    value = math.exp(mu + _z(quantile) * fit.sd)
    if value < cap - 0.5:
        return value
    # At the cap: order by the chance of reaching it (less than a token apart).
    return cap - 0.5 * (1.0 - p_cap)
