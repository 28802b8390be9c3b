"""Counter-based draws: fused into one compiled kernel, unfused on the logits' device, or with
the noise built on the host.

The torch engine draws each token as ``argmax(logits / T + G(key, t))`` with ``G`` a
``[rows, V]`` tensor of counter-based Gumbel noise (``actions/engines/sampling.py``). At a real
vocabulary (Qwen2.5: V = 151,936) the draw is the largest thing a decode step computes besides
the model. Three ways to draw the same tokens, side by side in one process:

* ``fused``: hash, noise and argmax in one compiled kernel (``generation.fused_sampling``; the
  engine's default for vocabularies of 8,192 entries or more);
* ``unfused``: the same arithmetic as about twenty tensor operations on the logits' device,
  each a pass over ``[rows, V]`` temporaries (``fused_sampling: off``);
* ``host`` (``--variants`` must name it; on the CPU it is ``unfused``): the noise computed on
  the host and copied to the device, as a sampler that builds its noise on the CPU does.

Per batch it prints:

* ``draw``: one draw alone (``sample_next`` at temperature 1), milliseconds, medians of
  ``--repeats``, and whether every variant drew the same tokens;
* ``decode``: the torch engine's milliseconds per decode step, the difference of two
  ``generate`` calls of ``--steps`` and 1 new tokens over ``steps - 1`` (prefill and set-up
  cancel), and how many rows drew the same tokens as ``unfused``.

Ratios are against ``unfused``. The model is randomly initialised from a Hugging Face config
(no download), no token is EOS:

    python3 benchmarks/bench_sampling_noise.py --device cuda --variants fused,unfused,host
    .venv/bin/python benchmarks/bench_sampling_noise.py --batches 8 --steps 4      # CPU, same config
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from bench_engine_throughput import timed
from json_lines import emit  # siblings: a script's own directory is on sys.path

from actions.engines import sampling
from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.torch_engine import TorchEngine
from actions.models.modeling import random_model_from_config

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "qwen2.5-0.5b.json"
VARIANTS = ("fused", "unfused", "host")

_device_noise = sampling._noise


def host_noise(keys: torch.Tensor, positions: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
    """The noise computed on the host and copied to the keys' device (``host``)."""
    return _device_noise(keys.cpu(), positions.cpu(), term.cpu()).to(keys.device)


@contextmanager
def noise_on_host():
    """Every unfused draw inside builds its noise on the host (``_noisy_argmax`` reads the
    module global)."""
    sampling._noise = host_noise
    try:
        yield
    finally:
        sampling._noise = _device_noise


def draw_alone(batch: int, vocab: int, device: torch.device, variants: list[str], repeats: int) -> dict:
    gen = torch.Generator().manual_seed(batch)
    logits = torch.randn(batch, vocab, generator=gen).to(device)
    keys = torch.tensor([sampling.stream_key(0, 0, p, 0) for p in range(batch)], device=device)
    positions = torch.full((batch,), 17, dtype=torch.int64, device=device)
    out: dict = {}
    drawn = {}
    for name in variants:
        def draw(fused: bool = name == "fused"):
            return sampling.sample_next(logits, keys, positions, 1.0, fused=fused)
        with noise_on_host() if name == "host" else nullcontext():
            drawn[name] = draw()  # warm-up (kernels, allocator; compiles the fused draw)
            out[f"{name}_ms"] = round(1e3 * statistics.median(timed(draw, device) for _ in range(repeats)), 3)
    _ratios(out, variants, "_ms")
    out["same_tokens"] = all(torch.equal(drawn[n], drawn[variants[0]]) for n in variants)
    return out


def decode_step(model: torch.nn.Module, batch: int, variants: list[str], steps: int, repeats: int,
                device: torch.device) -> dict:
    """Milliseconds per decode step of each variant, and its rows equal to ``unfused``'s."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(batch)
    prompts = torch.randint(3, vocab, (batch, 32), generator=gen)
    specs = [SampleSpec(p, 0, tuple(prompts[p].tolist())) for p in range(batch)]
    out: dict = {}
    tokens = {}
    for name in variants:
        # no EOS: every row decodes every step
        engine = TorchEngine(model, eos_id=-1, pad_id=0, fused_sampling="on" if name == "fused" else "off")

        def call(n: int):
            return engine.generate(specs, GenerationParams(seed=0, step=0, max_new_tokens=n, temperature=1.0))[0]

        with noise_on_host() if name == "host" else nullcontext():
            tokens[name] = [o.tokens for o in call(steps)]  # warm-up (graph captures), and the tokens
            long = [timed(lambda: call(steps), device) for _ in range(repeats)]
            short = [timed(lambda: call(1), device) for _ in range(repeats)]
        out[f"{name}_ms"] = round(1e3 * (statistics.median(long) - statistics.median(short)) / (steps - 1), 3)
    _ratios(out, variants, "_ms")
    base = tokens.get("unfused", tokens[variants[0]])
    for name in variants:
        out[f"{name}_rows_equal"] = f"{sum(a == b for a, b in zip(tokens[name], base))}/{batch}"
    return out


def _ratios(out: dict, variants: list[str], suffix: str) -> None:
    """``unfused / variant`` time for every other variant (above 1: the variant is faster)."""
    if "unfused" in variants and out["unfused" + suffix] > 0:
        for name in variants:
            if name != "unfused" and out[name + suffix] > 0:
                out[f"speedup_{name}"] = round(out["unfused" + suffix] / out[name + suffix], 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--model-config", default=str(DEFAULT_CONFIG), help="a Hugging Face config.json")
    ap.add_argument("--batches", default="8,64", help="decode batch sizes (rows)")
    ap.add_argument("--steps", type=int, default=16, help="new tokens of the long call (>= 2)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="fused,unfused", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--skip-decode", action="store_true", help="time the draw alone")
    ap.add_argument("--json", default=None, help="also append every JSON line printed to this file")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in VARIANTS for v in variants):
        ap.error(f"--variants {args.variants!r}: name some of {', '.join(VARIANTS)}")
    if args.steps < 2:
        ap.error(f"--steps {args.steps}: need at least 2 (the step is the difference of two calls)")
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    model = random_model_from_config(args.model_config, device, dtype, source="--model-config")
    vocab = model.config.vocab_size
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = {"device": f"{device} ({name})", "dtype": str(dtype), "vocab": vocab, "torch": torch.__version__,
              "threads": torch.get_num_threads(),
              "params_b": round(sum(p.numel() for p in model.parameters()) / 1e9, 3), "by_batch": {}}
    head = {k: v for k, v in result.items() if k != "by_batch"}
    with torch.no_grad():
        for batch in (int(b) for b in args.batches.split(",")):
            row = result["by_batch"][batch] = {"draw": draw_alone(batch, vocab, device, variants, args.repeats)}
            emit({"bench": "sampling_draw", **head, "batch": batch, **row["draw"]}, args.json)
            if not args.skip_decode:
                row["decode"] = decode_step(model, batch, variants, args.steps, args.repeats, device)
                emit({"bench": "sampling_decode", **head, "batch": batch, **row["decode"]}, args.json)
    result["fused_error"] = sampling.fused_draw.error  # set where the compiler failed and draws ran unfused
    emit({"bench": "sampling", **result}, args.json)


if __name__ == "__main__":
    main()
