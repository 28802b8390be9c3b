"""warmup action: a short supervised phase so RL starts from a non-trivial policy.

Trains the initial weights on demonstrations (teacher forcing, loss on answer tokens and EOS):
a synthetic task's imperfect demonstrator, or a user dataset's reference answers verbatim, and
publishes the result, which becomes policy version 0 and the frozen reference for the KL term.

It trains as ``train_step`` does: on the action's device (``RLHFLESS_DEVICE``) in
``model.dtype``, with the fp32 master weights of ``actions/rl/optimizer.py`` under bf16/fp16
and ``model.gradient_checkpointing``; and it publishes every weight in the training dtype, so
generate, score and train load version 0 as they load any later version. Warm-up is always full
fine-tuning, also under ``model.lora`` (its output is the adapter's backbone). Its optimizer
state is not kept: the first RL step starts AdamW afresh from version 0.
"""

from __future__ import annotations

import math
import random

import torch

from actions.contracts import ModelRef, WarmupRequest, WarmupResult
from actions.models.loading import encode, encode_prompt, load_model, store_for
from actions.models.modeling import stored_state
from actions.models.special_tokens import special_tokens
from actions.rl.recompute import enable_checkpointing
from actions.rl.sequences import pack, response_logprobs
from actions.rl.update import make_optimizer
from actions.runtime.adapter import run_action
from actions.store.weights import publish_tensors
from actions.tasks import get_task
from actions.tasks.stored import load_dataset


def run_warmup(req: WarmupRequest) -> WarmupResult:
    store = store_for(req.store_uri)
    init = ModelRef(store_uri=req.store_uri, base_key=req.base_key, policy_key=req.init_key, policy_version=0,
                    dtype=req.dtype)
    model, tokenizer, _ = load_model(init, fresh=True)
    device = next(model.parameters()).device
    rows = list(load_dataset(req.store_uri, req.dataset_key).values())
    task = get_task(req.task) if req.task is not None else None
    rng = random.Random(req.seed)
    torch.manual_seed(req.seed)
    opt = make_optimizer(model, req.warmup.lr)
    ids = special_tokens(model, tokenizer)
    model.train()
    enable_checkpointing(model, req.gradient_checkpointing)
    losses = []
    prompts: dict[int, tuple[int, ...]] = {}  # encoded once per row: 300 steps x 32 rows re-encoded cost ~0.6 s
    for _ in range(req.warmup.steps):
        batch = rng.sample(rows, min(req.warmup.batch_size, len(rows)))
        demos = [task.demonstrate(r.answer, rng, req.warmup.error_rate) if task else r.answer for r in batch]
        targets = [list(encode(tokenizer, d)) + [ids.eos_id] for d in demos]
        for r in batch:
            if r.prompt_id not in prompts:
                prompts[r.prompt_id] = encode_prompt(tokenizer, r)
        packed = pack([prompts[r.prompt_id] for r in batch], targets, ids.pad_id).to(device)
        logp = response_logprobs(model, packed)
        loss = -(logp.sum() / packed.response_mask.sum())
        opt.zero_grad()
        loss.backward()
        opt.step(max_grad_norm=math.inf)  # no clipping: a norm of inf scales the gradients by exactly 1
        losses.append(float(loss.detach()))
    published = publish_tensors(store, req.output_key, stored_state(model), {"version": 0, "source": "warmup"})
    return WarmupResult(
        policy_key=published.manifest_key,
        weights_sha256=published.weights_sha256,
        loss_first=losses[0] if losses else 0.0,
        loss_last=losses[-1] if losses else 0.0,
        num_steps=len(losses),
    )


def main(args: dict) -> dict:
    return run_action(WarmupRequest, run_warmup, args)
