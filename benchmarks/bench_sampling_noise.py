"""Counter-based sampling noise built on the logits' device against noise built on the host.

The torch engine draws each token as ``argmax(logits / T + G(key, t))`` with ``G`` a
``[rows, V]`` tensor of counter-based Gumbel noise (``actions/engines/sampling.py``). At a real
vocabulary (Qwen2.5: V = 151,936) that tensor is the largest thing a decode step builds besides
the logits. Built on the host and copied, it sets the pace of a GPU; built where the logits are,
it costs a few element-wise kernels. This benchmark measures both, side by side, in one process:

* ``noise``: one step's noise alone at each batch, device-built against host-built + copied
  (milliseconds, medians of ``--repeats``);
* ``decode``: the torch engine's seconds per decode step, as the difference of two ``generate``
  calls of ``--steps`` and 1 new tokens (prefill and set-up cancel), with the engine's own noise
  against the same engine whose ``gumbel_noise`` builds on the host and copies to the device.
  Also reported: whether the two runs drew the same tokens (device noise may differ from host
  noise in the last float32 bit, ``tests/test_sampling_device.py``).

On the CPU host and device are the same place and the two columns measure the same code.
The model is randomly initialised from a Hugging Face config (no download):

    python3 benchmarks/bench_sampling_noise.py --device cuda --model-config benchmarks/configs/qwen2.5-0.5b.json
    .venv/bin/python benchmarks/bench_sampling_noise.py --batches 8 --steps 4      # CPU, same config
"""

from __future__ import annotations

import argparse
import json
import statistics
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from bench_engine_throughput import timed

from actions.engines import sampling
from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.torch_engine import TorchEngine
from actions.models.modeling import random_model_from_config

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "qwen2.5-0.5b.json"


_device_noise = sampling.gumbel_noise


def host_noise(keys: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``gumbel_noise`` computed on the host and copied to the keys' device (the baseline)."""
    return _device_noise(keys.cpu(), positions.cpu(), vocab_size).to(keys.device)


@contextmanager
def noise_on_host():
    """Every draw inside builds its noise on the host (``sample_next`` reads the module global)."""
    sampling.gumbel_noise = host_noise
    try:
        yield
    finally:
        sampling.gumbel_noise = _device_noise


def noise_alone(batch: int, vocab: int, device: torch.device, repeats: int) -> dict:
    keys = torch.tensor([sampling.stream_key(0, 0, p, 0) for p in range(batch)], device=device)
    positions = torch.full((batch,), 17, dtype=torch.int64, device=device)
    out = {}
    for name, fn in (("device_ms", _device_noise), ("host_ms", host_noise)):
        fn(keys, positions, vocab)  # warm-up (kernels, allocator)
        out[name] = round(1e3 * statistics.median(timed(lambda f=fn: f(keys, positions, vocab), device)
                                                  for _ in range(repeats)), 3)
    return out


def decode_step(engine: TorchEngine, batch: int, vocab: int, steps: int, repeats: int,
                device: torch.device) -> dict:
    """Seconds per decode step, device noise against host noise, and whether the tokens agree."""
    gen = torch.Generator().manual_seed(batch)
    prompts = torch.randint(3, vocab, (batch, 32), generator=gen)
    specs = [SampleSpec(p, 0, tuple(prompts[p].tolist())) for p in range(batch)]

    def call(n: int):
        return engine.generate(specs, GenerationParams(seed=0, step=0, max_new_tokens=n, temperature=1.0))[0]

    out: dict = {}
    tokens = {}
    for name in ("device", "host"):
        with noise_on_host() if name == "host" else nullcontext():
            tokens[name] = [o.tokens for o in call(steps)]  # warm-up, and the tokens drawn
            long = [timed(lambda: call(steps), device) for _ in range(repeats)]
            short = [timed(lambda: call(1), device) for _ in range(repeats)]
        per_step = (statistics.median(long) - statistics.median(short)) / (steps - 1)
        out[f"{name}_ms_per_step"] = round(1e3 * per_step, 3)
        out[f"{name}_steps_per_s"] = round(1.0 / per_step, 1) if per_step > 0 else None
    out["speedup"] = round(out["host_ms_per_step"] / out["device_ms_per_step"], 2)
    same = sum(a == b for a, b in zip(tokens["device"], tokens["host"]))
    out["rows_equal"] = f"{same}/{batch}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--model-config", default=str(DEFAULT_CONFIG), help="a Hugging Face config.json")
    ap.add_argument("--batches", default="8,64", help="decode batch sizes (rows)")
    ap.add_argument("--steps", type=int, default=16, help="new tokens of the long call (>= 2)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    model = random_model_from_config(args.model_config, device, dtype, source="--model-config")
    vocab = model.config.vocab_size
    engine = TorchEngine(model, eos_id=-1, pad_id=0)  # no EOS: every row decodes every step
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = {"device": f"{device} ({name})", "dtype": str(dtype), "vocab": vocab,
              "params_b": round(sum(p.numel() for p in model.parameters()) / 1e9, 3), "by_batch": {}}
    with torch.no_grad():
        for batch in (int(b) for b in args.batches.split(",")):
            result["by_batch"][batch] = {"noise": noise_alone(batch, vocab, device, args.repeats),
                                         "decode": decode_step(engine, batch, vocab, args.steps, args.repeats,
                                                               device)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
