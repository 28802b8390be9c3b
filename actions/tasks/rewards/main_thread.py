"""Run a reward function in the main thread of a process, wherever it is called from.

Some reward libraries time their work out with ``signal.alarm`` (``math-verify``), which only
the main thread of a process may use. Actions run in the request threads of the action server
(``actions/runtime/server.py``) and of the in-process invoker, so such a function called there
fails ("doesn't support threaded environment"). :func:`call_in_main_thread` calls it directly
when the caller *is* a main thread, and otherwise in a helper process, where it runs in that
process's main thread with its library's own timeouts: the same code, so the same values.

The helper is one ``spawn``-started process per action process (a ``ProcessPoolExecutor``
with one worker), started on first use and kept warm like the action's other caches. It is
started from one long-lived thread and asks the kernel for a parent-death signal, and it also
polls its parent pid: it never outlives the action process (``tests/test_pool_lifetime.py``).
A call that runs past ``timeout_s`` or kills the helper raises :class:`TimeoutError` or
``BrokenProcessPool``; the helper is then replaced on the next call.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any

DEFAULT_TIMEOUT_S = 600.0
"""Longest one call may take in the helper (the library's own per-item timeouts come first)."""
_PARENT_POLL_S = 0.25

_lock = threading.Lock()
_helper: ProcessPoolExecutor | None = None
# The helper is forked by this one thread: Linux ties the parent-death signal to the thread
# that forked, and a request thread ends with its request.
_starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="main-thread-helper")


def call_in_main_thread(target: str, /, *args: Any, timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs: Any) -> Any:
    """``module:function`` called with ``args`` and ``kwargs`` in a main thread.

    Args:
        target: ``"package.module:function"``, importable in a fresh process.
        timeout_s: seconds the helper may take before the call fails (and the helper is killed).

    Raises:
        TimeoutError: the helper ran past ``timeout_s``.
        Whatever the function raises (pickled back from the helper).
    """
    if threading.current_thread() is threading.main_thread():
        return _resolve(target)(*args, **kwargs)
    helper = _get_helper()
    try:
        future = _starter.submit(helper.submit, _run, target, args, kwargs).result()
        return future.result(timeout=timeout_s)
    except TimeoutError:
        _discard(helper)
        raise TimeoutError(f"{target} ran past {timeout_s:.0f} s in its helper process") from None
    except BrokenProcessPool:
        _discard(helper)
        raise


def _resolve(target: str) -> Callable[..., Any]:
    module, name = target.split(":", 1)
    return getattr(importlib.import_module(module), name)


def _run(target: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    """In the helper (its main thread, where ProcessPoolExecutor runs its calls)."""
    return _resolve(target)(*args, **kwargs)


def _get_helper() -> ProcessPoolExecutor:
    global _helper
    with _lock:
        if _helper is None:
            _helper = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"),
                                          initializer=_die_with_parent, initargs=(os.getpid(),))
        return _helper


def _discard(helper: ProcessPoolExecutor) -> None:
    """Kill a helper that hangs or died, so the next call starts a fresh one."""
    global _helper
    with _lock:
        if _helper is helper:
            _helper = None
    for proc in list(getattr(helper, "_processes", {}).values()):
        proc.kill()
    helper.shutdown(wait=False, cancel_futures=True)


def _die_with_parent(parent_pid: int) -> None:
    """Helper initializer: exit when the action process is gone, however it died."""
    from actions.runtime.lifeline import die_with_parent

    die_with_parent(parent_pid)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="parent-poll", daemon=True).start()
