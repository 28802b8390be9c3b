"""What the planner and simulator benchmarks refuse in one line rather than a traceback:
``--repeats`` below 2 (``bench_planner.py``), an unknown ``--models`` entry
(``bench_simulator.py``), a malformed trace (``bench_simulator.py``, ``bench_assignment.py``);
and ``bench_planner.py``'s p90, which is never above the largest time."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("value", ["1", "0", "-1", "x"])
def test_bench_planner_refuses_fewer_than_two_repeats(value, capsys):
    from benchmarks.bench_planner import main

    with pytest.raises(SystemExit) as exc:
        main(["--repeats", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--repeats: {value!r}: must be a whole number >= 2" in err and "Traceback" not in err


def test_bench_planner_p90_is_within_the_times():
    from benchmarks.bench_planner import p90

    times = [1.0, 2.0, 10.0]
    assert statistics.quantiles(times, n=10)[-1] > 10.0  # the exclusive method's, above the max
    assert p90(times) <= max(times) and p90(times) == pytest.approx(8.4)
    assert p90([3.0, 3.0]) == 3.0


def test_bench_simulator_names_the_models_it_knows(capsys):
    from benchmarks.bench_simulator import main

    with pytest.raises(SystemExit) as exc:
        main(["--models", "qwen2.5-7b,gpt5"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--models 'qwen2.5-7b,gpt5': unknown model 'gpt5'" in err and "llama2-70b" in err and "qwen2.5-7b" in err


def _bad_traces(tmp_path: Path) -> Path:
    (tmp_path / "bad.jsonl").write_text('{"epoch": 0, "step": 0}\n')
    return tmp_path


def test_bench_simulator_names_a_malformed_trace_in_one_line(tmp_path, capsys):
    from benchmarks.bench_simulator import main

    assert main(["--traces", str(_bad_traces(tmp_path)), "--models", "qwen2.5-7b"]) == 2
    out, err = capsys.readouterr()
    assert err == f"bench_simulator.py: {tmp_path / 'bad.jsonl'}:1: field 'prompt_id' missing or not int\n"
    assert "==" not in out  # refused before any trace is replayed


def test_bench_assignment_names_a_malformed_trace_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it imports its neighbours, as a script does
    from bench_assignment import main

    monkeypatch.setattr(sys, "argv", ["bench_assignment.py", "--skip-live", "--traces", str(_bad_traces(tmp_path))])
    assert main() == 2
    assert capsys.readouterr().err == (f"bench_assignment.py: {tmp_path / 'bad.jsonl'}:1: field 'prompt_id' "
                                       "missing or not int\n")
