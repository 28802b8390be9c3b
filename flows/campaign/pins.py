"""Versions that ``rlhfless gc`` keeps for good: ``runs/<run>/pins.json``.

A training commit records its checkpoints in its commit record (``CampaignState.checkpoints``).
``rlhfless gc`` writes no commit record, so the checkpoints its retention keeps
(``--checkpoint-every N``, or ``store.checkpoint_every`` of its config) are recorded here, and
every later collection of the run (``rlhfless gc``, and the one after each training commit) keeps
them as it keeps committed checkpoints, whatever its own settings. The object lies outside
``steps/``, so no collection deletes it.

Only a holder of the run's lease writes it (``rlhfless gc`` under the lease; a campaign, which
holds the lease while it trains, never writes it), so a read, a merge and one ``put`` make an
update that loses no pin; a ``put`` is atomic on every backend (a rename on a local store, one
PUT on S3), so a reader sees the old list or the new one, never a torn one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from actions.store import IntegrityError, ObjectNotFound, ObjectStore, get_json, put_json

PINS_SCHEMA = "rlhfless.pins/v1"


def pins_key(run_id: str) -> str:
    return f"runs/{run_id}/pins.json"


def read_pins(store: ObjectStore, run_id: str) -> frozenset[int]:
    """The versions ``rlhfless gc`` pinned for the run; none when it never pinned any.

    Raises:
        IntegrityError: the object is not a pins record (one line naming it and the fix): a
            collection that cannot tell which versions are pinned must delete nothing.
    """
    key = pins_key(run_id)
    try:
        data = get_json(store, key)
    except ObjectNotFound:
        return frozenset()
    except (ValueError, UnicodeDecodeError):  # not JSON
        data = None
    versions = data.get("versions") if isinstance(data, dict) and data.get("_schema") == PINS_SCHEMA else None
    if not isinstance(versions, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                 for v in versions):
        raise IntegrityError(f"{key} is not a {PINS_SCHEMA} record (version numbers under 'versions'), so the "
                             f"versions `rlhfless gc` pinned are unknown; restore it, or write "
                             f"{json.dumps({'_schema': PINS_SCHEMA, 'versions': []})} there (the versions it pinned "
                             "are then kept only while a retention setting keeps them), then collect again")
    return frozenset(versions)


def record_pins(store: ObjectStore, run_id: str, versions: Iterable[int]) -> frozenset[int]:
    """Add ``versions`` to the run's pins; call it holding the run's lease. Writes nothing when
    none is new. Returns every pinned version."""
    pinned = read_pins(store, run_id)
    merged = pinned | frozenset(versions)
    if merged != pinned:
        put_json(store, pins_key(run_id), {"_schema": PINS_SCHEMA, "versions": sorted(merged)})
    return merged
