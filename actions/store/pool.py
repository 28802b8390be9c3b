"""The bounded thread pool that moves the blobs of one artifact (or one GC sweep).

Threads, not processes: the work is network or disk I/O and hashing, and both boto3 and
hashlib release the GIL while they wait or hash a large buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TypeVar

from actions.store.protocol import ObjectStore

T = TypeVar("T")
R = TypeVar("R")


def transfer_threads(store: ObjectStore, num_items: int) -> int:
    """Threads for ``num_items`` transfers on ``store``: its ``max_concurrency`` (1 when the
    backend has none), never more than there are items, at least 1."""
    return max(1, min(int(getattr(store, "max_concurrency", 1)), num_items))


def map_bounded(fn: Callable[[T], R], items: Iterable[T], max_workers: int) -> list[R]:
    """``[fn(x) for x in items]`` on at most ``max_workers`` threads, results in item order.

    On the first failure, work not yet started is cancelled and that exception is raised
    (transfers already running finish; their objects are harmless: nothing points at them).
    """
    items = list(items)
    if max_workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="store") as pool:
        futures = [pool.submit(fn, x) for x in items]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
        for f in futures:  # the first failure in item order, for a deterministic message
            if f in done and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        return [f.result() for f in futures]
