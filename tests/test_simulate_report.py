"""What ``rlhfless simulate`` bills and reports (``flows/simulate``): a fixed allocation's held
actors, the value objective's default value of time, the trace's step order, the JSON report's
names for the table's columns and the text report's arithmetic and rounding."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sim_cluster import qwen_cluster

from flows.simulate.cli import main
from flows.simulate.policies import parse_policy
from flows.simulate.replay import PromptRow, TraceStep, read_trace, replay

RATE = 4e4  # learner tokens/s


def _step(prompts: int) -> TraceStep:
    rows = tuple(PromptRow(i, 60 + 5 * i, 40 + 10 * i, tuple(40 + 10 * i + d for d in (0, 6, 12, 50)))
                 for i in range(prompts))
    return TraceStep(0, 0, rows, max_new_tokens=512)


def _write(path: Path, *rows: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_static_n_holds_n_actors_in_a_step_of_fewer_prompts():
    """The planner gives static:8 four actors for four prompts; the allocation still holds eight
    (policies module docstring: GPU-s = N x GPUs x phase time)."""
    step = _step(4)
    runs = replay([step], ["static:8", "static:4"], qwen_cluster())
    eight, four = runs["static:8"].steps[0], runs["static:4"].steps[0]
    assert eight.gen_time_s == pytest.approx(four.gen_time_s)  # the idle actors change no timing
    assert eight.n_actors == 8 and four.n_actors == 4
    assert eight.gpu_seconds == pytest.approx(8 * 2 * eight.gen_time_s)
    assert eight.gpu_seconds == pytest.approx(2 * four.gpu_seconds)
    # standalone through the learner's phases too: all eight held
    whole = replay([step], ["static:8"], qwen_cluster(learner_tokens_per_s=RATE))["static:8"].steps[0]
    assert whole.gpu_seconds == pytest.approx(8 * 2 * whole.time_s)


def test_the_value_of_time_defaults_to_the_learner_gpus():
    rlhfless = parse_policy("rlhfless")
    told = {gpus: qwen_cluster(objective="value", learner_gpus=gpus).planner_settings(rlhfless)
            for gpus in (None, 4, 16)}
    assert {g: s.value_of_time_usd_per_s for g, s in told.items()} == {None: 8.0, 4: 4.0, 16: 16.0}
    given = qwen_cluster(objective="value", learner_gpus=16, value_of_time_usd_per_s=2.5)
    assert given.planner_settings(rlhfless).value_of_time_usd_per_s == 2.5
    # the planner plans with it: 16 learner GPUs plan as a value of 16 given outright
    steps = [_step(24)]
    by_gpus = replay(steps, ["rlhfless"], qwen_cluster(objective="value", learner_gpus=16))["rlhfless"]
    by_value = replay(steps, ["rlhfless"], qwen_cluster(objective="value", learner_gpus=16,
                                                        value_of_time_usd_per_s=16.0))["rlhfless"]
    assert [p.assignments for p in by_gpus.plans] == [p.assignments for p in by_value.plans]


ROW = {"epoch": 0, "step": 0, "prompt_id": 1, "prompt_len": 5, "answer_len": 3, "response_lens": [4, 5]}


@pytest.mark.parametrize("keys,line,seen,after", [
    ([(0, 1), (0, 0)], 2, "epoch 0, step 0", "epoch 0, step 1"),
    ([(0, 0), (0, 1), (0, 0)], 3, "epoch 0, step 0", "epoch 0, step 1"),  # a step split around another
    ([(1, 0), (0, 3)], 2, "epoch 0, step 3", "epoch 1, step 0"),
])
def test_a_line_of_an_earlier_step_after_a_later_one_is_refused(tmp_path, keys, line, seen, after):
    rows = [{**ROW, "epoch": e, "step": s, "prompt_id": i} for i, (e, s) in enumerate(keys)]
    path = _write(tmp_path / "t.jsonl", *rows)
    with pytest.raises(ValueError) as exc:
        read_trace(path)
    assert str(exc.value) == (f"{path}:{line}: {seen} comes after {after}; steps replay in file order, each "
                              "predicted from the epochs before it: sort the trace by epoch, step")


def test_steps_in_order_are_read_in_order(tmp_path):
    keys = [(0, 0), (0, 0), (0, 1), (1, 0), (1, 2)]
    rows = [{**ROW, "epoch": e, "step": s, "prompt_id": i} for i, (e, s) in enumerate(keys)]
    steps = read_trace(_write(tmp_path / "t.jsonl", *rows))
    assert [(s.epoch, s.step, len(s.prompts)) for s in steps] == [(0, 0, 2), (0, 1, 1), (1, 0, 1), (1, 2, 1)]


def test_a_group_of_no_tokens_is_refused(tmp_path):
    path = _write(tmp_path / "t.jsonl", ROW, {**ROW, "prompt_id": 2, "response_lens": [0, 0, 0]})
    with pytest.raises(ValueError) as exc:
        read_trace(path)
    assert str(exc.value) == (f"{path}:2: response_lens=[0, 0, 0]: every sample 0 tokens, a group that generated "
                              "nothing; give each sample's generated tokens, or drop the line")
    # one sample of no tokens beside others is a group that generated something
    assert read_trace(_write(tmp_path / "ok.jsonl", {**ROW, "response_lens": [0, 7]}))[0].prompts[0].response_lens \
        == (0, 7)


def _one_prompt(tmp_path: Path, lens: list[int], prompt_len: int, answer_len: int) -> Path:
    return _write(tmp_path / "one.jsonl", {"epoch": 0, "step": 0, "prompt_id": 47, "prompt_len": prompt_len,
                                            "answer_len": answer_len, "response_lens": lens, "max_new_tokens": 2048})


def test_the_json_report_names_the_actor_bill_as_the_table_does(tmp_path, capsys):
    trace = _one_prompt(tmp_path, [182, 156, 159, 187], 190, 88)
    args = ["--trace", str(trace), "--policy", "static:3", "--policy", "rlhfless"]
    assert main([*args, "--json"]) == 0
    policies = json.loads(capsys.readouterr().out)["policies"]
    assert main(args) == 0
    table = capsys.readouterr().out.split("whole step")[1].splitlines()
    assert table[1].split()[2] == "actor_gpu_s" and table[1].split()[8] == "total_gpu_s"
    for name, summary in policies.items():
        row = next(line.split() for line in table if line.startswith(name + " "))
        assert summary["actor_gpu_seconds"] == pytest.approx(sum(s["gpu_seconds"] for s in summary["steps"]))
        assert summary["total_gpu_seconds"] == summary["actor_gpu_seconds"]  # the older name, kept
        assert f"{summary['actor_gpu_seconds']:.1f}" == row[2]
        assert f"{summary['total_gpu_seconds_with_learner']:.1f}" == row[8]


@pytest.mark.parametrize("lens,prompt_len,answer_len", [
    ([115, 135, 103, 108], 204, 54),  # printed 8 x 0.4 s = 3.3 GPU-s
    ([182, 156, 159, 187], 190, 88),
    ([300, 310, 290, 305], 120, 150),
])
def test_the_hybrid_line_s_arithmetic_reads_right(tmp_path, capsys, lens, prompt_len, answer_len):
    trace = _one_prompt(tmp_path, lens, prompt_len, answer_len)
    assert main(["--trace", str(trace), "--policy", "static:1", "--policy", "rlhfless"]) == 0
    found = re.search(r"alone: (\d+) x ([0-9.]+) s = ([0-9.]+) GPU-s;", capsys.readouterr().out)
    assert found is not None
    gpus, seconds, total = found.groups()
    assert f"{int(gpus) * float(seconds):.1f}" == total


def test_a_round_off_difference_prints_as_no_cut(tmp_path, capsys):
    """One prompt, one actor each: rlhfless bills static:1's GPU-s to within round-off, which
    printed as -0.0%."""
    trace = _one_prompt(tmp_path, [182, 156, 159, 187], 190, 88)
    assert main(["--trace", str(trace), "--budget-actors", "1", "--policy", "static:1", "--policy", "rlhfless"]) == 0
    out = capsys.readouterr().out
    assert "-0.0%" not in out
    generation = next(line.split() for line in out.splitlines() if line.startswith("rlhfless "))
    assert generation[4] == "0.0%"


def test_make_traces_states_the_capheavy_share_it_prints():
    import benchmarks.make_traces as make_traces

    stated = re.search(r"``capheavy``: [^;]*?about (\d+)% of groups run to the", make_traces.__doc__, re.S)
    assert stated is not None
    rows = make_traces.make_trace("capheavy", 0)
    share = sum(max(r["response_lens"]) >= make_traces.CAP for r in rows) / len(rows)
    assert int(stated.group(1)) == round(100 * share)
