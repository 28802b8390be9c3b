"""Measuring the torch engine's time per output token (TPOT) on this machine.

Runs dummy decode steps of the configured model for a grid of batch sizes and context lengths
and returns the grid the planner's ``TpotProfile`` takes. Prefill throughput is measured with
one padded batch. Timings are medians over a few repeats (these machines are noisy).
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import DynamicCache


@torch.no_grad()
def decode_step_seconds(model: torch.nn.Module, batch: int, context: int, vocab: int, repeats: int = 5) -> float:
    """Median wall time of one cached decode step for ``batch`` rows at ``context`` tokens."""
    ids = torch.randint(3, vocab, (batch, context))
    out = model(input_ids=ids, use_cache=True)
    cache: DynamicCache = out.past_key_values
    tok = torch.randint(3, vocab, (batch, 1))
    times = []
    for i in range(repeats + 1):
        layers = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
        c = DynamicCache(ddp_cache_data=layers)
        pos = torch.full((batch, 1), context, dtype=torch.long)
        t0 = time.perf_counter()
        model(input_ids=tok, past_key_values=c, position_ids=pos, use_cache=True)
        if i:  # the first run warms up allocator and kernels
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.no_grad()
def prefill_tokens_per_s(model: torch.nn.Module, vocab: int, batch: int = 16, length: int = 64) -> float:
    ids = torch.randint(3, vocab, (batch, length))
    model(input_ids=ids)
    t0 = time.perf_counter()
    model(input_ids=ids)
    return batch * length / (time.perf_counter() - t0)


def measure_grid(model: torch.nn.Module, vocab: int, batch_sizes: list[int], contexts: list[int]) -> dict:
    """The profile as a dict in ``TpotProfile.to_dict`` form (seconds per decode step)."""
    seconds = [[decode_step_seconds(model, b, c, vocab) for c in contexts] for b in batch_sizes]
    return {"batch_sizes": batch_sizes, "contexts": [float(c) for c in contexts], "seconds": seconds,
            "prefill_tokens_per_s": prefill_tokens_per_s(model, vocab), "name": "measured-torch-cpu"}
