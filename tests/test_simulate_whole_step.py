"""The whole step's bill (``flows/simulate/replay.py: execute_step``): static:N is the
standalone baseline, its actors billed through the learner's phases; every policy's actors'
GPU-s are reported beside the total with the learner's GPUs, held through every step, where
what a serverless policy runs on the learner node is counted once. Also the cluster's actor
capacity, the trace's required fields and what the CLI says of cold starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_cluster import qwen_cluster

from flows.planning.timeline import prefill_seconds
from flows.simulate.cli import add_arguments, check_fits, main
from flows.simulate.policies import parse_policy
from flows.simulate.replay import PromptRow, TraceStep, read_trace, replay

RATE = 4e4  # learner tokens/s: a learner phase of a few seconds on the step below


def _step() -> TraceStep:
    """16 prompts of 4 samples, the cap stated."""
    rows = tuple(PromptRow(i, 50 + 3 * i, 30 + 10 * i, tuple(30 + 10 * i + d for d in (0, 4, 8, 60)))
                 for i in range(16))
    return TraceStep(0, 0, rows, max_new_tokens=512)


def _learn_s(step: TraceStep) -> float:
    return sum(r.prompt_len * len(r.response_lens) + sum(r.response_lens) for r in step.prompts) / RATE


def test_static_is_standalone_and_the_learner_is_counted_beside_the_actors():
    step, model = _step(), qwen_cluster(learner_tokens_per_s=RATE)
    gen = replay([step], ["static:3"], qwen_cluster())["static:3"].steps[0]
    run = replay([step], ["static:3"], model)["static:3"]
    s = run.steps[0]
    # its 3 x 2 GPUs are its own, held idle through the learner's phases...
    assert s.time_s == pytest.approx(gen.time_s + _learn_s(step))
    assert s.gpu_seconds == pytest.approx(gen.gpu_seconds + 6 * _learn_s(step))
    # ...beside the learner's node, held through the whole step
    assert s.learner_gpu_seconds == pytest.approx(8 * s.time_s)
    assert run.summary()["total_gpu_seconds_with_learner"] == pytest.approx(s.gpu_seconds + 8 * s.time_s)


def test_serverless_actors_on_the_learner_node_are_counted_once():
    step = _step()
    # two actors, both co-located on the learner node (4 fit there): nothing runs off it, so the
    # total is the learner's GPUs x the step's time, whatever the actors billed
    run = replay([step], ["no-scale:2"], qwen_cluster(learner_tokens_per_s=RATE))["no-scale:2"]
    s = run.steps[0]
    assert s.gpu_seconds > 0 and s.gpu_seconds + s.learner_gpu_seconds == pytest.approx(8 * s.time_s)
    # one co-located actor: the prefill and actor 0 are on the learner node, the other is not
    one = qwen_cluster(learner_tokens_per_s=RATE, colocated_actors=1)
    s1 = replay([step], ["no-scale:2"], one)["no-scale:2"].steps[0]
    prefill = prefill_seconds(sum(r.prompt_len for r in step.prompts), one.profile, one.cluster_spec()) * 8
    assert 8 * s1.time_s < s1.gpu_seconds + s1.learner_gpu_seconds < 8 * s1.time_s + s1.gpu_seconds - prefill
    # a learner smaller than the node does not hold it: the actors' GPU-s are all on top of it
    small = replay([step], ["no-scale:2"], qwen_cluster(learner_tokens_per_s=RATE, learner_gpus=4))
    s4 = small["no-scale:2"].steps[0]
    assert s4.learner_gpu_seconds == pytest.approx(4 * s4.time_s)


def test_the_cli_labels_both_bills_and_the_hybrid_baseline(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"epoch": 0, "step": 0, "prompt_id": i, "prompt_len": 20 + i,
                                         "answer_len": 10, "response_lens": [8 + i, 30 + 2 * i],
                                         "max_new_tokens": 64}) + "\n" for i in range(6)))
    assert main(["--trace", str(trace), "--nodes", "2", "--policy", "rlhfless", "--policy", "static:3"]) == 0
    whole = capsys.readouterr().out.split("whole step (learner: 8 x H100-SXM")[1]
    header = whole.splitlines()[1].split()
    assert header[2] == "actor_gpu_s" and header[-2:] == ["total_gpu_s", "total_cut"]
    assert "static:N is standalone" in whole and "weight sync after each step not charged" in whole
    assert "against static:3 as a hybrid engine" in whole and "rlhfless " in whole.splitlines()[-1]
    static = next(line.split() for line in whole.splitlines() if line.startswith("static:3 "))
    time_s, actors, total = float(static[1]), float(static[2]), float(static[8])
    assert total == pytest.approx(actors + 8 * time_s, abs=0.2)


def test_an_actor_s_gpus_are_on_one_node():
    # 3 GPUs per actor on 8-GPU nodes: 2 actors a node (2 GPUs of each left over), not 16 // 3
    model = qwen_cluster(num_nodes=2, gpus_per_node=8, gpus_per_actor=3)
    assert model.max_actors == 4
    check_fits(parse_policy("static:4"), model)
    with pytest.raises(ValueError, match="hold 4 such actors"):
        check_fits(parse_policy("static:5"), model)


def test_an_empty_trace_names_every_required_field(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="no trace lines") as caught:
        read_trace(path)
    row = {"epoch": 0, "step": 0, "prompt_id": 1, "prompt_len": 5, "answer_len": 3, "response_lens": [4]}
    assert f"({', '.join(row)})" in str(caught.value)
    for name in row:  # every field the message names is required
        path.write_text(json.dumps({k: v for k, v in row.items() if k != name}) + "\n")
        with pytest.raises(ValueError, match=f"field '{name}' missing"):
            read_trace(path)


def test_the_help_says_when_a_cold_start_applies():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert "30 s cold starts" not in parser.description
    assert "--prewarm-idle-s" in parser.description and "--continuation" in parser.description
    cold = next(a for a in parser._actions if a.dest == "cold_start_s")
    assert "only with --continuation" in cold.help


def test_bench_assignment_says_why_it_skips_the_traces(tmp_path, capsys, monkeypatch):
    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(benchmarks))  # it imports its neighbours, as a script does
    from bench_assignment import run_traces

    run_traces(tmp_path / "nowhere")
    out = capsys.readouterr().out
    assert "traces: skipped" in out and "does not exist" in out and "--traces DIR" in out
    run_traces(tmp_path)
    assert "has no *.jsonl traces" in capsys.readouterr().out
    source = (benchmarks / "bench_assignment.py").read_text()  # main's own flag, passed on
    assert 'add_argument("--traces"' in source and "read_traces(Path(args.traces))" in source
