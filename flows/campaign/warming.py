"""Pre-warm on the local pool: the generation workers load the policy before it is needed.

Before the first step each of the pool's workers loads the policy and the generation code, so
the first step's activations start warm; after each step the next step's workers load the
version just trained while the step is committed and the next step's flow run starts. (The
later steps' pre-warm of new activations is planned from the call history by the planner,
``flows/planning/prewarm.py``, and fired by ``flows/step/prewarmer.py``.)
"""

from __future__ import annotations

import threading
from typing import Any

from actions.contracts import DecodeSettings
from flows.config import CampaignConfig
from flows.invokers.base import Invoker
from flows.step.prewarmer import prewarm_in_background


class PoolWarming:
    """The campaign's pre-warm of its local pool (a no-op on other invokers, and with
    ``scaling.prewarm: false``, which asks for no pre-warm of any kind)."""

    def __init__(self, cfg: CampaignConfig, invoker: Invoker, num_workers: int) -> None:
        self.on = cfg.invoker.kind == "local" and cfg.scaling.prewarm
        self.invoker, self.num_workers = invoker, num_workers
        self.decode = DecodeSettings.of(cfg.generation)
        self.thread: threading.Thread | None = None  # the next step's policy, loading in generation workers

    def before_first_step(self, model: dict[str, Any]) -> None:
        """Every worker loads ``model`` (a ``ModelRef`` as JSON) now, synchronously. A vLLM
        engine costs seconds and a KV cache each: the version goes into the engines set-up
        built (the profile's, the evaluation's), and one starts only where there is none."""
        if self.on:
            self.invoker.prewarm("generate", self.num_workers if self.decode.engine == "torch" else 1, model=model,
                                 decode=self.decode)

    def before_next_step(self, fan_out: int, model: dict[str, Any]) -> None:
        """``fan_out`` workers load ``model`` in the background."""
        if self.on:
            self.thread = prewarm_in_background(self.invoker, "generate", fan_out, model, self.decode)

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
