"""``export`` and ``gc`` of a run with no commit yet judge it as ``status`` does: set up now
under a held lease (who holds it), set-up interrupted (a lease whose process is gone, or set-up
objects left without a lease: ``train --resume`` sets it up again), or no such run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from actions.store import LocalStore
from flows.campaign.lease import RunLease
from flows.commands.cli import main

RUN = "uc"
_KILLED_DURING_SETUP = """
import os, sys
from actions.store import LocalStore
from flows.campaign.lease import RunLease
store = LocalStore(sys.argv[1])
store.put("runs/uc/base/config.json", b"{}")  # what prepare wrote before the kill
RunLease.acquire(store, "uc", renew=False, progress=lambda m: None)
print(os.getpid(), flush=True)
os._exit(9)  # killed: the lease stays, held by a pid that no longer runs
"""


def _killed_during_setup(root: Path) -> int:
    """Run a process that takes the run's lease as ``train`` does, then dies without a
    commit; its pid."""
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", _KILLED_DURING_SETUP, str(root)], capture_output=True, text=True,
                          cwd=repo, env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 9, done.stderr
    return int(done.stdout.split()[0])


def _refusal(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


@pytest.mark.parametrize("command", ["export", "gc"])
def test_a_run_killed_during_setup_is_named_interrupted_not_being_trained(tmp_path, capsys, command):
    """Killed during warm-up, before its first commit: its lease, fresh (within its 60 s), names
    a pid that is gone. ``status`` calls it stale; export and gc say the set-up was interrupted
    and how to continue it, never that the dead process trains it."""
    root = tmp_path / "s"
    pid = _killed_during_setup(root)
    argv = [command, RUN, "--store", str(root)] + (["--out", str(tmp_path / "o")] if command == "export" else [])
    err = _refusal(capsys, *argv)
    assert f"run '{RUN}' has committed nothing yet: its set-up was interrupted (its process (pid {pid}) is gone)" \
        in err, err
    assert f"`rlhfless train --run-id {RUN} --resume`" in err and "being trained" not in err, err
    assert ("check the run id" not in err) and not (tmp_path / "o").exists()
    if command == "gc":
        assert err.endswith("gc has nothing of it to collect yet"), err
    assert main(["status", RUN, "--store", str(root)]) == 0  # the same judgement
    lease = json.loads(capsys.readouterr().out)["lease"]
    assert not lease["held"] and lease["stale"] == f"its process (pid {pid}) is gone"


@pytest.mark.parametrize("command", ["export", "gc"])
def test_gc_and_export_of_a_run_being_set_up_or_left_name_its_state(tmp_path, capsys, command):
    """Held by a live trainer: who holds it. Set-up objects with no lease (stopped before its
    first commit): interrupted. Nothing of the run: check the run id and --store."""
    root = tmp_path / "s"
    store = LocalStore(root)
    argv = [command, RUN, "--store", str(root)] + (["--out", str(tmp_path / "o")] if command == "export" else [])
    lease = RunLease.acquire(store, RUN, ttl_s=60, renew=False, host="trainer", pid=4242, progress=lambda m: None)
    err = _refusal(capsys, *argv)
    assert f"run '{RUN}' has committed nothing yet: it is being trained by host 'trainer' pid 4242 since " in err
    assert "check the run id" not in err, err
    lease.release()
    err = _refusal(capsys, *argv)
    assert f"run '{RUN}' has no committed state in store {root}; check the run id and --store" in err, err
    store.put(f"runs/{RUN}/base/config.json", b"{}")
    err = _refusal(capsys, *argv)
    assert f"run '{RUN}' has committed nothing yet: its set-up was interrupted; `rlhfless train --run-id {RUN} " \
           "--resume` with its configuration sets it up again" in err, err
