"""Choosing the drafting strategy and the draft length k before each decode round (pure).

One verification round of the target at batch b and width k + 1 costs ``t(b, k + 1)``
seconds (its forward, and for k > 0 the drafting, verification and rollback around it) and
yields, per row, its sampled token plus the accepted prefix of its draft. With a per-token
acceptance rate ``alpha`` (each draft token accepted with probability alpha while all before
it were; Leviathan et al. 2023, section 3.1, with the target's own Gumbel draw as the
"verifier"), a row whose draft has m tokens gives ``1 + sum_{i=1..m} alpha^i`` tokens in
expectation; with per-position survival ``s_i`` (``AcceptanceTracker.survival``) the terms are
``s_1 * ... * s_i``. ``choose_rows`` maximises

    rate(k) = sum_r (1 + sum_{i<=min(m_r, k)} s_{r,1} * ... * s_{r,i}) / t(b, 1 + k)

over k in 0..max_k, where ``m_r`` is the length of the draft row r took this round (the kind of
draft that promises it the most tokens); k = 0 is plain decoding, rate ``b / t(b, 1)``.
Speculation is chosen only where it beats that (``margin``). As the batch shrinks ``t(b, w)``
flattens in w (a forward reads the weights once whatever its width), so longer drafts pay.

Both estimates are online: ``AcceptanceTracker`` counts accepted and rejected draft tokens per
strategy (a Beta prior stands in before any), and ``ForwardCost`` fits ``t(b, w)`` to the
rounds the engine has timed (least squares on 1, b, b * (w - 1) and a speculative round's
overhead, fixed and per row, ridge-pulled towards a prior shaped like a TPOT profile: a fixed
part plus a per-row part, width nearly free).
Nothing here changes outputs: the engine accepts only tokens equal to plain decoding's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import mul


@dataclass
class AcceptanceTracker:
    """Per strategy: draft tokens accepted and rounds that ended in a rejection.

    The geometric model's maximum-likelihood rate is accepted / (accepted + rejections); the
    prior adds ``prior_weight`` pseudo-tokens at ``prior_rate`` (or a caller's measured rate).
    ``survival`` refines it per draft position, for drafts whose tokens are right or wrong
    together (a copy inside a run of repeats is right to its end).
    """

    prior_rate: float = 0.5
    prior_weight: float = 2.0
    priors: dict[str, float] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    rejections: dict[str, int] = field(default_factory=dict)
    proposed: dict[str, int] = field(default_factory=dict)
    reached: dict[str, list[int]] = field(default_factory=dict)
    """Per strategy or kind: index i counts the drafts whose token i + 1 was checked (every
    token before it accepted)."""
    kept: dict[str, list[int]] = field(default_factory=dict)
    """... and index i the drafts whose token i + 1 was accepted."""

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

    def survival(self, strategy: str, length: int) -> list[float]:
        """For i = 1..``length``: the probability that draft token i is accepted given tokens
        1..i-1 were, measured per position and pulled towards ``rate(strategy)`` with
        ``prior_weight`` pseudo-drafts. Constant at ``rate`` for a geometric strategy; rising
        with i where drafts are right or wrong together."""
        alpha = self.rate(strategy)
        reached, kept = self.reached.get(strategy, []), self.kept.get(strategy, [])
        return [((kept[i] if i < len(kept) else 0) + self.prior_weight * alpha)
                / ((reached[i] if i < len(reached) else 0) + self.prior_weight) for i in range(length)]

    def best_survival(self, strategy: str, length: int) -> list[float]:
        """``survival`` of ``strategy``'s most promising kind of draft (the most expected tokens
        from a draft of ``length``), or of the strategy as a whole."""
        kinds = [strategy] + [kind for kind in self.accepted if kind.startswith(strategy + "/")]
        curves = [self.survival(kind, length) for kind in kinds]
        return max(curves, key=lambda c: sum(accumulate(c, mul)))

    def record(self, strategy: str, num_proposed: int, num_accepted: int, times: int = 1) -> None:
        """One row's verification: ``num_accepted`` of its ``num_proposed`` draft tokens kept
        (``times`` such rows: a round records each outcome once)."""
        self.proposed[strategy] = self.proposed.get(strategy, 0) + times * num_proposed
        self.accepted[strategy] = self.accepted.get(strategy, 0) + times * num_accepted
        if num_accepted < num_proposed:
            self.rejections[strategy] = self.rejections.get(strategy, 0) + times
        reached, kept = self.reached.setdefault(strategy, []), self.kept.setdefault(strategy, [])
        checked = min(num_proposed, num_accepted + 1)  # verification stops at the first mismatch
        while len(reached) < checked:
            reached.append(0)
            kept.append(0)
        for i in range(checked):
            reached[i] += times
        for i in range(num_accepted):
            kept[i] += times


MIN_PLAIN_WEIGHT = 1.0
"""See ``ForwardCost.plain_weight``: with decay 0.99, one plain round in about 70 speculative ones."""

MIN_WIDE_WEIGHT = 1.0
"""See ``ForwardCost.wide_weight``: as rare a round at the widest width the drafts allow."""


@dataclass
class ForwardCost:
    """Online estimate of one decode round's seconds at batch b and width w.

    Model: ``t = c0 + c1 * b + c2 * b * (w - 1) + (c3 + c4 * b) * [w > 1]``. ``c3 + c4 * b`` is
    what a speculative round costs beyond its wider forward whatever the draft length: its
    fixed part (the verification draw's launch and read-back, the cache rollback) and its part
    per row (drafting, bookkeeping). Without ``c4`` the per-row part lands in ``c2``, which
    then overstates each draft column and undervalues long drafts. On a CPU the extra is
    modest beside the forward; on a GPU, where an eager forward is launch-bound and nearly flat
    in b and w, it is a large part of a round (docs/gpu.md). The prior (``prior``, ``prior_weight`` pseudo-observations
    per coefficient) keeps the fit sane before the engine has timed any forward wider than 1.
    """

    prior: tuple[float, ...] = (2e-3, 1e-4, 2.5e-5, 5e-4, 1e-5)
    prior_weight: float = 1.0
    decay: float = 0.99
    _xtx: list[list[float]] = field(default_factory=lambda: [[0.0] * 5 for _ in range(5)])
    _xty: list[float] = field(default_factory=lambda: [0.0] * 5)
    plain_weight: float = 0.0
    """Decayed count of plain (width-1) rounds observed. Without them the fit cannot tell a
    speculative round's overhead ``c3`` from the fixed cost ``c0`` every round pays, and
    speculation looks cheaper than it is; ``speculative._Selector`` runs a plain round when
    this falls below ``MIN_PLAIN_WEIGHT``."""
    width_weight: dict[int, float] = field(default_factory=dict)
    """Decayed count of rounds observed per width. Rounds at the width the fit favours alone
    cannot tell the per-column cost ``c2`` from the fixed ``c3``: the fit then extrapolates to
    wider rounds by its prior, and if that overstates a column, wide rounds are never chosen
    and never measured. ``speculative._Selector`` widens a speculative round to its longest
    draft when ``wide_weight`` of that width falls below ``MIN_WIDE_WEIGHT``."""

    def wide_weight(self, width: int) -> float:
        """Decayed count of the rounds observed at ``width`` or wider."""
        return sum(v for w, v in self.width_weight.items() if w >= width)

    def observe(self, batch: int, width: int, seconds: float) -> None:
        self.plain_weight = self.decay * self.plain_weight + (1.0 if width == 1 else 0.0)
        for w in self.width_weight:
            self.width_weight[w] *= self.decay
        self.width_weight[width] = self.width_weight.get(width, 0.0) + 1.0
        spec = 1.0 if width > 1 else 0.0
        x = (1.0, float(batch), float(batch * (width - 1)), spec, spec * batch)
        for i in range(5):
            self._xty[i] = self.decay * self._xty[i] + x[i] * seconds
            for j in range(5):
                self._xtx[i][j] = self.decay * self._xtx[i][j] + x[i] * x[j]

    def coefficients(self) -> tuple[float, ...]:
        # Ridge towards the prior, scaled per coefficient so each term has comparable pull.
        # The per-column term weighs as much as 1/16 of a width-5 round at batch 64: a heavier
        # pull (it weighed ~8 such rounds) held c2 near its prior, and since rounds of similar
        # widths cannot tell c2 from the per-row overhead c4, the fit charged that overhead
        # per column and kept drafts short. Rare rounds at the widest width (``width_weight``)
        # identify c2 instead.
        scales = (1.0, 16.0, 64.0, 1.0, 16.0)
        a = [[self._xtx[i][j] + (self.prior_weight * scales[i] ** 2 if i == j else 0.0) for j in range(5)]
             for i in range(5)]
        b = [self._xty[i] + self.prior_weight * scales[i] ** 2 * self.prior[i] for i in range(5)]
        return tuple(max(c, 0.0) for c in _solve(a, b))

    def seconds(self, batch: int, width: int) -> float:
        return self.snapshot()(batch, width)

    def snapshot(self) -> "callable":
        """``seconds`` with the current fit frozen (one solve for many queries)."""
        c0, c1, c2, c3, c4 = self.coefficients()
        return lambda batch, width: max(
            c0 + c1 * batch + (c2 * batch * (width - 1) + c3 + c4 * batch if width > 1 else 0.0), 1e-9)


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


def choose_rows(rows: Sequence[tuple[int, float | Sequence[float]]], seconds: "callable", max_k: int,
                margin: float = 0.02) -> tuple[int, float, float]:
    """The k with the highest expected tokens per second when each row has its own draft.

    Args:
        rows: per row, (draft length, acceptance of that draft's strategy and kind: a rate, or
            per-position survival probabilities as ``AcceptanceTracker.survival`` gives, at
            least min(length, max_k) of them); a row without a draft is (0, 0.0).
        seconds: ``seconds(batch, width)`` -> one round's seconds (``ForwardCost.snapshot``).
        max_k: the longest draft allowed (``generation.max_draft_len``).
        margin: a speculative choice must beat plain decoding's rate by this fraction.
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
            p *= alpha if isinstance(alpha, (int, float)) else alpha[i - 1]
            gain[i] += p
    best_k, best_rate, tokens = 0, plain, float(b)
    for k in range(1, longest + 1):
        tokens += gain[k]
        rate = tokens / seconds(b, 1 + k)
        if rate > best_rate and rate > plain * (1.0 + margin):
            best_k, best_rate = k, rate
    return best_k, best_rate, plain


def can_pay(tracker: AcceptanceTracker, strategies: Sequence[str], batch: int, seconds: "callable",
            max_k: int) -> bool:
    """Whether any of ``strategies`` would beat plain decoding at ``batch`` rows if every row
    had a full-length draft of that strategy's best kind (``best_survival``): an optimistic
    test, so a False means no draft the strategies could make pays at this batch."""
    return any(choose_rows([(max_k, tracker.best_survival(n, max_k))] * batch, seconds, max_k)[0]
               for n in strategies)
