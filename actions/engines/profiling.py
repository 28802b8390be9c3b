"""Measuring the torch engine's time per output token (TPOT) on this machine.

Runs the torch engine itself (forward, sampling, cache bookkeeping) on dummy prompts for a grid
of batch sizes and context lengths and returns the grid the planner's ``TpotProfile`` takes,
with the cost of dropping finished rows from the batch (``shrink_seconds``), which the decode
grid does not see: no dummy row ever stops. Both are measured on the decode path the campaign
runs (``kv_cache``: the engine's static cache, by default, or Hugging Face's ``DynamicCache``).
Every row of a dummy batch shares one random prompt, so the engine prefills it once and forks
it (as it does for a GRPO group): the prefill stays cheap even at batch 256 x 2k tokens,
while each decode step still reads every row's own KV. Prefill cancels out of the decode
figure anyway (see ``decode_step_seconds``). The engine runs with the campaign's decode
settings (CUDA graphs, a compiled step, fused draws); a warm-up call of the timed length
captures and compiles what the timed calls run before anything is timed. Timings are medians over a few repeats (these
machines are noisy); on CUDA every timed call ends with a device-to-host copy of the sampled
tokens, so the host clock sees the finished work.
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import DynamicCache

from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.decode_timing import step_seconds
from actions.engines.static_decode import compact_rows, runtime_for, static_supported
from actions.engines.torch_engine import TorchEngine
from actions.models.cache_name import cache_of, with_cache
from actions.models.device import sync


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def decode_step_seconds(model: torch.nn.Module, batch: int, context: int, vocab: int, repeats: int = 3,
                        steps: int | None = None, kv_cache: str = "static", **settings) -> float:
    """Median wall time of one decode step of the torch engine (forward, sampling and cache
    bookkeeping) on the ``kv_cache`` path for ``batch`` rows at about ``context`` tokens: the
    difference between generating ``2 + steps`` and 2 tokens, divided by ``steps``, so prefill
    cancels out; always positive (``decode_timing.step_seconds``: more steps where noise made
    it zero or negative). ``steps`` defaults to 8 on the CPU and 32 on CUDA, where a call's
    fixed cost (fork and stack the prompt KV, launch jitter) is large next to one step and
    needs more steps to average out. ``settings``: the engine's other decode settings
    (``cuda_graphs``, ``compile_decode``, ``fused_sampling``)."""
    engine = TorchEngine(model, eos_id=-1, pad_id=0, kv_cache=kv_cache, **settings)  # no EOS: every row runs on
    gen = torch.Generator().manual_seed(batch * 100_003 + context)
    prompt = tuple(torch.randint(3, vocab, (context,), generator=gen).tolist())
    specs = [SampleSpec(0, i, prompt) for i in range(batch)]  # one prompt, ``batch`` samples
    device = _device(model)
    steps = steps or (32 if device.type == "cuda" else 8)

    def run(new_tokens: int) -> float:
        sync(device)
        t0 = time.perf_counter()
        engine.generate(specs, GenerationParams(seed=0, step=0, max_new_tokens=new_tokens, temperature=1.0))
        sync(device)
        return time.perf_counter() - t0

    run(2 + steps)  # warms up allocator and kernels, and captures or compiles what the timed calls run
    positions = getattr(model.config, "max_position_embeddings", None)  # more steps must fit the model
    return step_seconds(run, steps, repeats, max_steps=positions - context - 2 if positions else None)


@torch.no_grad()
def prefill_tokens_per_s(model: torch.nn.Module, vocab: int, batch: int = 16, length: int = 64,
                         repeats: int = 3) -> float:
    """Prompt tokens per second of one padded prefill forward of ``batch`` x ``length``."""
    device = _device(model)
    ids = torch.randint(3, vocab, (batch, length)).to(device)
    model(input_ids=ids)  # warm-up

    def run() -> float:
        sync(device)
        t0 = time.perf_counter()
        model(input_ids=ids)
        sync(device)
        return time.perf_counter() - t0

    return batch * length / statistics.median(run() for _ in range(repeats))


@torch.no_grad()
def shrink_seconds(model: torch.nn.Module, batch: int, context: int, vocab: int, repeats: int = 9,
                   kv_cache: str = "static", compiled: bool = False) -> float:
    """Median wall time the torch engine spends dropping one finished row from a batch of
    ``batch`` rows at ``context`` cached tokens, as its decode loop does where rows finish.

    Static path (``kv_cache="static"`` on a model it supports): the compaction of the engine's
    own buffers and step state (``static_decode.compact_rows``, ``StaticKV.compact``), on the
    model's decode runtime. With CUDA graphs the loop compacts only when the live rows fit a
    smaller batch bucket (rows in between run idle), so this is the cost of one such event.
    Dynamic path: ``DynamicCache.batch_select_indices`` and the padding mask. ``compiled``: the
    decode runtime is the compiled step's (``generation.compile_decode``), whose buffers the
    decode grid grew."""
    if kv_cache == "static" and static_supported(model):
        return _static_shrink_seconds(model, batch, context, repeats, compiled)
    device = _device(model)
    times = []
    for r in range(repeats):
        # one row prefilled and repeated (as a GRPO group is forked): the cache has the full
        # batch x context shape without a batch x context forward and its logits; a full cache,
        # as the engine holds (a sliding-window layer of Hugging Face's own would keep fewer columns)
        ids = torch.randint(3, vocab, (1, context)).to(device)
        cache = cache_of(model(input_ids=ids, use_cache=True, logits_to_keep=1, **with_cache(DynamicCache())))
        cache.batch_repeat_interleave(batch)
        mask = torch.ones((batch, context), dtype=torch.long, device=device)
        keep = torch.tensor([i for i in range(batch) if i != r % batch], device=device)
        sync(device)
        t0 = time.perf_counter()
        cache.batch_select_indices(keep)
        mask = mask[keep]
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _static_shrink_seconds(model: torch.nn.Module, batch: int, context: int, repeats: int,
                           compiled: bool = False) -> float:
    """``shrink_seconds`` on the static path: ``batch`` rows of ``context`` columns compacted
    into ``batch - 1`` (the values do not change the copy's cost; the buffers are the ones the
    decode grid grew, so no allocation is timed where the grid covered this shape)."""
    rt = runtime_for(model, compiled)
    times = []
    with rt.lock:
        rt.ensure(batch, context + 1)
        for r in range(repeats):
            keep = [i for i in range(batch) if i != r % batch]
            sync(rt.device)
            t0 = time.perf_counter()
            compact_rows(rt, keep, batch - 1, context)
            sync(rt.device)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b x`` with a, b >= 0."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    b = max(0.0, sum((x - mx) * (y - my) for x, y in points) / var) if var > 0 else 0.0
    return max(0.0, my - b * mx), b


def measure_grid(model: torch.nn.Module, vocab: int, batch_sizes: list[int], contexts: list[int],
                 *, prefill_shape: tuple[int, int] = (16, 64), name: str | None = None,
                 kv_cache: str = "static", cuda_graphs: str = "auto", compile_decode: bool = False,
                 fused_sampling: str = "auto") -> dict:
    """The profile as a dict in ``TpotProfile.to_dict`` form (seconds per decode step), decode
    steps and batch shrinks measured on the ``kv_cache`` path (``generation.kv_cache``), steps
    with the campaign's ``cuda_graphs``, ``compile_decode`` and ``fused_sampling``."""
    settings = dict(kv_cache=kv_cache, cuda_graphs=cuda_graphs, compile_decode=compile_decode,
                    fused_sampling=fused_sampling)
    seconds = [[decode_step_seconds(model, b, c, vocab, **settings) for c in contexts] for b in batch_sizes]
    param = next(model.parameters())
    label = name or f"measured-torch-{param.device.type}-{str(param.dtype).removeprefix('torch.')}"
    # the batch-shrink cost at the grid's corners (the smallest batch above one row: a lone row
    # is never shrunk), fitted as fixed + per cached token (rows x context)
    smallest = next((b for b in batch_sizes if b > 1), batch_sizes[-1])
    shapes = [(b, c) for b in sorted({smallest, batch_sizes[-1]}) for c in (contexts[0], contexts[-1])]
    shrink_s, per_token = fit_line([(b * c, shrink_seconds(model, b, c, vocab, kv_cache=kv_cache,
                                                           compiled=compile_decode))
                                    for b, c in shapes])
    return {"batch_sizes": batch_sizes, "contexts": [float(c) for c in contexts], "seconds": seconds,
            "prefill_tokens_per_s": prefill_tokens_per_s(model, vocab, *prefill_shape), "name": label,
            "shrink_s": shrink_s, "shrink_s_per_kv_token": per_token}
