"""Ctrl-C or SIGTERM sent to ``rlhfless train`` alone ends it with one line naming the run to
resume and the exit status a shell gives that signal (130, 143), not a traceback; the lease is
released on the way out. The campaign is a stand-in that waits (no Prefect server, seconds);
tests/test_server_lifetime.py signals a real flow's whole process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

try:
    from conftest import TINY_OVERRIDES
except ImportError:  # tests/ imported as a package
    from tests.conftest import TINY_OVERRIDES

REPO = Path(__file__).resolve().parents[1]
WAITING_TRAIN = textwrap.dedent("""
    import signal, sys, time
    import flows.campaign.run as run
    import flows.commands.local_api as local_api
    from flows.commands.cli import main

    def waits(config, resume):
        print("running", flush=True)
        time.sleep(300)

    run.rlhf_campaign, local_api.start_local_api = waits, lambda: None
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job's children ignore it
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_to_train_alone_is_one_line_and_the_shells_exit_status(tmp_path, sig):
    store = tmp_path / "store"
    args = [a for o in [*TINY_OVERRIDES, f"store.uri={store}", "invoker.kind=inprocess"] for a in ("--set", o)]
    proc = subprocess.Popen([sys.executable, "-c", WAITING_TRAIN, "train", "--run-id", "sig", "--out",
                             str(tmp_path / "out"), *args], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "running", proc.communicate(timeout=60)[1][-3000:]
        assert (store / "runs" / "sig" / "lease.json").exists()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlhfless: "), err[-3000:]
    assert "'sig'" in lines[0] and "--resume" in lines[0]
    assert not (store / "runs" / "sig" / "lease.json").exists()
