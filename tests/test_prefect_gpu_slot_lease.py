"""The GPU limit's slots of a flow process that is gone (a cancelled deployment run, a kill)
come back when their lease expires (``flows/step/invoke.py: GPU_SLOT_LEASE_S``), not after
Prefect's default 300 s that kept the next run waiting five minutes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_prefect_deployment import REPO, LocalPrefectServer

from flows.step.invoke import GPU_SLOT_LEASE_S

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]  # waits out a 60 s lease

HOLD_AND_DIE = """
import os, signal
from flows.config import load_config
from flows.step import invoke
cfg = load_config(None, ["invoker.gpu_concurrency_limit=gpu-lease", "scaling.gpus_per_actor=2"])
with invoke.gpu_slots("generate", cfg):
    print("held", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # gone without releasing, as a cancelled run's process
"""


class QuickServer(LocalPrefectServer):
    def env(self) -> dict[str, str]:  # the server's sweep of expired leases every 2 s, not 15
        return {**super().env(), "PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS": "2"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuickServer]:
    srv = QuickServer(tmp_path_factory.mktemp("prefect-home"))
    srv.start()
    yield srv
    srv.stop()


def test_a_killed_holders_gpu_slots_come_back_when_their_lease_expires(server: QuickServer, tmp_path: Path):
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    assert GPU_SLOT_LEASE_S == 60.0  # the least the server takes (it answers 422 below 60 s)
    with server.client() as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name="gpu-lease", limit=4))
    script = tmp_path / "hold.py"
    script.write_text(HOLD_AND_DIE)
    out = subprocess.run([sys.executable, str(script)], cwd=REPO, env={**server.env(), "PYTHONPATH": str(REPO)},
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert out.returncode == -9 and "held" in out.stdout, out.stderr[-2000:]
    died = time.monotonic()
    with server.client() as client:
        assert client.read_global_concurrency_limit_by_name("gpu-lease").active_slots == 2  # still held
        while client.read_global_concurrency_limit_by_name("gpu-lease").active_slots and \
                time.monotonic() - died < 120:
            time.sleep(0.5)
        assert client.read_global_concurrency_limit_by_name("gpu-lease").active_slots == 0
    assert time.monotonic() - died < 120  # the 60 s lease + a 2 s sweep; Prefect's default lease is 300 s
