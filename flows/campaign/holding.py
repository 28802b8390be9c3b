"""The campaign's hold on its run's lease (``flows/campaign/lease.py``) for as long as it runs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from actions.store import ObjectStore
from flows.campaign.lease import RunLease, held_lease
from flows.config import CampaignConfig


@contextlib.contextmanager
def holding_lease(cfg: CampaignConfig, store: ObjectStore, run_id: str, *, break_lease: bool,
                  progress: Callable[[str], None]) -> Iterator[RunLease]:
    """Adopt the lease this process already holds (the CLI takes it before Prefect starts), else
    take it, refusing with ``LeaseHeld`` when a live process has it; a lease taken here is
    released on exit."""
    lease = held_lease(store, run_id)
    owned = lease is None
    if lease is None:
        lease = RunLease.acquire(store, run_id, ttl_s=cfg.store.lease_ttl_s, break_lease=break_lease,
                                 progress=progress)
    try:
        yield lease
    finally:
        if owned:
            lease.release()
