"""torch engine vs Hugging Face ``generate``: decode throughput on the same batch, any device.

Workload: ``--prompts`` random prompts of ``--prompt-len`` tokens x ``--n`` samples each,
``--new-tokens`` tokens per sample, temperature 1, no EOS (every row runs to the end, so both
sides generate exactly the same number of tokens and the ratio measures the decode loop:
the engine's shared-prefix prefill and batching against ``generate``'s). Early release of
finished rows, the engine's other advantage, is not exercised here (random weights rarely
emit EOS). The model is randomly initialised from ``--model-config`` (a Hugging Face
config.json; default: the tiny Llama of the embedded campaign); nothing is downloaded.

Both sides run in this process on the same model; figures are medians of ``--repeats`` runs
after one warm-up each, printed as tokens/s and the ratio engine / generate.

    .venv/bin/python benchmarks/bench_engine_throughput.py                       # CPU, tiny model
    python3 benchmarks/bench_engine_throughput.py --device cuda --model-config CONFIG_JSON
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.torch_engine import TorchEngine
from actions.models.device import sync


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The options ``build`` reads: ``--device``, ``--dtype``, ``--model-config``."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="default bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--model-config", default=None,
                        help="a Hugging Face config.json (random weights of its shape); default a tiny Llama")


def build(args: argparse.Namespace) -> torch.nn.Module:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    if args.model_config:
        from actions.models.modeling import random_model_from_config

        return random_model_from_config(args.model_config, device, dtype, source="--model-config")
    from actions.models.modeling import build_tiny_model

    model, _ = build_tiny_model(hidden_size=96, num_layers=2, num_heads=4, intermediate_size=256,
                                max_positions=2048, seed=0)
    return model.to(device, dtype).eval()


def timed(fn, device: torch.device) -> float:
    """Seconds of ``fn()``, the device's queue drained before and after."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(parser)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    model = build(args)
    device, vocab = next(model.parameters()).device, model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (args.prompts, args.prompt_len), generator=gen)
    specs = [SampleSpec(p, i, tuple(prompts[p].tolist())) for p in range(args.prompts) for i in range(args.n)]
    engine = TorchEngine(model, eos_id=-1, pad_id=0)
    ids = prompts.repeat_interleave(args.n, dim=0).to(device)

    def run_engine() -> None:
        engine.generate(specs, GenerationParams(seed=0, step=0, max_new_tokens=args.new_tokens, temperature=1.0))

    @torch.no_grad()
    def run_hf() -> None:
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                       top_k=0, top_p=1.0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                       pad_token_id=0, eos_token_id=None)

    tokens = len(specs) * args.new_tokens
    results = {}
    for name, fn in (("engine", run_engine), ("hf_generate", run_hf)):
        timed(fn, device)  # warm-up
        results[name] = statistics.median(timed(fn, device) for _ in range(args.repeats))
    param = next(model.parameters())
    print(f"device {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), "
          f"dtype {param.dtype}, params {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B, "
          f"{args.prompts} prompts x n={args.n}, prompt {args.prompt_len}, new {args.new_tokens}")
    for name, seconds in results.items():
        print(f"  {name:12s} {seconds:8.3f} s  {tokens / seconds:10.1f} tokens/s")
    print(f"  ratio engine / generate (tokens/s): {results['hf_generate'] / results['engine']:.2f}x")


if __name__ == "__main__":
    main()
