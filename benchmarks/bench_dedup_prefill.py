"""Deduplicated prefill vs naive per-sample prefill on a prompt-heavy GRPO workload.

Workload: 16 prompts of ~400 tokens sharing a long instruction template, n = 8 samples each,
24 new tokens, the tiny default model on one CPU thread. Both paths run in this process, side
by side and alternating, and produce identical samples (asserted). Prints the prefill-token
reduction (target >= n x 0.95 = 7.6x) and the generation wall-clock speed-up (target >= 1.3x),
as medians over repeats. Prompts whose text coincides (two prompt ids drawing the same k and
letter) are deduplicated too, which can push the token ratio slightly above n.

Each figure is printed with its target and "met" or "NOT MET"; a missed target exits 0 (the
speed-up depends on what else the machine runs), a changed sample fails the assertion.

Run: .venv/bin/python benchmarks/bench_dedup_prefill.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from actions.engines.base import GenerationParams
from actions.engines.torch_engine import SampleSpec, TorchEngine
from actions.models.modeling import build_tiny_model
from actions.tasks.repeat import make_rows

N, PROMPTS, REPEATS = 8, 16, 5
TEMPLATE = "read the whole instruction carefully before you answer. " * 6


def _met(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    torch.set_num_threads(1)
    model, tok = build_tiny_model(hidden_size=96, num_layers=2, num_heads=4, intermediate_size=256,
                                  max_positions=1024, seed=0)
    model.eval()
    engine = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    rows = make_rows(PROMPTS, max_count=14, seed=5)
    specs = [SampleSpec(r.prompt_id, i, tuple(tok(TEMPLATE + r.prompt)["input_ids"])) for r in rows for i in range(N)]
    kw = dict(seed=0, step=0, max_new_tokens=24, temperature=1.0)
    times: dict[bool, list[float]] = {True: [], False: []}
    outs, stats = {}, {}
    for _ in range(REPEATS):
        for dedup in (False, True):
            t0 = time.perf_counter()
            outs[dedup], stats[dedup] = engine.generate(specs, GenerationParams(dedup=dedup, **kw))
            times[dedup].append(time.perf_counter() - t0)
    assert [o.tokens for o in outs[True]] == [o.tokens for o in outs[False]], "dedup changed the samples"
    token_ratio = stats[False].prefill_tokens / stats[True].prefill_tokens
    speedup = statistics.median(times[False]) / statistics.median(times[True])
    print(f"prompt length ~{len(specs[0].prompt_tokens)} tokens, {PROMPTS} prompts x n={N}")
    print(f"prefill tokens: naive {stats[False].prefill_tokens}, dedup {stats[True].prefill_tokens}, "
          f"ratio {token_ratio:.2f}x (target >= {N * 0.95:.2f}x: {_met(token_ratio >= N * 0.95)})")
    print(f"generation wall clock (median of {REPEATS}): naive {statistics.median(times[False]):.3f} s, "
          f"dedup {statistics.median(times[True]):.3f} s, speed-up {speedup:.2f}x "
          f"(target >= 1.3x: {_met(speedup >= 1.3)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
