"""The critical-path floor of a generation phase (flows/simulate/bound.py): hand-computed
values, equality with the replay where one sample decides, and no replayed plan below it."""

import dataclasses
import random

import pytest
from sim_cluster import qwen_cluster

from flows.planning.tpot import GPUS, MODELS, TpotProfile, roofline_profile
from flows.simulate.bound import PhaseFloor, max_speedup, phase_floor
from flows.simulate.policies import parse_policy
from flows.simulate.replay import PromptRow, TraceStep, replay

FLAT = TpotProfile((1, 1000), (0.0, 10000.0), ((0.01, 0.01), (0.01, 0.01)), 1e4)


_model = qwen_cluster


def test_floor_by_hand_on_a_flat_profile():
    # 10 ms per decode step whatever the batch, 1e4 prompt tokens/s per actor of 2 GPUs
    step = TraceStep(0, 0, (PromptRow(0, 100, 0, (10, 50)), PromptRow(1, 1000, 0, (40,))))
    floor = phase_floor(step, _model(profile=FLAT))
    # serverful: the 50-token sample after its own 100-token prompt: 0.01 + 0.5 s; the
    # 40-token one after its 1000-token prompt: 0.1 + 0.4 s
    assert floor.serverful_s == pytest.approx(0.51)
    # serverless: the prefill actor (8 GPUs, 4x an actor's rate) takes all 1100 prompt tokens
    # first, 0.0275 s; then the 50-token sample: 0.5 s
    assert floor.serverless_s == pytest.approx(0.5275)
    assert floor.time_s == pytest.approx(0.51)


@pytest.mark.parametrize("policy", ["static:1", "rlhfless", "round-robin:1"])
def test_floor_is_the_replay_when_one_sample_is_the_step(policy):
    step = TraceStep(0, 0, (PromptRow(7, 321, 400, (1500,)),), max_new_tokens=2048)
    model = _model()
    gen = replay([step], [policy], model)[policy].steps[0].gen_time_s
    floor = phase_floor(step, model)
    family = floor.serverful_s if parse_policy(policy).serverful else floor.serverless_s
    assert gen == pytest.approx(family, rel=1e-9)
    # one prompt: the prefill actor's 8 GPUs prefill it 4x faster than a 2-GPU static actor
    assert floor.time_s == floor.serverless_s < floor.serverful_s


def _random_steps(rng: random.Random) -> list[TraceStep]:
    """Two epochs of the same 1-3 steps (so later predictions come from history) of 1-6
    prompts of 1-4 samples, lengths 1-400 (the cap they state), prompts 10-600 tokens."""
    shapes = [[(rng.randint(10, 600), rng.randint(1, 4)) for _ in range(rng.randint(1, 6))]
              for _ in range(rng.randint(1, 3))]
    steps, pid = [], 0
    for epoch in range(2):
        pid = 0
        for k, shape in enumerate(shapes):
            rows = []
            for prompt_len, n in shape:
                mean = rng.randint(1, 400)
                lens = tuple(max(1, min(400, int(mean * rng.uniform(0.3, 1.7)))) for _ in range(n))
                rows.append(PromptRow(pid, prompt_len, rng.randint(1, 400), lens))
                pid += 1
            steps.append(TraceStep(epoch, epoch * len(shapes) + k, tuple(rows), max_new_tokens=400))
    return steps


POLICIES = ["static:1", "static:2", "static:3", "rlhfless", "round-robin:1", "round-robin:3",
            "no-assign", "no-scale:2", "no-cut", "oracle"]
MODELS_UNDER_TEST = {
    "default": {},
    "cutting, re-prefill, continuations": dict(objective="value", migration="reprefill", continuation=True,
                                              cut_threshold=0.5),
    "cutting, kv, one co-located actor": dict(objective="value", cut_threshold=0.3, colocated_actors=1),
    "paper objective, flat profile": dict(objective="paper", profile=FLAT),
}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("settings", MODELS_UNDER_TEST.values(), ids=MODELS_UNDER_TEST.keys())
def test_no_replayed_plan_ends_a_phase_before_its_floor(seed, settings):
    rng = random.Random(seed)
    steps = _random_steps(rng)
    model = _model(**settings)
    runs = replay(steps, POLICIES, model)
    for i, step in enumerate(steps):
        floor = phase_floor(step, model)
        for name, run in runs.items():
            family = floor.serverful_s if parse_policy(name).serverful else floor.serverless_s
            assert run.steps[i].gen_time_s >= family * (1 - 1e-9), (name, i, run.steps[i].gen_time_s, floor)
            assert run.steps[i].gen_time_s >= floor.time_s * (1 - 1e-9)


@pytest.mark.parametrize("model", ["qwen2.5-7b", "qwen2.5-3b", "llama2-70b"])
def test_roofline_profiles_meet_the_floor_assumption(model):
    # the floor assumes a batch never steps faster than a lone sample at the batch's total
    # context, TPOT(b, c) >= TPOT(1, b * c), and a convex batch-1 row (bound.py docstring)
    profile = roofline_profile(GPUS["h100"], MODELS[model], 2)
    tpot = profile.tpot_fn()
    for b in (1, 2, 3, 5, 8, 17, 64, 100, 170, 300, 512, 1000, 2048):
        for c in (0.0, 1.0, 37.0, 200.0, 700.0, 1500.0, 2748.0, 5000.0, 8192.0):
            assert tpot(b, c) >= tpot(1, b * c) * (1 - 1e-12), (b, c)
    row = [tpot(1, float(c)) for c in range(0, 20000, 50)]
    assert all(a - 2 * b + c >= -1e-15 for a, b, c in zip(row, row[1:], row[2:]))


def test_max_speedup_is_total_baseline_time_over_total_floor():
    assert max_speedup([6.0, 4.0], [3.0, 2.0]) == pytest.approx(2.0)
    assert max_speedup([6.0, 4.0], [5.0, 3.0]) == pytest.approx(1.25)  # not the mean of ratios
    with pytest.raises(ValueError, match="one of each per step"):
        max_speedup([1.0], [1.0, 2.0])
    assert PhaseFloor(2.0, 1.5).time_s == 1.5


def test_floor_grows_with_the_longest_sample_and_the_prefill():
    base = TraceStep(0, 0, tuple(PromptRow(i, 200, 0, (100, 300)) for i in range(8)))
    longer = dataclasses.replace(base, prompts=base.prompts[:-1] + (PromptRow(7, 200, 0, (100, 900)),))
    model = _model()
    a, b = phase_floor(base, model), phase_floor(longer, model)
    assert b.serverless_s > a.serverless_s and b.serverful_s > a.serverful_s
    # more prompts to prefill delay every serverless actor, not a serverful one's own start
    extra = tuple(PromptRow(8 + i, 600, 0, (5,)) for i in range(20))
    more = dataclasses.replace(base, prompts=base.prompts + extra)
    c = phase_floor(more, model)
    assert c.serverless_s > a.serverless_s and c.serverful_s == pytest.approx(a.serverful_s)


def test_bench_reach_brackets_what_plans_reach_within_the_bill(capsys):
    # two steps of the capheavy trace: the best plan within static:3's bill (real plans, made
    # from exact or predicted lengths) is at least static:3 and at most the critical-path bound
    from benchmarks.bench_simulator import best_within_bill, default_model, reach
    from benchmarks.make_traces import CAP, make_trace
    from flows.simulate.cli import bound_report

    by_step: dict[int, list[PromptRow]] = {}
    for r in make_trace("capheavy", 0):
        if r["epoch"] == 0 and r["step"] < 2:
            by_step.setdefault(r["step"], []).append(PromptRow(r["prompt_id"], r["prompt_len"],
                                                               r["answer_len"], tuple(r["response_lens"])))
    steps = [TraceStep(0, k, tuple(v), CAP) for k, v in sorted(by_step.items())]
    model = default_model()
    run = replay(steps, ["static:3"], model)["static:3"]
    r = bound_report(steps, {"static:3": run}, model)
    any_plan, serverless, capped = r["max_speedup"], r["max_speedup_serverless"], r["max_speedup_within_bill_no_cut"]
    speed, gpu = best_within_bill(steps, model, exact=True, max_actors=6)
    assert 1.0 <= speed <= capped <= any_plan and serverless <= any_plan and gpu <= 1.0
    guess = best_within_bill(steps, model, exact=False, max_actors=6)
    assert 1.0 <= guess[0] <= any_plan and guess[1] <= 1.0
    reach({"capheavy": {"gen": (1 / 1.01, 0.9), "predicted": guess, "exact": (speed, gpu),
                        "bound": (any_plan, serverless, capped)}})
    out = capsys.readouterr().out
    share = (1.01 - 1) / (any_plan - 1)
    assert f"{share:.1%}" in out and "is below the bound" in out
