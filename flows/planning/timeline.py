"""Timeline and cost of one generation phase for a candidate plan (paper §3.1, §3.6-3.8).

t = 0 is when the learner has written the new weights [I]:

- the prefill actor (the learner's ``num_prefill_gpus``) computes each unique prompt prefix's
  KV once: ``P = prefill_tokens / (prefill_tokens_per_s * prefill_gpus / gpus_per_actor)``
  (prefill is compute bound, so throughput scales with GPUs); the suffixes after the prefix
  are each decode actor's own work, in its decode time (``PlannerSettings.own_prefill_tokens``);
- decode actor 0 is co-located with it (same GPUs): no cold start, no transfer, decodes from P;
  so are actors 1..k-1 when ``colocated_actors = k`` (the prefill actor's GPUs hold k decode
  actors once prefill is done, as a hybrid engine shares the learner's GPUs);
- actor ``i >= 1`` (cold iff ``i >= num_warm_actors``) receives the weights, ``w = W / bw``,
  from t = 0 and its prompts' KV, ``kv_i = kv_bytes_per_token * sum(prompt_len) / bw``, after
  prefill: ``ready_i = max(cold_i + w, P) + kv_i + a``. The flow knows P, so it invokes the
  actor just in time, ``invoked_i = max(0, P - w - cold_i)``; the actor is billed from then
  until it finishes, plus ``prewarm_idle_s`` when it was pre-warmed (it waited warm);
- ``a = activation_s`` is every activation's fixed cost (invocation round trip, task
  submission): the prefill pays it once (it is in P, with ``prefill_fixed_s``: the prefill
  action's own fixed work), every decode actor once more, co-located ones too
  (``ready_0 = P + a``);
- an actor ends at ``ready_i + decode_i``;
- with ``max_concurrent_actors = m > 0`` (the local pool's workers) actor ``i >= m`` waits for
  the first of the running ones to end, ``q_i``: it is invoked at ``max(invoked_i, q_i)``, ready
  no sooner than that plus its start and transfers, and billed from then (a queued
  activation's wait is not billed). The other timings (``loads.slice_ends``, ``robust``) take
  every actor as started at once, which the sweep guarantees (``N <= max_actors <= m``) and
  only a fixed fan-out above the pool's workers breaks.

``T`` = latest actor end; ``GPU-s = P * prefill_gpus + sum_i billed_i * gpus_per_actor`` (the
paper's proxy, GPUs x invocation time [P §3.8]). Feasibility (§3.6, conservative as in the
paper, plus the cold start when an actor was not pre-warmed):
``cold_i + w + kv_i + decode_i <= P + decode_0`` for every ``i >= 1`` that has a start to hide,
``cold_i + w + kv_i > 0``: the check asks whether the transfers hide behind actor 0's work, so
a co-located actor, or a remote one with no cold start, weights or KV to receive, is not
checked (an actor longer than actor 0 there makes a slower plan, which the objective weighs,
not an infeasible one). It is made on the decode times given, or on ``point_decode`` (the
point estimate) where the planner passes stressed ones (``robust.py``), which answers that
question; a stressed tail may fall on any actor, actor 0 included.

The check applies only where a prefill action runs (``ClusterSpec.prefill_action``): it asks
whether the transfers hide behind the prefill window, and without a prefill action there is
none (P = 0), so any transfer would make equal slices of equal lengths infeasible. There the
timeline above already charges every transfer and start to the phase time and the bill, which
the objective weighs, so no candidate is infeasible and the planner never runs a plan another
candidate beats on both time and cost. With a prefill action the check stands (the paper's
constraint, as the simulator replays it): a plan that breaks it is not run even where its
estimate is faster and cheaper.

The simulator starts its actors with the same ``actor_start``, so plan and simulation agree
when predictions are exact.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple, Sequence

from flows.planning.plan import ClusterSpec
from flows.planning.tpot import TpotProfile


def prefill_seconds(tokens: float, profile: TpotProfile, cluster: ClusterSpec) -> float:
    """Prefill actor time: compute bound, so throughput scales with its GPU count; plus its
    activation's fixed cost and the prefill action's own. 0 without a prefill action
    (``ClusterSpec.prefill_action``)."""
    if not cluster.prefill_action:
        return 0.0
    return (tokens / (profile.prefill_tokens_per_s * cluster.prefill_gpus / cluster.gpus_per_actor)
            + cluster.activation_s + cluster.prefill_fixed_s)


class ActorStart(NamedTuple):  # a NamedTuple: built ~2000 times per planning sweep
    """When a decode actor is invoked (billing starts) and can decode, and its start costs."""

    invoked_s: float
    ready_s: float
    cold_s: float
    prewarm_idle_s: float  # billed seconds spent warm before the invocation
    transfer_s: float  # weights + KV


def actor_start(index: int, cluster: ClusterSpec, prefill_s: float,
                prompt_tokens: float) -> ActorStart:
    """Start-up timeline of decode actor ``index`` (the formulas in the module docstring)."""
    a = cluster.activation_s
    if index < cluster.colocated_actors:  # on the prefill actor's GPUs: no start, no transfer
        return ActorStart(prefill_s, prefill_s + a, 0.0, 0.0, 0.0)
    bw = cluster.transfer_bandwidth_bytes_per_s
    warm = index < max(cluster.num_warm_actors, 1)
    cold = 0.0 if warm else cluster.cold_start_s
    weights = cluster.weight_bytes / bw
    kv = cluster.kv_bytes_per_token * prompt_tokens / bw
    ready = max(cold + weights, prefill_s) + kv + a
    invoked = max(0.0, prefill_s - weights - cold)
    return ActorStart(invoked, ready, cold, cluster.prewarm_idle_s if warm else 0.0, weights + kv)


def evaluate_candidate(decode: Sequence[float], tokens: Sequence[float], cluster: ClusterSpec,
                       prefill_s: float, point_decode: Sequence[float] | None = None
                       ) -> tuple[float, float, str]:
    """(time_s, gpu_seconds, infeasibility reason or '') of one candidate.

    Args:
        decode: predicted decode seconds per actor, actor 0 first.
        tokens: prompt tokens per actor (sets its KV transfer).
        cluster: GPUs, bandwidth, warm pool.
        prefill_s: prefill actor time.
        point_decode: decode seconds the feasibility check uses (module docstring); default
            ``decode``.
    """
    check = decode if point_decode is None else point_decode
    c = cluster
    # actor_start is linear in the prompt tokens (only the KV transfer depends on them), so
    # take the zero-token start of a warm and a cold actor once and add each actor's KV time
    warm_count = max(c.num_warm_actors, 1)
    local = actor_start(0, c, prefill_s, 0.0)
    end0 = local.ready_s + decode[0]
    check0 = local.ready_s + check[0]
    t_max, billed, reason = end0, decode[0] + (local.ready_s - local.invoked_s), ""
    warm = actor_start(max(1, c.colocated_actors), c, prefill_s, 0.0)
    cold = actor_start(max(warm_count, c.colocated_actors), c, prefill_s, 0.0)
    kv_s_per_token = c.kv_bytes_per_token / c.transfer_bandwidth_bytes_per_s
    running = [end0] if c.max_concurrent_actors else []  # end times of the actors holding a worker
    for i in range(1, len(decode)):
        st = local if i < c.colocated_actors else warm if i < warm_count else cold
        kv = 0.0 if i < c.colocated_actors else kv_s_per_token * tokens[i]
        invoked, ready = st.invoked_s, st.ready_s + kv
        if c.max_concurrent_actors and len(running) >= c.max_concurrent_actors:  # queued until a worker frees
            invoked = max(invoked, heapq.heappop(running))
            ready = max(ready, invoked + st.cold_s + st.transfer_s + kv + c.activation_s)
        end = ready + decode[i]
        if c.max_concurrent_actors:
            heapq.heappush(running, end)
        if end > t_max:
            t_max = end
        billed += st.prewarm_idle_s + end - invoked
        start = st.cold_s + st.transfer_s + kv
        over = start + c.activation_s + check[i] - check0
        # nothing to hide without a start, nor behind without a prefill window (docstring)
        if over > 0 and start > 0 and c.prefill_action and not reason:
            reason = (f"actor {i}: start+transfer+decode exceeds prefill+decode of actor 0 "
                      f"by {over:.3f}s")
    return t_max, prefill_s * c.prefill_gpus + billed * c.gpus_per_actor, reason
