"""A speculative-decoding workload on a randomly initialised model of a real shape (any device).

Used by ``bench_speculation.py --model-config``. A random model is not a policy anyone trains:
its next-token distribution is nearly flat, so no draft would ever be accepted. A policy
trained on a narrow task is confident instead. ``sharpen`` scales the logits (through the final
norm's weight, which multiplies them exactly: the LM head is linear without bias) until the
mean top-token probability over probe positions is ``confidence``; the drafts' acceptance then
follows from that one stated number rather than from a trained model we cannot ship.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from actions.engines.base import SampleSpec
from actions.engines.torch_engine import TorchEngine
from actions.models.cache_name import with_cache
from actions.models.device import sync
from actions.models.modeling import random_model_from_config


def _final_norm(model: torch.nn.Module) -> torch.nn.Parameter:
    inner = getattr(model, "model", None)
    norm = getattr(inner, "norm", None)
    if norm is None or getattr(norm, "weight", None) is None:
        raise ValueError(f"{type(model).__name__}: no model.norm.weight to scale; use a Llama/Qwen2-style config")
    return norm.weight


@torch.no_grad()
def sharpen(model: torch.nn.Module, probe: torch.Tensor, confidence: float) -> tuple[float, float]:
    """Scale ``model``'s logits in place so the mean top-token probability over every position
    of ``probe`` ([B, T] token ids) is ``confidence`` (bisection on the scale; tempered softmax
    at temperature 1). Returns (scale, mean top-token probability reached)."""
    logits = model(input_ids=probe).logits.float().flatten(0, 1)  # [B*T, V]

    def top(scale: float) -> float:
        return torch.softmax(logits * scale, dim=-1).max(dim=-1).values.mean().item()

    lo, hi = 1.0, 2.0
    while top(hi) < confidence and hi < 1e6:
        lo, hi = hi, hi * 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if top(mid) < confidence else (lo, mid)
    scale = (lo + hi) / 2
    norm = _final_norm(model)
    norm.mul_(scale)
    return scale, top(scale)


def build(config_json: str, device: torch.device, dtype: torch.dtype, *, confidence: float, calls: int,
          group: int, per_call: int, prompt_len: int = 32) -> dict:
    """The confident and the untouched random engines, and ``calls`` batches of ``per_call``
    random prompts x ``group`` samples (prompt ids 0..calls*per_call-1)."""
    model = random_model_from_config(config_json, device, dtype, source="--model-config")
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (calls * per_call, prompt_len), generator=gen)
    random_model = copy.deepcopy(model)
    scale, reached = sharpen(model, prompts[:per_call].to(device), confidence)
    batches = [[SampleSpec(p, i, tuple(prompts[p].tolist())) for p in range(c * per_call, (c + 1) * per_call)
                for i in range(group)] for c in range(calls)]
    # eos -1: no token ends a sample, so every row decodes the same number of tokens on and off
    return {"confident": TorchEngine(model, eos_id=-1, pad_id=0),
            "random": TorchEngine(random_model, eos_id=-1, pad_id=0),
            "batches": batches, "logit_scale": round(scale, 3), "confidence": round(reached, 3)}


@torch.no_grad()
def width_costs(model: torch.nn.Module, batches: tuple[int, ...], widths: tuple[int, ...], context: int,
                repeats: int = 5) -> dict[str, dict[str, float]]:
    """Milliseconds of one cached forward of ``width`` new tokens per row at ``batch`` rows after
    ``context`` cached tokens (median of ``repeats``), and its ratio to width 1: what a
    verification round costs against a plain decode step."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    out: dict[str, dict[str, float]] = {}
    for b in batches:
        ids = torch.randint(3, vocab, (b, context), device=device)
        cache = DynamicCache()
        model(input_ids=ids, **with_cache(cache), use_cache=True)
        row: dict[str, float] = {}
        for w in widths:
            new = torch.randint(3, vocab, (b, w), device=device)
            pos = torch.arange(context, context + w, device=device).expand(b, w)
            times = []
            for _ in range(repeats + 1):  # the first is a warm-up
                sync(device)
                t0 = time.perf_counter()
                model(input_ids=new, **with_cache(cache), position_ids=pos, use_cache=True)
                sync(device)
                times.append(time.perf_counter() - t0)
                for layer in cache.layers:  # back to ``context`` columns (as the engine's rollback)
                    layer.keys, layer.values = layer.keys[:, :, :context], layer.values[:, :, :context]
            row[f"w{w}_ms"] = round(1e3 * statistics.median(times[1:]), 2)
        for w in widths:
            row[f"w{w}_ratio"] = round(row[f"w{w}_ms"] / row[f"w{widths[0]}_ms"], 2)
        out[str(b)] = row
    return out
