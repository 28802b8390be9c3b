"""The live campaign's handles (config, store, invoker), shared by flow tasks.

Prefect runs tasks in threads of the flow's process; handles such as the invoker's HTTP pool
are not parameters (they are not serialisable), so tasks read them from here. Set once by the
campaign before any flow runs.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from actions.common.config import CampaignConfig
from actions.common.contracts import Control
from actions.common.store import ObjectStore
from flows.invokers.base import Invoker

if TYPE_CHECKING:
    from flows.campaign.live_profile import LiveInputs


@dataclass
class RunContext:
    config: CampaignConfig
    store: ObjectStore
    invoker: Invoker
    run_id: str
    live: LiveInputs | None = None
    """The planner's measured inputs (``flows/campaign/live_profile.py``), set at campaign start."""
    injected: set[tuple[str, str]] = field(default_factory=set)
    killed: set[tuple[str, str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def prefix(self) -> str:
        return f"runs/{self.run_id}"

    def fault_payload(self, action: str, shard: str) -> dict[str, Any]:
        """The fault-injection keys (``faults``) to add to this activation's payload: at most
        one of a failure or a kill on the first attempt, plus latency on every attempt."""
        inject = self.should_inject(action, shard)
        kill = not inject and self.should_kill(action, shard)
        return Control(inject_failure=inject, inject_kill_after_s=self.config.faults.kill_after_s if kill else None,
                       inject_latency_s=self.latency_for(action, shard)).to_payload()

    def should_inject(self, action: str, shard: str) -> bool:
        """Fault injection: fail the first activation of a deterministic fraction of shards."""
        f = self.config.faults
        if f.fail_fraction <= 0 or action not in f.actions or _draw(f.seed, "", action, shard) >= f.fail_fraction:
            return False
        return self._first(self.injected, action, shard)

    def should_kill(self, action: str, shard: str) -> bool:
        """Fault injection: kill the worker during the first activation of a deterministic
        fraction of shards, never one that ``should_inject`` fails."""
        f = self.config.faults
        if f.kill_fraction <= 0 or action not in f.actions or _draw(f.seed, "kill:", action, shard) >= f.kill_fraction:
            return False
        if f.fail_fraction > 0 and _draw(f.seed, "", action, shard) < f.fail_fraction:
            return False
        return self._first(self.killed, action, shard)

    def latency_for(self, action: str, shard: str) -> float:
        """Fault injection: seconds of extra latency for every activation of a deterministic
        fraction of shards (0.0 for the others)."""
        f = self.config.faults
        if f.latency_s <= 0 or action not in f.actions or _draw(f.seed, "latency:", action, shard) >= f.latency_fraction:
            return 0.0
        return f.latency_s

    def _first(self, seen: set[tuple[str, str]], action: str, shard: str) -> bool:
        with self.lock:
            if (action, shard) in seen:
                return False
            seen.add((action, shard))
            return True


def _draw(seed: int, kind: str, action: str, shard: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, fault kind, action, shard)."""
    digest = hashlib.sha256(f"{seed}:{kind}{action}:{shard}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


_current: RunContext | None = None


def set_context(ctx: RunContext | None) -> None:
    global _current
    _current = ctx


def current() -> RunContext:
    if _current is None:
        raise RuntimeError("no campaign context: flows must run inside rlhf_campaign or with set_context()")
    return _current
