"""Measuring the vLLM engine's decode speed and weight push on this machine, in the grid form
of ``actions/engines/profiling.py`` (the torch engine's), so the planner reads both alike.

The running engine of the process (``factory.load_engine``) is measured as it will generate:
one request per row, the rows of a batch sharing one random prompt, every row running to the
token budget (``ignore_eos``). A decode step is the difference between generating ``2 + steps``
and 2 tokens, divided by ``steps``: prefill and the call's fixed cost cancel out (more steps
where noise made it zero or negative: ``decode_timing.step_seconds``). vLLM's paged
KV drops a finished request without copying the cache, so the row-drop terms are 0.

The push is timed as a new policy version reaches the engine (``VllmEngine.load_policy``:
scratch file, reload in every worker, prefix-cache reset), with the same weights: its size,
not its values, sets the time.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Mapping
from typing import Any

from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.decode_timing import step_seconds


def decode_step_seconds(engine: Any, batch: int, context: int, vocab: int, repeats: int = 3,
                        steps: int = 8) -> float:
    """Median seconds of one decode step for ``batch`` rows at about ``context`` tokens; always
    positive (``decode_timing.step_seconds``).

    The prompt is ``context`` tokens, or fewer where ``context + 2 + steps`` would not fit the
    engine's ``max_model_len`` (the grid's longest context is the campaign's longest prompt plus
    a full response, which may fill the model's context): the step measured is then the one
    ``2 + steps`` tokens before the end, within a handful of tokens of ``context``.

    Raises:
        RuntimeError: a row stopped before its token budget (the step time would be bogus).
    """
    prompt_len = max(1, min(context, engine.max_model_len - (2 + steps)))
    rng = random.Random(batch * 100_003 + context)
    prompt = tuple(rng.randrange(3, vocab) for _ in range(prompt_len))
    specs = [SampleSpec(0, i, prompt) for i in range(batch)]

    def run(new_tokens: int) -> float:
        t0 = time.perf_counter()
        outs, _ = engine.generate(specs, GenerationParams(seed=0, step=0, max_new_tokens=new_tokens, temperature=1.0),
                                  ignore_eos=True)
        seconds = time.perf_counter() - t0
        short = [len(o.tokens) for o in outs if len(o.tokens) != new_tokens]
        if short:  # the difference of two runs is a decode step only if every row decoded every token
            raise RuntimeError(f"profiling at context {prompt_len}: rows returned {short} tokens of {new_tokens}")
        return seconds

    run(2)  # the first call at a shape pays its scheduling and allocation set-up
    # more steps where noise made the difference zero or negative, as far as the context allows
    return step_seconds(run, steps, repeats, max_steps=engine.max_model_len - prompt_len - 2)


def prefill_tokens_per_s(engine: Any, vocab: int, batch: int = 16, length: int = 64, repeats: int = 3) -> float:
    """Prompt tokens per second of ``batch`` distinct prompts of ``length`` tokens, one token
    generated each, the prefix cache not read (every prompt token computed)."""
    length = max(1, min(length, engine.max_model_len - 1))  # a prompt that fills the context is refused
    rng = random.Random(batch * 7 + length)
    specs = [SampleSpec(i, 0, tuple(rng.randrange(3, vocab) for _ in range(length))) for i in range(batch)]

    def run() -> float:
        t0 = time.perf_counter()
        engine.generate(specs, GenerationParams(seed=0, step=0, max_new_tokens=1, temperature=1.0, dedup=False),
                        ignore_eos=True)
        return time.perf_counter() - t0

    run()
    return batch * length / statistics.median(run() for _ in range(repeats))


def push_seconds(engine: Any, tensors: Mapping[str, Any], version: int, repeats: int = 3) -> float:
    """Median seconds to push ``tensors`` into the running engine as policy ``version``."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine.load_policy(tensors, version)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_grid(engine: Any, vocab: int, batch_sizes: list[int], contexts: list[int], *,
                 prefill_shape: tuple[int, int] = (16, 64), name: str = "measured-vllm",
                 push: tuple[Mapping[str, Any], int] | None = None) -> dict:
    """The profile as a dict in ``TpotProfile.to_dict`` form, plus ``weight_push_s`` (the
    median push of ``push`` = (tensors, version), 0 without it)."""
    seconds = [[decode_step_seconds(engine, b, c, vocab) for c in contexts] for b in batch_sizes]
    return {"batch_sizes": batch_sizes, "contexts": [float(c) for c in contexts], "seconds": seconds,
            "prefill_tokens_per_s": prefill_tokens_per_s(engine, vocab, *prefill_shape), "name": name,
            "shrink_s": 0.0, "shrink_s_per_kv_token": 0.0,
            "weight_push_s": push_seconds(engine, *push) if push is not None else 0.0}
