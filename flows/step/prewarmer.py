"""Firing the pre-warm of a live generation phase (paper §3.7); when is decided by
``planning.prewarm`` from the call history, this module only does the I/O.

At the step's start the flow arms a timer for ``PhasePlan.prewarm_offset_s``; when it fires,
the invoker warms as many generation containers as the plan has actors and makes each load
the step's policy version, so the generate activations that follow skip the weight load (with
``generation.engine: vllm``, into the container's running vLLM engine). On
the local pool the campaign also warms them as soon as training has published the version
(``prewarm_in_background``), while the step is committed and the next one starts. A
pre-warm is best effort: a failure is logged and the step goes on (the activation then pays
the start-up itself).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from actions.contracts import DecodeSettings
from flows.invokers.base import Invoker

log = logging.getLogger(__name__)

Slots = Callable[[int], contextlib.AbstractContextManager[int]]
"""Given how many containers a pre-warm wants, hold the GPU slots of those it may start and
yield their number (``invoke.spare_gpu_slots``); by default all of them, holding nothing."""


def _all(count: int) -> contextlib.AbstractContextManager[int]:
    return contextlib.nullcontext(count)


class PhasePrewarmer:
    """One armed pre-warm; ``report()`` says whether and when it fired (seconds from ``t0``)
    and how long it took (``prewarm/duration_s``, from firing until the invoker's ``prewarm``
    returned, its containers loaded: the next plan fires that much earlier)."""

    def __init__(self, invoker: Invoker, *, t0: float, offset_s: float | None, action: str, count: int,
                 model: dict[str, Any], decode: DecodeSettings = DecodeSettings(), slots: Slots = _all) -> None:
        self.t0 = t0
        self.offset_s = offset_s
        self.fired_s: float | None = None
        self.duration_s: float | None = None
        self.started = 0
        self._timer: threading.Timer | None = None
        if offset_s is None or count < 1:
            return

        def fire() -> None:
            fired = time.time()
            self.fired_s = fired - t0
            self.started = _prewarm(invoker, action, count, model, decode, slots)
            self.duration_s = time.time() - fired

        self._timer = threading.Timer(max(0.0, offset_s - (time.time() - t0)), fire)
        self._timer.daemon = True
        self._timer.start()

    def report(self) -> dict[str, float]:
        """Cancel the pre-warm if it has not fired yet, wait for one in flight, and report."""
        if self._timer is not None:
            self._timer.cancel()  # no effect once fired; join then waits for it to finish
            self._timer.join(timeout=60)
        return {"prewarm/offset_s": -1.0 if self.offset_s is None else self.offset_s,
                "prewarm/fired_s": -1.0 if self.fired_s is None else self.fired_s,
                "prewarm/duration_s": -1.0 if self.duration_s is None else self.duration_s,
                "prewarm/started": float(self.started)}


def prewarm_in_background(invoker: Invoker, action: str, count: int, model: dict[str, Any],
                          decode: DecodeSettings = DecodeSettings()) -> threading.Thread:
    """Start loading ``model`` into ``count`` idle ``action`` workers now (into the engine
    ``decode`` describes: ``Invoker.prewarm``), on a thread, and return the thread (join it
    before closing the invoker). Best effort, like ``PhasePrewarmer``."""

    thread = threading.Thread(target=_prewarm, args=(invoker, action, count, model, decode),
                              name=f"prewarm-{action}", daemon=True)
    thread.start()
    return thread


def _prewarm(invoker: Invoker, action: str, count: int, model: dict[str, Any],
             decode: DecodeSettings = DecodeSettings(), slots: Slots = _all) -> int:
    """``invoker.prewarm`` of as many of ``count`` containers as ``slots`` allows, holding
    their GPU slots until it returns; best effort: a failure is logged, never raised (0
    started)."""
    try:
        with slots(count) as allowed:
            if allowed < count:
                log.info("pre-warm of %s: %d of %d containers (the GPU limit's free slots)", action, allowed, count)
            return invoker.prewarm(action, allowed, model=model, decode=decode) if allowed else 0
    except Exception as exc:  # never fail a step or the campaign for a pre-warm
        log.warning("pre-warm of %s failed: %s", action, exc)
        return 0
