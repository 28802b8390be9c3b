"""Rewards run where their libraries work: in an action server's request threads too.

``math-verify`` times its parsing out with ``signal.alarm``, which only a main thread may use;
actions run in the request threads of the local pool's workers, of the OpenWhisk images and of
the in-process invoker. These tests run every built-in reward off the main thread (the values
must equal the main thread's), a campaign with the ``math`` reward on the default local pool,
and (slow) every built-in through the OpenWhisk controller emulator.
"""

from __future__ import annotations

import threading

import pytest

from actions.config.reward import BUILTIN_REWARDS
from actions.config.workload import RewardFunctionConfig as Fn
from actions.tasks.dataset import PromptRow
from actions.tasks.rewards import compute_rewards

ANSWERS = ["#### 4", r"$\frac{1}{2}$", "#### 12", "ccc"]
TEXTS = [r"2+2 = 4. \boxed{4}", "0.5", "I get 13.\n#### 13", "ccc"]


def _score_all() -> dict[str, list[float | None]]:
    rows = [PromptRow(prompt_id=i, prompt=f"q{i}", answer=a) for i, a in enumerate(ANSWERS)]
    return compute_rewards([Fn(name=n) for n in BUILTIN_REWARDS], rows, TEXTS).per_function


def test_every_builtin_reward_gives_the_same_values_in_a_request_thread():
    main = _score_all()
    assert main["math"][:3] == [1.0, 1.0, 0.0]
    got: dict = {}
    worker = threading.Thread(target=lambda: got.update(_score_all()))  # as a server's request thread
    worker.start()
    worker.join(timeout=120)
    assert got == main


def test_math_reward_campaign_on_the_default_local_pool(tiny_config, prefect_harness, tmp_path):
    from flows.campaign.run import rlhf_campaign

    cfg = tiny_config("data.task=arith", "data.max_count=2", "invoker.kind=local", "invoker.num_workers=2",
                      "reward.functions=[{name: math}]", "run_id=math-pool")
    summary = rlhf_campaign(config=cfg.model_dump(mode="json"))
    assert summary["steps_completed"] == 2
    assert 0.0 <= summary["eval_accuracy_last"] <= 1.0
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("worker-*.log"))
    assert "threaded environment" not in logs and "Traceback" not in logs


@pytest.mark.slow
def test_every_builtin_reward_through_the_openwhisk_emulator(tiny_config, monkeypatch, prefect_harness):
    from actions.runtime.server import ACTION_NAMES
    from flows.campaign.run import run_campaign

    try:
        from ow_emulator import running_emulator
        from test_openwhisk import make_client, put_action
    except ImportError:  # tests/ imported as a package
        from tests.ow_emulator import running_emulator
        from tests.test_openwhisk import make_client, put_action
    functions = ", ".join(f"{{name: {n}}}" for n in BUILTIN_REWARDS)
    with running_emulator() as emu:
        client = make_client(emu)
        for name in sorted(ACTION_NAMES):
            put_action(client, name, timeout_ms=120_000)
        client.close()
        for key, value in emu.env().items():
            monkeypatch.setenv(key, value)
        summary = run_campaign(tiny_config("data.task=arith", "data.max_count=2", "invoker.kind=openwhisk",
                                           f"reward.functions=[{functions}]", "run_id=ow-rewards", "steps=1"),
                               progress=lambda m: None)
    assert summary["steps_completed"] == 1
