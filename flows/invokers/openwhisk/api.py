"""One OpenWhisk controller API request, riding out throttling, outages and dropped connections
by the retry rules of the package docstring (``flows.invokers.openwhisk``); the errors it raises."""

from __future__ import annotations

import logging
import random
import ssl
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from actions.store.credentials import redact
from flows.invokers.openwhisk.config import API_PATH, OpenWhiskConfig

log = logging.getLogger(__name__)


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
    retry_after_max_s: float = 60.0
    """The longest ``Retry-After`` honoured: a longer one (a proxy's ``Retry-After: 3600``) waits
    this long, so that one header cannot stall a request for an hour."""
    connect_attempts: int = 3
    """Attempts when the host refuses the connection or its name does not resolve."""
    poll_initial_s: float = 0.05
    poll_max_s: float = 2.0
    queue_factor: float = 2.0
    """OpenWhisk's ``whisk.loadbalancer.timeout-factor``: the controller gives an accepted
    activation ``queue_factor`` x its time limit (at least ``min_time_limit_s``) + 1 min to
    complete, queueing for a busy invoker and a cold start included, before it gives up on it.
    The client waits at least as long (:meth:`lost_after_s`): an activation queued behind
    others is not lost, and invoking it again would run it twice."""
    min_time_limit_s: float = 60.0
    """The least time limit the controller's bound assumes (OpenWhisk's standard limit, 60 s)."""
    lost_grace_s: float = 120.0
    """Seconds added to ``queue_factor`` x the time limit before an accepted, never recorded
    activation counts as lost: the controller's own 1 min, plus a minute for the record to be
    stored."""
    lost_retries: int = 2
    developer_error_retries: int = 1
    blocking_wait_ms: int = 50_000
    """Blocking wait asked of the controller; under the 60 s cap and common proxy timeouts."""
    blocking_margin_s: float = 5.0
    """How much longer than the blocking wait the HTTP read waits, near a deadline too: the
    controller answers 202 with the activation id when the wait ends, and a read that times
    out at that moment loses the id (the activation runs on, unseen)."""
    request_timeout_s: float = 30.0
    idempotent: bool = True
    """Every RLHFless action is: retrying after a 503 or a dropped connection is safe."""

    def lost_after_s(self, time_limit_s: float) -> float:
        """Seconds after an invoke was sent before its activation, accepted but never recorded,
        counts as lost: ``queue_factor`` x max(``time_limit_s``, ``min_time_limit_s``) +
        ``lost_grace_s`` (defaults: 2 x limit + 2 min, past the controller's own 2 x limit + 1 min)."""
        return self.queue_factor * max(time_limit_s, self.min_time_limit_s) + self.lost_grace_s

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        """Equal-jitter exponential backoff: half the step fixed, half random."""
        step = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        return step / 2 + rng.uniform(0, step / 2)


class ControllerApi:
    """Pooled HTTP requests to one controller, safe to share across threads.

    ``stats`` counts retries by cause (``throttled``, ``unavailable``, ``transport``,
    ``connect``) and whatever the caller counts with :meth:`count`.
    """

    def __init__(self, config: OpenWhiskConfig, retry: RetryPolicy, *, max_connections: int,
                 transport: httpx.BaseTransport | None, sleep: Callable[[float], None],
                 clock: Callable[[], float], seed: int | None) -> None:
        self.config = config
        self.retry = retry
        self.sleep = sleep
        self.clock = clock
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.stats: Counter[str] = Counter()
        self._http = httpx.Client(
            base_url=config.api_host + API_PATH,
            auth=tuple(config.auth.split(":", 1)),
            verify=config.tls_verify(),
            timeout=retry.request_timeout_s,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
            headers={"User-Agent": "rlhfless-openwhisk"},
        )

    def close(self) -> None:
        self._http.close()

    def remaining(self, deadline: float | None) -> float | None:
        """Seconds left before ``deadline`` (a ``clock()`` value); None when there is none."""
        return None if deadline is None else deadline - self.clock()

    def count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def request(
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
        ``retry_unavailable``), within ``max_attempts`` and the deadline; an answer that no retry
        changes raises at once (:meth:`refuse`)."""
        attempt = connect_failures = 0
        while True:
            remaining = self.remaining(deadline)
            if remaining is not None and remaining <= 0:
                raise OpenWhiskError(f"{what}: deadline passed before the request was sent", transient=True)
            timeout = timeout_s or self.retry.request_timeout_s
            timeout = timeout if remaining is None else max(0.05, min(timeout, remaining))
            try:
                resp = self._http.request(method, path, params=params, json=body, timeout=timeout)
            except httpx.ConnectError as exc:
                if _certificate_refused(exc):  # the same answer every time: no retry
                    raise self.untrusted(exc) from None
                connect_failures += 1
                self.count("connect")
                if connect_failures >= self.retry.connect_attempts:
                    raise self.unreachable(exc) from None
                self.pause(what, f"connection to {self.config.api_host} failed", attempt, None, deadline,
                           retries=self.retry.connect_attempts - 1, retry=connect_failures)
                attempt += 1
                continue
            except httpx.TransportError as exc:
                self.count("transport")
                if not retry_unavailable or attempt + 1 >= self.retry.max_attempts:
                    raise self.no_answer(exc, what, attempt + 1, timeout) from None
                self.pause(what, f"{type(exc).__name__} talking to {self.config.api_host}", attempt, None, deadline)
                attempt += 1
                continue
            self.refuse(resp, what)
            throttled = resp.status_code == 429
            if throttled or (retry_unavailable and _is_unavailable(resp)):
                self.count("throttled" if throttled else "unavailable")
                if attempt + 1 >= self.retry.max_attempts:
                    hint = "; raise whisk.limits.actionsInvokesPerminute/Concurrent or lower the fan-out" if throttled else ""
                    raise OpenWhiskError(
                        f"{what}: HTTP {resp.status_code} {error_text(resp)} after {attempt + 1} attempts{hint}",
                        status=resp.status_code,
                        transient=True,
                    )
                self.pause(what, f"HTTP {resp.status_code} from {self.config.api_host}", attempt, resp, deadline)
                attempt += 1
                continue
            return resp

    def no_answer(self, exc: httpx.TransportError, what: str, attempts: int, timeout_s: float) -> OpenWhiskError:
        """The (transient) error of a request whose last try failed in transport (a timeout, a
        dropped connection). A timeout (a host that accepts connections but never answers: a
        wrong port, a hung proxy; or one that silently drops them) names the setting to check,
        as a refused connection does."""
        message = f"{what}: {type(exc).__name__} talking to {self.config.api_host}: {_reason(exc)}"
        if isinstance(exc, httpx.TimeoutException):
            silent = ("does not accept connections" if isinstance(exc, httpx.ConnectTimeout)
                      else "accepts connections but does not answer")
            message += (f" after {attempts} attempt(s), the last waiting {timeout_s:g} s; check "
                        f"{self.config.setting('api_host')} (the OpenWhisk API host: this one {silent})")
        return OpenWhiskError(message, transient=True)

    def unreachable(self, exc: httpx.ConnectError) -> OpenWhiskUnreachable:
        """The error of a host that refused every connection attempt, naming the setting to fix."""
        return OpenWhiskUnreachable(f"cannot reach the OpenWhisk API at {self.config.api_host}: {_reason(exc)}; "
                                    f"check {self.config.setting('api_host')}", transient=True)

    def untrusted(self, exc: httpx.ConnectError) -> OpenWhiskError:
        """The error of a host whose TLS certificate this client does not trust (a self-signed
        controller), naming the settings that make it trusted."""
        return OpenWhiskError(f"the OpenWhisk API at {self.config.api_host} presented a TLS certificate this "
                              f"client does not trust ({_reason(exc)}); set {self.config.setting('ca_bundle')} to "
                              "the CA bundle that signed it (or WSK_INSECURE=true on a test cluster)",
                              transient=False)

    def pause(self, what: str, why: str, attempt: int, resp: httpx.Response | None, deadline: float | None,
              retries: int | None = None, retry: int | None = None) -> None:
        """Sleep before retry ``attempt + 1`` (backoff, at least ``Retry-After`` up to
        ``retry_after_max_s``), or raise a transient OpenWhiskError when the deadline leaves no
        time for it. The warning counts the retry as ``retry`` of ``retries`` (default: attempt
        + 1 of ``max_attempts - 1``; connection failures have their own, smaller budget)."""
        delay = self.retry.backoff_s(attempt, self._rng)
        retry_after = resp.headers.get("Retry-After", "") if resp is not None else ""
        if retry_after.isascii() and retry_after.isdigit():  # "²" is a digit float() refuses
            delay = max(delay, min(float(retry_after), self.retry.retry_after_max_s))
        remaining = self.remaining(deadline)
        if remaining is not None and delay >= remaining:
            status = resp.status_code if resp is not None else None
            raise OpenWhiskError(f"{what}: {why}; no time left before the deadline to retry", status=status, transient=True)
        log.warning("%s: %s; retry %d/%d in %.2fs", what, why, attempt + 1 if retry is None else retry,
                    self.retry.max_attempts - 1 if retries is None else retries, delay)
        self.sleep(delay)

    def refuse(self, resp: httpx.Response, what: str) -> None:
        """Raise for an answer to ``what`` that no retry changes: one not from the controller
        (:meth:`not_json`; checked first, so that a portal's 404 or 401 is not read as the
        controller's), or the controller's 401/403 (OpenWhiskAuthError)."""
        if _not_the_api(resp):
            raise self.not_json(resp, what)
        if resp.status_code in (401, 403):
            raise OpenWhiskAuthError(self.auth_message(resp.status_code), status=resp.status_code)

    def auth_message(self, status: int) -> str:
        ns, host, auth = self.config.namespace, self.config.api_host, self.config.setting("auth")
        if status == 401:
            return f"OpenWhisk rejected the credentials for namespace {ns} at {host} (HTTP 401); check {auth}"
        return (
            f"OpenWhisk denied the credentials access to namespace {ns} at {host} (HTTP 403); "
            f"check {auth} and the namespace ({self.config.setting('namespace')}, or _ for the key's own)"
        )

    def fail(self, resp: httpx.Response, what: str) -> OpenWhiskError:
        """The error for an unexpected answer to ``what`` (transient for 5xx)."""
        status = resp.status_code
        return OpenWhiskError(f"{what}: HTTP {status} {error_text(resp)}", status=status, transient=status >= 500)

    def body(self, resp: httpx.Response, what: str, kind: type[dict] | type[list] = dict) -> Any:
        """The JSON body of ``resp`` (the answer to ``what``), which must be a ``kind``.

        Raises:
            OpenWhiskError: not transient, from :meth:`not_json`, when it is not.
        """
        data = _parse(resp)
        if not isinstance(data, kind):
            raise self.not_json(resp, what)
        return data

    def not_json(self, resp: httpx.Response, what: str) -> OpenWhiskError:
        """The error for an answer the controller would never give: an HTML login portal, a
        wrong ingress, another service on the port. Not transient: asking again gets the same."""
        host, setting = self.config.api_host, self.config.setting("api_host")
        return OpenWhiskError(f"{what}: HTTP {resp.status_code} from {host} is not JSON (not an OpenWhisk API "
                              f"answer); check {setting} (the OpenWhisk API host)", status=resp.status_code)


def json_object(resp: httpx.Response) -> dict[str, Any]:
    """The response body when it is a JSON object, else {}."""
    data = _parse(resp)
    return data if isinstance(data, dict) else {}


def _parse(resp: httpx.Response) -> Any:
    """The JSON body; None when there is none or it is not JSON."""
    try:
        return resp.json()
    except ValueError:  # json.JSONDecodeError, and UnicodeDecodeError for a binary body
        return None


def has_activation(resp: httpx.Response) -> bool:
    """Whether the body is an activation record (a blocking invoke that finished)."""
    data = json_object(resp)
    return "activationId" in data and "response" in data


def _not_the_api(resp: httpx.Response) -> bool:
    """Whether the answer comes from something other than the controller, which answers JSON:
    a redirect (a login portal), or a page that is not JSON with a status below 500. A proxy's
    page for 408, 429 or 5xx is an outage or throttling in front of it, and retried as one; its
    413 (an ingress's body limit, nginx's 1 MB by default) is the payload's size, not the host."""
    status = resp.status_code
    if 300 <= status < 400:
        return True
    return status < 500 and status not in (408, 413, 429) and bool(resp.content) and _parse(resp) is None


def _is_unavailable(resp: httpx.Response) -> bool:
    return resp.status_code in (408, 500, 502, 503, 504) and not has_activation(resp)


def error_text(resp: httpx.Response) -> str:
    """The controller's ``error`` text on one line: a refusal of a request's content comes as
    "The request content was malformed:" and the reason on the next line (Akka's rejection of
    a limit out of range), which the first line alone would drop."""
    data = json_object(resp)
    text = " ".join(str(data.get("error") or resp.reason_phrase or "").split())
    return redact(text[:300])


def _certificate_refused(exc: BaseException) -> bool:
    """Whether a connection failed on certificate verification (an ``ssl.SSLCertVerificationError``
    under httpx's ConnectError)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return redact(text.splitlines()[0][:200])
