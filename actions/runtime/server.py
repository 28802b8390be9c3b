"""The OpenWhisk action-protocol server: ``POST /init`` and ``POST /run`` on one port.

This is the entrypoint of the runtime images (port 8080) and of every local warm-pool worker
(a free loopback port). It follows the contract in OpenWhisk's ``docs/actions-new.md``:

* ``/init`` takes ``{"value": {name, main, code, binary, env}}`` once per container. The action
  code is baked into the image, so ``code`` is ignored; ``env`` is exported. A second ``/init``
  is refused, as the contract requires.
* ``/run`` takes ``{"value": params, "action_name": "/ns/pkg/generate", "activation_id",
  "deadline", ...}``; the last path segment of ``action_name`` (or ``value["__action"]`` when
  no name is given) selects ``actions.<name>.main``. The reply is the action's JSON dict, with
  an ``__activation`` block added: busy seconds, process id, image id, cold/warm.
* Activations never overlap in one container (concurrency 1): a lock serialises ``/run``.
* Every activation's logs end with the sentinel line on stdout and stderr so OpenWhisk
  collects them promptly.
* Fault injection: ``__inject_kill_after_s`` in ``value`` makes the process kill itself
  (SIGKILL) that long into the activation, without replying (``faults.kill_fraction``).

What it does not do: authentication (OpenWhisk's invoker talks to it on a private network;
the local pool binds loopback only).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SENTINEL = "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX"
ACTION_NAMES = frozenset({"prefill", "generate", "score", "train_step", "warmup", "evaluate", "noop"})


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
        value = body.get("value") or {}
        for key, val in (value.get("env") or {}).items():
            os.environ[str(key)] = str(val)
        self.initialized = True
        return 200, {"ok": True}

    def run(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        params = body.get("value")
        if not isinstance(params, dict):
            return 400, {"error": "run body must carry a JSON object under 'value'"}
        name = _action_name(body, params)
        if name not in ACTION_NAMES:
            return 404, {"error": f"unknown action {name!r}; known: {sorted(ACTION_NAMES)}"}
        with self.lock:
            cold = self.num_runs == 0
            self.num_runs += 1
            _export_context(body)
            start = time.time()
            if params.get("__prewarm") is True:
                # Pre-warming only needs a started, initialised container: return before the
                # action module (and torch) is imported. Holding the container briefly makes
                # concurrent pre-warm calls land on distinct containers.
                time.sleep(min(max(float(params.get("__prewarm_hold_s") or 0.0), 0.0), 10.0))
                loaded = False
                if isinstance(params.get("__prewarm_model"), dict):
                    # Also load the coming policy version, so the activation skips the load.
                    loaded = _preload_model(params["__prewarm_model"])
                print(SENTINEL, flush=True)
                print(SENTINEL, file=sys.stderr, flush=True)
                return 200, {"ok": True, "prewarm": True, "model_loaded": loaded,
                             "__activation": _activation_block(time.time() - start, start, cold)}
            kill_after_s = params.pop("__inject_kill_after_s", None)
            if kill_after_s is not None:
                _schedule_kill(float(kill_after_s))
            try:
                module = importlib.import_module(f"actions.{name}")
                result = module.main(dict(params))
            except Exception as exc:  # outermost adapter: report, never crash the container
                traceback.print_exc()
                result = {"error": f"{type(exc).__name__}: {exc}", "developer_error": True}
            if kill_after_s is not None:
                threading.Event().wait()  # an action quicker than the kill still gets no reply
            busy = time.time() - start
            print(SENTINEL, flush=True)
            print(SENTINEL, file=sys.stderr, flush=True)
        if not isinstance(result, dict):
            result = {"error": f"action {name} returned {type(result).__name__}, not a dict"}
        result["__activation"] = _activation_block(busy, start, cold)
        return 200, result


def _preload_model(ref: dict[str, Any]) -> bool:
    """Load a policy version into the warm cache; True if it was not there. Best effort."""
    try:
        from actions.common.contracts import ModelRef
        from actions.common.loading import configure_threads, load_model

        configure_threads()
        _, _, hit = load_model(ModelRef.model_validate(ref))
        return not hit
    except Exception:  # a pre-warm never fails the container; the activation loads it later
        traceback.print_exc()
        return False


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
    return {"busy_s": busy, "start": start, "pid": os.getpid(), "image": image_id(), "cold": cold}


def _action_name(body: dict[str, Any], params: dict[str, Any]) -> str:
    full = body.get("action_name") or params.get("__action") or ""
    return str(full).rstrip("/").split("/")[-1]


def _export_context(body: dict[str, Any]) -> None:
    for key in ("api_host", "namespace", "action_name", "activation_id", "transaction_id", "deadline"):
        if key in body:
            os.environ[f"__OW_{key.upper()}"] = str(body[key])


def make_handler(runtime: ActionRuntime) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # TCP_NODELAY: a reply is two small writes (headers, then body); with Nagle's algorithm
        # the body waits for the ACK of the headers, which the client delays ~40 ms. That
        # stalled every activation by 44 ms over loopback while the worker sat idle.
        disable_nagle_algorithm = True

        def log_message(self, fmt: str, *args: Any) -> None:  # keep activation logs clean
            pass

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # health probe for pools and orchestrators
            self._reply(200, {"ok": True, "image": image_id(), "runs": runtime.num_runs})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("body is not a JSON object")
            except ValueError as exc:
                self._reply(400, {"error": f"request body is not valid JSON: {exc}"})
                return
            if self.path == "/init":
                self._reply(*runtime.init(body))
            elif self.path == "/run":
                self._reply(*runtime.run(body))
            else:
                self._reply(404, {"error": f"no route {self.path}; use /init or /run"})

    return Handler


def serve(host: str = "0.0.0.0", port: int = 8080, ready_fd: int | None = None) -> None:
    """Serve forever. With ``ready_fd``, write the bound port there once listening."""
    server = ThreadingHTTPServer((host, port), make_handler(ActionRuntime()))
    if ready_fd is not None:
        os.write(ready_fd, f"{server.server_address[1]}\n".encode())
        os.close(ready_fd)
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="RLHFless action-protocol server (/init, /run)")
    parser.add_argument("--host", default=os.environ.get("RLHFLESS_HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("RLHFLESS_PORT", "8080")))
    parser.add_argument("--ready-fd", type=int, default=None)
    args = parser.parse_args(argv)
    serve(args.host, args.port, args.ready_fd)


if __name__ == "__main__":
    main()
