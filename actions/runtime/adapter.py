"""The thin ``main`` every action exposes: validate, run the core, return a JSON dict.

Contract violations come back as ``{"error": ..., "field": ...}`` (an OpenWhisk application
error, not retried). Fault injection for tests (``faults`` in the campaign config):
``__inject_failure`` in the payload makes the activation fail like a crashed container
(``InjectedFault``, classified transient and retried by the flow); ``__inject_latency_s`` sleeps that long first;
``__inject_kill_after_s`` is taken by the runtime server, which kills its own process, so it
arrives here only in-process, where it fails the activation like a crash instead.
``__threads`` (set by the local pool and the in-process invoker, never by users) is the
activation's share of the machine's cores: torch's intra-op thread count while it runs.
Any other exception propagates to the runtime server, which answers 502 with its classification
(``actions.runtime.errors``: transient or permanent).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from actions.contracts import parse_request
from actions.models import warm
from actions.runtime.control import Control, WarmCounts, split_control
from actions.runtime.errors import InjectedFault
from actions.store import IntegrityError, ObjectNotFound
from actions.store.credentials import redact


def run_action(request_model: type, core: Callable[[Any], Any], args: dict[str, Any]) -> dict[str, Any]:
    req = parse_request(request_model, args)
    if isinstance(req, dict):
        return _refusal(req["error"], req["field"])
    try:
        _, control = split_control(args)
    except ValidationError as exc:  # the invoker's keys: never set by hand, so a bug upstream
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else "control"
        return _refusal(f"control key {key}: {err['msg'].lower()} (got {err.get('input')!r})", key)
    if control.inject_failure:
        raise InjectedFault("injected fault (faults.fail_fraction): simulated container crash")
    if control.inject_kill_after_s is not None:
        raise InjectedFault("injected kill (faults.kill_fraction) with no worker process to kill: simulated crash")
    if control.inject_latency_s:
        time.sleep(control.inject_latency_s)
    from actions.models.loading import configure_threads  # torch: here, so validate_inputs at the CLI stays light

    configure_threads(control.threads)
    before = warm.stats()
    try:
        result = core(req)
    except (ObjectNotFound, IntegrityError, ValueError) as exc:
        # Missing or corrupted inputs, or a bad device setting, will not heal by retrying: an
        # application error naming what to fix.
        return _refusal(str(exc), getattr(exc, "field", "store"))
    after = warm.stats()
    counts = WarmCounts(hits=after["hits"] - before["hits"], misses=after["misses"] - before["misses"])
    return result.model_dump(mode="json") | Control(warm=counts).to_payload()


def _refusal(message: str, field: str) -> dict[str, str]:
    """The application-error result. It is stored in the activation record and travels into
    the flow's errors and logs, and it may quote a payload value (an environment variable
    bound as a default parameter by mistake included): secrets are scrubbed first."""
    return {"error": redact(message), "field": field}
