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

``held_budget`` is the ``budget`` objective's limit (``objective.py``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

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
    length-oblivious split in effect, like a fixed data-parallel one), so that plan, whose
    actors are billed from the same invocations but released at their own ends, is always
    within the budget. Without a striped candidate of that size (other assignments, ``n_max``
    below it): the first candidate of that size, else the first one."""
    ref = ([c for c in cands if c.kind == "striped" and c.n == actors]
           or [c for c in cands if c.n == actors] or list(cands))[0]
    held = 0.0
    for i in range(actors):
        start = actor_start(i, cluster, prefill_s, 0.0)
        held += start.prewarm_idle_s + max(0.0, ref.time_s - start.invoked_s)
    return (held * cluster.gpus_per_actor + prefill_s * cluster.prefill_gpus) * cluster.price_per_gpu_second


def tail_stress(decode: Sequence[float], longest: Sequence[float], context0: Sequence[float],
                top: float, group_row: np.ndarray) -> list[float]:
    """Decode seconds per actor with its longest group run to ``top`` tokens.

    Args:
        decode: predicted decode seconds per actor.
        longest: each actor's longest predicted group length (tokens).
        context0: each actor's mean prompt length (tokens).
        top: the longest predicted length of the step (tokens).
        group_row: TPOT of a batch of one group by context bucket
            (``DecodeEstimator.table[0]``: the same table the decode times come from).
    """
    lo = np.asarray(longest, dtype=np.float64)
    gap = np.maximum(top - lo, 0.0)
    cols = ((np.asarray(context0, dtype=np.float64) + 0.5 + 0.5 * (top + lo)) / CONTEXT_BUCKET)
    cols = np.minimum(cols.astype(np.int64), len(group_row) - 1)
    return (np.asarray(decode, dtype=np.float64) + gap * group_row[cols]).tolist()


Loads = tuple[list[float], list[float], list[float], list[int]]
"""Per actor of one plan: decode seconds, prompt tokens, longest predicted length, groups."""


def split_plans(loads: Loads, counts: Sequence[int]) -> list[Loads]:
    """Loads of consecutive plans of ``counts`` actors each, from one concatenated set."""
    out, j = [], 0
    for count in counts:
        out.append(tuple(part[j:j + count] for part in loads))  # type: ignore[arg-type]
        j += count
    return out


def stress_plans(plans: Sequence[Loads], top: float, group_row: np.ndarray) -> list[Loads]:
    """``tail_stress`` of every actor of these plans, in one pass; the decode seconds of each
    plan replaced by the stressed ones."""
    joined = tuple([x for load in plans for x in load[k]] for k in range(4))
    decode = tail_stress(joined[0], joined[2], [t / c for t, c in zip(joined[1], joined[3])], top,
                         group_row)
    return split_plans((decode, joined[1], joined[2], joined[3]), [len(load[0]) for load in plans])
