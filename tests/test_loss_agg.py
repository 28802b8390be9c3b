"""``algorithm.loss_agg`` and ``algorithm.mask_truncated``: the policy loss's reduction and the
rows it counts reach the train action, are part of the run's identity where they are not the
default, and TRL's ``loss_type`` and ``mask_truncated_completions`` point to them. The
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


def test_requests_of_a_config_without_the_settings_are_the_bytes_they_were():
    """At their defaults neither setting is in a dump, so the requests of a run that sets neither
    are what the revision before them sent (whose actions refuse unknown fields)."""
    from actions.config.workload import AlgorithmConfig
    from actions.contracts import TrainStepRequest

    assert not {"loss_agg", "mask_truncated"} & set(load_config(None, []).model_dump(mode="json")["algorithm"])
    ref = {"store_uri": "s", "base_key": "b", "policy_key": "p", "policy_version": 0}
    request = TrainStepRequest(policy=ref, optimizer_key=None, scored_keys=[], algorithm=AlgorithmConfig(), seed=0,
                               step=0, output_prefix="o").model_dump(mode="json")
    assert not {"loss_agg", "mask_truncated"} & set(request["algorithm"]) and "max_new_tokens" not in request
    both = AlgorithmConfig(loss_agg="seq_mean_token_mean", mask_truncated=True)
    assert AlgorithmConfig.model_validate(both.model_dump(mode="json")) == both


@pytest.mark.parametrize("mode", MODES)
def test_the_train_request_carries_the_response_limit_only_for_dr_grpo(mode):
    from types import SimpleNamespace

    from flows.step.payloads import train_payload

    cfg = load_config(None, [f"algorithm.loss_agg={mode}", "generation.max_new_tokens=40"])
    ctx = SimpleNamespace(config=cfg, prefix="runs/r")
    inputs = SimpleNamespace(model={"store_uri": "s", "base_key": "b", "policy_key": "p", "policy_version": 0},
                             optimizer_key=None, critic_key=None, critic_optimizer_key=None, step=0)
    request = train_payload(ctx, inputs, ["k"])
    assert request.get("max_new_tokens") == (40 if mode == "seq_mean_token_sum_norm" else None)
    assert ("loss_agg" in request["algorithm"]) == (mode != "token_mean")


def test_a_trl_loss_type_and_an_unknown_mode_are_answered_with_the_setting():
    with pytest.raises(ValueError,
                       match=r"TRL's `loss_type` is algorithm.loss_agg \(.*dr_grpo: seq_mean_token_sum_norm"):
        load_config(None, ["algorithm.loss_type=dr_grpo"])
    with pytest.raises(ValueError, match=r"algorithm.loss_agg.*'seq_mean'.*token_mean"):
        load_config(None, ["algorithm.loss_agg=seq_mean"])
    # TRL's value typed into the setting itself names the mode that computes it
    with pytest.raises(ValueError, match=r"'dapo': input should be .*; TRL's loss_type dapo is loss_agg token_mean"):
        load_config(None, ["algorithm.loss_agg=dapo"])
    with pytest.raises(ValueError, match=r"TRL's loss_type dr_grpo is loss_agg seq_mean_token_sum_norm"):
        load_config(None, ["algorithm.loss_agg=dr_grpo"])


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


def test_mask_truncated_leaves_cut_rows_out_of_the_policy_loss_only():
    """With ``algorithm.mask_truncated`` the rows that stopped at the length limit get no policy
    gradient and no weight in the loss's reduction; the other rows' loss is theirs alone."""
    import torch

    from actions.config.workload import AlgorithmConfig
    from actions.rl.batch import TrainBatch
    from actions.rl.sequences import pack
    from actions.rl.update import policy_loss

    prompts, responses = [[1, 2], [1, 2], [3], [3]], [[4, 5, 6], [4], [7, 8], [9, 9, 9]]
    packed = pack(prompts, responses, 0)
    reasons = ["length", "stop", "stop", "length"]
    batch = TrainBatch(packed, None, None, torch.tensor([1.0, 0.0, 1.0, 0.0]), None, reasons, prompts, responses, 0,
                       max_new_tokens=3)
    assert batch.policy_mask(False) is packed.response_mask
    assert batch.policy_mask(True).sum(-1).tolist() == [0.0, 1.0, 2.0, 0.0]
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    rows = torch.arange(4)
    for mode in MODES:
        for masked in (False, True):
            algo = AlgorithmConfig(batch_size=4, group_size=2, num_minibatches=1, kl_coef=0.0, loss_agg=mode,
                                   mask_truncated=masked)
            logp = torch.full(packed.response_mask.shape, -1.0, requires_grad=True)
            loss, _ = policy_loss(logp, torch.zeros_like(logp), batch, adv, rows, algo)
            loss.backward()
            cut_grad = logp.grad[[0, 3]].abs().sum().item()
            assert (cut_grad == 0.0) == masked, (mode, masked)
            assert logp.grad[[1, 2]].abs().sum().item() > 0
    assert load_config(None, ["algorithm.mask_truncated=false"]).fingerprint() == load_config(None, []).fingerprint()
    assert load_config(None, ["algorithm.mask_truncated=true"]).fingerprint() != load_config(None, []).fingerprint()
    with pytest.raises(ValueError, match=r"TRL's `mask_truncated_completions` is algorithm.mask_truncated"):
        load_config(None, ["algorithm.mask_truncated_completions=true"])


def test_batch_std_scope_is_grpo_with_a_std_only_and_keeps_default_ids():
    base = load_config(None, []).fingerprint()
    assert load_config(None, ["algorithm.std_scope=group"]).fingerprint() == base
    assert load_config(None, ["algorithm.std_scope=batch"]).fingerprint() != base
    for other, why in (("algorithm.name=ppo", "algorithm.name is ppo"),
                       ("algorithm.scale_by_std=false", "algorithm.scale_by_std is false")):
        with pytest.raises(ValueError, match=rf"algorithm.std_scope=batch .* but {why}.*remove algorithm.std_scope"):
            load_config(None, ["algorithm.std_scope=batch", other])
    with pytest.raises(ValueError, match=r"TRL's `scale_rewards` is .*std_scope batch"):
        load_config(None, ["algorithm.scale_rewards=batch"])


def test_the_update_computes_advantages_with_the_configured_std_scope():
    import torch

    from actions.config.workload import AlgorithmConfig
    from actions.rl.advantage import group_normalized_advantages
    from actions.rl.batch import TrainBatch
    from actions.rl.sequences import pack
    from actions.rl.update import compute_advantages

    prompts, responses = [[1]] * 4, [[2], [3], [4], [5]]
    rewards = torch.tensor([1.0, 0.0, 3.0, 1.0])
    batch = TrainBatch(pack(prompts, responses, 0), None, None, rewards, None, ["stop"] * 4, prompts, responses, 0)
    for scope in ("group", "batch"):
        algo = AlgorithmConfig(batch_size=4, group_size=2, num_minibatches=1, std_scope=scope)
        adv, _ = compute_advantages(batch, algo)
        torch.testing.assert_close(adv, group_normalized_advantages(rewards, 2, std_scope=scope))
    assert not torch.allclose(compute_advantages(batch, AlgorithmConfig(batch_size=4, group_size=2,
                                                                        num_minibatches=1))[0],
                              group_normalized_advantages(rewards, 2, std_scope="batch"))
