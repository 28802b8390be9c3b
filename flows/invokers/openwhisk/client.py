"""The OpenWhisk REST client: actions, packages, invoke (blocking, 202 fallback, polling) and
activations, with the retry rules of the package docstring (``flows.invokers.openwhisk``)."""

from __future__ import annotations

import logging
import random
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from actions.common.credentials import redact
from actions.common.errors import crash_text
from flows.invokers.base import ActionError
from flows.invokers.openwhisk.config import API_PATH, OpenWhiskConfig

log = logging.getLogger(__name__)

MAX_BLOCKING_WAIT_MS = 60_000
"""The controller's cap on a blocking invoke's wait (``timeout`` query parameter)."""
DEFAULT_TIME_LIMIT_MS = 300_000


class OpenWhiskError(RuntimeError):
    """A controller request that failed. ``transient``: trying again later may succeed."""

    def __init__(self, message: str, *, status: int | None = None, transient: bool = False) -> None:
        super().__init__(redact(message))
        self.status = status
        self.transient = transient


class OpenWhiskAuthError(OpenWhiskError):
    """The controller rejected the credentials (401) or the namespace (403)."""


class OpenWhiskNotFound(OpenWhiskError):
    """The action, package or activation does not exist."""


class OpenWhiskUnreachable(OpenWhiskError):
    """No connection to the API host (refused, DNS failure, TLS failure)."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds on how the client rides out throttling, outages and lost activations."""

    max_attempts: int = 8
    """Attempts per request for 429, 5xx without a record, timeouts and dropped connections."""
    backoff_base_s: float = 0.5
    backoff_max_s: float = 20.0
    connect_attempts: int = 3
    """Attempts when the host refuses the connection or its name does not resolve."""
    poll_initial_s: float = 0.05
    poll_max_s: float = 2.0
    lost_grace_s: float = 60.0
    """How long past the action's time limit an accepted activation may stay unrecorded
    before it counts as lost."""
    lost_retries: int = 2
    developer_error_retries: int = 1
    blocking_wait_ms: int = 50_000
    """Blocking wait asked of the controller; under the 60 s cap and common proxy timeouts."""
    request_timeout_s: float = 30.0
    idempotent: bool = True
    """Every RLHFless action is: retrying after a 503 or a dropped connection is safe."""

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        """Equal-jitter exponential backoff: half the step fixed, half random."""
        step = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        return step / 2 + rng.uniform(0, step / 2)


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
        self._sleep = sleep
        self._clock = clock
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._meta: dict[str, dict[str, Any]] = {}
        self.stats: Counter[str] = Counter()
        verify = ssl.create_default_context(cafile=config.verify) if isinstance(config.verify, str) else config.verify
        self._http = httpx.Client(
            base_url=config.api_host + API_PATH,
            auth=tuple(config.auth.split(":", 1)),
            verify=verify,
            timeout=self.retry.request_timeout_s,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
            headers={"User-Agent": "rlhfless-openwhisk"},
        )

    def __repr__(self) -> str:
        return f"OpenWhiskClient({self.config!r})"

    def close(self) -> None:
        self._http.close()

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

    # ------------------------------------------------------------------ transport
    def _remaining(self, deadline: float | None) -> float | None:
        return None if deadline is None else deadline - self._clock()

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        params: dict[str, str] | None = None,
        body: Any = None,
        deadline: float | None = None,
        retry_unavailable: bool = True,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        """Send one API request, riding out 429 (always) and 5xx/transport errors (when
        ``retry_unavailable``), within ``max_attempts`` and the deadline."""
        attempt = connect_failures = 0
        while True:
            remaining = self._remaining(deadline)
            if remaining is not None and remaining <= 0:
                raise OpenWhiskError(f"{what}: deadline passed before the request was sent", transient=True)
            timeout = timeout_s or self.retry.request_timeout_s
            timeout = timeout if remaining is None else max(0.05, min(timeout, remaining))
            try:
                resp = self._http.request(method, path, params=params, json=body, timeout=timeout)
            except httpx.ConnectError as exc:
                connect_failures += 1
                self._count("connect")
                if connect_failures >= self.retry.connect_attempts:
                    raise OpenWhiskUnreachable(
                        f"cannot reach the OpenWhisk API at {self.config.api_host}: {_reason(exc)}; "
                        "check WSK_APIHOST (or __OW_API_HOST)",
                        transient=True,
                    ) from None
                self._pause(what, "connection failed", attempt, None, deadline)
                attempt += 1
                continue
            except httpx.TransportError as exc:
                self._count("transport")
                if not retry_unavailable or attempt + 1 >= self.retry.max_attempts:
                    raise OpenWhiskError(
                        f"{what}: {type(exc).__name__} talking to {self.config.api_host}: {_reason(exc)}", transient=True
                    ) from None
                self._pause(what, type(exc).__name__, attempt, None, deadline)
                attempt += 1
                continue
            if resp.status_code in (401, 403):
                raise OpenWhiskAuthError(self._auth_message(resp.status_code), status=resp.status_code)
            throttled = resp.status_code == 429
            if throttled or (retry_unavailable and _is_unavailable(resp)):
                self._count("throttled" if throttled else "unavailable")
                if attempt + 1 >= self.retry.max_attempts:
                    hint = "; raise whisk.limits.actionsInvokesPerminute/Concurrent or lower the fan-out" if throttled else ""
                    raise OpenWhiskError(
                        f"{what}: HTTP {resp.status_code} {_error_text(resp)} after {attempt + 1} attempts{hint}",
                        status=resp.status_code,
                        transient=True,
                    )
                self._pause(what, f"HTTP {resp.status_code}", attempt, resp, deadline)
                attempt += 1
                continue
            return resp

    def _pause(self, what: str, why: str, attempt: int, resp: httpx.Response | None, deadline: float | None) -> None:
        delay = self.retry.backoff_s(attempt, self._rng)
        retry_after = resp.headers.get("Retry-After", "") if resp is not None else ""
        if retry_after.isdigit():
            delay = max(delay, float(retry_after))
        remaining = self._remaining(deadline)
        if remaining is not None and delay >= remaining:
            status = resp.status_code if resp is not None else None
            raise OpenWhiskError(f"{what}: {why}; no time left before the deadline to retry", status=status, transient=True)
        log.warning("%s: %s; retry %d/%d in %.2fs", what, why, attempt + 1, self.retry.max_attempts - 1, delay)
        self._sleep(delay)

    def _auth_message(self, status: int) -> str:
        ns, host = self.config.namespace, self.config.api_host
        if status == 401:
            return f"OpenWhisk rejected the credentials for namespace {ns} at {host} (HTTP 401); check WSK_AUTH"
        return (
            f"OpenWhisk denied the credentials access to namespace {ns} at {host} (HTTP 403); "
            "check WSK_AUTH and the namespace (__OW_NAMESPACE, or _ for the key's own)"
        )

    def _fail(self, resp: httpx.Response, what: str) -> OpenWhiskError:
        status = resp.status_code
        return OpenWhiskError(f"{what}: HTTP {status} {_error_text(resp)}", status=status, transient=status >= 500)

    # ------------------------------------------------------------------ actions and packages
    def list_actions(self, *, package: str | None = None, page_size: int = 200) -> list[dict[str, Any]]:
        """All actions (``ActionMeta``: no code or image) in the namespace or one package."""
        ns = quote(self.config.namespace, safe="")
        path = f"/namespaces/{ns}/actions" + (f"/{quote(package, safe='')}/" if package else "")
        out: list[dict[str, Any]] = []
        while True:
            params = {"limit": str(page_size), "skip": str(len(out))}
            resp = self._request("GET", path, what="list actions", params=params)
            if resp.status_code == 404:
                raise OpenWhiskNotFound(f"package {package} does not exist in namespace {self.config.namespace}", status=404)
            if resp.status_code != 200:
                raise self._fail(resp, "list actions")
            page = resp.json()
            out.extend(page)
            if len(page) < page_size:
                return out

    def get_action(self, name: str) -> dict[str, Any]:
        """The full action record (exec, limits, annotations, parameters)."""
        resp = self._request("GET", self._entity_path("actions", name), what=f"get action {name}")
        if resp.status_code == 404:
            raise OpenWhiskNotFound(self._missing_action(name), status=404)
        if resp.status_code != 200:
            raise self._fail(resp, f"get action {name}")
        return resp.json()

    def put_action(self, name: str, action: dict[str, Any], *, overwrite: bool = True) -> dict[str, Any]:
        """Create or replace an action from an ``ActionPut`` body; returns the stored record."""
        return self._put("actions", name, action, overwrite)

    def delete_action(self, name: str) -> None:
        self._forget(name)
        resp = self._request("DELETE", self._entity_path("actions", name), what=f"delete action {name}")
        if resp.status_code == 404:
            raise OpenWhiskNotFound(self._missing_action(name), status=404)
        if resp.status_code != 200:
            raise self._fail(resp, f"delete action {name}")

    def get_package(self, name: str) -> dict[str, Any]:
        resp = self._request("GET", self._entity_path("packages", name), what=f"get package {name}")
        if resp.status_code == 404:
            raise OpenWhiskNotFound(f"package {name} does not exist in namespace {self.config.namespace}", status=404)
        if resp.status_code != 200:
            raise self._fail(resp, f"get package {name}")
        return resp.json()

    def put_package(self, name: str, package: dict[str, Any], *, overwrite: bool = True) -> dict[str, Any]:
        return self._put("packages", name, package, overwrite)

    def _put(self, collection: str, name: str, body: dict[str, Any], overwrite: bool) -> dict[str, Any]:
        self._forget(name)
        what = f"put {collection[:-1]} {name}"
        params = {"overwrite": "true" if overwrite else "false"}
        resp = self._request("PUT", self._entity_path(collection, name), what=what, params=params, body=body)
        if resp.status_code == 404 and collection == "actions":
            pkg = self.split_name(name)[1].partition("/")[0]
            raise OpenWhiskNotFound(f"{what}: package {pkg} does not exist; create it first", status=404)
        if resp.status_code != 200:
            raise self._fail(resp, what)
        return resp.json()

    def describe_action(self, name: str) -> dict[str, Any]:
        """``get_action``, cached per client (limits and annotations drive polling and accounting)."""
        with self._lock:
            cached = self._meta.get(name)
        if cached is None:
            cached = self.get_action(name)
            with self._lock:
                self._meta[name] = cached
        return cached

    def _forget(self, name: str) -> None:
        with self._lock:
            self._meta.pop(name, None)

    def _missing_action(self, name: str) -> str:
        ns, rel = self.split_name(name)
        return f"action {rel} does not exist in namespace {ns}; run `rlhfless deploy`"

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
        resp = self._request("GET", self._activation_path(activation_id, suffix), what=what)
        if resp.status_code == 404:
            raise OpenWhiskNotFound(f"activation {activation_id} is not (yet) recorded", status=404)
        if resp.status_code != 200:
            raise self._fail(resp, what)
        return resp.json()

    # ------------------------------------------------------------------ invoke
    def invoke(
        self,
        name: str,
        params: dict[str, Any],
        *,
        blocking: bool = True,
        timeout_s: float | None = None,
        idempotent: bool | None = None,
    ) -> dict[str, Any]:
        """Run an action and wait for its activation record.

        Args:
            name: ``NAME``, ``PKG/NAME`` or ``/NS/PKG/NAME``.
            params: the JSON payload (at most ~1 MB: pass object-store keys).
            blocking: wait on the controller (up to ``blocking_wait_ms``, then poll) or submit
                and poll at once.
            timeout_s: overall deadline, retries and polling included; None waits as long as
                the action's time limit allows.
            idempotent: override ``RetryPolicy.idempotent`` for this call.

        Returns:
            The successful activation record (``response.status == "success"``).

        Raises:
            ActionError: the activation failed or was lost (``transient`` per the module table).
            OpenWhiskError: the controller refused the request (auth, missing action, limits).
        """
        idem = self.retry.idempotent if idempotent is None else idempotent
        deadline = None if timeout_s is None else self._clock() + timeout_s
        num_lost = num_dev_retries = 0
        while True:
            record, activation_id = self._invoke_once(name, params, blocking, deadline, idem)
            if record is None:
                num_lost += 1
                self._count("lost")
                if not idem or num_lost > self.retry.lost_retries:
                    raise ActionError(
                        name,
                        f"activation {activation_id} was accepted but never recorded ({num_lost} lost in a row)",
                        transient=True,
                        activation_id=activation_id,
                    )
                log.warning("invoke %s: activation %s lost; invoking again", name, activation_id)
                continue
            failure, retry_in_place = classify_activation(name, record)
            if failure is None:
                return record
            can_retry = idem and num_dev_retries < self.retry.developer_error_retries
            if retry_in_place and can_retry and (deadline is None or self._clock() < deadline):
                num_dev_retries += 1
                self._count("developer_retry")
                log.warning("invoke %s: %s; invoking again", name, failure.message)
                continue
            raise failure

    def _invoke_once(
        self, name: str, params: dict[str, Any], blocking: bool, deadline: float | None, idem: bool
    ) -> tuple[dict[str, Any] | None, str]:
        query = {"blocking": "true" if blocking else "false", "result": "false"}
        wait_ms = min(self.retry.blocking_wait_ms, MAX_BLOCKING_WAIT_MS)
        remaining = self._remaining(deadline)
        if remaining is not None:
            wait_ms = min(wait_ms, int(remaining * 1000))
            if wait_ms < 1:
                raise ActionError(name, "no time left before the deadline to invoke", transient=True)
        if blocking:
            query["timeout"] = str(wait_ms)
        sent = self._clock()
        resp = self._request(
            "POST",
            self._entity_path("actions", name),
            what=f"invoke {name}",
            params=query,
            body=params,
            deadline=deadline,
            retry_unavailable=idem,
            timeout_s=wait_ms / 1000 + self.retry.request_timeout_s if blocking else None,
        )
        if resp.status_code in (200, 500, 502) and _has_activation(resp):
            record = resp.json()
            return record, record["activationId"]
        if resp.status_code == 202:
            activation_id = _json(resp).get("activationId") or resp.headers.get("x-openwhisk-activation-id", "")
            if not activation_id:
                raise OpenWhiskError(f"invoke {name}: HTTP 202 without an activation id", status=202, transient=True)
            return self._await(name, activation_id, sent, deadline), activation_id
        if resp.status_code == 404:
            raise OpenWhiskNotFound(self._missing_action(name), status=404)
        if resp.status_code == 413:
            raise OpenWhiskError(
                f"invoke {name}: payload over the controller's limit (~1 MB); pass object-store keys, not data",
                status=413,
            )
        raise self._fail(resp, f"invoke {name}")

    def _await(self, name: str, activation_id: str, sent: float, deadline: float | None) -> dict[str, Any] | None:
        """Poll until the record is stored; None when it is lost (past time limit + grace)."""
        lost_at = sent + self._time_limit_s(name) + self.retry.lost_grace_s
        delay = self.retry.poll_initial_s
        path = self._activation_path(activation_id)
        while True:
            if deadline is not None and self._clock() >= deadline:
                raise ActionError(
                    name,
                    f"no result before the deadline; activation {activation_id} may still be running",
                    transient=True,
                    activation_id=activation_id,
                )
            self._count("polls")
            remaining = self._remaining(deadline)
            timeout = self.retry.request_timeout_s if remaining is None else max(0.05, min(self.retry.request_timeout_s, remaining))
            resp = self._request("GET", path, what=f"poll activation {activation_id}", timeout_s=timeout)
            if resp.status_code == 200:
                return resp.json()
            if resp.status_code != 404:  # 404: not stored yet
                raise self._fail(resp, f"poll activation {activation_id}")
            now = self._clock()
            if now >= lost_at:
                return None
            self._sleep(max(0.0, min(delay, lost_at - now, (deadline or lost_at) - now)))
            delay = min(delay * 1.5, self.retry.poll_max_s)

    def _time_limit_s(self, name: str) -> float:
        try:
            limits = self.describe_action(name).get("limits") or {}
        except OpenWhiskError:
            limits = {}
        return float(limits.get("timeout") or DEFAULT_TIME_LIMIT_MS) / 1000


def classify_activation(action: str, record: dict[str, Any]) -> tuple[ActionError | None, bool]:
    """Map an activation record to (error or None, whether to invoke again in place).

    The runtime server answers an exception raised by ``main`` with HTTP 502 and
    ``{"error": {"type", "message", "transient"}}``; OpenWhisk files that as an action developer
    error and keeps the ``error`` object, so the runtime's classification decides: a transient
    crash (connection refused, timeout, injected fault) is left to the flow's retry policy, a
    permanent one (a ``TypeError``, CUDA out of memory) fails at once. Other developer errors
    (the container died, init failed) are OpenWhisk's own and are retried in place.
    """
    response = record.get("response") or {}
    status = response.get("status") or ("success" if response.get("success") else "unknown")
    if status == "success":
        return None, False
    activation_id = str(record.get("activationId", ""))
    result = response.get("result") if isinstance(response.get("result"), dict) else {}
    error = result.get("error")
    if isinstance(error, dict) and "type" in error:  # the runtime server's classified crash
        return ActionError(action, crash_text(error), transient=error.get("transient") is True,
                           activation_id=activation_id), False
    message = str(error or status)
    if status == "application error":  # the action refused its input: the same every time
        return ActionError(action, message, transient=False, activation_id=activation_id), False
    if status == "action developer error":
        if annotations_of(record).get("timeout") is True or "time limit" in message:
            hint = "; raise its timeout in infra/openwhisk/actions.yaml (and whisk.limits.actions.time.max) or give it less work"
            return ActionError(action, message + hint, transient=False, activation_id=activation_id), False
        return ActionError(action, f"developer error: {message}", transient=True, activation_id=activation_id), True
    return ActionError(action, f"{status}: {message}", transient=True, activation_id=activation_id), True


def annotations_of(record: Mapping[str, Any]) -> dict[str, Any]:
    return {kv.get("key"): kv.get("value") for kv in record.get("annotations") or [] if isinstance(kv, dict)}


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _has_activation(resp: httpx.Response) -> bool:
    data = _json(resp)
    return "activationId" in data and "response" in data


def _is_unavailable(resp: httpx.Response) -> bool:
    return resp.status_code in (408, 500, 502, 503, 504) and not _has_activation(resp)


def _error_text(resp: httpx.Response) -> str:
    data = _json(resp)
    text = str(data.get("error") or resp.reason_phrase or "")
    return redact(text[:300])


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return redact(text.splitlines()[0][:200])
