"""Unit tests for actions/rl math on tiny hand-computed inputs (CPU, milliseconds)."""

import math

import pytest
import torch

from actions.rl.advantage import gae, group_normalized_advantages, kl_penalized_token_rewards
from actions.rl.grpo_loss import grpo_loss
from actions.rl.kl import kl_estimate
from actions.rl.masked import masked_mean, masked_sum, masked_whiten
from actions.rl.ppo_loss import ppo_policy_loss, value_loss


def close(actual: torch.Tensor, expected: list, tol: float = 1e-5) -> bool:
    return torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), atol=tol)


# ---- masked -------------------------------------------------------------------------------


def test_masked_reductions_ignore_padding_garbage():
    x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_sum(x, mask).item() == 6.0  # 1 + 2 + 3
    assert masked_mean(x, mask).item() == 2.0  # 6 / 3 tokens
    assert close(masked_mean(x, mask, dim=1), [1.5, 3.0])  # (1+2)/2, 3/1
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0  # empty mask: 0, not NaN


def test_masked_whiten_uses_population_variance():
    # real values [1, 2, 3]: mean 2, population var (1 + 0 + 1) / 3 = 2/3 -> (x-2)/sqrt(2/3)
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    out = masked_whiten(x, torch.tensor([[1, 1, 1, 0]]))
    s = math.sqrt(2 / 3)
    assert close(out, [[-1 / s, 0.0, 1 / s, 0.0]])


def _whiten_direct(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """The formula masked_whiten used before it took huge values, for the bit-for-bit check."""
    mean = masked_mean(x, mask)
    centered = torch.where(mask.bool(), x - mean, torch.zeros_like(x))
    return centered * torch.rsqrt(masked_mean(centered.square(), mask) + eps)


def test_masked_whiten_takes_values_whose_squares_overflow_float32_and_leaves_others_bit_for_bit():
    """Rewards of 1e20 (finite, allowed) made PPO's float32 variance infinite and every
    advantage 0; they are whitened exactly now, and ordinary advantages as before, bit for bit."""
    torch.manual_seed(0)
    mask = (torch.rand(6, 9) > 0.2).int()
    mask[:, 0] = 1
    for x in (torch.randn(6, 9), torch.randn(6, 9) * 1e3, torch.randn(6, 9) * 1e-4):
        assert torch.equal(masked_whiten(x, mask), _whiten_direct(x, mask))
    for scale in (1e20, 3e37):
        x = torch.randn(6, 9) * scale
        x[~mask.bool()] = float("nan")  # padding holds anything
        keep = mask.bool()
        if scale == 1e20:  # what the direct formula made of them: every advantage 0
            assert (_whiten_direct(x, mask)[keep] == 0).all()
        got = masked_whiten(x, mask)  # 3e37: near float32's largest, where even the sum may overflow
        ref = x.double()[keep]
        want = (ref - ref.mean()) / ref.var(unbiased=False).sqrt()
        assert torch.allclose(got[keep].double(), want, rtol=1e-5, atol=1e-5)
        assert (got[~keep] == 0).all() and got[keep].abs().max() > 0.5
        assert masked_mean(got.square(), mask).item() == pytest.approx(1.0, rel=1e-5)  # unit variance, as for small x
    equal = torch.full((2, 3), 1e30)  # all equal: variance 0, whitened to 0 as any constant is
    assert torch.equal(masked_whiten(equal, torch.ones(2, 3)), torch.zeros(2, 3))
    poisoned = torch.tensor([[1.0, float("nan"), 2.0]])  # a NaN on a real position still shows
    assert torch.isnan(masked_whiten(poisoned, torch.ones(1, 3))).any()


# ---- advantages ---------------------------------------------------------------------------


def test_group_advantages_hand_computed():
    # group 1 [1,0,0,1]: mean 0.5, population std 0.5 -> (r-0.5)/0.5 = +-1 (eps=1e-6 ~ 2e-6)
    # group 2 [1,1,1,1]: mean 1, std 0 -> 0 / (0 + eps) = exactly 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_normalized_advantages(rewards, group_size=4)
    assert close(adv, [1, -1, -1, 1, 0, 0, 0, 0])
    assert torch.equal(adv[4:], torch.zeros(4))


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_a_group_of_equal_rewards_gets_exactly_zero_whatever_the_mean_s_rounding(scale_by_std):
    """Eight rewards of 0.3 average to 0.3 + 1.5e-8 in fp32: computed, every row would get the
    same advantage (0.029 with the std); set, it is 0. Scored rows only where some are not."""
    for value, g in ((0.30000000000000004, 8), (1.3, 8), (100.3, 3), (7.7, 7), (-0.3, 8)):
        rewards = torch.tensor([value] * g + [float(i % 2) for i in range(g)])
        grouped = rewards[:g]
        assert grouped.mean().item() != grouped[0].item() or value in (7.7, -0.3)  # the rounding this is about
        adv = group_normalized_advantages(rewards, group_size=g, scale_by_std=scale_by_std)
        assert torch.equal(adv[:g], torch.zeros(g)) and adv[g:].abs().sum() > 0
        scored = torch.ones(2 * g, dtype=torch.bool)
        scored[1] = False
        partial = group_normalized_advantages(rewards * torch.where(scored, 1.0, 5.0), group_size=g,
                                              scale_by_std=scale_by_std, scored=scored)
        assert torch.equal(partial[:g], torch.zeros(g))  # the unscored row's reward left out
        # the other group as without the mask, to fp32 round-off: the masked path takes the std
        # as the root of the mean square, the plain one with torch.std, and which last bit each
        # lands on depends on the CPU's vector kernels (equal on an AMD EPYC, not on an Intel Xeon)
        assert torch.allclose(partial[g:], adv[g:], rtol=1e-6, atol=0)


def test_group_advantages_without_std_scaling():
    # Dr. GRPO: mean-centring only, (r - 0.5) and (r - 1)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_normalized_advantages(rewards, group_size=4, scale_by_std=False)
    assert close(adv, [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])


def test_group_size_must_divide_batch():
    with pytest.raises(ValueError, match="group_size"):
        group_normalized_advantages(torch.zeros(6), group_size=4)


def test_gae_undiscounted_is_return_minus_value():
    # gamma = lam = 1: A_t = (sum of future rewards) - V_t = 1 - V_t; returns = A + V = 1
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = gae(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert close(adv, [[0.5, 0.4, 0.3]])
    assert close(ret, [[1.0, 1.0, 1.0]])


def test_gae_discounted_hand_computed():
    # gamma=0.9, lam=0.95 (gamma*lam = 0.855), terminal value after the last token is 0:
    # delta_2 = 1 + 0.9*0   - 0.7 = 0.3
    # delta_1 = 0 + 0.9*0.7 - 0.6 = 0.03
    # delta_0 = 0 + 0.9*0.6 - 0.5 = 0.04
    # A_2 = 0.3; A_1 = 0.03 + 0.855*0.3 = 0.2865; A_0 = 0.04 + 0.855*0.2865 = 0.2849575
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = gae(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.95)
    assert close(adv, [[0.2849575, 0.2865, 0.3]])
    assert close(ret, [[0.7849575, 0.8865, 1.0]])


def test_gae_ignores_padding():
    # same row as above plus a padded 4th token holding garbage: identical result, 0 there
    rewards = torch.tensor([[0.0, 0.0, 1.0, 100.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.95)
    assert close(adv, [[0.2849575, 0.2865, 0.3, 0.0]])
    assert close(ret, [[0.7849575, 0.8865, 1.0, 0.0]])


def test_kl_penalized_token_rewards():
    # k1 = logp - ref = [0.5, 0, -1]; -0.1 * k1 = [-0.05, 0, 0.1]; outcome 1 added at t=2
    logp = torch.tensor([[-1.0, -1.0, -2.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    out = kl_penalized_token_rewards(torch.tensor([1.0]), logp, ref, mask, kl_coef=0.1)
    assert close(out, [[-0.05, 0.0, 1.1, 0.0]])
    # k3: log_r = ref - logp = [-0.5, 0, 1]; exp(log_r) - log_r - 1 = [0.106531, 0, 0.718282]
    out = kl_penalized_token_rewards(torch.tensor([1.0]), logp, ref, mask, kl_coef=0.1, kl_kind="k3")
    assert close(out, [[-0.0106531, 0.0, 0.9281718, 0.0]])


# ---- KL -----------------------------------------------------------------------------------


def test_kl_estimators_hand_computed():
    # log_r = ref - logp = [-1, 1]
    logp = torch.tensor([[0.0, -1.0]])
    ref = torch.tensor([[-1.0, 0.0]])
    assert close(kl_estimate(logp, ref, "k1"), [[1.0, -1.0]])  # -log_r
    assert close(kl_estimate(logp, ref, "k2"), [[0.5, 0.5]])  # 0.5 * log_r^2
    # exp(-1) - (-1) - 1 = e^-1 = 0.367879; exp(1) - 1 - 1 = e - 2 = 0.718282
    assert close(kl_estimate(logp, ref, "k3"), [[0.367879, 0.718282]])
    assert torch.equal(kl_estimate(logp, logp, "k3"), torch.zeros(1, 2))


def test_kl_k3_clamp_keeps_outliers_finite():
    # log_r = 200 clamps to 20: exp(20) - 20 - 1, finite instead of inf
    out = kl_estimate(torch.tensor([[-200.0]]), torch.tensor([[0.0]]), "k3")
    assert out.item() == pytest.approx(math.exp(20) - 21, rel=1e-5)
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


def test_kl_k3_pulls_back_a_token_the_policy_drifted_far_above_the_reference():
    """log_r = -24 (the policy 24 nats above the reference): k3 ~ 23 and d k3 / d logp ~ 1,
    not capped (only the overflowing side is clamped)."""
    logp = torch.tensor([[-1.0]], requires_grad=True)
    out = kl_estimate(logp, torch.tensor([[-25.0]]), "k3")
    out.sum().backward()
    assert out.item() == pytest.approx(23.0, rel=1e-6)
    assert logp.grad.item() == pytest.approx(1.0, rel=1e-6)


# ---- GRPO ---------------------------------------------------------------------------------


def test_grpo_loss_on_policy_is_minus_token_mean_advantage():
    # ratio 1 everywhere: per-token loss -A_i. Row 0 (A=1) has 3 tokens, row 1 (A=-0.5) has 2:
    # token mean = (3*(-1) + 2*0.5) / 5 = -0.4 (GRPO's sequence mean would give -0.25).
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, float("nan")]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, metrics = grpo_loss(
        logp, logp.detach(), None, torch.tensor([1.0, -0.5]), mask,
        clip_low=0.2, clip_high=0.2, kl_coef=0.0,
    )
    assert loss.item() == pytest.approx(-0.4)
    expected = {"loss": -0.4, "loss/policy": -0.4, "clipfrac": 0.0, "ratio_mean": 1.0}  # no reference: no kl
    assert metrics == pytest.approx(expected)
    loss.backward()
    # d/dlogp (-A * ratio / 5) = -A / 5 at ratio 1; padding gets 0
    assert close(logp.grad, [[-0.2, -0.2, -0.2], [0.1, 0.1, 0.0]])


def test_ratio_mean_and_clipfrac_are_over_real_tokens_only():
    """One real token at ratio 2 (clipped, A=+1) and one padding token: over the real token the
    metrics are 2 and 1; a mean over the row (padding's ratio set to 1) would give 1.5 and 0.5."""
    logp = torch.tensor([[math.log(2.0), float("nan")]])
    _, metrics = grpo_loss(logp, torch.zeros(1, 2), None, torch.tensor([1.0]), torch.tensor([[1, 0]]),
                           clip_low=0.2, clip_high=0.2, kl_coef=0.0)
    assert metrics["ratio_mean"] == pytest.approx(2.0) and metrics["clipfrac"] == pytest.approx(1.0)


def test_grpo_loss_clipping_zeroes_gradient_and_counts_clipfrac():
    # clip 0.2 -> ratio range [0.8, 1.2]; per token max(-A*r, -A*clip(r)):
    # row 0, A=+1: r=1.5 -> max(-1.5, -1.2) = -1.2 clipped
    #              r=0.5 -> max(-0.5, -0.8) = -0.5;  r=1 -> -1
    # row 1, A=-1: r=0.5 -> max(0.5, 0.8) = 0.8 clipped;  r=1.5 -> max(1.5, 1.2) = 1.5
    # loss = (-1.2 - 0.5 - 1 + 0.8 + 1.5) / 5 = -0.08; clipfrac = 2/5
    ratios = torch.tensor([[1.5, 0.5, 1.0], [0.5, 1.5, 1.0]])
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, metrics = grpo_loss(
        logp, -ratios.log(), None, torch.tensor([1.0, -1.0]), mask,
        clip_low=0.2, clip_high=0.2, kl_coef=0.0,
    )
    assert loss.item() == pytest.approx(-0.08)
    assert metrics["clipfrac"] == pytest.approx(0.4)
    assert metrics["ratio_mean"] == pytest.approx(5.0 / 5)  # (1.5+0.5+1+0.5+1.5)/5
    loss.backward()
    # unclipped: d(-A*r/5)/dlogp = -A*r/5 -> -0.1, -0.2 (row 0), 0.3 (row 1); clipped: 0
    assert close(logp.grad, [[0.0, -0.1, -0.2], [0.0, 0.3, 0.0]])


def test_grpo_decoupled_clip_high():
    # ratio 1.25, A=+1: clipped with clip_high 0.2 (1.2), inside with clip_high 0.28 (DAPO)
    logp = torch.zeros(1, 1)
    old = -torch.tensor([[1.25]]).log()
    args = (logp, old, None, torch.tensor([1.0]), torch.ones(1, 1))
    _, sym = grpo_loss(*args, clip_low=0.2, clip_high=0.2, kl_coef=0.0)
    _, dapo = grpo_loss(*args, clip_low=0.2, clip_high=0.28, kl_coef=0.0)
    assert (sym["clipfrac"], sym["loss/policy"]) == pytest.approx((1.0, -1.2))
    assert (dapo["clipfrac"], dapo["loss/policy"]) == pytest.approx((0.0, -1.25))


def test_grpo_kl_term_is_added_to_loss():
    # A = 0 so the policy term is 0; k3 token mean = (e^-1 + e - 2) / 2 = 0.543081; x 0.1
    logp = torch.tensor([[0.0, -1.0]])
    ref = torch.tensor([[-1.0, 0.0]])
    clips = dict(clip_low=0.2, clip_high=0.2)
    mask = torch.ones(1, 2)
    loss, metrics = grpo_loss(logp, logp, ref, torch.zeros(1), mask, **clips, kl_coef=0.1)
    assert metrics["kl"] == pytest.approx(0.543081, abs=1e-6)
    assert loss.item() == pytest.approx(0.0543081, abs=1e-6)
    # `loss` is what is minimised (TRL's), `loss/policy` the surrogate alone
    assert (metrics["loss"], metrics["loss/policy"]) == pytest.approx((0.0543081, 0.0), abs=1e-6)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, logp, None, torch.zeros(1), mask, **clips, kl_coef=0.1)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_grpo_uses_the_configured_kl_estimator(kind):
    """``algorithm.kl_kind`` reaches GRPO's loss (through ``update.policy_loss``), not k3 always."""
    from types import SimpleNamespace

    from actions.config.workload import AlgorithmConfig
    from actions.rl.update import policy_loss

    logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    mask = torch.ones(1, 2)
    batch = SimpleNamespace(packed=SimpleNamespace(response_mask=mask), old_logp=logp, ref_logp=ref,
                            max_new_tokens=None, policy_mask=lambda mask_truncated: mask)
    algo = AlgorithmConfig(kl_kind=kind, kl_coef=0.1)
    loss, metrics = policy_loss(logp, torch.zeros(1, 2), batch, torch.zeros(1), torch.tensor([0]), algo)
    expected = float(masked_mean(kl_estimate(logp, ref, kind), mask))  # k1 -0.25, k2 0.3125, k3 0.412
    assert metrics["kl"] == pytest.approx(expected, abs=1e-6)
    assert loss.item() == pytest.approx(0.1 * expected, abs=1e-6)  # advantage 0: the KL term alone
    direct = grpo_loss(logp, logp, ref, torch.zeros(1), mask, clip_low=0.2, clip_high=0.2, kl_coef=0.1, kl_kind=kind)
    assert direct[1]["kl"] == pytest.approx(expected, abs=1e-6)


# ---- PPO ----------------------------------------------------------------------------------


def test_ppo_policy_loss_per_token_advantages():
    # ratio 1: loss = token mean of -A over real tokens = -(1 + 2 + 3) / 3 = -2
    adv = torch.tensor([[1.0, 2.0, 99.0], [3.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    zeros, clips = torch.zeros(2, 3), dict(clip_low=0.2, clip_high=0.2)
    loss, metrics = ppo_policy_loss(zeros, zeros, adv, mask, **clips)
    assert loss.item() == pytest.approx(-2.0)
    assert metrics["clipfrac"] == 0.0
    with pytest.raises(ValueError, match="advantages"):
        ppo_policy_loss(zeros, zeros, torch.zeros(2), mask, **clips)  # [B] instead of [B, T]


def test_value_loss_clipping():
    # token 0: old 0, V 1, R 1, c 0.2 -> unclipped (1-1)^2 = 0, clipped (0.2-1)^2 = 0.64: clipped
    # token 1: old 0, V 1, R -1      -> unclipped (1+1)^2 = 4, clipped (0.2+1)^2 = 1.44 -> 4
    # loss = 0.5 * (0.64 + 4) / 2 = 1.16; vf_clipfrac = 1/2; padding ignored
    values = torch.tensor([[1.0, 1.0, 50.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    returns = torch.tensor([[1.0, -1.0, 0.0]])
    loss, metrics = value_loss(values, old, returns, torch.tensor([[1, 1, 0]]), clip=0.2)
    assert loss.item() == pytest.approx(1.16)
    assert metrics == pytest.approx({"loss/value": 1.16, "vf_clipfrac": 0.5})
    loss.backward()
    # clipped token: no gradient; unclipped: 0.5 * 2 * (V - R) / 2 tokens = 1.0
    assert close(values.grad, [[0.0, 1.0, 0.0]])


def test_pack_to_fixed_widths_and_refuse_rows_that_do_not_fit():
    from actions.rl.sequences import pack

    b = pack([[5, 6], [7]], [[8], [9, 10]], 0, prompt_width=4, response_width=3)
    # prompts left-padded to 4, responses right-padded to 3, whatever the batch's own maxima
    assert b.input_ids.tolist() == [[0, 0, 5, 6, 8, 0, 0], [0, 0, 0, 7, 9, 10, 0]]
    assert b.response_mask.tolist() == [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    assert b.position_ids[1].tolist()[3:6] == [0, 1, 2]  # positions skip the padding
    with pytest.raises(ValueError, match="prompt_width=1"):
        pack([[5, 6]], [[8]], 0, prompt_width=1, response_width=3)


def test_rows_are_scored_at_widths_of_their_own_whatever_their_batch_mates():
    from functools import partial

    from actions.models.modeling import build_tiny_model
    from actions.rl.sequences import bucket_widths, pack, per_row_widths, response_logprobs

    assert bucket_widths(1, 1, 16) == (16, 16) and bucket_widths(17, 16, 16) == (32, 16)
    torch.manual_seed(0)
    model, _ = build_tiny_model(hidden_size=96, num_layers=2, num_heads=4, intermediate_size=256,
                                max_positions=256, seed=0)
    model.eval()
    short = ([3, 4, 5], [6, 7])
    long = ([8] * 40, [9] * 70)
    mid = ([10] * 5, [11] * 20)
    logp = partial(response_logprobs, model)
    with torch.no_grad():
        (alone,), mask_alone = per_row_widths([logp], [short[0]], [short[1]], 0)
        (mixed,), mask = per_row_widths([logp], [mid[0], short[0], long[0]], [mid[1], short[1], long[1]], 0)
        # padded to the batch's longest row instead: the same values to float tolerance only
        wide = logp(pack([short[0], long[0]], [short[1], long[1]], 0))
    assert alone.shape == (1, 16) and mixed.shape == (3, 80)  # widest group: 70 -> 80 tokens
    assert torch.equal(mixed[1, :16], alone[0]) and not mixed[1, 16:].any()
    assert mask.sum(-1).tolist() == [20.0, 2.0, 70.0] and torch.equal(mask_alone[0, :2], torch.ones(2))
    assert torch.allclose(wide[0, :2], alone[0, :2], atol=1e-5)
    assert alone[0, 2:].abs().sum() == 0  # nothing past the response
    # fixed row blocks (CUDA's): 5 rows of one group in blocks of 2, the last topped up
    rows = [([12] * (3 + i), [13 + i] * (20 + i)) for i in range(5)]
    with torch.no_grad():
        (whole,), _ = per_row_widths([logp], [r[0] for r in rows], [r[1] for r in rows], 0)
        (blocks,), bmask = per_row_widths([logp], [r[0] for r in rows], [r[1] for r in rows], 0, row_block=2)
    assert torch.equal(blocks, whole) and bmask.sum(-1).tolist() == [20.0, 21.0, 22.0, 23.0, 24.0]


def test_loss_aggregations_by_hand():
    """token_mean weighs every token alike, seq_mean_token_mean every row alike (an empty row
    counts 0), seq_mean_token_sum_norm divides the token sum by rows x the response limit;
    padding (NaN here) never reaches any of them, and the parts' shares sum to 1."""
    from actions.rl.masked import aggregate, micro_share

    x = torch.tensor([[1.0, 2.0, 3.0, float("nan")], [4.0, float("nan"), float("nan"), float("nan")],
                      [float("nan")] * 4])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    assert aggregate(x, mask, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(x, mask, "seq_mean_token_mean").item() == pytest.approx((2.0 + 4.0 + 0.0) / 3)
    assert aggregate(x, mask, "seq_mean_token_sum_norm", norm_tokens=8).item() == pytest.approx(10 / (3 * 8))
    with pytest.raises(ValueError, match="norm_tokens is None; pass generation.max_new_tokens"):
        aggregate(x, mask, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="'sum' is not one of"):
        aggregate(x, mask, "sum")
    idx, parts = torch.arange(3), (torch.tensor([0]), torch.tensor([1, 2]))
    for mode, want in (("token_mean", (0.75, 0.25)), ("seq_mean_token_mean", (1 / 3, 2 / 3)),
                       ("seq_mean_token_sum_norm", (1 / 3, 2 / 3))):
        got = [micro_share(mask, p, idx, mode).item() for p in parts]
        assert got == pytest.approx(want) and sum(got) == pytest.approx(1.0)
        x0 = torch.nan_to_num(x)
        whole = aggregate(x0, mask, mode, 8)
        split = sum(micro_share(mask, p, idx, mode) * aggregate(x0[p], mask[p], mode, 8) for p in parts)
        assert split.item() == pytest.approx(whole.item())


def test_batch_std_scope_divides_group_centred_rewards_by_the_steps_std():
    """``std_scope: batch``: group mean, batch std (population, over the scored rows); uniform
    groups stay exactly 0, unscored rows 0 and out of the std."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0, 1.0, 2.0, 2.0])
    adv = group_normalized_advantages(rewards, 4, std_scope="batch")
    centred = torch.tensor([0.75, -0.25, -0.25, -0.25, 1.0, -1.0, 0.0, 0.0])
    torch.testing.assert_close(adv, centred / (rewards.std(unbiased=False) + 1e-6))
    group = group_normalized_advantages(rewards, 4)
    assert not torch.allclose(adv, group)  # the first group's spread is no longer stretched to 1
    flat = torch.tensor([0.3] * 4 + [1.0, 0.0, 0.0, 1.0])
    assert group_normalized_advantages(flat, 4, std_scope="batch")[:4].tolist() == [0.0] * 4
    scored = torch.tensor([True, True, False, True, True, True, True, True])
    got = group_normalized_advantages(rewards, 4, std_scope="batch", scored=scored)
    kept = rewards[scored]
    mean0 = (1.0 + 0.0 + 0.0) / 3
    assert got[2].item() == 0.0
    assert got[0].item() == pytest.approx((1.0 - mean0) / (kept.std(unbiased=False).item() + 1e-6), rel=1e-6)
    assert got[4].item() == pytest.approx(1.0 / (kept.std(unbiased=False).item() + 1e-6), rel=1e-6)
    with pytest.raises(ValueError, match="std_scope 'row' is not group or batch"):
        group_normalized_advantages(rewards, 4, std_scope="row")
