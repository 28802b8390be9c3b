"""Runs whose identity was recorded before ``model.lora`` and ``reward.models`` were part of it.

A derived run id hashes the settings that define what a run computes
(``CampaignConfig.identity``). Those two keys entered the identity without being left out at
their defaults (None, ``[]``), so every run id derived before then differs from the one the
same settings derive now (the default campaign: ``repeat-grpo-7a56ae721e20`` then,
``repeat-grpo-7cd0a181803c`` now), and its recorded identity lacks the two keys. A resume of
such a run takes the id it was derived with where the store holds a run under it and none under
today's (``resumed_run_id``), and compares the settings without the keys its record lacks, where
they are at those defaults (``as_recorded_then``). Runs derived since keep their ids.
"""

from __future__ import annotations

import copy
from typing import Any

from actions.store import ObjectStore, commit_key
from flows.campaign.lease import lease_key
from flows.config import CampaignConfig, fingerprint_of

LATER_KEYS: tuple[tuple[str, str, Any], ...] = (("reward", "models", []), ("model", "lora", None))
"""(section, key, value) of identity keys added after runs were committed without them, in the
order they were added: a run recorded without the key had that value."""


def as_recorded_then(identity: dict[str, Any], recorded: dict[str, Any] | None = None,
                     keys: tuple[tuple[str, str, Any], ...] = LATER_KEYS) -> dict[str, Any]:
    """``identity`` (a copy) without each of ``keys`` that holds its value there and that
    ``recorded`` (a run's recorded identity; None: a record from before them all) lacks."""
    out = copy.deepcopy(identity)
    for section, key, value in keys:
        lacks = recorded is None or key not in (recorded.get(section) or {})
        if lacks and section in out and key in out[section] and out[section][key] == value:
            del out[section][key]
    return out


def earlier_run_ids(cfg: CampaignConfig) -> list[str]:
    """The ids ``cfg`` derived before each of ``LATER_KEYS`` entered the identity (before both,
    then before the later one alone), those that differ from today's; none where ``run_id`` is set."""
    if cfg.run_id is not None:
        return []
    identity, now = cfg.identity(), cfg.fingerprint()
    stem = cfg.resolved_run_id().removesuffix(now)
    ids = [stem + fingerprint_of(as_recorded_then(identity, keys=LATER_KEYS[i:])) for i in range(len(LATER_KEYS))]
    return [i for i in dict.fromkeys(ids) if i != stem + now]


def resumed_run_id(cfg: CampaignConfig, store: ObjectStore) -> str | None:
    """For a resume: an earlier derivation's run id where the store holds a committed run under
    it and nothing under the id ``cfg`` derives now (not even the set-up or lease of a run stopped
    before its first commit, which ``status`` calls ``incomplete``); else None (resume what
    ``cfg`` names). A few one-key listings, whatever the runs' sizes."""
    earlier = earlier_run_ids(cfg)
    today = cfg.resolved_run_id()
    if not earlier or any(store.list(p) for p in (lease_key(today), f"runs/{today}/base/", _first_commit(today))):
        return None
    return next((i for i in earlier if store.list(_first_commit(i))), None)


def _first_commit(run_id: str) -> str:
    """The key of a run's first commit record (after set-up; garbage collection never deletes one)."""
    return commit_key(f"runs/{run_id}/campaign", 0)
