"""The ``budget`` objective with pre-warm idle billed (``robust.held_budget``): its limit is the
fixed allocation's bill, which waits pre-warmed for nothing, so a plan whose remote actors
each bill ``prewarm_idle_s`` of waiting is held to what the allocation costs, in the planner's
estimate and in the replay."""

from __future__ import annotations

import dataclasses
import random

import pytest
from sim_cluster import qwen_cluster

from flows.planning.plan import ClusterSpec
from flows.planning.robust import held_budget
from flows.planning.scaling import plan_generation
from flows.planning.settings import PlannerSettings
from flows.planning.timeline import prefill_seconds
from flows.planning.tpot import GPUS, MODELS, roofline_profile
from flows.simulate.replay import PromptRow, TraceStep, replay

QWEN = MODELS["qwen2.5-7b"]
PROFILE = roofline_profile(GPUS["h100"], QWEN, 8)
# 8 GPUs an actor on 8-GPU nodes: only actor 0 runs on the learner node's GPUs, so a plan of 3
# actors has 2 remote ones, each billing its pre-warm wait on 8 GPUs
CLUSTER = ClusterSpec(gpus_per_actor=8, max_actors=20, num_warm_actors=20, weight_bytes=QWEN.weight_bytes,
                      kv_bytes_per_token=QWEN.kv_bytes_per_token, transfer_bandwidth_bytes_per_s=320e9,
                      num_prefill_gpus=8, colocated_actors=1, prewarm_idle_s=5.0)


def _step(seed: int, m: int = 96) -> tuple[list[int], dict[int, float], dict[int, int]]:
    rnd = random.Random(seed)
    ids = list(range(m))
    return (ids, {i: float(min(2048, int(rnd.lognormvariate(5.5, 0.6)))) for i in ids},
            {i: rnd.randint(60, 400) for i in ids})


@pytest.mark.parametrize("seed", range(3))
def test_the_budget_is_the_held_allocation_without_pre_warm_idle(seed):
    ids, pred, plen = _step(seed)
    settings = PlannerSettings(policy="cost_aware", n_min=1, n_max=16, lam=0.7, assignment="ranked",
                               profile=PROFILE, cluster=CLUSTER, objective="budget")
    plan = plan_generation(ids, pred, group_size=4, prompt_lengths=plen, settings=settings)
    prefill_s = prefill_seconds(sum(plen.values()), PROFILE, CLUSTER)
    budget = held_budget(plan.candidates, 3, CLUSTER, prefill_s)
    # the allocation never waits pre-warmed: its bill is the same whatever the serverless wait
    assert budget == held_budget(plan.candidates, 3, dataclasses.replace(CLUSTER, prewarm_idle_s=0.0), prefill_s)
    chosen = plan.candidates[plan.chosen]
    assert chosen.cost_usd <= budget * (1 + 1e-12)
    # the striped 3-actor plan pays its two remote actors' wait on top of the allocation's bill
    striped3 = next(c for c in plan.candidates if c.kind == "striped" and c.n == 3)
    assert striped3.cost_usd > budget
    assert chosen.n < 3


def _trace(seed: int, steps: int = 4, prompts: int = 48) -> list[TraceStep]:
    rnd = random.Random(seed)
    lens = {i: rnd.lognormvariate(5.5, 0.6) for i in range(prompts)}  # a prompt's typical length, kept by epoch
    out = []
    for k in range(steps):
        rows = tuple(PromptRow(i, rnd.randint(60, 400), int(lens[i]),
                               tuple(min(1024, max(1, int(lens[i] * rnd.lognormvariate(0.0, 0.3))))
                                     for _ in range(4)))
                     for i in range(prompts))
        out.append(TraceStep(k, k, rows, max_new_tokens=1024))
    return out


@pytest.mark.parametrize("seed", range(2))
def test_replayed_rlhfless_bills_no_more_than_static_3_with_pre_warm_idle(seed):
    """``--prewarm-idle-s 5 --gpus-per-actor 8``: a 3-actor rlhfless plan bills 2 x 5 s x 8 GPUs
    of waiting each step, far above what static:3 bills for the whole phase; the budget keeps
    rlhfless at or under static:3's GPU-s (it had billed 5x static:3's on the gsm8k trace)."""
    model = qwen_cluster(profile=roofline_profile(GPUS["h100"], QWEN, 8), num_nodes=20, gpus_per_actor=8,
                         bandwidth_bytes_per_s=320e9, prewarm_idle_s=5.0, n_max=16)
    runs = replay(_trace(seed), ["static:3", "rlhfless"], model)
    static, ours = (runs[name].summary()["generation"]["gpu_seconds"] for name in ("static:3", "rlhfless"))
    assert ours <= static, (ours, static)
    # without the wait the same budget buys the 3-actor plans (the limit is unchanged by it)
    free = replay(_trace(seed), ["rlhfless"], dataclasses.replace(model, prewarm_idle_s=0.0))["rlhfless"]
    assert max(free.planned) >= 2
