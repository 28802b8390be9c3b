"""``algorithm.loss_agg``: the policy loss's reduction reaches the train action, is part of the
run's identity where it is not the default, and TRL's ``loss_type`` names point to it. The
reductions' arithmetic is in ``test_rl_math.py``, their parity with TRL in ``test_trl_parity.py``,
micro batches in ``test_logprob_chunks.py``."""

from __future__ import annotations

import pytest
from conftest import LEARNING

from flows.config import load_config

MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def test_the_default_keeps_run_ids_and_each_other_mode_is_a_run_of_its_own():
    ids = {mode: load_config(None, [f"algorithm.loss_agg={mode}"]).fingerprint() for mode in MODES}
    assert load_config(None, []).fingerprint() == ids["token_mean"] == "7cd0a181803c"  # runs from before keep theirs
    assert len(set(ids.values())) == 3


def test_a_trl_loss_type_and_an_unknown_mode_are_answered_with_the_setting():
    with pytest.raises(ValueError, match=r"TRL's `loss_type` is algorithm.loss_agg \(.*dr_grpo: seq_mean_token_sum_norm"):
        load_config(None, ["algorithm.loss_type=dr_grpo"])
    with pytest.raises(ValueError, match=r"algorithm.loss_agg.*'seq_mean'.*token_mean"):
        load_config(None, ["algorithm.loss_agg=seq_mean"])


def test_each_mode_trains_and_changes_the_step_loss(tiny_config, prefect_harness):
    """One tiny step of the default and of Dr. GRPO's reduction on the same samples (the same
    seed, the same first policy): the train action gets what the mode needs (the response limit)
    and reduces as it says."""
    from flows.campaign.run import run_campaign

    steps = {}
    for mode in ("token_mean", "seq_mean_token_sum_norm"):
        cfg = tiny_config("invoker.kind=inprocess", "steps=1", f"run_id=agg-{mode}", f"algorithm.loss_agg={mode}",
                          *LEARNING)
        steps[mode] = run_campaign(cfg, progress=lambda m: None)["steps"][0]
    assert len({s["reward/mean"] for s in steps.values()}) == 1  # the same samples
    losses = [s["loss/policy"] for s in steps.values()]
    assert len({round(v, 9) for v in losses}) == 2, losses
    assert all(s["grad_norm"] > 0 for s in steps.values())
