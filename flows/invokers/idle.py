"""Which idle worker of the local pool takes an activation: the one whose warm state it can use.

A worker keeps what its activations loaded (``actions/models/warm.py``): the policy version a
generation or a pre-warm read, and after a training step the model and optimizer state it just
published. An activation that lands elsewhere reads them from the store again. So each worker
remembers, per action it ran, the policy version that left it holding (``warm``: the version a
training step published, else the version the request named), and an activation takes the idle
worker whose ``warm`` has its action at its version, then one that ran its action at all, then
the one idle longest (first in, first out) among those that ran an activation before, then
among fresh ones. A training step thus returns to the worker that
holds its optimizer state, and a generation to the worker pre-warmed for it, away from the
training worker. Which worker runs an activation never changes its result; this only saves loads.

A vLLM engine (``generation.engine: vllm``) costs seconds to start and is shared by the
process's generate and evaluate activations, which push each new version into it in place
(``actions/engines/factory.py``). So for a request that names ``engine: vllm`` a worker whose
vLLM engine is built comes first, whatever action built it: the one whose engine holds the
version, then any engine, and only then the policy-version rule above. A worker that merely
read the version (into a torch model) would start a second engine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

from pydantic import ValidationError

from actions.contracts import ModelRef, TrainStepResult
from actions.runtime.control import split_control

WARMING_WAIT_S = 30.0
"""Longest an activation waits for a pre-warm loading its policy version before it takes
another idle worker (and loads the version there itself)."""


class _HasWarmState(Protocol):
    warm: dict[str, str | None]  # action -> the policy version it left the worker holding
    engine: str | None  # the generation engine built in the worker ("vllm"), None: none
    engine_policy: str | None  # the policy version that engine holds


W = TypeVar("W", bound=_HasWarmState)


def ref_policy(ref: Any) -> str | None:
    """The policy version (manifest key) of a ``ModelRef`` as JSON; None for anything else."""
    try:
        return ModelRef.model_validate(ref).policy_key
    except ValidationError:
        return None


def request_policy(payload: Mapping[str, Any]) -> str | None:
    """The policy version a request reads: its ``model`` or ``policy`` ref, if it has one."""
    return next((key for field in ("model", "policy") if (key := ref_policy(payload.get(field)))), None)


def request_engine(payload: Mapping[str, Any]) -> str | None:
    """``vllm`` when a request runs on the vLLM engine (generate, evaluate, profile), else None."""
    return "vllm" if payload.get("engine") == "vllm" else None


def held_policy(action: str, payload: Mapping[str, Any], result: dict[str, Any]) -> str | None:
    """The version a worker holds after an activation: the one a training step published,
    else the one its request read."""
    if action == "train_step":
        try:
            return TrainStepResult.model_validate(split_control(result)[0]).policy_key
        except ValidationError:
            return None  # a failed step holds nothing reusable
    return request_policy(payload)


ENGINE_HOLDS_POLICY = 4
"""``affinity`` of a worker whose engine of the request's kind is built and holds its version."""


def affinity(worker: _HasWarmState, action: str, policy: str | None, engine: str | None = None) -> int:
    """With ``engine`` (``vllm``): 4 when the worker's engine of that kind holds ``policy``, 3
    when it is built at all. Then 2: the worker ran ``action`` and holds ``policy`` from it;
    1: it ran ``action``; else 0."""
    if engine is not None and worker.engine == engine:
        held = worker.engine_policy  # a policy version's key, not scaling.policy
        return ENGINE_HOLDS_POLICY if policy is not None and held == policy else 3
    if action not in worker.warm:
        return 0
    return 2 if policy is not None and worker.warm[action] == policy else 1


def _best(engine: str | None) -> int:
    """The affinity of a worker that holds the version ready to use."""
    return ENGINE_HOLDS_POLICY if engine is not None else 2


class NoWorkersLeft(RuntimeError):
    """A ``take`` from a pool that has no worker and will get none: why (the replacement's failure)."""


class IdleWorkers(Generic[W]):
    """The pool's idle workers; ``take`` blocks until one is idle.

    Workers out on a pre-warm (``take_to_warm``) are counted by what they are loading until
    ``put`` brings them back: an activation for that version waits for one of them (up to
    ``warming_wait_s``) rather than load it again on another worker beside the load in flight,
    and another pre-warm counts them as holding it. A pre-warm into an engine counts for every
    action that runs on that engine (generate and evaluate).
    """

    def __init__(self, warming_wait_s: float = WARMING_WAIT_S) -> None:
        self._workers: list[W] = []  # oldest put first
        self._cond = threading.Condition()
        self._warming: dict[tuple[str, str], int] = {}  # (engine or action, policy) -> workers loading it
        self.warming_wait_s = warming_wait_s
        self._none_left: str | None = None
        self._closed = False

    def none_left(self, why: str) -> None:
        """The pool has no worker and none will come (``why``): every ``take`` waiting, and every
        later one, raises :class:`NoWorkersLeft` instead of waiting for a worker forever."""
        with self._cond:
            self._none_left = why
            self._cond.notify_all()

    def close(self, why: str) -> None:
        """No worker is taken again (the pool is closing, ``why``): every ``take`` waiting, and
        every later one, raises :class:`NoWorkersLeft`; idle workers and those put back later
        are dropped (their owner retires them)."""
        with self._cond:
            self._closed = True
            self._workers.clear()
            self._none_left = why
            self._cond.notify_all()

    def put(self, worker: W, *, warmed: tuple[str, str | None] | None = None) -> None:
        """Return ``worker`` to the idle set; ``warmed``: the (engine or else action, policy) of
        the pre-warm it comes back from (its ``warm`` already says whether it loaded it)."""
        with self._cond:
            if warmed is not None and warmed[1] is not None:
                key = (warmed[0], warmed[1])
                self._warming[key] -= 1
                if not self._warming[key]:
                    del self._warming[key]
            if self._closed:
                return
            self._workers.append(worker)
            self._cond.notify_all()  # a taker may wait for this very worker

    def take(self, action: str, policy: str | None, engine: str | None = None) -> W:
        """The idle worker with the highest ``affinity``, the longest idle among equals; while
        none holds ``policy`` and a pre-warm is loading it, the worker loading it."""
        deadline = time.monotonic() + self.warming_wait_s
        with self._cond:
            while True:
                if self._none_left is not None and not self._workers:
                    raise NoWorkersLeft(self._none_left)
                left = deadline - time.monotonic()
                loading = policy is not None and (engine or action, policy) in self._warming and left > 0
                if self._workers and not (loading and not self._holder(action, policy, engine)):
                    return self._pick(action, policy, engine)
                self._cond.wait(timeout=left if loading else None)

    def take_nowait(self, action: str, policy: str | None, engine: str | None = None) -> W | None:
        """As ``take`` without waiting (for anything), or None when no worker is idle."""
        with self._cond:
            return self._pick(action, policy, engine) if self._workers else None

    def take_to_warm(self, action: str, policy: str | None, count: int, engine: str | None = None) -> list[W]:
        """Idle workers to load ``policy`` for ``action`` so that ``count`` workers hold it or
        are loading it, best ``affinity`` first (the longest idle among equals); never waits.
        Idle workers that hold it already stay idle: a load there would do nothing but keep
        the next activation off its best worker. With ``engine``, every idle worker whose
        engine of that kind is built but holds another version is taken too (a push in place
        costs little, and an engine left on an old version is one the next phase cannot use),
        and new engines are started only for what ``count`` still lacks.
        ``put`` each one back with ``warmed``."""
        with self._cond:
            best = _best(engine)
            score = [affinity(w, action, policy, engine) for w in self._workers]
            key = (engine or action, policy)
            ready = score.count(best) + (self._warming.get(key, 0) if policy is not None else 0)
            stale = [i for i in range(len(score)) if engine is not None and score[i] == best - 1]
            rest = sorted((i for i in range(len(score)) if score[i] < best - (engine is not None)),
                          key=lambda i: (-score[i], i))
            chosen = stale + rest[:max(0, count - ready - len(stale))]
            taken = [self._workers[i] for i in chosen]
            self._workers = [w for i, w in enumerate(self._workers) if i not in chosen]
            if taken and policy is not None:
                self._warming[key] = self._warming.get(key, 0) + len(taken)
            return taken

    def _holder(self, action: str, policy: str, engine: str | None) -> bool:
        return any(affinity(w, action, policy, engine) == _best(engine) for w in self._workers)

    def _pick(self, action: str, policy: str | None, engine: str | None) -> W:
        # Among equals, a request without an engine leaves the workers that hold one free for
        # the requests that need it (another engine would cost a start and a KV cache); then a
        # worker that ran anything before one that never did: its first activation imports torch
        # and the model code (~4 s of a CPU), so the campaign's set-up chain (prepare, warm-up,
        # profile, first evaluation) pays that once, not once per action.
        best = max(range(len(self._workers)),
                   key=lambda i: (affinity(self._workers[i], action, policy, engine),
                                  engine is not None or self._workers[i].engine is None,
                                  bool(self._workers[i].warm) or self._workers[i].engine is not None, -i))
        return self._workers.pop(best)

    def __len__(self) -> int:
        with self._cond:
            return len(self._workers)
