"""The action server's request guard and the local pool's per-worker secrets.

A pool worker answers 401, doing nothing, to a request without a valid single-use MAC of its
secret, and signs its replies; the pool refuses a reply without that signature, so a process
that takes a dead worker's port forges nothing and learns nothing any worker accepts. A worker
refuses a
body over its cap with 413 from the ``Content-Length`` alone; cuts a request that trickles in
slower than its read timeout; and answers a crashed action with 502 and its classification.
The secret travels on a pipe: it is on no command line and in no environment.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from actions.runtime.request_auth import REPLY_HEADER, reply_is_authentic, sign_request
from actions.runtime.server import ActionRuntime, Guard, make_handler
from flows.invokers.base import ActionError
from flows.invokers.local_pool import LocalPoolInvoker

SECRET = "s3cr3t-for-this-test"


@contextlib.contextmanager
def _serve(guard: Guard) -> Iterator[tuple[ActionRuntime, int]]:
    runtime = ActionRuntime()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(runtime, guard))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield runtime, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def served() -> Iterator[tuple[ActionRuntime, int]]:
    """An in-process action server with a secret, a 1 KiB body cap and a 1 s read timeout."""
    with _serve(Guard(secret=SECRET, max_body_bytes=1024, read_timeout_s=1.0)) as both:
        yield both


def _auth(path: str = "/run", secret: str = SECRET, method: str = "POST") -> dict[str, str]:
    return {"Authorization": sign_request(secret, method, path)[1]}


def test_requests_without_the_secret_get_401_and_do_nothing(served):
    runtime, port = served
    url = f"http://127.0.0.1:{port}"
    run = {"value": {}, "action_name": "/local/rlhfless/noop"}
    with httpx.Client() as client:
        for secret in ("wrong", SECRET + "x"):
            assert client.post(f"{url}/init", json={"value": {"env": {"RLHFLESS_PWNED": "1"}}},
                               headers=_auth("/init", secret)).status_code == 401
            assert client.post(f"{url}/run", json=run, headers=_auth("/run", secret)).status_code == 401
            assert client.get(url + "/", headers=_auth("/", secret, "GET")).status_code == 401
        for headers in ({}, {"Authorization": f"Bearer {SECRET}"}, {"Authorization": SECRET},
                        _auth("/run"), _auth("/init", method="GET")):  # no MAC, the secret itself, a MAC for another route
            assert client.post(f"{url}/init", json={"value": {}}, headers=headers).status_code == 401
        assert not runtime.initialized and runtime.num_runs == 0  # nothing happened
        assert client.post(f"{url}/init", json={"value": {}}, headers=_auth("/init")).status_code == 200
        headers = _auth()
        reply = client.post(f"{url}/run", json=run, headers=headers)
        assert client.post(f"{url}/run", json=run, headers=headers).status_code == 401  # a nonce is single use
    assert reply.status_code == 200 and reply.json()["ok"] is True and runtime.num_runs == 1
    nonce = headers["Authorization"].split()[1].split(":")[0]
    assert reply_is_authentic(SECRET, nonce, 200, reply.content, reply.headers.get(REPLY_HEADER))
    assert not reply_is_authentic("wrong", nonce, 200, reply.content, reply.headers.get(REPLY_HEADER))


def _raw(port: int, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(data)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_an_oversized_content_length_gets_413_at_once_unread():
    """1 GB announced, a few bytes sent: the answer comes from the header, long before the
    30 s read timeout would cut a request waiting for its body."""
    head = (f"POST /run HTTP/1.1\r\nHost: x\r\nAuthorization: {_auth()['Authorization']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {1 << 30}\r\n\r\n").encode()
    with _serve(Guard(secret=SECRET, read_timeout_s=30.0)) as (runtime, port):
        t0 = time.monotonic()
        with _raw(port, head + b'{"value": ') as sock:
            reply = _read_all(sock)
        took = time.monotonic() - t0
    status_line, _, rest = reply.partition(b"\r\n")
    assert status_line.split()[1] == b"413", reply
    assert b"over this server's limit of 67108864 bytes" in rest  # the 64 MiB default
    assert took < 3.0, took
    assert runtime.num_runs == 0


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_slow_loris_request_is_cut_at_the_read_timeout(served, where):
    """One byte every 0.2 s never trips a per-read timeout; the request deadline (1 s) cuts it."""
    runtime, port = served
    body = json.dumps({"value": {}, "action_name": "noop"}).encode()
    head = (f"POST /run HTTP/1.1\r\nHost: x\r\nAuthorization: {_auth()['Authorization']}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    first, trickle = (head[:10], head[10:] + body) if where == "headers" else (head, body)
    t0 = time.monotonic()
    sock = _raw(port, first)
    closed_after = None
    try:
        for byte in trickle:
            time.sleep(0.2)
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # reset: the server cut us
                closed_after = time.monotonic() - t0
                break
            sock.setblocking(False)
            try:
                if sock.recv(1) == b"":
                    closed_after = time.monotonic() - t0
                    break
            except BlockingIOError:
                pass
            except OSError:
                closed_after = time.monotonic() - t0
                break
            finally:
                sock.setblocking(True)
    finally:
        sock.close()
    assert closed_after is not None, "the server let the trickling request run to its end"
    assert 0.9 <= closed_after <= 4.0, closed_after  # cut at 1 s (the trickle would take 10 s or more)
    assert runtime.num_runs == 0


def test_an_idle_connection_is_closed_at_the_idle_timeout():
    with _serve(Guard(secret=SECRET, idle_timeout_s=0.5)) as (_, port):
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            assert sock.recv(1) == b""  # closed by the server, without a byte sent
        assert 0.4 <= time.monotonic() - t0 <= 3.0


def test_a_crashed_action_gets_502_with_its_classification(served, monkeypatch):
    import actions.noop

    runtime, port = served

    def buggy(args):
        return len(args["n"])  # TypeError: object of type 'int' has no len()

    monkeypatch.setattr(actions.noop, "main", buggy)
    with httpx.Client(headers=_auth()) as client:  # one request: one nonce
        reply = client.post(f"http://127.0.0.1:{port}/run", json={"value": {"n": 3}, "action_name": "noop"})
    assert reply.status_code == 502
    assert reply.json()["error"] == {"type": "TypeError", "message": "object of type 'int' has no len()",
                                     "transient": False}


def test_pool_workers_hold_the_secret_only_in_memory(tmp_path: Path):
    pool = LocalPoolInvoker(1, log_dir=tmp_path / "logs", timeout_s=60)
    try:
        secret = pool._workers[0].secret
        (pid,) = pool.worker_pids()
        for name in ("cmdline", "environ"):
            assert secret.encode() not in Path(f"/proc/{pid}/{name}").read_bytes(), name
        port = pool._workers[0].port
        assert httpx.post(f"http://127.0.0.1:{port}/run", json={"value": {}, "action_name": "noop"}).status_code == 401
        assert pool.invoke("noop", {}).result == {"ok": True}
        # A refusal the action makes itself is not retried, and names no log (nothing crashed).
        with pytest.raises(ActionError) as info:
            pool.invoke("generate", {"prompt_ids": "not a list"})
        assert not info.value.transient and "\n" not in str(info.value)
    finally:
        pool.close()
    log = (tmp_path / "logs" / "worker-0.log").read_text()
    assert "action server pid" in log and secret not in log


IMPOSTOR = """
import json, socket, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Forger(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(sys.argv[2], "a") as fh:
            fh.write(json.dumps(dict(self.headers)) + "\\n")
        data = json.dumps({"ok": True, "forged": True}).encode()
        self.send_response(200)
        self.send_header("X-RLHFless-Reply-MAC", "0" * 64)  # a guess: it has no secret to compute one
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

class Server(HTTPServer):
    allow_reuse_address = True

server = Server(("127.0.0.1", int(sys.argv[1])), Forger)
print("listening", flush=True)
server.serve_forever()
"""


def test_an_impostor_on_a_dead_workers_port_gets_no_credential_and_forges_nothing(tmp_path: Path):
    """A worker dies after the pool took it for a call (a worker found dead before is replaced
    and never called: ``test_failed_attempts``); another local process binds its freed port and
    answers that call with a forged result. The pool refuses the reply and replaces the worker;
    what the impostor received is accepted by no worker (not the new one, not another one)."""
    import os
    import signal
    import subprocess
    import sys

    pool = LocalPoolInvoker(2, log_dir=tmp_path / "logs", timeout_s=60)
    impostor = None
    try:
        victim, other = pool._workers
        secrets_before = {victim.secret, other.secret}
        assert victim.secret != other.secret  # one secret per worker
        taken = [pool._idle.take("noop", None) for _ in range(2)]  # both idle workers, then only the victim back:
        assert {w.name for w in taken} == {victim.name, other.name}
        pool._idle.put(victim)  # the other stays busy, so the next call goes to the victim's port
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait()
        exit_code = victim.proc.returncode
        victim.proc.poll = lambda: None  # it died after the pool's liveness check
        seen = tmp_path / "seen.jsonl"
        impostor = subprocess.Popen([sys.executable, "-c", IMPOSTOR, str(victim.port), str(seen)],
                                    stdout=subprocess.PIPE, text=True)
        assert impostor.stdout.readline().strip() == "listening"
        with pytest.raises(ActionError) as info:
            pool.invoke("noop", {})
        assert info.value.transient and "another process answers on its port" in str(info.value)
        assert exit_code == -signal.SIGKILL
        (headers,) = [json.loads(line) for line in seen.read_text().splitlines()]
        auth = headers.get("Authorization", "")
        assert not any(s in json.dumps(headers) for s in secrets_before)  # no secret crossed the socket
        # What it captured, replayed against every live worker (the replacement and the other): 401.
        for worker in pool._workers:
            for path in ("/run", "/init"):
                reply = httpx.post(f"http://127.0.0.1:{worker.port}{path}", headers={"Authorization": auth},
                                   json={"value": {}, "action_name": "noop"})
                assert reply.status_code == 401, (worker.name, path)
        new = next(w for w in pool._workers if w.name == victim.name)
        assert new.port != victim.port or new.proc.pid != victim.proc.pid
        assert new.secret not in secrets_before
        pool._idle.put(other)
        assert pool.invoke("noop", {}).result == {"ok": True}  # the pool works on
    finally:
        if impostor is not None:
            impostor.kill()
            impostor.wait()
        pool.close()
