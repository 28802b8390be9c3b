"""Peak memory of scoring plus one training step at Qwen's vocabulary: chunked against naive.

The model is a 2-layer Qwen2 of width 256 with V = 151,936 (``rlhfless tiny-model``, random
weights, tied embeddings). Each variant runs in a fresh child process, one after the other, and
reports its peak resident set size (``ru_maxrss``: torch's allocations are invisible to
tracemalloc) and the RSS after loading the model (the baseline every variant shares):

* ``chunked``: the code the actions run: scoring through ``per_row_widths`` with the output
  head in chunks (``sequences.response_logprobs``), then one GRPO update (``update.run_updates``)
  whose log-probs go the same way, checkpointed per chunk; optionally also with
  ``--micro-batch-size`` (without it, the training step holds the transformer's activations
  of every row at once, about 36 MB per 544-token row here).
* ``naive``: the same two phases with the full-vocabulary path
  (``sequences.response_logprobs_full``: the model's ``[B, P + T, V]`` logits, an fp32
  ``[B, T, V]`` log-softmax, entropy over it), which is what scoring and training did before.

Rows are ``--prompt-tokens`` + ``--tokens`` (default 32 + 512) random token ids. The naive path
needs about 4 copies of ``rows x 512 x V x 4 bytes`` (20 GB each at 64 rows), so on a machine
shared with other work it runs at ``--naive-rows`` (default 4) rows; the chunked path runs at
that row count too (the ratio at equal work) and at ``--rows`` (default 64).

Usage: ``python benchmarks/bench_logprob_memory.py [--rows 64] [--naive-rows 4] [--threads 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VOCAB = 151_936


def _rss_gib() -> float:
    """Current resident set size of this process (``/proc/self/statm``), GiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30


def child(args: argparse.Namespace) -> None:
    """One variant in this process; prints one JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    from actions.config.workload import AlgorithmConfig
    from actions.models.modeling import instantiate, read_model_dir
    from actions.rl import update
    from actions.rl.batch import TrainBatch
    from actions.rl.optimizer import TrainOptimizer
    from actions.rl.sequences import pack, per_row_widths, response_logprobs, response_logprobs_full

    model, _ = instantiate(*read_model_dir(args.model))
    logprobs = response_logprobs_full if args.child == "naive" else response_logprobs
    update.response_logprobs = logprobs  # the update's forward takes the same path
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 500, (args.prompt_tokens,), generator=gen).tolist() for _ in range(args.rows)]
    responses = [torch.randint(0, 500, (args.tokens,), generator=gen).tolist() for _ in range(args.rows)]
    opt = TrainOptimizer(model, 1e-5)
    baseline = _rss_gib()

    t0 = time.perf_counter()
    with torch.no_grad():  # the score action: the policy's log-probs of every row
        (old,), mask = per_row_widths([lambda b: logprobs(model, b)], prompts, responses, 0)
    t_score = time.perf_counter() - t0

    # GRPO groups of 4 where the rows divide into them, else of 2 (main: the rows are even)
    algo = AlgorithmConfig(batch_size=args.rows, group_size=4 if args.rows % 4 == 0 else 2, num_minibatches=1,
                           kl_coef=0.0,
                           micro_batch_size=args.micro_batch_size)
    packed = pack(prompts, responses, 0)
    rewards = torch.tensor([float(i % 2) for i in range(args.rows)])
    batch = TrainBatch(packed, old[:, :packed.response_width] * packed.response_mask, None, rewards, None,
                       ["length"] * args.rows, prompts, responses, 0)
    model.train()
    t0 = time.perf_counter()
    update.run_updates(model, opt, batch, algo, None, None, seed=0, step=0)
    t_train = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux -> GiB
    print(json.dumps({"variant": args.child, "rows": args.rows, "micro_batch_size": args.micro_batch_size,
                      "peak_gib": peak, "baseline_gib": baseline, "score_s": t_score, "train_s": t_train}))


def run_child(model_dir: Path, variant: str, rows: int, args: argparse.Namespace,
              micro: int | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, "--model", str(model_dir), "--rows", str(rows),
           "--tokens", str(args.tokens), "--prompt-tokens", str(args.prompt_tokens), "--threads", str(args.threads)]
    if micro:
        cmd += ["--micro-batch-size", str(micro)]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        return {"variant": variant, "rows": rows, "micro_batch_size": micro, "error": out.stderr.strip()[-300:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--naive-rows", type=int, default=4)
    p.add_argument("--tokens", type=int, default=512, help="response tokens per row")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--micro-batch-size", type=int, default=None,
                   help="algorithm.micro_batch_size of a child; in the parent: also run the chunked path at "
                        "--rows with it (e.g. 16: training activations of 16 rows at a time)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", choices=("chunked", "naive"), help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    for flag, rows in (("--rows", args.rows), ("--naive-rows", args.naive_rows)):
        if rows < 2 or rows % 2:
            p.error(f"{flag} {rows}: pass an even number of at least 2 (the training step takes GRPO groups of 2 or 4)")
    if args.child:
        return child(args)
    from flows.commands.tiny_model_dir import write_tiny_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "qwen2"
        write_tiny_model_dir(model_dir, "qwen2", vocab_size=VOCAB, hidden_size=256, num_layers=2, num_heads=4,
                             num_kv_heads=2, max_positions=1024, seed=0)
        print(f"V={VOCAB}, 2 layers x width 256, rows of {args.prompt_tokens}+{args.tokens} tokens, "
              f"{args.threads} threads; peak RSS of scoring + one GRPO training step, one process per variant")
        print(f"{'variant':<10} {'rows':>5} {'micro':>6} {'peak GiB':>9} {'base GiB':>9} {'score s':>8} {'train s':>8}",
              flush=True)
        plan = [("naive", args.naive_rows, None), ("chunked", args.naive_rows, None), ("chunked", args.rows, None)]
        if args.micro_batch_size:
            plan.append(("chunked", args.rows, args.micro_batch_size))
        runs = []
        for variant, rows, micro in plan:
            r = run_child(model_dir, variant, rows, args, micro)
            runs.append(r)
            if "error" in r:
                print(f"{variant:<10} {rows:>5} {str(micro or '-'):>6} failed: {r['error']}", flush=True)
                continue
            print(f"{variant:<10} {rows:>5} {str(micro or '-'):>6} {r['peak_gib']:>9.2f} "
                  f"{r['baseline_gib']:>9.2f} {r['score_s']:>8.1f} {r['train_s']:>8.1f}", flush=True)
    naive, small, full = runs[:3]
    if not any("error" in r for r in runs):
        base = small["baseline_gib"]
        print(f"at {args.naive_rows} rows: naive / chunked peak = {naive['peak_gib'] / small['peak_gib']:.1f}x "
              f"(above the model baseline: {(naive['peak_gib'] - base) / max(small['peak_gib'] - base, 1e-9):.1f}x)")
        per_row = (naive["peak_gib"] - naive["baseline_gib"]) / args.naive_rows
        print(f"naive at {args.rows} rows, extrapolated linearly: ~{naive['baseline_gib'] + per_row * args.rows:.0f} GiB; "
              f"chunked measured: {full['peak_gib']:.2f} GiB; target < 3 GB: "
              f"{'met' if full['peak_gib'] * 2**30 < 3e9 else 'NOT met'}")


if __name__ == "__main__":
    main()
