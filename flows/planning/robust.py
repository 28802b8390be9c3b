"""Planning for prediction error: a robust tail per actor and the striped candidates.

Ranked slices put the groups predicted short on few actors with large batches. A group there
that runs as long as the step's longest ones keeps its actor going after the rest of the slice
is done, so the actor's end is not its slice's predicted decode time. On the traces (rank
correlation of predicted and true group lengths ~0.8) that is what made ranked plans lose to a
length-oblivious split of the same size: the point estimate never saw it.

``tail_stress`` adds that case to each actor's decode time: its longest group is taken to run
to the step's longest predicted length ``top``; past the slice's own longest prediction it
decodes as one group alone (the rest of the slice has finished), at the TPOT of a batch of
``group_size`` samples. An actor that already holds a group predicted at ``top`` is unchanged,
so a striped plan (the ranking dealt round-robin: ``assignment.assign_round_robin`` of the ranking), whose actors
each hold one of the longest predictions, is timed as before, while a ranked slice of short
groups is timed as if it could hold the longest one. The planner compares candidates with
these times and bills them (the actor runs, and is billed, for the stressed time). Applied to
``cost_aware`` under every objective but ``paper`` (which keeps the paper's estimate).

With a measured error (``MeasuredError``: how far observed group maxes fell from their
predictions on recent steps) the tail scales with the predictor instead: each actor's longest
group is run to ``TailModel``'s quantile of its slice's longest *observed* group, every group
observed as its prediction times an error drawn from the measured ones, independently (capped
at the generation cap). Exact predictions then stress nothing, and a ranked slice is stretched
by what its own groups could run to rather than by the step's longest prediction. The
simulator measures the error on the last steps (``ClusterModel.tail_error_steps``); without a
measurement (the first step; the live hook) the step's longest prediction is the target.

``held_budget`` is the ``budget`` objective's limit (``objective.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from flows.planning.loads import Loads
from flows.planning.plan import Candidate, ClusterSpec
from flows.planning.timeline import actor_start
from flows.planning.tpot import CONTEXT_BUCKET

STRIPED_MAX_N = 8
"""``cost_aware`` times striped plans for N = 2..this (one ``DecodeEstimator.sweep`` each)."""


def striped_layout(num_groups: int, n: int) -> tuple[list[int], list[int]]:
    """(groups per actor, ranking positions actor by actor) of the ranking dealt round-robin
    over ``n`` actors (``assignment.assign_round_robin`` of the ranking): each actor's positions are contiguous in
    the permutation and still longest first, so one ``DecodeEstimator.sweep`` times them all."""
    sizes = [len(range(a, num_groups, n)) for a in range(n)]
    return sizes, [i for a in range(n) for i in range(a, num_groups, n)]


def held_budget(cands: Sequence[Candidate], actors: int, cluster: ClusterSpec,
                prefill_s: float) -> float:
    """The ``budget`` objective's limit (dollars): what ``actors`` decode actors would bill if
    held from their invocation until the phase ends, as a fixed allocation is, plus the
    prefill. The phase is timed as this step's striped plan of that many actors (a
    length-oblivious split in effect, like a fixed data-parallel one); without a striped
    candidate of that size (other assignments, ``n_max`` below it): the first candidate of that
    size, else the first one.

    A fixed allocation is reserved for the whole run and never waits pre-warmed, so the limit
    bills no ``prewarm_idle_s``; a candidate's own bill does (``timeline.evaluate_candidate``).
    With no pre-warm idle the striped plan, whose actors are billed from the same invocations
    but released at their own ends, is always within the limit. With it, each remote actor's
    wait is on top, and the plans within the limit may be fewer actors, slower than the
    allocation (the ones on the learner node's GPUs, ``colocated_actors``, pay none)."""
    ref = ([c for c in cands if c.kind == "striped" and c.n == actors]
           or [c for c in cands if c.n == actors] or list(cands))[0]
    held = 0.0
    for i in range(actors):
        start = actor_start(i, cluster, prefill_s, 0.0)
        held += max(0.0, ref.time_s - start.invoked_s)
    return (held * cluster.gpus_per_actor + prefill_s * cluster.prefill_gpus) * cluster.price_per_gpu_second


@dataclass(frozen=True)
class MeasuredError:
    """The length predictor's error on recent steps, which sets the robust tail's target."""

    log_ratios: tuple[float, ...]
    """``log(observed group max / predicted length)`` of each group measured, ascending."""
    max_length: float | None = None
    """The generation cap (tokens): no group runs longer. None: uncapped."""
    quantile: float = 0.5
    """Quantile of an actor's longest observed group that its tail is run to."""

    def __post_init__(self) -> None:
        if not self.log_ratios or list(self.log_ratios) != sorted(self.log_ratios):
            raise ValueError("MeasuredError.log_ratios: pass at least one error, sorted ascending")
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"MeasuredError.quantile={self.quantile}: must be in (0, 1)")

    @classmethod
    def of(cls, predicted: Sequence[float], observed: Sequence[float],
           max_length: float | None = None, quantile: float = 0.5) -> "MeasuredError":
        """From paired predicted and observed group max lengths (tokens; below 1 counts as 1)."""
        if len(predicted) != len(observed) or not predicted:
            raise ValueError(f"MeasuredError.of: {len(predicted)} predictions, {len(observed)} "
                             "observations; pass one of each per group, at least one")
        ratios = sorted(math.log(max(o, 1.0) / max(p, 1.0)) for p, o in zip(predicted, observed))
        return cls(tuple(ratios), max_length, quantile)


GRID_POINTS = 64
"""Log-length grid on which ``TailModel`` solves for the quantile (linear in between)."""
RESOLUTION = 8
"""Predicted lengths are placed on the grid to 1/RESOLUTION of a step (~1% of a length)."""
MAX_SPREAD_GRIDS = 64
"""The grid spans at least 1/MAX_SPREAD_GRIDS of the predictions' log-spread (so their offsets
on it take at most about ``MAX_SPREAD_GRIDS * GRID_POINTS * RESOLUTION`` values)."""
_IMPOSSIBLE = -1e6  # log-probability standing in for log 0, so that sums stay finite


class TailModel:
    """Quantiles of the longest observed group of subsets of a ranking, under ``error``.

    A group predicted ``l`` is observed as ``l * exp(E)``, ``E`` drawn from ``error.log_ratios``
    (the empirical distribution, ``F`` its CDF), independently per group, so a set ``S`` of
    groups has ``log P(max <= x) = sum_{i in S} log F(log x - log l_i)``. Those terms are tabled
    once per plan on ``GRID_POINTS`` log-lengths, for every group of the ranking
    (``GRID_POINTS x groups``); a subset's sum is then a prefix-sum difference (contiguous
    slices), a strided sum (striped plans) or a gather (any grouping). Pure numpy.
    """

    def __init__(self, lengths: Sequence[float], error: MeasuredError):
        """``lengths``: predicted length (tokens) along the ranking."""
        e = np.asarray(error.log_ratios, dtype=np.float64)
        log_l = np.log(np.maximum(np.asarray(lengths, dtype=np.float64), 1.0))
        hi = float(log_l.max() + e[-1])
        if error.max_length is not None:
            hi = min(hi, math.log(max(error.max_length, 1.0)))
        lo = min(float(log_l.min() + e[0]), hi)
        # Where even the smallest error runs every group past the cap, lo is clipped to the cap
        # and the grid has no width: the table would need billions of entries between the
        # predictions. The targets there are the cap whatever the width, so widen it downwards.
        lo = min(lo, hi - float(np.ptp(log_l)) / MAX_SPREAD_GRIDS)
        self.grid = np.linspace(lo, hi, GRID_POINTS)
        # log F(grid[k] - log l_i) by table look-up: each log l_i rounded to 1/RESOLUTION of a
        # grid step, so the offsets take few values: one searchsorted per offset, not per entry
        step = max((hi - lo) / (GRID_POINTS - 1), 1e-9) / RESOLUTION
        pos = np.rint((log_l - lo) / step).astype(np.int64)
        first = -int(pos.max())
        index = (np.arange(GRID_POINTS, dtype=np.int64) * RESOLUTION - first)[:, None] - pos[None, :]
        cdf = np.searchsorted(e, (np.arange(int(index[-1].max()) + 1) + first) * step, side="right") / len(e)
        with np.errstate(divide="ignore"):
            table = np.where(cdf > 0, np.log(np.maximum(cdf, 1e-300)), _IMPOSSIBLE)
        self.log_cdf = table[index]
        self.cum = np.zeros((GRID_POINTS, len(log_l) + 1))
        np.cumsum(self.log_cdf, axis=1, out=self.cum[:, 1:])
        self.log_q = math.log(error.quantile)

    def contiguous(self, starts: Sequence[int], ends: Sequence[int]) -> np.ndarray:
        """Targets (tokens) of the slices ``starts[k]:ends[k]`` of the ranking."""
        s, e = np.asarray(starts), np.asarray(ends)
        return self._solve(lambda rows: self.cum[rows, e] - self.cum[rows, s], len(s))

    def slices(self, starts: np.ndarray, sizes: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
        """``contiguous`` targets of consecutive plans of ``counts`` slices each, one array per plan."""
        return np.split(self.contiguous(starts, starts + sizes), np.cumsum(counts)[:-1])

    def striped(self, ns: Sequence[int]) -> list[np.ndarray]:
        """Targets of the actors of the striped plan (``striped_layout``) of each N in ``ns``."""
        sums = [self.log_cdf[:, a::n].sum(axis=1) for n in ns for a in range(n)]
        targets = self._matrix(np.stack(sums, axis=1))
        return np.split(targets, np.cumsum(list(ns))[:-1])

    def groups(self, positions: Sequence[Sequence[int]]) -> np.ndarray:
        """Targets of actors holding these ranking positions."""
        return self._matrix(np.stack([self.log_cdf[:, list(p)].sum(axis=1) for p in positions], axis=1))

    def _matrix(self, sums: np.ndarray) -> np.ndarray:
        cols = np.arange(sums.shape[1])
        return self._solve(lambda rows: sums[rows, cols], sums.shape[1])

    def _solve(self, value, count: int) -> np.ndarray:
        """Per actor, ``value(rows)`` being its ``log P(max <= grid[row])`` (non-decreasing in
        the row; one row per actor): the log-length where it reaches ``log quantile``, found by
        bisection over the grid and interpolated; the grid's top where it never does."""
        lo, hi = np.zeros(count, dtype=np.int64), np.full(count, GRID_POINTS - 1)
        while (active := lo < hi).any():
            mid = (lo + hi) // 2
            ok = value(mid) >= self.log_q
            hi, lo = np.where(active & ok, mid, hi), np.where(active & ~ok, mid + 1, lo)
        below = np.maximum(lo - 1, 0)
        a, b = value(below), value(lo)
        frac = np.clip((self.log_q - a) / np.where(b > a, b - a, 1.0), 0.0, 1.0)
        frac = np.where(lo > 0, frac, 1.0)
        return np.exp(self.grid[below] + frac * (self.grid[lo] - self.grid[below]))


def tail_stress(decode: Sequence[float], longest: Sequence[float], context0: Sequence[float],
                top: float | np.ndarray, group_row: np.ndarray) -> list[float]:
    """Decode seconds per actor with its longest group run to ``top`` tokens.

    Args:
        decode: predicted decode seconds per actor.
        longest: each actor's longest predicted group length (tokens).
        context0: each actor's mean prompt length (tokens).
        top: the longest predicted length of the step (tokens), or a target per actor
            (``TailModel``); an actor whose longest group reaches it is unchanged.
        group_row: TPOT of a batch of one group by context bucket
            (``DecodeEstimator.table[0]``: the same table the decode times come from).
    """
    lo = np.asarray(longest, dtype=np.float64)
    gap = np.maximum(top - lo, 0.0)
    cols = ((np.asarray(context0, dtype=np.float64) + 0.5 + 0.5 * (top + lo)) / CONTEXT_BUCKET)
    cols = np.minimum(cols.astype(np.int64), len(group_row) - 1)
    return (np.asarray(decode, dtype=np.float64) + gap * group_row[cols]).tolist()


def split_plans(loads: Loads, counts: Sequence[int]) -> list[Loads]:
    """Loads of consecutive plans of ``counts`` actors each, from one concatenated set."""
    out, j = [], 0
    for count in counts:
        cut = slice(j, j + count)
        out.append(Loads(loads.decode[cut], loads.tokens[cut], loads.longest[cut], loads.groups[cut],
                         None if loads.point is None else loads.point[cut]))
        j += count
    return out


def stress_plans(plans: Sequence[Loads], top: float | Sequence[np.ndarray],
                 group_row: np.ndarray) -> list[Loads]:
    """``tail_stress`` of every actor of these plans, in one pass: each plan's ``decode``
    replaced by the stressed seconds, its point estimate kept as ``point`` (the feasibility
    check's, ``timeline.evaluate_candidate``). ``top``: one target for all, or one array per plan."""
    def joined(field: str) -> list:
        return [x for load in plans for x in getattr(load, field)]

    decode, tokens, longest, groups = (joined(f) for f in ("decode", "tokens", "longest", "groups"))
    if not isinstance(top, (int, float)):
        top = np.concatenate([np.asarray(t, dtype=np.float64) for t in top])
    stressed = tail_stress(decode, longest, [t / c for t, c in zip(tokens, groups)], top, group_row)
    out, j = [], 0
    for load in plans:
        count = len(load.decode)
        out.append(load._replace(decode=stressed[j:j + count], point=load.decode))
        j += count
    return out
