"""Two limits of the sharded learner (``train.world_size``): a failed rank's error keeps its
fix within the crash line (``actions/rl/ranks.py``), and ranks on GPUs stay within the
``scaling.gpus_per_actor`` each activation is billed and reserved for
(``actions/rl/world_size.py``, ``flows/campaign/preflight.py``)."""

from __future__ import annotations

import pytest

import actions.rl.world_size as world_size
from actions.rl.world_size import check_ranks_within_gpus, check_world_size
from actions.runtime.errors import LINE_LIMIT, describe_crash, one_line


def test_a_rank_error_keeps_its_fix_behind_the_rank_prefix():
    """The error fits the crash line on one rank; behind ``rank 1 of 2 failed: ValueError: `` it
    would not, and the line is cut in its middle (the hashes), not at its end (the fix)."""
    from actions.rl.ranks import RankFailed, run_on_ranks
    from tests import rank_functions

    with pytest.raises(ValueError) as alone:
        rank_functions.raise_long_on_rank_one(1, 2)
    alone_line = describe_crash(alone.value)["message"]
    assert len(alone_line) > LINE_LIMIT - len("rank 1 of 2 failed: ValueError: ")  # too long behind the prefix
    assert alone_line.endswith(rank_functions.LONG_FIX)  # one rank: whole
    with pytest.raises(RankFailed) as info:
        run_on_ranks(rank_functions.raise_long_on_rank_one, 2)
    message = describe_crash(info.value)["message"]
    assert message.startswith("rank 1 of 2 failed: ValueError: blob runs/r1/optimizer/blobs/abab")
    assert message.endswith(f"; {rank_functions.LONG_FIX}") and " ... " in message
    assert len(message) <= LINE_LIMIT and one_line(str(info.value)) == str(info.value)


def test_a_short_rank_error_is_kept_whole():
    from actions.rl.ranks import _rank_error

    assert _rank_error("rank 0 of 2 failed: ", "ValueError: bad\n shard") == "rank 0 of 2 failed: ValueError: bad shard"
    long = "ValueError: " + "x" * 600 + "; do this"
    cut = _rank_error("train rank 0 of 2 failed: ", long)
    assert cut.endswith("; do this") and len("RankFailed: " + cut) == LINE_LIMIT


@pytest.fixture
def eight_devices(monkeypatch):
    """This machine with 8 GPUs and 8 processors."""
    monkeypatch.setattr(world_size, "devices_present", lambda kind: 8)


def test_cuda_ranks_above_gpus_per_actor_are_refused_naming_both_settings(eight_devices):
    with pytest.raises(ValueError, match=r"^train.world_size=8 is above scaling.gpus_per_actor=1 on CUDA .*"
                                         r"billed and reserved as 1 GPU\(s\) but its ranks would use 8; raise "
                                         r"scaling.gpus_per_actor to 8, or lower train.world_size to at most 1$"):
        check_world_size(8, 1, "cuda")
    assert check_world_size(8, 8, "cuda") == 8 and check_world_size(2, 4, "cuda") == 2
    assert check_world_size(None, 4, "cuda") == 4  # the default is gpus_per_actor itself


def test_cpu_ranks_are_not_held_to_gpus_per_actor(eight_devices):
    assert check_world_size(4, 1, "cpu") == 4
    assert check_world_size(4, 1, "cpu", num_cores=4) == 4


def test_an_unset_world_size_is_never_above_gpus_per_actor():
    check_ranks_within_gpus(None, 1, "on OpenWhisk")
    check_ranks_within_gpus(2, 2, "on OpenWhisk")


def _config(tmp_path, *extra):
    from flows.config import load_config

    return load_config(None, [f"store.uri={tmp_path / 'store'}", "model.hidden_size=32", "model.num_heads=2",
                              "model.intermediate_size=64", *extra])


def test_the_start_up_check_refuses_cuda_ranks_above_gpus_per_actor(tmp_path, monkeypatch, eight_devices):
    from flows.campaign.preflight import check_campaign

    monkeypatch.setenv("RLHFLESS_DEVICE", "cuda")
    cfg = _config(tmp_path, "train.world_size=8", "invoker.kind=inprocess")
    with pytest.raises(ValueError, match=r"^train.world_size=8 is above scaling.gpus_per_actor=1 on CUDA"):
        check_campaign(cfg)
    assert not (tmp_path / "store").exists()


def test_openwhisk_ranks_are_compared_with_a_gpu_actions_containers_only():
    """On OpenWhisk the flow's machine is not the action's: a GPU cluster's container (its
    ``gpus`` annotation) bounds the ranks, whatever this machine has; a CPU cluster's action
    (``gpus: 0``) or one without the annotation runs its ranks on cores and is not compared."""
    from flows.invokers.factory import check_train_ranks

    def action(**annotations) -> dict:
        return {"annotations": [{"key": k, "value": v} for k, v in annotations.items()]}

    with pytest.raises(ValueError, match=r"^train.world_size=2 is above scaling.gpus_per_actor=1 on OpenWhisk "
                                         r".*raise scaling.gpus_per_actor to 2, or lower train.world_size"):
        check_train_ranks(action(gpus=1), 2)
    check_train_ranks(action(gpus=2), 2)
    check_train_ranks(action(gpus=0), 4)
    check_train_ranks(action(), 4)
    check_train_ranks(action(gpus=1), None)
