"""Single-object operations on any backend: JSON objects and compare-and-swap.

Compare-and-swap (:func:`replace_if` / :func:`delete_if`) replaces or deletes an object only
while it still holds the bytes the caller last read; the run lease (``flows/campaign/lease.py``) is
built on it.
"""

from __future__ import annotations

import json
from typing import Any

from actions.store.protocol import ObjectNotFound, ObjectStore


def put_json(store: ObjectStore, key: str, obj: Any) -> None:
    """Write ``obj`` as JSON (sorted keys, so the same object gives the same bytes)."""
    store.put(key, json.dumps(obj, sort_keys=True).encode())


def get_json(store: ObjectStore, key: str) -> Any:
    """Read the JSON object at ``key`` (:class:`ObjectNotFound` when it is missing)."""
    return json.loads(store.get(key))


def replace_if(store: ObjectStore, key: str, expected: bytes, data: bytes) -> bool:
    """Compare-and-swap: write ``data`` at ``key`` only if ``key`` still holds ``expected``.

    Uses the backend's ``replace_if`` (local: under a directory lock; S3: ``If-Match`` on the
    ETag of the bytes compared). A backend without one gets a read, a compare and a write,
    which is not atomic against another writer.
    """
    method = getattr(store, "replace_if", None)
    if method is not None:
        return bool(method(key, expected, data))
    if not _holds(store, key, expected):
        return False
    store.put(key, data)
    return True


def delete_if(store: ObjectStore, key: str, expected: bytes) -> bool:
    """Delete ``key`` only if it still holds ``expected`` (see :func:`replace_if`)."""
    method = getattr(store, "delete_if", None)
    if method is not None:
        return bool(method(key, expected))
    if not _holds(store, key, expected):
        return False
    store.delete(key)
    return True


def _holds(store: ObjectStore, key: str, expected: bytes) -> bool:
    """Whether ``key`` exists and holds exactly ``expected`` (a plain read: not atomic)."""
    try:
        return store.get(key) == expected
    except ObjectNotFound:
        return False
