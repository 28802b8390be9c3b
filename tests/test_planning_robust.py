"""Planning for prediction error: the robust tail per actor, striped candidates, the budget."""

import dataclasses
import math
import random

import numpy as np
import pytest

from flows.planning.assignment import assign_round_robin, rank_prompts
from flows.planning.cost import DecodeEstimator, decode_time
from flows.planning.plan import ClusterSpec
from flows.planning.robust import MeasuredError, TailModel, held_budget, striped_layout, tail_stress
from flows.planning.scaling import plan_generation
from flows.planning.settings import PlannerSettings
from flows.planning.timeline import evaluate_candidate, prefill_seconds
from flows.planning.tpot import GPUS, MODELS, roofline_profile

QWEN = MODELS["qwen2.5-7b"]
PROFILE = roofline_profile(GPUS["h100"], QWEN, 2)
CLUSTER = ClusterSpec(gpus_per_actor=2, max_actors=80, num_warm_actors=80,
                      weight_bytes=QWEN.weight_bytes, kv_bytes_per_token=QWEN.kv_bytes_per_token,
                      transfer_bandwidth_bytes_per_s=80e9, num_prefill_gpus=8, colocated_actors=4)


def _settings(**kw):
    args = dict(policy="cost_aware", n_min=1, n_max=64, lam=0.7, assignment="ranked",
                profile=PROFILE, cluster=CLUSTER, objective="budget")
    args.update(kw)
    return PlannerSettings(**args)


def _step(seed, m=128):
    rnd = random.Random(seed)
    ids = list(range(m))
    pred = {i: float(min(2048, int(rnd.lognormvariate(6.2, 0.6)))) for i in ids}
    plen = {i: rnd.randint(60, 700) for i in ids}
    return ids, pred, plen


def test_tail_stress_runs_each_actor_longest_group_to_the_top_alone():
    est = DecodeEstimator(PROFILE, 4, 8, 3000)
    decode = [est.time_desc([1500.0, 900.0], 300.0), est.time_desc([600.0, 500.0, 400.0], 200.0)]
    out = tail_stress(decode, [1500.0, 600.0], [300.0, 200.0], 1500.0, est.table[0])
    assert out[0] == decode[0]  # holds the top already
    # the second actor's longest group keeps going alone from 600 to 1500 tokens: one group
    # of 4 samples, the same as decoding that slice with its longest group at 1500
    alone = decode_time([1500.0] * 4 + [500.0] * 4 + [400.0] * 4, 200.0, PROFILE)
    assert out[1] == pytest.approx(alone, rel=0.02) and out[1] > decode[1] * 1.5


def test_striped_layout_times_the_same_groups_as_assign_round_robin():
    sizes, perm = striped_layout(10, 3)
    groups = assign_round_robin(list(range(10)), 3)
    assert sizes == [len(g) for g in groups]
    assert [perm[sum(sizes[:a]):sum(sizes[:a + 1])] for a in range(3)] == [list(g) for g in groups]


@pytest.mark.parametrize("seed", range(4))
def test_robust_estimate_times_a_ranked_short_slice_as_possibly_long(seed):
    """A ranked actor holding only short predictions is timed to the step's longest one; the
    striped plan of the same N, whose actors each hold one of the longest, is not stretched."""
    ids, pred, plen = _step(seed)
    plan = plan_generation(ids, pred, group_size=4, prompt_lengths=plen, settings=_settings())
    paper = plan_generation(ids, pred, group_size=4, prompt_lengths=plen,
                            settings=_settings(objective="paper"))  # the point estimate
    point = {c.n: c for c in paper.candidates}
    robust = {c.n: c for c in plan.candidates if c.kind == "ranked"}
    striped = {c.n: c for c in plan.candidates if c.kind == "striped"}
    assert robust[1].time_s == pytest.approx(point[1].time_s)  # one actor holds the top
    for n in (2, 3, 4):
        assert robust[n].gpu_seconds > point[n].gpu_seconds  # short slices stretched and billed
    ranking = rank_prompts(ids, pred)
    for n in (2, 3, 4):  # every striped actor's longest is within the n longest predictions
        assert all(pred[g[0]] >= pred[ranking[n - 1]] for g in assign_round_robin(ranking, n))
    assert striped[3].time_s < robust[3].time_s


@pytest.mark.parametrize("seed", range(4))
def test_budget_plan_bills_within_the_held_allocation_and_is_not_slower(seed):
    ids, pred, plen = _step(seed)
    plan = plan_generation(ids, pred, group_size=4, prompt_lengths=plen, settings=_settings())
    chosen = plan.candidates[plan.chosen]
    prefill_s = prefill_seconds(sum(plen.values()), PROFILE, CLUSTER)
    budget = held_budget(plan.candidates, 3, CLUSTER, prefill_s)
    striped3 = next(c for c in plan.candidates if c.kind == "striped" and c.n == 3)
    assert chosen.cost_usd <= budget * (1 + 1e-12)
    assert chosen.time_s <= striped3.time_s
    # a larger allocation buys a faster (or equal) plan, a smaller one a cheaper (or equal) one
    big = plan_generation(ids, pred, group_size=4, prompt_lengths=plen, settings=_settings(budget_actors=6))
    small = plan_generation(ids, pred, group_size=4, prompt_lengths=plen, settings=_settings(budget_actors=1))
    assert big.predicted_time_s <= plan.predicted_time_s <= small.predicted_time_s
    assert small.predicted_gpu_seconds <= plan.predicted_gpu_seconds


def test_budget_without_a_striped_candidate_falls_back_to_the_same_size():
    ids, pred, plen = _step(0, m=16)
    plan = plan_generation(ids, pred, group_size=4, prompt_lengths=plen,
                           settings=_settings(assignment="round_robin", n_max=4))
    assert "striped" not in {c.kind for c in plan.candidates}
    prefill_s = prefill_seconds(sum(plen.values()), PROFILE, CLUSTER)
    assert plan.candidates[plan.chosen].cost_usd <= held_budget(plan.candidates, 3, CLUSTER, prefill_s)


# ---- the tail scaled by the predictor's measured error (MeasuredError, TailModel) ------------

def _error(sd, n=256, seed=0, cap=2048.0):
    rnd = random.Random(seed)
    return MeasuredError.of([100.0] * n, [100.0 * rnd.lognormvariate(0.0, sd) for _ in range(n)], cap)


def test_measured_error_sorts_and_validates():
    err = MeasuredError.of([100.0, 200.0, 0.0], [50.0, 400.0, 3.0], 2048.0)
    assert err.log_ratios == pytest.approx(sorted([math.log(0.5), math.log(2.0), math.log(3.0)]))
    with pytest.raises(ValueError, match="sorted"):
        MeasuredError((0.5, 0.1))
    with pytest.raises(ValueError, match="quantile"):
        MeasuredError((0.0,), quantile=1.0)
    with pytest.raises(ValueError, match="one of each"):
        MeasuredError.of([1.0], [])


@pytest.mark.parametrize("seed", range(3))
def test_tail_model_target_is_the_quantile_of_the_slice_longest_observed_group(seed):
    """Against sampling: each group observed as prediction x exp(error drawn from the sample)."""
    rnd = random.Random(seed)
    lengths = sorted((min(2048.0, rnd.lognormvariate(5.8, 0.7)) for _ in range(96)), reverse=True)
    err = _error(0.25, seed=seed)
    model = TailModel(lengths, err)
    slices = [(0, 1), (0, 12), (10, 40), (40, 96)]
    targets = model.contiguous([a for a, _ in slices], [b for _, b in slices])
    for (a, b), target in zip(slices, targets):
        draws = sorted(min(2048.0, max(x * math.exp(rnd.choice(err.log_ratios)) for x in lengths[a:b]))
                       for _ in range(4000))
        assert target == pytest.approx(draws[len(draws) // 2], rel=0.03)
    assert all(t <= 2048.0 * (1 + 1e-9) for t in targets)  # the generation cap
    # more groups, or a higher quantile, can only run longer
    assert targets[1] >= targets[0]
    high = TailModel(lengths, MeasuredError(err.log_ratios, err.max_length, quantile=0.9))
    assert all(h >= t for h, t in zip(high.contiguous([0, 40], [12, 96]), targets[[1, 3]]))


def test_tail_model_targets_the_cap_where_every_group_runs_past_it():
    # 300 and 60 tokens, observed at least e^2 = 7.4x longer: both pass the 400-token cap
    # whatever the draw, so every slice's longest group is at the cap (the grid has no width)
    model = TailModel([300.0, 60.0], MeasuredError((2.0, 2.5), 400.0, 0.5))
    assert model.contiguous([0, 1, 0], [1, 2, 2]) == pytest.approx([400.0] * 3, rel=1e-6)
    # one group, one error: the grid is the one point the group is observed at
    assert TailModel([115.0], MeasuredError((-1.0,), 400.0, 0.5)).contiguous([0], [1]) == pytest.approx(
        [115.0 * math.exp(-1.0)])


def test_tail_model_layouts_time_the_same_groups():
    rnd = random.Random(5)
    lengths = sorted((rnd.uniform(50, 1500) for _ in range(50)), reverse=True)
    model = TailModel(lengths, _error(0.2))
    for n, targets in zip((2, 3, 5), model.striped([2, 3, 5])):
        _, perm = striped_layout(len(lengths), n)
        positions = [list(range(a, len(lengths), n)) for a in range(n)]
        assert targets == pytest.approx(model.groups(positions))
        assert sorted(perm) == list(range(len(lengths)))
    starts, sizes = np.array([0, 7, 0, 20, 35]), np.array([7, 43, 20, 15, 15])
    parts = model.slices(starts, sizes, [2, 3])
    assert [len(p) for p in parts] == [2, 3]
    assert np.concatenate(parts) == pytest.approx(model.contiguous(starts, starts + sizes))


@pytest.mark.parametrize("seed", range(3))
def test_exact_predictions_stress_nothing_and_larger_errors_stretch_more(seed):
    ids, pred, plen = _step(seed)
    paper = plan_generation(ids, pred, group_size=4, prompt_lengths=plen,
                            settings=_settings(objective="paper"))  # the point estimate
    exact = plan_generation(ids, pred, group_size=4, prompt_lengths=plen,
                            settings=_settings(tail_error=MeasuredError((0.0,) * 64, 2048.0)))
    point = {c.n: c for c in paper.candidates}
    for c in exact.candidates:
        if c.kind == "ranked":
            assert c.time_s == pytest.approx(point[c.n].time_s)
    times = []
    for sd in (0.1, 0.3):
        plan = plan_generation(ids, pred, group_size=4, prompt_lengths=plen,
                               settings=_settings(tail_error=_error(sd, seed=seed)))
        times.append([c.time_s for c in plan.candidates])
        chosen = plan.candidates[plan.chosen]  # the budget objective's contract still holds
        prefill_s = prefill_seconds(sum(plen.values()), PROFILE, CLUSTER)
        budget = held_budget(plan.candidates, 3, CLUSTER, prefill_s)
        assert chosen.feasible and chosen.cost_usd <= budget * (1 + 1e-12)
        assert not any(o.feasible and o.time_s < chosen.time_s and o.cost_usd < chosen.cost_usd
                       for o in plan.candidates)
    assert all(b >= a * (1 - 1e-9) for a, b in zip(*times))
    assert sum(times[1]) > sum(times[0])


def test_feasibility_is_checked_on_the_point_estimate():
    """Actor 1's stressed tail running past actor 0 says nothing of whether its transfers (a
    remote actor here: the weights and its prompts' KV) hide behind actor 0's work, so the plan
    stays feasible when its point estimate ends within actor 0's."""
    remote = dataclasses.replace(CLUSTER, colocated_actors=1)
    assert evaluate_candidate([1.0, 3.0], [100.0, 100.0], remote, 0.5)[2]
    t, gs, reason = evaluate_candidate([1.0, 3.0], [100.0, 100.0], remote, 0.5, [1.0, 0.8])
    assert not reason and (t, gs) == evaluate_candidate([1.0, 3.0], [100.0, 100.0], remote, 0.5)[:2]
