"""The planner's objective: no dominated plan, absolute units, the paper's min-max kept."""

import random
from dataclasses import replace

import pytest

from flows.planning.objective import choose, pareto_mask
from flows.planning.plan import Candidate, ClusterSpec
from flows.planning.tpot import GPUS, MODELS, roofline_profile
from flows.planning.scaling import BASELINE_N, default_value_of_time
from flows.planning.scaling import plan_generation as _plan_generation
from flows.planning.settings import PlannerSettings
from flows.planning.robust import held_budget
from flows.planning.timeline import prefill_seconds


def plan_generation(ids, predicted, *, group_size, prompt_lengths, prefill_tokens=None, **settings):
    """The planner with its settings given flat, as these tests vary them one at a time."""
    return _plan_generation(ids, predicted, group_size=group_size, prompt_lengths=prompt_lengths,
                            prefill_tokens=prefill_tokens, settings=PlannerSettings(**settings))


def _cand(n, t, cost, feasible=True):
    return Candidate(n, t, cost, cost, None, feasible, "" if feasible else "slow transfer")


def _dominated(c, cands):
    return any(o.feasible and o.time_s <= c.time_s and o.cost_usd <= c.cost_usd
               and (o.time_s < c.time_s or o.cost_usd < c.cost_usd) for o in cands)


@pytest.mark.parametrize("objective", ["budget", "value", "slack", "paper"])
def test_never_chooses_a_dominated_candidate(objective):
    """Property: over random candidate sets (ties, infeasible ones, clusters of near-equal
    points), the choice is feasible and no feasible candidate beats it on both axes."""
    rnd = random.Random(objective)
    for _ in range(400):
        k = rnd.randint(1, 30)
        grid = rnd.choice([None, 4])  # coarse values make exact ties likely
        cands = []
        for i in range(k):
            t, c = rnd.uniform(1, 10), rnd.uniform(1, 100)
            if grid:
                t, c = float(round(t / grid) * grid), float(round(c / grid) * grid)
            cands.append(_cand(i + 1, t, c, rnd.random() > 0.2))
        best, scores = choose(cands, objective, lam=rnd.random(),
                              value_of_time_usd_per_s=rnd.choice([0.0, 0.5, 8.0, 1e6]),
                              time_slack=rnd.choice([0.0, 0.05, 1.0]),
                              budget_usd=rnd.choice([0.0, 30.0, 60.0, 1e6]))
        if not any(c.feasible for c in cands):
            assert best is None and all(s is None for s in scores)
            continue
        chosen = cands[best]
        assert chosen.feasible and not _dominated(chosen, cands)
        assert all(s is None for s, keep in zip(scores, pareto_mask(cands)) if not keep)


def test_pareto_mask_matches_brute_force():
    rnd = random.Random(3)
    for _ in range(200):
        cands = [_cand(i, float(rnd.randint(1, 6)), float(rnd.randint(1, 6)), rnd.random() > 0.1)
                 for i in range(rnd.randint(1, 12))]
        assert pareto_mask(cands) == [c.feasible and not _dominated(c, cands) for c in cands]


def test_value_objective_prices_a_second_in_dollars():
    # 10 s for $20 against 9 s for $40: the faster plan saves 1 s for $20 more
    cands = [_cand(1, 10.0, 20.0), _cand(2, 9.0, 40.0)]
    assert choose(cands, "value", value_of_time_usd_per_s=19.0)[0] == 0
    assert choose(cands, "value", value_of_time_usd_per_s=21.0)[0] == 1
    assert choose(cands, "value", value_of_time_usd_per_s=0.0)[0] == 0  # cheapest
    assert choose(cands, "value", value_of_time_usd_per_s=1e9)[0] == 1  # fastest


def test_paper_objective_buys_a_small_gain_at_any_price_value_does_not():
    """The issue's example: 2% faster at twice the GPU-seconds wins under min-max lam = 0.7."""
    cands = [_cand(3, 10.0, 60.0), _cand(12, 9.8, 120.0)]
    assert choose(cands, "paper", lam=0.7)[0] == 1
    assert choose(cands, "value", value_of_time_usd_per_s=8.0)[0] == 0


def test_slack_objective_is_cheapest_within_the_slack_of_the_fastest():
    cands = [_cand(1, 12.0, 10.0), _cand(2, 10.4, 20.0), _cand(4, 10.0, 40.0)]
    assert choose(cands, "slack", time_slack=0.05)[0] == 1
    assert choose(cands, "slack", time_slack=0.0)[0] == 2
    assert choose(cands, "slack", time_slack=0.25)[0] == 0
    # the slack is (1 + s) x the fastest, not more: 10.6 s is outside 5% of 10 s (inside (1.05)^2)
    assert choose([_cand(1, 10.6, 10.0), _cand(2, 10.0, 20.0)], "slack", time_slack=0.05)[0] == 1


def test_budget_objective_is_fastest_within_the_budget_else_cheapest():
    cands = [_cand(1, 12.0, 10.0), _cand(2, 10.4, 20.0), _cand(4, 10.0, 40.0)]
    assert choose(cands, "budget", budget_usd=25.0)[0] == 1
    assert choose(cands, "budget", budget_usd=40.0)[0] == 2
    assert choose(cands, "budget", budget_usd=5.0)[0] == 0  # none within: the cheapest
    best, scores = choose(cands, "budget", budget_usd=25.0)
    assert scores == [12.0, 10.4, None]


def _step(seed=0, m=128):
    rnd = random.Random(seed)
    ids = list(range(m))
    pred = {i: float(min(2048, int(rnd.lognormvariate(5.8, 0.7)))) for i in ids}
    plen = {i: rnd.randint(30, 700) for i in ids}
    model = MODELS["qwen2.5-7b"]
    cluster = ClusterSpec(gpus_per_actor=2, max_actors=80, num_warm_actors=80,
                          weight_bytes=model.weight_bytes, kv_bytes_per_token=model.kv_bytes_per_token,
                          transfer_bandwidth_bytes_per_s=80e9, num_prefill_gpus=8)
    return ids, pred, dict(group_size=4, prompt_lengths=plen, policy="cost_aware", n_min=1,
                           n_max=64, lam=0.7, assignment="ranked",
                           profile=roofline_profile(GPUS["h100"], model, 2), cluster=cluster)


def test_planner_candidates_include_the_fixed_baseline_and_choice_is_on_the_frontier():
    for seed in range(3):
        ids, pred, kw = _step(seed)
        plan = plan_generation(ids, pred, objective="budget", **kw)
        kinds = {c.kind for c in plan.candidates}
        assert {"ranked", "sized", "round_robin", "striped"} <= kinds
        base = [c for c in plan.candidates if c.kind == "round_robin"]
        assert len(base) == 1 and base[0].n == BASELINE_N
        chosen = plan.candidates[plan.chosen]
        assert chosen.time_s == plan.predicted_time_s and chosen.n == plan.num_actors
        assert not _dominated(chosen, plan.candidates)
        plan.validate(ids)
        # objective budget: the fastest plan within the bill of 3 actors held for the striped
        # 3-actor plan's time (which is itself within it)
        striped3 = next(c for c in plan.candidates if c.kind == "striped" and c.n == 3)
        budget = held_budget(plan.candidates, 3, kw["cluster"], prefill_seconds(
            sum(kw["prompt_lengths"].values()), kw["profile"], kw["cluster"]))
        assert striped3.cost_usd <= budget and chosen.cost_usd <= budget
        assert chosen.time_s == min(c.time_s for c in plan.candidates
                                    if c.feasible and c.cost_usd <= budget)
        # objective value (the planner's default): the value of time is the prefill (learner)
        # GPUs' price
        plan = plan_generation(ids, pred, **kw)
        chosen = plan.candidates[plan.chosen]
        value = default_value_of_time(kw["cluster"])
        assert value == 8.0
        best = min(c.cost_usd + value * c.time_s for c in plan.candidates if c.feasible)
        assert chosen.cost_usd + value * chosen.time_s == pytest.approx(best)


def test_paper_objective_keeps_the_papers_candidates():
    ids, pred, kw = _step(1)
    plan = plan_generation(ids, pred, objective="paper", **kw)
    assert [c.n for c in plan.candidates] == list(range(1, 65))
    assert {c.kind for c in plan.candidates} == {"ranked"}


def test_value_of_time_moves_along_the_frontier():
    """More dollars per second buy a faster, dearer plan; never the other way round."""
    ids, pred, kw = _step(2)
    plans = [plan_generation(ids, pred, objective="value", value_of_time_usd_per_s=v, **kw)
             for v in (0.0, 4.0, 16.0, 1e4)]
    times = [p.predicted_time_s for p in plans]
    costs = [p.predicted_gpu_seconds for p in plans]
    assert times == sorted(times, reverse=True) and costs == sorted(costs)
    assert times[0] > times[-1]


def test_a_fan_outs_own_speed_times_its_candidates():
    """``decode_scale_by_n``: the candidates of N actors are timed as with a profile N's factor
    slower; the others are left as they are."""
    ids, pred, kw = _step(5)
    base = plan_generation(ids, pred, objective="value", **kw)
    scaled = plan_generation(ids, pred, objective="value", decode_scale_by_n=((2, 3.0),), **kw)
    slow = plan_generation(ids, pred, objective="value", **{**kw, "n_min": 2, "n_max": 2,
                                                            "profile": kw["profile"].with_decode_speed(1 / 3.0, "x3")})
    by_kind = {(c.n, c.kind): c for c in scaled.candidates}
    for c in base.candidates:
        if c.n != 2:
            assert (by_kind[c.n, c.kind].time_s, by_kind[c.n, c.kind].gpu_seconds) == (c.time_s, c.gpu_seconds)
    for c in slow.candidates:
        assert by_kind[2, c.kind].time_s == pytest.approx(c.time_s, rel=1e-9)
        assert by_kind[2, c.kind].gpu_seconds == pytest.approx(c.gpu_seconds, rel=1e-9)


@pytest.mark.parametrize("objective", ["budget", "value", "slack", "paper"])
def test_no_objective_picks_a_fan_out_its_measured_speed_makes_slower_and_dearer(objective):
    """Every fan-out above one decoding 40x slower than the profile (actions starved of cores):
    one actor is then faster and cheaper than any of them, and every objective takes it."""
    ids, pred, kw = _step(6)
    kw = {**kw, "n_max": 8, "cluster": replace(kw["cluster"], max_actors=8), "value_of_time_usd_per_s": 1e3}
    assert plan_generation(ids, pred, objective=objective, **kw).num_actors > 1
    starved = tuple((n, 40.0) for n in range(2, 9))
    assert plan_generation(ids, pred, objective=objective, decode_scale_by_n=starved, **kw).num_actors == 1


def test_a_bad_fan_out_speed_is_refused_with_the_field_named():
    ids, pred, kw = _step(0, m=8)
    with pytest.raises(ValueError, match=r"PlannerSettings.decode_scale_by_n: \[\(2, 0.0\)\]"):
        plan_generation(ids, pred, decode_scale_by_n=((2, 0.0),), **kw)
