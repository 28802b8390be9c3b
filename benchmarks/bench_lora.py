"""LoRA against full fine-tuning on a real model shape: what a version moves, loads and holds.

A randomly initialised model of ``--model-config`` (default: the Qwen2.5-0.5B shape) in
``--dtype``, LoRA ``r=--r`` on every linear layer (``all-linear``). Four figures, each printed
side by side with its full fine-tuning baseline and the ratio:

1. **bytes published per policy version** (``publish_tensors`` into a local store): full
   fine-tuning changes every tensor, LoRA publishes the adapter alone (fp32).
2. **warm load per version** (bytes read from the store and wall time, median of
   ``--repeats``): full: the version's tensors and a model built from them; LoRA: the adapter
   read and the model built over the backbone the container already holds
   (``loading._build_lora``'s steps).
3. **scoring peak memory**: policy log-probs alone (the baseline) against LoRA's policy plus
   reference log-probs (the adapter switched off: ``lora.adapter_disabled``), and full
   fine-tuning's policy plus a separate reference copy. Each variant runs in a fresh child
   process; the figure is the peak resident set (CPU, ``ru_maxrss``) or
   ``torch.cuda.max_memory_allocated`` (CUDA).
4. **decode step time**, the adapter unmerged (what the actions run) against merged into a
   private copy of the weights (``merge_and_unload``), median of ``--repeats`` runs of
   ``--decode-steps`` greedy steps at ``--batch`` rows.

Needs only torch, transformers, peft and safetensors (plus this tree).
Usage: ``python benchmarks/bench_lora.py [--model-config benchmarks/configs/qwen2.5-0.5b.json]
[--device cpu|cuda] [--dtype float32|bfloat16] [--r 16]``
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _setup(args: argparse.Namespace):
    import torch

    from actions.models.lora import attach_adapter
    from actions.models.modeling import random_model_from_config

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    model = random_model_from_config(args.model_config, device, dtype)
    lora = SimpleNamespace(r=args.r, alpha=2.0 * args.r, dropout=0.0, target_modules="all-linear", bias="none")
    return torch, model, lora, attach_adapter


def _sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def bytes_and_loads(args: argparse.Namespace) -> dict:
    """Figures 1 and 2."""
    torch, model, lora, attach_adapter = _setup(args)
    from actions.models.lora import adapter_tensors
    from actions.models.modeling import BaseParts, build_model
    from actions.store import LocalStore, read_manifest
    from actions.store.weights import load_tensors, publish_tensors

    full_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    base = BaseParts(model.config, None, None)
    peft_model = attach_adapter(build_model(base, full_state, share=True).to(args.device), lora, None)
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1e-3)
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalStore(tmp)
        full = publish_tensors(store, "full/manifest.json", full_state)
        adapter = publish_tensors(store, "lora/manifest.json", adapter_tensors(peft_model))
        out = {"published_bytes": {"full": full.stats.bytes_uploaded, "lora": adapter.stats.bytes_uploaded}}

        def read_bytes(key: str) -> int:
            return sum(e["size"] for e in read_manifest(store, key)["files"].values())

        def load_full() -> None:
            tensors, _ = load_tensors(store, full.manifest_key)
            build_model(base, tensors, dtype=getattr(torch, args.dtype)).to(args.device)  # as the actions build it
            _sync(torch, args.device)

        def load_lora() -> None:  # the backbone (full_state) is what the warm container holds
            tensors, _ = load_tensors(store, adapter.manifest_key)
            attach_adapter(build_model(base, full_state, share=True).to(args.device), lora, tensors)
            _sync(torch, args.device)

        out["load_bytes"] = {"full": read_bytes(full.manifest_key), "lora": read_bytes(adapter.manifest_key)}
        out["load_s"] = {name: _median(fn, args.repeats) for name, fn in (("full", load_full), ("lora", load_lora))}
    return out


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def decode(args: argparse.Namespace) -> dict:
    """Figure 4: greedy decode steps with the adapter unmerged and merged."""
    torch, model, lora, attach_adapter = _setup(args)
    from peft import PeftModel  # noqa: F401  (merge_and_unload lives on the PEFT wrapper)
    from transformers import DynamicCache

    from actions.models.cache_name import with_cache

    peft_model = attach_adapter(model, lora, None)
    prompt = torch.randint(0, model.config.vocab_size - 1, (args.batch, 16), device=args.device)

    @torch.no_grad()
    def run(m) -> None:
        cache = DynamicCache()
        out = m(input_ids=prompt, **with_cache(cache), use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        for _ in range(args.decode_steps):
            out = m(input_ids=tok, **with_cache(cache), use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
        _sync(torch, args.device)

    unmerged = _median(lambda: run(peft_model), args.repeats)
    merged_model = _merged_copy(peft_model)
    merged = _median(lambda: run(merged_model), args.repeats)
    return {"decode_s": {"unmerged": unmerged, "merged": merged}, "decode_steps": args.decode_steps,
            "batch": args.batch}


def _merged_copy(model):
    """A private merged model: the shared backbone stays as it is for the other versions."""
    import copy

    from peft.tuners.tuners_utils import BaseTunerLayer

    merged = copy.deepcopy(model)
    for m in merged.modules():
        if isinstance(m, BaseTunerLayer):
            m.merge()
    return merged


def score_child(args: argparse.Namespace) -> None:
    """One scoring variant (``args.variant``) in this process; prints one JSON line."""
    torch, model, lora, attach_adapter = _setup(args)
    from actions.models.lora import adapter_disabled
    from actions.rl.sequences import pack, response_logprobs

    gen = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    prompts = [torch.randint(0, V, (32,), generator=gen).tolist() for _ in range(args.batch)]
    responses = [torch.randint(0, V, (args.tokens,), generator=gen).tolist() for _ in range(args.batch)]
    batch = pack(prompts, responses, 0)
    batch = batch.to(torch.device(args.device))
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        if args.variant == "policy":
            response_logprobs(model, batch)
        elif args.variant == "lora":
            peft_model = attach_adapter(model, lora, None)
            response_logprobs(peft_model, batch)
            with adapter_disabled(peft_model):
                response_logprobs(peft_model, batch)
        else:  # full fine-tuning: the policy and a separate copy for the reference
            import copy

            reference = copy.deepcopy(model)
            response_logprobs(model, batch)
            response_logprobs(reference, batch)
    _sync(torch, args.device)
    peak = (torch.cuda.max_memory_allocated() if args.device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    print(json.dumps({"variant": args.variant, "peak_bytes": peak}))


def scoring(args: argparse.Namespace) -> dict:
    """Figure 3: each variant in a fresh process."""
    peaks = {}
    for variant in ("policy", "lora", "full_plus_reference"):
        cmd = [sys.executable, __file__, "--child-score", variant, *sys.argv[1:]]
        line = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        peaks[variant] = json.loads(line)["peak_bytes"]
    return {"score_peak_bytes": peaks}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-config", default=str(ROOT / "benchmarks/configs/qwen2.5-0.5b.json"))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64, help="response tokens per scored row")
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--skip", nargs="*", default=[], choices=["bytes", "scoring", "decode"])
    p.add_argument("--child-score", dest="variant", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.variant:
        return score_child(args)
    import torch

    torch.manual_seed(0)
    res: dict = {"model_config": args.model_config, "device": args.device, "dtype": args.dtype, "r": args.r}
    if "bytes" not in args.skip:
        res.update(bytes_and_loads(args))
        b, lb, ls = res["published_bytes"], res["load_bytes"], res["load_s"]
        print(f"published per version: full {b['full'] / 2**20:9.1f} MiB  lora {b['lora'] / 2**20:7.2f} MiB  "
              f"full/lora {b['full'] / b['lora']:6.1f}x", flush=True)
        print(f"warm load per version: full {lb['full'] / 2**20:9.1f} MiB {ls['full']:6.3f} s  lora "
              f"{lb['lora'] / 2**20:7.2f} MiB {ls['lora']:6.3f} s  time full/lora {ls['full'] / ls['lora']:5.1f}x",
              flush=True)
    if "scoring" not in args.skip:
        res.update(scoring(args))
        s = res["score_peak_bytes"]
        print(f"scoring peak: policy alone {s['policy'] / 2**30:6.3f} GiB  lora policy+reference "
              f"{s['lora'] / 2**30:6.3f} GiB ({s['lora'] / s['policy']:.3f}x)  full policy+reference copy "
              f"{s['full_plus_reference'] / 2**30:6.3f} GiB ({s['full_plus_reference'] / s['policy']:.3f}x)", flush=True)
    if "decode" not in args.skip:
        res.update(decode(args))
        d = res["decode_s"]
        print(f"decode {args.decode_steps} steps x {args.batch} rows: unmerged {d['unmerged']:.3f} s  merged "
              f"{d['merged']:.3f} s  unmerged/merged {d['unmerged'] / d['merged']:.3f}x", flush=True)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
