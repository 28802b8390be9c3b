"""Event-driven model of one generation phase on a GPU cluster (PAPER §4.7, §3.4, §3.6).

Each actor decodes its live samples as one continuously batched group: per decode step every
live sample gains one token and the step takes ``TPOT(live, mean context)`` from the profile.
Between events (a sample finishing, an actor becoming ready or resuming after a re-prefill)
the batch is constant, so the clock jumps from event to event; the context of a segment is
taken at its midpoint (the same approximation as ``planning.cost``).

Modelled per actor (``ActorSpec``): when it is invoked (billing starts), when it can decode
(after prefill / cold start / weight + KV transfer, computed by the policy), whether it is
held until the end of the step (serverful) or released when its last sample finishes
(serverless). Cut-and-migrate (``tau``): when ``cut_point(n, tau)`` of the samples an actor
has held are done, its unfinished samples move to other running actors with free slots
(free slots = the samples an actor was planned for minus its live ones): all or nothing, otherwise the cut waits for slots (paper). A receiving actor pauses
to re-prefill the moved samples' prompt + generated tokens (token ids are shipped, not KV)
and the source is released at once. With ``continuation=True`` a cut that finds no slots
starts a fresh continuation actor instead, which pays the cold start (when not pre-warmed),
the weight transfer and the re-prefill, and accepts later cuts into its free slots.

Accounting: ``gpu_seconds`` = sum over actors of GPUs x (release - invoke) plus the prefill
actor's GPU-s and the pre-warm idle GPU-s passed in; ``busy`` = GPU-s spent decoding; idle
fraction = 1 - busy / billed.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from flows.planning.migrate import choose_destinations, should_cut
from flows.planning.profile import TpotProfile


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


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    profile: TpotProfile
    gpus_per_actor: int
    tau: float | None = None  # cut threshold; None = never cut
    continuation: bool = False
    cold_start_s: float = 0.0
    weight_transfer_s: float = 0.0
    spare_warm_actors: int = 0  # pre-warmed actors a continuation may use without cold start
    migration: str = "reprefill"  # 'reprefill' (ship token ids) | 'kv' (ship KV blocks)
    kv_transfer_s_per_token: float = 0.0  # for 'kv': KV bytes per token / bandwidth
    prefer: str = "most_free"  # destination order: 'most_free' | 'least_loaded'

    def __post_init__(self) -> None:
        if self.migration not in ("reprefill", "kv"):
            raise ValueError(f"migration={self.migration!r}: use 'reprefill' or 'kv'")
        if self.prefer not in ("most_free", "least_loaded"):
            raise ValueError(f"prefer={self.prefer!r}: use 'most_free' or 'least_loaded'")


@dataclass(frozen=True)
class PhaseResult:
    time_s: float
    gpu_seconds: float
    busy_gpu_seconds: float
    num_actors: int
    num_cut: int
    num_migrated: int

    @property
    def idle_fraction(self) -> float:
        return 0.0 if self.gpu_seconds <= 0 else max(0.0, 1.0 - self.busy_gpu_seconds / self.gpu_seconds)


@dataclass
class _Actor:
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


class _Phase:
    """Mutable state of one simulated phase."""

    def __init__(self, specs: list[ActorSpec], config: SimConfig) -> None:
        self.cfg = config
        self.tpot = config.profile.tpot_fn()
        self.samples = {s.sid: s for spec in specs for s in spec.samples}
        self.actors: list[_Actor] = []
        self.cuts = self.migrated = 0
        self.spare_warm = config.spare_warm_actors
        for spec in specs:
            actor = self._new_actor(spec.invoked_s, spec.ready_s, spec.holds_until_end,
                                    len(spec.samples))
            for s in spec.samples:
                actor.add(s)

    def _new_actor(self, invoked: float, ready: float, holds: bool, slots: int) -> _Actor:
        actor = _Actor(len(self.actors), invoked, ready, holds, slots)
        self.actors.append(actor)
        return actor

    def running(self) -> list[_Actor]:
        return [a for a in self.actors if a.released_s is None]

    def next_event(self, t: float) -> float:
        """Earliest time something changes; records each decoding actor's own next finish."""
        best = math.inf
        for a in self.running():
            if a.arriving:
                best = min(best, min(a.arriving)[0])
            if t < a.resume_s:
                best = min(best, a.resume_s)
            elif a.live:
                k = a.live[0][0] - a.progress
                a.ctx0 = a.ctx_base / len(a.live) + a.progress
                a.next_s = t + k * self.tpot(len(a.live), a.ctx0 + 0.5 * (k + 1.0))
                best = min(best, a.next_s)
        return best

    def advance(self, t: float, t_next: float) -> None:
        for a in self.running():
            if t < a.resume_s or not a.live:
                continue
            a.busy_s += t_next - t
            if t_next >= a.next_s:  # the actor's own event: land exactly on the finish mark
                a.progress = a.live[0][0]
                continue
            # interrupted: solve for the x tokens decoded in dt with TPOT linear in context
            # over the segment (t0 + slope * u at token u), so a segment cut into pieces costs
            # what the uninterrupted segment costs: x * (t0 + slope * x / 2) = dt
            b, dt, k = len(a.live), t_next - t, a.live[0][0] - a.progress
            t0 = self.tpot(b, a.ctx0 + 0.5)
            slope = (self.tpot(b, a.ctx0 + 0.5 + k) - t0) / k if k > 0 else 0.0
            if slope > 1e-15:
                x = (math.sqrt(t0 * t0 + 2.0 * slope * dt) - t0) / slope
            else:
                x = dt / t0
            a.progress = min(a.progress + x, a.live[0][0])

    def settle(self, t: float) -> None:
        """Land migrated samples, finish samples due at ``t``, then cut and release actors."""
        for a in self.running():
            landed = [x for x in a.arriving if x[0] <= t]
            a.arriving = [x for x in a.arriving if x[0] > t]
            for _, sid in sorted(landed):
                a.add(self.samples[sid])
            while a.live and a.live[0][0] <= a.progress + 1e-6:
                end, sid = heapq.heappop(a.live)
                a.take(self.samples[sid], end, end)
                a.finished += 1
        for a in self.running():
            if self.cfg.tau is not None and not a.holds and a.live and t >= a.resume_s:
                if should_cut(a.held, a.finished, self.cfg.tau):
                    self._try_cut(a, t)
        for a in self.running():
            if not a.live and not a.arriving and not a.holds and t >= a.resume_s:
                a.released_s = t

    def _free_slots(self, exclude: _Actor) -> dict[int, int]:
        return {a.aid: a.slots - len(a.live) - len(a.arriving) for a in self.running()
                if a is not exclude and not a.holds}

    def _preference(self, free: dict[int, int]) -> list[int] | None:
        if self.cfg.prefer == "most_free":
            return None  # choose_destinations' default
        return sorted(free, key=lambda aid: (len(self.actors[aid].live), aid))

    def _try_cut(self, src: _Actor, t: float) -> None:
        free = self._free_slots(src)
        moves = choose_destinations(len(src.live), free, self._preference(free))
        if moves is None and self.cfg.continuation:
            cont = self._start_continuation(t, max(len(src.live), src.slots))
            moves = {cont.aid: len(src.live)}
        if moves is None:
            return  # no free slots anywhere: the cut waits (PAPER §3.4)
        live = sorted(src.live)  # longest remaining last: deterministic order
        src.live = []
        for aid, count in sorted(moves.items()):
            dst = self.actors[aid]
            batch, live = live[:count], live[count:]
            tokens = 0.0
            for end, sid in batch:
                s = self.samples[sid]
                src.take(s, end, src.progress)
                tokens += s.prompt_len + s.decoded
                if self.cfg.migration == "kv":  # KV blocks over the network; no recompute
                    delay = (s.prompt_len + s.decoded) * self.cfg.kv_transfer_s_per_token
                    dst.arriving.append((t + delay, sid))
                else:
                    dst.add(s)
            if self.cfg.migration == "reprefill":
                # the destination recomputes prompt + generated tokens before decoding on
                dst.resume_s = max(dst.resume_s, t) + tokens / self.cfg.profile.prefill_tokens_per_s
        self.cuts += 1
        self.migrated += sum(moves.values())
        src.released_s = t

    def _start_continuation(self, t: float, slots: int) -> _Actor:
        """A fresh actor sized like the one it relieves; later cuts may join its free slots."""
        cold = 0.0 if self.spare_warm > 0 else self.cfg.cold_start_s
        self.spare_warm = max(0, self.spare_warm - 1)
        return self._new_actor(t, t + cold + self.cfg.weight_transfer_s, False, slots)


def simulate_phase(specs: list[ActorSpec], config: SimConfig, *, extra_gpu_seconds: float = 0.0,
                   extra_busy_gpu_seconds: float = 0.0) -> tuple[PhaseResult, list[Sample]]:
    """Run one generation phase to completion.

    Args:
        specs: the actors as the policy starts them.
        config: cluster and cut-and-migrate settings.
        extra_gpu_seconds: billed GPU-s outside the decode actors (prefill actor, pre-warm).
        extra_busy_gpu_seconds: part of the extra that is useful work (not idle).
    Returns:
        the phase totals and every sample with its per-actor decode record.
    """
    phase = _Phase(specs, config)
    t = 0.0
    phase.settle(t)
    while phase.running():
        t_next = phase.next_event(t)
        if t_next == math.inf:
            break  # only held (serverful) actors remain and none has work
        phase.advance(t, t_next)
        t = t_next
        phase.settle(t)
    end = max([t] + [a.released_s for a in phase.actors if a.released_s is not None])
    billed = busy = 0.0
    for a in phase.actors:
        release = end if a.holds or a.released_s is None else a.released_s
        billed += (release - a.spec_invoked) * config.gpus_per_actor
        busy += a.busy_s * config.gpus_per_actor
    result = PhaseResult(end, billed + extra_gpu_seconds, busy + extra_busy_gpu_seconds,
                         len(phase.actors), phase.cuts, phase.migrated)
    return result, list(phase.samples.values())
