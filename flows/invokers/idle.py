"""Which idle worker of the local pool takes an activation: the one whose warm state it can use.

A worker keeps what its activations loaded (``actions/common/warm.py``): the policy version a
generation or a pre-warm read, and after a training step the model and optimizer state it just
published. An activation that lands elsewhere reads them from the store again. So each worker
remembers, per action it ran, the policy version that left it holding (``warm``: the version a
training step published, else the version the request named), and an activation takes the idle
worker whose ``warm`` has its action at its version, then one that ran its action at all, then
the one idle longest (first in, first out). A training step thus returns to the worker that
holds its optimizer state, and a generation to the worker pre-warmed for it, away from the
training worker. Which worker runs an activation never changes its result; this only saves loads.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

from pydantic import ValidationError

from actions.common.contracts import ModelRef, TrainStepResult, split_control


class _HasWarmState(Protocol):
    warm: dict[str, str | None]  # action -> the policy version it left the worker holding


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


def held_policy(action: str, payload: Mapping[str, Any], result: dict[str, Any]) -> str | None:
    """The version a worker holds after an activation: the one a training step published,
    else the one its request read."""
    if action == "train_step":
        try:
            return TrainStepResult.model_validate(split_control(result)[0]).policy_key
        except ValidationError:
            return None  # a failed step holds nothing reusable
    return request_policy(payload)


def affinity(worker: _HasWarmState, action: str, policy: str | None) -> int:
    """2: the worker ran ``action`` and holds ``policy`` from it; 1: it ran ``action``; else 0."""
    if action not in worker.warm:
        return 0
    return 2 if policy is not None and worker.warm[action] == policy else 1


class IdleWorkers(Generic[W]):
    """The pool's idle workers; ``take`` blocks until one is idle."""

    def __init__(self) -> None:
        self._workers: list[W] = []  # oldest put first
        self._cond = threading.Condition()

    def put(self, worker: W) -> None:
        with self._cond:
            self._workers.append(worker)
            self._cond.notify()

    def take(self, action: str, policy: str | None) -> W:
        """The idle worker with the highest ``affinity``, the longest idle among equals."""
        with self._cond:
            while not self._workers:
                self._cond.wait()
            return self._pick(action, policy)

    def take_nowait(self, action: str, policy: str | None) -> W | None:
        """As ``take``, or None when no worker is idle."""
        with self._cond:
            return self._pick(action, policy) if self._workers else None

    def _pick(self, action: str, policy: str | None) -> W:
        best = max(range(len(self._workers)), key=lambda i: (affinity(self._workers[i], action, policy), -i))
        return self._workers.pop(best)

    def __len__(self) -> int:
        with self._cond:
            return len(self._workers)
