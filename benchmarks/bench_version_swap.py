"""What a new policy version costs the generation engine: copied in place into the warm model
(the generation slot, ``actions/engines/torch_slot.py``) against a model built afresh.

A warm container's decode runtime -- its static KV buffers and the CUDA graphs (or compiled
steps) captured over them -- is keyed by the model's parameter addresses
(``static_decode.runtime_for``). The slot copies each version into the same parameters
(``in_place.copy_version``), so the next call replays what the last one captured; a model
built afresh for the version gets a new runtime and captures again. Per version this prints,
for both ways: the time to get the version in (copy, or build), the first call's time, its
captures and their seconds, and what the in-place copy saves.

One model shape (``--model-config``, random weights on ``--device``; default a tiny Llama),
``--batch`` rows of ``--context`` random prompt tokens, ``--new-tokens`` each (no token is EOS,
so every call runs the same shapes); ``--versions`` versions after the first, each the
previous weights plus noise. ``--compile`` runs the step through ``torch.compile`` (a fresh
model's runtime reuses the compiled code of the same shapes from torch's caches, but captures
its graphs again). On the CPU there are no graphs: what a version saves there is the build and
a first call's set-up, which is what the run shows.

    python3 benchmarks/bench_version_swap.py --device cuda --model-config benchmarks/configs/qwen2.5-0.5b.json
    .venv/bin/python benchmarks/bench_version_swap.py --batch 8 --context 32     # CPU, tiny model
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from bench_decode_roofline import grouped_prompts  # the same rows as the decode benchmark
from bench_engine_throughput import add_model_args, build, timed  # the same model set-up and device-synced timer

from actions.engines.base import GenerationParams
from actions.engines.torch_engine import TorchEngine
from actions.models.device import sync
from actions.models.in_place import copy_version, version_targets


def noisy(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """A next version: every tensor of ``model`` plus small seeded noise (on its device)."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        return {k: v + 1e-3 * torch.randn(v.shape, generator=g, device=v.device, dtype=v.dtype)
                for k, v in model.state_dict().items()}


def main() -> None:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    add_model_args(p)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--versions", type=int, default=2, help="versions after the first (each timed both ways)")
    p.add_argument("--compile", action="store_true", help="the decode step through torch.compile")
    p.add_argument("--json", default=None, help="also append the figures to this file (one JSON line)")
    args = p.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    device = torch.device(args.device)
    opts = {"eos_id": -1, "pad_id": 0, "compile_decode": args.compile}
    t0 = time.perf_counter()
    warm = build(args).eval()
    sync(device)
    build_s = time.perf_counter() - t0
    specs, _ = grouped_prompts(warm.config.vocab_size, args.batch, args.context, group=8)
    params = GenerationParams(seed=0, step=0, max_new_tokens=args.new_tokens, temperature=1.0)

    def call(engine: TorchEngine) -> tuple[float, int, float, list]:
        out: list = []
        seconds = timed(lambda: out.extend(engine.generate(specs, params)), device)
        stats = out[1]
        return seconds, stats.graph_captures, stats.graph_capture_s, [o.tokens for o in out[0]]

    engine = TorchEngine(warm, **opts)
    first = call(engine)
    rows = []
    print(f"{args.device} {next(warm.parameters()).dtype} batch={len(specs)} context={args.context} "
          f"new={args.new_tokens} graphs={engine.graphs} compiled={engine.compiled} build {build_s:.2f} s")
    print(f"version 0 (first call of the container): {first[0]:.3f} s, {first[1]} captures in {first[2]:.3f} s")
    for v in range(1, args.versions + 1):
        tensors = noisy(warm, v)
        t0 = time.perf_counter()
        copy_version(version_targets(warm), tensors)
        sync(device)
        copy_s = time.perf_counter() - t0
        in_place = call(engine)
        t0 = time.perf_counter()
        fresh_model = build(args).eval()
        copy_version(version_targets(fresh_model), tensors)
        sync(device)
        fresh_build_s = time.perf_counter() - t0
        fresh = call(TorchEngine(fresh_model, **opts))
        same = in_place[3] == fresh[3]
        del fresh_model
        saved = fresh_build_s + fresh[0] - copy_s - in_place[0]
        rows.append({"version": v, "copy_s": copy_s, "call_s": in_place[0], "captures": in_place[1],
                     "capture_s": in_place[2], "fresh_build_s": fresh_build_s, "fresh_call_s": fresh[0],
                     "fresh_captures": fresh[1], "fresh_capture_s": fresh[2], "saved_s": saved, "same_tokens": same})
        print(f"version {v}: in place: copy {copy_s:.3f} s + call {in_place[0]:.3f} s ({in_place[1]} captures, "
              f"{in_place[2]:.3f} s) | afresh: build {fresh_build_s:.3f} s + call {fresh[0]:.3f} s "
              f"({fresh[1]} captures, {fresh[2]:.3f} s) | saved {saved:.3f} s | same tokens: {same}")
    if rows:
        print(f"median saved per version: {statistics.median(r['saved_s'] for r in rows):.3f} s")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"bench": "version_swap", "device": args.device, "model_config": args.model_config, "batch": len(specs),
                                "context": args.context, "new_tokens": args.new_tokens, "compiled": args.compile,
                                "first_call": first[:3], "versions": rows}) + "\n")


if __name__ == "__main__":
    main()
