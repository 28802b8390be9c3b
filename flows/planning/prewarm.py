"""Pre-warming from call history (paper §3.7).

RLHFless pre-warms functions so they are warm when invoked, using "the shortest execution time
seen in earlier steps plus a fixed buffer" (after Shahrad et al. 2020). Reading [I]: for each
action kind record the offsets (seconds from step start) at which it was invoked in past steps;
the pre-warm time for the next step is ``min(offsets) - buffer_s - lead_s``, so the container
is ready before the earliest invocation seen so far, ``lead_s`` being how long a pre-warm
itself takes (``prewarm_lead``: the longest measured in the recent steps, or, where none of
them fired one, the least a pre-warm can take on the platform). The paper gives no buffer value.

A pre-warm that cannot finish before that invocation (the time would fall before the step
starts) is not fired: a container runs one activation at a time, so the calls that arrive
while the pre-warms hold the warm containers go to new, cold ones. On OpenWhisk that is the
cold start the pre-warm was meant to spare, and twice the containers kept warm.

How many decode actors to keep warm: the count planned in the most recent step, or the max over
the last ``window`` steps (``window = 1`` = last step). Using the max is the safe side when the
planner's N fluctuates; actors beyond the warm count pay a cold start, which the planner prices
in through ``ClusterSpec.num_warm_actors``.
"""

from __future__ import annotations

from typing import Mapping, Sequence


def prewarm_offset(offsets: Sequence[float], buffer_s: float, lead_s: float = 0.0) -> float | None:
    """Seconds after step start to pre-warm one action kind; None without history or where a
    pre-warm taking ``lead_s`` seconds could not finish before the earliest past invocation."""
    if buffer_s < 0:
        raise ValueError(f"prewarm.buffer_s={buffer_s}: must be >= 0")
    if lead_s < 0:
        raise ValueError(f"prewarm lead_s={lead_s}: must be >= 0")
    if not offsets:
        return None
    at = min(offsets) - buffer_s - lead_s
    return at if at >= 0 else None


def prewarm_lead(durations: Sequence[float | None], floor_s: float = 0.0) -> float:
    """How long the next pre-warm is taken to last (s): the longest of ``durations`` (one per
    recent step, None where the step fired none), at least ``floor_s`` (the least a pre-warm
    takes: OpenWhisk holds each container ``prewarm_hold_s``). Steps without one let a slow
    measurement age out, so a pre-warm skipped after one slow start is tried again."""
    return max([floor_s, *(d for d in durations if d is not None)])


def plan_prewarm(history: Mapping[str, Sequence[Sequence[float]]],
                 buffer_s: float) -> dict[str, float]:
    """Pre-warm offset per action kind from ``kind -> [offsets of step 1, step 2, ...]``.

    Kinds never invoked are left out (nothing to pre-warm).
    """
    out: dict[str, float] = {}
    for kind, steps in history.items():
        flat = [offset for step in steps for offset in step]
        offset = prewarm_offset(flat, buffer_s)
        if offset is not None:
            out[kind] = offset
    return out


def warm_actor_count(planned_counts: Sequence[int], window: int = 1, default: int = 1) -> int:
    """Decode actors to pre-warm: max of the last ``window`` planned counts, or ``default``."""
    if window < 1:
        raise ValueError(f"prewarm.window={window}: must be >= 1")
    recent = list(planned_counts)[-window:]
    return max(recent) if recent else default
