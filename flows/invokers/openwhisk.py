"""Apache OpenWhisk: a thin REST client and the invoker that runs RLHFless actions on it.

:class:`OpenWhiskClient` follows the controller's swagger (``/api/v1``; see
``shared/specs/openwhisk-apiv1-swagger.json``) for the calls RLHFless needs: actions and
packages (list/get/put/delete), invoke, and activations (get/logs/result). No maintained Python
client exists (ECOSYSTEM B.7), so this is ~one method per endpoint over one pooled, thread-safe
``httpx.Client``. :class:`OpenWhiskInvoker` maps ``generate`` to ``{package}/generate`` and turns
activation records into :class:`~flows.invokers.base.Activation` accounting.

What the controller says, and what the client does (``RetryPolicy`` holds every bound):

============================================  ===============================================
controller answer                             client behaviour
============================================  ===============================================
200 / 502 / 500 with an activation record     classify ``response.status`` (below)
202 ``{activationId}`` (non-blocking, or a    poll ``/activations/{id}`` with backoff; 404 there
blocking wait that ran out)                   means "not stored yet"
activation never stored (past the action's    "lost": invoke again with the same payload,
time limit + ``lost_grace_s``)                at most ``lost_retries`` times (actions are
                                              idempotent), then ActionError(transient)
``success``                                   return the record
``application error`` (action returned        ActionError(transient=False) with the action's
``{"error": ...}``)                           message; transient=True only when the runtime
                                              marked it ``developer_error`` (``main`` raised)
``action developer error``: time limit        ActionError(transient=False): raise the limit
``action developer error``: other (init       invoke again in place ``developer_error_retries``
failure, crash, bad response); ``whisk        times (a fresh container usually fixes it), then
internal error``                              ActionError(transient=True)
401 / 403                                     OpenWhiskAuthError (never retried, key never shown)
404 on an action                              OpenWhiskNotFound: "run `rlhfless deploy`"
413                                           non-transient: payload over ~1 MB
429                                           exponential backoff with jitter (honours
                                              Retry-After), ``max_attempts`` and the deadline
503 / 500 / 504 / 408 / gateway 502 without   retried like 429 only when the call is idempotent
a record; timeouts and dropped connections    (a flag; every RLHFless action is)
connection refused / DNS failure              ``connect_attempts`` tries, then one line naming
                                              the host (OpenWhiskUnreachable, transient)
============================================  ===============================================

Every request's timeout is cut to what is left of the caller's deadline. The auth key appears
in no message, log line or repr (it is also registered with ``credentials.redact``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from actions.common.credentials import redact, register_secret
from flows.invokers.base import ActionError, Activation

log = logging.getLogger(__name__)

API_PATH = "/api/v1"
MAX_BLOCKING_WAIT_MS = 60_000
"""The controller's cap on a blocking invoke's wait (``timeout`` query parameter)."""
DEFAULT_TIME_LIMIT_MS = 300_000
SECRET_BLOCK_ENV = "RLHFLESS_OPENWHISK_SECRET"
"""Names a Prefect Secret block holding the OpenWhisk connection (see ``OpenWhiskConfig.from_secret``)."""


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


def _truthy(value: str | None) -> bool:
    return str(value or "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class OpenWhiskConfig:
    """Where the controller is and how to authenticate. ``repr`` never shows the key."""

    api_host: str
    """``https://host[:port]``; a bare host gets ``https://`` (as the ``wsk`` CLI does)."""
    auth: str = field(repr=False)
    """``uuid:key``, the AUTH value of ``~/.wskprops``."""
    namespace: str = "_"
    """``_`` means the key's default namespace."""
    verify: bool | str = True
    """TLS verification: True, False (``WSK_INSECURE``), or a CA bundle path."""

    def __post_init__(self) -> None:
        host = (self.api_host or "").strip().rstrip("/")
        if not host:
            raise ValueError("OpenWhisk API host is not set; set WSK_APIHOST (or __OW_API_HOST)")
        if "://" not in host:
            host = "https://" + host
        if host.endswith(API_PATH):
            host = host[: -len(API_PATH)]
        object.__setattr__(self, "api_host", host)
        uuid, _, key = (self.auth or "").partition(":")
        if not uuid or not key:
            raise ValueError("OpenWhisk auth must look like 'uuid:key' (the AUTH of ~/.wskprops); check WSK_AUTH")
        register_secret(self.auth)
        object.__setattr__(self, "namespace", (self.namespace or "_").strip("/") or "_")

    def __repr__(self) -> str:
        subject = self.auth.partition(":")[0][:4] + "****"
        return f"OpenWhiskConfig(api_host={self.api_host!r}, namespace={self.namespace!r}, subject={subject!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OpenWhiskConfig:
        """Read ``WSK_APIHOST``/``__OW_API_HOST``, ``WSK_AUTH``/``__OW_API_KEY``,
        ``__OW_NAMESPACE``/``WSK_NAMESPACE``, ``WSK_INSECURE``/``__OW_IGNORE_CERTS`` and
        ``WSK_CA_BUNDLE``; values missing there come from ``~/.wskprops`` (``WSK_CONFIG_FILE``)."""
        env = os.environ if env is None else env
        props = _read_wskprops(env)
        host = env.get("WSK_APIHOST") or env.get("__OW_API_HOST") or props.get("APIHOST", "")
        auth = env.get("WSK_AUTH") or env.get("__OW_API_KEY") or props.get("AUTH", "")
        if not host or not auth:
            missing = " and ".join(n for n, v in (("WSK_APIHOST", host), ("WSK_AUTH", auth)) if not v)
            raise ValueError(f"OpenWhisk connection not configured: set {missing} (or write ~/.wskprops)")
        namespace = env.get("__OW_NAMESPACE") or env.get("WSK_NAMESPACE") or props.get("NAMESPACE") or "_"
        return cls(host, auth, namespace, _verify_from(env))

    @classmethod
    def from_secret(cls, block_name: str, env: Mapping[str, str] | None = None) -> OpenWhiskConfig:
        """Load a Prefect Secret block. Its value is either a JSON object with ``api_host``,
        ``auth`` and optional ``namespace``, ``insecure``, ``ca_bundle``, or the bare
        ``uuid:key`` string (host and namespace then come from the environment)."""
        from prefect.blocks.system import Secret  # lazy: the client works without a Prefect server

        value = Secret.load(block_name).get()
        if isinstance(value, str) and value.lstrip().startswith("{"):
            value = json.loads(value)
        env = os.environ if env is None else env
        if isinstance(value, str):
            return cls.from_env({**env, "WSK_AUTH": value.strip()})
        if not isinstance(value, Mapping):
            raise ValueError(f"Prefect Secret {block_name!r} must hold 'uuid:key' or an object with api_host and auth")
        verify: bool | str = value.get("ca_bundle") or not _truthy(str(value.get("insecure", "")))
        host = value.get("api_host") or value.get("apihost") or env.get("WSK_APIHOST") or env.get("__OW_API_HOST", "")
        return cls(host, str(value.get("auth", "")), str(value.get("namespace") or "_"), verify)

    @classmethod
    def resolve(
        cls,
        *,
        api_host: str | None = None,
        auth: str | None = None,
        namespace: str | None = None,
        secret_block: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> OpenWhiskConfig:
        """Explicit arguments win, then a Secret block (argument or ``RLHFLESS_OPENWHISK_SECRET``),
        then the environment."""
        env = os.environ if env is None else env
        block = secret_block or env.get(SECRET_BLOCK_ENV)
        if api_host and auth:
            return cls(api_host, auth, namespace or "_", _verify_from(env))
        base = cls.from_secret(block, env) if block else cls.from_env(env)
        return cls(api_host or base.api_host, auth or base.auth, namespace or base.namespace, base.verify)


def _verify_from(env: Mapping[str, str]) -> bool | str:
    if _truthy(env.get("WSK_INSECURE")) or _truthy(env.get("__OW_IGNORE_CERTS")):
        return False
    return env.get("WSK_CA_BUNDLE") or True


def _read_wskprops(env: Mapping[str, str]) -> dict[str, str]:
    path = Path(env.get("WSK_CONFIG_FILE") or Path(env.get("HOME", "~")).expanduser() / ".wskprops")
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in lines if "=" in line and not line.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


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

    The runtime server reports an exception raised by ``main`` as a result with
    ``developer_error: true``; OpenWhisk files it as an application error, but it is a crash
    (S3 down, CUDA OOM), so it is transient and left to the flow's retry policy.
    """
    response = record.get("response") or {}
    status = response.get("status") or ("success" if response.get("success") else "unknown")
    if status == "success":
        return None, False
    activation_id = str(record.get("activationId", ""))
    result = response.get("result") if isinstance(response.get("result"), dict) else {}
    message = str(result.get("error") or status)
    if status == "application error":
        crashed = result.get("developer_error") is True
        return ActionError(action, message, transient=crashed, activation_id=activation_id), False
    if status == "action developer error":
        if _annotations(record).get("timeout") is True or "time limit" in message:
            hint = "; raise its timeout in infra/openwhisk/actions.yaml (and whisk.limits.actions.time.max) or give it less work"
            return ActionError(action, message + hint, transient=False, activation_id=activation_id), False
        return ActionError(action, f"developer error: {message}", transient=True, activation_id=activation_id), True
    return ActionError(action, f"{status}: {message}", transient=True, activation_id=activation_id), True


def _annotations(record: Mapping[str, Any]) -> dict[str, Any]:
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


# ---------------------------------------------------------------------------- the invoker
def action_gpus(action_record: Mapping[str, Any]) -> int:
    """GPUs an action's container holds, for accounting: the ``gpus`` annotation, else 1 when
    ``invoker-resources`` asks for ``gpu``, else 0."""
    ann = _annotations(action_record)
    if "gpus" in ann:
        return int(ann["gpus"])
    return 1 if "gpu" in (ann.get("invoker-resources") or []) else 0


def activation_from_record(
    action: str, record: dict[str, Any], action_record: Mapping[str, Any] | None = None
) -> Activation:
    """Accounting from an activation record.

    OpenWhisk's ``start`` is when the container began work (including a cold start's init);
    ``waitTime`` is the time queued before it, ``initTime`` (present only on cold starts) the
    init. So ``submitted_at = start - waitTime``, ``started_at = start + initTime`` (the run
    itself) and ``billed_s`` = run + init = the record's ``duration``. ``busy_s`` comes from
    the runtime's ``__activation`` block, which is moved from the result to ``extra["runtime"]``.
    """
    ann = _annotations(record)
    start_ms = int(record["start"])
    end_ms = int(record.get("end") or start_ms + int(record.get("duration") or 0))
    wait_ms = int(ann.get("waitTime") or 0)
    init_ms = int(ann.get("initTime") or 0)
    result = dict((record.get("response") or {}).get("result") or {})
    runtime = result.pop("__activation", None) or {}
    busy_s = float(runtime.get("busy_s", max(0, end_ms - start_ms - init_ms) / 1000))
    meta = action_record or {}
    extra = {
        "runtime": runtime,
        "image": runtime.get("image", ""),
        "wait_s": wait_ms / 1000,
        "memory_mb": (meta.get("limits") or {}).get("memory"),
        "path": ann.get("path", ""),
    }
    return Activation(
        action=action,
        activation_id=str(record["activationId"]),
        result=result,
        submitted_at=(start_ms - wait_ms) / 1000,
        started_at=(start_ms + init_ms) / 1000,
        ended_at=end_ms / 1000,
        busy_s=busy_s,
        init_s=init_ms / 1000,
        cold="initTime" in ann,
        worker=f"{runtime.get('image', '')}#{runtime.get('pid', '')}" if runtime else "",
        gpus=action_gpus(meta),
        extra=extra,
    )


class OpenWhiskInvoker:
    """The :class:`~flows.invokers.base.Invoker` for an OpenWhisk cluster.

    ``invoke("generate", payload)`` runs ``{package}/generate`` and returns its accounting.
    ``prewarm("generate", n)`` fires ``n`` concurrent ``{"__prewarm": true}`` activations, which
    the runtime server answers before importing the action, so ``n`` containers start.
    """

    def __init__(
        self,
        client: OpenWhiskClient,
        *,
        package: str = "rlhfless",
        timeout_s: float | None = 600.0,
        prewarm_hold_s: float = 0.5,
    ) -> None:
        self.client = client
        self.package = package.strip("/")
        self.timeout_s = timeout_s
        self.prewarm_hold_s = prewarm_hold_s
        """How long each pre-warm activation holds its container, so that concurrent pre-warm
        calls cannot all be served by one already-warm container."""

    @classmethod
    def from_env(
        cls,
        *,
        package: str = "rlhfless",
        timeout_s: float | None = 600.0,
        secret_block: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> OpenWhiskInvoker:
        """Connection from the environment or a Prefect Secret block (``OpenWhiskConfig.resolve``)."""
        return cls(OpenWhiskClient(OpenWhiskConfig.resolve(secret_block=secret_block), retry=retry), package=package, timeout_s=timeout_s)

    def __repr__(self) -> str:
        return f"OpenWhiskInvoker(package={self.package!r}, client={self.client!r})"

    def qualified_name(self, action: str) -> str:
        if action.startswith("/") or not self.package:
            return action
        return f"{self.package}/{action}"

    def invoke(self, action: str, payload: dict[str, Any], *, timeout_s: float | None = None) -> Activation:
        name = self.qualified_name(action)
        try:
            meta = self.client.describe_action(name)
            record = self.client.invoke(name, payload, timeout_s=timeout_s or self.timeout_s)
        except OpenWhiskError as exc:
            raise ActionError(action, str(exc), transient=exc.transient) from exc
        except ActionError as exc:  # raised under the qualified name; report the logical one
            raise ActionError(action, exc.message, transient=exc.transient, activation_id=exc.activation_id) from exc
        return activation_from_record(action, record, meta)

    def prewarm(self, action: str, count: int) -> int:
        """Start ``count`` containers for ``action``; returns how many were cold starts now."""
        if count <= 0:
            return 0
        name = self.qualified_name(action)

        def warm_one(_: int) -> bool:
            try:
                payload = {"__prewarm": True, "__prewarm_hold_s": self.prewarm_hold_s}
                record = self.client.invoke(name, payload, timeout_s=self.timeout_s)
            except OpenWhiskError as exc:
                if not exc.transient:
                    raise ActionError(action, str(exc), transient=False) from exc
                log.warning("prewarm %s: %s", name, exc)
                return False
            except ActionError as exc:
                log.warning("prewarm %s: %s", name, exc)
                return False
            return "initTime" in _annotations(record)

        with ThreadPoolExecutor(max_workers=min(count, 32), thread_name_prefix="ow-prewarm") as pool:
            return sum(pool.map(warm_one, range(count)))

    def close(self) -> None:
        self.client.close()
