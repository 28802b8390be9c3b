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
``--stop-rate`` scales the stop token's embedding row (tied: its output row too) until the
mean chance of stopping per token on random contexts is that rate, so lengths vary as a
trained model's do, and the reward is ``length_reward.py``'s (the task reward is 0 for a random
model). ``--size gpu`` is 64 prompts x 8 samples, up to 256 new tokens:

    python benchmarks/bench_vs_trl.py --size gpu --device cuda --model-config benchmarks/configs/qwen2.5-0.5b.json \
        --pairs 1 --steps 3
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script or imported as benchmarks.bench_vs_trl (tests)

from benchmarks.json_lines import emit  # noqa: E402

SIZES = {"small": (16, 4, 32), "large": (32, 8, 128), "gpu": (64, 8, 256)}  # prompts x samples x new tokens
LR = 4e-4
LENGTH_REWARD = "benchmarks.length_reward:length_reward"
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


def write_shaped_model(work: Path, config_json: str, stop_rate: float, device: str) -> Path:
    """A model folder of the shape ``config_json`` describes, random weights, the built-in BPE
    tokenizer, and the stop token's row scaled to ``stop_rate`` (``calibrate_stop_rate``)."""
    sys.path.insert(0, str(ROOT))
    from flows.commands.tiny_model_dir import write_tiny_model_dir

    cfg = json.loads(Path(config_json).read_text())
    info = write_tiny_model_dir(
        work / "model", cfg["model_type"], vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
        num_kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
        intermediate_size=cfg["intermediate_size"], max_positions=min(cfg["max_position_embeddings"], 4096),
        tie_word_embeddings=cfg.get("tie_word_embeddings", True), chat_template=False)
    scale, reached = calibrate_stop_rate(info.path, info.eos_token_ids[0], stop_rate, device)
    print(json.dumps({"model": config_json, "stop_token": info.eos_token_ids[0], "stop_row_scale": round(scale, 3),
                      "stop_rate": round(reached, 5)}), flush=True)
    return info.path


def calibrate_stop_rate(model_dir: Path, eos: int, rate: float, device: str) -> tuple[float, float]:
    """Scale the stop token's embedding row (and so, tied, its output row) in the folder's
    ``model.safetensors`` until the mean probability of the stop token over random contexts
    (16 x 64 random ids, temperature 1) is ``rate``; bisection on the log of the scale.
    Returns (scale, rate reached)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    ids = torch.randint(0, model.config.vocab_size, (16, 64), generator=torch.Generator().manual_seed(0)).to(device)
    rows = [model.get_input_embeddings().weight]
    if not model.config.tie_word_embeddings:
        rows.append(model.get_output_embeddings().weight)
    original = [r[eos].detach().clone() for r in rows]

    def stop_rate(scale: float) -> float:
        with torch.no_grad():
            for r, o in zip(rows, original):
                r[eos] = o * scale
            logits = model(input_ids=ids).logits.float()
            return float(torch.softmax(logits, dim=-1)[..., eos].mean())

    lo, hi = 0.0, 8.0  # log2 of the scale
    for _ in range(24):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if stop_rate(2.0 ** mid) < rate else (lo, mid)
    scale = 2.0 ** ((lo + hi) / 2)
    reached = stop_rate(scale)
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in tensors:
            tensors[name][eos] *= scale
    save_file(tensors, str(path), metadata={"format": "pt"})
    return scale, reached


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


def run_rlhfless(work: Path, model: Path, data: Path, size: tuple[int, int, int], steps: int, tag: str,
                 device: str = "cpu", reward: str | None = None, micro: int | None = None) -> dict:
    prompts, samples, tokens = size
    out = work / f"rlhfless-{tag}"
    cmd = [sys.executable, "-m", "flows.commands.cli", "train", "--out", str(out), "--steps", str(steps),
           *[a for kv in (f"model.path={model}", f"data.train_path={data}", f"data.eval_path={data.with_name('eval.jsonl')}",
                          "data.chat_template=false", "warmup.steps=0",
                          f"algorithm.batch_size={prompts * samples}", f"algorithm.group_size={samples}",
                          "algorithm.num_minibatches=1", "algorithm.kl_coef=0", f"algorithm.lr={LR}",
                          f"generation.max_new_tokens={tokens}", "eval_every=0", f"store.uri={out}/store",
                          *([f'reward.functions=[{{name: "{reward}"}}]'] if reward else []),
                          *([f"algorithm.micro_batch_size={micro}"] if micro else []))
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
            "overhead_s": statistics.median(s["timing_s/overhead"] for s in summary["steps"][1:])}


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
    parser.add_argument("--stop-rate", type=float, default=0.01,
                        help="with --model-config: mean chance per token of the stop token")
    parser.add_argument("--json", default=None, help="also append every JSON line printed to this file")
    args = parser.parse_args()
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
        model, reward = write_shaped_model(work, args.model_config, args.stop_rate, args.device), LENGTH_REWARD
    completions = size[0] * size[1]
    rows = []
    micro = MICRO.get(args.size)
    for i in range(args.pairs):
        ours = run_rlhfless(work, model, data, size, args.steps, str(i), args.device, reward, micro)
        theirs = run_trl(work, model, data, size, args.steps, str(i), args.device, reward, micro)
        o, t = statistics.median(ours["steps"]), statistics.median(theirs["steps"])
        row = {"pair": i, "rlhfless_s_per_step": o, "trl_s_per_step": t,
               "rlhfless_completions_per_s": completions / o, "trl_completions_per_s": completions / t,
               "rlhfless_tokens_per_s": completions * ours["mean_length"] / o,
               "trl_tokens_per_s": completions * theirs["mean_length"] / t,
               "completions_ratio": t / o, "rlhfless_overhead_s": ours["overhead_s"],
               "rlhfless_first_step_s": ours["first_step_s"], "trl_first_step_s": theirs["first_step_s"]}
        rows.append(row)
        emit({"bench": "vs_trl_pair", **{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}},
             args.json)
    emit({"bench": "vs_trl", "size": args.size, "prompts_x_samples_x_tokens": size, "device": args.device,
          "model": args.model_config or "tiny qwen2 folder",
          "median_completions_ratio": statistics.median(r["completions_ratio"] for r in rows)}, args.json)


if __name__ == "__main__":
    main()
