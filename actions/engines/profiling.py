"""Measuring the torch engine's time per output token (TPOT) on this machine.

Runs the torch engine itself (forward, sampling, cache bookkeeping) on dummy prompts for a grid
of batch sizes and context lengths and returns the grid the planner's ``TpotProfile`` takes. Prefill throughput is measured with
one padded batch. Timings are medians over a few repeats (these machines are noisy).
"""

from __future__ import annotations

import statistics
import time

import torch

from actions.engines.torch_engine import SampleSpec, TorchEngine


@torch.no_grad()
def decode_step_seconds(model: torch.nn.Module, batch: int, context: int, vocab: int, repeats: int = 3,
                        steps: int = 8) -> float:
    """Median wall time of one decode step of the torch engine (forward, sampling and cache
    bookkeeping) for ``batch`` rows at about ``context`` tokens: the difference between
    generating ``2 + steps`` and 2 tokens, divided by ``steps``, so prefill cancels out."""
    engine = TorchEngine(model, eos_id=-1, pad_id=0)  # no token is EOS: every row runs on
    gen = torch.Generator().manual_seed(batch * 100_003 + context)
    specs = [SampleSpec(i, 0, tuple(torch.randint(3, vocab, (context,), generator=gen).tolist()))
             for i in range(batch)]

    def run(new_tokens: int) -> float:
        t0 = time.perf_counter()
        engine.generate(specs, seed=0, step=0, max_new_tokens=new_tokens, temperature=1.0)
        return time.perf_counter() - t0

    run(2)  # warms up allocator and kernels
    return statistics.median((run(2 + steps) - run(2)) / steps for _ in range(repeats))


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
