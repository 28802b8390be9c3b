"""Choosing the drafting strategy and the draft length k before each decode round (pure).

One verification forward of the target at batch b and width k + 1 costs ``t(b, k + 1)``
seconds and yields, per row, its sampled token plus the accepted prefix of its draft. With a
per-token acceptance rate ``alpha`` for the strategy (each draft token accepted with
probability alpha while all before it were; Leviathan et al. 2023, section 3.1, with the
target's own Gumbel draw as the "verifier"), a row whose draft has m tokens gives
``1 + sum_{i=1..m} alpha^i`` tokens in expectation. The selector maximises

    rate(s, k) = sum_r (1 + sum_{i<=min(m_r(s), k)} alpha_s^i) / (t(b, 1 + max_r min(m_r(s), k)) + b * d_s)

over strategies s and k in 0..max_k, where ``m_r(s)`` is the length of the draft s has for
row r this round and ``d_s`` its drafting seconds per row; k = 0 is plain decoding, rate
``b / t(b, 1)``. Speculation is chosen only where it beats that (``margin``). As the batch
shrinks ``t(b, w)`` flattens in w (a forward reads the weights once whatever its width), so
longer drafts pay.

Both estimates are online: ``AcceptanceTracker`` counts accepted and rejected draft tokens per
strategy (a Beta prior stands in before any), and ``ForwardCost`` fits ``t(b, w)`` to the
rounds the engine has timed (least squares on 1, b, b * (w - 1) and a speculative round's
fixed overhead, ridge-pulled towards a prior shaped like a TPOT profile: a fixed part plus a
per-row part, width nearly free).
Nothing here changes outputs: the engine accepts only tokens equal to plain decoding's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class AcceptanceTracker:
    """Per strategy: draft tokens accepted and rounds that ended in a rejection.

    The geometric model's maximum-likelihood rate is accepted / (accepted + rejections); the
    prior adds ``prior_weight`` pseudo-tokens at ``prior_rate`` (or a caller's measured rate).
    """

    prior_rate: float = 0.5
    prior_weight: float = 2.0
    priors: dict[str, float] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    rejections: dict[str, int] = field(default_factory=dict)
    proposed: dict[str, int] = field(default_factory=dict)

    def rate(self, strategy: str) -> float:
        """The rate of a strategy, or of a kind of its drafts (``"<strategy>/<kind>"``, e.g.
        ``prompt_lookup/n3``), whose prior is its strategy's."""
        prior = self.priors.get(strategy, self.priors.get(strategy.split("/")[0], self.prior_rate))
        a = self.accepted.get(strategy, 0) + self.prior_weight * prior
        r = self.rejections.get(strategy, 0) + self.prior_weight * (1.0 - prior)
        return a / (a + r) if a + r > 0 else 0.0

    def known(self, strategy: str) -> bool:
        """Whether anything was measured of ``strategy``: drafts verified here, or a caller's
        prior (the rate an earlier step measured). An unknown strategy gets one probe before
        its default prior may rule it out."""
        return self.proposed.get(strategy, 0) > 0 or strategy in self.priors

    def record(self, strategy: str, num_proposed: int, num_accepted: int) -> None:
        """One row's verification: ``num_accepted`` of its ``num_proposed`` draft tokens kept."""
        self.proposed[strategy] = self.proposed.get(strategy, 0) + num_proposed
        self.accepted[strategy] = self.accepted.get(strategy, 0) + num_accepted
        if num_accepted < num_proposed:
            self.rejections[strategy] = self.rejections.get(strategy, 0) + 1


MIN_PLAIN_WEIGHT = 1.0
"""See ``ForwardCost.plain_weight``: with decay 0.99, one plain round in about 70 speculative ones."""


@dataclass
class ForwardCost:
    """Online estimate of one decode round's seconds at batch b and width w.

    Model: ``t = c0 + c1 * b + c2 * b * (w - 1) + c3 * [w > 1]``. ``c3`` is what a speculative
    round costs beyond its wider forward whatever the draft length: drafting, the column-by-
    column verification draws and the cache rollback. On a CPU it is small beside the forward;
    on a GPU, where an eager forward is launch-bound and nearly flat in b and w, it is a large
    part of a round (docs/gpu.md). The prior (``prior``, ``prior_weight`` pseudo-observations
    per coefficient) keeps the fit sane before the engine has timed any forward wider than 1.
    """

    prior: tuple[float, float, float, float] = (2e-3, 1e-4, 2.5e-5, 5e-4)
    prior_weight: float = 1.0
    decay: float = 0.99
    _xtx: list[list[float]] = field(default_factory=lambda: [[0.0] * 4 for _ in range(4)])
    _xty: list[float] = field(default_factory=lambda: [0.0] * 4)
    plain_weight: float = 0.0
    """Decayed count of plain (width-1) rounds observed. Without them the fit cannot tell a
    speculative round's overhead ``c3`` from the fixed cost ``c0`` every round pays, and
    speculation looks cheaper than it is; ``speculative._Selector`` runs a plain round when
    this falls below ``MIN_PLAIN_WEIGHT``."""

    def observe(self, batch: int, width: int, seconds: float) -> None:
        self.plain_weight = self.decay * self.plain_weight + (1.0 if width == 1 else 0.0)
        x = (1.0, float(batch), float(batch * (width - 1)), 1.0 if width > 1 else 0.0)
        for i in range(4):
            self._xty[i] = self.decay * self._xty[i] + x[i] * seconds
            for j in range(4):
                self._xtx[i][j] = self.decay * self._xtx[i][j] + x[i] * x[j]

    def coefficients(self) -> tuple[float, float, float, float]:
        # Ridge towards the prior, scaled per coefficient so each term has comparable pull.
        # The width term is identified only by the few speculative rounds: its prior weighs as
        # much as ~8 of them at batch 64, so one round slowed by a neighbour's load cannot
        # switch speculation off for the rest of the call.
        scales = (1.0, 16.0, 512.0, 1.0)
        a = [[self._xtx[i][j] + (self.prior_weight * scales[i] ** 2 if i == j else 0.0) for j in range(4)]
             for i in range(4)]
        b = [self._xty[i] + self.prior_weight * scales[i] ** 2 * self.prior[i] for i in range(4)]
        return tuple(max(c, 0.0) for c in _solve(a, b))

    def seconds(self, batch: int, width: int) -> float:
        return self.snapshot()(batch, width)

    def snapshot(self) -> "callable":
        """``seconds`` with the current fit frozen (one solve for many queries)."""
        c0, c1, c2, c3 = self.coefficients()
        return lambda batch, width: max(c0 + c1 * batch + (c2 * batch * (width - 1) + c3 if width > 1 else 0.0),
                                        1e-9)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a is small and positive definite here)."""
    n = len(b)
    m = [row[:] + [rhs] for row, rhs in zip(a, b)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


@dataclass(frozen=True)
class Choice:
    """A round's decision: ``strategy`` None and ``k`` 0 mean plain decoding."""

    strategy: str | None
    k: int
    expected_rate: float  # tokens per second the model predicts for this choice
    plain_rate: float  # ... and for plain decoding


def expected_tokens(alpha: float, lengths: Sequence[int], k: int) -> float:
    """Sum over rows of 1 + alpha + ... + alpha^min(m_r, k)."""
    total = 0.0
    for m in lengths:
        m = min(m, k)
        total += 1.0 + (sum(alpha ** i for i in range(1, m + 1)) if m > 0 else 0.0)
    return total


def choose(draft_lengths: Mapping[str, Sequence[int]], rates: Mapping[str, float],
           seconds: "callable", max_k: int, draft_seconds: Mapping[str, float] | None = None,
           margin: float = 0.02) -> Choice:
    """The (strategy, k) with the highest expected tokens per second, or plain decoding.

    Args:
        draft_lengths: strategy -> per-row length of the draft it has this round (rows in
            batch order; every list has the batch's length).
        rates: strategy -> per-token acceptance rate alpha in [0, 1].
        seconds: ``seconds(batch, width)`` -> one target forward's seconds.
        max_k: the longest draft allowed (``generation.max_draft_len``).
        draft_seconds: strategy -> drafting seconds per row and round (0 when absent).
        margin: a speculative choice must beat plain decoding's rate by this fraction.
    Returns:
        the best choice; ``Choice(None, 0, ...)`` when nothing beats plain decoding.
    """
    b = len(next(iter(draft_lengths.values()))) if draft_lengths else 0
    if b == 0:
        return Choice(None, 0, 0.0, 0.0)
    plain = b / seconds(b, 1)
    best = Choice(None, 0, plain, plain)
    for strategy, lengths in draft_lengths.items():
        longest = min(max(lengths, default=0), max_k)
        cost_draft = b * (draft_seconds or {}).get(strategy, 0.0)
        alpha = rates.get(strategy, 0.0)
        # rows with a draft of at least i tokens gain alpha^i at every k >= i: one pass over
        # a histogram of draft lengths instead of rows x k
        at_least = [0] * (longest + 2)
        for m in lengths:
            at_least[min(m, longest)] += 1
        for i in range(longest - 1, -1, -1):
            at_least[i] += at_least[i + 1]
        tokens = float(b)
        for k in range(1, longest + 1):
            tokens += at_least[k] * alpha ** k
            rate = tokens / (seconds(b, 1 + k) + cost_draft)
            if rate > best.expected_rate and rate > plain * (1.0 + margin):
                best = Choice(strategy, k, rate, plain)
    return best


def choose_rows(rows: Sequence[tuple[int, float]], seconds: "callable", max_k: int,
                margin: float = 0.02) -> tuple[int, float, float]:
    """The k with the highest expected tokens per second when each row has its own draft.

    Args:
        rows: per row, (draft length, acceptance rate of that draft's strategy and kind); a
            row without a draft is (0, 0.0).
        seconds, max_k, margin: as for :func:`choose`.
    Returns:
        (k, expected tokens per second at k, plain decoding's); k = 0 when nothing beats
        plain decoding by ``margin``.
    """
    b = len(rows)
    if b == 0:
        return 0, 0.0, 0.0
    plain = b / seconds(b, 1)
    longest = min(max((m for m, _ in rows), default=0), max_k)
    gain = [0.0] * (longest + 1)  # gain[i]: expected extra tokens from draft position i
    for m, alpha in rows:
        p = 1.0
        for i in range(1, min(m, longest) + 1):
            p *= alpha
            gain[i] += p
    best_k, best_rate, tokens = 0, plain, float(b)
    for k in range(1, longest + 1):
        tokens += gain[k]
        rate = tokens / seconds(b, 1 + k)
        if rate > best_rate and rate > plain * (1.0 + margin):
            best_k, best_rate = k, rate
    return best_k, best_rate, plain
