"""The OpenWhisk REST client: actions, packages, invoke (blocking, 202 fallback, polling) and
activations, with the retry rules of the package docstring (``flows.invokers.openwhisk``).
Each request goes through :class:`~flows.invokers.openwhisk.api.ControllerApi`; what an
activation record means is decided in :mod:`flows.invokers.openwhisk.activations`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

from flows.invokers.base import ActionError
from flows.invokers.openwhisk.activations import classify_activation
from flows.invokers.openwhisk.api import (
    ControllerApi,
    OpenWhiskError,
    OpenWhiskNotFound,
    RetryPolicy,
    error_text,
    has_activation,
    json_object,
)
from flows.invokers.openwhisk.config import OpenWhiskConfig

log = logging.getLogger(__name__)

MAX_BLOCKING_WAIT_MS = 60_000
"""The controller's cap on a blocking invoke's wait (``timeout`` query parameter)."""
DEFAULT_TIME_LIMIT_MS = 300_000


class OpenWhiskClient:
    """One controller, one namespace, one pooled connection set; safe to share across threads.

    ``stats`` counts retries by cause (``throttled``, ``unavailable``, ``transport``, ``connect``,
    ``lost``, ``developer_retry``) and ``polls``.
    """

    def __init__(
        self,
        config: OpenWhiskConfig,
        *,
        retry: RetryPolicy | None = None,
        max_connections: int = 64,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
    ) -> None:
        self.config = config
        self.retry = retry or RetryPolicy()
        self._api = ControllerApi(config, self.retry, max_connections=max_connections, transport=transport,
                                  sleep=sleep, clock=clock, seed=seed)
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._meta: dict[str, dict[str, Any]] = {}
        self.stats = self._api.stats

    def __repr__(self) -> str:
        return f"OpenWhiskClient({self.config!r})"

    def close(self) -> None:
        self._api.close()

    def __enter__(self) -> OpenWhiskClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ names and paths
    def split_name(self, name: str) -> tuple[str, str]:
        """``/ns/pkg/a`` -> (ns, "pkg/a"); ``pkg/a`` or ``a`` -> (configured namespace, name)."""
        if name.startswith("/"):
            ns, _, rest = name.strip("/").partition("/")
            return ns, rest
        return self.config.namespace, name.strip("/")

    def _entity_path(self, collection: str, name: str) -> str:
        ns, rel = self.split_name(name)
        parts = rel.split("/")
        if not rel or len(parts) > 2 or not all(parts):
            raise ValueError(f"{collection[:-1]} name {name!r} must be NAME, PKG/NAME or /NS/PKG/NAME")
        return f"/namespaces/{quote(ns, safe='')}/{collection}/" + "/".join(quote(p, safe="") for p in parts)

    def _activation_path(self, activation_id: str, suffix: str = "") -> str:
        return f"/namespaces/{quote(self.config.namespace, safe='')}/activations/{quote(activation_id, safe='')}{suffix}"

    # ------------------------------------------------------------------ actions and packages
    def list_actions(self, *, package: str | None = None, page_size: int = 200) -> list[dict[str, Any]]:
        """All actions (``ActionMeta``: no code or image) in the namespace or one package."""
        ns = quote(self.config.namespace, safe="")
        path = f"/namespaces/{ns}/actions" + (f"/{quote(package, safe='')}/" if package else "")
        out: list[dict[str, Any]] = []
        while True:
            params = {"limit": str(page_size), "skip": str(len(out))}
            resp = self._api.request("GET", path, what="list actions", params=params)
            if resp.status_code == 404:
                raise OpenWhiskNotFound(f"package {package} does not exist in namespace {self.config.namespace}", status=404)
            if resp.status_code != 200:
                raise self._api.fail(resp, "list actions")
            page = self._api.body(resp, "list actions", list)
            out.extend(page)
            if len(page) < page_size:
                return out

    def get_action(self, name: str, *, deadline: float | None = None) -> dict[str, Any]:
        """The full action record (exec, limits, annotations, parameters); retries end by
        ``deadline`` (a ``clock()`` value), if given."""
        what = f"get action {name}"
        resp = self._api.request("GET", self._entity_path("actions", name), what=what, deadline=deadline)
        if resp.status_code == 404:
            raise OpenWhiskNotFound(self._missing_action(name), status=404)
        if resp.status_code != 200:
            raise self._api.fail(resp, what)
        return self._api.body(resp, what)

    def put_action(self, name: str, action: dict[str, Any], *, overwrite: bool = True) -> dict[str, Any]:
        """Create or replace an action from an ``ActionPut`` body; returns the stored record."""
        return self._put("actions", name, action, overwrite)

    def delete_action(self, name: str) -> None:
        self._forget(name)
        resp = self._api.request("DELETE", self._entity_path("actions", name), what=f"delete action {name}")
        if resp.status_code == 404:
            raise OpenWhiskNotFound(self._missing_action(name), status=404)
        if resp.status_code != 200:
            raise self._api.fail(resp, f"delete action {name}")

    def get_package(self, name: str) -> dict[str, Any]:
        resp = self._api.request("GET", self._entity_path("packages", name), what=f"get package {name}")
        if resp.status_code == 404:
            raise OpenWhiskNotFound(f"package {name} does not exist in namespace {self.config.namespace}", status=404)
        if resp.status_code != 200:
            raise self._api.fail(resp, f"get package {name}")
        return self._api.body(resp, f"get package {name}")

    def put_package(self, name: str, package: dict[str, Any], *, overwrite: bool = True) -> dict[str, Any]:
        return self._put("packages", name, package, overwrite)

    def _put(self, collection: str, name: str, body: dict[str, Any], overwrite: bool) -> dict[str, Any]:
        self._forget(name)
        what = f"put {collection[:-1]} {name}"
        params = {"overwrite": "true" if overwrite else "false"}
        resp = self._api.request("PUT", self._entity_path(collection, name), what=what, params=params, body=body)
        if resp.status_code == 404 and collection == "actions":
            pkg = self.split_name(name)[1].partition("/")[0]
            raise OpenWhiskNotFound(f"{what}: package {pkg} does not exist; create it first", status=404)
        if resp.status_code != 200:
            raise self._api.fail(resp, what)
        return self._api.body(resp, what)

    def describe_action(self, name: str, *, deadline: float | None = None) -> dict[str, Any]:
        """``get_action``, cached per client (limits and annotations drive polling and accounting)."""
        with self._lock:
            cached = self._meta.get(name)
        if cached is None:
            cached = self.get_action(name, deadline=deadline)
            with self._lock:
                self._meta[name] = cached
        return cached

    def get_limits(self) -> dict[str, Any] | None:
        """The namespace's ``UserLimits`` (``GET /namespaces/{ns}/limits``: min/max action memory,
        timeout, logs, concurrency... as far as the controller reports them); None where the
        controller does not serve that path (404, 405)."""
        path = f"/namespaces/{quote(self.config.namespace, safe='')}/limits"
        resp = self._api.request("GET", path, what="get limits")
        if resp.status_code in (404, 405):
            return None
        if resp.status_code != 200:
            raise self._api.fail(resp, "get limits")
        return self._api.body(resp, "get limits")

    def _forget(self, name: str) -> None:
        with self._lock:
            self._meta.pop(name, None)

    def _missing_action(self, name: str) -> str:
        ns, rel = self.split_name(name)
        package, _, _ = rel.rpartition("/")
        if not package:
            return f"action {rel} does not exist in namespace {ns}; run `rlhfless deploy`"
        # a wrong invoker.package looks the same as an undeployed action: name both fixes
        return (f"action {rel} does not exist in namespace {ns}; run `rlhfless deploy` with a manifest whose "
                f"`package:` is {package!r}, or set invoker.package to the package your manifest deploys")

    # ------------------------------------------------------------------ activations
    def get_activation(self, activation_id: str) -> dict[str, Any]:
        return self._get_activation_part(activation_id, "")

    def activation_logs(self, activation_id: str) -> list[str]:
        return list(self._get_activation_part(activation_id, "/logs").get("logs") or [])

    def activation_result(self, activation_id: str) -> dict[str, Any]:
        """``{result, status, success, size}``."""
        return self._get_activation_part(activation_id, "/result")

    def _get_activation_part(self, activation_id: str, suffix: str) -> dict[str, Any]:
        what = f"get activation {activation_id}{suffix}"
        resp = self._api.request("GET", self._activation_path(activation_id, suffix), what=what)
        if resp.status_code == 404:
            raise OpenWhiskNotFound(f"activation {activation_id} is not (yet) recorded", status=404)
        if resp.status_code != 200:
            raise self._api.fail(resp, what)
        return self._api.body(resp, what)

    # ------------------------------------------------------------------ invoke
    def invoke(
        self,
        name: str,
        params: dict[str, Any],
        *,
        blocking: bool = True,
        timeout_s: float | None = None,
        idempotent: bool | None = None,
        failed: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Run an action and wait for its activation record.

        Args:
            name: ``NAME``, ``PKG/NAME`` or ``/NS/PKG/NAME``.
            params: the JSON payload (at most ~1 MB: pass object-store keys).
            blocking: wait on the controller (up to ``blocking_wait_ms``, then poll) or submit
                and poll at once.
            timeout_s: overall deadline in seconds, retries and polling included; None waits
                as long as the controller may take for the action (``RetryPolicy.lost_after_s``).
                An activation still running at the deadline is left to run and reported, never
                invoked again (:func:`still_running`).
            idempotent: override ``RetryPolicy.idempotent`` for this call.
            failed: where to append the record of every activation that failed on the way
                (retried in place, or the one raised), for billing: OpenWhisk charges their
                ``duration``. An activation that was lost (never recorded) or outlived the
                deadline has no record, and adds nothing.

        Returns:
            The successful activation record (``response.status == "success"``).

        Raises:
            ActionError: the activation failed, was lost or outlived the deadline (``transient``
                per the module table; the deadline is not transient).
            OpenWhiskError: the controller refused the request (auth, missing action, limits).
        """
        idem = self.retry.idempotent if idempotent is None else idempotent
        deadline = self.deadline_after(timeout_s)
        num_lost = num_dev_retries = 0
        while True:
            record, activation_id = self._invoke_once(name, params, blocking, deadline, idem)
            if record is None:
                num_lost += 1
                self._api.count("lost")
                if not idem or num_lost > self.retry.lost_retries:
                    raise ActionError(name, f"activation {activation_id} was accepted but never recorded "
                                      f"({num_lost} lost in a row)", transient=True, activation_id=activation_id)
                log.warning("invoke %s: activation %s lost; invoking again", name, activation_id)
                continue
            failure, retry_in_place = classify_activation(name, record)
            if failure is None:
                return record
            if failed is not None:
                failed.append(record)
            can_retry = idem and num_dev_retries < self.retry.developer_error_retries
            if retry_in_place and can_retry and (deadline is None or self._clock() < deadline):
                num_dev_retries += 1
                self._api.count("developer_retry")
                log.warning("invoke %s: %s; invoking again", name, failure.message)
                continue
            raise failure

    def deadline_after(self, timeout_s: float | None) -> float | None:
        """The ``clock()`` value ``timeout_s`` from now; None for None (no deadline)."""
        return None if timeout_s is None else self._clock() + timeout_s

    def time_left(self, deadline: float | None) -> float | None:
        """Seconds left before ``deadline`` (:meth:`deadline_after`), at least 0; None for None."""
        return None if deadline is None else max(0.0, deadline - self._clock())

    def _invoke_once(
        self, name: str, params: dict[str, Any], blocking: bool, deadline: float | None, idem: bool
    ) -> tuple[dict[str, Any] | None, str]:
        wait_ms = min(self.retry.blocking_wait_ms, MAX_BLOCKING_WAIT_MS)
        remaining = self._api.remaining(deadline)
        if remaining is not None:
            if remaining <= 0:
                raise ActionError(name, "no time left before the deadline to invoke", transient=True)
            # The controller sends the activation id (202) when the wait ends: the read below must
            # outlast the wait by a margin, so the wait ends that much before the deadline.
            wait_ms = min(wait_ms, int((remaining - self.retry.blocking_margin_s) * 1000))
        blocking = blocking and wait_ms >= 1  # too close to the deadline to wait: submit, then poll
        query = {"blocking": "true" if blocking else "false", "result": "false"}
        if blocking:
            query["timeout"] = str(wait_ms)
        sent = self._clock()
        resp = self._api.request(
            "POST",
            self._entity_path("actions", name),
            what=f"invoke {name}",
            params=query,
            body=params,
            deadline=deadline,
            retry_unavailable=idem,
            timeout_s=wait_ms / 1000 + self.retry.request_timeout_s if blocking else None,
        )
        if resp.status_code in (200, 500, 502) and has_activation(resp):
            record = json_object(resp)
            return record, record["activationId"]
        if resp.status_code == 202:
            activation_id = json_object(resp).get("activationId") or resp.headers.get("x-openwhisk-activation-id", "")
            if not activation_id:
                raise OpenWhiskError(f"invoke {name}: HTTP 202 without an activation id", status=202, transient=True)
            return self._await(name, activation_id, sent, deadline), activation_id
        if resp.status_code == 404:
            raise OpenWhiskNotFound(self._missing_action(name), status=404)
        if resp.status_code == 413:
            raise OpenWhiskError(
                f"invoke {name}: HTTP 413 {error_text(resp)}: the payload is over the controller's limit "
                "(whisk.limits.activation.payload.max, 1 MB by default) or its ingress's body limit; actions "
                "take object-store keys, not data: raise scaling.n_min so each action gets fewer prompts, or "
                "raise the limit", status=413)
        raise self._api.fail(resp, f"invoke {name}")

    def _await(self, name: str, activation_id: str, sent: float, deadline: float | None) -> dict[str, Any] | None:
        """Poll until the record is stored; None when it is lost (``RetryPolicy.lost_after_s``
        after ``sent``: the controller's own bound, queueing included).

        Raises:
            ActionError: the deadline passed first (not transient: :func:`still_running`), or polls
                failed until the controller's bound or the deadline (:func:`unanswered_polls`).
        """
        lost_at = sent + self.retry.lost_after_s(self._time_limit_s(name, deadline))
        give_up = lost_at if deadline is None else min(lost_at, deadline)
        delay = self.retry.poll_initial_s
        path = self._activation_path(activation_id)
        failed: OpenWhiskError | None = None  # the last poll's failure, None once one is answered
        while True:
            if deadline is not None and self._clock() >= deadline:
                if failed is not None:
                    raise unanswered_polls(name, activation_id, failed)
                raise still_running(name, activation_id)
            self._api.count("polls")
            remaining = self._api.remaining(deadline)
            timeout = self.retry.request_timeout_s if remaining is None else max(0.05, min(self.retry.request_timeout_s, remaining))
            try:  # the deadline also ends the request's own retries (a poll answering 503, or hanging)
                resp = self._api.request("GET", path, what=f"poll activation {activation_id}", timeout_s=timeout,
                                         deadline=deadline)
                if resp.status_code >= 500:  # any 5xx, those the request does not retry itself too
                    raise self._api.fail(resp, f"poll activation {activation_id}")
            except OpenWhiskError as exc:
                # The activation was accepted and may be running: an error that lets the caller
                # invoke again would run it twice. Poll on until it is lost or the deadline.
                if not exc.transient:
                    raise
                if self._clock() >= give_up:
                    raise unanswered_polls(name, activation_id, exc) from None
                log.warning("%s; polling on", exc)  # exc names the poll and the activation
                failed = exc
                self._sleep(max(0.0, min(self.retry.poll_max_s, give_up - self._clock())))
                continue
            failed = None
            if resp.status_code == 200:
                return self._api.body(resp, f"poll activation {activation_id}")
            if resp.status_code != 404:  # 404: not stored yet
                raise self._api.fail(resp, f"poll activation {activation_id}")
            now = self._clock()
            if now >= lost_at:
                return None
            self._sleep(max(0.0, min(delay, lost_at - now, (deadline or lost_at) - now)))
            delay = min(delay * 1.5, self.retry.poll_max_s)

    def _time_limit_s(self, name: str, deadline: float | None) -> float:
        try:
            limits = self.describe_action(name, deadline=deadline).get("limits") or {}
        except OpenWhiskError:
            limits = {}
        return float(limits.get("timeout") or DEFAULT_TIME_LIMIT_MS) / 1000


def unanswered_polls(action: str, activation_id: str, exc: OpenWhiskError) -> ActionError:
    """The controller stopped answering polls of an accepted activation. Not transient, as
    :func:`still_running`: the activation may be running, and a retry would start a second copy."""
    return ActionError(
        action,
        f"activation {activation_id} was accepted, but polls of it failed until the controller's bound or the "
        f"deadline ({exc}); it may still be running: look at it with `wsk activation get {activation_id}` "
        "before running the step again",
        transient=False,
        activation_id=activation_id,
    )


def still_running(action: str, activation_id: str) -> ActionError:
    """The error for a deadline that passed while ``activation_id`` was queued or running.

    Not transient: the activation goes on (OpenWhisk cannot cancel it), so a retry that invoked
    the action again would run a second copy beside it, on a second GPU set. The message says
    how to look at it and which setting to raise.
    """
    return ActionError(
        action,
        f"no result before the deadline; activation {activation_id} is still queued or running and is not "
        f"invoked again (a second copy would run beside it): see `wsk activation get {activation_id}`; raise "
        "invoker.timeout_s above the action's time limit, or unset it to wait as long as OpenWhisk may",
        transient=False,
        activation_id=activation_id,
    )
