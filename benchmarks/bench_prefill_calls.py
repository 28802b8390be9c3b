"""Prefill of deduplicated prompts of mixed lengths: one padded call, per-length-bucket calls
(``prefill_plan``), one call per distinct length; and the output head on the last column only
against every column.

Workload: ``--prompts`` unique random prompts whose lengths are drawn from three bands (short
20-60, medium 150-250, long 400-600 tokens: a chat dataset's spread), prefilled by the torch
engine's ``prefill`` (what a generate call runs once per unique prompt). Timed side by side,
alternating, median of ``--repeats``. The states are compared: every plan gives the same
last-position logits up to the round-off of another padding width (``match`` in the output:
the largest difference, relative to the logits' scale, against a tolerance per dtype).

The output-head comparison runs the model's forward on the one padded batch of all prompts
with ``logits_to_keep=1`` (what ``prefill`` passes) and without it (every column's logits, as
before), and prints both times and the logits' bytes.

Output: one JSON line for the plans (printed, and appended to ``--json``), then one for the
output head, each as soon as it is measured, so a run cut short keeps the first.

    python benchmarks/bench_prefill_calls.py                       # the default tiny model
    python benchmarks/bench_prefill_calls.py --model-config benchmarks/configs/qwen2.5-0.5b.json --layers 2
    python benchmarks/bench_prefill_calls.py --device cuda --model-config benchmarks/configs/qwen2.5-0.5b.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

import torch
from bench_engine_throughput import timed  # a sibling: a script's own directory is on sys.path
from json_lines import emit

from actions.engines.torch_engine import TorchEngine
from actions.models.modeling import build_tiny_model, random_model_from_config

BANDS = ((20, 60), (150, 250), (400, 600))


def _model(args) -> tuple[torch.nn.Module, int]:
    device = torch.device(args.device)
    if args.model_config is None:
        model, tok = build_tiny_model(hidden_size=96, num_layers=2, num_heads=4, intermediate_size=256,
                                      max_positions=1024, seed=0)
        return model.to(device).eval(), len(tok)
    config = json.loads(Path(args.model_config).read_text())
    if args.layers:  # fewer layers, the real width and vocabulary: the output head's share shows
        config["num_hidden_layers"] = args.layers
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16 if device.type == "cuda" else torch.float32
    model = random_model_from_config(f.name, device, dtype)
    return model.eval(), config["vocab_size"]


# Tolerance on the last-position logits, as a fraction of their scale (the reference row's
# largest |logit|). The plans run the same prompts through GEMMs and attention of other shapes
# (another padded width, another number of rows per call); the kernels then pick other tilings
# and split the reductions differently, so each dot product adds its terms in another order. In
# fp32 that moves a logit by round-off alone; in bf16 (8 significant bits) every layer rounds
# its sums to 2^-8 of their size, and over the 24 layers of the 0.5B shape the last logits of
# two plans differed by up to 0.059 at a scale of 2.8 (2%) on the CPU. A real fault (a wrong
# mask, position or cache column) moves them by the order of the scale itself.
RTOL = {torch.float32: 1e-3, torch.float64: 1e-6}
RTOL_HALF = 5e-2  # bf16, fp16


def match(states: dict, dtype: torch.dtype) -> dict:
    """Per plan against ``one call``: the largest |difference| of the last-position logits, the
    same relative to the logits' scale, the tolerance, and whether every prompt is within it."""
    rtol = RTOL.get(dtype, RTOL_HALF)
    ref, out = states["one call"], {}
    for name, got in states.items():
        if name == "one call":
            continue
        worst_abs = worst_rel = 0.0
        for a, b in zip(ref, got):
            x, y = a.last_logits.float(), b.last_logits.float()
            diff = (x - y).abs().max().item()
            scale = max(x.abs().max().item(), 1e-6)
            worst_abs, worst_rel = max(worst_abs, diff), max(worst_rel, diff / scale)
        out[name] = {"max_abs_diff": round(worst_abs, 6), "max_rel_diff": round(worst_rel, 6), "rtol": rtol,
                     "within": worst_rel <= rtol}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--model-config", default=None, help="a Hugging Face config.json (random weights)")
    ap.add_argument("--layers", type=int, default=0, help="with --model-config: keep this many layers")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="with --model-config: default bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--prompts", type=int, default=12, help="unique prompts (one per GRPO group)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="also append the figures to this file (JSON lines)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, vocab = _model(args)
    device = next(model.parameters()).device
    rng = random.Random(0)
    seqs = []
    for p in range(args.prompts):
        lo, hi = BANDS[p % len(BANDS)]
        seqs.append(tuple(rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))))
    engine = TorchEngine(model, eos_id=-1, pad_id=0)
    plans = {"one call": float("inf"), "buckets": engine.prefill_call_tokens, "per length": 0.0}
    times: dict[str, list[float]] = {k: [] for k in plans}
    calls, states = {}, {}
    with torch.no_grad():
        engine.prefill(seqs[:2])  # warm-up
        for _ in range(args.repeats):
            for name, price in plans.items():
                engine.prefill_call_tokens = price
                before = engine.prefill_calls
                times[name].append(timed(lambda: states.__setitem__(name, engine.prefill(seqs)[0]), device))
                calls[name] = engine.prefill_calls - before
    real = sum(len(s) for s in seqs)
    padded = {"one call": len(seqs) * max(map(len, seqs)), "per length": real}
    base = statistics.median(times["one call"])
    dtype = next(model.parameters()).dtype
    result = {"bench": "prefill", "device": str(device), "dtype": str(dtype),
              "model": args.model_config or "tiny default (hidden 96, 2 layers)",
              "layers": args.layers or None, "prompts": len(seqs), "real_tokens": real,
              "padded_tokens_one_call": padded["one call"], "call_tokens_price": plans["buckets"]}
    for name in plans:
        med = statistics.median(times[name])
        result[name] = {"calls": calls[name], "median_s": round(med, 4), "speedup_vs_one_call": round(base / med, 2)}
    result["match"] = match(states, dtype)
    emit(result, args.json)
    # the output head: every column's logits against the last column's, on the one padded batch
    width = max(map(len, seqs))
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(seqs):
        ids[r, width - len(s):], mask[r, width - len(s):] = torch.tensor(s), 1
    ids, mask = ids.to(device), mask.to(device)
    head: dict[str, list[float]] = {"all columns": [], "last column": []}
    with torch.no_grad():
        for _ in range(args.repeats):
            for name, keep in (("all columns", 0), ("last column", 1)):
                head[name].append(timed(lambda: model(input_ids=ids, attention_mask=mask, use_cache=True,
                                                      logits_to_keep=keep), device))
    all_s, last_s = statistics.median(head["all columns"]), statistics.median(head["last column"])
    emit({"bench": "prefill_output_head", "device": str(device), "dtype": str(dtype), "model": result["model"],
          "all_columns_s": round(all_s, 4), "last_column_s": round(last_s, 4), "speedup": round(all_s / last_s, 2),
          "all_columns_logits_MiB": round(len(seqs) * width * vocab * 4 / 2**20, 1)}, args.json)


if __name__ == "__main__":
    main()
