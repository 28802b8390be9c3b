"""Keeping the control plane's own time off the step, and measuring what is left.

* :func:`quiet_step_flows` -- per-step subflows run without Prefect's flow-run heartbeat. Its
  thread sleeps in 1 s ticks and the engine joins it when the flow returns, so every step
  subflow waited up to a second (0.96 s measured) after its work was done. The campaign's own
  flow run keeps its heartbeat: a crashed process is still detected by the run that holds it.
* :class:`Background` -- Prefect artifacts (metrics table, plan, report, progress) are
  published on one background thread, in commit order, while the next step runs; the campaign
  waits for them once, at its end. A job waits for its gate: the next step's flow run entering
  Running (:func:`open_gate_when_running`). On the local SQLite server an artifact write
  that coincides with the creation of the step's flow run makes that write fail with
  ``SQLITE_BUSY`` (503), and Prefect's client retries it 2 s later: up to 2 s on every step
  where the two met, which was most of them. Once the step runs, the API is quiet. The same
  queue creates the next step's flow run (``flows/campaign/prestart.py``), without the gate.
* :class:`StepClock` -- ``timing_s/overhead`` measured from the outside: the wall time of one
  step period (from the point before one commit to the point before the next, so everything
  in between is counted once: the subflow's creation, task runs, commit, collection, artifacts,
  the progress line) minus the work in it (activations' busy time on the critical path, an
  evaluation's busy time, planning, the state commit and the collection).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


@contextlib.contextmanager
def quiet_step_flows() -> Iterator[None]:
    """Flow runs started inside this block send no heartbeats (see the module docstring)."""
    try:
        from prefect.context import SettingsContext, get_settings_context
    except ImportError:  # pragma: no cover - Prefect is a dependency of flows/
        yield
        return
    ctx = get_settings_context()
    settings = ctx.settings
    # A copy, not temporary_settings(): its update drops None values, and None is what turns
    # the heartbeat off (FlowsSettings.heartbeat_frequency: Optional[int]).
    flows = settings.flows.model_copy(update={"heartbeat_frequency": None})
    with SettingsContext(profile=ctx.profile, settings=settings.model_copy(update={"flows": flows})):
        yield


class Background:
    """One worker thread running side effects in submission order, in the submitter's context
    (so Prefect calls still see the flow run), each once ``gate`` is open (none: at once).
    ``wait()`` opens the gate, waits for every job and re-raises the first failure."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish")
        self._futures: list[Future] = []
        self._gate = gate

    def submit(self, fn: Callable[..., Any], *args: Any, gated: bool = True) -> Future:
        """Queue ``fn(*args)``; ``gated=False``: it runs when its turn comes, open gate or not.
        Returns its future (``wait()`` skips one that was cancelled before it started)."""
        self._futures = [f for f in self._futures
                         if not f.done() or (not f.cancelled() and f.exception() is not None)]
        future = self._pool.submit(contextvars.copy_context().run, self._gated, gated, fn, *args)
        self._futures.append(future)
        return future

    def _gated(self, gated: bool, fn: Callable[..., Any], *args: Any) -> Any:
        if gated and self._gate is not None:
            self._gate.wait()
        return fn(*args)

    def wait(self) -> None:
        if self._gate is not None:
            self._gate.set()  # no step follows
        try:
            for f in self._futures:
                if not f.cancelled():
                    f.result()
        finally:
            self._pool.shutdown(wait=True)


def open_gate_when_running(flow: Any, gate: threading.Event) -> Any:
    """``flow`` with an ``on_running`` hook that opens ``gate``: the flow run exists and its
    Running state is set, so the API calls that start it are over. The caller closes the
    gate before each call."""
    def opened(*_: Any) -> None:
        gate.set()

    return flow.with_options(on_running=[*flow.on_running_hooks, opened])


class StepClock:
    """Wall time per step period, and the work done in it, for ``timing_s/overhead``."""

    def __init__(self) -> None:
        self._mark = time.time()
        self._carried_work = 0.0

    def add_work(self, seconds: float) -> None:
        """Work done outside the step's activations (a commit, a collection, an evaluation)."""
        self._carried_work += max(0.0, seconds)

    def close_period(self, step_work_s: float) -> tuple[float, float]:
        """End the current period now; returns (its wall seconds, its overhead seconds)."""
        now = time.time()
        wall = now - self._mark
        overhead = max(0.0, wall - step_work_s - self._carried_work)
        self._mark, self._carried_work = now, 0.0
        return wall, overhead
