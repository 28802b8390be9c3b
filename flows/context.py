"""The live campaign's handles (config, store, invoker), shared by flow tasks.

Prefect runs tasks in threads of the flow's process; handles such as the invoker's HTTP pool
are not parameters (they are not serialisable), so tasks read them from here. Set once by the
campaign before any flow runs.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field

from actions.common.config import CampaignConfig
from actions.common.storage import ObjectStore
from flows.invokers.base import Invoker


@dataclass
class RunContext:
    config: CampaignConfig
    store: ObjectStore
    invoker: Invoker
    run_id: str
    injected: set[tuple[str, str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def prefix(self) -> str:
        return f"runs/{self.run_id}"

    def should_inject(self, action: str, shard: str) -> bool:
        """Fault injection: fail the first activation of a deterministic fraction of shards."""
        f = self.config.faults
        if f.fail_fraction <= 0 or action not in f.actions:
            return False
        digest = hashlib.sha256(f"{f.seed}:{action}:{shard}".encode()).digest()
        if int.from_bytes(digest[:8], "big") / 2**64 >= f.fail_fraction:
            return False
        with self.lock:
            if (action, shard) in self.injected:
                return False
            self.injected.add((action, shard))
            return True


_current: RunContext | None = None


def set_context(ctx: RunContext | None) -> None:
    global _current
    _current = ctx


def current() -> RunContext:
    if _current is None:
        raise RuntimeError("no campaign context: flows must run inside rlhf_campaign or with set_context()")
    return _current
