"""The generation drain: what a step does as its generation actions return (paper §3.4, §4.7).

Pure decisions, no clock, futures or I/O: the caller passes ``now`` and executes what comes
back. The live step (``flows/step/flow.py``) and the cluster model (``flows/simulate/cluster.py``)
share :class:`ContinuationWindow`, the rule that batches cut samples into one continuation;
the step drives it through :class:`GenerationDrain`, which also names the continuations and
decides when and how each rollout is scored.

Rules, in the order they apply to one returned action:

1. its cut samples (``partial_key``) join the continuation window; the first one opens it;
2. the window closes ``window_s`` after it opened, or as soon as no action that can still be
   cut is pending (nothing more can join, and waiting would only delay the phase's tail); a
   closed window becomes ONE continuation action (``cont-<n>``), submitted before this
   action's score, because the continuation is what the phase waits for;
3. a rollout with finished samples is scored: at once where scores overlap generation
   (``overlap_scoring``), else after the phase, packed into at most ``score_bins`` activations
   (``flows/planning/score_batches.py``) in submission order (``gen-0``.., then ``cont-0``..),
   so the same step packs alike every time; a pack is named after its first shard.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from flows.planning.score_batches import pack_score_batches

T = TypeVar("T", bound=Hashable)


@dataclass
class ContinuationWindow(Generic[T]):
    """Cut samples gathered for one continuation (rules 1 and 2 of the module docstring).

    ``items`` are whatever the caller continues: partial-sample object keys in the step,
    sample ids in the simulator. Times are seconds on the caller's clock.
    """

    window_s: float
    items: list[T] = field(default_factory=list)
    closes_at: float = math.inf

    def add(self, items: Iterable[T], now: float) -> None:
        """Gather ``items``; the first ones open the window at ``now``."""
        items = list(items)
        if items and not self.items:
            self.closes_at = now + self.window_s
        self.items.extend(items)

    def due(self, now: float, *, cuttable_pending: bool) -> bool:
        """Whether the gathered items go to a continuation now."""
        return bool(self.items) and (now >= self.closes_at or not cuttable_pending)

    def take(self) -> list[T]:
        """The gathered items; the window is empty and closed afterwards."""
        items, self.items, self.closes_at = self.items, [], math.inf
        return items

    def wait_s(self, now: float) -> float | None:
        """Seconds until the window closes (None: nothing gathered, wait for a return)."""
        return max(0.0, self.closes_at - now) if self.items else None


@dataclass(frozen=True)
class ReturnedShard:
    """What the drain needs of one returned generation action (a ``GenerateResult``)."""

    shard: str
    rollout_key: str
    partial_key: str | None
    score_work: float
    """Scoring work of its finished samples (response tokens + EOS); 0: none finished."""


@dataclass(frozen=True)
class SubmitContinuation:
    shard: str
    partial_keys: tuple[str, ...]


@dataclass(frozen=True)
class SubmitScore:
    shard: str
    """Named after its first rollout's shard: ``score-<shard>``."""
    rollout_keys: tuple[str, ...]


Submit = SubmitContinuation | SubmitScore


class GenerationDrain:
    """The step's generation phase as a state machine over returns (module docstring).

    Args:
        cut_after: per planned action ``gen-<i>``, its cut point (None: never cut).
        window_s: the continuation batching window (``generation.migrate_window_s``).
        overlap_scoring: score each rollout the moment it returns.
        score_bins: most score activations after the phase (the plan's fan-out).
    """

    def __init__(self, cut_after: Sequence[int | None], *, window_s: float, overlap_scoring: bool,
                 score_bins: int) -> None:
        self.submitted = [f"gen-{i}" for i in range(len(cut_after))]
        self.pending = set(self.submitted)
        # only actions with a cut point can still return cut samples (continuations and the
        # actions the planner lets run to the end never do)
        self.cuttable = {s for s, after in zip(self.submitted, cut_after) if after is not None}
        self.window: ContinuationWindow[str] = ContinuationWindow(window_s)
        self.overlap_scoring = overlap_scoring
        self.score_bins = score_bins
        self.num_continuations = 0
        self.continued_from: dict[str, tuple[str, ...]] = {}
        """Continuation shard -> the shards whose cut samples it finishes, in return order
        (a step's generate chains: ``flows/step/metrics.py``)."""
        self._cut_in: dict[str, str] = {}  # partial key -> the shard that returned it
        self._to_score: dict[str, tuple[str, float]] = {}  # shard -> (rollout key, work)

    @property
    def finished(self) -> bool:
        return not self.pending and not self.window.items

    def wait_s(self, now: float) -> float | None:
        """How long to wait for the next return before calling :meth:`on_return` with None."""
        return self.window.wait_s(now)

    def on_return(self, returned: ReturnedShard | None, now: float) -> list[Submit]:
        """Apply rules 1-3 to one return (None: the wait timed out); what to submit, in order."""
        if returned is not None:
            self.pending.discard(returned.shard)
            if returned.partial_key:
                self._cut_in[returned.partial_key] = returned.shard
                self.window.add([returned.partial_key], now)
        out: list[Submit] = []
        if self.window.due(now, cuttable_pending=bool(self.pending & self.cuttable)):
            name = f"cont-{self.num_continuations}"
            self.num_continuations += 1
            self.submitted.append(name)
            self.pending.add(name)
            keys = tuple(self.window.take())
            self.continued_from[name] = tuple(self._cut_in[k] for k in keys)
            out.append(SubmitContinuation(name, keys))
        if returned is not None and returned.score_work > 0:
            if self.overlap_scoring:
                out.append(SubmitScore(returned.shard, (returned.rollout_key,)))
            else:
                self._to_score[returned.shard] = (returned.rollout_key, returned.score_work)
        return out

    def final_scores(self) -> list[SubmitScore]:
        """The scores held back until the phase ended (rule 3, ``overlap_scoring`` off)."""
        work = dict(self._to_score[s] for s in self.submitted if s in self._to_score)
        shard_of = {key: s for s, (key, _) in self._to_score.items()}
        return [SubmitScore(shard_of[keys[0]], tuple(keys)) for keys in pack_score_batches(work, self.score_bins)]
