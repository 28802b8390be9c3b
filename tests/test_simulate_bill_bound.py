"""The floor of a trace's generation phases under a cap on the bill (flows/simulate/bill_bound.py):
its memory envelope, a scalar reference of the bill floor, and no replayed plan without cuts
below it on random small traces."""

import math
import random

import pytest
from sim_cluster import qwen_cluster

from flows.planning.tpot import CPU_TINY_PROFILE, GPUS, MODELS, roofline_profile
from flows.simulate.bill_bound import (
    capped_time_floor,
    serverful_time_floor,
    serverless_bill_floor,
    step_terms,
    tpot_envelope,
)
from flows.simulate.bound import phase_floor
from flows.simulate.policies import parse_policy
from flows.simulate.replay import PromptRow, TraceStep, replay

_model = qwen_cluster


@pytest.mark.parametrize("model", ["qwen2.5-7b", "llama2-70b"])
def test_envelope_is_below_every_step_time_on_the_grid(model):
    spec = MODELS[model]
    profile = roofline_profile(GPUS["h100"], spec, 2)
    env = tpot_envelope(profile)
    # the roofline's batch-1 row is the weight read plus the KV read: the envelope is that row
    gbw = 2 * GPUS["h100"].hbm_bytes_per_s * GPUS["h100"].mem_eff
    assert env.m_s == pytest.approx(spec.weight_bytes / gbw)
    assert env.kappa_s == pytest.approx(spec.kv_bytes_per_token / gbw)
    tpot, rng = profile.tpot_fn(), random.Random(0)
    for _ in range(3000):
        b, c = rng.randint(1, int(env.max_batch)), rng.uniform(0.0, env.max_context)
        assert tpot(b, c) >= (env.m_s + env.kappa_s * b * c) * (1 - 1e-12), (b, c)


def test_no_envelope_off_a_grid_that_starts_above_context_zero():
    assert tpot_envelope(CPU_TINY_PROFILE) is None  # its contexts start at 16 tokens


def _reference_bill(step, terms, env, model, time_s):
    """The bill floor of fact 3 written out from the step's rows, one length at a time."""
    window, counts = time_s - terms.first_ready_s, []
    for length in range(1, max(max(r.response_lens) for r in step.prompts) + 1):
        work = env.kappa_s * sum(n * (r.prompt_len + (n + 1) / 2) for r in step.prompts
                                 if max(r.response_lens) >= length for n in r.response_lens)
        room = window - env.m_s * length
        if room <= 0:
            return math.inf
        counts.append(max(1, math.ceil(work / room - 1e-12)))
    if max(counts) > model.max_actors:
        return math.inf
    remote = max(0, max(counts) - terms.colocated)
    return (terms.prefill_gpu_s + model.gpus_per_actor
            * (env.m_s * sum(counts) + terms.kv_work_s + remote * terms.remote_wait_s))


def test_bill_floor_matches_its_reference_and_falls_with_time():
    step = TraceStep(0, 0, tuple(PromptRow(i, 100 + 13 * i, 0, (50 + 97 * i, 20 + 31 * i)) for i in range(12)))
    model = _model()
    env = tpot_envelope(model.profile)
    terms = step_terms(step, model, env)
    floor = phase_floor(step, model).serverless_s
    times = [floor * x for x in (0.99, 1.0, 1.01, 1.05, 1.2, 2.0, 10.0)]
    bills = serverless_bill_floor(terms, env, model, times).tolist()
    assert bills == pytest.approx([_reference_bill(step, terms, env, model, t) for t in times])
    assert bills[0] == math.inf  # before the critical-path floor no plan ends
    assert all(a >= b for a, b in zip(bills[1:], bills[2:]))
    # with all the time in the world one actor per level suffices: every step of the longest
    # sample once, every token's KV read once, the prefill actor's bill
    assert bills[-1] == pytest.approx(terms.prefill_gpu_s + 2 * (env.m_s * terms.levels[0][0] + terms.kv_work_s))


def _random_steps(rng: random.Random) -> list[TraceStep]:
    steps = []
    for k in range(rng.randint(1, 3)):
        rows = tuple(PromptRow(10 * k + i, rng.randint(10, 600), rng.randint(1, 400),
                               tuple(rng.randint(1, 400) for _ in range(rng.randint(1, 4))))
                     for i in range(rng.randint(1, 8)))
        steps.append(TraceStep(0, k, rows, max_new_tokens=400))  # the lengths' cap
    return steps


POLICIES = ["static:1", "static:2", "static:3", "rlhfless", "round-robin:1", "round-robin:2",
            "round-robin:4", "no-assign", "no-cut", "oracle"]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("settings", [{}, {"colocated_actors": 1}, {"objective": "value", "cut_threshold": 1.0},
                                      {"prewarm_idle_s": 0.5, "colocated_actors": 2}])
def test_no_replayed_plan_without_cuts_beats_the_floors(seed, settings):
    steps = _random_steps(random.Random(seed))
    model = _model(**settings)
    env = tpot_envelope(model.profile)
    runs = {name: run for name, run in replay(steps, POLICIES, model).items()
            if all(s.num_cut == 0 for s in run.steps)}
    assert len(runs) >= 8
    for i, step in enumerate(steps):
        terms = step_terms(step, model, env)
        for name, run in runs.items():
            record, policy = run.steps[i], parse_policy(name)
            if policy.serverful:
                assert record.gen_time_s >= serverful_time_floor(terms, env, record.n_actors) * (1 - 1e-9)
            else:
                bill = serverless_bill_floor(terms, env, model, [record.gen_time_s])[0]
                assert record.gen_gpu_seconds >= bill * (1 - 1e-9), (name, i, record.gen_gpu_seconds, bill)
    # over the trace: within any of these plans' own bill, nothing runs faster than the floor
    for name, run in runs.items():
        floor = capped_time_floor(steps, model, sum(s.gen_gpu_seconds for s in run.steps))
        assert floor <= sum(s.gen_time_s for s in run.steps) * (1 + 1e-9), name


def test_capped_floor_rises_as_the_bill_falls_and_never_undercuts_the_critical_path():
    steps = _random_steps(random.Random(3)) + _random_steps(random.Random(4))
    model = _model()
    critical = sum(phase_floor(step, model).time_s for step in steps)
    static = replay(steps, ["static:3"], model)["static:3"]
    budget = sum(s.gen_gpu_seconds for s in static.steps)
    floors = [capped_time_floor(steps, model, budget * x) for x in (1e6, 2.0, 1.0, 0.5, 0.25)]
    assert all(a <= b * (1 + 1e-12) for a, b in zip(floors, floors[1:]))
    assert floors[0] >= critical * (1 - 1e-12) and floors[0] == pytest.approx(critical, rel=0.02)
    assert floors[-1] > floors[0]  # a quarter of static:3's bill is binding
