"""Keeping the control plane's own time off the step, and measuring what is left.

* :func:`quiet_step_flows` -- per-step subflows run without Prefect's flow-run heartbeat. Its
  thread sleeps in 1 s ticks and the engine joins it when the flow returns, so every step
  subflow waited up to a second (0.96 s measured) after its work was done. The campaign's own
  flow run keeps its heartbeat, which a server automation can watch to mark a run whose
  process died ``Crashed`` (``infra/prefect/zombie-flow-runs.yaml``); a step's run cannot be.
* :class:`Background` -- the campaign's per-step control-plane jobs (the next step's flow run,
  ``flows/campaign/prestart.py``; the running step's parameters; the previous step's Prefect
  artifacts: metrics table, plan, report, progress) run on one background thread, one at a
  time, inside a window of the step: from its flow run entering Running
  (:func:`open_gate_when_running` opens the gate) to the start of its training, which closes
  it (``flows/campaign/run.py``). That window is the generation phase, where a generate
  activation leaves the control plane a core (``flows/invokers/cores.py``); training runs one
  thread per core, and a job beside it stalled the whole team (small steps trained in
  0.19-0.21 s against 0.13 s with nothing beside them). The next step's flow run is queued
  first, so it is made before the artifacts; what does not fit in one window waits for the
  next, and the campaign waits for everything once, at its end. The window also keeps the
  artifacts' writes off the creation of the step's flow run: on the local SQLite server two
  writes that meet fail one with ``SQLITE_BUSY`` (503), which Prefect's client retries 2 s later.
* :class:`StepClock` -- ``timing_s/overhead`` measured from the outside: the wall time of one
  step period (from the point before one commit to the point before the next, so everything
  in between is counted once: the subflow's creation, task runs, commit, collection, artifacts,
  the progress line) minus the work in it (activations' busy time on the critical path, with
  the wall time their failed attempts held (``flows/step/metrics.py``: ``_critical_busy``), an
  evaluation's busy time, planning, the state commit and the collection).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
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
    """One worker thread running side effects in the submitter's context (so Prefect calls still
    see the flow run), one at a time, in submission order except that a ``first`` job goes
    ahead of every job not yet started. A job that is ``gated`` starts only while ``gate`` is
    open (none: at once), and until it starts it holds back the jobs queued behind it; until it
    starts it can still be cancelled (its future's ``cancel()``). ``wait()`` opens the gate,
    waits for every job and re-raises the first failure; call it once, at the end."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self._gate = gate
        self._queue: deque[tuple[Future, bool, Callable[[], Any]]] = deque()
        self._changed = threading.Condition()
        self._busy = False  # a job is running
        self._closed = False
        self._futures: list[Future] = []
        # daemon: a queue nobody waits for must not keep the interpreter alive
        self._thread = threading.Thread(target=self._work, name="publish", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, gated: bool = True, first: bool = False) -> Future:
        """Queue ``fn(*args)``; ``gated=False``: it runs when its turn comes, open gate or not;
        ``first``: its turn comes before that of every job not yet started. Returns its future
        (``wait()`` skips one that was cancelled before it started)."""
        self._futures = [f for f in self._futures
                         if not f.done() or (not f.cancelled() and f.exception() is not None)]
        future: Future = Future()
        job = (future, gated, functools.partial(contextvars.copy_context().run, fn, *args))
        with self._changed:
            self._queue.appendleft(job) if first else self._queue.append(job)
            self._changed.notify_all()
        self._futures.append(future)
        return future

    def settle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the job running now, if any, to end (jobs queued are not
        waited for). Returns whether none runs."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._busy, timeout=timeout_s)

    def _next(self) -> tuple[Future, Callable[[], Any]] | None:
        """The next job to run, once its gate is open; None once closed and empty."""
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return None
                future, gated, call = self._queue[0]
                if not gated or self._gate is None or self._gate.is_set() or future.cancelled():
                    self._queue.popleft()
                    self._busy = True
                    return future, call
            self._gate.wait(0.05)  # then look again: a first job may have come in front

    def _work(self) -> None:
        while (job := self._next()) is not None:
            future, call = job
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(call())
                    except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                        future.set_exception(exc)
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()

    def wait(self) -> None:
        if self._gate is not None:
            self._gate.set()  # no step follows
        try:
            for f in list(self._futures):
                if not f.cancelled():
                    f.result()
        finally:
            with self._changed:
                self._closed = True
                self._changed.notify_all()
            self._thread.join()


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


SETTLE_S = 0.25
"""Longest wait, before training, for a background job in flight to end."""


def hold_for_training(gate: threading.Event, background: Background) -> None:
    """Keep the background queue's jobs to the generation phase, where a generate activation
    leaves them a core (``flows/invokers/cores.py``): close the gate (the next step's flow run
    opens it again once it is Running) and let the job in flight, if any, end first."""
    gate.clear()
    background.settle(SETTLE_S)
