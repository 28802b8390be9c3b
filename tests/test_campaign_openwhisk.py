"""A default campaign end to end through `invoker: openwhisk` against the controller emulator."""

from __future__ import annotations

from actions.runtime.server import ACTION_NAMES
from flows.campaign.run import run_campaign

try:
    from conftest import LEARNING, assert_learned
    from ow_emulator import running_emulator
    from test_openwhisk import make_client, put_action
except ImportError:  # tests/ imported as a package
    from tests.conftest import LEARNING, assert_learned
    from tests.ow_emulator import running_emulator
    from tests.test_openwhisk import make_client, put_action


def test_campaign_through_openwhisk_matches_local_training_data(tiny_config, monkeypatch, prefect_harness):
    local_lines: list[str] = []
    local = run_campaign(tiny_config("invoker.kind=inprocess", "run_id=ref", "steps=2", *LEARNING),
                         progress=local_lines.append)
    with running_emulator() as emu:
        client = make_client(emu)
        for name in sorted(ACTION_NAMES):  # what `rlhfless deploy` creates
            put_action(client, name, timeout_ms=120_000)
        client.close()
        for key, value in emu.env().items():
            monkeypatch.setenv(key, value)
        lines: list[str] = []
        summary = run_campaign(tiny_config("invoker.kind=openwhisk", "run_id=ow", "steps=2", *LEARNING),
                               progress=lines.append)
    # the emulator's actions share this machine's files; a cluster's containers would not see the folder
    folder = [m for m in lines if m.startswith("warning: store.uri ")]
    assert len(folder) == 1 and "s3://bucket/prefix" in folder[0], lines[:5]
    assert not any(m.startswith("warning: store.uri ") for m in local_lines)
    assert summary["steps_completed"] == 2
    first, second = summary["steps"]
    assert summary["billed_gpu_seconds"] >= 0 and first["actors/n"] >= 1
    # The second step's generation finds the first step's containers warm: a pre-warm that could
    # not finish before generation starts is not fired, since it would hold those containers and
    # send the generate activations to new, cold ones.
    assert second["prewarm/fired_s"] == -1.0
    assert second["actors/cold_starts"] <= max(0.0, second["actors/n"] - first["actors/n"])
    # Same seed, same config: the training data and so the weights do not depend on the invoker.
    assert_learned(local)
    assert summary["weights_sha256"] == local["weights_sha256"]
