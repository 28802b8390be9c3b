"""Action containers for the OpenWhisk emulator (tests only): each one is a real
action-protocol server process (``python -m actions.runtime.server``) on a loopback port, with
its stdout/stderr captured up to the runtime's sentinel lines, as an invoker collects logs."""

from __future__ import annotations

import http.client
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
SENTINEL = "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX"


class Container:
    """One action container: a real action-protocol server process on a loopback port."""

    def __init__(self, image: str, extra_modules: tuple[str, ...]) -> None:
        self.image = image
        self.extra_modules = extra_modules
        self.initialized = False
        self.busy = True
        self.retired = False
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.logs: list[tuple[str, str]] = []
        self.sentinels = {"stdout": 0, "stderr": 0}
        self.cond = threading.Condition()

    def start(self, timeout_s: float = 30.0) -> None:
        read_fd, write_fd = os.pipe()
        env = {k: v for k, v in os.environ.items() if k not in ("WSK_AUTH", "__OW_API_KEY")}
        env.update(
            PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS), env.get("PYTHONPATH", "")]),
            RLHFLESS_IMAGE=self.image,
            PYTHONUNBUFFERED="1",
        )
        if self.extra_modules:
            # SIGTERM unblocked first, as the server's main() does: a test process that ran the CLI
            # in-process has it blocked in its threads (flows/commands/main_thread_signals.py), and a
            # child inherits the mask of the thread that starts it, so stop() waited 5 s per container
            launcher = (
                "import signal, sys, importlib\nsignal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})\n"
                "for m in sys.argv[2:]: importlib.import_module(m)\n"
                "from actions.runtime.server import serve\nserve('127.0.0.1', 0, int(sys.argv[1]))"
            )
            cmd = [sys.executable, "-c", launcher, str(write_fd), *self.extra_modules]
        else:
            cmd = [sys.executable, "-m", "actions.runtime.server", "--host", "127.0.0.1", "--port", "0"]
            cmd += ["--ready-fd", str(write_fd)]
        self.proc = subprocess.Popen(
            cmd, env=env, pass_fds=(write_fd,), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
        )
        os.close(write_fd)
        for stream, pipe in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            threading.Thread(target=self._pump, args=(stream, pipe), daemon=True).start()
        try:
            ready, _, _ = select.select([read_fd], [], [], timeout_s)
            line = os.read(read_fd, 64).decode() if ready else ""
        finally:
            os.close(read_fd)
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"action container did not start within {timeout_s}s: {self.tail()}")
        self.port = int(line)

    def _pump(self, stream: str, pipe: Any) -> None:
        for raw in iter(pipe.readline, ""):
            text = raw.rstrip("\n")
            with self.cond:
                if text == SENTINEL:
                    self.sentinels[stream] += 1
                else:
                    self.logs.append((stream, text))
                self.cond.notify_all()

    def tail(self) -> str:
        with self.cond:
            return " | ".join(t for _, t in self.logs[-5:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def post(self, path: str, body: dict[str, Any], timeout_s: float) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(data)
        except ValueError:
            return resp.status, None

    def run(self, body: dict[str, Any], timeout_s: float) -> tuple[int, Any, list[str]]:
        """POST /run, then collect this activation's log lines up to both sentinels."""
        with self.cond:
            first, seen = len(self.logs), dict(self.sentinels)
        status, result = self.post("/run", body, timeout_s)
        with self.cond:
            self.cond.wait_for(lambda: all(self.sentinels[s] > seen[s] for s in seen), timeout=2.0)
            lines = [f"{_iso(time.time())} {s}: {t}" for s, t in self.logs[first:]]
        return status, result, lines

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


class ContainerPool:
    """Warm containers per action; a new one starts only when all are busy."""

    def __init__(self, extra_modules: tuple[str, ...], max_per_action: int) -> None:
        self.extra_modules = extra_modules
        self.max_per_action = max_per_action
        self.cond = threading.Condition()
        self.containers: dict[str, list[Container]] = {}
        self.every: list[Container] = []
        self.num_started = 0

    def acquire(self, key: str, image: str) -> Container:
        with self.cond:
            while True:
                pool = self.containers.setdefault(key, [])
                idle = next((c for c in pool if not c.busy and c.alive()), None)
                if idle is not None:
                    idle.busy = True
                    return idle
                if len(pool) < self.max_per_action:
                    container = Container(image, self.extra_modules)
                    pool.append(container)
                    self.every.append(container)
                    self.num_started += 1
                    break
                self.cond.wait()
        try:
            container.start()
        except Exception:
            self.release(key, container, destroy=True)
            raise
        return container

    def release(self, key: str, container: Container, *, destroy: bool = False) -> None:
        if destroy or container.retired:
            container.stop()
        with self.cond:
            container.busy = False
            if destroy and container in self.containers.get(key, []):
                self.containers[key].remove(container)
            self.cond.notify_all()

    def drop(self, key: str) -> None:
        """Retire an action's containers (updated or deleted): idle ones stop now, busy ones
        when their activation ends."""
        with self.cond:
            pool = self.containers.pop(key, [])
            for container in pool:
                container.retired = True
            idle = [c for c in pool if not c.busy]
        for container in idle:
            container.stop()

    def warm(self, key: str) -> int:
        with self.cond:
            return sum(1 for c in self.containers.get(key, []) if c.alive())

    def close(self) -> None:
        with self.cond:
            doomed = list(self.every)
            self.containers.clear()
        for container in doomed:
            container.stop()
