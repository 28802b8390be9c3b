"""How fast speculative decoding could be on a workload, with hindsight (pure, no torch).

Inputs: each row's final token sequence from the plain run (``x_1 .. x_n``, the stop token
included where one ended the row), the drafts each strategy proposes along that sequence
(``replay_acceptance``: a drafter's state depends only on the tokens so far, so replaying it on
the true sequence gives the drafts the engine would see whatever it chose before), and a table
``T[(b, w)]`` of measured seconds of one cached forward at batch b and width w.

Row model (as ``speculative.decode_speculative``): x_1 comes from the prefill's logits; a row
takes part in a round while it knows q < n tokens, and a round of width w gives it
``1 + min(a_q, w - 1)`` more tokens (at most n - q), where ``a_q`` is the longest accepted prefix
among the strategies' drafts after ``x_1 .. x_q`` (each row takes its best strategy with
hindsight). Plain decoding is w = 1 in every round: n - 1 rounds for the row.

Two times for the forwards of one call:

* ``bound_seconds``: no schedule of widths (one per round, any in 1 .. max_k + 1) is faster.
  For any alpha, with ``beta(w) = min_b (T(b, w) - alpha) / b`` every round costs
  ``T(b, w) >= alpha + b * beta(w)``, so R rounds cost at least ``alpha * R`` plus, per row, the
  beta of the widths of the rounds it took part in. Each row's part is minimised alone (dynamic
  programming over its position and the rounds used), then the sum over R, and the largest
  such bound over alpha is kept.
* ``greedy_seconds``: a schedule hindsight allows (each round the width with the most tokens
  per second in that round, or one width throughout, whichever is faster), so achievable
  under the table: the best schedule lies between the two.

What both assume, and why they are optimistic: forwards cost what the table says and nothing
else costs anything (drafting, verification draws, cache rollback and Python bookkeeping are
free); each row's draft is its best strategy's, known in advance; the widths between table
entries cost the linear interpolation in b. ``call_speedup`` turns forward seconds into a
whole-call speed-up by keeping the plain call's other work (prefill, sampling, bookkeeping)
unchanged, which speculation cannot shorten.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from actions.engines.drafters.base import Drafter

Table = Mapping[tuple[int, int], float]
"""(batch, width) -> seconds of one cached forward; every width at every batch listed."""


def replay_acceptance(drafters: Sequence[Drafter], rows: Sequence[tuple[int, Sequence[int], Sequence[int]]],
                      max_new_tokens: int, max_k: int) -> list[list[int]]:
    """Per row, ``a_q`` for q = 1 .. n - 1: the longest prefix of any drafter's draft (of at
    most ``min(max_k, max_new_tokens - q)`` tokens, the engine's room) equal to ``x_{q+1} ..``.

    Args:
        drafters: fresh drafters (``speculative.make_drafters``), one per strategy allowed.
        rows: per row (prompt id, prompt tokens, final sequence x_1 .. x_n).
    """
    out = []
    for r, (prompt_id, prompt, seq) in enumerate(rows):
        for d in drafters:
            d.start(r, prompt_id, prompt, [])
        acc = []
        for q in range(1, len(seq)):
            for d in drafters:
                d.extend(r, seq[q - 1:q])
            room = min(max_k, max_new_tokens - q)
            best = 0
            for d in drafters:
                draft = d.propose(r, room)
                n = 0
                while n < len(draft) and q + n < len(seq) and draft[n] == seq[q + n]:
                    n += 1
                best = max(best, n)
            acc.append(best)
        out.append(acc)
    return out


def seconds(table: Table, batch: int, width: int) -> float:
    """``T(batch, width)``, linear in the batch between the table's batches (constant beyond)."""
    bs = sorted({b for b, w in table if w == width})
    if batch <= bs[0]:
        return table[(bs[0], width)]
    for lo, hi in zip(bs, bs[1:]):
        if batch <= hi:
            f = (batch - lo) / (hi - lo)
            return (1 - f) * table[(lo, width)] + f * table[(hi, width)]
    return table[(bs[-1], width)]


def plain_seconds(table: Table, lengths: Sequence[int]) -> float:
    """Forward seconds of plain decoding: round r has every row with n - 1 >= r."""
    rounds = max((n - 1 for n in lengths), default=0)
    return sum(seconds(table, sum(1 for n in lengths if n - 1 >= r), 1) for r in range(1, rounds + 1))


def _advance(q: int, n: int, a: int, width: int) -> int:
    return min(n, q + 1 + min(a, width - 1))


def _transitions(lengths: Sequence[int], acc: Sequence[Sequence[int]], num_widths: int) -> np.ndarray:
    """``nxt[i, q, w - 1]``: row i's known tokens after a round of width w from q (q >= n stays)."""
    nxt = np.zeros((len(lengths), max(lengths) + 1, num_widths), dtype=np.int64)
    for i, (n, a) in enumerate(zip(lengths, acc)):
        for q in range(nxt.shape[1]):
            nxt[i, q] = [_advance(q, n, a[q - 1], w) if 1 <= q < n else q for w in range(1, num_widths + 1)]
    return nxt


def _row_costs(lengths: Sequence[int], nxt: np.ndarray, beta: np.ndarray, max_rounds: int) -> np.ndarray:
    """``g[i, R]``: the least sum of ``beta[w - 1]`` over the widths w of at most R rounds that take
    row i from q = 1 to its n (infinite where R rounds cannot); dynamic programming over
    (row, q), every row at once."""
    done = np.arange(nxt.shape[1])[None, :] >= np.asarray(lengths)[:, None]
    g = np.where(done, 0.0, np.inf)  # no round left: only a finished row costs nothing
    rows = np.arange(len(lengths))[:, None, None]
    out = [g[:, 1]]
    for _ in range(max_rounds):
        g = np.minimum(g, np.where(done, 0.0, (g[rows, nxt] + beta[None, None, :]).min(axis=2)))
        out.append(g[:, 1])
    return np.stack(out, axis=1)


def bound_seconds(table: Table, lengths: Sequence[int], acc: Sequence[Sequence[int]], max_k: int) -> float:
    """A lower bound on the forward seconds of any schedule (module docstring).

    Args:
        lengths: per row, n (the final sequence's length, >= 1).
        acc: per row, ``a_q`` for q = 1 .. n - 1 (``replay_acceptance``).
        max_k: the longest draft; widths 1 .. max_k + 1.
    """
    widths = range(1, max_k + 2)
    batches = sorted({b for b, _ in table})
    max_rounds = max((n - 1 for n in lengths), default=0)
    if max_rounds == 0:
        return 0.0
    top = min(table[(b, w)] for b in batches for w in widths)
    # alpha = 0, the fixed part of a plain forward (its intercept from the two smallest
    # batches), and a grid between; each gives a valid bound, the largest is kept
    b0, b1 = batches[0], batches[min(1, len(batches) - 1)]
    intercept = table[(b0, 1)] - b0 * (table[(b1, 1)] - table[(b0, 1)]) / (b1 - b0) if b1 > b0 else 0.0
    alphas = sorted({0.0, min(max(intercept, 0.0), top)} | {top * i / 8 for i in range(1, 9)})
    nxt = _transitions(lengths, acc, len(widths))
    best = 0.0
    for alpha in alphas:
        beta = np.array([min((table[(b, w)] - alpha) / b for b in batches) for w in widths])
        totals = _row_costs(lengths, nxt, beta, max_rounds).sum(axis=0) + alpha * np.arange(max_rounds + 1)
        best = max(best, float(totals.min()))  # infinite for R too few for some row
    return best


def _schedule(table: Table, lengths: Sequence[int], acc: Sequence[Sequence[int]], widths: Sequence[int],
              pick_greedy: bool) -> float:
    """Forward seconds of the schedule that takes, each round, the width of ``widths`` with the
    most tokens per second in that round (``pick_greedy``), or always ``widths[0]``."""
    q = [1] * len(lengths)
    total = 0.0
    while True:
        active = [i for i, n in enumerate(lengths) if q[i] < n]
        if not active:
            return total
        b = len(active)

        def rate(w: int) -> float:
            return sum(_advance(q[i], lengths[i], acc[i][q[i] - 1], w) - q[i] for i in active) / seconds(table, b, w)

        w = max(widths, key=rate) if pick_greedy else widths[0]
        total += seconds(table, b, w)
        for i in active:
            q[i] = _advance(q[i], lengths[i], acc[i][q[i] - 1], w)


def greedy_seconds(table: Table, lengths: Sequence[int], acc: Sequence[Sequence[int]], max_k: int) -> float:
    """Forward seconds of a schedule hindsight allows: the faster of the one that takes, each
    round, the width with the most tokens per second in that round, and the best fixed width."""
    widths = list(range(1, max_k + 2))
    return min([_schedule(table, lengths, acc, widths, True)]
               + [_schedule(table, lengths, acc, [w], False) for w in widths])


def call_speedup(call_seconds: float, plain_forward_seconds: float, forward_seconds: float) -> float:
    """A whole call's speed-up when its plain forwards (``plain_forward_seconds`` of the
    ``call_seconds`` a plain call takes) become ``forward_seconds`` and the rest stays."""
    rest = max(call_seconds - plain_forward_seconds, 0.0)
    return (rest + plain_forward_seconds) / (rest + forward_seconds)
