"""Warm-container cache: expensive objects kept across warm invocations.

OpenWhisk may reuse a container for the next activation of the same action, and the local
warm pool always does. Anything costly to build (a model at a policy version, a tokenizer, a
dataset) is cached here under an explicit key such as ``("policy", manifest_key)``. A miss is
always correct, just slower; the action reports hits and misses in its result so the flow can
log warm/cold ratios.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

_MAX_ENTRIES = 8
_cache: OrderedDict[Hashable, Any] = OrderedDict()
_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0}


def get_or_build(key: Hashable, build: Callable[[], T], *,
                 supersedes: Callable[[Hashable], bool] | None = None) -> tuple[T, bool]:
    """Return (value, hit). Builds outside the lock so a slow build does not block readers.

    ``supersedes``: on a miss, every other entry whose key it returns True for is evicted
    before the build: state the new value replaces and no later request asks for (a run's
    older critic versions), which would otherwise hold a model's memory until the LRU limit
    reached it. Evicted first, so the old and the new model are not held together.
    """
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            _stats["hits"] += 1
            return _cache[key], True
        for old in [k for k in _cache if supersedes is not None and k != key and supersedes(k)]:
            del _cache[old]
    value = build()
    put(key, value)
    with _lock:
        _stats["misses"] += 1
    return value, False


def take(key: Hashable) -> Any | None:
    """Remove and return the value under ``key`` (None when absent): for state the taker
    mutates, such as a model it trains, which no later hit may see half-changed."""
    with _lock:
        value = _cache.pop(key, None)
        _stats["hits" if value is not None else "misses"] += 1
        return value


def put(key: Hashable, value: Any) -> None:
    """Keep ``value`` under ``key`` (replacing any), evicting the least recently used."""
    with _lock:
        _cache[key] = value
        _cache.move_to_end(key)
        while len(_cache) > _MAX_ENTRIES:
            _cache.popitem(last=False)


def note(hit: bool) -> None:
    """Count a hit or a miss of warm state kept outside this cache (the generation slot,
    ``actions/engines/torch_slot.py``), so the action's warm counts include it."""
    with _lock:
        _stats["hits" if hit else "misses"] += 1


def stats() -> dict[str, int]:
    with _lock:
        return dict(_stats)


def clear() -> None:
    with _lock:
        _cache.clear()
