"""Data of the cluster simulator: samples, actor start-ups, settings, results, actor state."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from flows.planning.tpot import TpotProfile


@dataclass
class Sample:
    """One response: its prompt, true length and per-actor decode record (conservation)."""

    sid: int
    prompt_id: int
    prompt_len: int
    length: int
    decoded: float = 0.0
    segments: list[tuple[int, float]] = field(default_factory=list)  # (actor id, tokens)


@dataclass(frozen=True)
class ActorSpec:
    """How the policy starts one actor."""

    samples: tuple[Sample, ...]
    invoked_s: float
    ready_s: float
    holds_until_end: bool = False  # serverful: billed until the whole phase ends
    work_s: float = 0.0  # processor work after ready_s before the first decode step (live mode)
    cuttable: bool = True  # False: the plan gave this actor no cut point (migrate.plan_cut_points)


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """Cluster and cut-and-migrate settings of one simulated phase (see cluster.py)."""

    profile: TpotProfile
    gpus_per_actor: int
    cut_threshold: float | None = None  # cut threshold; None = never cut
    continuation: bool = False
    cold_start_s: float = 0.0
    weight_transfer_s: float = 0.0
    spare_warm_actors: int = 0  # pre-warmed actors a continuation may use without cold start
    migration: str = "reprefill"  # 'reprefill' (ship token ids) | 'kv' (ship KV blocks)
    kv_transfer_s_per_token: float = 0.0  # for 'kv': KV bytes per token / bandwidth
    prefer: str = "most_free"  # destination order: 'most_free' | 'least_loaded'
    shared_processors: int | None = None  # actors time-share this many processors (None: own)
    migrate_to_running: bool = True  # False: cut samples always go to a continuation (live flow)
    # Live-flow mode (cluster.py "Live flow"); every default leaves the cluster model unchanged.
    migrate_window_s: float | None = None  # batch cut samples into one continuation (flow window)
    submit_s: float = 0.0  # flow -> activation latency of a submitted task (continuation, score)
    activation_latency_s: float = 0.0  # a continuation's round-trip wait that uses no processor
    task_work_s: float = 0.0  # processor work of the flow + orchestrator per submitted action
    background_processors: float = 0.0  # processors other processes keep busy all along
    corun_slowdown: float = 0.0  # extra slowdown of each busy process per other busy processor
    continuation_work_s: float = 0.0  # processor work of a continuation before decoding: fixed
    continuation_work_s_per_token: float = 0.0  # ... and per re-prefilled token (prompt + generated)
    score_work_s: float = 0.0  # processor work of the score activation of a returned shard: fixed
    score_work_s_per_sample: float = 0.0  # ... and per finished sample it scores

    def __post_init__(self) -> None:
        if self.migration not in ("reprefill", "kv"):
            raise ValueError(f"migration={self.migration!r}: use 'reprefill' or 'kv'")
        if self.prefer not in ("most_free", "least_loaded"):
            raise ValueError(f"prefer={self.prefer!r}: use 'most_free' or 'least_loaded'")
        if self.migrate_window_s is not None and (not self.continuation or self.migrate_to_running):
            raise ValueError("migrate_window_s (live flow) needs continuation=True and migrate_to_running=False")


@dataclass(frozen=True)
class PhaseResult:
    """Totals of one phase: wall time (s), billed and decoding GPU-s, actors, cuts, moves."""

    time_s: float
    gpu_seconds: float
    busy_gpu_seconds: float
    num_actors: int
    num_cut: int
    num_migrated: int
    release_s: tuple[float, ...] = ()
    """When each actor returned (s), in start order: the planned actors, then continuations."""
    learner_gpu_seconds: float = 0.0
    """The learner's GPU-s not already in ``gpu_seconds`` (a whole step's: set by
    ``replay.execute_step``, 0 from ``simulate_phase``); ``gpu_seconds`` counts actors only."""

    @property
    def idle_fraction(self) -> float:
        if self.gpu_seconds <= 0:
            return 0.0
        return max(0.0, 1.0 - self.busy_gpu_seconds / self.gpu_seconds)


@dataclass
class ActorState:
    """Mutable decode state of one actor; a live sample finishes when ``progress`` reaches its
    end mark (all live samples gain one token per decode step)."""

    aid: int
    spec_invoked: float
    resume_s: float
    holds: bool
    slots: int
    live: list[tuple[float, int]] = field(default_factory=list)  # heap of (end mark, sid)
    arriving: list[tuple[float, int]] = field(default_factory=list)  # (time, sid) in flight
    start_mark: dict[int, float] = field(default_factory=dict)
    progress: float = 0.0  # tokens each live sample gained on this actor
    ctx_base: float = 0.0  # sum over live of (prompt_len + length - end mark)
    held: int = 0
    finished: int = 0
    released_s: float | None = None
    busy_s: float = 0.0
    ctx0: float = 0.0  # mean context of the live samples when the current segment started
    next_s: float = math.inf  # when the actor's next sample finishes if nothing intervenes
    cuttable: bool = True  # continuation actors run to completion
    work_left: float = 0.0  # processor work (s at full speed) left before decoding starts

    def add(self, s: Sample) -> None:
        end = self.progress + (s.length - s.decoded)
        heapq.heappush(self.live, (end, s.sid))
        self.start_mark[s.sid] = self.progress
        self.ctx_base += s.prompt_len + s.length - end
        self.held += 1

    def take(self, s: Sample, end: float, upto: float) -> None:
        """Credit ``s`` with the tokens decoded here up to mark ``upto`` and drop it."""
        tokens = upto - self.start_mark.pop(s.sid)
        s.decoded += tokens
        s.segments.append((self.aid, tokens))
        self.ctx_base -= s.prompt_len + s.length - end
