"""A campaign that fails mid-run, through the real CLI: one error line, no traceback from
Prefect's frames on the console, the way to continue in that line, and ``--resume`` then
continuing once the cause is fixed (here: a reward function that raises from step 1 on)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from conftest import TINY_OVERRIDES
except ImportError:  # tests/ imported as a package
    from tests.conftest import TINY_OVERRIDES

PLUGIN = '''
import os

def late(prompts, completions, trainer_state, **kwargs):
    if trainer_state.global_step >= 1 and not os.environ.get("FIXED"):
        raise ValueError("late failure")
    return [0.5] * len(completions)
'''


def test_a_mid_run_failure_is_one_line_naming_the_resume_and_resume_continues(tmp_path: Path, prefect_harness):
    from prefect.settings import PREFECT_API_URL

    (tmp_path / "latefail.py").write_text(PLUGIN)
    sets = [*TINY_OVERRIDES, "invoker.kind=inprocess", "steps=3", f"store.uri={tmp_path / 'store'}",
            'reward.functions=[{name: "latefail:late"}]']
    cmd = [sys.executable, "-m", "flows.commands.cli", "train", "--run-id", "late", "--out", str(tmp_path / "out"),
           *[a for s in sets for a in ("--set", s)]]
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[1])])}
    env.pop("FIXED", None)

    failed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr, failed.stderr[-3000:]
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("rlhfless: error: action score failed: reward function 'latefail:late' raised "
                           "ValueError: late failure"), last
    assert last.endswith(" --run-id late --resume` continues the run from its last committed step (1)"), last
    # the command it names is the one that ran, with --resume: pasted as printed, it continues the run
    printed = shlex.split(last.split("`")[-2])
    assert printed[:2] == ["rlhfless", "train"] and f"store.uri={tmp_path / 'store'}" in printed, printed
    resumed = subprocess.run([sys.executable, "-m", "flows.commands.cli", *printed[1:]], env={**env, "FIXED": "1"},
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (tmp_path / "out" / "summary.json").is_file()


def test_resume_of_a_run_the_store_does_not_hold_says_it_starts_it(tmp_path, capsys):
    """--resume on a run with no committed step is not refused (a scheduled run's first night),
    but says so: a mistyped run id or store would otherwise start a new run silently."""
    from flows.commands.cli import _preflight
    from flows.config import load_config

    cfg = load_config(None, [f"store.uri={tmp_path / 'store'}", "run_id=nightly"])
    lease = _preflight(cfg, tmp_path / "out", tmp_path / "out" / "summary.json", resume=True, break_lease=False)
    lease.release()
    assert "note: --resume: the store holds no committed step of run 'nightly'; starting it" in capsys.readouterr().err


def test_a_stop_while_train_writes_its_outputs_leaves_the_summary_whole_or_absent(tmp_path, monkeypatch):
    """The summary is written first and renamed into place: a stop while it is written leaves
    none (and no temporary file), one while the report is drawn leaves it whole."""
    import flows.commands.report as report
    from flows.commands.cli import Terminated, _write_outputs

    summary_path = tmp_path / "out" / "summary.json"

    def stop(*args, **kwargs):
        raise Terminated(143)

    monkeypatch.setattr(os, "replace", stop)
    with pytest.raises(Terminated):
        _write_outputs({"steps_completed": 2}, tmp_path / "out", summary_path)
    assert list((tmp_path / "out").iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setattr(report, "write_report", stop)
    with pytest.raises(Terminated):
        _write_outputs({"steps_completed": 2}, tmp_path / "out", summary_path)
    assert json.loads(summary_path.read_text()) == {"steps_completed": 2, "run_dir": str(tmp_path / "out")}


def test_the_error_line_comes_after_a_warning_of_the_lease_release(tmp_path, monkeypatch, capsys):
    """A run that fails releases its lease before the error line is printed: a warning the
    release gives (a store that would not delete the lease) never follows the error, which
    stays the last line the user sees."""
    import flows.campaign.run as campaign_run
    import flows.commands.cli as cli
    import flows.commands.local_api as local_api

    class WarningLease:
        def release(self) -> None:
            print("could not release the lease of run 'warned': the store did not answer", file=sys.stderr)

    def fails(**kwargs):
        raise ValueError("the real error")

    monkeypatch.setattr(cli, "_preflight", lambda *args: WarningLease())
    monkeypatch.setattr(local_api, "start_local_api", lambda: None)
    monkeypatch.setattr(campaign_run, "rlhf_campaign", fails)
    assert cli.main(["train", "--run-id", "warned", "--set", f"store.uri={tmp_path / 'store'}",
                     "--out", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-2:] == ["could not release the lease of run 'warned': the store did not answer",
                          "rlhfless: error: the real error"], lines


def test_a_step_run_cancelled_in_prefect_stops_train_in_one_line_with_the_resume(tmp_path, monkeypatch, capsys):
    """A step's flow run cancelled from Prefect (the UI or ``prefect flow-run cancel``) stops the
    campaign after committing that step: ``train`` says so in one line, not with a traceback."""
    import flows.campaign.run as campaign_run
    import flows.commands.cli as cli
    import flows.commands.local_api as local_api

    class Lease:
        def release(self) -> None:
            pass

    line = "stopped after step 1/3: its step run 'brave-fox' was cancelled; resume the run to continue"

    def cancelled(**kwargs):
        raise campaign_run.StepRunCancelled(line)

    monkeypatch.setattr(cli, "_preflight", lambda *args: Lease())
    monkeypatch.setattr(local_api, "start_local_api", lambda: None)
    monkeypatch.setattr(campaign_run, "rlhf_campaign", cancelled)
    assert cli.main(["train", "--run-id", "cut", "--set", f"store.uri={tmp_path / 'store'}",
                     "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"rlhfless: error: {line}"]
