"""RLHFless against TRL's GRPOTrainer on the same work, side by side on this machine.

Both systems train the same tiny Qwen2 folder (``rlhfless tiny-model``) with GRPO on the same
prompts (the repeat task's training rows, written to a JSON Lines file both read, no chat
template) and the same reward function (``repeat``, TRL's signature), one optimizer step per
batch (RLHFless ``algorithm.num_minibatches=1``; TRL's defaults), the same learning rate,
temperature 1, no KL term (TRL's default ``beta=0``; RLHFless ``kl_coef=0``). RLHFless runs its
default configuration otherwise (local warm pool, CLI ``rlhfless train``); TRL its defaults.

Each run is a fresh process timed from the outside: RLHFless by the timestamps of its progress
lines, TRL by a callback at each optimizer step's end. Steady state is the median step interval
after the first step (and before RLHFless's last, which also evaluates). Runs alternate
(RLHFless, TRL, RLHFless, TRL, ...) and ratios are taken pair by pair.

TRL is a benchmark-only dependency: ``pip install -e '.[bench]'`` (``make bench`` does it).

    python benchmarks/bench_vs_trl.py --size small --pairs 2 --steps 6
    python benchmarks/bench_vs_trl.py --size large --pairs 2 --steps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"small": (16, 4, 32), "large": (32, 8, 128)}  # prompts x samples x new tokens
LR = 4e-4


def write_inputs(work: Path) -> tuple[Path, Path]:
    """The tiny Qwen2 folder and the prompts file (prompt, answer) both systems read, plus
    ``eval.jsonl`` (8 of them) for RLHFless's evaluations before and after, outside the timing."""
    sys.path.insert(0, str(ROOT))
    from actions.tasks.build import _split
    from flows.commands.tiny_model_dir import write_tiny_model_dir
    from flows.config import load_config

    model = work / "qwen2"
    write_tiny_model_dir(model, "qwen2")
    rows, _ = _split(load_config(None, ["data.num_train_prompts=256"]), "train", frozenset())
    data = work / "prompts.jsonl"
    lines = [json.dumps({"prompt": r.prompt, "answer": r.answer}) + "\n" for r in rows]
    data.write_text("".join(lines))
    (work / "eval.jsonl").write_text("".join(lines[:8]))
    return model, data


def run_rlhfless(work: Path, model: Path, data: Path, size: tuple[int, int, int], steps: int, tag: str) -> dict:
    prompts, samples, tokens = size
    out = work / f"rlhfless-{tag}"
    cmd = [sys.executable, "-m", "flows.commands.cli", "train", "--out", str(out), "--steps", str(steps),
           *[a for kv in (f"model.path={model}", f"data.train_path={data}", f"data.eval_path={data.with_name('eval.jsonl')}",
                          "data.chat_template=false", "warmup.steps=0",
                          f"algorithm.batch_size={prompts * samples}", f"algorithm.group_size={samples}",
                          "algorithm.num_minibatches=1", "algorithm.kl_coef=0", f"algorithm.lr={LR}",
                          f"generation.max_new_tokens={tokens}", "eval_every=0", f"store.uri={out}/store")
             for a in ("--set", kv)]]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marks = [time.time() - t0 for line in proc.stdout if "] step " in line]  # type: ignore[union-attr]
    if proc.wait() != 0:
        raise RuntimeError(f"rlhfless run failed; see {out}")
    summary = json.loads((out / "summary.json").read_text())
    gaps = [b - a for a, b in zip(marks, marks[1:])][:-1]  # the last step also evaluates
    lengths = [s["response_length/mean"] for s in summary["steps"]][1:-1]
    return {"first_step_s": marks[0], "steps": gaps, "mean_length": statistics.mean(lengths),
            "overhead_s": statistics.median(s["timing_s/overhead"] for s in summary["steps"][1:])}


def run_trl_child(model: str, data: str, prompts: int, samples: int, tokens: int, steps: int, out: str) -> None:
    """In a fresh process: TRL's GRPOTrainer on the same inputs; prints one JSON line."""
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(ROOT))
    from actions.tasks.rewards import load_reward

    repeat = load_reward("repeat")
    ds = datasets.load_dataset("json", data_files=data, split="train")
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            marks.append(time.time())

    args = GRPOConfig(output_dir=out, per_device_train_batch_size=prompts * samples, num_generations=samples,
                      max_completion_length=tokens, max_steps=steps, learning_rate=LR, logging_steps=1,
                      report_to="none", save_strategy="no", use_cpu=True, temperature=1.0, seed=0)
    t0 = time.time()
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, answer, **kw: repeat(completions, answer=answer),
                          args=args, train_dataset=ds, callbacks=[Clock()])
    trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    print(json.dumps({"first_step_s": marks[0] - t0, "steps": [b - a for a, b in zip(marks, marks[1:])],
                      "mean_length": statistics.mean(lengths[1:] or lengths)}))


def run_trl(work: Path, model: Path, data: Path, size: tuple[int, int, int], steps: int, tag: str) -> dict:
    cmd = [sys.executable, __file__, "--trl-child", str(model), str(data), *map(str, size), str(steps),
           str(work / f"trl-{tag}")]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"TRL run failed: {out.stderr[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--trl-child":
        m, d, p, s, t, n, o = sys.argv[2:]
        run_trl_child(m, d, int(p), int(s), int(t), int(n), o)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    size = SIZES[args.size]
    work = Path(tempfile.mkdtemp(prefix="bench-vs-trl-"))
    model, data = write_inputs(work)
    completions = size[0] * size[1]
    rows = []
    for i in range(args.pairs):
        ours = run_rlhfless(work, model, data, size, args.steps, str(i))
        theirs = run_trl(work, model, data, size, args.steps, str(i))
        o, t = statistics.median(ours["steps"]), statistics.median(theirs["steps"])
        row = {"pair": i, "rlhfless_s_per_step": o, "trl_s_per_step": t,
               "rlhfless_completions_per_s": completions / o, "trl_completions_per_s": completions / t,
               "rlhfless_tokens_per_s": completions * ours["mean_length"] / o,
               "trl_tokens_per_s": completions * theirs["mean_length"] / t,
               "completions_ratio": t / o, "rlhfless_overhead_s": ours["overhead_s"],
               "rlhfless_first_step_s": ours["first_step_s"], "trl_first_step_s": theirs["first_step_s"]}
        rows.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    print(json.dumps({"size": args.size, "prompts_x_samples_x_tokens": size,
                      "median_completions_ratio": statistics.median(r["completions_ratio"] for r in rows)}))


if __name__ == "__main__":
    main()
