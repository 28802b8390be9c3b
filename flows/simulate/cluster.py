"""Event-driven model of one generation phase on a GPU cluster (paper §4.7, §3.4, §3.6).

Each actor decodes its live samples as one continuously batched group: per decode step every
live sample gains one token and the step takes ``TPOT(live, mean context)`` from the profile.
Between events (a sample finishing, an actor becoming ready or resuming after a re-prefill)
the batch is constant, so the clock jumps from event to event; the context of a segment is
taken at its midpoint (the same approximation as ``planning.cost``).

Modelled per actor (``ActorSpec``): when it is invoked (billing starts), when it can decode
(after prefill / cold start / weight + KV transfer, computed by the policy), whether it is
held until the end of the step (serverful) or released when its last sample finishes
(serverless). Cut-and-migrate (``cut_threshold``): when ``cut_point(n, cut_threshold)`` of the samples an actor
has held are done, its unfinished samples move to other running actors with free slots
(free slots = the samples an actor was planned for minus its live and incoming ones), all or
nothing, filled most-free first (``prefer``); otherwise the cut waits for slots (paper). The
source is released at once. ``migration='reprefill'`` (default): token ids are shipped and the
destination pauses to recompute prompt + generated tokens at the prefill rate (an upper
bound: an engine with chunked prefill overlaps part of it with memory-bound decode).
``migration='kv'``: the KV blocks are shipped over the transfer bandwidth (the NCCL path the
prefill actor already uses) and the sample joins when they arrive; an actor with samples still
in flight to it is not cut until they have landed (a cut moves live rows only). With ``continuation=True``
a cut that finds no slots starts a continuation actor (what the live flow does), which accepts
later cuts into its free slots and is never cut itself (the live continuation action has no
cut point). It runs in the first container available: one released earlier in this phase
(warm, and already holding this step's weights: no start-up), else a spare pre-warmed one
(weight transfer), else a cold one (cold start + weight transfer); then the re-prefill.

``shared_processors = p`` models actors that share p processors instead of owning their
accelerators (the local warm pool: one thread per worker on a small CPU): while k > p actors
decode, each decodes at p / k of its profiled speed; and with ``corun_slowdown = c`` every busy
process runs ``1 + c * (min(k, p) - 1)`` times slower again (processors busy at once share memory
bandwidth and caches; ``bench_fidelity.py`` measures c).

Live flow (``migrate_window_s`` set; the local warm pool as ``flows/step/flow.py`` drives it;
every setting below defaults to off, leaving the cluster model above unchanged):

- an actor's ``ActorSpec.work_s`` is processor work it does after ``ready_s`` and before its
  first decode step (request parsing, dataset / KV-bundle reads, prefill, output write, result
  transfer: the activation's cost beyond the decode steps); it runs on the shared processors
  like a decoding actor (while k busy actors and jobs exceed p processors, each runs at p / k);
- a cut returns the action: its unfinished samples are batched, and ONE continuation action
  is submitted when the batching window (``migrate_window_s`` from the first cut sample) closes
  or no generation action that can be cut is still decoding (no more cut samples can come),
  whichever comes first; it starts ``submit_s``
  + ``activation_latency_s`` later (task submission; the invocation's round-trip waits, which
  use no processor) and first does ``continuation_work_s`` +
  ``continuation_work_s_per_token`` x (prompt + generated tokens) of processor work (request,
  re-prefill), then decodes; it is never cut;
- every returned action with finished samples starts a score activation ``submit_s`` later,
  ``score_work_s`` + ``score_work_s_per_sample`` x finished samples of processor work on the
  shared processors; it does not extend the phase (the flow's generation phase ends when the
  last generation action returns);
- every submitted action (primary, continuation, score) costs ``task_work_s`` of processor
  work in the flow and the orchestrator (Prefect task run, state updates) on the same
  processors, from its submission; these run one at a time, in submission order (the flow's
  engine shares one interpreter lock; the server one event loop), so they load at most one
  processor; ``background_processors`` is the load other processes (the idle orchestrator)
  keep on them all along.

Batch shrink: at a decode step where some of an actor's samples finish and others go on, the
actor first spends ``profile.shrink(batch, context)`` dropping them (the torch engine copies
its KV cache; 0 in roofline profiles and in profiles written before the field), as work
before its next decode step.

Accounting: ``gpu_seconds`` = sum over actors of GPUs x (release - invoke) plus the prefill
actor's GPU-s and the pre-warm idle GPU-s passed in; ``busy`` = GPU-s spent decoding; idle
fraction = 1 - busy / billed.
"""

from __future__ import annotations

import heapq
import math

from flows.planning import charges
from flows.planning.drain import ContinuationWindow
from flows.planning.migrate import choose_destinations, should_cut
from flows.simulate.actors import ActorSpec, ActorState, PhaseResult, Sample, SimConfig

__all__ = ["ActorSpec", "PhaseResult", "Sample", "SimConfig", "simulate_phase"]


class _Phase:
    """Mutable state of one simulated phase."""

    def __init__(self, specs: list[ActorSpec], config: SimConfig) -> None:
        self.cfg = config
        self.tpot = config.profile.tpot_fn()
        self.samples = {s.sid: s for spec in specs for s in spec.samples}
        self.actors: list[ActorState] = []
        self.cuts = self.migrated = 0
        self.spare_warm = config.spare_warm_actors
        self.released_warm = 0  # containers released in this phase: warm, this step's weights
        self.slow = 1.0  # TPOT multiplier of the current segment (processor sharing)
        self.jobs: list[list[float]] = []  # live mode: [start, work left] of score activations
        self.tasks: list[list[float]] = []  # live mode: [start, work left] of the flow, in order
        # live mode: cut samples waiting for their continuation (the flow's batching rule)
        self.window: ContinuationWindow[int] = ContinuationWindow(config.migrate_window_s or 0.0)
        self.returned: list[int] = []  # live mode: finished samples of actions returned just now
        for spec in specs:
            actor = self._new_actor(spec.invoked_s, spec.ready_s, spec.holds_until_end,
                                    len(spec.samples))
            actor.work_left = spec.work_s
            actor.cuttable = spec.cuttable
            for s in spec.samples:
                actor.add(s)
            if config.task_work_s > 0:  # the flow submits every planned action at its invocation
                self.tasks.append([spec.invoked_s, config.task_work_s])
        self.tasks.sort()

    def _new_actor(self, invoked: float, ready: float, holds: bool, slots: int) -> ActorState:
        actor = ActorState(len(self.actors), invoked, ready, holds, slots)
        self.actors.append(actor)
        return actor

    def running(self) -> list[ActorState]:
        return [a for a in self.actors if a.released_s is None]

    def next_event(self, t: float) -> float:
        """Earliest time something changes; records each decoding actor's own next finish."""
        best = math.inf
        cores = self.cfg.shared_processors
        if cores:  # processor sharing: more busy actors (and jobs) than processors slow each down
            active = sum(1 for a in self.running() if t >= a.resume_s and (a.live or a.work_left > 0))
            active += len(self._running_jobs(t)) + self.cfg.background_processors
            # beyond time sharing, processes busy at once contend for memory and caches
            corun = 1.0 + self.cfg.corun_slowdown * max(0.0, min(active, cores) - 1.0)
            self.slow = max(1.0, active / cores) * corun
        for a in self.running():
            if a.arriving:
                best = min(best, min(a.arriving)[0])
            if t < a.resume_s:
                best = min(best, a.resume_s)
            elif a.work_left > 0:  # start-up work before decoding (live mode)
                a.next_s = t + a.work_left * self.slow
                best = min(best, a.next_s)
            elif a.live:
                k = a.live[0][0] - a.progress
                a.ctx0 = a.ctx_base / len(a.live) + a.progress
                a.next_s = t + k * self.slow * self.tpot(len(a.live), a.ctx0 + 0.5 * (k + 1.0))
                best = min(best, a.next_s)
        for start, work in self.jobs + self.tasks[:1]:
            best = min(best, start if start > t else t + work * self.slow)
        if self.window.items and self.window.closes_at > t:
            best = min(best, self.window.closes_at)
        return best

    def advance(self, t: float, t_next: float) -> None:
        for job in self._running_jobs(t):
            job[1] -= (t_next - t) / self.slow
        for a in self.running():
            if t >= a.resume_s and a.work_left > 0:
                a.work_left = 0.0 if t_next >= a.next_s else a.work_left - (t_next - t) / self.slow
                continue
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
            t0 = self.slow * self.tpot(b, a.ctx0 + 0.5)
            slope = (self.slow * self.tpot(b, a.ctx0 + 0.5 + k) - t0) / k if k > 0 else 0.0
            if slope > 1e-15:
                x = (math.sqrt(t0 * t0 + 2.0 * slope * dt) - t0) / slope
            else:
                x = dt / t0
            a.progress = min(a.progress + x, a.live[0][0])

    def settle(self, t: float) -> None:
        """Land migrated samples, finish samples due at ``t``, then cut and release actors."""
        shrinks: list[tuple[ActorState, float]] = []  # (actor, seconds to drop its finished rows)
        for a in self.running():
            landed = [x for x in a.arriving if x[0] <= t]
            a.arriving = [x for x in a.arriving if x[0] > t]
            for _, sid in sorted(landed):
                a.add(self.samples[sid])
            if not a.live or a.live[0][0] > a.progress + 1e-6:
                continue  # no sample finishes here
            batch, context = len(a.live), a.ctx_base / len(a.live) + a.progress  # before the drop
            while a.live and a.live[0][0] <= a.progress + 1e-6:
                end, sid = heapq.heappop(a.live)
                a.take(self.samples[sid], end, end)
                a.finished += 1
            if a.live:
                shrinks.append((a, self.cfg.profile.shrink(batch, context)))
        self.jobs = [job for job in self.jobs if job[1] > 1e-12]
        self.tasks = [job for job in self.tasks if job[1] > 1e-12]
        for a in self.running():
            # not while KV is in flight to it: the cut moves live rows only, and rows still
            # arriving would be left behind on a released actor
            if (self.cfg.cut_threshold is not None and a.cuttable and not a.holds and a.live
                    and not a.arriving and t >= a.resume_s and a.work_left <= 0):
                if should_cut(a.held, a.finished, self.cfg.cut_threshold):
                    self._try_cut(a, t)
        for a, seconds in shrinks:  # an actor that was cut stops before shrinking (the engine)
            if a.released_s is None and a.live:
                a.work_left += seconds
        for a in self.running():
            if not a.live and not a.arriving and not a.holds and t >= a.resume_s:
                self._release(a, t)
        if self.window.items and self.window.due(  # (any() only when something waits: the hot path)
                t, cuttable_pending=any(a.cuttable and a.live for a in self.running())):
            self._start_batched_continuation(t)
        for finished in self.returned:  # after the continuation, in the flow's order
            work = self.cfg.score_work_s + self.cfg.score_work_s_per_sample * finished
            self.jobs.append([t + self.cfg.submit_s, work])
            if self.cfg.task_work_s > 0:
                self.tasks.append([t, self.cfg.task_work_s])
        self.returned = []

    def _running_jobs(self, t: float) -> list[list[float]]:
        """Score activations under way, and the flow's task work at the head of its queue (the
        flow process and the orchestrator each run one thing at a time: GIL, one event loop)."""
        return [job for job in self.jobs if job[0] <= t] + [job for job in self.tasks[:1] if job[0] <= t]

    def _release(self, a: ActorState, t: float) -> None:
        """The actor returns; in live mode the flow then submits the score of its finished
        samples (at the end of ``settle``, after a continuation submitted at the same moment)."""
        a.released_s = t
        self.released_warm += 1
        if a.finished and (self.cfg.score_work_s > 0 or self.cfg.score_work_s_per_sample > 0):
            self.returned.append(a.finished)

    def _start_batched_continuation(self, t: float) -> None:
        """Live flow: one continuation action for the batched cut samples, submitted now; it
        starts after the submission latency and the invocation's waits and does its start-up
        work (request, re-prefill of prompt + generated tokens) on the shared processors before
        decoding."""
        samples = [self.samples[sid] for sid in self.window.take()]
        tokens = sum(s.prompt_len + s.decoded for s in samples)
        actor = self._new_actor(t, t + self.cfg.submit_s + self.cfg.activation_latency_s, False, len(samples))
        actor.cuttable = False
        actor.work_left = self.cfg.continuation_work_s + self.cfg.continuation_work_s_per_token * tokens
        for s in samples:
            actor.add(s)
        if self.cfg.task_work_s > 0:
            self.tasks.append([t, self.cfg.task_work_s])

    def _free_slots(self, exclude: ActorState) -> dict[int, int]:
        return {a.aid: a.slots - len(a.live) - len(a.arriving) for a in self.running()
                if a is not exclude and not a.holds}

    def _preference(self, free: dict[int, int]) -> list[int] | None:
        if self.cfg.prefer == "most_free":
            return None  # choose_destinations' default
        return sorted(free, key=lambda aid: (len(self.actors[aid].live), aid))

    def _try_cut(self, src: ActorState, t: float) -> None:
        if self.cfg.migrate_window_s is not None:  # live flow: the action returns its cut samples
            cut = sorted(src.live)
            for end, sid in cut:
                src.take(self.samples[sid], end, src.progress)
            self.window.add((sid for _, sid in cut), t)
            self.cuts += 1
            self.migrated += len(src.live)
            src.live = []
            self._release(src, t)
            return
        free = self._free_slots(src) if self.cfg.migrate_to_running else {}
        moves = choose_destinations(len(src.live), free, self._preference(free))
        if moves is None and self.cfg.continuation:
            cont = self._start_continuation(t, max(len(src.live), src.slots))
            moves = {cont.aid: len(src.live)}
        if moves is None:
            return  # no free slots anywhere: the cut waits (paper §3.4)
        live = sorted(src.live)  # by (end mark, sample id): a deterministic order
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
                    move = charges.migration_s(s.prompt_len + s.decoded, "kv", self.cfg.profile,
                                               self.cfg.kv_transfer_s_per_token)
                    dst.arriving.append((t + move.delay_s, sid))
                else:
                    dst.add(s)
            if self.cfg.migration == "reprefill":
                # the destination recomputes prompt + generated tokens before decoding on
                move = charges.migration_s(tokens, "reprefill", self.cfg.profile,
                                           self.cfg.kv_transfer_s_per_token)
                dst.resume_s = max(dst.resume_s, t) + move.stall_s
        self.cuts += 1
        self.migrated += sum(moves.values())
        self._release(src, t)

    def _start_continuation(self, t: float, slots: int) -> ActorState:
        """An actor sized like the one it relieves, in the first container available (module
        docstring); later cuts may join its free slots, and it is never cut itself."""
        released, spare = self.released_warm > 0, self.released_warm <= 0 and self.spare_warm > 0
        self.released_warm -= released
        self.spare_warm -= spare
        start = charges.continuation_start_s(released_warm=released, spare_warm=spare,
                                             cold_start_s=self.cfg.cold_start_s,
                                             weight_transfer_s=self.cfg.weight_transfer_s)
        actor = self._new_actor(t, t + start, False, slots)
        actor.cuttable = False
        return actor


def simulate_phase(specs: list[ActorSpec], config: SimConfig, *,
                   extra_gpu_seconds: float = 0.0) -> tuple[PhaseResult, list[Sample]]:
    """Run one generation phase to completion.

    Args:
        specs: the actors as the policy starts them.
        config: cluster and cut-and-migrate settings.
        extra_gpu_seconds: billed GPU-s outside the decode actors (prefill actor, pre-warm
            waits); not decoding, so it counts as idle.
    Returns:
        the phase totals and every sample with its per-actor decode record.
    Raises:
        AssertionError: a sample did not finish (a lost row would under-report time and cost).
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
    _check_all_finished(phase.samples.values())
    end = max([t] + [a.released_s for a in phase.actors if a.released_s is not None])
    billed = busy = 0.0
    for a in phase.actors:
        release = end if a.holds or a.released_s is None else a.released_s
        billed += (release - a.spec_invoked) * config.gpus_per_actor
        busy += a.busy_s * config.gpus_per_actor
    result = PhaseResult(end, billed + extra_gpu_seconds, busy,
                         len(phase.actors), phase.cuts, phase.migrated,
                         tuple(end if a.released_s is None else a.released_s for a in phase.actors))
    return result, list(phase.samples.values())


def _check_all_finished(samples) -> None:
    """Every sample decoded to its length: the phase's totals cover all of its rows."""
    unfinished = [(s.sid, s.decoded, s.length) for s in samples if abs(s.decoded - s.length) > 1e-6]
    if unfinished:  # raised, not asserted: a lost row must stop the report even under -O
        raise AssertionError(f"{len(unfinished)} samples not finished (sid, decoded, length): {unfinished[:5]}")
