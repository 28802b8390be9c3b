"""Creating the next step's flow run while the current step works.

A nested flow run called the usual way creates itself on the caller's thread before its body
starts: the subflow's tracking task run in the parent (through a new async client: a CSRF
request and a connection each time), a look for an earlier run of that tracking task (for a
parent that is re-run), the flow, and the flow run. :class:`FlowRunStarter` makes the same
records (the tracking task run, named by the parent's run as Prefect names it, then the flow
run under it, Pending, with the caller's tags) on a background thread while the previous step
runs, and runs the next call against that flow run (``prefect.flow_engine.run_flow(flow_run=
...)``). What users see is the same: one flow run per call, a child of the parent's tracking
task run, with its parameters, task runs, logs and states Pending -> Running -> Completed.
What is left on the caller's path is the engine's own: an update of the run, Running, a read,
and Completed.

The parameters of a call are not known when its flow run is created; they are written to the
flow run once it is Running, on the same background thread, in Prefect's form
(``Flow.serialize_parameters``).

Jobs go to one :class:`~flows.campaign.overhead.Background` queue, so the server sees one
writer at a time from it; a write that still meets the server recording the running step's
task runs is retried within milliseconds (``flows/campaign/api_client.py``). A creation that
has not started when the call comes is cancelled and Prefect creates the run the usual way, so
a creation queued behind a gated job never blocks the call that would open the gate.

A call's flow run cancelled while it runs (``prefect flow-run cancel``, the UI) is not stopped:
nothing delivers a cancel to a flow run that runs in its parent's process, and the server
refuses the engine's Completed, so the engine ends with the run Cancelling. The call still
returns its result; :meth:`FlowRunStarter.cancelled` then names the run (kept by an
``on_cancellation`` hook, which the engine runs when the run enters Cancelling: no request),
and :meth:`FlowRunStarter.mark_cancelled` ends it Cancelled.

Not covered: a process killed between a creation and its call leaves one Pending flow run
behind (the parent's run is left Running then anyway); :meth:`FlowRunStarter.close` deletes an
unused one otherwise.

A prepared run cancelled while still Pending never runs: the engine's Running is refused, and
its call raises :class:`CancelledBeforeStart` naming the run (Prefect's own error,
``UnfinishedRun``, would not).
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future
from typing import Any

from flows.campaign.api_client import RETRY_SOON
from flows.campaign.overhead import Background


class CancelledBeforeStart(Exception):
    """The call's flow run was cancelled before it started (Pending, prepared ahead): its body
    did not run. ``flow_run``: the run, Cancelling."""

    def __init__(self, flow_run: Any) -> None:
        super().__init__(f"flow run {flow_run.name!r} ({flow_run.id}) was cancelled before it started")
        self.flow_run = flow_run


class FlowRunStarter:
    """Runs ``flow`` as a nested flow run of the current flow run, created ahead of the call.

    Use inside a flow run: ``prepare()`` queues the creation of the next call's flow run,
    ``run(*args, **kwargs)`` runs the flow like ``flow(*args, **kwargs)`` (the same result
    or exception), ``cancelled()`` says whether that call's run was cancelled while it ran, and
    ``close()`` deletes a prepared run that no call used.
    """

    def __init__(self, flow: Any, background: Background) -> None:
        self.flow = flow.with_options(on_cancellation=[*flow.on_cancellation_hooks, self._keep_cancelled])
        self._cancelled: Any = None  # the last call's flow run, once it entered Cancelling
        self._background = background
        self._next: Future | None = None
        self._api: Any = None  # the jobs' client, opened by the first (see _client)
        self._api_lock = threading.Lock()

    def prepare(self, gated: bool = False) -> None:
        """Queue the creation of the next call's flow run (at most one is kept); ``gated``: it
        waits for the queue's gate, ahead of the jobs queued already."""
        if self._next is None:
            self._next = self._background.submit(self._create, gated=gated, first=gated)

    def run(self, *args: Any, prepare_next: bool = False, **kwargs: Any) -> Any:
        """``flow(*args, **kwargs)`` against the prepared flow run (Prefect creates one as usual
        when none is ready); ``prepare_next``: queue the next call's creation, gated, first in
        the queue, so it is the first job once this call's run opens the gate.

        Raises:
            CancelledBeforeStart: the prepared run was cancelled before the call started it."""
        from prefect.exceptions import UnfinishedRun
        from prefect.flow_engine import run_flow
        from prefect.utilities.callables import get_call_parameters

        parameters = get_call_parameters(self.flow.fn, args, kwargs)
        flow_run = self._take()
        if prepare_next:
            self.prepare(gated=True)
        if flow_run is not None:  # written once it runs (the module docstring)
            self._background.submit(self._write_parameters, flow_run.id, parameters)
        self._cancelled = None
        try:
            return run_flow(flow=self.flow, flow_run=flow_run, parameters=parameters)
        except UnfinishedRun:  # Running refused: the run is Cancelling (the module docstring)
            if self._cancelled is None:
                raise
            raise CancelledBeforeStart(self._cancelled) from None

    def cancelled(self) -> Any:
        """The last call's flow run if it entered Cancelling (it was cancelled while it ran: the
        call returned its result all the same), else None."""
        return self._cancelled

    def mark_cancelled(self, flow_run: Any, message: str) -> None:
        """Set ``flow_run`` (:meth:`cancelled`'s) Cancelled with ``message``: forced, as nothing
        else moves a Cancelling run whose process goes on. Raises the client's error if the
        server does not answer."""
        from prefect.states import Cancelled

        self._client().set_flow_run_state(flow_run.id, Cancelled(message=message), force=True)

    def close(self) -> None:
        """Delete the prepared flow run and its tracking task run if no call used them; the
        jobs' client closes after the jobs queued before this call."""
        flow_run = self._take()
        if flow_run is not None:
            client = self._client()
            client.delete_flow_run(flow_run.id)
            if flow_run.parent_task_run_id is not None:
                client.delete_task_run(flow_run.parent_task_run_id)
        if self._api is not None:
            self._background.submit(self._api.__exit__, None, None, None)

    def _keep_cancelled(self, flow: Any, flow_run: Any, state: Any) -> None:
        """``on_cancellation`` hook (the engine runs it in the caller's thread when the run enters
        Cancelling): keep the run for :meth:`cancelled`."""
        self._cancelled = flow_run

    def _client(self) -> Any:
        """One Prefect client for every job of this starter, opened on first use. A client per
        job paid a connection and a CSRF-token request (Prefect's client asks for one before its
        first write) on every request it made."""
        with self._api_lock:
            if self._api is None:
                from prefect.client.orchestration import get_client

                self._api = get_client(sync_client=True, httpx_settings=RETRY_SOON).__enter__()
            return self._api

    def _take(self) -> Any:
        """The prepared flow run, or None when its creation had not started (cancelled)."""
        future, self._next = self._next, None
        if future is None or future.cancel():
            return None
        try:
            return future.result()
        except CancelledError:  # pragma: no cover - cancel() above returned False
            return None

    def _create(self) -> Any:
        """The tracking task run in the current flow run (none outside a flow run), then the
        flow run under it, Pending: what ``FlowRunEngine.create_flow_run`` does for a call,
        minus the look for an earlier run (a new call never has one)."""
        from prefect import Task
        from prefect._internal.engine import dynamic_key_for_task_run
        from prefect.context import FlowRunContext, TagsContext
        from prefect.states import Pending

        parent = FlowRunContext.get()
        tags = TagsContext.get().current_tags
        client = self._client()
        tracking_id = None
        if parent is not None and parent.flow_run is not None:
            tracking = Task(name=self.flow.name, fn=self.flow.fn, version=self.flow.version)
            tracking._is_subflow_tracking_task = True  # type: ignore[attr-defined]  # as Prefect marks it
            key = dynamic_key_for_task_run(context=parent, task=tracking)  # the server's create is keyed by it
            tracking_id = client.create_task_run(task=tracking, flow_run_id=parent.flow_run.id,
                                                 dynamic_key=str(key), name=f"{tracking.name}-{key}",
                                                 state=Pending(), task_inputs={}, extra_tags=tags).id
        return client.create_flow_run(flow=self.flow, parameters={}, state=Pending(),
                                      parent_task_run_id=tracking_id, tags=tags)

    def _write_parameters(self, flow_run_id: Any, parameters: dict[str, Any]) -> None:
        self._client().update_flow_run(flow_run_id, parameters=self.flow.serialize_parameters(parameters))
