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

TRL is a benchmark-only dependency: ``pip install -e '.[bench]'`` (``make bench`` does it);
where it is not importable the benchmark prints that it is skipped and exits 0 (3 with
``--device cuda``: a GPU check that names this part has not got its figure).

    python benchmarks/bench_vs_trl.py --size small --pairs 2 --steps 6
    python benchmarks/bench_vs_trl.py --size large --pairs 2 --steps 5

**A real model shape on a GPU.** ``--model-config`` (a Hugging Face ``config.json``, e.g.
``benchmarks/configs/qwen2.5-0.5b.json``) writes a model folder of that shape with random
weights instead (the same built-in BPE tokenizer; the embedding keeps the config's rows), and
``--device cuda`` runs both systems there: RLHFless's actions with ``RLHFLESS_DEVICE=cuda`` on
the local warm pool, TRL with its default Hugging Face generation, both in bf16. A random model
almost never draws its stop token out of 151,936, so every sample would run to the limit;
the model is made context-free (``make_context_free``) and the stop token's row shifted until
the expected completion length after the benchmark's own prompts is ``--mean-length`` tokens
(measured along sampled paths, ``stop_trace``), so lengths vary as a trained model's do (a
geometric spread within every group), and the reward is
``length_reward.py``'s (the task reward is 0 for a random model). Before either system runs,
16 prompts are sampled once more in the systems' dtype (bf16 on a GPU; ``sampled_length`` in the
calibration line), and a pair whose completions average under a tenth or over twice
``--mean-length`` on either side is printed and then refused (``shaped_model.length_problem``):
either way the benchmark exits 4, since a step that generates next to nothing, or runs every
completion to the limit, measures something else. ``--size gpu`` is 64 prompts x
8 samples, up to 256 new tokens:

    python benchmarks/bench_vs_trl.py --size gpu --device cuda --model-config benchmarks/configs/qwen2.5-0.5b.json \
        --pairs 1 --steps 3

``--set KEY=VALUE`` (repeatable) adds an RLHFless setting after the benchmark's own, e.g.
``--set generation.compile_decode=true`` for the compiled decode step. Only settings that leave
the work the same are taken: one under a section the comparison fixes (``model``, ``data``,
``reward``, ``algorithm``, ``warmup``, ``store``, ``eval_every``) or
``generation.max_new_tokens`` / ``generation.temperature`` is refused with exit status 2. The
settings are printed in each pair's line (``rlhfless_set``).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script or imported as benchmarks.bench_vs_trl (tests)

from benchmarks.json_lines import emit  # noqa: E402
from benchmarks.shaped_model import WorkloadRefused, length_problem, write_shaped_model  # noqa: E402

SIZES = {"small": (16, 4, 32), "large": (32, 8, 128), "gpu": (64, 8, 256)}  # prompts x samples x new tokens
LR = 4e-4
LENGTH_REWARD = "benchmarks.length_reward:length_reward"
CALIBRATION_PROMPTS = 32
"""Prompts the stop calibration samples after (``shaped_model.stop_trace``), once each."""
MICRO = {"gpu": 64}
"""Completions per forward and backward pass, for both systems (RLHFless
``algorithm.micro_batch_size``; TRL ``per_device_train_batch_size`` with gradient accumulation
up to the whole batch, still one generation and one optimizer step per batch): 512 completions
of 256 tokens in one pass would hold about 100 GB of activations and logits of a 0.5B model."""


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


def _child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository first on ``PYTHONPATH``, plus ``extra``."""
    return dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **extra)


def _worker_error(out: Path) -> str:
    """The first error a worker of the run logged (a crash, a segmentation fault's Python stack
    among them, is told in the worker's log only), 40 lines from where it starts; '' if none."""
    for log in sorted((out / "logs").glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        start = next((i for i, line in enumerate(lines) if "Fatal Python error" in line or "Traceback" in line), None)
        if start is not None:
            return f"\n--- {log.name}:\n" + "\n".join(lines[start:start + 40])
    return ""


FIXED_SETTINGS = ("model.", "data.", "reward.", "algorithm.", "warmup.", "store.", "eval_every",
                  "generation.max_new_tokens", "generation.temperature")
"""Settings (prefixes of dotted keys) that define the work both systems do: ``--set`` may not
change them."""


def extra_setting_problem(kv: str) -> str | None:
    """Why ``--set`` cannot take ``kv`` (``KEY=VALUE``), or None."""
    key, eq, _ = kv.partition("=")
    key = key.strip()
    if not eq or not key:
        return f"--set {kv!r}: expected KEY=VALUE, e.g. generation.compile_decode=true"
    for fixed in FIXED_SETTINGS:
        if key == fixed.rstrip(".") or (fixed.endswith(".") and key.startswith(fixed)):
            return (f"--set {kv!r}: {key} is part of the work both systems do (the benchmark sets it for both); "
                    "only settings that leave the work the same, such as generation.compile_decode or "
                    "generation.cuda_graphs, may be added")
    return None


def run_rlhfless(work: Path, model: Path, data: Path, size: tuple[int, int, int], steps: int, tag: str,
                 device: str = "cpu", reward: str | None = None, micro: int | None = None,
                 extra: tuple[str, ...] = ()) -> dict:
    prompts, samples, tokens = size
    out = work / f"rlhfless-{tag}"
    cmd = [sys.executable, "-m", "flows.commands.cli", "train", "--out", str(out), "--steps", str(steps),
           *[a for kv in (f"model.path={model}", f"data.train_path={data}", f"data.eval_path={data.with_name('eval.jsonl')}",
                          "data.chat_template=false", "warmup.steps=0",
                          f"algorithm.batch_size={prompts * samples}", f"algorithm.group_size={samples}",
                          "algorithm.num_minibatches=1", "algorithm.kl_coef=0", f"algorithm.lr={LR}",
                          f"generation.max_new_tokens={tokens}", "eval_every=0", f"store.uri={out}/store",
                          *([f'reward.functions=[{{name: "{reward}"}}]'] if reward else []),
                          *([f"algorithm.micro_batch_size={micro}"] if micro else []), *extra)
             for a in ("--set", kv)]]
    env = _child_env(RLHFLESS_DEVICE=device)
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marks, tail = [], collections.deque(maxlen=40)  # the output's end: the run's own error, where it fails
    for line in proc.stdout:  # type: ignore[union-attr]
        tail.append(line)
        if "] step " in line:
            marks.append(time.time() - t0)
    if proc.wait() != 0:
        raise RuntimeError(f"rlhfless run failed; the end of its output:\n{''.join(tail)}{_worker_error(out)}")
    summary = json.loads((out / "summary.json").read_text())
    gaps = [b - a for a, b in zip(marks, marks[1:])][:-1]  # the last step also evaluates
    lengths = [s["response_length/mean"] for s in summary["steps"]][1:-1]
    return {"first_step_s": marks[0], "steps": gaps, "mean_length": statistics.mean(lengths),
            "overhead_s": statistics.median(s["timing_s/overhead"] for s in summary["steps"][1:]),
            "phases_s": phase_medians(summary["steps"][1:-1]), "first_phases_s": phase_medians(summary["steps"][:1]),
            # retried activations (a worker lost, memory among the causes) and train steps that
            # found their state warm: either one moves a step's time by seconds
            "failed_attempts": sum(s.get("cost/failed_attempts", 0) for s in summary["steps"]),
            "reused_state": [s.get("train/reused_state") for s in summary["steps"]]}


def phase_medians(steps: list[dict]) -> dict[str, float]:
    """Where the timed steps' seconds went: the median of each phase's wall time
    (``timing_s/*``), of the train step's own split (``train/*_s``: loading, the update,
    publishing the version and the optimizer state) and of the generation actions' weight
    pushes and graph captures (``engine/*_s``), over ``steps`` (summary.json step records)."""
    keys = sorted({k for s in steps for k in s
                   if k.startswith("timing_s/") or (k.startswith(("train/", "engine/")) and k.endswith("_s"))})
    return {k.removeprefix("timing_s/"): round(statistics.median(s[k] for s in steps if k in s), 3) for k in keys}


def run_trl_child(model: str, data: str, prompts: int, samples: int, tokens: int, steps: int, out: str,
                  device: str = "cpu", reward: str = "repeat", micro: int = 0) -> None:
    """In a fresh process: TRL's GRPOTrainer on the same inputs; prints one JSON line."""
    import datasets
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(ROOT))
    from actions.tasks.rewards import load_reward

    if reward == "repeat":
        repeat = load_reward("repeat")

        def reward_fn(completions, answer, **kw):
            return repeat(completions, answer=answer)
    else:
        from benchmarks.length_reward import length_reward as reward_fn
    ds = datasets.load_dataset("json", data_files=data, split="train")
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            marks.append(time.time())

    gpu = device != "cpu"
    per_pass = micro or prompts * samples
    args = GRPOConfig(output_dir=out, per_device_train_batch_size=per_pass, num_generations=samples,
                      gradient_accumulation_steps=prompts * samples // per_pass,
                      max_completion_length=tokens, max_steps=steps, learning_rate=LR, logging_steps=1,
                      report_to="none", save_strategy="no", use_cpu=not gpu, temperature=1.0, seed=0, bf16=gpu,
                      model_init_kwargs={"dtype": torch.bfloat16 if gpu else torch.float32})
    t0 = time.time()
    trainer = GRPOTrainer(model=model, reward_funcs=reward_fn, args=args, train_dataset=ds, callbacks=[Clock()])
    trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    print(json.dumps({"first_step_s": marks[0] - t0, "steps": [b - a for a, b in zip(marks, marks[1:])],
                      "mean_length": statistics.mean(lengths[1:] or lengths)}))


def run_trl(work: Path, model: Path, data: Path, size: tuple[int, int, int], steps: int, tag: str,
            device: str = "cpu", reward: str | None = None, micro: int | None = None) -> dict:
    cmd = [sys.executable, __file__, "--trl-child", str(model), str(data), *map(str, size), str(steps),
           str(work / f"trl-{tag}"), device, "length" if reward else "repeat", str(micro or 0)]
    env = _child_env()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"TRL run failed: {out.stderr[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def refuse(why: str) -> NoReturn:
    """End the benchmark with exit status 4: the workload is not the one it compares."""
    print(f"vs TRL: refused, {why}", file=sys.stderr)
    sys.exit(4)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--trl-child":
        m, d, p, s, t, n, o, dev, reward, micro = sys.argv[2:]
        run_trl_child(m, d, int(p), int(s), int(t), int(n), o, dev, reward, int(micro))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--model-config", default=None,
                        help="a Hugging Face config.json: a random-weight model of that shape, length reward")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both systems)")
    parser.add_argument("--mean-length", type=float, default=96.0,
                        help="with --model-config: the expected completion length in tokens the stop token is "
                             "calibrated to, on the benchmark's prompts")
    parser.add_argument("--json", default=None, help="also append every JSON line printed to this file")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="an RLHFless setting added after the benchmark's own (repeatable); settings that "
                             "change the work are refused")
    args = parser.parse_args()
    for kv in args.extra:
        problem = extra_setting_problem(kv)
        if problem:
            parser.error(problem)
    if args.model_config and not 1 < args.mean_length < SIZES[args.size][2]:
        parser.error(f"--mean-length {args.mean_length:g}: must lie between 1 and the {SIZES[args.size][2]} new "
                     f"tokens --size {args.size} allows")
    if args.steps < 3:  # the first step is reported apart and the last one also evaluates
        parser.error(f"--steps {args.steps}: at least 3 (the first step warms up and the last one also evaluates, "
                     "so the steps timed are the ones between)")
    if importlib.util.find_spec("trl") is None:  # a benchmark-only extra: half the comparison is missing
        print("vs TRL: skipped, TRL is not importable here; pip install -e '.[bench]' (make bench does it)")
        if args.device != "cpu":  # a GPU check that asked for this figure has not got it: never "ok"
            sys.exit(3)
        return
    size = SIZES[args.size]
    work = Path(tempfile.mkdtemp(prefix="bench-vs-trl-"))
    model, data = write_inputs(work)
    reward = None
    if args.model_config:
        prompts = [json.loads(line)["prompt"] for line in data.read_text().splitlines()[:CALIBRATION_PROMPTS]]
        try:
            model = write_shaped_model(work, args.model_config, prompts, args.mean_length, size[2], args.device)
        except WorkloadRefused as exc:
            refuse(f"before either system ran: {exc}")
        reward = LENGTH_REWARD
    completions = size[0] * size[1]
    rows = []
    micro = MICRO.get(args.size)
    for i in range(args.pairs):
        ours = run_rlhfless(work, model, data, size, args.steps, str(i), args.device, reward, micro, tuple(args.extra))
        theirs = run_trl(work, model, data, size, args.steps, str(i), args.device, reward, micro)
        o, t = statistics.median(ours["steps"]), statistics.median(theirs["steps"])
        row = {"pair": i, "rlhfless_s_per_step": o, "trl_s_per_step": t,
               "rlhfless_completions_per_s": completions / o, "trl_completions_per_s": completions / t,
               "rlhfless_tokens_per_s": completions * ours["mean_length"] / o,
               "trl_tokens_per_s": completions * theirs["mean_length"] / t,
               "completions_ratio": t / o, "rlhfless_overhead_s": ours["overhead_s"],
               "rlhfless_first_step_s": ours["first_step_s"], "trl_first_step_s": theirs["first_step_s"],
               "rlhfless_mean_length": ours["mean_length"], "trl_mean_length": theirs["mean_length"],
               "rlhfless_phases_s": ours["phases_s"], "rlhfless_first_phases_s": ours["first_phases_s"],
               "rlhfless_failed_attempts": ours["failed_attempts"], "rlhfless_reused_state": ours["reused_state"],
               "rlhfless_set": list(args.extra)}
        rows.append(row)
        emit({"bench": "vs_trl_pair", **{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}},
             args.json)
        for who in ("rlhfless", "trl") if args.model_config else ():
            problem = length_problem(row[f"{who}_mean_length"], args.mean_length)  # a run's mean: no extremes
            if problem:
                refuse(f"{who}'s completions are not the workload: {problem}; the calibration line above "
                       "(expected_length, sampled_length) says what the model gave before the runs")
    emit({"bench": "vs_trl", "size": args.size, "prompts_x_samples_x_tokens": size, "device": args.device,
          "model": args.model_config or "tiny qwen2 folder",
          "median_completions_ratio": statistics.median(r["completions_ratio"] for r in rows)}, args.json)


if __name__ == "__main__":
    main()
