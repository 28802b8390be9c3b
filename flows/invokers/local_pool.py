"""Local warm pool: worker processes serving the OpenWhisk action protocol on loopback.

Each worker runs ``python -m actions.runtime.server`` (the runtime images' entrypoint) on a
free loopback port, gets one ``/init``, then serves ``/run`` one activation at a time and
keeps models loaded between activations, like a warm OpenWhisk container. An invocation takes
an idle worker (waiting in a queue when all are busy, which is the queue time it reports),
posts ``/run`` and records the accounting. A worker that dies mid-activation is replaced and
the activation fails as transient, so the flow's retry runs it again.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from flows.invokers.base import ActionError, Activation


@dataclass
class _Worker:
    name: str
    proc: subprocess.Popen
    port: int
    num_runs: int = 0


def _spawn(name: str) -> _Worker:
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", RLHFLESS_THREADS="1",
               PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "actions.runtime.server", "--host", "127.0.0.1", "--port", "0",
         "--ready-fd", str(write_fd)],
        pass_fds=(write_fd,), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    os.close(write_fd)
    with os.fdopen(read_fd) as fh:
        line = fh.readline()
    if not line.strip():
        proc.kill()
        raise RuntimeError(f"local worker {name} failed to start (exit code {proc.poll()})")
    return _Worker(name, proc, int(line))


class LocalPoolInvoker:
    """A fixed-size pool of warm action workers on this machine."""

    def __init__(self, num_workers: int, *, timeout_s: float = 600.0) -> None:
        if num_workers < 1:
            raise ValueError(f"invoker.num_workers={num_workers}: the local pool needs at least 1 worker")
        self.timeout_s = timeout_s
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=5.0))
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        threads = [threading.Thread(target=self._add, args=(f"worker-{i}",)) for i in range(num_workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(self._workers) != num_workers:
            self.close()
            raise RuntimeError("the local warm pool could not start all its workers")

    def _add(self, name: str) -> None:
        worker = _spawn(name)
        self._client.post(f"http://127.0.0.1:{worker.port}/init", json={"value": {"name": name}}).raise_for_status()
        with self._lock:
            self._workers.append(worker)
        self._idle.put(worker)

    @property
    def size(self) -> int:
        return len(self._workers)

    def invoke(self, action: str, payload: dict[str, Any], *, timeout_s: float | None = None) -> Activation:
        submitted = time.time()
        worker = self._idle.get()
        started = time.time()
        activation_id = uuid.uuid4().hex
        body = {"value": payload, "action_name": f"/local/rlhfless/{action}", "activation_id": activation_id,
                "deadline": int((started + (timeout_s or self.timeout_s)) * 1000)}
        try:
            resp = self._client.post(f"http://127.0.0.1:{worker.port}/run", json=body,
                                     timeout=timeout_s or self.timeout_s)
            result = resp.json()
        except (httpx.TransportError, ValueError) as exc:
            self._replace(worker)
            raise ActionError(action, f"worker {worker.name} was lost mid-activation ({type(exc).__name__})",
                              transient=True, activation_id=activation_id) from None
        worker.num_runs += 1
        self._idle.put(worker)
        ended = time.time()
        meta = result.pop("__activation", {}) if isinstance(result, dict) else {}
        if not isinstance(result, dict) or "error" in result:
            err = result.get("error") if isinstance(result, dict) else f"non-JSON result {result!r}"
            raise ActionError(action, str(err), transient=bool(result.get("developer_error")),
                              activation_id=activation_id)
        return Activation(action=action, activation_id=activation_id, result=result, submitted_at=submitted,
                          started_at=started, ended_at=ended, busy_s=float(meta.get("busy_s", ended - started)),
                          cold=bool(meta.get("cold", False)), worker=worker.name,
                          extra={"pid": meta.get("pid"), "image": meta.get("image")})

    def _replace(self, worker: _Worker) -> None:
        worker.proc.kill()
        worker.proc.wait()  # reap it: a lost worker leaves no zombie behind
        with self._lock:
            self._workers = [w for w in self._workers if w is not worker]
        self._add(worker.name)

    def prewarm(self, action: str, count: int, *, model: dict[str, Any] | None = None) -> int:
        """Workers are started warm; with ``model``, up to ``count`` idle workers load that
        policy version now (busy ones are skipped: never wait). Returns how many loaded it."""
        if model is None or count <= 0:
            return 0
        taken: list[_Worker] = []
        while len(taken) < count:
            try:
                taken.append(self._idle.get_nowait())
            except queue.Empty:
                break
        body = {"value": {"__prewarm": True, "__prewarm_model": model},
                "action_name": f"/local/rlhfless/{action}", "activation_id": uuid.uuid4().hex}

        def warm(worker: _Worker) -> bool:
            try:
                resp = self._client.post(f"http://127.0.0.1:{worker.port}/run", json=body, timeout=self.timeout_s)
                return bool(resp.json().get("model_loaded"))
            except (httpx.TransportError, ValueError):
                return False  # a lost worker shows up (and is replaced) on its next invocation
            finally:
                self._idle.put(worker)

        threads = [threading.Thread(target=lambda w=w: results.append(warm(w))) for w in taken]
        results: list[bool] = []
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(results)

    def close(self) -> None:
        for w in self._workers:
            w.proc.terminate()
        for w in self._workers:
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                w.proc.kill()
        self._client.close()
