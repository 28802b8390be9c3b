"""Peak memory and time of one GRPO train step per learner mode: full fine-tuning against LoRA.

One step as the train action takes it: the reference log-probs (for LoRA the same model with
the adapter off, ``lora.adapter_disabled``; for full fine-tuning a separate frozen copy only
with ``--full-reference``), then micro-batches of ``--micro-batch`` rows whose GRPO losses'
gradients accumulate (``sequences.response_logprobs``, ``grpo_loss.grpo_loss``), with
gradient checkpointing (``--no-checkpointing`` turns it off), then clipping and the AdamW step
of ``optimizer.TrainOptimizer`` (fp32 master copies under bf16 for full fine-tuning; LoRA's
adapter is fp32 and needs none). Each mode runs in a fresh child process; the figure is peak
memory per rank: ``torch.cuda.max_memory_allocated`` on CUDA, the peak resident set on the CPU.

Modes: ``full`` (every weight, 1 rank), ``full2`` (every weight, FSDP2 over 2 ranks as the train
action runs it with ``train.world_size: 2``: ``actions/rl/fsdp.py``, ranks spawned by
``actions/rl/ranks.py``, gloo on the CPU, NCCL on CUDA, each rank taking half of the micro
batches) and ``lora`` (``--r``, all-linear, 1 rank). On the CPU the peak is also given above the
process's resident set before the model is built (the interpreter and torch), which is what the
mode itself costs.

Needs only torch, transformers, peft and safetensors (plus this tree). On a GPU:

    python benchmarks/bench_learner_memory.py --device cuda --dtype bfloat16 \\
        --model-config benchmarks/configs/qwen2.5-0.5b.json --modes full full2 lora
    python benchmarks/bench_learner_memory.py --device cuda --dtype bfloat16 \\
        --model-config benchmarks/configs/qwen2.5-7b.json --modes lora
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TINY = {"model_type": "qwen2", "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 1024,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True}


def _rss_bytes() -> int:
    """This process's resident set now (Linux), 0 where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def child(args: argparse.Namespace) -> None:
    """One train step of ``args.mode`` in this process (``full2``: on two spawned ranks); prints one JSON line."""
    if args.mode == "full2":
        import bench_learner_memory as this  # by name, so the ranks can import the step function

        from actions.rl.ranks import run_on_ranks

        backend = "nccl" if args.device == "cuda" else "gloo"
        print(json.dumps(run_on_ranks(this.train_step, 2, (vars(args),), backend=backend)))
        return
    print(json.dumps(train_step(0, 1, vars(args))))


def train_step(rank: int, world: int, options: dict) -> dict:
    """One GRPO step of ``options["mode"]`` on this rank; the figures of the rank with the highest peak."""
    import torch

    from actions.models.lora import adapter_disabled, attach_adapter
    from actions.models.modeling import random_model_from_config
    from actions.rl.grpo_loss import grpo_loss
    from actions.rl.optimizer import TrainOptimizer
    from actions.rl.sequences import pack, response_logprobs

    args = SimpleNamespace(**options)
    torch.set_num_threads(max(1, args.threads // world))
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = getattr(torch, args.dtype)
    base_rss = _rss_bytes()
    model = random_model_from_config(args.model_config, device, dtype)
    reference = None
    if args.mode == "lora":
        lora = SimpleNamespace(r=args.r, alpha=2.0 * args.r, dropout=0.0, target_modules="all-linear", bias="none")
        model = attach_adapter(model, lora, None)
    elif args.full_reference:
        reference = random_model_from_config(args.model_config, device, dtype)
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    scorer = model
    if world > 1:
        from actions.rl.fsdp import make_mesh, shard
        from actions.rl.sharded_update import LogprobRoot

        scorer = shard(LogprobRoot(model), make_mesh(device), dtype)
    gen = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    rows = [(torch.randint(0, V, (args.prompt_tokens,), generator=gen).tolist(),
             torch.randint(0, V, (args.tokens,), generator=gen).tolist()) for _ in range(args.rows)]
    advantages = torch.randn(args.rows, generator=gen).to(device)
    opt = TrainOptimizer(model, 1e-5)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for start in range(rank * args.micro_batch, args.rows, args.micro_batch * world):
        part = rows[start:start + args.micro_batch]
        batch = pack([p for p, _ in part], [r for _, r in part], 0).to(device)
        with torch.no_grad():
            if args.mode == "lora":
                with adapter_disabled(model):
                    ref_logp = response_logprobs(model, batch)
            elif world > 1:
                ref_logp = scorer(batch)[..., 0]
            else:
                ref_logp = response_logprobs(reference or model, batch)
        logp = scorer(batch)[..., 0] if world > 1 else response_logprobs(model, batch)
        loss, _ = grpo_loss(logp, logp.detach(), ref_logp, advantages[start:start + len(part)], batch.response_mask,
                            clip_low=0.2, clip_high=0.28, kl_coef=0.01)
        (loss * len(part) / args.rows).backward()
    opt.step(1.0)
    if device.type == "cuda":
        torch.cuda.synchronize()
    step_s = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    figures = {"mode": args.mode, "ranks": world, "peak_bytes": peak, "base_bytes": base_rss if device.type == "cpu"
               else 0, "step_s": step_s,
               "trainable": sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in opt.params),
               "params": sum(p.numel() for p in model.parameters())}
    if world > 1:  # the busiest rank's peak and time; the trainable count over every shard
        import torch.distributed as dist

        every: list = [None] * world
        dist.all_gather_object(every, figures)
        figures = max(every, key=lambda f: f["peak_bytes"])
        figures["trainable"] = sum(f["trainable"] for f in every)
        figures["step_s"] = max(f["step_s"] for f in every)
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-config", default=None, help="a Hugging Face config.json (default: a small Qwen2)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--modes", nargs="+", default=["full", "lora"], choices=["full", "full2", "lora"])
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-checkpointing", dest="checkpointing", action="store_false")
    p.add_argument("--full-reference", action="store_true",
                   help="full fine-tuning holds a separate reference copy (as the score action does)")
    p.add_argument("--child", dest="mode", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.model_config is None:
        path = Path("/tmp/rlhfless-bench-learner-config.json")
        path.write_text(json.dumps(TINY))
        args.model_config = str(path)
    if args.mode:
        return child(args)
    # glibc keeps freed heap pages in the process, so a CPU peak resident set would count memory
    # freed long before (the whole model a rank builds before sharding it, for one); a fixed mmap
    # threshold returns every large tensor's pages when it is freed, so the peak is of live memory.
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    results = {}
    for mode in args.modes:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--model-config", args.model_config, "--child", mode]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            print(f"{mode}: failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}", flush=True)
            continue
        r = results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        above = f"  (above the runtime: {(r['peak_bytes'] - r['base_bytes']) / 2**30:6.3f} GiB)" if r["base_bytes"] else ""
        print(f"{mode:5s} {r['ranks']} rank(s): peak per rank {r['peak_bytes'] / 2**30:7.3f} GiB{above}  step "
              f"{r['step_s']:7.2f} s  trainable {r['trainable'] / 1e6:9.2f} M of {r['params'] / 1e6:9.1f} M", flush=True)

    def used(mode: str) -> float:
        return results[mode]["peak_bytes"] - results[mode]["base_bytes"]

    for other in ("full2", "lora"):
        if {"full", other} <= set(results):
            f, o = results["full"], results[other]
            print(f"full/{other}: peak per rank {used('full') / used(other):.2f}x (above the runtime)  "
                  f"step {f['step_s'] / o['step_s']:.2f}x")
    print(json.dumps({"device": args.device, "dtype": args.dtype, "model_config": args.model_config,
                      "rows": args.rows, "micro_batch": args.micro_batch, "tokens": args.tokens, "results": results}))


if __name__ == "__main__":
    main()
