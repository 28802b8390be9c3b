"""torch engine vs vLLM engine: start-up time and generated tokens per second.

Workload: the tiny Llama with head_dim 64 (hidden 128, 2 heads, 2 layers; the smallest head
the vLLM CPU attention accepts), saved to a temporary directory; 16 prompts of the repeat task
x n = 8 samples, 32 new tokens, temperature 1. Both engines run in this process on one
thread (vLLM's CPU backend binds this process to one OpenMP thread per core it is given, and
actions run with RLHFLESS_THREADS=1). Figures are medians of 3 runs:

* start: model directory -> engine ready (torch: ``from_pretrained`` + engine; vLLM: the
  ``LLM`` constructor, after ``import vllm``, whose time is printed apart); the first start
  in the process (what a cold action pays) is printed too;
* tokens/s: generated tokens (EOS excluded) / wall time of one ``generate`` call. vLLM's
  prefix cache is reset before each run so that it does not reuse the previous run's prompts.

It also prints how many samples are token-for-token equal across the engines (same sampling
rule; only kernel round-off can differ). The vLLM half is skipped, with a message, where vLLM
is not importable: run it in the ``make test-vllm`` environment:

    .venv-vllm/bin/python benchmarks/bench_engines.py
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.vllm_engine import vllm_available
from actions.models.loading import encode
from actions.models.modeling import build_tiny_model
from actions.tasks.repeat import make_rows

N, PROMPTS, NEW_TOKENS, REPEATS = 8, 16, 32, 3


def _save_model(root: Path) -> tuple[list[SampleSpec], int]:
    model, tok = build_tiny_model(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256,
                                  max_positions=512, seed=0)
    model.save_pretrained(root, safe_serialization=True)
    tok.save_pretrained(root)
    rows = make_rows(PROMPTS, max_count=14, seed=5)
    return [SampleSpec(r.prompt_id, i, encode(tok, r.prompt)) for r in rows for i in range(N)], tok.eos_token_id


def _start_torch(root: Path, eos: int):
    from transformers import AutoModelForCausalLM

    from actions.engines.torch_engine import TorchEngine

    model = AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32).eval()
    return TorchEngine(model, eos_id=eos, pad_id=0)


def _start_vllm(root: Path, eos: int):
    from actions.engines.vllm_engine import VllmEngine

    return VllmEngine(root, eos_id=eos, max_model_len=512)


def _measure(name: str, start, root: Path, eos: int, specs: list[SampleSpec], before_run=None):
    starts = []
    for i in range(REPEATS):
        t0 = time.perf_counter()
        engine = start(root, eos)
        starts.append(time.perf_counter() - t0)
        if i < REPEATS - 1 and hasattr(engine, "shutdown"):
            engine.shutdown()
    rates, outs = [], None
    for step in range(REPEATS):
        if before_run:
            before_run(engine)
        t0 = time.perf_counter()
        params = GenerationParams(seed=0, step=step, max_new_tokens=NEW_TOKENS, temperature=1.0)
        outs, _ = engine.generate(specs, params)
        rates.append(sum(len(o.tokens) for o in outs) / (time.perf_counter() - t0))
    # The last run again at step 0, for the cross-engine comparison.
    if before_run:
        before_run(engine)
    outs, _ = engine.generate(specs, GenerationParams(seed=0, step=0, max_new_tokens=NEW_TOKENS, temperature=1.0))
    start_s, rate = statistics.median(starts), statistics.median(rates)
    print(f"{name:5s}: start {start_s:6.2f} s (median of {REPEATS}; first in process {starts[0]:.2f} s), "
          f"{rate:8.0f} generated tokens/s (median of {REPEATS}; {sum(len(o.tokens) for o in outs)} tokens per run)")
    if hasattr(engine, "shutdown"):
        engine.shutdown()
    return start_s, rate, outs


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        specs, eos = _save_model(root)
        print(f"{PROMPTS} prompts x n={N}, ~{len(specs[0].prompt_tokens)} prompt tokens, "
              f"{NEW_TOKENS} new tokens, head_dim 64, 1 thread")
        t_start, t_rate, t_outs = _measure("torch", _start_torch, root, eos, specs)
        if not vllm_available():
            print("vllm : skipped, vLLM is not importable here; run this script with .venv-vllm/bin/python "
                  "(built by `make test-vllm`)")
            return 0
        t0 = time.perf_counter()
        import vllm  # noqa: F401  (import time reported apart from engine start)

        print(f"vllm : import {time.perf_counter() - t0:.2f} s")
        v_start, v_rate, v_outs = _measure("vllm", _start_vllm, root, eos, specs,
                                           before_run=lambda e: e.llm.reset_prefix_cache())
        same = sum(a.tokens == b.tokens for a, b in zip(t_outs, v_outs))
        print(f"ratio vllm/torch: tokens/s {v_rate / t_rate:.2f}x, start {v_start / t_start:.1f}x; "
              f"identical samples {same}/{len(specs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
