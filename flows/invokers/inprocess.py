"""In-process invoker: calls ``actions.<name>.main`` directly (unit tests, debugging).

It goes through the same JSON round trip as a real activation, so a payload that would not
survive OpenWhisk does not pass here either. An exception out of ``main`` is classified as the
runtime server classifies it (``actions.runtime.errors``): transient or permanent. One
activation runs at a time, with all of ``num_cores`` (``flows.invokers.cores``), and MKL in
the strict reproducible mode the pool's workers run in (``MKL_CBWR``, unless the user chose
one): MKL's default mode rounds some products differently (PPO's value head, a matrix-vector
product, differed in the last bits), so a campaign would end at other weights in process
than on the pool. MKL reads the mode at its first call, so the invoker must be made before
this process's first matrix product (the CLI sets the mode as it starts, before torch loads).
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
import uuid
from dataclasses import replace
from typing import Any

from actions.contracts import DecodeSettings
from actions.runtime.control import Control
from actions.runtime.errors import describe_crash
from flows.invokers.base import ActionError, Activation
from flows.invokers.cores import MKL_REPRODUCIBLE, available_cores


class InProcessInvoker:
    sees_local_files = True

    def __init__(self, num_cores: int = 0) -> None:
        # the actions' numerics of a pool worker (module docstring); no effect once MKL has run
        os.environ.setdefault("MKL_CBWR", MKL_REPRODUCIBLE)
        self.num_cores = num_cores or available_cores()
        self._lock = threading.Lock()  # actions assume one activation per container at a time
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def invoke(self, action: str, payload: dict[str, Any], *, timeout_s: float | None = None) -> Activation:
        wire = json.loads(json.dumps(payload))
        submitted = time.time()
        activation_id = uuid.uuid4().hex

        def spent(result: dict[str, Any]) -> Activation:
            ended = time.time()
            return Activation(action=action, activation_id=activation_id, result=result, submitted_at=submitted,
                              started_at=started, ended_at=ended, busy_s=ended - started, worker="inprocess")

        with self._lock:
            started = time.time()
            self.calls.append((action, wire))
            try:
                result = importlib.import_module(f"actions.{action}").main({**wire, **Control(threads=self.num_cores).to_payload()})
            except Exception as exc:  # a crashed action, classified as the runtime server does
                raise ActionError.from_crash(action, describe_crash(exc), activation_id=activation_id,
                                             failed_attempts=(spent({}),)) from exc
            activation = spent(result)
        activation.result = json.loads(json.dumps(result))
        if "error" in activation.result:
            raise ActionError(action, str(activation.result["error"]), transient=False, activation_id=activation_id,
                              failed_attempts=(replace(activation, result={}),))
        return activation

    def prewarm(self, action: str, count: int, *, model: dict[str, Any] | None = None,
                decode: DecodeSettings = DecodeSettings()) -> int:
        return 0  # this process is the only container, and it is always warm

    def close(self) -> None:
        pass
