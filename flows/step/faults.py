"""Fault injection for resilience tests (``faults.*``): which activations fail, die or stall.

Each kind picks a deterministic fraction of (action, shard) pairs by a hash of ``faults.seed``;
a failure or a kill hits only the first attempt of its shard (the retry succeeds), and one
shard gets at most one of them; latency hits every attempt. What to inject travels to the
action as control keys (``actions.runtime.control.Control``) beside the request, never inside it.
"""

from __future__ import annotations

import hashlib
import threading

from actions.runtime.control import Control
from flows.config import FaultConfig


class FaultInjector:
    """The faults of one campaign; safe to call from the flow's task threads."""

    def __init__(self, config: FaultConfig) -> None:
        self.config = config
        self._injected: set[tuple[str, str]] = set()
        self._killed: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def control(self, action: str, shard: str) -> Control:
        """The faults of this activation: at most one of a failure or a kill on the first
        attempt, plus latency on every attempt (all defaults: nothing to inject)."""
        inject = self.should_inject(action, shard)
        kill = not inject and self.should_kill(action, shard)
        return Control(inject_failure=inject, inject_kill_after_s=self.config.kill_after_s if kill else None,
                       inject_latency_s=self.latency_for(action, shard))

    def should_inject(self, action: str, shard: str) -> bool:
        """Fail the first activation of a deterministic fraction of shards."""
        f = self.config
        if f.fail_fraction <= 0 or action not in f.actions or _draw(f.seed, "", action, shard) >= f.fail_fraction:
            return False
        return self._first(self._injected, action, shard)

    def should_kill(self, action: str, shard: str) -> bool:
        """Kill the worker during the first activation of a deterministic fraction of shards,
        never one that ``should_inject`` fails."""
        f = self.config
        if f.kill_fraction <= 0 or action not in f.actions or _draw(f.seed, "kill:", action, shard) >= f.kill_fraction:
            return False
        if f.fail_fraction > 0 and _draw(f.seed, "", action, shard) < f.fail_fraction:
            return False
        return self._first(self._killed, action, shard)

    def latency_for(self, action: str, shard: str) -> float:
        """Seconds of extra latency for every activation of a deterministic fraction of shards
        (0.0 for the others)."""
        f = self.config
        if f.latency_s <= 0 or action not in f.actions or _draw(f.seed, "latency:", action, shard) >= f.latency_fraction:
            return 0.0
        return f.latency_s

    def _first(self, seen: set[tuple[str, str]], action: str, shard: str) -> bool:
        with self._lock:
            if (action, shard) in seen:
                return False
            seen.add((action, shard))
            return True


def _draw(seed: int, kind: str, action: str, shard: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, fault kind, action, shard)."""
    digest = hashlib.sha256(f"{seed}:{kind}{action}:{shard}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
