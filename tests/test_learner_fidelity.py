"""The learner's log-probs are those of the distribution the rollouts were drawn from, on every
model family: the critic on any decoder, each family's own output head, fp32 rotary buffers
under bf16, the sampling temperature, whole prompt groups in as many mini-batches as asked,
and no model dropout in the update."""

from __future__ import annotations

import pytest
import torch
import transformers

from actions.config.workload import AlgorithmConfig
from actions.models.modeling import base_files, build_model, build_tiny_model, read_base
from actions.rl.batch import TrainBatch
from actions.rl.critic import build_critic
from actions.rl.dropout import disable_dropout
from actions.rl.head import check_head
from actions.rl.optimizer import TrainOptimizer
from actions.rl.sequences import pack, per_row_widths, response_logprobs, response_logprobs_full
from actions.rl.update import minibatches, policy_logprobs, run_updates

pytestmark = pytest.mark.usefixtures("one_thread")  # as an action runs (conftest)


LLAMA_LIKE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, bos_token_id=1, eos_token_id=1, pad_token_id=0)
PROMPTS, RESPONSES = [[3, 4, 5], [6, 7], [9, 3, 8, 2]], [[8, 9], [10, 11, 12], [5]]


def _tiny(config: transformers.PretrainedConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _gpt2(pdrop: float = 0.0) -> torch.nn.Module:
    return _tiny(transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                         bos_token_id=1, eos_token_id=1, resid_pdrop=pdrop, embd_pdrop=pdrop,
                                         attn_pdrop=pdrop))


@pytest.mark.parametrize("decoder", ["gpt2", "gpt_neox"])
def test_the_critic_runs_on_decoders_that_are_not_at_model(decoder):
    lm = _gpt2() if decoder == "gpt2" else _tiny(transformers.GPTNeoXConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        bos_token_id=1, eos_token_id=1))
    critic = build_critic(lm, None)
    torch.nn.init.normal_(critic.value_head.weight)
    batch = pack(PROMPTS, RESPONSES, 0)
    with torch.no_grad():
        values = critic(batch)
        hidden = getattr(lm, lm.base_model_prefix)(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                                   position_ids=batch.position_ids).last_hidden_state
        P, T = batch.prompt_width, batch.response_width
        expected = critic.value_head(hidden[:, P - 1:P + T - 1]).squeeze(-1) * batch.response_mask
    assert values.shape == (3, 3) and torch.equal(values, expected) and values.abs().sum() > 0


HEADS = {  # family: (config class, its head settings), each far from the identity
    "granite": ("GraniteConfig", dict(logits_scaling=8.0)),
    "granitemoe": ("GraniteMoeConfig", dict(logits_scaling=8.0, num_local_experts=2, num_experts_per_tok=1)),
    "hyperclovax": ("HyperCLOVAXConfig", dict(logits_scaling=0.25)),
    "minicpm3": ("MiniCPM3Config", dict(dim_model_base=8)),  # logits_scaling = hidden_size / dim_model_base = 4
    "falcon_h1": ("FalconH1Config", dict(lm_head_multiplier=3.0, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8,
                                        mamba_d_state=8, mamba_chunk_size=8)),  # its defaults' SSM: 20 s a test
    "cohere": ("CohereConfig", dict(logit_scale=0.25)),
    "gemma2": ("Gemma2Config", dict(final_logit_softcapping=2.0, head_dim=8)),
    "mpt": ("MptConfig", dict(logit_scale=4.0)),  # transformers' MPT does not apply it
}


def _head_model(family: str) -> torch.nn.Module:
    cls, settings = HEADS[family]
    config_cls = getattr(transformers, cls)
    if family == "mpt":
        return _tiny(config_cls(vocab_size=64, d_model=32, n_heads=4, n_layers=2, **settings))
    return _tiny(config_cls(**LLAMA_LIKE, **settings))


@pytest.mark.parametrize("family", sorted(HEADS))
def test_chunked_logprobs_apply_each_familys_own_head_as_its_forward_does(family):
    model = _head_model(family)
    batch = pack(PROMPTS, RESPONSES, 0)
    with torch.no_grad():
        for temperature in (1.0, 0.7):
            chunked = response_logprobs(model, batch, temperature=temperature)
            full = response_logprobs_full(model, batch, temperature=temperature)
            torch.testing.assert_close(chunked, full, atol=2e-6, rtol=0)


def test_gemma3n_loaded_whole_softcaps_with_its_text_configs_cap():
    """Gemma 3n's multimodal forward (what AutoModelForCausalLM loads for it) reads the cap from
    its text config, where its top-level config has none."""
    from actions.rl.head import head_logits

    class Whole(torch.nn.Module):  # the head's inputs only: a whole Gemma 3n needs its vision tower
        def __init__(self) -> None:
            super().__init__()
            self.config = transformers.Gemma3nConfig()
            self.head = torch.nn.Linear(8, 16, bias=False)

        def get_output_embeddings(self) -> torch.nn.Module:
            return self.head

    model, hidden = Whole(), torch.randn(3, 8) * 50
    cap = model.config.get_text_config().final_logit_softcapping
    assert not hasattr(model.config, "final_logit_softcapping") and cap == 30.0
    with torch.no_grad():
        torch.testing.assert_close(head_logits(model, hidden), torch.tanh(model.head(hidden) / cap) * cap)


def test_a_family_whose_logit_scale_is_unknown_is_refused_naming_the_field():
    config = transformers.LlamaConfig(**LLAMA_LIKE)
    check_head(config)  # no scale: fine
    config.logits_scaling = 2.0
    with pytest.raises(ValueError, match=r"model config logits_scaling=2.0 \(model_type 'llama'\).*actions/rl/head.py"):
        check_head(config)
    config.logits_scaling = 1.0  # the identity changes nothing: accepted
    check_head(config)


def test_prepare_refuses_a_model_with_an_unknown_logit_scale_before_writing(tmp_path):
    import json

    from flows.commands.tiny_model_dir import write_tiny_model_dir
    from tests.conftest import prepare_tiny

    info = write_tiny_model_dir(tmp_path / "m", "llama", hidden_size=32, num_heads=2, num_kv_heads=1)
    config_path = tmp_path / "m" / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "logits_scaling": 2.0}))
    with pytest.raises(ValueError, match=r"model config logits_scaling=2.0 \(model_type 'llama'\)"):
        prepare_tiny(tmp_path / "store", "runs/x", f"model.path={info.path}")
    assert not any((tmp_path / "store").rglob("manifest.json"))


def test_a_bf16_model_keeps_its_rotary_buffers_in_fp32_as_transformers_does():
    model, tokenizer = build_tiny_model(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                                        max_positions=4096, seed=0)
    base = read_base(base_files(model, tokenizer))
    tensors = model.state_dict()
    fp32 = build_model(base, tensors)
    bf16 = build_model(base, tensors, dtype=torch.bfloat16)
    assert bf16.model.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.equal(bf16.model.embed_tokens.weight, tensors["model.embed_tokens.weight"].to(torch.bfloat16))
    for name in ("inv_freq", "original_inv_freq"):
        ours, theirs = getattr(bf16.model.rotary_emb, name), getattr(fp32.model.rotary_emb, name)
        assert ours.dtype == torch.float32 and torch.equal(ours, theirs), name


def test_the_store_loaders_build_bf16_models_and_critics_with_fp32_rotary_buffers(tmp_path):
    from actions.contracts import ModelRef
    from actions.models.loading import load_model
    from actions.rl.critic import HEAD_PREFIX
    from actions.rl.critic_store import load_critic
    from actions.store import LocalStore, put_artifact
    from actions.store.weights import publish_tensors

    model, tokenizer = build_tiny_model(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                                        max_positions=4096, seed=0)
    store = LocalStore(tmp_path)
    put_artifact(store, "base/manifest.json", base_files(model, tokenizer))
    tensors = model.state_dict()
    v0 = publish_tensors(store, "v0/manifest.json", tensors)
    critic_tensors = {**tensors, HEAD_PREFIX + "weight": torch.ones(1, 32), HEAD_PREFIX + "bias": torch.zeros(1)}
    publish_tensors(store, "critic/manifest.json", critic_tensors)
    ref = ModelRef(store_uri=store.uri, base_key="base/manifest.json", policy_key=v0.manifest_key, policy_version=0,
                   dtype="bfloat16")
    policy, _, _ = load_model(ref, fresh=True)
    critic = load_critic(store.uri, "base/manifest.json", "critic/manifest.json", fresh=True, dtype_setting="bfloat16")
    expected = model.model.rotary_emb.inv_freq
    for lm in (policy, critic.lm):
        assert lm.model.embed_tokens.weight.dtype == torch.bfloat16
        assert lm.model.rotary_emb.inv_freq.dtype == torch.float32 and torch.equal(lm.model.rotary_emb.inv_freq,
                                                                                   expected)
    assert critic.value_head.weight.dtype == torch.bfloat16


def _scored_batch(model, algo: AlgorithmConfig, temperature: float) -> TrainBatch:
    """A batch as gather_batch builds it, old_logp scored in eval mode as the score action does."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 64, (int(n),), generator=g).tolist() for n in torch.randint(2, 9, (algo.batch_size,),
                                                                                            generator=g)]
    responses = [torch.randint(2, 64, (int(n),), generator=g).tolist() for n in torch.randint(1, 9, (algo.batch_size,),
                                                                                              generator=g)]
    packed = pack(prompts, responses, 0)
    model.eval()
    with torch.no_grad():
        (old,), _ = per_row_widths([lambda b: response_logprobs(model, b, temperature=temperature)], prompts,
                                   responses, 0)
    old = old[:, :packed.response_width] * packed.response_mask
    rewards = torch.tensor([float(i % 2) for i in range(algo.batch_size)])
    return TrainBatch(packed, old, None, rewards, None, ["stop"] * algo.batch_size, prompts, responses, 0,
                      temperature=temperature)


def test_logprobs_are_of_the_tempered_distribution_and_temperature_one_changes_no_bit():
    model = _gpt2()
    batch = pack(PROMPTS, RESPONSES, 0)
    with torch.no_grad():
        plain = response_logprobs(model, batch)
        assert torch.equal(response_logprobs(model, batch, temperature=1.0), plain)
        assert torch.equal(response_logprobs(model, batch, temperature=0.0), plain)  # greedy: read as 1
        P, T = batch.prompt_width, batch.response_width
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits[:, P - 1:P + T - 1].float()
        tempered = torch.log_softmax(logits / 0.5, -1).gather(-1, batch.input_ids[:, P:, None]).squeeze(-1)
        torch.testing.assert_close(response_logprobs(model, batch, temperature=0.5),
                                   tempered * batch.response_mask, atol=2e-6, rtol=0)


def test_the_update_trains_at_the_sampling_temperature():
    """old_logp scored at T = 0.5: the update's own log-probs before any step are the same bits
    (ratio exactly 1), which they are not at T = 1."""
    algo = AlgorithmConfig(name="grpo", batch_size=8, group_size=2, num_minibatches=1, lr=1e-3, kl_coef=0.0)
    model = _gpt2()
    batch = _scored_batch(model, algo, temperature=0.5)
    model.train()
    metrics = run_updates(model, TrainOptimizer(model, algo.lr), batch, algo, None, None, seed=0, step=0)
    assert metrics["ratio_mean"] == 1.0 and metrics["clipfrac"] == 0.0


def test_score_and_train_requests_carry_the_generation_temperature(tmp_path):
    from actions.contracts import ModelRef, ScoreRequest, TrainStepRequest
    from actions.store import LocalStore
    from flows.config import load_config
    from flows.step.context import RunContext
    from flows.step.payloads import StepInputs, score_payload, train_payload

    cfg = load_config(None, [f"store.uri={tmp_path}", "run_id=t", "generation.temperature=0.7"])
    ctx = RunContext(config=cfg, store=LocalStore(tmp_path), invoker=None, run_id="t")
    model = ModelRef(store_uri=str(tmp_path), base_key="b", policy_key="p", policy_version=0)
    inputs = StepInputs(step=0, epoch=0, prompt_ids=[0], model=model, reference_key="p", train_key="d",
                        optimizer_key=None, critic_key=None, critic_optimizer_key=None)
    assert ScoreRequest.model_validate(score_payload(ctx, inputs, ["r"], "s0")).temperature == 0.7
    assert TrainStepRequest.model_validate(train_payload(ctx, inputs, ["k"])).temperature == 0.7
    # at temperature 1 the field is left out: actions of the revision before it refuse unknown fields
    ctx = RunContext(config=load_config(None, [f"store.uri={tmp_path}", "run_id=t"]), store=ctx.store, invoker=None,
                     run_id="t")
    assert "temperature" not in score_payload(ctx, inputs, ["r"], "s0")
    assert "temperature" not in train_payload(ctx, inputs, ["k"])


@pytest.mark.parametrize("batch_size,group_size,num_minibatches", [(6, 1, 4), (12, 4, 2), (10, 1, 4), (5, 1, 4),
                                                                   (9, 3, 2), (128, 8, 2), (16, 4, 2), (24, 2, 3)])
def test_minibatches_are_as_many_as_asked_of_whole_groups(batch_size, group_size, num_minibatches):
    algo = AlgorithmConfig(name="ppo" if group_size == 1 else "grpo",  # GRPO refuses groups of 1
                           batch_size=batch_size, group_size=group_size, num_minibatches=num_minibatches)
    parts = minibatches(batch_size, algo, torch.Generator().manual_seed(7))
    assert len(parts) == num_minibatches
    assert sorted(torch.cat(parts).tolist()) == list(range(batch_size))
    groups = [sorted({r // group_size for r in p.tolist()}) for p in parts]
    for part, gs in zip(parts, groups):
        assert len(part) == len(gs) * group_size  # whole groups only
    sizes = [len(gs) for gs in groups]
    assert max(sizes) - min(sizes) <= 1
    prompts = batch_size // group_size
    if prompts % num_minibatches == 0:  # the row split of before, row for row (the default config's case)
        perm = torch.randperm(prompts, generator=torch.Generator().manual_seed(7))
        rows = (perm[:, None] * group_size + torch.arange(group_size)).flatten()
        assert all(torch.equal(a, b) for a, b in zip(parts, rows.chunk(num_minibatches), strict=True))


def test_each_step_and_epoch_shuffles_its_mini_batches_anew():
    """The mini-batch order is seeded by (seed, step): a resumed step draws the same, the next
    step another (an order shared by every step would visit the groups in a fixed pattern)."""
    algo = AlgorithmConfig(batch_size=64, group_size=4, num_minibatches=4, epochs=2)
    packed = pack([[1]] * 64, [[2]] * 64, 0)
    batch = TrainBatch(packed, torch.zeros(packed.response_mask.shape), None, torch.arange(64.0) % 3, None,
                       ["stop"] * 64, [[1]] * 64, [[2]] * 64, 0)

    def orders(seed: int, step: int) -> list[list[int]]:
        seen: list[list[int]] = []

        def record(policy, opt, batch, adv, idx, algo, *, masks):
            seen.append(idx.tolist())
            return {}
        run_updates(None, None, batch, algo, None, None, seed=seed, step=step, policy_pass=record)
        return seen

    first = orders(0, 0)
    assert len(first) == 8 and first == orders(0, 0)
    assert first[:4] != first[4:]  # the second epoch reshuffles
    assert first != orders(0, 1) and first != orders(1, 0)


def test_the_update_runs_without_model_dropout_and_keeps_lora_dropout():
    """A GPT-2 with every dropout at 0.1: in train mode, after disable_dropout, the update's
    log-probs are the eval-mode scored old_logp bit for bit (ratio exactly 1)."""
    algo = AlgorithmConfig(name="grpo", batch_size=8, group_size=2, num_minibatches=1, lr=1e-3, kl_coef=0.0)
    model = _gpt2(pdrop=0.1)
    batch = _scored_batch(model, algo, temperature=1.0)
    model.train()
    idx = torch.arange(algo.batch_size)
    with torch.no_grad():
        noisy, _ = policy_logprobs(model, batch, idx)
    assert not torch.equal(noisy, batch.old_logp)  # dropout on: the ratios are noise
    assert disable_dropout(model) > 0 and disable_dropout(model) == 0
    assert model.config.resid_pdrop == model.config.attn_pdrop == model.config.embd_pdrop == 0.0
    with torch.no_grad():
        logp, _ = policy_logprobs(model, batch, idx)
    assert model.training and torch.equal(logp, batch.old_logp)
    metrics = run_updates(model, TrainOptimizer(model, algo.lr), batch, algo, None, None, seed=0, step=0)
    assert metrics["ratio_mean"] == 1.0

    from actions.config.workload import LoraConfig
    from actions.models.lora import attach_adapter

    lora = attach_adapter(_gpt2(pdrop=0.1), LoraConfig(r=2, alpha=4, dropout=0.1, target_modules=["c_attn"]), None)
    disable_dropout(lora)
    rates = {n: m.p for n, m in lora.named_modules() if isinstance(m, torch.nn.Dropout)}
    assert rates and all((p == 0.1) == ("lora_dropout" in n) for n, p in rates.items()), rates


def test_score_and_train_actions_agree_at_the_sampling_temperature_on_a_model_with_dropout(tmp_path):
    """Action level: a Qwen2 with ``attention_dropout`` 0.1, sampled at temperature 0.7. The score
    action's old_logp (eval mode) and the train action's first pass (train mode) are the same
    bits, so the ratio before any update is exactly 1: dropout is off and both use T = 0.7."""
    import importlib
    import json

    from actions.contracts import ModelRef
    from flows.commands.tiny_model_dir import write_tiny_model_dir
    from tests.conftest import prepare_tiny

    info = write_tiny_model_dir(tmp_path / "q", "qwen2", hidden_size=32, num_heads=2, num_kv_heads=1, seed=1)
    config_path = tmp_path / "q" / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "attention_dropout": 0.1}))
    _, store, p = prepare_tiny(tmp_path / "store", "runs/d", f"model.path={info.path}")

    def call(name, payload):
        result = importlib.import_module(f"actions.{name}").main(json.loads(json.dumps(payload)))
        assert "error" not in result, result
        return result

    ref = ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=p.init_key, policy_version=0).model_dump()
    gen = call("generate", {"model": ref, "dataset_key": p.train_key, "run_seed": 0, "step": 0, "shard": "g",
                            "prompt_ids": [0, 1, 2, 3], "group_size": 4, "max_new_tokens": 6, "temperature": 0.7,
                            "output_key": "runs/d/roll.json"})
    scoring = AlgorithmConfig(batch_size=16, group_size=4, num_minibatches=2, kl_coef=0.0, lr=1e-3)
    score = call("score", {"policy": ref, "reference_key": p.init_key, "dataset_key": p.train_key,
                           "rollout_keys": [gen["rollout_key"]], "rewards": [{"name": "repeat"}],
                           "algorithm": scoring.model_dump(), "temperature": 0.7,
                           "output_key": "runs/d/scored/manifest.json"})
    one_pass = scoring.model_copy(update={"num_minibatches": 1})  # one update: its ratio is the scored one's
    train = call("train_step", {"policy": ref, "optimizer_key": None, "scored_keys": [score["scored_key"]],
                                "algorithm": one_pass.model_dump(), "seed": 0, "step": 0, "temperature": 0.7,
                                "output_prefix": "runs/d/train"})
    assert train["metrics"]["ratio_mean"] == 1.0 and train["metrics"]["clipfrac"] == 0.0


@pytest.mark.parametrize("family", ["mixtral", "phimoe"])
def test_moe_routing_is_the_scored_routing_in_the_update(family):
    """Mixtral's router jitter and PhiMoE's sampled routing make a train-mode forward random;
    after disable_dropout the update's forward is the eval-mode one bit for bit, the decoder
    layers stay in train mode (gradient checkpointing) and the router still gets a gradient."""
    from transformers import MixtralConfig, MixtralForCausalLM, PhimoeConfig, PhimoeForCausalLM

    shape = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.3)
    torch.manual_seed(0)
    if family == "mixtral":
        model = MixtralForCausalLM(MixtralConfig(**shape))
    else:
        model = PhimoeForCausalLM(PhimoeConfig(**shape, input_jitter_noise=0.3))
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        scored = model.eval()(ids).logits
        model.train()
        assert not torch.equal(model(ids).logits, scored)  # random routing in train mode
    assert disable_dropout(model) > 0 and disable_dropout(model) == 0
    assert model.training and all(layer.training for layer in model.model.layers)
    logits = model(ids).logits
    assert torch.equal(logits, scored)
    logits.sum().backward()
    routers = [p for n, p in model.named_parameters() if "gate" in n.split(".")[-2] or "router" in n]
    assert routers and all(p.grad is not None and p.grad.abs().sum() > 0 for p in routers)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_first_critic_is_policy_v0_in_its_stored_dtype(tmp_path, dtype):
    """init_critic copies the stored policy's backbone bit for bit, in its dtype (a bf16 policy
    gets a bf16 critic, not one of twice the bytes), with a zero head of the same dtype."""
    from actions.contracts import CriticInitRequest, ModelRef
    from actions.init_critic import run_init_critic
    from actions.store.weights import load_tensors, publish_tensors
    from tests.conftest import prepare_tiny

    _, store, p = prepare_tiny(tmp_path, "runs/c")
    policy = {k: v.to(dtype) for k, v in load_tensors(store, p.init_key)[0].items()}
    published = publish_tensors(store, "runs/c/policy/v000000/manifest.json", policy)
    ref = ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=published.manifest_key, policy_version=0,
                   weights_sha256=published.weights_sha256)
    res = run_init_critic(CriticInitRequest(model=ref, output_key="runs/c/critic/v000000/manifest.json"))
    critic, _ = load_tensors(store, res.critic_key, expected_sha256=res.weights_sha256)
    assert {t.dtype for t in critic.values()} == {dtype}
    assert [k for k, v in policy.items() if not torch.equal(critic[k], v)] == []
    head = {k: v for k, v in critic.items() if k not in policy}
    assert head and all(not v.any() for v in head.values())


def _state(module: torch.nn.Module, opt: TrainOptimizer) -> dict[str, torch.Tensor]:
    return {**{f"w.{k}": v.detach().clone() for k, v in module.state_dict().items()},
            **{f"o.{k}": v.clone() for k, v in opt.state_tensors().items()}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_nonfinite_gradient_skips_the_optimizer_step_and_a_finite_one_steps_as_adamw(dtype):
    """As torch.amp's GradScaler: a NaN or inf gradient norm leaves the weights, the fp32 masters
    and AdamW's moments and step count as they were, and the next finite step is the step that
    would have come without it. A finite step is plain AdamW after clipping, bit for bit."""
    def stepped(nan_between: bool) -> tuple[torch.nn.Module, TrainOptimizer]:
        torch.manual_seed(0)
        layer = torch.nn.Linear(4, 4).to(dtype)
        opt = TrainOptimizer(layer, lr=1e-2)
        for i, scale in enumerate([1.0, float("nan"), float("inf"), 2.0] if nan_between else [1.0, 2.0]):
            opt.zero_grad()
            (layer(torch.ones(1, 4, dtype=dtype)).sum() * scale).backward()
            before = _state(layer, opt)
            norm = opt.step(max_grad_norm=1.0)
            if scale in (1.0, 2.0):
                assert norm > 0
            else:
                assert norm != norm or norm == float("inf")
                after = _state(layer, opt)
                assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
                assert all(p.grad is None for p in [*opt.params, *opt.master])
        return layer, opt

    plain, plain_opt = stepped(False)
    skipped, skipped_opt = stepped(True)
    a, b = _state(plain, plain_opt), _state(skipped, skipped_opt)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if dtype == torch.float32:  # the finite path is torch's AdamW, unchanged
        torch.manual_seed(0)
        ref = torch.nn.Linear(4, 4)
        adamw = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0, foreach=False)
        for scale in (1.0, 2.0):
            adamw.zero_grad()
            (ref(torch.ones(1, 4)).sum() * scale).backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
            adamw.step()
        assert all(torch.equal(x, y) for x, y in zip(ref.state_dict().values(), plain.state_dict().values()))


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_an_infinite_reward_skips_the_mini_batches_it_reaches_and_warns(name):
    """An infinite reward (which the reward checks refuse; this is the learner's own guard)
    makes its group's advantages NaN: the mini-batch holding it makes no step and is counted,
    the other mini-batch trains, no weight turns NaN, and ``nonfinite_update`` fires. PPO
    whitens the advantages over the batch, so every policy step is skipped; the critic's
    returns are infinite in one mini-batch only."""
    import copy

    from actions.rl.critic import build_critic
    from actions.rl.update import CRITIC_SKIPPED, SKIPPED
    from flows.campaign.learning_warnings import find_warnings

    algo = AlgorithmConfig(name=name, batch_size=8, group_size=2, num_minibatches=2, lr=1e-3, kl_coef=0.0)
    model = _gpt2()
    batch = _scored_batch(model, algo, temperature=1.0)
    batch.rewards[0] = float("inf")
    critic = critic_opt = None
    if name == "ppo":
        batch.values = torch.zeros_like(batch.old_logp)
        critic = build_critic(copy.deepcopy(model), None)
        critic_opt = TrainOptimizer(critic, algo.critic_lr)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = run_updates(model, TrainOptimizer(model, algo.lr), batch, algo, critic, critic_opt, seed=0, step=0)
    after = model.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    if name == "grpo":
        assert metrics[SKIPPED] == 1.0 and CRITIC_SKIPPED not in metrics
        assert any(not torch.equal(before[k], after[k]) for k in before)  # the other mini-batch trained
    else:
        assert metrics[SKIPPED] == 2.0 and metrics[CRITIC_SKIPPED] == 1.0  # only one mini-batch's returns are inf
        assert all(torch.equal(before[k], after[k]) for k in before)
        assert all(torch.isfinite(p).all() for p in critic.parameters())
    assert metrics["grad_norm"] != metrics["grad_norm"]  # NaN: the average over mini-batches keeps it
    assert [w.kind for w in find_warnings([metrics], total=1)] == ["nonfinite_update"]
    if name == "grpo":  # a finite batch skips nothing
        finite = _scored_batch(model, algo, 1.0)
        metrics = run_updates(model, TrainOptimizer(model, algo.lr), finite, algo, None, None, seed=0, step=0)
        assert metrics[SKIPPED] == 0


def test_kl_kind_defaults_to_each_algorithms_own_estimator_and_ppo_refuses_scale_by_std():
    assert AlgorithmConfig().kl_kind == "k3" and AlgorithmConfig(name="ppo").kl_kind == "k1"
    assert AlgorithmConfig(name="ppo", kl_kind=None).kl_kind == "k1"
    assert AlgorithmConfig(name="ppo", kl_kind="k3").kl_kind == "k3"
    with pytest.raises(ValueError, match="algorithm.scale_by_std=false .* remove algorithm.scale_by_std"):
        AlgorithmConfig(name="ppo", scale_by_std=False)


def test_grpo_refuses_ppo_settings_it_would_ignore():
    """PPO's critic and GAE settings change nothing GRPO computes but would change its run id."""
    with pytest.raises(ValueError, match=r"algorithm.gamma=0.9 sets PPO's .* remove algorithm.gamma or set "
                                         r"algorithm.name=ppo"):
        AlgorithmConfig(gamma=0.9)
    with pytest.raises(ValueError, match=r"critic_lr=0.1, algorithm.value_clip=0.5 set .* remove "
                                         r"algorithm.critic_lr and algorithm.value_clip"):
        AlgorithmConfig(critic_lr=0.1, value_clip=0.5)
    assert AlgorithmConfig(gamma=1.0).gamma == 1.0  # the default, stated: nothing to refuse
    assert AlgorithmConfig(name="ppo", gamma=0.9, critic_lr=0.1).gamma == 0.9


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_ppo_penalises_and_reports_the_kl_estimator_it_is_configured_with(kind):
    """``algorithm.kl_kind`` reaches PPO's per-token KL reward (so its advantages and returns)
    and its ``kl`` metric, as TRL's ``kl_estimator`` does."""
    import copy

    from actions.rl.advantage import gae, kl_penalized_token_rewards
    from actions.rl.kl import kl_estimate
    from actions.rl.masked import masked_mean
    from actions.rl.update import compute_advantages

    algo = AlgorithmConfig(name="ppo", batch_size=4, group_size=1, num_minibatches=1, kl_coef=0.5, kl_kind=kind)
    model = _gpt2()
    batch = _scored_batch(model, algo, temperature=1.0)
    mask = batch.packed.response_mask
    batch.ref_logp = (batch.old_logp - torch.linspace(-1.0, 1.0, mask.shape[1])) * mask
    batch.values = torch.zeros_like(batch.old_logp)
    _, ret = compute_advantages(batch, algo)
    token_rewards = kl_penalized_token_rewards(batch.rewards, batch.old_logp, batch.ref_logp, mask, 0.5, kind)
    assert torch.equal(ret, gae(token_rewards, batch.values, mask, algo.gamma, algo.gae_lambda)[1])
    other = compute_advantages(batch, algo.model_copy(update={"kl_kind": "k3" if kind == "k1" else "k1"}))[1]
    assert not torch.equal(ret, other)
    critic = build_critic(copy.deepcopy(model), None)
    metrics = run_updates(model, TrainOptimizer(model, algo.lr), batch, algo, critic,
                          TrainOptimizer(critic, algo.critic_lr), seed=0, step=0)
    assert metrics["kl"] == pytest.approx(float(masked_mean(kl_estimate(batch.old_logp, batch.ref_logp, kind), mask)))
