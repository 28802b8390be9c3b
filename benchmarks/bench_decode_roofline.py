"""Decode-step time of the torch engine against the device's memory roofline.

For one model shape (a Hugging Face config.json, randomly initialised on the device; nothing
is downloaded), a batch and a context, prints the milliseconds of one decode step of:

* ``graphs``: the engine on its static KV cache with the step replayed as a CUDA graph;
* ``compiled`` (``--paths`` must name it): the graph path with the step through
  ``torch.compile`` (fused kernels; they round differently, so tokens may differ in bf16);
* ``compiled-flex`` (``--paths`` must name it): the compiled graph path with ``flex``
  decode attention (``static_forward.ATTENTIONS``): a Triton kernel that skips the key/value
  blocks past the last written column, where ``compiled`` runs cuDNN's or the flash kernel
  over the whole window;
* ``static``: the same path, eager (``generation.cuda_graphs: off``);
* ``dynamic``: the engine on Hugging Face's growing ``DynamicCache`` (``kv_cache: dynamic``);
* ``hf-loop``: a plain Hugging Face eager loop (forward with ``DynamicCache``, greedy argmax);

The engine paths draw as ``generation.fused_sampling`` says (``--fused-sampling``, default
``auto``: one compiled kernel per draw at a real vocabulary; ``off`` gives the draws of the
figures measured before fusion). Beside them, the roofline: the bytes one step must read at
least -- every weight once plus every row's cached keys and values at the mean context of the
timed steps -- over the memory
bandwidth (the card's peak where the card is known, else a measured device copy; both are
printed). A decode step is ``(t(1 + S new tokens) - t(1 new token)) / S`` (medians of
``--repeats``), so prefill and call set-up cancel. Prompts are random, no token is EOS, so
every row decodes every step; rows share their prompt in groups of ``--group`` (as GRPO
samples do), which keeps prefill cheap and leaves decode reading every row's own KV.
The engine's CUDA graphs are captured in a warm-up call first (the capture time is printed);
timed calls replay them, as a warm container does. ``--profile graphs,static`` adds, per
path, the step's device time by kernel kind (GEMM, attention, norms, copies, elementwise,
Triton) from the torch profiler (``step_profile.py``): what the gap to the roofline is made of.

    python3 benchmarks/bench_decode_roofline.py --device cuda \\
        --model-config benchmarks/configs/qwen2.5-0.5b.json --batch 64 --context 512
    .venv/bin/python benchmarks/bench_decode_roofline.py        # CPU, tiny model, the same table
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch._dynamo.utils
from bench_engine_throughput import add_model_args, build, timed  # the same model set-up and device-synced timer
from step_profile import report, step_profile
from transformers import DynamicCache

from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.sampling import fused_draw, fused_for
from actions.engines.static_decode import runtime_for
from actions.engines.torch_engine import TorchEngine
from actions.models.cache_name import cache_of, with_cache
from actions.models.device import sync

ENGINE_PATHS = {
    "graphs": dict(kv_cache="static", cuda_graphs="on"),
    "compiled": dict(kv_cache="static", cuda_graphs="on", compile_decode=True),
    "compiled-flex": dict(kv_cache="static", cuda_graphs="on", compile_decode=True, decode_attention="flex"),
    "static": dict(kv_cache="static", cuda_graphs="off"),
    "dynamic": dict(kv_cache="dynamic", cuda_graphs="off"),
}
"""The engine's decode paths this benchmark times: ``TorchEngine`` settings by name."""

GRAPH_PATHS = ("graphs", "compiled", "compiled-flex")
"""The paths that replay CUDA graphs (timed on CUDA only)."""

PEAK_GBPS = {"H100": 3350.0, "H200": 4800.0, "A100": 2039.0}
"""Peak HBM bandwidth, GB/s, by a substring of the CUDA device name (SXM parts)."""


def bandwidth_gbps(device: torch.device) -> tuple[float | None, float | None]:
    """(peak GB/s of a known card or None, measured device-copy GB/s counting read + write)."""
    if device.type != "cuda":
        return None, None
    name = torch.cuda.get_device_name(device)
    peak = next((v for k, v in PEAK_GBPS.items() if k in name), None)
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t0)
    return peak, 2 * src.numel() / statistics.median(times) / 1e9


def step_bytes(model: torch.nn.Module, batch: int, context: float) -> float:
    cfg = model.config
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    elem = next(model.parameters()).element_size()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # tied weights counted once
    kv = batch * context * cfg.num_hidden_layers * 2 * kv_heads * head_dim * elem
    return weights + kv


@torch.no_grad()
def hf_loop(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int) -> None:
    """Greedy decoding by plain eager forwards with a DynamicCache (no engine)."""
    cache = DynamicCache()
    out = model(input_ids=ids, **with_cache(cache), use_cache=True)
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(new_tokens - 1):
        out = model(input_ids=tok, **with_cache(cache_of(out)), use_cache=True)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
    tok.tolist()


def compare_rows(model: torch.nn.Module, specs: list[SampleSpec], new_tokens: int, paths: list[str]) -> dict:
    """Per engine path: how many rows drew exactly the dynamic path's tokens (in bf16 the
    kernels round differently, and a near-tie can flip a draw; in fp32 all should)."""
    toks = {}
    for name in [p for p in paths if p in ENGINE_PATHS]:
        engine = TorchEngine(model, eos_id=-1, pad_id=0, **ENGINE_PATHS[name])
        params = GenerationParams(seed=1, step=0, max_new_tokens=new_tokens, temperature=1.0)
        toks[name] = [o.tokens for o in engine.generate(specs, params)[0]]
    ref = toks.get("dynamic")
    return {k: f"{sum(a == b for a, b in zip(v, ref))}/{len(v)}" for k, v in toks.items()} if ref else {}


def grouped_prompts(vocab: int, batch: int, context: int, group: int) -> tuple[list[SampleSpec], torch.Tensor]:
    """About ``batch`` rows of ``context`` random ids (3 and up) sharing their prompt in groups
    of ``group``, as GRPO samples do (seeded): the rows and the ``[groups, context]`` prompts."""
    groups = max(1, batch // group)
    prompts = torch.randint(3, vocab, (groups, context), generator=torch.Generator().manual_seed(0))
    specs = [SampleSpec(g, i, tuple(prompts[g].tolist())) for g in range(groups) for i in range(batch // groups)]
    return specs, prompts


def compilations() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far (a compiled decode step's, a
    fused draw's)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def step_ms(fn, steps: int, repeats: int, device: torch.device) -> float:
    """Median over ``repeats`` of (t(1 + steps) - t(1)) / steps, in ms."""
    fn(1 + steps)  # warm-up (and graph capture)
    return 1e3 * statistics.median((timed(lambda: fn(1 + steps), device) - timed(lambda: fn(1), device)) / steps
                                   for _ in range(repeats))


def inductor_choices() -> dict[str, bool]:
    """The compiler settings that pick a compiled step's GEMM kernels, as this process has them."""
    from torch._inductor import config

    return {"max_autotune": bool(config.max_autotune), "max_autotune_gemm": bool(config.max_autotune_gemm)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--group", type=int, default=8, help="rows sharing one prompt")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--paths", default="graphs,static,dynamic,hf-loop")
    p.add_argument("--json", default=None,
                   help="also append the figures to this file: a line per path as it is measured, then the run's")
    p.add_argument("--profile", default=None, metavar="PATHS",
                   help="also profile these paths (comma-separated): device time per step by kernel kind")
    p.add_argument("--fused-sampling", default="auto", choices=("auto", "on", "off"),
                   help="the engine paths' generation.fused_sampling (off: the draws as before fusion)")
    p.add_argument("--compare", action="store_true",
                   help="count the rows whose tokens equal the dynamic path's, per engine path")
    args = p.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    model = build(args).eval()
    device, vocab = next(model.parameters()).device, model.config.vocab_size
    specs, prompts = grouped_prompts(vocab, args.batch, args.context, args.group)
    ids = prompts.repeat_interleave(len(specs) // len(prompts), dim=0).to(device)

    def engine_fn(name: str):
        engine = TorchEngine(model, eos_id=-1, pad_id=0, fused_sampling=args.fused_sampling, **ENGINE_PATHS[name])
        return lambda n: engine.generate(specs, GenerationParams(seed=0, step=0, max_new_tokens=n, temperature=1.0))

    paths = {**{name: (lambda name=name: engine_fn(name)) for name in ENGINE_PATHS},
             "hf-loop": lambda: (lambda n: hf_loop(model, ids, n))}
    unknown = [x for x in args.paths.split(",") if x and x not in paths]
    if unknown:
        p.error(f"--paths {','.join(unknown)}: not one of {','.join(paths)}")
    wanted = [x for x in args.paths.split(",") if x and (x not in GRAPH_PATHS or device.type == "cuda")]
    peak, measured = bandwidth_gbps(device)
    gbps = peak or measured
    nbytes = step_bytes(model, len(specs), args.context + args.steps / 2)
    roof_ms = 1e3 * nbytes / (gbps * 1e9) if gbps else None
    res: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                 "dtype": str(next(model.parameters()).dtype), "model_config": args.model_config,
                 "params": sum(p.numel() for p in model.parameters()), "batch": len(specs),
                 "context": args.context, "steps": args.steps, "step_bytes": nbytes,
                 "peak_gbps": peak, "measured_copy_gbps": measured, "roofline_ms": roof_ms,
                 "fused_sampling": fused_for(args.fused_sampling, vocab), "ms": {},
                 # the compiled paths' kernel choice: TORCHINDUCTOR_MAX_AUTOTUNE(_GEMM)=1 in the
                 # environment has the compiler time candidate GEMM kernels (Triton templates
                 # against cuBLAS) per shape instead of taking cuBLAS's
                 "inductor": inductor_choices()}
    print(f"{res['device']} {res['dtype']} batch={res['batch']} context={args.context}: roofline "
          + (f"{roof_ms:.3f} ms/step" if roof_ms else "unknown (no bandwidth on the CPU)") + f"; timing {wanted}"
          + (f"; compiler {res['inductor']}" if any(x.startswith("compiled") for x in wanted) else ""), flush=True)

    def runtime_of(name: str):
        """The decode runtime an engine path runs on (None: the dynamic path and the HF loop)."""
        opts = ENGINE_PATHS.get(name, {})
        if opts.get("kv_cache") != "static":
            return None
        return runtime_for(model, opts.get("compile_decode", False), opts.get("decode_attention", "sdpa"))

    for name in wanted:
        rt0 = runtime_of(name)
        c0, s0 = (rt0.captures, rt0.capture_s) if rt0 else (0, 0.0)
        frames0 = compilations()
        res["ms"][name] = step_ms(paths[name](), args.steps, args.repeats, device)
        res.setdefault("compilations", {})[name] = compilations() - frames0
        if name in GRAPH_PATHS:
            rt1 = runtime_of(name)
            res[f"{name}_captures"] = rt1.captures - (c0 if rt1 is rt0 else 0)
            res[f"{name}_capture_s"] = rt1.capture_s - (s0 if rt1 is rt0 else 0.0)
            res[f"{name}_error"] = rt1.graph_error or (None if rt1.compiled == rt1.wants_compiled else "compile failed")
        # each path's figure as soon as it is measured: a run stopped at its time limit keeps it
        ms = res["ms"][name]
        print(f"measured {name}: {ms:.3f} ms/step" + (f"  x{ms / roof_ms:.2f} roofline" if roof_ms else ""), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"bench": "roofline_path", "partial": True, "device": res["device"],
                                    "dtype": res["dtype"], "model_config": args.model_config, "batch": len(specs),
                                    "context": args.context, "path": name, "ms": ms, "roofline_ms": roof_ms,
                                    **({"inductor": res["inductor"]} if name.startswith("compiled") else {}),
                                    **{k: v for k, v in res.items() if k.startswith(name + "_")}}) + "\n")
    res["fused_error"] = fused_draw.error  # fused draws that fell back to unfused ones, and why
    print(f"{res['device']} {res['dtype']} params={res['params'] / 1e9:.3f}B batch={res['batch']} "
          f"context={args.context} step bytes={nbytes / 1e9:.3f} GB draws "
          + ("fused" if res["fused_sampling"] and not fused_draw.error else "unfused")
          + (f" (fused failed: {fused_draw.error})" if fused_draw.error else ""))
    if gbps:
        print(f"bandwidth: {gbps:.0f} GB/s ({'card peak' if peak else 'measured copy'}); measured copy "
              f"{measured:.0f} GB/s; roofline {roof_ms:.3f} ms/step")
    for name in GRAPH_PATHS:
        if f"{name}_captures" in res:
            print(f"{name}: captures in the warm-up {res[f'{name}_captures']} in {res[f'{name}_capture_s']:.3f} s"
                  f" (torch.compile graphs made in its warm-up and timed calls: {res['compilations'][name]})"
                  + (f"; FAILED: {res[f'{name}_error']}" if res[f"{name}_error"] else ""))
    base = res["ms"].get("hf-loop")
    for name, ms in res["ms"].items():
        extra = f"  x{ms / roof_ms:.2f} roofline" if roof_ms else ""
        extra += f"  hf-loop/this {base / ms:.2f}x" if base else ""
        print(f"  {name:13s} {ms:8.3f} ms/step{extra}")
    # what the GEMMs read: every weight but an input embedding of its own (a row lookup, not a GEMM)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if embed.data_ptr() != head.data_ptr():
        weights -= embed.numel() * embed.element_size()
    for name in [x for x in (args.profile or "").split(",") if x in wanted and x != "hf-loop"]:
        try:
            res.setdefault("profile", {})[name] = prof = step_profile(paths[name](), args.steps, device)
        except Exception as exc:  # noqa: BLE001 -- a profiler failure must not lose the timings
            res.setdefault("profile", {})[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(f"profile of {name} failed: {res['profile'][name]['error']}")
            continue
        print(f"profile of {name}:")
        print(report(prof, weights, roof_ms, res["ms"].get(name)))
    if args.compare:
        res["equal_rows_vs_dynamic"] = compare_rows(model, specs, args.steps + 1, wanted)
        print("rows equal to the dynamic path's:", res["equal_rows_vs_dynamic"])
    if args.json:
        with open(args.json, "a") as f:  # one JSON line per run, besides the per-path lines above
            f.write(json.dumps({"bench": "roofline", **res}) + "\n")


if __name__ == "__main__":
    main()
