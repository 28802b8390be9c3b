"""Whole calls, speculative against plain: the check that speculation does not lose.

The selector (``spec_select``) prices a speculative round against a plain round of the same
loop. Where the plain loop overlaps a step with the host's bookkeeping (CUDA graphs:
``static_decode`` launches step s + 1 before it applies step s), a call that speculates gives up
more than the rounds the selector sees: on an H200 the plain graphed loop took 3.9 ms a step
while calls that speculated ran at 0.45-0.72x of it (docs/gpu.md). ``CallRates`` compares what
matters instead, per batch bucket: the decode seconds per generated token of calls that ran the
speculative loop against those of calls that were asked to speculate and decoded plainly.

Decision for a call of a bucket (``CallRates.verdict``):

* no speculative call measured yet: speculate (the selector decides per round, as before);
* speculative calls measured, no plain call: run one plain call to measure it;
* both measured: speculate unless the speculative calls' seconds per token exceed the plain
  calls' by more than ``margin``; where they do, speculate again once ``recheck`` calls have
  passed since the last speculative one, a wait that doubles while speculation stays slower (up
  to ``recheck_max``), so that a policy whose drafts grow better is found again.

The waits count recorded calls (``record``), so a call that the engine decodes plainly for
another reason (the selector's own estimates, ``TorchEngine._skip_speculation``) does not use
up a recheck. Pure bookkeeping: the engine times its decode loops, graph captures and
compilations left out (paid once per warm container and shape), and reports them. Means are
decayed (``decay`` per new call), so a bucket follows a policy whose acceptance drifts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["CallRates", "Verdict"]

Verdict = Literal["speculate", "measure", "plain"]


@dataclass
class CallRates:
    """Decode seconds per generated token of plain and of speculative calls, per batch bucket
    (module docstring). ``verdict`` says what the next call of a bucket runs."""

    margin: float = 0.03
    """How much slower (a fraction) speculative calls may be before a bucket decodes plainly."""
    decay: float = 0.5
    """Weight of the old mean when a call is recorded (0: the last call alone)."""
    recheck: int = 4
    """Calls from one speculative call to the next while speculation is slower, at first."""
    recheck_max: int = 16
    """The longest such wait, in calls."""
    plain: dict[int, float] = field(default_factory=dict)
    """Bucket -> decayed mean seconds per new token of plain calls."""
    spec: dict[int, float] = field(default_factory=dict)
    """Bucket -> the same for calls that ran the speculative loop."""
    _waits: dict[int, list[int]] = field(default_factory=dict, init=False, repr=False)
    """Bucket -> [plain calls since the last speculative one, the wait], while speculation is slower."""

    def record(self, bucket: int, speculative: bool, seconds: float, tokens: int) -> None:
        """One call's decode loop: ``seconds`` for ``tokens`` new tokens (a call with none says nothing)."""
        if tokens <= 0 or seconds <= 0.0:
            return
        means = self.spec if speculative else self.plain
        rate = seconds / tokens
        old = means.get(bucket)
        means[bucket] = rate if old is None else self.decay * old + (1.0 - self.decay) * rate
        if not self.slower(bucket):
            self._waits.pop(bucket, None)
        elif speculative:  # a recheck that did not pay: wait longer before the next (first: ``recheck``)
            wait = 2 * self._waits[bucket][1] if bucket in self._waits else self.recheck
            self._waits[bucket] = [0, min(wait, self.recheck_max)]
        else:
            self._waits.setdefault(bucket, [0, self.recheck])[0] += 1

    def slower(self, bucket: int) -> bool:
        """Whether speculative calls of this bucket were measured slower than plain ones."""
        s, p = self.spec.get(bucket), self.plain.get(bucket)
        return s is not None and p is not None and s > p * (1.0 + self.margin)

    def verdict(self, bucket: int) -> Verdict:
        """What the next call of this bucket runs: ``"speculate"``, ``"measure"`` (a plain call,
        to measure plain decoding) or ``"plain"``. Changes nothing (``record`` counts calls)."""
        if bucket not in self.spec:
            return "speculate"
        if bucket not in self.plain:
            return "measure"
        if not self.slower(bucket):
            return "speculate"
        since, wait = self._waits.get(bucket, [0, self.recheck])
        return "speculate" if since + 1 >= wait else "plain"
