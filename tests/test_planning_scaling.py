"""Cost-aware actor scaling and the feasibility check (paper §3.5-3.6)."""

import math
import re
import textwrap
from dataclasses import replace

import pytest

from flows.planning.plan import ClusterSpec, GenerationPlan
from flows.planning.scaling import plan_generation as _plan_generation
from flows.planning.settings import PlannerSettings
from flows.planning.tpot import TpotProfile


def plan_generation(ids, predicted, *, group_size, prompt_lengths, prefill_tokens=None, **settings):
    """The planner with its settings given flat, as these tests vary them one at a time."""
    return _plan_generation(ids, predicted, group_size=group_size, prompt_lengths=prompt_lengths,
                            prefill_tokens=prefill_tokens, settings=PlannerSettings(**settings))

IDS = list(range(12))
PRED = {i: float(100 + 60 * i) for i in IDS}  # prompt 11 longest
PLEN = {i: 50 for i in IDS}
# no batch benefit: TPOT is 10 ms whatever the batch and context
FLAT = TpotProfile((1, 1000), (0.0, 10000.0), ((0.01, 0.01), (0.01, 0.01)), 1e6)
# TPOT grows with batch: more actors are faster
LINEAR = TpotProfile((1, 1001), (0.0, 10000.0), ((0.011, 0.011), (1.011, 1.011)), 1e6)
CLUSTER = ClusterSpec(gpus_per_actor=2, max_actors=100)


def _plan(**kw):
    """The paper's objective and candidate set unless ``objective`` is given."""
    args = dict(group_size=4, prompt_lengths=PLEN, policy="cost_aware", n_min=1, n_max=8,
                lam=0.7, assignment="ranked", profile=LINEAR, cluster=CLUSTER, objective="paper")
    args.update(kw)
    return plan_generation(IDS, PRED, **args)


def test_lam_zero_is_cost_minimum_one_actor_without_batch_benefit():
    plan = _plan(lam=0.0, profile=FLAT)
    assert plan.num_actors == 1
    assert plan.predicted_gpu_seconds == min(c.gpu_seconds for c in plan.candidates)
    # one actor decodes until the longest prompt ends: 760 tokens * 10 ms * 2 GPUs
    # plus the prefill of 12 x 50 prompt tokens at 1e6 tokens/s on 2 GPUs
    assert plan.predicted_gpu_seconds == pytest.approx(760 * 0.01 * 2 + 600 / 1e6 * 2)


def test_lam_one_is_fastest_n_with_smaller_n_on_ties():
    plan = _plan(lam=1.0)
    fastest = min(c.time_s for c in plan.candidates)
    assert plan.predicted_time_s == fastest
    assert plan.num_actors == min(c.n for c in plan.candidates if c.time_s == fastest)
    # with a flat profile every N has the same time: the tie goes to N = 1
    assert _plan(lam=1.0, profile=FLAT).num_actors == 1


def test_assignment_is_ranked_heaviest_first():
    plan = _plan(policy="fixed:3")
    assert plan.assignments == ((11, 10, 9, 8), (7, 6, 5, 4), (3, 2, 1, 0))
    rr = _plan(policy="fixed:3", assignment="round_robin")
    assert rr.assignments == ((0, 3, 6, 9), (1, 4, 7, 10), (2, 5, 8, 11))
    static = _plan(policy="fixed:3", assignment="contiguous")  # the serverful baseline's split
    assert static.assignments == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11))
    ca = _plan(policy="cost_aware", assignment="round_robin", n_min=3, n_max=3)
    assert ca.assignments == ((0, 3, 6, 9), (1, 4, 7, 10), (2, 5, 8, 11))


def test_degenerate_range():
    plan = _plan(n_min=4, n_max=4)
    assert plan.num_actors == 4 and len(plan.candidates) == 1
    assert plan.candidates[0].score == 0.0  # zero range normalises to 0, not a division error


def test_n_is_capped_by_prompts_and_cluster():
    plan = _plan(n_min=1, n_max=50, cluster=ClusterSpec(gpus_per_actor=2, max_actors=5))
    assert max(c.n for c in plan.candidates) == 5
    assert max(c.n for c in _plan(n_max=50).candidates) == len(IDS)


def test_infeasible_transfer_rejected():
    # 3 GB of weights at 1 GB/s: 3 s of transfer, more than actor 0's decode lead at large N
    slow = ClusterSpec(gpus_per_actor=2, max_actors=100, weight_bytes=3e9,
                       transfer_bandwidth_bytes_per_s=1e9)
    plan = _plan(lam=1.0, cluster=slow)
    bad = [c for c in plan.candidates if not c.feasible]
    assert bad and all(c.score is None and "actor" in c.reason for c in bad)
    assert plan.candidates[plan.num_actors - 1].feasible
    assert plan.num_actors < min(c.n for c in bad)
    # nothing feasible: the smallest N is used and the plan says so
    none = _plan(lam=1.0, n_min=2, n_max=4, policy="cost_aware",
                 cluster=ClusterSpec(gpus_per_actor=2, max_actors=100, weight_bytes=1e12,
                                     transfer_bandwidth_bytes_per_s=1e9))
    assert none.num_actors == 2 and "no feasible" in none.note


def test_cold_actors_pay_start():
    warm = _plan(policy="fixed:3", cluster=ClusterSpec(gpus_per_actor=2, max_actors=9,
                                                       num_warm_actors=3, cold_start_s=5.0))
    cold = _plan(policy="fixed:3", cluster=ClusterSpec(gpus_per_actor=2, max_actors=9,
                                                       num_warm_actors=1, cold_start_s=5.0))
    # two cold remote actors: each +5 s billed on 2 GPUs
    assert cold.predicted_gpu_seconds == pytest.approx(warm.predicted_gpu_seconds + 2 * 5 * 2)


def test_deterministic_and_json():
    a, b = _plan(), _plan()
    assert a == b  # planning_ms is excluded from equality
    d = a.to_dict()
    assert d["num_actors"] == a.num_actors and isinstance(d["assignments"][0], list)
    assert len(d["candidates"]) == 8


def test_module_function_policy(tmp_path, monkeypatch):
    (tmp_path / "my_policy.py").write_text(textwrap.dedent("""
        from flows.planning.plan import GenerationPlan

        def two(prompt_ids, predicted, **kw):
            ids = list(prompt_ids)
            return GenerationPlan("mine", 2, (tuple(ids[:1]), tuple(ids[1:])), 1.0, 2.0)

        def broken(prompt_ids, predicted, **kw):
            return GenerationPlan("mine", 1, ((0,),), 1.0, 2.0)

        def flat(prompt_ids, predicted, **kw):
            return GenerationPlan("mine", 1, tuple(prompt_ids), 1.0, 2.0)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    plan = _plan(policy="my_policy:two")
    assert plan.num_actors == 2 and plan.assignments[0] == (0,)
    # the plan's fault is the function's: named, with the plan's complaint and the fix
    invalid = r"^scaling.policy='my_policy:broken' returned an invalid plan: plan.assignments: must contain"
    with pytest.raises(ValueError, match=invalid + r" every prompt id exactly once.*; fix the function$"):
        _plan(policy="my_policy:broken")
    with pytest.raises(ValueError, match=r"^scaling.policy='my_policy:flat' returned an invalid plan: .*; fix the "):
        _plan(policy="my_policy:flat")  # assignments not a sequence of sequences
    with pytest.raises(ValueError, match="scaling.policy"):
        _plan(policy="my_policy:missing")


@pytest.mark.parametrize("text", ["a:" + "f" * 5000, "n" * 5000 + ":f", "FIXED:" + "3" * 5000])
def test_a_long_policy_name_is_quoted_short(text):
    """A policy name that does not import is quoted at most about 200 characters, wherever it
    shows up in the line (the name, the import's own message, the did-you-mean hint)."""
    from flows.planning.registry import check_scaling_policy, parse_scaling_policy

    with pytest.raises(ValueError) as info:
        check_scaling_policy(parse_scaling_policy(text))
    line = str(info.value)
    assert line.startswith("scaling.policy='") and "\n" not in line and len(line) < 1000, line


def test_a_policy_function_is_checked_before_the_first_phase(tmp_path, monkeypatch):
    """``check_scaling_policy`` (a campaign's preflight) imports the plan function: a module
    that fails to import, a name that is no function, or a built-in's name in capitals is one
    ValueError naming scaling.policy, before any phase is planned."""
    from flows.planning.registry import check_scaling_policy, parse_scaling_policy

    (tmp_path / "bad_policy.py").write_text("LIMIT = 3\nraise RuntimeError('half written')\n")
    (tmp_path / "odd_policy.py").write_text("LIMIT = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for text, named in (("bad_policy:plan", "cannot import (RuntimeError: half written)"),
                        ("odd_policy:LIMIT", "LIMIT is a int, not a function"),
                        ("FIXED:3", "did you mean 'fixed:3'?"), ("nomod.x:fn", "No module named 'nomod'")):
        with pytest.raises(ValueError, match=re.escape(f"scaling.policy={text!r}: ") + ".*" + re.escape(named)):
            check_scaling_policy(parse_scaling_policy(text))
    check_scaling_policy(parse_scaling_policy("fixed:3"))  # built-ins pass


# TPOT grows with batch and context, so the slice of the longest prompts decodes slowest
KV_HEAVY = TpotProfile((1, 1001), (0.0, 4000.0), ((0.01, 0.02), (0.3, 1.5)), 1e5)
SKEWED = {i: float(50 + 15 * i * i) for i in IDS}  # 50 .. 1865 tokens, prompt 11 longest


def _slicings(n: int, profile: TpotProfile, pred=SKEWED, plen=PLEN,
              cluster=CLUSTER) -> list[tuple[float, float]]:
    """(time, GPU-s) of every split of the ranking into n contiguous slices (brute force)."""
    from itertools import combinations

    from flows.planning.cost import decode_time
    from flows.planning.timeline import evaluate_candidate, prefill_seconds

    order = sorted(pred, key=lambda i: (-pred[i], i))
    prefill_s = prefill_seconds(sum(plen.values()), profile, cluster)
    out = []
    for cuts in combinations(range(1, len(order)), n - 1):
        bounds = (0, *cuts, len(order))
        groups = [order[i:j] for i, j in zip(bounds, bounds[1:])]
        decode = [decode_time([pred[p] for p in g for _ in range(4)], sum(plen[p] for p in g) / len(g), profile)
                  for g in groups]
        tokens = [float(sum(plen[p] for p in g)) for g in groups]
        out.append(evaluate_candidate(decode, tokens, cluster, prefill_s)[:2])
    return out


def test_rank_slack_sizes_ranked_slices_by_predicted_time():
    kw = dict(policy="fixed:3", profile=KV_HEAVY)
    equal = plan_generation(IDS, SKEWED, **{**_args(), **kw})
    balanced = plan_generation(IDS, SKEWED, rank_slack=0.0, **{**_args(), **kw})
    loose = plan_generation(IDS, SKEWED, rank_slack=0.3, **{**_args(), **kw})
    ranking = sorted(IDS, key=lambda i: -SKEWED[i])
    for plan in (balanced, loose):  # contiguous slices of the ranking, every prompt once
        assert [p for a in plan.assignments for p in a] == ranking and all(plan.assignments)
    assert equal.assignments == (tuple(ranking[:4]), tuple(ranking[4:8]), tuple(ranking[8:]))
    slicings = _slicings(3, KV_HEAVY)
    fastest = min(t for t, _ in slicings)
    # slack 0: as fast as the fastest contiguous split (equal counts are much slower here),
    # with fewer prompts on the slice of the longest ones
    assert balanced.predicted_time_s <= fastest * 1.01 < equal.predicted_time_s * 0.9
    assert len(balanced.assignments[0]) < 4
    # slack 0.3: up to 30% longer, released earlier, within 3% of the cheapest such split
    cheapest = min(c for t, c in slicings if t <= 1.3 * fastest)
    assert loose.predicted_time_s <= 1.3 * fastest * 1.01
    assert loose.predicted_gpu_seconds < balanced.predicted_gpu_seconds
    assert loose.predicted_gpu_seconds <= cheapest * 1.03
    # not a ranked plan, or one actor: nothing to size
    rr = plan_generation(IDS, SKEWED, rank_slack=0.0, **{**_args(), **kw, "assignment": "round_robin"})
    assert rr.assignments == plan_generation(IDS, SKEWED, **{**_args(), **kw, "assignment": "round_robin"}).assignments
    one = plan_generation(IDS, SKEWED, rank_slack=0.0, **{**_args(), **kw, "policy": "fixed:1"})
    assert one.assignments == (tuple(ranking),)


def test_sized_slices_are_near_the_cheapest_within_their_budget():
    """Random small planning problems (long and short groups, prompts of 10-600 tokens, remote
    actors paying transfers) against brute force over every contiguous slicing."""
    import random

    rnd = random.Random(7)
    cluster = ClusterSpec(gpus_per_actor=2, max_actors=100, weight_bytes=1e9, kv_bytes_per_token=1e5,
                          transfer_bandwidth_bytes_per_s=1e11)
    worst_cost = worst_time = 0.0
    for _ in range(60):
        m = rnd.randint(3, 10)
        n = rnd.randint(2, min(4, m))
        pred = {i: float(rnd.choice([rnd.randint(5, 400), rnd.randint(300, 2000)])) for i in range(m)}
        plen = {i: rnd.randint(10, 600) for i in range(m)}
        slack = rnd.choice([0.0, 0.1, 0.3])
        kw = dict(group_size=4, prompt_lengths=plen, policy=f"fixed:{n}", n_min=1, n_max=8, lam=0.7,
                  assignment="ranked", profile=KV_HEAVY, cluster=cluster)
        plan = plan_generation(list(range(m)), pred, rank_slack=slack, **kw)
        equal = plan_generation(list(range(m)), pred, **kw)
        slicings = _slicings(n, KV_HEAVY, pred, plen, cluster)
        # within the slack of the fastest slicing, and never slower than equal counts
        budget = min((1 + slack) * min(t for t, _ in slicings), equal.predicted_time_s)
        # the brute force times by decode_time, the planner by its bucketed table: they differ by
        # up to ~0.5%, so compare with the slicings clearly inside the budget
        cheapest = min((c for t, c in slicings if t <= budget * 0.995), default=math.inf)
        worst_time = max(worst_time, plan.predicted_time_s / budget)
        worst_cost = max(worst_cost, plan.predicted_gpu_seconds / cheapest)
    assert worst_time <= 1.01 and worst_cost <= 1.03, (worst_time, worst_cost)


def _args() -> dict:
    return dict(group_size=4, prompt_lengths=PLEN, policy="cost_aware", n_min=1, n_max=8,
                lam=0.7, assignment="ranked", profile=LINEAR, cluster=CLUSTER)


@pytest.mark.parametrize("kw, field", [
    ({"n_min": 0}, "scaling.n_min"), ({"n_min": 5, "n_max": 4}, "scaling.n_max"),
    ({"lam": 1.5}, "scaling.lam"), ({"policy": "bogus"}, "scaling.policy"),
    ({"policy": "fixed:x"}, "scaling.policy"), ({"assignment": "random"}, "generation.assignment"),
    ({"cut_threshold": 0.0}, "generation.cut_threshold"), ({"group_size": 0}, "algorithm.group_size"),
    ({"rank_slack": -0.1}, "generation.rank_slack"), ({"objective": "fast"}, "scaling.objective"),
    ({"value_of_time_usd_per_s": -1.0}, "scaling.value_of_time_usd_per_s"),
    ({"value_of_time_usd_per_s": math.inf}, "scaling.value_of_time_usd_per_s"),
    ({"time_slack": -0.5}, "scaling.time_slack"),
])
def test_errors_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        _plan(**kw)


def test_empty_prompts_and_missing_prediction():
    settings = PlannerSettings(policy="cost_aware", n_min=1, n_max=2, lam=0.7, assignment="ranked", profile=FLAT,
                               cluster=CLUSTER)
    with pytest.raises(ValueError, match="a phase has no prompt"):
        _plan_generation([], PRED, group_size=4, prompt_lengths=PLEN, settings=settings)
    with pytest.raises(ValueError, match="no predicted length for prompts \\[99\\]"):
        _plan_generation([99], PRED, group_size=4, prompt_lengths=PLEN, settings=settings)


def test_cluster_spec_validation():
    with pytest.raises(ValueError, match="cluster.gpus_per_actor"):
        ClusterSpec(gpus_per_actor=0, max_actors=4)
    assert isinstance(GenerationPlan("p", 1, ((1,),), 0.0, 0.0).to_dict(), dict)


def test_colocated_actors_start_with_actor_zero():
    """Actors on the prefill actor's GPUs pay neither the weight nor the KV transfer."""
    remote = ClusterSpec(gpus_per_actor=2, max_actors=10, weight_bytes=4e9, kv_bytes_per_token=1e6,
                         transfer_bandwidth_bytes_per_s=1e9, num_prefill_gpus=8)
    local = ClusterSpec(gpus_per_actor=2, max_actors=10, weight_bytes=4e9, kv_bytes_per_token=1e6,
                        transfer_bandwidth_bytes_per_s=1e9, num_prefill_gpus=8, colocated_actors=4)
    far, near = _plan(policy="fixed:4", cluster=remote), _plan(policy="fixed:4", cluster=local)
    assert near.predicted_time_s < far.predicted_time_s
    assert near.predicted_gpu_seconds < far.predicted_gpu_seconds
    from flows.planning.timeline import actor_start

    assert actor_start(3, local, 0.5, 100.0) == actor_start(0, local, 0.5, 100.0)
    assert actor_start(4, local, 0.5, 100.0).transfer_s > 0
    with pytest.raises(ValueError, match="colocated_actors"):
        ClusterSpec(gpus_per_actor=2, max_actors=10, num_prefill_gpus=8, colocated_actors=5)


def test_prompt_suffixes_are_timed_on_the_generation_actions_that_prefill_them():
    """After a dedup prefill each action prefills its own prompts' suffixes before decoding
    (``PlannerSettings.own_prefill_tokens``): 1e4 tokens per prompt at 1e6 tokens/s is 10 ms,
    so an actor of k prompts ends k x 10 ms later and every plan bills 12 x 10 ms x 2 GPUs more."""
    own = {p: 10_000 for p in IDS}
    for objective in ("paper", "value"):  # equal slices; then sized, striped and round-robin ones too
        base = _plan(objective=objective, profile=FLAT)
        plus = _plan(objective=objective, profile=FLAT, own_prefill_tokens=own)
        for a, b in zip(base.candidates, plus.candidates):
            assert (a.n, a.kind) == (b.n, b.kind)
            if a.kind == "sized":  # slices sized on the new ends may differ
                continue
            assert b.gpu_seconds == pytest.approx(a.gpu_seconds + 12 * 0.01 * 2), (a.n, a.kind)
            if a.kind == "ranked":  # equal slices: the largest holds ceil(12 / N) prompts
                assert b.time_s == pytest.approx(a.time_s + math.ceil(12 / a.n) * 0.01), a.n


def test_only_a_start_to_hide_makes_a_plan_infeasible():
    """§3.6 asks whether an actor's weight/KV transfers and cold start hide behind actor 0's
    prefill + decode. A co-located actor, or a warm remote one with nothing to receive, has
    none: a longer decode there is a slower plan (the objective weighs it), not an infeasible one."""
    from flows.planning.timeline import evaluate_candidate

    decode, tokens = [1.0, 5.0, 5.0], [100.0, 100.0, 100.0]
    shared = ClusterSpec(gpus_per_actor=2, max_actors=8, num_prefill_gpus=8, colocated_actors=4)
    assert evaluate_candidate(decode, tokens, shared, 0.5)[2] == ""  # all three on the learner's GPUs
    remote = ClusterSpec(gpus_per_actor=2, max_actors=8)  # warm, no weights, no KV: no start
    assert evaluate_candidate(decode, tokens, remote, 0.5)[2] == ""
    sending = ClusterSpec(gpus_per_actor=2, max_actors=8, weight_bytes=1e8, transfer_bandwidth_bytes_per_s=1e9)
    assert evaluate_candidate(decode, tokens, sending, 0.5)[2].startswith("actor 1:")  # 0.1 s + 5 s > 1.5 s
    assert evaluate_candidate([5.0, 1.0, 1.0], tokens, sending, 0.5)[2] == ""  # hidden behind actor 0
    # a plan that splits the given order (contiguous: the longest prompts need not come first)
    # keeps every N with its actors on the learner's GPUs
    plan = _plan(assignment="contiguous", cluster=replace(shared, max_actors=100), n_max=4)
    assert all(c.feasible for c in plan.candidates)


@pytest.mark.parametrize("policy, n_max, workers, expected", [
    ("cost_aware", 4, 0, 5),  # one worker per possible generation action, plus one for scoring
    ("fixed:3", 4, 0, 5),
    ("fixed:8", 4, 0, 9),  # a fixed allocation above n_max gets its N actors, not a queue
    ("fixed:8", 4, 3, 3),  # an explicit pool size is the user's
])
def test_the_local_pool_has_a_worker_for_every_generation_action_of_the_policy(policy, n_max, workers, expected):
    from flows.config import CampaignConfig
    from flows.invokers.factory import pool_size

    cfg = CampaignConfig.model_validate({"scaling": {"policy": policy, "n_max": n_max},
                                         "invoker": {"num_workers": workers}})
    assert pool_size(cfg) == expected


@pytest.mark.parametrize("objective", ["value", "budget", "slack", "paper"])
def test_without_a_prefill_action_no_transfer_makes_a_plan_infeasible(objective):
    """No prefill action (the live default): no prefill window for the transfers to hide behind,
    so the §3.6 check does not apply; the timeline charges the transfers to each candidate's time
    and bill. Equal lengths, where a TPOT that grows fast with batch makes 4 actors both the
    fastest and the cheapest: that plan runs, and no candidate beats the chosen one on both."""
    steep = TpotProfile((1, 16), (0.0, 10000.0), ((0.01, 0.01), (0.5, 0.5)), 1e6)
    ids = list(range(16))
    cluster = ClusterSpec(gpus_per_actor=1, max_actors=8, weight_bytes=1e6,
                          transfer_bandwidth_bytes_per_s=67e6, prefill_action=False)
    plan = plan_generation(ids, {i: 100.0 for i in ids}, group_size=1, prompt_lengths={i: 50 for i in ids},
                           policy="cost_aware", n_min=1, n_max=4, lam=0.7, assignment="ranked",
                           profile=steep, cluster=cluster, objective=objective)
    assert all(c.feasible and not c.reason for c in plan.candidates)
    assert plan.num_actors == 4
    assert not any(c.time_s < plan.predicted_time_s and c.gpu_seconds < plan.predicted_gpu_seconds
                   for c in plan.candidates)
    # with a prefill action the paper's constraint stands: equal slices break it
    paper = plan_generation(ids, {i: 100.0 for i in ids}, group_size=1, prompt_lengths={i: 50 for i in ids},
                            policy="cost_aware", n_min=1, n_max=4, lam=0.7, assignment="ranked",
                            profile=steep, cluster=replace(cluster, prefill_action=True), objective=objective)
    assert not paper.candidates[3].feasible and paper.num_actors == 3


def test_the_simulators_static_policy_is_refused_naming_the_live_one():
    """``static:N`` is ``rlhfless simulate``'s serverful baseline; as a live ``scaling.policy``
    it is refused where the config is validated, naming ``fixed:N``, not imported as a module."""
    from pydantic import ValidationError

    from flows.config import ScalingConfig
    from flows.planning.registry import parse_scaling_policy

    with pytest.raises(ValueError, match=re.escape("scaling.policy='static:3': static:N is the simulator's")
                       + ".*use 'fixed:3'"):
        parse_scaling_policy("static:3")
    with pytest.raises(ValidationError, match="use 'fixed:4'"):
        ScalingConfig(policy="static:4")
