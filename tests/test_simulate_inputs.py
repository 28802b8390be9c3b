"""What ``rlhfless simulate`` refuses up front, in one line naming the trace line or the flag:
trace values out of range (``flows/simulate/replay.py``), flags the cluster model cannot hold
(``flows/simulate/cli.py: build_model``), and output it could not write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.simulate.cli import main

ROW = {"epoch": 0, "step": 0, "prompt_id": 1, "prompt_len": 5, "answer_len": 3, "response_lens": [4, 5]}


def _trace(tmp_path: Path, *rows: dict, raw: bytes = b"") -> Path:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows) + raw)
    return path


@pytest.mark.parametrize("change,named", [
    ({"answer_len": -50}, ":2: answer_len=-50: must be an integer in [0, 1048576]"),
    ({"prompt_len": -100}, ":2: prompt_len=-100: must be an integer in [1, 1048576]"),
    ({"prompt_len": 0, "response_lens": [0, 0]}, ":2: prompt_len=0"),  # a phase of no work: 0 s floors
    ({"response_lens": [10**12]}, ":2: response_lens=[1000000000000]: must be a non-empty list of integers"),
    ({"response_lens": [True, 3]}, ":2: response_lens=[True, 3]"),
    ({"prompt_id": -1}, ":2: prompt_id=-1"),
    ({"answer_len": 10**400}, ":2: answer_len=100000000000... (401 digits)"),
    ({"max_new_tokens": 2**40}, ":2: max_new_tokens=1099511627776: must be an integer in [1, 1048576]"),
    ({"max_new_tokens": True}, ":2: max_new_tokens=True"),
])
def test_trace_values_out_of_range_name_the_line(tmp_path, change, named):
    """Each of these failed deep in the simulator (IndexError, numpy's negative dimensions, a
    466 GiB allocation, ZeroDivisionError, OverflowError) or was taken as a length (True as 1)."""
    from flows.simulate.replay import read_trace

    path = _trace(tmp_path, {**ROW, "prompt_id": 0}, {**ROW, **change})
    with pytest.raises(ValueError) as exc:
        read_trace(path)
    assert str(exc.value).startswith(f"{path}:2: ") and named in str(exc.value)


def test_undecodable_or_overlong_lines_name_the_line(tmp_path):
    from flows.simulate.replay import read_trace

    with pytest.raises(ValueError, match=r"t\.jsonl:2: not UTF-8 text .*save the trace as UTF-8"):
        read_trace(_trace(tmp_path, ROW, raw=b'{"note": "caf\xe9"}\n'))
    digits = b'{"epoch": 0, "step": 0, "prompt_id": ' + b"9" * 5000 + b"}\n"  # past int's 4300-digit parse limit
    with pytest.raises(ValueError, match=r"t\.jsonl:2: a number too long"):
        read_trace(_trace(tmp_path, ROW, raw=digits))


def test_the_floor_of_no_work_is_an_error_not_a_division_by_zero():
    from flows.simulate.bound import max_speedup

    with pytest.raises(ValueError, match="floors total 0"):
        max_speedup([1.0, 2.0], [0.0, 0.0])
    assert max_speedup([1.0, 2.0], [0.5, 1.0]) == 2.0


@pytest.mark.parametrize("args,named", [
    (["--max-new-tokens", "0"], "--max-new-tokens=0: must be in [1, 1048576]"),
    (["--max-new-tokens", str(2**21)], "--max-new-tokens=2097152"),
    # reported as the cluster.* or scaling.* setting they fill, or not checked at all
    (["--bandwidth-gb-per-gpu", "-40"], "--bandwidth-gb-per-gpu=-40.0: must be a finite number of GB/s > 0"),
    (["--n-min", "0"], "--n-min=0: must be >= 1"),
    (["--n-min", "5", "--n-max", "2"], "--n-max=2: below --n-min=5"),
    (["--learner-mfu", "1.5"], "--learner-mfu=1.5: must be in (0, 1]"),
    (["--learner-gpus", "0"], "--learner-gpus=0: must be >= 1"),
    (["--cut-threshold", "2"], "--cut-threshold=2.0: must be in (0, 1]"),  # accepted unless --objective value
    (["--lam", "nan"], "--lam=nan"),
    (["--cold-start-s", "inf"], "--cold-start-s=inf: must be a finite number of seconds >= 0"),
    (["--gpus-per-actor", "16", "--gpus-per-node", "8"], "--gpus-per-actor=16: more than --gpus-per-node=8"),
    (["--nodes", "1", "--policy", "static:100"], "--policy 'static:100': 100 actors of --gpus-per-actor 2 need "
                                                 "200 GPUs, but --nodes 1 x --gpus-per-node 8 hold 4 such actors"),
    (["--nodes", "1", "--gpus-per-actor", "8"], "default policy 'static:3' (pass --policy to choose)"),
    (["--policy", "static:0"], "policy='static:0': N must be a whole number >= 1 (the actors it holds), e.g. static:3"),
    (["--max-new-tokens", "512"], "--max-new-tokens 512, but the trace states [256]; drop the flag"),
    # the runs are keyed by name: a second static:3 was added to the first's totals
    (["--policy", "static:3", "--policy", "static:3", "--policy", "rlhfless"],
     "--policy 'static:3' given twice; name each policy once"),
    # the live config's scaling.policy spellings, mapped to the simulator's
    (["--policy", "cost_aware"], "the live scaling.policy 'cost_aware' is 'rlhfless' here"),
    (["--policy", "fixed:3"], "the live scaling.policy 'fixed:3' is 'no-scale:3' here"),
])
def test_flags_are_named_in_the_error(tmp_path, capsys, args, named):
    path = _trace(tmp_path, {**ROW, "max_new_tokens": 256})
    assert main(["--trace", str(path), *args]) == 2
    err = capsys.readouterr().err
    assert named in err and err.count("\n") == 1, err


def _small(tmp_path: Path, name: str = "t.jsonl") -> Path:
    """Two steps of four prompts (cap stated): simulated in well under a second."""
    rows = [{**ROW, "step": s, "prompt_id": i, "prompt_len": 20 + i, "response_lens": [8 + i, 12 + 2 * i],
             "max_new_tokens": 64} for s in range(2) for i in range(4)]
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


FAST = ["--nodes", "2", "--policy", "rlhfless", "--policy", "static:3"]


@pytest.mark.parametrize("plot,named", [
    ("{tmp}/missing/p.png", "the folder"),
    ("{tmp}", "name a file ending in .png, .pdf, .svg"),  # matplotlib would write {tmp}.png beside it
    ("{tmp}/p.xyz", "name a file ending in"),
    ("{tmp}/taken.png", "is a directory"),
])
def test_a_plot_that_cannot_be_written_is_refused_before_simulating(tmp_path, capsys, plot, named):
    (tmp_path / "taken.png").mkdir()
    trace = _small(tmp_path)
    plot = plot.format(tmp=tmp_path)
    assert main(["--trace", str(trace), *FAST, "--plot", plot]) == 2  # not a traceback (python -m flows.simulate)
    out, err = capsys.readouterr()
    assert out == "" and f"--plot {plot!r}" in err and named in err and err.count("\n") == 1, err
    assert not Path(f"{tmp_path}.png").exists()


def test_traces_of_the_same_file_name_get_a_plot_each(tmp_path, capsys):
    a, b = _small(tmp_path / "a"), _small(tmp_path / "b")
    assert main(["--trace", str(a), "--trace", str(b), *FAST, "--plot", str(tmp_path / "p.svg"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert sorted(p.name for p in tmp_path.glob("p-*")) == ["p-t-2.svg", "p-t.svg"]
    # each file written is named (on stderr: stdout stays one JSON document)
    assert f"wrote {tmp_path / 'p-t.svg'} (plot of {a})" in err
    assert f"wrote {tmp_path / 'p-t-2.svg'} (plot of {b})" in err
    assert set(json.loads(out)["traces"]) == {str(a), str(b)}


def test_a_missing_trace_is_named_as_the_main_cli_names_it(tmp_path, capsys):
    """``python -m flows.simulate`` printed Python's bare ``[Errno 2]``."""
    missing = tmp_path / "nope.jsonl"
    assert main(["--trace", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == f"rlhfless simulate: --trace {str(missing)!r} is not a file; pass a JSONL length trace\n"
    assert main(["--trace", str(tmp_path)]) == 2  # a directory too
    assert "is not a file" in capsys.readouterr().err


def test_a_policy_named_twice_is_refused_by_replay_too(tmp_path):
    from sim_cluster import qwen_cluster

    from flows.simulate.replay import read_trace, replay

    with pytest.raises(ValueError, match="policy 'static:3' given twice"):
        replay(read_trace(_small(tmp_path)), ["static:3", "rlhfless", "static:3"], qwen_cluster())


def test_the_value_of_time_frontier_is_labelled_in_gpu_seconds_per_second(tmp_path, capsys):
    """The simulator prices a GPU-second at 1: the knob's unit is GPU-s per second, not dollars."""
    trace = _small(tmp_path)
    assert main(["--trace", str(trace), *FAST, "--frontier", "--objective", "value", "--json"]) == 0
    frontier = json.loads(capsys.readouterr().out)["frontier"]
    assert frontier["knob"] == "value_of_time_gpu_s_per_s" and "value_of_time_gpu_s_per_s" in frontier["rows"][0]
    assert main(["--trace", str(trace), *FAST, "--frontier", "--objective", "value"]) == 0
    out = capsys.readouterr().out
    assert "value_of_time_gpu_s_per_s" in out and "usd" not in out


def test_json_keeps_the_frontier_and_every_trace_given(tmp_path, capsys):
    trace = _small(tmp_path)
    assert main(["--trace", str(trace), *FAST, "--json", "--frontier", "--objective", "slack"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["frontier"]["rows"]
    assert report["frontier"]["knob"] == "time_slack" and len(rows) == 7
    assert set(rows[0]) == {"time_slack", "gen_time", "gen_gpu_seconds", "step_time", "step_gpu_seconds",
                            "step_gpu_seconds_with_learner", "mean_n"}
    assert main(["--trace", str(trace), "--trace", str(trace), *FAST, "--json"]) == 0  # the same trace twice
    report = json.loads(capsys.readouterr().out)
    assert list(report["traces"]) == [str(trace), f"{trace}#2"]
    assert all(set(r) == {"policies", "generation_floor"} for r in report["traces"].values())


def test_the_frontier_s_baseline_must_fit_the_cluster(tmp_path, capsys):
    trace = _small(tmp_path)
    assert main(["--trace", str(trace), "--nodes", "1", "--gpus-per-actor", "4", "--policy", "rlhfless",
                 "--frontier"]) == 2
    assert "--frontier's baseline 'static:3': 3 actors" in capsys.readouterr().err


def test_without_a_static_baseline_the_ratio_columns_are_dashes_not_nan(tmp_path, capsys):
    """speedup and gpu_s_cut compare with the first static:N policy: without one in --policy,
    each is ``-`` and a closing line says why (the JSON report has no ratios, nor a baseline)."""
    trace = _small(tmp_path)
    assert main(["--trace", str(trace), "--nodes", "2", "--policy", "rlhfless"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower()
    rows = [line.split() for line in out.splitlines() if line.startswith("rlhfless ")]
    assert len(rows) == 2 and all(row[3:5] == ["-", "-"] for row in rows)  # generation, whole step
    assert out.count("--policy names none") == 2
    assert main(["--trace", str(trace), "--nodes", "2", "--policy", "rlhfless", "--json"]) == 0
    assert "baseline" not in json.loads(capsys.readouterr().out)["generation_floor"]
    assert main(["--trace", str(trace), *FAST]) == 0  # with one: the ratios, and no such line
    out = capsys.readouterr().out
    assert "--policy names none" not in out and [line.split()[3] for line in out.splitlines()
                                                 if line.startswith("static:3 ")] == ["1.00x", "1.00x"]


def _profile(tmp_path: Path, seconds, identity: dict | None = None, name: str = "p.json") -> Path:
    from flows.planning.tpot import ProfileIdentity, TpotProfile

    profile = TpotProfile(batch_sizes=(1, 2, 64), contexts=(1.0, 4096.0), seconds=seconds, prefill_tokens_per_s=5e4,
                          identity=ProfileIdentity(**identity) if identity else None)
    path = tmp_path / name
    path.write_text(json.dumps(profile.to_dict()))
    return path


def test_a_profile_that_breaks_the_floor_s_conditions_gets_no_bound_rather_than_a_wrong_one(tmp_path, capsys):
    """Measured on a loaded machine, a batch of 2 may step faster than a lone sample: plans then
    end phases under the floor, and the bound is withdrawn (naming why), not printed below the
    table's own times."""
    trace = _small(tmp_path)
    falling = _profile(tmp_path, ((0.05, 0.06), (0.01, 0.012), (0.001, 0.0012)))  # faster with more rows
    assert main(["--trace", str(trace), *FAST, "--profile", str(falling)]) == 0
    out = capsys.readouterr().out
    assert "bound: n/a: " in out and "under the floor" in out and "max speed-up" not in out
    assert main(["--trace", str(trace), *FAST, "--profile", str(falling), "--json"]) == 0
    assert "under the floor" in json.loads(capsys.readouterr().out)["generation_floor"]["invalid"]
    rising = _profile(tmp_path, ((0.01, 0.012), (0.011, 0.013), (0.03, 0.04)), name="q.json")  # a roofline's shape
    assert main(["--trace", str(trace), *FAST, "--profile", str(rising)]) == 0
    out = capsys.readouterr().out
    assert "bound: no plan can run" in out and "bound: n/a" not in out


def test_a_profile_file_s_identity_picks_the_model_and_learner_or_is_warned_about(tmp_path, capsys):
    trace = _small(tmp_path)
    seconds = ((0.01, 0.012), (0.011, 0.013), (0.03, 0.04))
    # a roofline file of a model and GPU the simulator knows: both taken from it, no warning
    known = _profile(tmp_path, seconds, {"model": "Llama2-70B", "device": "A100-SXM-80G", "engine": "roofline"})
    assert main(["--trace", str(trace), *FAST, "--profile", str(known)]) == 0
    out, err = capsys.readouterr()
    assert "A100-SXM-80G" in out and "68.98B FLOPs" in out and "warning" not in err
    # a measured profile of a model it has no shape for: modelled as the default, and said so
    tiny = _profile(tmp_path, seconds, {"model": "qwen2 tiny", "device": "cpu:AMD EPYC", "engine": "torch"},
                    name="tiny.json")
    assert main(["--trace", str(trace), *FAST, "--profile", str(tiny)]) == 0
    err = capsys.readouterr().err
    assert "was measured on qwen2 tiny (cpu:AMD EPYC)" in err and "modelled as Qwen2.5-7B on H100-SXM" in err
    assert "pass --model and --learner-gpu" in err


def test_an_empty_trace_says_what_a_line_holds(tmp_path, capsys):
    assert main(["--trace", str(_trace(tmp_path, raw=b"\n"))]) == 2
    assert "no trace lines; write one JSON object per line (epoch, step, prompt_id" in capsys.readouterr().err
