"""``RLHFLESS_DEVICE`` as the learner's rank check and backend read it (``actions/rl/world_size.py``,
``actions/train_step.py: run_sharded``): ``auto`` resolves as the actions' device does
(``actions/models/device.py``), CUDA only where torch sees one, so a CPU-only host runs gloo
ranks; ``cuda`` where none is visible is refused naming the setting, never "at most 0"."""

from __future__ import annotations

import pytest
import torch

import actions.rl.world_size as world_size


@pytest.fixture
def cpu_only(monkeypatch):
    """This machine as a host without CUDA and with 8 processors."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(world_size, "devices_present", lambda kind: 0 if kind == "cuda" else 8)


def test_auto_on_a_cpu_only_host_runs_gloo_ranks(cpu_only, monkeypatch):
    from actions.models.device import action_device

    monkeypatch.setenv("RLHFLESS_DEVICE", "auto")
    assert world_size.device_kind() == "cpu" == action_device().type
    assert world_size.check_world_size(2, 1) == 2
    assert world_size.check_world_size(None, 4) == 1  # the CPU's default: one rank


def test_cuda_without_a_visible_device_is_refused_naming_the_setting(cpu_only, monkeypatch):
    monkeypatch.setenv("RLHFLESS_DEVICE", "cuda")
    with pytest.raises(ValueError) as info:
        world_size.check_world_size(2, 1)
    message = str(info.value)
    assert message.startswith("train.world_size=2 needs 2 CUDA devices")
    assert "RLHFLESS_DEVICE=cuda but no CUDA device is visible; set RLHFLESS_DEVICE to cpu or auto" in message
    assert "at most 0" not in message


def test_auto_on_a_cuda_host_stays_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("RLHFLESS_DEVICE", "auto")
    assert world_size.device_kind() == "cuda"
    monkeypatch.setenv("RLHFLESS_DEVICE", "cpu")
    assert world_size.device_kind() == "cpu"


@pytest.mark.parametrize("setting", ["auto", "cpu"])
def test_the_sharded_step_picks_gloo_where_the_ranks_compute_on_the_cpu(cpu_only, monkeypatch, setting):
    import actions.rl.ranks as ranks
    from actions.train_step import run_sharded

    class Chosen(Exception):
        pass

    def capture(fn, world, args=(), *, backend, what):
        raise Chosen(backend)

    class Request:
        def model_dump(self, mode):
            return {}

    monkeypatch.setenv("RLHFLESS_DEVICE", setting)
    monkeypatch.setattr(ranks, "run_on_ranks", capture)
    with pytest.raises(Chosen, match="^gloo$"):
        run_sharded(Request(), 2)  # type: ignore[arg-type]


def test_cuda_without_a_visible_device_is_refused_with_one_rank_too(cpu_only, monkeypatch):
    """The default world size (1) on a host without CUDA: refused by the start-up check, not by
    the first action after set-up has written the store."""
    monkeypatch.setenv("RLHFLESS_DEVICE", "cuda")
    with pytest.raises(ValueError) as info:
        world_size.check_world_size(None, 1)
    assert str(info.value) == ("RLHFLESS_DEVICE='cuda' but no CUDA device is visible; set RLHFLESS_DEVICE to cpu "
                               "or auto")


@pytest.mark.parametrize("setting", ["gpu", "cuda:x", "tpu"])
def test_a_setting_that_is_no_device_is_refused_as_the_actions_refuse_it(cpu_only, monkeypatch, setting):
    from actions.models.device import DeviceSettingError, parse_device

    monkeypatch.setenv("RLHFLESS_DEVICE", setting)
    refusal = f"^RLHFLESS_DEVICE={setting!r} is not a device; use cpu, cuda, cuda:N or auto$"
    with pytest.raises(ValueError, match=refusal):
        world_size.device_kind()
    with pytest.raises(DeviceSettingError, match="is not a device"):  # the action's own reading agrees
        parse_device(setting)
