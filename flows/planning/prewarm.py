"""Pre-warming from call history (paper §3.7).

RLHFless pre-warms functions so they are warm when invoked, using "the shortest execution time
seen in earlier steps plus a fixed buffer" (after Shahrad et al. 2020). Reading [I]: for each
action kind record the offsets (seconds from step start) at which it was invoked in past steps;
the pre-warm time for the next step is ``max(0, min(offsets) - buffer_s)``, so the container
is ready before the earliest invocation seen so far. The paper gives no buffer value.

How many decode actors to keep warm: the count planned in the most recent step, or the max over
the last ``window`` steps (``window = 1`` = last step). Using the max is the safe side when the
planner's N fluctuates; actors beyond the warm count pay a cold start, which the planner prices
in through ``ClusterSpec.num_warm_actors``.
"""

from __future__ import annotations

from typing import Mapping, Sequence


def prewarm_offset(offsets: Sequence[float], buffer_s: float) -> float | None:
    """Seconds after step start to pre-warm one action kind; None without history."""
    if buffer_s < 0:
        raise ValueError(f"prewarm.buffer_s={buffer_s}: must be >= 0")
    if not offsets:
        return None
    return max(0.0, min(offsets) - buffer_s)


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
