"""Trace-driven simulator: conservation, baseline accounting, policies and the CLI."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
from sim_cluster import qwen_cluster

from flows.planning.tpot import GPUS, MODELS, TpotProfile
from flows.simulate.cli import main
from flows.simulate.cluster import ActorSpec, Sample, SimConfig, simulate_phase
from flows.simulate.policies import make_plan, parse_policy
from flows.simulate.replay import PromptRow, TraceStep, measured_error, read_trace, replay, run_step, step_predictions

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
FLAT = TpotProfile((1, 1000), (0.0, 10000.0), ((0.01, 0.01), (0.01, 0.01)), 1e4)
QWEN = MODELS["qwen2.5-7b"]


_model = qwen_cluster


CAP = 1000  # the generation cap _step's trace states


def _step() -> TraceStep:
    """32 prompts of 4 samples; prompt 5 is predicted short but runs very long."""
    rows = [PromptRow(i, 100 + i, 40 + 10 * i, tuple(40 + 10 * i + d for d in (0, 5, 9, 13)))
            for i in range(32)]
    rows[5] = PromptRow(5, 105, 20, (20, 25, 900, 950))
    return TraceStep(0, 0, tuple(rows), max_new_tokens=CAP)


def _check_conservation(samples):
    for s in samples:
        assert sum(tokens for _, tokens in s.segments) == pytest.approx(s.length, abs=1e-6)
        assert s.decoded == pytest.approx(s.length, abs=1e-6)


@pytest.mark.parametrize("migration", ["reprefill", "kv"])
def test_every_sample_decoded_exactly_once_with_migration(migration):
    step = _step()
    predicted = {r.prompt_id: float(r.answer_len) for r in step.prompts}
    policy = parse_policy("no-scale:4")
    result, _, n, samples = run_step(policy, step, predicted, _model(cut_threshold=0.5, migration=migration))
    assert n == 4 and len(samples) == 128
    assert result.num_migrated > 0  # prompt 5's stragglers were cut and moved
    _check_conservation(samples)
    assert any(len({a for a, _ in s.segments}) == 2 for s in samples)


def test_static_cost_is_n_gpus_time():
    step = _step()
    predicted = {r.prompt_id: float(r.answer_len) for r in step.prompts}
    result, _, n, samples = run_step(parse_policy("static:3"), step, predicted, _model())
    assert n == 3 and result.num_cut == 0
    assert result.gpu_seconds == pytest.approx(3 * 2 * result.time_s)
    _check_conservation(samples)


def test_serverless_actor_is_released_when_done():
    # one actor with samples of 10 and 30 tokens at a flat 10 ms: busy 0.3 s, billed 0.3 s
    samples = (Sample(0, 0, 0, 10), Sample(1, 0, 0, 30))
    cfg = SimConfig(profile=FLAT, gpus_per_actor=1)
    res, done = simulate_phase([ActorSpec(samples, 0.0, 0.0)], cfg)
    assert res.time_s == pytest.approx(0.3)
    assert res.gpu_seconds == pytest.approx(0.3) and res.idle_fraction == pytest.approx(0.0)
    # held (serverful) next to a longer actor: billed until the phase ends
    samples = (Sample(0, 0, 0, 10), Sample(1, 0, 0, 30))  # fresh: samples record progress
    long = (Sample(2, 1, 0, 50),)
    res, _ = simulate_phase([ActorSpec(samples, 0.0, 0.0, True), ActorSpec(long, 0.0, 0.0, True)],
                            cfg)
    assert res.gpu_seconds == pytest.approx(2 * 0.5)
    assert res.idle_fraction == pytest.approx(1 - 0.8 / 1.0)


def test_cut_waits_without_free_slots():
    # a single actor cannot migrate anywhere: it runs to the end, nothing is cut
    samples = tuple(Sample(i, 0, 0, 10 * (i + 1)) for i in range(4))
    cfg = SimConfig(profile=FLAT, gpus_per_actor=1, cut_threshold=0.5)
    res, done = simulate_phase([ActorSpec(samples, 0.0, 0.0)], cfg)
    assert res.num_cut == 0 and res.time_s == pytest.approx(0.4)
    _check_conservation(done)


def test_continuation_reuses_released_container_and_is_not_cut_again():
    # actor 0 (4 samples: 10, 20, 300, 400 tokens) is cut at cut_threshold=0.5 once two finished; actor 1
    # (one 5-token sample) was released at 0.05 s, so the continuation starts in its warm
    # container at once: no cold start, no weight transfer, and it is never cut itself
    a = tuple(Sample(i, 0, 0, n) for i, n in enumerate((10, 20, 300, 400)))
    b = (Sample(4, 1, 0, 5),)
    cfg = SimConfig(profile=FLAT, gpus_per_actor=1, cut_threshold=0.5, continuation=True, cold_start_s=30.0,
                    weight_transfer_s=2.0)
    res, done = simulate_phase([ActorSpec(a, 0.0, 0.0), ActorSpec(b, 0.0, 0.0)], cfg)
    assert res.num_actors == 3 and res.num_cut == 1 and res.num_migrated == 2
    # 400 tokens x 10 ms plus the re-prefill of 2 x 20 generated tokens at 1e4 tokens/s
    assert res.time_s == pytest.approx(4.0 + 0.004)
    _check_conservation(done)
    # no released container and no spare: the continuation pays cold start + weights
    a = tuple(Sample(i, 0, 0, n) for i, n in enumerate((10, 20, 300, 400)))
    res, done = simulate_phase([ActorSpec(a, 0.0, 0.0)], cfg)
    assert res.num_cut == 1 and res.time_s == pytest.approx(0.2 + 32.0 + 0.004 + 3.8)
    _check_conservation(done)
    # an actor the plan gave no cut point runs to the end (migrate.plan_cut_points)
    a = tuple(Sample(i, 0, 0, n) for i, n in enumerate((10, 20, 300, 400)))
    res, done = simulate_phase([ActorSpec(a, 0.0, 0.0, cuttable=False)], cfg)
    assert res.num_cut == 0 and res.num_actors == 1 and res.time_s == pytest.approx(4.0)
    _check_conservation(done)


def test_actor_with_kv_in_flight_is_not_cut_and_every_sample_finishes():
    # flat 10 ms/token, KV at 0.1 s/token, cut at half. At 0.01 s actor 0 (1, 1, 50 tokens) is
    # cut and its 50-token sample (1 token of context) moves to actor 1, the most free; its KV
    # lands at 0.11 s. Actor 1 (1, 1, 1, 300) has reached its cut point too but is not cut
    # while that KV is in flight (a cut moves live rows only: the arriving one would be lost).
    # At 0.11 s its two rows find one free slot (actor 2): the cut waits. The moved sample ends
    # at 0.11 + 0.49 = 0.60 s; actor 1 is cut, its 300-token row (60 decoded) reaches actor 2
    # at 0.60 + 6.0 s and ends at 9.0 s; actor 2's 1000-token row ends the phase at 10 s.
    a = (Sample(0, 0, 0, 1), Sample(1, 0, 0, 1), Sample(2, 0, 0, 50))
    b = (Sample(3, 1, 0, 1), Sample(4, 1, 0, 1), Sample(5, 1, 0, 1), Sample(6, 1, 0, 300))
    c = (Sample(7, 2, 0, 1), Sample(8, 2, 0, 1000))
    cfg = SimConfig(profile=FLAT, gpus_per_actor=1, cut_threshold=0.5, migration="kv",
                    kv_transfer_s_per_token=0.1)
    res, done = simulate_phase([ActorSpec(a, 0.0, 0.0), ActorSpec(b, 0.0, 0.0),
                                ActorSpec(c, 0.0, 0.0, cuttable=False)], cfg)
    _check_conservation(done)
    assert done[2].segments == [(0, 1.0), (1, 49.0)] and done[6].segments == [(1, 60.0), (2, 240.0)]
    assert res.num_cut == 2 and res.release_s == pytest.approx((0.01, 0.60, 10.0))


def test_a_lost_sample_raises():
    from flows.simulate.cluster import _check_all_finished
    with pytest.raises(AssertionError, match="1 samples not finished"):
        _check_all_finished([Sample(0, 0, 0, 10, decoded=10.0), Sample(1, 0, 0, 10, decoded=2.0)])


def test_shared_processors_slow_concurrent_actors():
    # two actors of 100 tokens at a flat 10 ms on one shared processor: each decodes at half
    # speed while both run, so the phase takes 2 s instead of 1 s; on two processors, 1 s
    def run(cores):
        specs = [ActorSpec((Sample(0, 0, 0, 100),), 0.0, 0.0), ActorSpec((Sample(1, 1, 0, 100),), 0.0, 0.0)]
        return simulate_phase(specs, SimConfig(profile=FLAT, gpus_per_actor=1, shared_processors=cores))[0]
    assert run(1).time_s == pytest.approx(2.0)
    assert run(2).time_s == pytest.approx(1.0) == run(None).time_s
    # processes busy at once on both processors contend (memory, caches): 25% slower each
    specs = [ActorSpec((Sample(0, 0, 0, 100),), 0.0, 0.0), ActorSpec((Sample(1, 1, 0, 100),), 0.0, 0.0)]
    cfg = SimConfig(profile=FLAT, gpus_per_actor=1, shared_processors=2, corun_slowdown=0.25)
    assert simulate_phase(specs, cfg)[0].time_s == pytest.approx(1.25)
    # unequal work: 50 and 100 tokens on one processor: both at half speed until 1.0 s, then
    # the survivor alone at full speed for its last 50 tokens
    specs = [ActorSpec((Sample(0, 0, 0, 50),), 0.0, 0.0), ActorSpec((Sample(1, 1, 0, 100),), 0.0, 0.0)]
    res, done = simulate_phase(specs, SimConfig(profile=FLAT, gpus_per_actor=1, shared_processors=1))
    assert res.time_s == pytest.approx(1.5)
    assert res.release_s == pytest.approx((1.0, 1.5))  # per actor, in start order
    _check_conservation(done)


def test_rows_finishing_while_others_go_on_cost_the_batch_shrink():
    # 10 and 20 tokens at a flat 10 ms: the first finish (one survivor) costs 0.5 s of shrink
    # before the next step; the last finish ends the actor and costs nothing
    shrinking = TpotProfile((1, 1000), (0.0, 10000.0), ((0.01, 0.01), (0.01, 0.01)), 1e4, shrink_s=0.5)
    samples = (Sample(0, 0, 0, 10), Sample(1, 0, 0, 20))
    res, done = simulate_phase([ActorSpec(samples, 0.0, 0.0)], SimConfig(profile=shrinking, gpus_per_actor=1))
    assert res.time_s == pytest.approx(0.1 + 0.5 + 0.1)
    _check_conservation(done)
    res, _ = simulate_phase([ActorSpec((Sample(0, 0, 0, 10),), 0.0, 0.0)],
                            SimConfig(profile=shrinking, gpus_per_actor=1))
    assert res.time_s == pytest.approx(0.1)


def test_parse_policy():
    assert parse_policy("round-robin:4").assignment == "round_robin"
    assert not parse_policy("round-robin:4").serverful and not parse_policy("round-robin:4").cut
    assert parse_policy("static:3").serverful
    assert parse_policy("no-scale").scaling.name == "fixed:3"
    assert parse_policy("oracle").oracle
    for bad in ("static", "static:0", "rlhfless:2", "nope"):
        with pytest.raises(ValueError, match="policy"):
            parse_policy(bad)


def test_read_trace_errors_name_the_line(tmp_path):
    good = {"epoch": 0, "step": 0, "prompt_id": 1, "prompt_len": 5, "answer_len": 3,
            "response_lens": [4, 5]}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:2"):
        read_trace(path)
    path.write_text(json.dumps({**good, "response_lens": []}) + "\n")
    with pytest.raises(ValueError, match=r":1: response_lens"):
        read_trace(path)


def _write_trace(path: Path) -> None:
    lines = []
    for epoch in range(2):
        for row in _step().prompts:
            lines.append(json.dumps({"epoch": epoch, "step": epoch, "prompt_id": row.prompt_id,
                                     "prompt_len": row.prompt_len, "answer_len": row.answer_len,
                                     "response_lens": list(row.response_lens), "max_new_tokens": CAP}))
    path.write_text("\n".join(lines) + "\n")


def test_cli_json_shape(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    _write_trace(trace)
    rc = main(["--trace", str(trace), "--policy", "rlhfless", "--policy", "static:3",
               "--nodes", "2", "--json", "--plot", str(tmp_path / "p.png")])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"policies", "generation_floor"}
    assert set(report["policies"]) == {"rlhfless", "static:3"}
    floor = report["generation_floor"]
    assert set(floor) == {"time_s", "serverless_time_s", "serverful_time_s", "steps", "baseline", "max_speedup",
                          "max_speedup_serverless", "max_speedup_within_bill_no_cut"}
    assert len(floor["steps"]) == 2 and floor["baseline"] == "static:3"
    # the cap on the bill only lowers what a plan could reach
    assert 1.0 <= floor["max_speedup_within_bill_no_cut"] <= floor["max_speedup"]
    assert floor["time_s"] == pytest.approx(sum(floor["steps"]))
    assert floor["time_s"] == pytest.approx(min(floor["serverless_time_s"], floor["serverful_time_s"]))
    # no plan runs the phases faster than the floor of its family
    assert report["policies"]["static:3"]["generation"]["time_s"] >= floor["serverful_time_s"]
    assert report["policies"]["rlhfless"]["generation"]["time_s"] >= floor["serverless_time_s"]
    summary = report["policies"]["rlhfless"]
    assert set(summary) == {"total_time_s", "actor_gpu_seconds", "total_gpu_seconds", "total_gpu_seconds_with_learner",
                            "mean_idle_fraction", "planning_ms_p50", "planning_ms_max", "steps", "generation",
                            "fidelity"}
    assert [set(s) for s in summary["steps"]] == [{"step", "n_actors", "time_s", "gpu_seconds",
                                                   "gen_time_s", "predicted_time_s"}] * 2
    # the whole step (the learner after generation) is longer than its generation phase
    assert summary["total_time_s"] > summary["generation"]["time_s"] > 0
    # a serverful policy's actors are held idle through the learner's phases: the whole step's
    # idle fraction, not its generation phase's
    static = report["policies"]["static:3"]
    assert set(static["generation"]) == {"time_s", "gpu_seconds", "mean_idle_fraction"}
    assert 0 <= static["generation"]["mean_idle_fraction"] < static["mean_idle_fraction"] < 1
    assert 0 <= summary["fidelity"]["median_abs_error"] <= summary["fidelity"]["p90_abs_error"]
    assert (tmp_path / "p.png").stat().st_size > 0


def test_cli_reports_generation_whole_step_and_frontier(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    _write_trace(trace)
    rc = main(["--trace", str(trace), "--trace", str(trace), "--policy", "rlhfless", "--policy",
               "static:3", "--nodes", "2", "--frontier", "--objective", "slack"])
    out = capsys.readouterr().out
    assert rc == 0 and out.count("generation only:") == 2 and out.count("whole step (learner:") == 2
    assert "8 x H100-SXM at 40% MFU" in out and "pred_err p50/p90" in out
    # the bound lines: the most any plan could speed up the phases over static:3 is at least
    # what every replayed plan reached (the table's speedup column)
    bound = [line for line in out.splitlines() if line.startswith("bound: max speed-up any plan")]
    assert len(bound) == 2 and "over static:3:" in bound[0]
    best = float(bound[0].split("over static:3: ")[1].split("x")[0])
    table = out.split("generation only:")[1].split("bound:")[0].splitlines()[2:]
    assert table and all(best >= float(row.split()[3].rstrip("x")) for row in table)
    frontier = out.split("frontier of objective 'slack'")[1].split("==")[0].splitlines()[2:]
    assert len(frontier) == 7  # one row per slack value


@pytest.mark.parametrize("args, message", [
    (["--trace", "/nonexistent/trace.jsonl"], "--trace '/nonexistent/trace.jsonl' is not a file"),
    (["--policy", "bogus"], "bogus"),
    (["--profile", "roofline:h100:gpt5"], "roofline"),
    (["--rank-slack", "-1"], "--rank-slack"),
    (["--value-of-time", "-2"], "--value-of-time=-2.0"),
    (["--time-slack", "11"], "--time-slack=11.0"),
    (["--learner-mfu", "0"], "mfu"),
])
def test_cli_bad_input_returns_2(tmp_path, capsys, args, message):
    trace = tmp_path / "t.jsonl"
    _write_trace(trace)
    rc = main(["--trace", str(trace)] + args)
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1


def test_cli_malformed_line(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    _write_trace(trace)
    trace.write_text(trace.read_text() + '{"epoch": 0}\n')
    assert main(["--trace", str(trace)]) == 2
    assert ":65:" in capsys.readouterr().err


@pytest.mark.skipif(not (TRACES / "gsm8k.jsonl").exists(),
                    reason=f"shared traces not found at {TRACES}")
def test_oracle_no_slower_than_rlhfless_on_trace():
    steps = read_trace(TRACES / "gsm8k.jsonl")[:6]
    runs = replay(steps, ["rlhfless", "oracle"], _model(num_nodes=20, n_max=64), max_new_tokens=2048)
    total = {name: run.summary()["total_time_s"] for name, run in runs.items()}
    assert total["oracle"] <= total["rlhfless"] * 1.001


def test_default_budget_objective_does_not_cut_and_stays_within_static3():
    """Default settings: no cut-and-migrate, and on a synthetic trace of long, mispredicted
    answers the plan bills no more than static:3 at no more than 1.02x its time."""
    from benchmarks.make_traces import CAP as TRACE_CAP
    from benchmarks.make_traces import make_trace

    rows = [r for r in make_trace("capheavy", 0) if r["epoch"] == 0 and r["step"] < 2]
    by_step: dict[int, list[PromptRow]] = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(PromptRow(r["prompt_id"], r["prompt_len"], r["answer_len"],
                                                           tuple(r["response_lens"])))
    steps = [TraceStep(0, k, tuple(v), TRACE_CAP) for k, v in sorted(by_step.items())]
    model = _model(num_nodes=20, n_max=64, colocated_actors=None)
    runs = replay(steps, ["static:3", "rlhfless"], model)
    base, ours = runs["static:3"].summary(), runs["rlhfless"].summary()
    assert all(s.num_cut == 0 for s in runs["rlhfless"].steps)
    assert ours["total_gpu_seconds"] <= base["total_gpu_seconds"]
    assert ours["total_time_s"] <= 1.02 * base["total_time_s"]
    cutting = replay(steps, ["rlhfless"], dataclasses.replace(model, objective="value"))["rlhfless"]
    assert any(s.num_cut > 0 for s in cutting.steps)


def test_learner_phases_lengthen_every_step_and_bill_only_held_actors():
    from flows.planning.tpot import learner_tokens_per_s

    rate = learner_tokens_per_s(GPUS["h100"], QWEN, 8)  # 10 x params FLOPs per token at 40% MFU
    assert rate == pytest.approx(8 * GPUS["h100"].peak_flops * 0.4 / (10 * QWEN.num_params))
    step = _step()
    tokens = sum(r.prompt_len * len(r.response_lens) + sum(r.response_lens) for r in step.prompts)
    gen = replay([step], ["rlhfless", "static:3"], _model())
    whole = replay([_step()], ["rlhfless", "static:3"], _model(learner_tokens_per_s=rate))
    learn = tokens / rate
    for name in ("rlhfless", "static:3"):
        assert whole[name].steps[0].time_s == pytest.approx(gen[name].steps[0].time_s + learn)
    # static:3 holds its 3 x 2 GPUs through the learner phases; rlhfless released its actors
    assert whole["static:3"].steps[0].gpu_seconds == pytest.approx(gen["static:3"].steps[0].gpu_seconds + 6 * learn)
    assert whole["rlhfless"].steps[0].gpu_seconds == pytest.approx(gen["rlhfless"].steps[0].gpu_seconds)


def test_replay_caps_predictions_at_the_generation_cap():
    # epoch 0 predicts from reference answers; references far beyond what generation can
    # produce plan exactly as references at the cap do (the cap the trace states)
    step = _step()
    huge = dataclasses.replace(step, prompts=tuple(dataclasses.replace(r, answer_len=100 * CAP)
                                                   for r in step.prompts))
    at_cap = dataclasses.replace(step, prompts=tuple(dataclasses.replace(r, answer_len=CAP)
                                                     for r in step.prompts))
    a = replay([huge], ["no-scale:4"], _model())["no-scale:4"].steps[0]
    b = replay([at_cap], ["no-scale:4"], _model())["no-scale:4"].steps[0]
    assert (a.time_s, a.gpu_seconds) == (b.time_s, b.gpu_seconds)
    # (one co-located actor: the other three pay transfers, which the longer predictions move)
    unstated = dataclasses.replace(huge, max_new_tokens=None)
    c = replay([unstated], ["no-scale:4"], _model(colocated_actors=1), max_new_tokens=10 * CAP)["no-scale:4"]
    a = replay([huge], ["no-scale:4"], _model(colocated_actors=1))["no-scale:4"].steps[0]
    assert (c.steps[0].time_s, c.steps[0].gpu_seconds) != (a.time_s, a.gpu_seconds)


def test_the_cap_is_stated_or_given_never_read_off_the_lengths(tmp_path, capsys):
    # the trace's longest response is known only after its last step: a step's predictions
    # must not change with the steps after it (here the 310-token response of step 1 capped
    # step 0's 1000-token reference prediction at 310)
    rows0 = (PromptRow(1, 50, 1000, (120, 130)), PromptRow(2, 50, 200, (90, 100)))
    steps = [TraceStep(0, 0, rows0), TraceStep(0, 1, (PromptRow(3, 50, 900, (300, 310)),))]
    with pytest.raises(ValueError, match="states no generation cap"):
        list(step_predictions(steps, _model()))
    full = next(step_predictions(steps, _model(), max_new_tokens=2048))[1]
    alone = next(step_predictions(steps[:1], _model(), max_new_tokens=2048))[1]
    assert full == alone and full[1] > 310
    with pytest.raises(ValueError, match="a 310-token response"):
        replay(steps, ["static:3"], _model(), max_new_tokens=200)
    # a cap the trace states is used, and a different one given is refused
    stated = [dataclasses.replace(s, max_new_tokens=512) for s in steps]
    assert next(step_predictions(stated, _model()))[1][1] == 512.0
    with pytest.raises(ValueError, match="the trace states"):
        replay(stated, ["static:3"], _model(), max_new_tokens=2048)
    # the CLI: a trace that states none needs --max-new-tokens
    trace = tmp_path / "t.jsonl"
    _write_trace(trace)
    trace.write_text(trace.read_text().replace(f', "max_new_tokens": {CAP}', ""))
    assert main(["--trace", str(trace), "--policy", "static:3", "--nodes", "2"]) == 2
    assert "--max-new-tokens" in capsys.readouterr().err
    assert main(["--trace", str(trace), "--policy", "static:3", "--nodes", "2", "--max-new-tokens", "1000"]) == 0
    # every line that states a cap states the same one
    _write_trace(trace)
    text = trace.read_text()
    last = text.rindex(f'"max_new_tokens": {CAP}')
    trace.write_text(text[:last] + text[last:].replace(str(CAP), "7", 1))
    with pytest.raises(ValueError, match=f"max_new_tokens=7, but an earlier line says {CAP}"):
        read_trace(trace)


def test_measured_error_covers_the_last_steps_only():
    pairs = [([100.0, 100.0], [50.0, 50.0]), ([100.0, 100.0], [200.0, 400.0])]
    assert measured_error([], 2, 2048.0, 0.5) is None
    assert measured_error(pairs, 0, 2048.0, 0.5) is None
    last = measured_error(pairs, 1, 2048.0, 0.5)
    assert last.log_ratios == pytest.approx([math.log(2.0), math.log(4.0)])
    assert (last.max_length, last.quantile) == (2048.0, 0.5)
    assert len(measured_error(pairs, 2, 2048.0, 0.5).log_ratios) == 4


def test_replay_gives_each_policy_the_error_of_its_own_predictions(monkeypatch):
    """The planner learns how far its predictions missed on the previous steps: none before
    the first step, the oracle's none at all, rlhfless's from the reference-based guesses."""
    from flows.planning.planner import Planner

    errors: dict[int, list] = {}  # planner -> the error it gave each plan
    real = Planner.tail_error

    def spy(self):
        error = real(self)
        errors.setdefault(id(self), []).append(error)
        return error

    monkeypatch.setattr(Planner, "tail_error", spy)
    steps = [dataclasses.replace(_step(), step=k) for k in range(3)]
    replay(steps, ["rlhfless", "oracle"], _model(tail_error_steps=1))
    seen = dict(zip(["rlhfless", "oracle"], errors.values()))  # the policies plan in this order
    assert seen["rlhfless"][0] is None and seen["oracle"][0] is None
    assert all(set(e.log_ratios) == {0.0} for e in seen["oracle"][1:])
    # step 0 guessed from references (prompt 5: 20 tokens, ran 950); step 1 repeated step 0's
    # lengths from history, which the trace repeats exactly
    first, second = seen["rlhfless"][1:]
    assert len(first.log_ratios) == 32 and first.log_ratios[-1] == pytest.approx(math.log(950 / 20))
    assert set(second.log_ratios) == {0.0}
    off = dict(seen)
    errors.clear()
    replay(steps, ["rlhfless"], _model(tail_error_steps=0))
    assert list(errors.values()) == [[None] * 3] and len(off["rlhfless"]) == 3


def test_plan_and_simulation_agree_when_predictions_are_exact():
    # every sample of a prompt has the predicted length and nothing is cut: the planner's
    # estimate and the event simulation must tell the same story
    rows = tuple(PromptRow(i, 50 + 7 * i, 0, (300 + 37 * (i % 9),) * 4) for i in range(40))
    step = TraceStep(0, 0, rows)
    exact = {r.prompt_id: float(r.response_lens[0]) for r in rows}
    model = _model(value_of_time_usd_per_s=1e3)  # time is dear: a plan of several actors
    policy = parse_policy("no-cut")
    plan = make_plan(policy, [r.prompt_id for r in rows], exact,
                     {r.prompt_id: r.prompt_len for r in rows}, 4, model)
    result, _, n, _ = run_step(policy, step, exact, model)
    assert n == plan.num_actors > 1
    assert result.time_s == pytest.approx(plan.predicted_time_s, rel=0.01)
    assert result.gpu_seconds == pytest.approx(plan.predicted_gpu_seconds, rel=0.01)


# ---- live-flow mode (local warm pool as flows/step/flow.py drives it) ------------------------

def _live(**kw) -> SimConfig:
    args = dict(profile=FLAT, gpus_per_actor=1, cut_threshold=0.5, continuation=True, migrate_to_running=False,
                migrate_window_s=1.0)
    args.update(kw)
    return SimConfig(**args)


def test_startup_work_shares_the_processors():
    # two actors, each 0.5 s of start-up work then one 100-token sample at a flat 10 ms, ready
    # at 0.2 s. One processor: the start-ups run at half speed (0.2 -> 1.2 s), then both decode
    # at half speed for 2 s: 3.2 s. Two processors: 0.2 + 0.5 + 1.0 = 1.7 s.
    def run(cores):
        specs = [ActorSpec((Sample(i, i, 0, 100),), 0.0, 0.2, work_s=0.5) for i in range(2)]
        return simulate_phase(specs, SimConfig(profile=FLAT, gpus_per_actor=1, shared_processors=cores))
    res, done = run(1)
    assert res.time_s == pytest.approx(3.2)
    assert res.busy_gpu_seconds == pytest.approx(2 * 2.0)  # start-up work is not decoding
    _check_conservation(done)
    assert run(2)[0].time_s == pytest.approx(1.7)
    # one actor alone: ready 0.2 + work 0.5 + 100 x 10 ms
    res, _ = simulate_phase([ActorSpec((Sample(0, 0, 0, 100),), 0.0, 0.2, work_s=0.5)],
                            SimConfig(profile=FLAT, gpus_per_actor=1, shared_processors=1))
    assert res.time_s == pytest.approx(1.7)


def _cut_pair():
    # actor 0: samples of 10, 20, 300, 400 tokens, cut at tau = 0.5 when the 20-token one
    # finishes (0.2 s), its two stragglers having 20 tokens each; actor 1: one 50-token sample
    # (0.5 s), never cut
    a = tuple(Sample(i, 0, 0, n) for i, n in enumerate((10, 20, 300, 400)))
    return [ActorSpec(a, 0.0, 0.0), ActorSpec((Sample(4, 1, 0, 50),), 0.0, 0.0)]


def test_live_continuation_waits_for_the_last_pending_action_that_can_be_cut():
    # window 1 s, actor 1 has a cut point (cuttable): the flow submits the continuation when
    # actor 1 returns (0.5 s), not at the cut; it starts 0.1 s (submission) + 0.02 s (round-trip
    # wait) later, does 0.05 s + 40 re-prefilled tokens x 1 ms of start-up work (0.09 s), then decodes the longest
    # straggler's last 380 tokens: 0.5 + 0.12 + 0.09 + 3.8
    cfg = _live(submit_s=0.1, activation_latency_s=0.02, continuation_work_s=0.05,
                continuation_work_s_per_token=0.001)
    res, done = simulate_phase(_cut_pair(), cfg)
    assert res.num_actors == 3 and res.num_cut == 1 and res.num_migrated == 2
    assert res.time_s == pytest.approx(0.5 + 0.12 + 0.09 + 3.8)
    _check_conservation(done)
    assert [len(s.segments) for s in done] == [1, 1, 2, 2, 1]


def test_live_continuation_does_not_wait_for_actions_without_a_cut_point():
    # actor 1 runs to the end (no cut point): no more cut samples can come, so the window
    # closes at the cut (0.2 s) instead of when actor 1 returns (0.5 s)
    cfg = _live(submit_s=0.1, activation_latency_s=0.02, continuation_work_s=0.05,
                continuation_work_s_per_token=0.001)
    specs = _cut_pair()
    specs[1] = dataclasses.replace(specs[1], cuttable=False)
    res, done = simulate_phase(specs, cfg)
    assert res.num_cut == 1 and res.num_migrated == 2
    assert res.time_s == pytest.approx(0.2 + 0.12 + 0.09 + 3.8)
    _check_conservation(done)


def test_live_continuation_submitted_when_the_window_closes():
    # window 0.1 s from the cut at 0.2 s: submitted at 0.3 s although actor 1 is still running
    cfg = _live(migrate_window_s=0.1, submit_s=0.1, continuation_work_s=0.05,
                continuation_work_s_per_token=0.001)
    res, done = simulate_phase(_cut_pair(), cfg)
    assert res.time_s == pytest.approx(0.3 + 0.1 + 0.09 + 3.8)
    _check_conservation(done)


def test_live_cuts_within_the_window_share_one_continuation():
    # two identical actors cut at 0.2 s: one continuation with the 4 stragglers (re-prefill of
    # 4 x (5 prompt + 20 generated) tokens x 1 ms = 0.1 s), submitted at once (nothing pending)
    specs = []
    for k in range(2):
        specs.append(ActorSpec(tuple(Sample(4 * k + i, k, 5, n) for i, n in enumerate((10, 20, 300, 400))),
                               0.0, 0.0))
    res, done = simulate_phase(specs, _live(continuation_work_s_per_token=0.001))
    assert res.num_actors == 3 and res.num_cut == 2 and res.num_migrated == 4
    assert res.time_s == pytest.approx(0.2 + 0.1 + 3.8)
    _check_conservation(done)


def test_score_activations_share_the_processors_without_extending_the_phase():
    # one processor. Actors of 100 and 10 tokens decode at half speed until the short one
    # returns at 0.2 s (the long one has 10 tokens). Its score starts 0.1 s later (0.3 s; the
    # long one is at 20 tokens) with 0.2 + 0.1 x 1 sample = 0.3 s of work: shared, it takes
    # 0.6 s (to 0.9 s) while the long actor gains 30 tokens; its last 50 take 0.5 s: 1.4 s.
    # The long actor's own score starts after the phase and does not extend it.
    specs = [ActorSpec((Sample(0, 0, 0, 100),), 0.0, 0.0), ActorSpec((Sample(1, 1, 0, 10),), 0.0, 0.0)]
    cfg = SimConfig(profile=FLAT, gpus_per_actor=1, shared_processors=1, submit_s=0.1, score_work_s=0.2,
                    score_work_s_per_sample=0.1)
    res, done = simulate_phase(specs, cfg)
    assert res.time_s == pytest.approx(1.4)
    _check_conservation(done)
    # a cut action's score covers only its finished samples: 2 x 0.1 + 0.2 = 0.4 s of work
    # from 0.3 s, sharing one processor with the continuation started at 0.2 s (no start-up)
    res, done = simulate_phase([_cut_pair()[0]], _live(shared_processors=1, submit_s=0.1, score_work_s=0.2,
                                                         score_work_s_per_sample=0.1))
    # continuation: 0.2 -> 0.3 submission; 0.3 -> 1.1 shares with the score (40 tokens);
    # then the longest straggler's last 400 - 20 - 40 = 340 tokens alone
    assert res.time_s == pytest.approx(0.3 + 0.8 + 3.4)
    _check_conservation(done)


def test_live_window_needs_the_live_flow_settings():
    with pytest.raises(ValueError, match="migrate_window_s"):
        SimConfig(profile=FLAT, gpus_per_actor=1, cut_threshold=0.5, migrate_window_s=0.25)


def test_task_submission_work_shares_the_processors():
    # one processor, one actor of 100 tokens at 10 ms: its own submission (0.1 s of flow work
    # from 0 s) runs beside it, so both go at half speed until 0.2 s (10 tokens); the last 90
    # tokens then take 0.9 s. The continuation's and scores' submissions count the same way.
    cfg = SimConfig(profile=FLAT, gpus_per_actor=1, shared_processors=1, task_work_s=0.1)
    res, done = simulate_phase([ActorSpec((Sample(0, 0, 0, 100),), 0.0, 0.0)], cfg)
    assert res.time_s == pytest.approx(1.1)
    _check_conservation(done)
    # the flow's task work runs one task at a time: on 2 processors an actor beside 3 queued
    # submissions (0.3 s) sees 2 loads, never slows down (in parallel they would be 4 loads)
    specs = [ActorSpec((Sample(0, 0, 0, 100),), 0.0, 0.0)] + [ActorSpec((), 0.0, 0.0) for _ in range(2)]
    cfg = SimConfig(profile=FLAT, gpus_per_actor=1, shared_processors=2, task_work_s=0.1)
    assert simulate_phase(specs, cfg)[0].time_s == pytest.approx(1.0)
    # the cut pair on one processor (window 1 s, no score work): 0 -> 0.6 s, the two
    # submissions one after the other beside the two actors (3 busy) -- each actor gains 20
    # tokens: actor 0 reaches its cut (returns), actor 1 is at 20; 0.6 -> 0.9 s,
    # actor 1 alone decodes its last 30 tokens and returns; the continuation is submitted at
    # 0.9 s and its submission work (0.1 s) halves its speed to 1.1 s (10 tokens); then the
    # longest straggler's last 400 - 20 - 10 = 370 tokens take 3.7 s
    res, done = simulate_phase(_cut_pair(), _live(shared_processors=1, task_work_s=0.1))
    assert res.time_s == pytest.approx(1.1 + 3.7)
    _check_conservation(done)


def test_background_load_shares_the_processors():
    # two actors of 100 tokens at 10 ms on 2 processors with half a processor busy elsewhere:
    # 2.5 loads on 2 processors, each actor at 2 / 2.5 of its speed: 1.25 s
    def specs(n):
        return [ActorSpec((Sample(i, i, 0, 100),), 0.0, 0.0) for i in range(n)]
    cfg = SimConfig(profile=FLAT, gpus_per_actor=1, shared_processors=2, background_processors=0.5)
    assert simulate_phase(specs(2), cfg)[0].time_s == pytest.approx(1.25)
    # one actor: 1.5 loads on 2 processors, no slow-down
    assert simulate_phase(specs(1), cfg)[0].time_s == pytest.approx(1.0)
