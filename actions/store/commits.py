"""The commit pointer: create-once, step-numbered commit records read without listing.

Layout under a pointer key K (e.g. ``runs/r1/campaign``)::

    K/commits/step-000012.json   create-once (put_if_absent); the commit record itself
    K/latest.json                overwritten after each commit; a hint, never the truth

Steps are committed consecutively, starting at 0 or 1. The highest committed step is the
highest N whose commit record exists; since existence is monotone in N (consecutive), a reader
finds it by probing upward -- from ``latest.json``'s step when that hint is valid, else by
galloping from the first step -- in O(log distance) GETs/HEADs and no listing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from actions.store.objects import put_json
from actions.store.protocol import CommitConflict, IntegrityError, ObjectNotFound, ObjectStore

COMMIT_SCHEMA = "rlhfless.commit/v1"


def commit_key(key: str, step: int) -> str:
    """Key of the commit record for ``step`` under pointer ``key``."""
    return f"{key}/commits/step-{step:06d}.json"


def _encode_commit(payload: Mapping[str, Any]) -> bytes:
    if "_schema" in payload:
        raise ValueError("commit payload key '_schema' is reserved for the record format")
    return json.dumps({"_schema": COMMIT_SCHEMA, **payload}, sort_keys=True).encode()


def commit_pointer(store: ObjectStore, key: str, payload: Mapping[str, Any]) -> str:
    """Commit ``payload`` as step ``payload["step"]`` of pointer ``key``.

    Writes ``key/commits/step-NNNNNN.json`` create-once, then ``key/latest.json``. Committing
    the same payload again is a no-op (replay after a crash between the two writes).

    Args:
        store: the object store.
        key: the pointer's key prefix, e.g. ``runs/<run_id>/campaign``.
        payload: JSON-serialisable dict with an int ``"step"`` >= 0 (plus anything the reader
            needs: policy version, manifest keys, metrics).

    Returns:
        The commit record's key.

    Raises:
        ValueError: ``step`` is missing or negative, or step-1 was never committed (steps must
            be consecutive from 0 or 1, or readers could not find them without listing).
        CommitConflict: the step is already committed with a different payload.
    """
    step = payload.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"commit payload needs an int 'step' >= 0, got {step!r}")
    if step > 1 and not store.exists(commit_key(key, step - 1)):
        raise ValueError(
            f"cannot commit step {step} of {key!r}: step {step - 1} is not committed "
            "(commits must be consecutive)"
        )
    record_key = commit_key(key, step)
    data = _encode_commit(payload)
    store.put_if_absent(record_key, data)
    # Read back whether or not this call created the record: a replay with the same payload
    # is fine, a different payload is a second writer. (On stores that ignore If-None-Match,
    # put_if_absent is HEAD+PUT and this also catches most of that race.)
    if store.get(record_key) != data:
        raise CommitConflict(
            f"step {step} of {key!r} is already committed with a different payload "
            f"({record_key}); another writer owns this campaign or the replay diverged"
        )
    put_json(store, f"{key}/latest.json", {"_schema": COMMIT_SCHEMA, "step": step, "commit": record_key})
    return record_key


def _read_commit(store: ObjectStore, key: str, step: int) -> dict[str, Any] | None:
    record_key = commit_key(key, step)
    try:
        record = json.loads(store.get(record_key))
    except ObjectNotFound:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"commit record {record_key!r} is not valid JSON: {exc}") from None
    if not isinstance(record, dict) or record.pop("_schema", None) != COMMIT_SCHEMA:
        raise IntegrityError(f"commit record {record_key!r} is not a {COMMIT_SCHEMA} record")
    return record


def _latest_hint(store: ObjectStore, key: str) -> int | None:
    try:
        hint = json.loads(store.get(f"{key}/latest.json"))
        step = hint["step"]
        return step if isinstance(step, int) and step >= 0 else None
    except (ObjectNotFound, ValueError, KeyError, TypeError):
        return None  # a missing or damaged hint only costs a few more probes


def read_pointer(store: ObjectStore, key: str) -> dict[str, Any] | None:
    """The payload of the highest committed step of pointer ``key``, or None if none.

    Reads ``latest.json``, checks that its step's commit record exists, then probes upward
    (1, 2, 4, ... steps ahead, then bisects) in case a writer crashed between the commit and
    the hint update. Never lists.
    """
    hint = _latest_hint(store, key)
    if hint is not None and store.exists(commit_key(key, hint)):
        low = hint
    else:
        low = next((s for s in (0, 1) if store.exists(commit_key(key, s))), None)
        if low is None:
            return None
    # Gallop: find a missing step above `low`, then bisect between the last present and it.
    gap = 1
    while store.exists(commit_key(key, low + gap)):
        low, gap = low + gap, gap * 2
    high = low + gap  # known missing
    while high - low > 1:
        mid = (low + high) // 2
        if store.exists(commit_key(key, mid)):
            low = mid
        else:
            high = mid
    return _read_commit(store, key, low)
