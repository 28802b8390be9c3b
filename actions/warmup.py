"""warmup action: a short supervised phase so RL starts from a non-trivial policy.

Trains the initial weights on demonstrations (teacher forcing, loss on answer tokens and EOS):
a synthetic task's imperfect demonstrator, or a user dataset's reference answers verbatim, and publishes the result, which becomes policy version 0 and the frozen
reference for the KL term.
"""

from __future__ import annotations

import random

import torch

from actions.contracts import WarmupRequest, WarmupResult
from actions.models.loading import encode, load_base, store_for
from actions.models.modeling import instantiate
from actions.models.special_tokens import special_tokens
from actions.rl.sequences import pack, response_logprobs
from actions.runtime.adapter import run_action
from actions.store.weights import load_tensors, publish_tensors
from actions.tasks import get_task
from actions.tasks.stored import load_dataset


def run_warmup(req: WarmupRequest) -> WarmupResult:
    store = store_for(req.store_uri)
    tensors, _ = load_tensors(store, req.init_key)
    model, tokenizer = instantiate(load_base(req.store_uri, req.base_key), tensors)
    rows = list(load_dataset(req.store_uri, req.dataset_key).values())
    task = get_task(req.task) if req.task is not None else None
    rng = random.Random(req.seed)
    torch.manual_seed(req.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=req.warmup.lr, weight_decay=0.0)
    ids = special_tokens(model, tokenizer)
    model.train()
    losses = []
    for _ in range(req.warmup.steps):
        batch = rng.sample(rows, min(req.warmup.batch_size, len(rows)))
        demos = [task.demonstrate(r.answer, rng, req.warmup.error_rate) if task else r.answer for r in batch]
        targets = [list(encode(tokenizer, d)) + [ids.eos_id] for d in demos]
        packed = pack([encode(tokenizer, r.prompt) for r in batch], targets, ids.pad_id)
        logp = response_logprobs(model, packed)
        loss = -(logp.sum() / packed.response_mask.sum())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    published = publish_tensors(store, req.output_key, model.state_dict(), {"version": 0, "source": "warmup"})
    return WarmupResult(
        policy_key=published.manifest_key,
        weights_sha256=published.weights_sha256,
        loss_first=losses[0] if losses else 0.0,
        loss_last=losses[-1] if losses else 0.0,
        num_steps=len(losses),
    )


def main(args: dict) -> dict:
    return run_action(WarmupRequest, run_warmup, args)
