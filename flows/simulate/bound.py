"""The critical-path floor of a generation phase: how fast any plan could run it in the replay.

No plan can end a generation phase before the step's slowest sample has been started and
decoded token by token. This module computes that floor with the simulator's own cost model:
the actor start-ups of ``policies.build_actors`` / ``timeline.actor_start`` and the decode
charge of ``cluster.simulate_phase`` (``cost.decode_time`` of a lone sample). The cheapest
version of each term, per sample of ``prompt_len`` prompt and ``length`` response tokens:

- start, serverful plans (``static:N``): the actor is invoked at t = 0 and first prefills its
  own prompts, at least this sample's: ``policies.serverful_ready_s(prompt_len)``;
- start, serverless plans (every other policy): no decode actor is ready before actor 0,
  co-located with the prefill actor, which prefills every prompt of the step first:
  ``timeline.actor_start(0, ...)`` after ``timeline.prefill_seconds(all prompt tokens)``;
  a remote actor, a continuation or a migrated sample starts later still;
- decode: the sample alone in its batch (batch 1) for all its tokens, at its own context:
  ``cost.decode_time([length], prompt_len)``, exactly what the simulator charges a lone
  sample; batch-shrink work, processor sharing and migration stalls only add to it.

A family's floor is the latest (start + decode) over the step's samples; the step's floor is
the smaller of the two families' (``PhaseFloor``).

Why no plan beats it: in ``simulate_phase`` a sample gains one token per decode step of the
actor that holds it, and a segment of k steps at batch b and mean context c costs
``k * TPOT(b, c + (k + 1) / 2)``. The floor holds for profiles in which a batch never steps
faster than a lone sample whose context is the batch's total, ``TPOT(b, c) >= TPOT(1, b * c)``
(the roofline's bytes and FLOPs both grow with b and b * c; KV-capacity waves only add), and
whose batch-1 row is convex in context (linear in the roofline): then every segment costs at
least the lone sample's steps, and their sum at least its single-segment charge (Jensen).

What it is not: a plan. It ignores cost (every long sample decoded alone needs many actors)
and whether the lengths are known in advance; it is the speed no plan can pass, not one a
plan reaches.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from flows.planning.cost import decode_time
from flows.planning.timeline import actor_start, prefill_seconds
from flows.simulate.policies import ClusterModel, serverful_ready_s
from flows.simulate.replay import TraceStep


class PhaseFloor(NamedTuple):
    """Smallest generation-phase time (s) any plan could have on one step, per plan family."""

    serverless_s: float  # no serverless plan (rlhfless, round-robin:N, ablations) ends sooner
    serverful_s: float  # no serverful plan (static:N) ends sooner

    @property
    def time_s(self) -> float:
        """No plan of either family ends sooner."""
        return min(self.serverless_s, self.serverful_s)


def phase_floor(step: TraceStep, model: ClusterModel) -> PhaseFloor:
    """The step's critical-path floor (module docstring): the latest (cheapest start + lone
    decode) over its samples, for serverless and for serverful plans.

    Args:
        step: the prompts of one step, with their true response lengths (tokens).
        model: the simulated cluster; its profile prices prefill and decode.
    Returns:
        per family, seconds from t = 0 (the new weights written) before which no plan can end
        the step's generation phase.
    """
    profile = model.profile
    solo = {(r.prompt_len, n): decode_time([n], r.prompt_len, profile)
            for r in step.prompts for n in set(r.response_lens)}
    cluster = model.cluster_spec()
    prefill_s = prefill_seconds(sum(r.prompt_len for r in step.prompts), profile, cluster)
    first_ready = actor_start(0, cluster, prefill_s, 0.0).ready_s
    serverless = first_ready + max(solo.values())
    serverful = max(serverful_ready_s(p, profile) + t for (p, _), t in solo.items())
    return PhaseFloor(serverless, serverful)


def max_speedup(base_times_s: Sequence[float], floors_s: Sequence[float]) -> float:
    """The most any plan could speed up the phases of a baseline that took ``base_times_s``
    (one per step), aggregated as the simulator aggregates speed: total baseline time over
    total time (here the floors' total)."""
    if len(base_times_s) != len(floors_s) or not floors_s:
        raise ValueError(f"{len(base_times_s)} baseline times, {len(floors_s)} floors: need one "
                         "of each per step, at least one step")
    if sum(floors_s) <= 0:  # phases with no work: no ratio to give (read_trace refuses such traces)
        raise ValueError(f"the phases' floors total {sum(floors_s)} s: a speed-up needs phases that take time "
                         "(prompts of at least one token)")
    return sum(base_times_s) / sum(floors_s)
