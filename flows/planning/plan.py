"""Plain data of the generation planner: cluster description, candidates and the plan
(paper §3.5-3.6). Kept apart from ``scaling`` so user policies (``module:function``) can
build a ``GenerationPlan`` without importing the planner's internals; the planner's settings
are ``flows/planning/settings.py``."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """What the planner knows about the decode cluster."""

    gpus_per_actor: int
    """GPUs of every decode actor (G_i, equal for all actors as in the paper)."""
    max_actors: int
    """Cluster capacity in actors (total GPUs // gpus_per_actor)."""
    price_per_gpu_second: float = 1.0
    """rho; 1.0 makes cost_usd equal GPU-seconds (the paper's proxy)."""
    cold_start_s: float = 0.0
    """Start-up of an actor that is not pre-warmed (container + engine + weight load); live, on
    the vLLM engine, the engine start learned from the steps (``flows/planning/engine_starts.py``)."""
    num_warm_actors: int = 1
    """Pre-warmed actors (actor 0, co-located with the learner, is always warm); live, on the
    vLLM engine, the workers known to hold an engine."""
    weight_bytes: float = 0.0
    """Bytes of policy weights sent to every remote actor each step."""
    kv_bytes_per_token: float = 0.0
    """Prefix-KV bytes per prompt token sent from the prefill actor."""
    transfer_bandwidth_bytes_per_s: float = math.inf
    """Learner/prefill -> remote actor bandwidth (bytes/s, per actor)."""
    num_prefill_gpus: int = 0
    """GPUs of the prefill actor (the learner's); 0 means gpus_per_actor."""
    prewarm_idle_s: float = 0.0
    """Seconds a pre-warmed remote actor is billed while waiting to be invoked (the buffer)."""
    activation_s: float = 0.0
    """Fixed seconds every activation (the prefill and each decode actor) spends beyond its
    compute and transfers: the invocation's round trip and the flow's task submission. The
    live campaign measures it at start (``flows/campaign/live_profile.py``); 0 in the simulator, whose
    live-flow mode models these waits itself."""
    prefill_fixed_s: float = 0.0
    """Fixed seconds of the prefill activation beyond its compute and ``activation_s``: reading
    the policy, writing the prefix-KV bundle. Learned by the live campaign from its own steps
    (``flows/planning/calibration.py``); 0 in the simulator."""
    prefill_action: bool = True
    """False: no prefill action runs before the decode actors (``prefix.prefill_action_pays``
    found it costs more than it saves); each actor prefills its own prompts, so P = 0 and no
    prefix KV travels, and no candidate is infeasible (the §3.6 check needs a prefill window to
    hide transfers behind; ``timeline.py``). The actors' own prefill compute is part of their
    measured generation time, which the live calibration's decode scale follows."""
    colocated_actors: int = 1
    """Decode actors 0..k-1 run on the prefill actor's GPUs once prefill is done: they hold the
    weights and the prefix KV already (no cold start, no transfer). At most
    ``prefill_gpus // gpus_per_actor``; 1 is the paper's actor 0."""
    max_concurrent_actors: int = 0
    """Decode actors that run at once; 0: all of them (OpenWhisk starts a container for each).
    The local pool has this many workers and no container start: an actor beyond them waits in the
    queue for the first to finish and is billed from when it starts
    (``timeline.evaluate_candidate``)."""

    def __post_init__(self) -> None:
        checks = {"gpus_per_actor": self.gpus_per_actor >= 1, "max_actors": self.max_actors >= 1,
                  "price_per_gpu_second": self.price_per_gpu_second >= 0,
                  "cold_start_s": self.cold_start_s >= 0,
                  "num_warm_actors": self.num_warm_actors >= 0,
                  "transfer_bandwidth_bytes_per_s": self.transfer_bandwidth_bytes_per_s > 0,
                  "num_prefill_gpus": self.num_prefill_gpus >= 0,
                  "prewarm_idle_s": self.prewarm_idle_s >= 0,
                  "activation_s": self.activation_s >= 0,
                  "prefill_fixed_s": self.prefill_fixed_s >= 0,
                  "max_concurrent_actors": self.max_concurrent_actors >= 0,
                  "colocated_actors": 1 <= self.colocated_actors <= max(
                      1, (self.num_prefill_gpus or self.gpus_per_actor) // max(1, self.gpus_per_actor))}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"cluster.{name}={getattr(self, name)!r}: out of range "
                                 "(counts >= 1, times/prices >= 0, bandwidth > 0)")

    @property
    def prefill_gpus(self) -> int:
        return self.num_prefill_gpus or self.gpus_per_actor


@dataclass(frozen=True)
class Candidate:
    """One evaluated plan. ``score`` is the objective's value; None where the candidate is
    infeasible or dominated (``objective.py``)."""

    n: int
    time_s: float
    gpu_seconds: float
    cost_usd: float
    score: float | None
    feasible: bool
    reason: str = ""
    kind: str = ""
    """How the prompts are split: the assignment ('ranked', 'round_robin', 'contiguous'),
    'sized' (budget-sized ranked slices) or '' (a user policy's own)."""


@dataclass(frozen=True)
class GenerationPlan:
    """The planner's decision for one generation phase (logged as an artifact)."""

    policy: str
    num_actors: int
    assignments: tuple[tuple[int, ...], ...]
    """Prompt ids per actor; actor 0 (co-located with the learner) has the heaviest load."""
    predicted_time_s: float
    predicted_gpu_seconds: float
    candidates: tuple[Candidate, ...] = ()
    planning_ms: float = field(default=0.0, compare=False)  # wall clock, not part of the decision
    note: str = ""
    chosen: int | None = None
    """Index in ``candidates`` of the plan that was chosen (None: a user policy's plan)."""

    def to_dict(self) -> dict:
        out = asdict(self)
        out["assignments"] = [list(a) for a in self.assignments]
        out["candidates"] = [asdict(c) for c in self.candidates]
        return out

    def validate(self, prompt_ids: list[int] | tuple[int, ...]) -> None:
        """Raise ValueError unless every prompt is assigned exactly once to a non-empty actor."""
        flat = [pid for actor in self.assignments for pid in actor]
        if self.num_actors != len(self.assignments) or self.num_actors < 1:
            raise ValueError(f"plan.num_actors={self.num_actors} but {len(self.assignments)} "
                             "assignments; return one tuple of prompt ids per actor")
        if any(len(actor) == 0 for actor in self.assignments):
            raise ValueError("plan.assignments: an actor has no prompts; drop empty actors")
        if sorted(flat) != sorted(prompt_ids):
            raise ValueError("plan.assignments: must contain every prompt id exactly once")
