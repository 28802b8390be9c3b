"""Where a decode step's time goes: kernels by kind, per step, from the torch profiler.

``step_profile(fn, steps, device)`` profiles ``fn(1)`` and ``fn(1 + steps)`` (one engine call
each: prefill plus 0 or ``steps`` decode steps) and divides the difference by ``steps``, the
way ``bench_decode_roofline.step_ms`` times a step, so prefill and call set-up cancel. On a GPU
it counts device kernels (inside CUDA graphs too, where the profiler's CUPTI traces graph
nodes); on the CPU, operators' self time. The kinds say what a step's device time is spent on
against the roofline: GEMMs (their achieved GB/s over the bytes of the weights they read tells
their efficiency), attention, norms and reductions, copies and indexing, other elementwise kernels,
and Triton kernels (a compiled step's fused ones).
"""

from __future__ import annotations

import re
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from actions.models.device import sync

KINDS = (
    # before gemm: cutlass FMHA kernels; "flex": flex attention's Triton templates (flex_decoding)
    ("attention", r"flash|fmha|attention|sdpa|scaled_dot_product|flex"),
    ("gemm", r"gemm|gemv|cutlass|nvjet|xmma|cublas|aten::(mm|addmm|bmm|linear|matmul)$"),
    ("triton", r"^triton"),
    ("norm/reduce", r"reduce|norm|rsqrt|softmax|aten::(mean|sum|pow|max|argmax|amax)$"),
    ("copy/index", r"copy|memcpy|memset|index|scatter|gather|fill|cat"
                   r"|aten::(to|_to_copy|clone|contiguous|repeat|where)$"),
)
"""Kernel (or operator) name pattern per kind, first match wins; the rest is ``elementwise``."""


VIEWS = frozenset(f"aten::{n}" for n in ("as_strided", "slice", "view", "t", "transpose", "unsqueeze",
                                         "squeeze", "expand", "select", "reshape", "_reshape_alias",
                                         "_unsafe_view", "narrow", "permute", "alias", "unflatten", "flatten"))
"""CPU operators that make a view and launch nothing."""


def kind_of(name: str) -> str:
    return next((k for k, pat in KINDS if re.search(pat, name, re.IGNORECASE)), "elementwise")


def _kernel_times(fn, device: torch.device) -> dict[str, tuple[float, int]]:
    """name -> (microseconds, count) of the device kernels (CPU: operators' self time) of ``fn()``."""
    gpu = device.type == "cuda"
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA] if gpu else [ProfilerActivity.CPU]) as prof:
        fn()
        sync(device)
    out: dict[str, list] = defaultdict(lambda: [0.0, 0])
    if gpu:
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                out[ev.name][0] += ev.time_range.elapsed_us()
                out[ev.name][1] += 1
    else:
        for ev in prof.key_averages():
            # views (slices, strides) are no kernels: left out, as a GPU profile has no such rows.
            # Chosen by name alone: a self time (total less children's, from two clock reads) can
            # come out at or below 0 for a thin wrapper, and a step's count must not depend on it.
            if ev.key.startswith("aten::") and ev.key not in VIEWS:
                out[ev.key][0] += ev.self_cpu_time_total
                out[ev.key][1] += ev.count
    return {k: (v[0], v[1]) for k, v in out.items()}


def step_profile(fn, steps: int, device: torch.device) -> dict:
    """Per decode step: ``kinds`` {kind: {"ms", "kernels"}}, ``total_ms``, ``kernels`` and
    ``top`` (the ten most expensive names: ms and count per step). ``fn(n)`` runs one call
    that decodes ``n`` tokens; it is called once first as a warm-up (graph capture, lazy
    set-up)."""
    fn(1 + steps)
    one, full = _kernel_times(lambda: fn(1), device), _kernel_times(lambda: fn(1 + steps), device)
    per: dict[str, tuple[float, float]] = {}
    for name in set(one) | set(full):
        us = full.get(name, (0.0, 0))[0] - one.get(name, (0.0, 0))[0]
        n = full.get(name, (0.0, 0))[1] - one.get(name, (0.0, 0))[1]
        if n > 0 or us > 0:
            per[name] = (us / 1e3 / steps, n / steps)
    kinds: dict[str, dict] = {}
    for name, (ms, n) in per.items():
        k = kinds.setdefault(kind_of(name), {"ms": 0.0, "kernels": 0.0})
        k["ms"] += ms
        k["kernels"] += n
    top = sorted(per.items(), key=lambda kv: -kv[1][0])[:10]
    return {"unit": "kernels" if device.type == "cuda" else "operators", "kinds": kinds,
            "total_ms": sum(ms for ms, _ in per.values()),
            "kernels": sum(n for _, n in per.values()),
            "top": [{"name": name[:90], "ms": ms, "count": n} for name, (ms, n) in top]}


def report(prof: dict, weight_bytes: float, roof_ms: float | None, wall_ms: float | None) -> str:
    """The profile as text lines: kinds (ms, kernels, share), GEMM GB/s, the top names."""
    unit = prof.get("unit", "kernels")
    what = "device" if unit == "kernels" else "self"
    lines = [f"  {what} time {prof['total_ms']:.3f} ms/step in {prof['kernels']:.0f} {unit}/step"
             + (f"; the step's wall time {wall_ms:.3f} ms" if wall_ms else "")
             + (f"; roofline {roof_ms:.3f} ms" if roof_ms else "")]
    for kind, v in sorted(prof["kinds"].items(), key=lambda kv: -kv[1]["ms"]):
        share = v["ms"] / prof["total_ms"] if prof["total_ms"] else 0.0
        extra = ""
        if kind == "gemm" and v["ms"] > 0:
            extra = f"  (weights at {weight_bytes / (v['ms'] / 1e3) / 1e9:.0f} GB/s)"
        lines.append(f"    {kind:12s} {v['ms']:8.3f} ms  {v['kernels']:6.1f} {unit}  {share:6.1%}{extra}")
    lines.append("  top:")
    lines += [f"    {t['ms']:8.3f} ms  x{t['count']:<5.1f} {t['name']}" for t in prof["top"]]
    return "\n".join(lines)
