"""What the live planner plans from, measured (or read from the store's cache) when a campaign
starts (``flows/campaign/live_profile.py``) and held by the run's context
(``flows/step/context.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flows.planning.tpot import TpotProfile


@dataclass(frozen=True)
class LiveInputs:
    """What the planner is built from (``flows/step/phase.py``)."""

    profile: TpotProfile
    source: str
    """``measured`` | ``cached`` (this store's profile for the same facts) | ``file``
    (``scaling.profile``) | ``built-in`` (no profiler for the engine)."""
    weight_bytes: float = 0.0
    kv_bytes_per_token: float = 0.0
    transfer_bandwidth_bytes_per_s: float = float("inf")
    threads: int = 1
    """Torch threads of one action (a generation action occupies this many cores)."""
    activation_s: float = 0.0
    """Median round trip of an empty activation through the flow's task path (seconds)."""
    profile_key: str = ""
    weight_push_s: float = 0.0
    """The vLLM engine's measured push of a new policy version into it (0: torch engine)."""
    measure_s: float = 0.0
    """Seconds the profile action spent measuring the grid (0: read from the store's cache)."""

    def describe(self) -> dict[str, Any]:
        """The summary's ``profile`` entry."""
        return {"name": self.profile.name, "source": self.source, "key": self.profile_key,
                "weight_bytes": self.weight_bytes, "kv_bytes_per_token": self.kv_bytes_per_token,
                "store_read_bytes_per_s": self.transfer_bandwidth_bytes_per_s, "threads": self.threads,
                "activation_s": self.activation_s, "weight_push_s": self.weight_push_s}
