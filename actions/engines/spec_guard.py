"""Whole calls, speculative against plain: the check that speculation does not lose.

The selector (``spec_select``) prices a speculative round against a plain round of the same
loop. Where the plain loop overlaps a step with the host's bookkeeping (CUDA graphs:
``static_decode`` launches step s + 1 before it applies step s), a call that speculates gives up
more than the rounds the selector sees: on an H200 the plain graphed loop took 3.9 ms a step
while calls that speculated ran at 0.45-0.72x of it (docs/gpu.md). ``CallRates`` compares what
matters instead, per batch bucket: the decode seconds per generated token of calls that ran the
speculative loop against those of plain calls, and sends a call to the plain loop where the
speculative ones were slower.

Decision for a call of a bucket (``CallRates.verdict``):

* no speculative call measured yet: speculate (the selector decides per round, as before);
* speculative calls measured, no plain call: run one plain call to measure it;
* both measured: speculate unless the speculative calls' seconds per token exceed the plain
  calls' by more than ``margin``; where they do, speculate again only every ``recheck`` calls
  (doubling while they stay slower, up to ``recheck_max``), so that a policy whose drafts grow
  better is found again.

Pure bookkeeping: the engine times its decode loops and reports them (``record``). Means are
decayed (``decay`` per new call), so a bucket follows a policy whose acceptance drifts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CallRates"]


@dataclass
class CallRates:
    """Decode seconds per generated token of plain and of speculative calls, per batch bucket
    (module docstring). ``verdict`` says what the next call of a bucket runs."""

    margin: float = 0.03
    decay: float = 0.5
    recheck: int = 4
    recheck_max: int = 16
    plain: dict[int, float] = field(default_factory=dict)
    spec: dict[int, float] = field(default_factory=dict)
    _waits: dict[int, list[int]] = field(default_factory=dict)  # bucket -> [calls since a recheck, wait]

    def record(self, bucket: int, speculative: bool, seconds: float, tokens: int) -> None:
        """One call's decode loop: ``seconds`` for ``tokens`` new tokens (a call with none says nothing)."""
        if tokens <= 0 or seconds <= 0.0:
            return
        means = self.spec if speculative else self.plain
        rate = seconds / tokens
        old = means.get(bucket)
        means[bucket] = rate if old is None else self.decay * old + (1.0 - self.decay) * rate

    def slower(self, bucket: int) -> bool:
        """Whether speculative calls of this bucket were measured slower than plain ones."""
        s, p = self.spec.get(bucket), self.plain.get(bucket)
        return s is not None and p is not None and s > p * (1.0 + self.margin)

    def verdict(self, bucket: int) -> str:
        """``"speculate"``, ``"measure"`` (a plain call, to measure plain decoding) or ``"plain"``
        for the next call of this bucket; counts the call towards a recheck."""
        if bucket not in self.spec:
            return "speculate"
        if bucket not in self.plain:
            return "measure"
        if not self.slower(bucket):
            self._waits.pop(bucket, None)
            return "speculate"
        since, wait = self._waits.setdefault(bucket, [0, self.recheck])
        if since + 1 < wait:
            self._waits[bucket][0] = since + 1
            return "plain"
        self._waits[bucket] = [0, min(2 * wait, self.recheck_max)]
        return "speculate"
