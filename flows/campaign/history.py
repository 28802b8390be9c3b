"""A campaign's per-step history in sealed segments, so that commit records stay small.

Every commit record holds the whole campaign state. The per-step metrics (about 3.4 KB a step
with its plan) and the evaluations grow with every step; records that carried them all would
grow the run's records quadratically (some 1.7 GB of records by step 1000). Instead, each
``SEGMENT`` consecutive entries of such a list are sealed, once, into a create-once object::

    runs/<run>/campaign/history/<name>-<first:06d>.json

and a record holds how many entries are sealed (``CampaignState.sealed``) and only the entries
after them. A record's size is then bounded by ``SEGMENT`` entries of each list, and the run's
history is written once in all.

Only entries an earlier record already holds are sealed (``CampaignState`` knows how many the
record it was read from or last committed as held): the step being committed may be replayed
after a crash with other measured times, while committed entries never change. So a segment
is written by the commit after the one that completes it, a replay writes the same bytes
again, and a segment that differs is a second writer and is refused, as a commit record is.
Segments live outside ``steps/``, where garbage collection never deletes
(``flows/planning/retention.py``); it reads records without their history.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from actions.store import CommitConflict, IntegrityError, ObjectNotFound, ObjectStore

SEGMENT = 20
"""Entries per sealed segment: a record carries fewer than this many of each list. Records
average SEGMENT / 2 entries of 3.4 KB; at 100 (runs written before: their segments still read,
:func:`unseal`) a 10,000-step run's records came to 1.9 GB, at 20 about 0.35 GB, for one more
segment read per 20 steps on resume."""

LEGACY_SEGMENT = 100
"""``SEGMENT`` of the runs sealed before it was 20: their segments hold this many entries."""

HISTORY_SCHEMA = "rlhfless.history/v1"


def segment_key(run_id: str, name: str, first: int) -> str:
    """Key of the segment of list ``name`` that starts at entry ``first``."""
    return f"runs/{run_id}/campaign/history/{name}-{first:06d}.json"


def _encode(name: str, first: int, items: Sequence[Any]) -> bytes:
    return json.dumps({"_schema": HISTORY_SCHEMA, "name": name, "first": first, "items": list(items)},
                      sort_keys=True).encode()


def seal(store: ObjectStore, run_id: str, name: str, tail: Sequence[Any], sealed: int) -> int:
    """Write the whole segments of ``tail``, the entries after the ``sealed`` already sealed
    (JSON-ready, oldest first; only the tail, so a commit's cost does not grow with the run);
    return the new sealed count.

    Raises:
        ValueError: ``sealed`` is negative.
        CommitConflict: a segment exists with other entries (another writer, or a diverged replay).
    """
    if sealed < 0:
        raise ValueError(f"sealed={sealed}: must be a count of {name} entries")
    first = sealed
    while sealed + len(tail) - first >= SEGMENT:
        key = segment_key(run_id, name, first)
        data = _encode(name, first, tail[first - sealed:first - sealed + SEGMENT])
        store.put_if_absent(key, data)
        held = store.get(key)
        if held == data:  # as commit_pointer: a replay is fine, other entries are not
            first += SEGMENT
        elif held == _encode(name, first, tail[first - sealed:first - sealed + LEGACY_SEGMENT]):
            first += LEGACY_SEGMENT  # a replay of a run sealed in segments of 100: the same entries
        else:
            raise CommitConflict(f"history segment {key} already holds other {name} entries; another writer "
                                 "owns this campaign or the replay diverged")
    return first


def unseal(store: ObjectStore, run_id: str, name: str, sealed: Any) -> list[Any]:
    """The first ``sealed`` entries of list ``name``, read back from their segments: each
    segment's entries say where the next starts, so a run sealed before ``SEGMENT`` changed
    reads too (``LEGACY_SEGMENT`` entries in its first segments).

    Raises:
        IntegrityError: ``sealed`` is not a count, or a segment is missing, unreadable, not the
            one its key names or runs past ``sealed`` (one line naming the key).
    """
    if not isinstance(sealed, int) or isinstance(sealed, bool) or sealed < 0:
        raise IntegrityError(f"commit record of run {run_id!r}: sealed {name} count {sealed!r} is not a count; "
                             "it was not written by this version or was tampered with")
    out: list[Any] = []
    first = 0
    while first < sealed:
        key = segment_key(run_id, name, first)
        try:
            segment = json.loads(store.get(key))
        except ObjectNotFound:
            raise IntegrityError(f"history segment {key} is missing; the run's commit records name it "
                                 "(restore it from a backup of the store)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise IntegrityError(f"history segment {key} is not valid JSON: {exc}") from None
        if (not isinstance(segment, dict) or segment.get("_schema") != HISTORY_SCHEMA
                or segment.get("name") != name or segment.get("first") != first
                or not isinstance(segment.get("items"), list)
                or len(segment["items"]) not in (SEGMENT, LEGACY_SEGMENT) or len(segment["items"]) > sealed - first):
            raise IntegrityError(f"history segment {key} is not a {HISTORY_SCHEMA} segment of {name} entries from "
                                 f"{first} within the {sealed} sealed; it was tampered with")
        out.extend(segment["items"])
        first += len(segment["items"])
    return out
