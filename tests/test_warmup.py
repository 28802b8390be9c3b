"""The warm-up action trains and stores policy version 0 as train_step trains and stores a version.

On the action's device (``RLHFLESS_DEVICE``), in ``model.dtype`` with fp32 master weights
under bf16, with ``model.gradient_checkpointing`` honoured, and v0 published in that dtype,
so generate and score load exactly the stored tensors. The CUDA variant is in test_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

import actions.warmup as warmup
from actions.contracts import ModelRef, WarmupRequest
from actions.models.device import action_device
from actions.models.loading import load_model
from actions.rl.update import make_optimizer
from actions.store import LocalStore
from actions.store.weights import load_tensors
from tests.conftest import prepare_tiny


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare_tiny(tmp_path_factory.mktemp("store"), "runs/w")


def _request(cfg, store, p, name: str, **fields) -> WarmupRequest:
    return WarmupRequest(store_uri=store.uri, base_key=p.base_key, init_key=p.init_key, dataset_key=p.train_key,
                         output_key=f"runs/w/{name}/manifest.json", warmup=cfg.warmup, task="repeat", seed=0, **fields)


@pytest.fixture
def spied(monkeypatch):
    """What the warm-up trained with: each forward's model and batch, and its optimizer."""
    seen: dict = {"forwards": []}
    forward, optimizer = warmup.response_logprobs, make_optimizer

    def spy_forward(model, packed):
        param = next(model.parameters())
        # transformers >= 5.x names it is_activation_checkpointing (as recompute.py's enable call)
        recomputes = getattr(model, "is_activation_checkpointing", None)
        if recomputes is None:
            recomputes = model.is_gradient_checkpointing
        seen["forwards"].append((param.dtype, param.device, packed.input_ids.device, recomputes))
        return forward(model, packed)

    def spy_optimizer(module, lr):
        seen["names"] = [n for n, p in module.named_parameters() if p.requires_grad]
        seen["opt"] = optimizer(module, lr)
        return seen["opt"]

    monkeypatch.setattr(warmup, "response_logprobs", spy_forward)
    monkeypatch.setattr(warmup, "make_optimizer", spy_optimizer, raising=False)
    monkeypatch.setenv("RLHFLESS_DEVICE", "cpu")
    return seen


def test_bf16_warmup_trains_on_the_action_device_and_stores_what_generate_loads(prepared, spied):
    cfg, store, p = prepared
    res = warmup.run_warmup(_request(cfg, store, p, "bf16", dtype="bfloat16", gradient_checkpointing=True))
    device = action_device()
    assert spied["forwards"] == [(torch.bfloat16, device, device, True)] * cfg.warmup.steps
    stored, _ = load_tensors(store, res.policy_key)
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    # v0 is the optimizer's fp32 masters rounded once, as train_step publishes a version
    opt = spied["opt"]
    assert opt.mixed and all(m.dtype == torch.float32 for m in opt.master)
    assert [n for n, m in zip(spied["names"], opt.master) if not torch.equal(stored[n], m.to(torch.bfloat16))] == []
    init, _ = load_tensors(store, p.init_key)
    assert [n for n in spied["names"] if torch.equal(stored[n], init[n].to(torch.bfloat16))] == []
    # generate and score load the version in model.dtype: exactly the stored tensors, no conversion
    model, _, _ = load_model(ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=res.policy_key,
                                      policy_version=0, weights_sha256=res.weights_sha256, dtype="bfloat16"))
    loaded = model.state_dict()
    assert [n for n, t in stored.items() if not torch.equal(loaded[n], t)] == []


def test_gradient_checkpointing_is_honoured_and_changes_no_weight(prepared, spied):
    cfg, store, p = prepared
    plain = warmup.run_warmup(_request(cfg, store, p, "fp32"))
    assert {f[3] for f in spied["forwards"]} == {False}
    spied["forwards"].clear()
    recomputed = warmup.run_warmup(_request(cfg, store, p, "fp32-ckpt", gradient_checkpointing=True))
    assert {f[3] for f in spied["forwards"]} == {True}
    assert {f[0] for f in spied["forwards"]} == {torch.float32} and not spied["opt"].mixed  # fp32: no masters
    assert recomputed.weights_sha256 == plain.weights_sha256  # memory for compute, the same weights


def test_campaign_passes_model_dtype_and_checkpointing_to_warmup(tiny_config, prefect_harness, monkeypatch):
    from flows.campaign.run import run_campaign
    from flows.invokers.inprocess import InProcessInvoker

    payloads = {}
    invoke = InProcessInvoker.invoke

    def record(self, action, payload, *a, **k):
        payloads.setdefault(action, payload)
        return invoke(self, action, payload, *a, **k)

    monkeypatch.setattr(InProcessInvoker, "invoke", record)
    cfg = tiny_config("invoker.kind=inprocess", "run_id=warm-bf16", "model.dtype=bfloat16",
                      "model.gradient_checkpointing=true", "steps=1")
    run_campaign(cfg, progress=lambda m: None)
    req = WarmupRequest.model_validate(payloads["warmup"])
    assert (req.dtype, req.gradient_checkpointing) == ("bfloat16", True)
    stored, meta = load_tensors(LocalStore(cfg.store.uri), req.output_key)
    assert meta["source"] == "warmup" and {t.dtype for t in stored.values()} == {torch.bfloat16}


def test_each_row_is_trained_on_its_own_prompt_encoded_once(prepared, monkeypatch):
    """Warm-up encodes a row's prompt the first time the row is drawn and reuses it after; every
    packed prompt is that row's own encoding."""
    from actions.models.loading import encode_prompt
    from actions.tasks.stored import load_dataset

    cfg, store, p = prepared
    rows = load_dataset(store.uri, p.train_key)
    calls: list[int] = []
    packed: list[list[tuple[int, ...]]] = []
    real_pack = warmup.pack

    def counting(tokenizer, row):
        calls.append(row.prompt_id)
        return encode_prompt(tokenizer, row)

    def recording(prompts, targets, pad_id):
        packed.append([tuple(x) for x in prompts])
        return real_pack(prompts, targets, pad_id)

    monkeypatch.setattr(warmup, "encode_prompt", counting)
    monkeypatch.setattr(warmup, "pack", recording)
    monkeypatch.setenv("RLHFLESS_DEVICE", "cpu")
    warmup.run_warmup(_request(cfg, store, p, "encoded-once"))
    assert len(calls) == len(set(calls)) and len(packed) == cfg.warmup.steps
    tokenizer = load_model(ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=p.init_key,
                                    policy_version=0))[1]
    drawn = {tuple(encode_prompt(tokenizer, rows[i])) for i in set(calls)}  # the rows' own (texts repeat)
    assert {prompt for step in packed for prompt in step} == drawn and len(drawn) > 1
