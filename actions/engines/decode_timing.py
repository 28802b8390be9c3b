"""One decode step's seconds from timed ``generate`` calls, never zero or negative.

Both engines' profilers (``profiling.py``, ``vllm_profiling.py``) time whole ``generate``
calls: a call of ``2 + steps`` tokens less a call of 2 tokens, over ``steps``, is one decode
step, with prefill and the call's fixed cost cancelled. On a busy machine that fixed cost
varies by more than ``steps`` steps of a small model take (8 steps of about 1 ms against
scheduling noise of several ms), so the difference has come out negative: a CPU profile cached
-0.8 ms for a step, which the planner then refused. :func:`step_seconds` doubles ``steps``
until the difference is positive (the difference grows with ``steps``, the noise does not), and
past its last try falls back to an upper bound that is positive by construction.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

MAX_DOUBLINGS = 3
"""How many times ``steps`` doubles (8 -> 64 on the CPU) before the fallback."""
MIN_STEP_S = 1e-6
"""Floor of the fallback, one microsecond: below any engine's decode step, so it only keeps a
clock that returned 0 for a whole call from making a zero time."""


def step_seconds(run: Callable[[int], float], steps: int, repeats: int, max_steps: int | None = None) -> float:
    """Seconds of one decode step; ``run(n)``: the wall seconds of one call generating ``n``
    tokens (warmed up by the caller).

    The median over ``repeats`` pairs of ``(run(2 + steps) - run(2)) / steps``. When that is not
    positive, ``steps`` doubles, up to :data:`MAX_DOUBLINGS` times and never past ``max_steps``
    (the tokens the caller's context leaves room for; None: no limit), and the pairs are timed
    again. When none is positive: the longest calls' median time per token generated,
    prefill and fixed cost included (an upper bound of a step), at least :data:`MIN_STEP_S`.

    >>> timings = {2: [0.030, 0.030, 0.030, 0.030], 10: [0.020, 0.020], 18: [0.040, 0.050]}
    >>> ms = step_seconds(lambda n: timings[n].pop(), steps=8, repeats=2) * 1e3
    >>> round(ms, 6)  # 8 steps: noise (-1.25 ms); 16 steps: (0.045 - 0.030) / 16
    0.9375
    >>> step_seconds(lambda n: {2: 0.03, 10: 0.02}[n], steps=8, repeats=3, max_steps=12)  # no room to double
    0.002
    """
    for doubling in range(MAX_DOUBLINGS + 1):
        pairs = [(run(2 + steps), run(2)) for _ in range(repeats)]
        step = statistics.median((long - short) / steps for long, short in pairs)
        if step > 0:
            return step
        if doubling == MAX_DOUBLINGS or (max_steps is not None and 2 * steps > max_steps):
            break
        steps *= 2
    return max(statistics.median(long for long, _ in pairs) / (2 + steps), MIN_STEP_S)
