"""The OpenWhisk action-protocol server: ``POST /init`` and ``POST /run`` on one port.

This is the entrypoint of the runtime images (port 8080) and of every local warm-pool worker
(a free loopback port). It follows the contract in OpenWhisk's ``apache/openwhisk:docs/actions-new.md``:

* ``/init`` takes ``{"value": {name, main, code, binary, env}}`` once per container. The action
  code is baked into the image, so ``code`` is ignored; ``env`` is exported. A second ``/init``
  is refused, as the contract requires.
* ``/run`` takes ``{"value": params, "action_name": "/ns/pkg/generate", "activation_id",
  "deadline", ...}``; the last path segment of ``action_name`` (or ``value["__action"]`` when
  no name is given, or when it names an action allowed in that one's containers:
  ``ENGINE_GUESTS``) selects ``actions.<name>.main``. The reply is the action's JSON dict, with
  an ``__activation`` block added: busy seconds, process id, image id, cold/warm, and the
  generation engine the process holds built (``engine``: ``vllm`` or null), which the
  invokers route generate and evaluate activations by.
* Activations never overlap in one container (concurrency 1): a lock serialises ``/run``.
* Every activation's logs end with the sentinel line on stdout and stderr so OpenWhisk
  collects them promptly.
* An exception out of ``main`` (a crashed action) is answered with HTTP 502, as OpenWhisk's
  action proxy does, and ``{"error": {"type", "message", "transient"[, "advice"]}}``
  (``actions.runtime.errors.describe_crash``): OpenWhisk keeps the ``error`` field of a non-200
  reply as the activation's result, so the classification reaches the flow on both paths. An
  action that returns ``{"error": ...}`` itself (bad payload, missing input) gets 200: an
  application error.
* A ``/run`` the runtime refuses before any action runs (an action name not in
  ``ACTION_NAMES``, a malformed ``__*`` control key, no ``value`` object) gets 200 and the same
  typed form with ``transient`` false (``describe_refusal``): an application error the flow
  fails on at once, never a developer error that would be retried on fresh containers.
* Replies are strict JSON: a non-finite float in a result is sent as the string ``"NaN"``,
  ``"Infinity"`` or ``"-Infinity"`` (:func:`encode_reply`), which the flows' typed results read
  back as floats; OpenWhisk refuses the bare literals.
* Fault injection: ``__inject_kill_after_s`` in ``value`` makes the process kill itself
  (SIGKILL) that long into the activation, without replying (``faults.kill_fraction``).

Request limits (:class:`Guard`), on every path: a body over ``max_body_bytes`` is refused with
413 from its ``Content-Length`` alone, before any of it is read; a request must arrive whole
within ``read_timeout_s`` of its first byte, or the connection is cut (a slow-loris client
cannot hold a thread); an idle kept-alive connection is closed after ``idle_timeout_s``.

Signals: a local pool worker (``--control-fd``) ignores SIGINT, so a Ctrl-C at the terminal,
which reaches the CLI's whole process group, leaves it to the pool to stop it (it closes the
control pipe, then terminates it) rather than killing it mid-activation; started by hand, with no
control pipe, the server stops on Ctrl-C.

Authentication: a local pool worker gets its own secret on its control pipe (``--control-fd``,
see ``actions.runtime.lifeline``), answers 401, doing nothing, to any request without a valid
single-use HMAC of that secret, and signs every other reply with one
(``actions.runtime.request_auth``): the secret itself never crosses the socket. The runtime
images run by OpenWhisk get no secret and keep the action-proxy behaviour: the invoker talks to
them on its private container network, which is the boundary there.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from actions.runtime.errors import describe_crash, describe_refusal
from actions.runtime.init_env import init_environment
from actions.runtime.request_auth import REPLY_HEADER, NonceCheck, reply_mac

if TYPE_CHECKING:
    from actions.contracts import DecodeSettings

SENTINEL = "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX"
ACTION_NAMES = frozenset({"prepare", "prefill", "generate", "score", "train_step", "warmup", "evaluate", "profile",
                          "init_critic", "noop"})
SLOT_ACTIONS = frozenset({"generate", "evaluate"})
"""Actions that generate through ``factory.load_engine``: a torch pre-warm for one of them
loads the version into the generation slot (``actions/engines/torch_slot.py``)."""

ENGINE_GUESTS = {"generate": frozenset({"evaluate", "profile"})}
"""Action -> the actions that may run in its containers when the request says so
(``__action``): an evaluation or a profile on the vLLM engine runs where the generation engine is built
(``flows/invokers/openwhisk/invoker.py``: ``ENGINE_HOSTS``), never beside a second one."""
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""Generous: payloads carry object-store keys, not data (OpenWhisk itself caps them at ~1 MB)."""


@dataclass(frozen=True)
class Guard:
    """Who may call this server and how much a request may cost it."""

    secret: str | None = None
    """This worker's secret, which authenticates requests and signs replies
    (``request_auth.py``); None: no authentication (OpenWhisk images)."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    read_timeout_s: float = 30.0
    """A request (line, headers, body) must arrive within this long of its first byte."""
    idle_timeout_s: float = 600.0
    """A kept-alive connection with no request for this long is closed. Far above the local
    pool client's keep-alive expiry (5 s), so the pool never reuses a connection being closed."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_nonces", NonceCheck(self.secret) if self.secret is not None else None)

    def admit(self, header: str | None, method: str, path: str) -> tuple[bool, str | None]:
        """(admitted, the request's nonce to sign the reply with; None without a secret)."""
        if self._nonces is None:
            return True, None
        nonce = self._nonces.admit(header, method, path)
        return nonce is not None, nonce


def image_id() -> str:
    """The runtime image name:version this server runs in (``local`` outside an image)."""
    return os.environ.get("RLHFLESS_IMAGE", "local")


class ActionRuntime:
    """Dispatches activations to ``actions.<name>.main`` and keeps per-container state."""

    def __init__(self) -> None:
        self.initialized = False
        self.num_runs = 0
        self.lock = threading.Lock()

    def init(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.initialized:
            return 403, {"error": "cannot initialize the action more than once"}
        env = init_environment(body)
        if env is None:  # OpenWhisk sends objects: anything else is another caller's mistake
            return 400, {"error": "init body: 'value' must be an object and 'value.env' an object whose keys are "
                                  "environment variable names (no '=', no NUL) and whose values hold no NUL"}
        os.environ.update(env)  # every entry checked first: a refused init sets none
        self.initialized = True
        return 200, {"ok": True}

    def run(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        params = body.get("value")
        if not isinstance(params, dict):
            return _refuse(body, "BadRequest", "run body must carry a JSON object under 'value'")
        # imported here, not at start-up: a worker process answers /init before pydantic loads
        from pydantic import ValidationError

        from actions.runtime.control import split_control

        try:
            control = split_control(params)[1]
        except ValidationError as exc:
            err = exc.errors()[0]
            return _refuse(body, "InvalidControlKey",
                           f"control key {err['loc'][0]}: {err['msg'].lower()} (got {err.get('input')!r})")
        name = _action_name(body, control)
        if name not in ACTION_NAMES:
            return _refuse(body, "UnknownAction", f"unknown action {name!r}; known: {', '.join(sorted(ACTION_NAMES))}",
                           "name the OpenWhisk action PACKAGE/NAME with NAME one of these (rlhfless deploy "
                           "refuses other names)")
        with self.lock:
            cold = self.num_runs == 0
            self.num_runs += 1
            _export_context(body)
            start = time.time()
            if control.prewarm:
                # Pre-warming only needs a started, initialised container: return before the
                # action module (and torch) is imported. Holding the container briefly makes
                # concurrent pre-warm calls land on distinct containers.
                time.sleep(min(max(control.prewarm_hold_s, 0.0), 10.0))
                loaded = False
                if control.prewarm_model is not None:
                    # Also load the coming policy version and the action's code, so the
                    # activation skips both.
                    loaded = _preload_model(control.prewarm_model, name, control.prewarm_decode)
                print(SENTINEL, flush=True)
                print(SENTINEL, file=sys.stderr, flush=True)
                return 200, {"ok": True, "prewarm": True, "model_loaded": loaded,
                             **_activation_block(time.time() - start, start, cold)}
            kill_after_s = control.inject_kill_after_s
            params.pop("__inject_kill_after_s", None)
            if kill_after_s is not None:
                _schedule_kill(float(kill_after_s))
            print(f"[rlhfless] {name} activation {body.get('activation_id', '')} started", flush=True)
            status = 200
            try:
                module = importlib.import_module(f"actions.{name}")
                result = module.main(dict(params))
            except Exception as exc:  # outermost adapter: report, never crash the container
                print_redacted_traceback()
                status, result = 502, {"error": describe_crash(exc)}
            if kill_after_s is not None:
                threading.Event().wait()  # an action quicker than the kill still gets no reply
            busy = time.time() - start
            print(SENTINEL, flush=True)
            print(SENTINEL, file=sys.stderr, flush=True)
        if not isinstance(result, dict):
            result = {"error": f"action {name} returned {type(result).__name__}, not a dict"}
        result.update(_activation_block(busy, start, cold))
        return status, result


def print_redacted_traceback() -> None:
    """Print the exception being handled, as ``traceback.print_exc`` does, with every secret
    scrubbed (``actions.store.credentials.redact``): stderr is the activation's log on OpenWhisk
    and ``runs/<id>/logs/worker-N.log`` on the local pool, and an exception's text may quote a
    secret (an S3 error echoing a request, a bound parameter)."""
    from actions.store.credentials import redact  # imported here: /init answers before the store loads

    print(redact(traceback.format_exc()), end="", file=sys.stderr, flush=True)


def _refuse(body: dict[str, Any], kind: str, message: str, advice: str | None = None) -> tuple[int, dict[str, Any]]:
    """Refuse an activation before any action runs: a permanent error in the crash form
    (``describe_refusal``), answered with 200, so OpenWhisk files it as an application error and
    keeps the container; the logs still end with the sentinels."""
    refusal = describe_refusal(kind, message, advice)
    print(f"[rlhfless] activation {body.get('activation_id', '')} refused: {refusal['message']}", flush=True)
    print(SENTINEL, flush=True)
    print(SENTINEL, file=sys.stderr, flush=True)
    return 200, {"error": refusal}


def _preload_model(ref: dict[str, Any], action: str, decode: DecodeSettings) -> bool:
    """Import ``action``'s module and load a policy version where the action will look for it:
    the process's vLLM engine (``vllm``: built once, then each version pushed into it in
    place, never a torch model beside it), the torch generation slot for generate and
    evaluate (the same model, each version copied into it in place), else the warm cache.
    Engines are built with ``decode``'s settings, the ones the run's actions ask for. True if
    the version was not there. Best effort."""
    try:
        from actions.contracts import ModelRef
        from actions.models.loading import configure_threads, load_model

        importlib.import_module(f"actions.{action}")
        configure_threads()
        model = ModelRef.model_validate(ref)
        if decode.engine == "vllm" or action in SLOT_ACTIONS:
            from actions.engines.factory import load_engine

            loaded, _, hit = load_engine(decode.engine, model, **decode.engine_options())
            if action == "generate" and hasattr(loaded, "prepare_draws"):
                loaded.prepare_draws()  # compile the fused draw here, not in the first generate
        else:
            _, _, hit = load_model(model)
        return not hit
    except Exception:  # a pre-warm never fails the container; the activation loads it later
        print_redacted_traceback()
        return False


def _engine_built() -> str | None:
    """``vllm`` when this process holds a built vLLM engine, else None (the torch engine's
    generation slot takes any version of its base, and the pool tracks it by policy version
    like the warm cache). Never imports the engines."""
    factory = sys.modules.get("actions.engines.factory")
    return "vllm" if factory is not None and factory.vllm_engine_policy() is not None else None


def _schedule_kill(delay_s: float) -> None:
    """Fault injection (``faults.kill_fraction``): this process dies ``delay_s`` into the
    activation, with no reply, as an OOM-killed or preempted container does."""

    def kill() -> None:
        if os.getpid() == 1:  # PID 1 of a container ignores signals it has no handler for
            os._exit(137)
        os.kill(os.getpid(), signal.SIGKILL)

    timer = threading.Timer(max(delay_s, 0.0), kill)
    timer.daemon = True
    timer.start()


def _activation_block(busy: float, start: float, cold: bool) -> dict[str, Any]:
    """The ``__activation`` control key the invokers move into an activation's accounting."""
    from actions.runtime.control import Control

    block = {"busy_s": busy, "start": start, "pid": os.getpid(), "image": image_id(), "cold": cold,
             "engine": _engine_built()}
    return Control(activation=block).to_payload()


def _action_name(body: dict[str, Any], control: Any) -> str:
    full = body.get("action_name") or control.action or ""
    name = str(full).rstrip("/").split("/")[-1]
    return control.action if control.action in ENGINE_GUESTS.get(name, ()) else name


def _export_context(body: dict[str, Any]) -> None:
    for key in ("api_host", "namespace", "action_name", "activation_id", "transaction_id", "deadline"):
        if key in body:
            os.environ[f"__OW_{key.upper()}"] = str(body[key])


def encode_reply(payload: dict[str, Any]) -> bytes:
    """``payload`` as strict JSON. OpenWhisk rejects the ``NaN``/``Infinity`` literals Python
    writes by default (an invalid result is a developer error), so a non-finite float (a
    diverged step's ``grad_norm``, say) goes out as the string ``"NaN"``, ``"Infinity"`` or
    ``"-Infinity"``; the flows' typed results (``actions/contracts.py``, pydantic floats)
    read those strings back as the same floats."""
    try:
        return json.dumps(payload, allow_nan=False).encode()
    except ValueError:  # rare: only then walk the payload
        return json.dumps(_finite(payload), allow_nan=False).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def make_handler(runtime: ActionRuntime, guard: Guard = Guard()) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # TCP_NODELAY: a reply is two small writes (headers, then body); with Nagle's algorithm
        # the body waits for the ACK of the headers, which the client delays ~40 ms. That
        # stalled every activation by 44 ms over loopback while the worker sat idle.
        disable_nagle_algorithm = True
        timeout = guard.idle_timeout_s  # socket timeout from setup(); tightened per request
        cut = False
        nonce: str | None = None  # the admitted request's: its reply is signed with it

        def log_message(self, fmt: str, *args: Any) -> None:  # keep activation logs clean
            pass

        def handle_one_request(self) -> None:
            # Wait for the next request's first byte (an idle keep-alive connection), then give
            # the whole request read_timeout_s. A per-read socket timeout alone would let a client
            # trickle one byte per interval forever; the watchdog shuts the socket down instead,
            # which wakes the blocked read.
            try:
                if not self.rfile.peek(1):
                    self.close_connection = True
                    return
            except OSError:  # idle timeout, reset
                self.close_connection = True
                return
            self.connection.settimeout(guard.read_timeout_s)
            self.watchdog = threading.Timer(guard.read_timeout_s, self._cut)
            self.watchdog.daemon = True
            self.watchdog.start()
            try:
                super().handle_one_request()
            except OSError:  # the watchdog cut the connection, or the client dropped it
                self.close_connection = True
            finally:
                self.watchdog.cancel()
                self.connection.settimeout(guard.idle_timeout_s)

        def _cut(self) -> None:
            self.cut = True
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def _reply(self, status: int, payload: dict[str, Any], *, close: bool = False) -> None:
            if self.cut:
                return
            data = encode_reply(payload)
            self.send_response(status)
            if self.nonce is not None:
                self.send_header(REPLY_HEADER, reply_mac(guard.secret, self.nonce, status, data))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if close:  # the request body was not read: the connection cannot carry another one
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def _admit(self) -> bool:
            """Authentication first (an unauthenticated caller learns nothing), then the size."""
            if self.cut:
                self.close_connection = True
                return False
            admitted, self.nonce = guard.admit(self.headers.get("Authorization"), self.command, self.path)
            if not admitted:
                self._reply(401, {"error": "missing or wrong credentials"}, close=True)
                return False
            return True

        def do_GET(self) -> None:  # health probe for pools and orchestrators
            if self._admit():
                self._reply(200, {"ok": True, "image": image_id(), "runs": runtime.num_runs})

        def do_POST(self) -> None:
            if not self._admit():
                return
            body = self._read_body()
            if body is None:
                return
            if self.path == "/init":
                self._reply(*runtime.init(body))
            elif self.path == "/run":
                self._reply(*runtime.run(body))
            else:
                self._reply(404, {"error": f"no route {self.path}; use /init or /run"})

        def _read_body(self) -> dict[str, Any] | None:
            """The JSON object body, or None once an error reply is sent (or the client is cut)."""
            if self.headers.get("Transfer-Encoding"):
                self._reply(411, {"error": "send the body with a Content-Length, not chunked"}, close=True)
                return None
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length < 0:
                    raise ValueError
            except ValueError:
                self._reply(400, {"error": "Content-Length is not a non-negative integer"}, close=True)
                return None
            if length > guard.max_body_bytes:
                self._reply(413, {"error": f"request body of {length} bytes is over this server's limit of "
                                           f"{guard.max_body_bytes} bytes; pass object-store keys, not data"}, close=True)
                return None
            raw = self.rfile.read(length)
            self.watchdog.cancel()  # the request is in: the action may take as long as it needs
            if len(raw) < length:  # cut by the watchdog, or the client went away
                self.close_connection = True
                return None
            try:
                body = json.loads(raw or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("body is not a JSON object")
            except ValueError as exc:
                self._reply(400, {"error": f"request body is not valid JSON: {exc}"})
                return None
            return body

    return Handler


def serve(host: str = "0.0.0.0", port: int = 8080, ready_fd: int | None = None, guard: Guard = Guard()) -> None:
    """Serve forever. With ``ready_fd``, write the bound port there once listening."""
    server = ThreadingHTTPServer((host, port), make_handler(ActionRuntime(), guard))
    if ready_fd is not None:
        os.write(ready_fd, f"{server.server_address[1]}\n".encode())
        os.close(ready_fd)
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="RLHFless action-protocol server (/init, /run)")
    parser.add_argument("--host", default=os.environ.get("RLHFLESS_HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("RLHFLESS_PORT", "8080")))
    parser.add_argument("--ready-fd", type=int, default=None)
    parser.add_argument("--control-fd", type=int, default=None,
                        help="local pool: pipe carrying the request secret; its end-of-file stops this worker, "
                             "which then ignores Ctrl-C (SIGINT)")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="local pool: exit with this process (Linux parent-death signal)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--read-timeout-s", type=float, default=30.0)
    parser.add_argument("--idle-timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.control_fd is not None:
        # A pool worker's life is its control pipe's (the pool closes it, then stops the worker).
        # Ctrl-C at the terminal reaches the whole process group: the worker would die mid-activation
        # with a KeyboardInterrupt traceback in its log that reads like a failure of the action. A
        # server started by hand, with no control pipe, still stops on Ctrl-C. The pool starts the
        # worker with SIGINT blocked, so one sent before this line waits, pending: ignoring it
        # discards it, and the unblock restores the usual mask (the worker's own children inherit it).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    # The CLI's threads block SIGTERM (flows/commands/main_thread_signals.py) and a process
    # inherits its starting thread's mask: a server, and the processes it starts (vLLM's engine
    # core), take SIGTERM as usual.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    secret = None
    if args.parent_pid is not None:
        from actions.runtime.lifeline import die_with_parent

        die_with_parent(args.parent_pid)
    if args.control_fd is not None:
        from actions.runtime.lifeline import read_secret, watch_parent

        secret = read_secret(args.control_fd)
        watch_parent(args.control_fd)
    print(f"[rlhfless] action server pid {os.getpid()} starting", flush=True)
    serve(args.host, args.port, args.ready_fd,
          Guard(secret=secret, max_body_bytes=args.max_body_bytes, read_timeout_s=args.read_timeout_s,
                idle_timeout_s=args.idle_timeout_s))


if __name__ == "__main__":
    main()
