"""Local warm pool: worker processes serving the OpenWhisk action protocol on loopback.

Each worker runs ``python -m actions.runtime.server`` (the runtime images' entrypoint) on a
free loopback port, gets one ``/init``, then serves ``/run`` one activation at a time and
keeps models loaded between activations, like a warm OpenWhisk container. An invocation takes
an idle worker (waiting when all are busy, which is the queue time it reports), preferring one
whose warm state serves it (``flows/invokers/idle.py``: a built vLLM engine for a vLLM request,
the policy version it holds, the action it ran last), posts ``/run`` and records the accounting.

Security and lifetime (``actions.runtime.lifeline``):

* The pool draws a random secret per worker and writes it to that worker's control pipe,
  never to a command line, the environment or a log. Requests and replies are authenticated
  both ways with HMACs of it over a fresh nonce (``actions.runtime.request_auth``); the secret
  never crosses the socket. A worker answers anything else with 401, doing nothing, and the
  pool takes no reply whose MAC is wrong: a process that binds a dead worker's freed port
  learns nothing any worker accepts, and its answer is refused like a lost worker's.
* A worker exits when the pool process dies, however it dies: the control pipe reaches
  end-of-file, and on Linux the kernel's parent-death signal fires too. That signal follows the
  *thread* that forked the worker, so every worker is forked by one thread that lives as long
  as the pool.
* A worker ignores Ctrl-C (SIGINT, which the terminal sends to the whole process group) from
  its first instruction: it starts with SIGINT blocked, inherited from the forking thread, until
  its ``main`` ignores it and unblocks it (``actions.runtime.server``).
* Each worker's stdout and stderr go to ``<log_dir>/<worker>.log`` (mode 0600), appended to
  across replacements; every error message names that file.
* Each worker's temporary files go under one directory the pool owns (``TMPDIR``), removed when
  the pool closes: a worker leaves through ``os._exit`` when its control pipe closes, or dies
  to a signal, and no clean-up of its own runs then (a vLLM engine's copy of the model, the
  size of its weights, would stay behind in ``/tmp`` for every worker of every campaign).

Errors (``flows.invokers.base``): a worker that dies or does not answer mid-activation is
replaced and the activation fails as transient, so the flow's retry runs it again (where no new
worker starts, the pool closing or the start failing, it still fails as an ``ActionError`` with its
accounting, transient only while a worker is left to retry on); a crashed
action (502) is transient or permanent as the worker classified it; an application error
(``{"error": ...}`` with 200) and any other refusal are permanent.
"""

from __future__ import annotations

import getpass
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from actions.contracts import DecodeSettings
from actions.runtime.control import Control, take_activation
from actions.runtime.errors import TRANSIENT_STATUS, one_line
from actions.runtime.request_auth import REPLY_HEADER, reply_is_authentic, sign_request
from actions.runtime.server import DEFAULT_MAX_BODY_BYTES
from flows.invokers.base import ActionError, Activation
from flows.invokers.cores import MKL_REPRODUCIBLE, CoreShare
from flows.invokers.idle import IdleWorkers, NoWorkersLeft, held_policy, ref_policy, request_engine, request_policy

KEEPALIVE_EXPIRY_S = 5.0
"""How long the pool keeps an idle connection to a worker (well under the worker's idle timeout)."""


@dataclass
class _Worker:
    name: str
    proc: subprocess.Popen
    port: int
    secret: str = field(repr=False)
    """This worker's own secret (request and reply MACs); never sent, logged or shown."""
    control_fd: int = -1
    """Write end of the worker's control pipe; closing it tells the worker to exit."""
    log_path: Path = Path()
    num_runs: int = 0
    warm: dict[str, str | None] = field(default_factory=dict)
    """Action -> the policy version it left this worker holding (``flows/invokers/idle.py``)."""
    engine: str | None = None
    """The generation engine built in this worker (``vllm``; its runtime says so after each call)."""
    engine_policy: str | None = None
    """The policy version that engine holds."""


class PoolStartFailed(RuntimeError):
    """Workers of the local pool did not start (one line: how many, the first's cause, its log)."""


class UnauthenticatedReply(Exception):
    """A reply without this worker's MAC: something else answers on the worker's port."""


def _exit_text(proc: subprocess.Popen) -> str:
    code = proc.poll()
    if code is None:
        return "still running, no answer"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _note_engine(worker: _Worker, meta: dict[str, Any], policy: str | None) -> None:
    """Record what the worker's runtime said about its engine (``meta``: its activation block)
    and, when the call loaded ``policy`` into that engine, the version it holds now."""
    worker.engine = meta.get("engine")
    if worker.engine is None:
        worker.engine_policy = None
    elif policy is not None:
        worker.engine_policy = policy


class LocalPoolInvoker:
    """A fixed-size pool of warm action workers on this machine.

    Args:
        num_workers: workers started now, all warm.
        timeout_s: longest an activation may run before its worker is replaced.
        log_dir: where each worker's log file goes (created); None: a new temporary directory.
        max_body_bytes, read_timeout_s: the workers' request limits (``actions.runtime.server.Guard``).
        num_cores: cores the running activations share (``flows.invokers.cores``); 0: this
            process's affinity mask.
    """

    sees_local_files = True

    def __init__(self, num_workers: int, *, timeout_s: float = 600.0, log_dir: str | Path | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, read_timeout_s: float = 30.0,
                 num_cores: int = 0) -> None:
        if num_workers < 1:
            raise ValueError(f"invoker.num_workers={num_workers}: the local pool needs at least 1 worker")
        self.timeout_s = timeout_s
        self.cores = CoreShare(num_cores)
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="rlhfless-pool-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix="rlhfless-pool-tmp-"))  # the workers' TMPDIR (module docstring)
        # Idle connections: this client drops its own after KEEPALIVE_EXPIRY_S, so a worker may
        # close idle ones after a minute (freeing a thread an idle stranger holds) without ever
        # closing one the pool is about to reuse.
        self._limits = ["--max-body-bytes", str(max_body_bytes), "--read-timeout-s", str(read_timeout_s),
                        "--idle-timeout-s", str(max(60.0, read_timeout_s))]
        self._idle: IdleWorkers[_Worker] = IdleWorkers()
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=5.0),
                                    limits=httpx.Limits(max_connections=100, max_keepalive_connections=20,
                                                        keepalive_expiry=KEEPALIVE_EXPIRY_S))
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._closing = False  # set by close(): no worker starts after it
        self._starting = 0  # replacements of lost workers still starting: the pool is not empty while one is
        # The one thread that forks workers (see the module docstring): it lives until close().
        # It blocks SIGINT (only Python's main thread handles it anyway): a child inherits the
        # mask, so Ctrl-C cannot kill a worker before its main() ignores SIGINT (a signal
        # handler can only be set from the main thread, and a preexec_fn is unsafe here).
        self._forker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pool-forker",
                                          initializer=signal.pthread_sigmask,
                                          initargs=(signal.SIG_BLOCK, {signal.SIGINT}))
        self._start_all([f"worker-{i}" for i in range(num_workers)])

    def __repr__(self) -> str:  # never a secret
        return f"LocalPoolInvoker(size={self.size}, log_dir={str(self.log_dir)!r})"

    @property
    def size(self) -> int:
        return len(self._workers)

    def _has_workers(self) -> bool:
        """A worker is alive or a lost one's replacement is still starting (it may yet come)."""
        with self._lock:
            return bool(self._workers) or self._starting > 0

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._workers]

    def _spawn(self, name: str) -> _Worker:
        log_path = self.log_dir / f"{name}.log"
        ready_r, ready_w = os.pipe()
        control_r, control_w = os.pipe()
        secret = secrets.token_urlsafe(32)
        # Pipe capacity is far above one line: this write never blocks, and the worker reads it
        # whenever it starts. The write end stays open: it is the worker's lifeline.
        os.write(control_w, f"{secret}\n".encode())
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(log_fd, f"--- {name} starting at {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
        # One thread until an activation says how many it may use (its share, set per
        # activation); MKL in its reproducible mode unless the user chose one.
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", RLHFLESS_THREADS="1",
                   PYTHONUNBUFFERED="1")
        env.setdefault("MKL_CBWR", MKL_REPRODUCIBLE)
        # torch's compile cache stays where it would be (it is kept across campaigns, not scratch)
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"torchinductor_{_user()}"))
        env["TMPDIR"] = str(self._tmp)
        argv = [sys.executable, "-m", "actions.runtime.server", "--host", "127.0.0.1", "--port", "0",
                "--ready-fd", str(ready_w), "--control-fd", str(control_r), "--parent-pid", str(os.getpid()),
                *self._limits]
        try:
            proc = self._forker.submit(subprocess.Popen, argv, pass_fds=(ready_w, control_r), env=env,
                                       stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd).result()
        except BaseException:
            os.close(control_w)
            os.close(ready_r)
            raise
        finally:
            for fd in (ready_w, control_r, log_fd):
                os.close(fd)
        with os.fdopen(ready_r) as fh:
            line = fh.readline()
        if not line.strip():
            os.close(control_w)
            proc.kill()
            proc.wait()
            raise RuntimeError(f"local worker {name} failed to start ({_exit_text(proc)}); see {log_path}")
        return _Worker(name, proc, int(line), secret, control_w, log_path)

    def _post(self, worker: _Worker, path: str, body: dict[str, Any], timeout: float | None = None) -> httpx.Response:
        """POST ``body`` to ``worker`` with a fresh request MAC; the reply only if its MAC is
        this worker's (else :class:`UnauthenticatedReply`)."""
        nonce, header = sign_request(worker.secret, "POST", path)
        resp = self._client.post(f"http://127.0.0.1:{worker.port}{path}", json=body, headers={"Authorization": header},
                                 **({"timeout": timeout} if timeout is not None else {}))
        if not reply_is_authentic(worker.secret, nonce, resp.status_code, resp.content, resp.headers.get(REPLY_HEADER)):
            raise UnauthenticatedReply(f"HTTP {resp.status_code} without worker {worker.name}'s MAC")
        return resp

    def _start_all(self, names: list[str]) -> None:
        """Start the named workers in parallel, one thread each, and wait for them all.

        Raises:
            RuntimeError: a worker did not start (the pool is closed first); it names how many
                failed and the first failure, with that worker's log.
            BaseException: Ctrl-C or SIGTERM's exception while waiting: the pool is closed and it
                propagates. The starts still running then fail without a word (a worker killed by
                the same signal is no error to report), and the command's one line stands alone.
        """
        failures: list[BaseException] = []

        def start(name: str) -> None:
            # never raised out of the thread: threading would print its traceback on stderr
            try:
                self._add(name)
            except BaseException as exc:  # noqa: BLE001 - reported below, or dropped once interrupted
                failures.append(exc)

        # daemons: a start that hangs (a worker that never writes its ready line) must not keep
        # an interrupted process alive at exit; its worker exits with the control pipe then
        threads = [threading.Thread(target=start, args=(name,), name=f"pool-start-{name}", daemon=True)
                   for name in names]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        except BaseException:
            self.close()
            raise
        if failures or len(self._workers) != len(names):
            self.close()
            first = f"; first: {one_line(str(failures[0]) or type(failures[0]).__name__, 300)}" if failures else ""
            raise PoolStartFailed(f"the local warm pool could not start all its workers ({len(failures)} of "
                               f"{len(names)} failed{first}); see the logs in {self.log_dir}")

    def _add(self, name: str) -> None:
        worker = self._spawn(name)
        try:
            self._post(worker, "/init", {"value": {"name": name}}).raise_for_status()
            with self._lock:
                if self._closing:  # close() has taken the list: a worker added now would outlive the pool
                    raise RuntimeError("the pool is closing")
                self._workers.append(worker)
        except BaseException:
            self._retire(worker)
            raise
        self._idle.put(worker)

    def invoke(self, action: str, payload: dict[str, Any], *, timeout_s: float | None = None) -> Activation:
        submitted = time.time()
        engine = request_engine(payload)
        worker = self._take_live(action, request_policy(payload), engine)
        started = time.time()
        activation_id = uuid.uuid4().hex
        try:
            with self.cores.share(action) as threads:
                body = {"value": {**payload, **Control(threads=threads).to_payload()},
                        "action_name": f"/local/rlhfless/{action}", "activation_id": activation_id,
                        "deadline": int((started + (timeout_s or self.timeout_s)) * 1000)}
                resp = self._post(worker, "/run", body, timeout_s or self.timeout_s)
            result = resp.json()
        except (httpx.TransportError, ValueError, UnauthenticatedReply) as exc:
            # the worker was held (and a platform would bill it) until the activation was lost
            lost = Activation(action=action, activation_id=activation_id, result={}, submitted_at=submitted,
                              started_at=started, ended_at=time.time(), busy_s=0.0, worker=worker.name)
            try:  # a dead worker's socket closes as it exits: give the exit a moment to be reaped
                worker.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            how = _exit_text(worker.proc)
            unreplaced = self._replace(worker)
            why = "a reply without its MAC: another process answers on its port" \
                if isinstance(exc, UnauthenticatedReply) else type(exc).__name__
            past_deadline = isinstance(exc, httpx.ReadTimeout)
            if past_deadline:  # the worker was killed for it: say which setting bounds it
                why += (f": no answer within invoker.timeout_s={timeout_s or self.timeout_s:g} s; raise "
                        "invoker.timeout_s if the action needs longer")
            short = f"; no worker replaces it ({unreplaced})" if unreplaced else ""
            # a retry needs a worker to run on: with none left it would wait for one forever. Past
            # the deadline, not retried (as the child and OpenWhisk invokers do): the same work
            # would run as long again, and four retries of a 600 s action are 40 minutes lost
            retry = not past_deadline and (unreplaced is None or (self._has_workers() and not self._closing))
            raise ActionError(action, f"worker {worker.name} was lost mid-activation ({how}; {why}){short}; "
                              f"worker log {worker.log_path}", transient=retry, activation_id=activation_id,
                              failed_attempts=(lost,)) from None
        worker.num_runs += 1
        worker.warm[action] = held_policy(action, payload, result) if isinstance(result, dict) else None
        meta = take_activation(result) if isinstance(result, dict) else {}
        ok = resp.status_code == 200 and isinstance(result, dict) and "error" not in result
        _note_engine(worker, meta, request_policy(payload) if ok and engine else None)
        self._idle.put(worker)
        ended = time.time()
        activation = Activation(action=action, activation_id=activation_id, result={}, submitted_at=submitted,
                                started_at=started, ended_at=ended, busy_s=float(meta.get("busy_s", ended - started)),
                                cold=bool(meta.get("cold", False)), worker=worker.name,
                                extra={"pid": meta.get("pid"), "image": meta.get("image")})
        if not isinstance(result, dict):
            raise ActionError(action, f"non-JSON-object result {one_line(repr(result), 200)}; worker log {worker.log_path}",
                              transient=False, activation_id=activation_id, failed_attempts=(activation,))
        if resp.status_code != 200 or "error" in result:
            raise self._failure(action, resp.status_code, result.get("error"), worker, activation)
        activation.result = result
        return activation

    def _take_live(self, action: str, policy: str | None, engine: str | None) -> _Worker:
        """An idle worker whose process is alive. One that died while idle (killed, out of
        memory) is replaced first, never sent the activation: that would fail as lost, spend a
        retry and bill an attempt no action ran, and several such deaths would fail the action
        while live workers sat idle.

        Raises:
            ActionError: not transient, when the pool has no worker left and none will come (a
                dead worker's replacement failed to start), also while this call waits.
        """
        while True:
            try:
                worker = self._idle.take(action, policy, engine)
            except NoWorkersLeft as exc:
                raise ActionError(action, f"the local pool has no worker left: {exc}", transient=False) from None
            if worker.proc.poll() is None:
                return worker
            how = _exit_text(worker.proc)
            unreplaced = self._replace(worker)
            if unreplaced is not None and not self._has_workers():
                raise ActionError(action, f"worker {worker.name} died while idle ({how}) and no worker replaces it "
                                  f"({unreplaced}); worker log {worker.log_path}", transient=False)

    @staticmethod
    def _failure(action: str, status: int, error: Any, worker: _Worker, spent: Activation) -> ActionError:
        """One line: what failed, how (crash type and message, or the refusal), and the log;
        ``spent`` is the failed activation's accounting."""
        where = f"worker log {worker.log_path}"
        ids = {"activation_id": spent.activation_id, "failed_attempts": (spent,)}
        if isinstance(error, dict):  # a crash the worker classified (actions.runtime.errors)
            return ActionError.from_crash(action, error, where, **ids)
        text = one_line(str(error)) if error is not None else "(no error message)"
        if status == 200:  # the action refused its input: an application error
            return ActionError(action, text, transient=False, **ids)
        return ActionError(action, f"HTTP {status}: {text}; {where}", transient=status in TRANSIENT_STATUS, **ids)

    def _replace(self, worker: _Worker) -> str | None:
        """Retire a lost worker and start another in its place: None, or why none started (the
        pool is closing, or the start failed; the pool goes on a worker short). Never raises, so
        the lost activation still fails as an :class:`ActionError` with its accounting."""
        self._retire(worker)
        with self._lock:
            self._workers = [w for w in self._workers if w is not worker]
            if self._closing:
                return "the pool is closing"
            self._starting += 1
        try:
            self._add(worker.name)
        except Exception as exc:  # noqa: BLE001 - reported in the lost activation's error
            why = one_line(str(exc) or type(exc).__name__, 300)
            with self._lock:
                self._starting -= 1
                # empty for good only with no worker left and none starting (two workers lost
                # at once: the other's replacement may still come up, and calls wait for it)
                empty = not self._workers and self._starting == 0
            if empty:  # a call waiting for an idle worker would wait forever
                self._idle.none_left(f"worker {worker.name} was lost and no worker replaces it ({why})")
            return why
        with self._lock:
            self._starting -= 1
        return None

    @staticmethod
    def _retire(worker: _Worker, grace_s: float = 0.0) -> None:
        """Stop a worker and reap it (a lost worker leaves no zombie behind)."""
        if worker.control_fd >= 0:
            os.close(worker.control_fd)
            worker.control_fd = -1
        if grace_s > 0:
            worker.proc.terminate()
            try:
                worker.proc.wait(timeout=grace_s)
                return
            except subprocess.TimeoutExpired:
                pass
        worker.proc.kill()
        worker.proc.wait()

    def prewarm(self, action: str, count: int, *, model: dict[str, Any] | None = None,
                decode: DecodeSettings = DecodeSettings()) -> int:
        """Workers are started warm; with ``model``, idle workers load that policy version now
        until ``count`` idle ones hold it (busy ones are skipped: never wait; one that holds it
        already gets no request). With ``decode.engine`` vllm they load it into their vLLM engine:
        every idle worker with a built engine gets the version pushed into it, and new engines
        start only on as many workers as ``count`` still lacks (``IdleWorkers.take_to_warm``).
        Engines are built with ``decode``'s settings. Returns how many loaded it."""
        if model is None or count <= 0:
            return 0
        policy = ref_policy(model)
        kind = "vllm" if decode.engine == "vllm" else None
        taken = self._idle.take_to_warm(action, policy, count, kind)
        body = {"value": Control(prewarm=True, prewarm_model=model, prewarm_decode=decode).to_payload(),
                "action_name": f"/local/rlhfless/{action}", "activation_id": uuid.uuid4().hex}

        def warm(worker: _Worker) -> bool:
            try:
                reply = self._post(worker, "/run", body, self.timeout_s).json()
                loaded = bool(reply.get("model_loaded"))
                if loaded:
                    worker.warm[action] = policy
                _note_engine(worker, take_activation(reply), policy if kind else None)
                return loaded
            except (httpx.TransportError, ValueError, UnauthenticatedReply):
                return False  # a lost worker shows up (and is replaced) on its next invocation
            finally:
                self._idle.put(worker, warmed=(kind or action, policy))

        threads = [threading.Thread(target=lambda w=w: results.append(warm(w)), daemon=True) for w in taken]
        results: list[bool] = []
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(results)

    def engines(self) -> dict[str, str | None]:
        """Worker name -> the generation engine built in it (``vllm``) or None."""
        with self._lock:
            return {w.name: w.engine for w in self._workers}

    def close(self) -> None:
        with self._lock:
            self._closing = True
            workers, self._workers = self._workers, []
        self._idle.close("the pool is closed")  # a call waiting for a worker fails instead of waiting forever
        for w in workers:
            os.close(w.control_fd)  # end-of-file on the control pipe: each worker exits by itself
            w.control_fd = -1
        for w in workers:
            self._retire(w, grace_s=5.0)
        self._client.close()
        self._forker.shutdown(wait=True)
        shutil.rmtree(self._tmp, ignore_errors=True)  # after every worker is reaped


def _user() -> str:
    """The user name torch's compile cache directory is named after (``torchinductor_<user>``)."""
    try:
        name = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        name = f"uid_{os.getuid()}"
    return re.sub(r'[\\/:*?"<>|]', "_", name)
