"""The generation engine's starts in the planner's cluster (``generation.engine: vllm``).

A worker with no vLLM engine (a local pool's process, an OpenWhisk container) builds one
before it decodes: the engine's own start and its KV cache, seconds on the CPU and 30 to 60 s
on a GPU with a real model (docs/vllm.md). A worker keeps its engine, and a vLLM request goes
to a worker whose engine is built first (``flows/invokers/idle.py``), so a phase's first
actions decode on the engines built before and only the actions beyond them start one. The
planner prices that as the cluster's cold start (``timeline.actor_start``): actor ``i >=
num_warm_actors`` pays ``cold_start_s`` before it decodes, with

* ``num_warm_actors``: the workers known to hold an engine, the widest fan-out a phase has run
  (a phase's actions start at once, each on a worker of its own) -- on OpenWhisk the
  campaign's (``Calibration.max_fan_out``: its containers outlive the flow's process), on the
  local pool this process's (its workers start with the process, so a resumed campaign's new
  pool holds none of the engines built before) -- at least the one the local pool pre-warms
  before the first step (``flows/campaign/warming.py``), at most the pool's workers;
* ``cold_start_s``: the engine start learned from the steps (``Calibration.engine_start_s``),
  ``DEFAULT_ENGINE_START_S`` before any is observed, plus the container's own start where a
  new worker is a new container (OpenWhisk: ``scaling.cold_start_s``).

So a fan-out within the engines built plans as before, and one beyond them pays a start for
each action past them, which is what makes it worth it or not. The count is what the steps
show, and the planner's state keeps it (``calibration_memory``), so a resumed campaign on
OpenWhisk plans as an uninterrupted one; it does not see an engine lost with its worker (a
crash, an OpenWhisk container reclaimed while idle), whose start comes unpriced once, nor one
built outside the steps (an evaluation's), whose start is priced and does not come; such a
phase gives the calibration no decode-speed reading where the start is a large share of it
(``flows/planning/calibration.py``).

The torch engine prices no start (its model is built from the warm cache in seconds, and every
worker loads it before the first step), nor does the in-process invoker, whose actions share
the flow process's one engine: ``PlannerRules.engine_starts`` is None there. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flows.planning.calibration import Calibration
from flows.planning.plan import ClusterSpec

DEFAULT_ENGINE_START_S = 30.0
"""Seconds of a vLLM engine start before a step has reported one: the low end of a GPU's with a
real model (docs/vllm.md; 18 s on the 2-core CPU box at set-up, 100-220 s there under load).
Until a start is observed, a fan-out beyond the engines built must save at least this much."""


@dataclass(frozen=True, kw_only=True)
class EngineStarts:
    """How a phase's actions pay an engine start (module docstring)."""

    workers: int
    """Workers the actions run on, each holding one engine at most (the pool's size)."""
    container_s: float = 0.0
    """A new worker's own start before its engine's: an OpenWhisk container's
    (``scaling.cold_start_s``); 0 on the local pool, whose workers start with it."""
    outlives_process: bool = False
    """The workers outlive the flow's process (OpenWhisk's containers): the campaign's widest
    fan-out holds an engine after a resume. False (the local pool, started by the process):
    only the widest fan-out this process ran does."""

    def __post_init__(self) -> None:
        if self.workers < 1 or self.container_s < 0:
            raise ValueError(f"engine starts: workers={self.workers}, container_s={self.container_s}: "
                             "workers must be >= 1 and container_s >= 0")

    def start_s(self, calibration: Calibration) -> float:
        """Seconds one engine start takes: learned, else ``DEFAULT_ENGINE_START_S``."""
        learned = calibration.engine_start_s
        return DEFAULT_ENGINE_START_S if learned is None else learned

    def warm_actors(self, calibration: Calibration, widest_here: int | None = None) -> int:
        """Actions that find an engine built: the widest fan-out run, in [1, workers] -- the
        campaign's (``calibration.max_fan_out``) where the workers outlive the process or
        ``widest_here`` is None, else ``widest_here``, the widest this process ran."""
        built = calibration.max_fan_out if self.outlives_process or widest_here is None else widest_here
        return max(1, min(self.workers, built))

    def cluster(self, cluster: ClusterSpec, calibration: Calibration, widest_here: int | None = None
                ) -> ClusterSpec:
        """``cluster`` whose actions beyond the warm engines (:meth:`warm_actors`) pay the
        container's and the engine's start."""
        return replace(cluster, cold_start_s=self.container_s + self.start_s(calibration),
                       num_warm_actors=self.warm_actors(calibration, widest_here))

    def priced_s(self, num_actors: int, cluster: ClusterSpec) -> float:
        """The engine start a plan of ``num_actors`` on ``cluster`` (:meth:`cluster`'s) timed
        on its actions past the warm ones (0: none starts one)."""
        if num_actors <= max(1, cluster.num_warm_actors, cluster.colocated_actors):
            return 0.0
        return cluster.cold_start_s - self.container_s
