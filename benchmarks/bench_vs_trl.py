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
calibration line), and a pair whose completions average under a tenth of ``--mean-length`` on
either side is printed and then refused: either way the benchmark exits 4, since a step that
generates next to nothing measures something else. ``--size gpu`` is 64 prompts x
8 samples, up to 256 new tokens:

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
CALIBRATION_PROMPTS = 32
"""Prompts the stop calibration samples after (``stop_trace``), once each."""
PREFLIGHT_PROMPTS = 16
"""Of those, the prompts sampled once more in the systems' dtype before they run
(``sampled_lengths``)."""
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


def write_shaped_model(work: Path, config_json: str, prompts: list[str], mean_length: float, max_new_tokens: int,
                       device: str) -> Path:
    """A model folder of the shape ``config_json`` describes, random weights, the built-in BPE
    tokenizer, made context-free (``make_context_free``) and its stop token's chance set so that
    the expected completion length after ``prompts`` is ``mean_length`` tokens
    (``calibrate_stop_shift``). Checks the lengths by sampling in the systems' dtype
    (``sampled_lengths``) and exits 4 where they would come out under a tenth of that."""
    sys.path.insert(0, str(ROOT))
    from flows.commands.tiny_model_dir import write_tiny_model_dir

    cfg = json.loads(Path(config_json).read_text())
    info = write_tiny_model_dir(
        work / "model", cfg["model_type"], vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
        num_kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
        intermediate_size=cfg["intermediate_size"], max_positions=min(cfg["max_position_embeddings"], 4096),
        tie_word_embeddings=cfg.get("tie_word_embeddings", True), chat_template=False)
    eos = info.eos_token_ids[0]
    make_context_free(info.path)
    trace = stop_trace(info.path, eos, prompts, max_new_tokens, device)
    shift = calibrate_stop_shift(trace, mean_length)
    rows = expected_lengths(trace, shift)
    shift_stop_row(info.path, eos, shift)
    sampled = sampled_lengths(info.path, eos, prompts[:PREFLIGHT_PROMPTS], max_new_tokens, device)
    print(json.dumps({"model": config_json, "stop_token": eos, "stop_shift": round(shift, 4),
                      "expected_length": round(float(rows.mean()), 2),
                      "row_expected_length": [round(float(x), 1) for x in (rows.min(), rows.median(), rows.max())],
                      "sampled_length": sampled}), flush=True)
    if sampled["mean"] < mean_length / 10:  # what both runs would measure: refuse before minutes go by
        print(f"vs TRL: refused before either system ran, completions sampled in {sampled['dtype']} averaged "
              f"{sampled['mean']} tokens where the calibration (fp32) expects {float(rows.mean()):.1f}: the step "
              "compared would generate next to nothing (sampled_length above says how)", file=sys.stderr)
        sys.exit(4)
    return info.path


CONSTANT_DIM = 0
"""The residual-stream dimension ``make_context_free`` fills with a constant."""


def _output_rows(tensors: dict) -> str:
    """The name of the matrix whose rows are the output head's (the embedding where tied)."""
    return "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"


def make_context_free(model_dir: Path) -> None:
    """Give every token's embedding the same large value ``C`` in dimension ``CONSTANT_DIM``
    (16 times the norm of an embedding row), and scale that dimension of the final norm's weight
    so it reaches the output head as about ``1 / C``. Every layer's normalised input is then
    dominated by that one constant, so the random model's next-token distribution hardly
    depends on the context, and the stop token's chance can be set once for every position and
    prompt (``shift_stop_row``): completion lengths come out geometric, varying within a group
    as a trained model's do. A random model's stop chance otherwise depends on the last prompt
    token, which the benchmark's prompts all share: scaling the stop token's row made every
    completion stop at its first token or none. The shapes, and so every FLOP and byte the two
    systems spend, are the config's; the output head's other rows gain the same ``C / C = 1``
    logit each, which the softmax ignores (and which keeps bf16 logits small)."""
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    embed = tensors["model.embed_tokens.weight"]
    hidden = embed.shape[1]
    c = 16.0 * float(embed.float().norm(dim=1).mean())
    embed[:, CONSTANT_DIM] = c
    if "lm_head.weight" in tensors:  # untied: the output rows carry the same constant
        tensors["lm_head.weight"][:, CONSTANT_DIM] = c
    norm = tensors["model.norm.weight"]
    norm[CONSTANT_DIM] = 1.0 / (c * hidden ** 0.5)  # the normalised constant is about sqrt(hidden)
    save_file(tensors, str(path), metadata={"format": "pt"})


def sampled_lengths(model_dir: Path, eos: int, prompts: list[str], max_new_tokens: int, device: str,
                    seed: int = 0) -> dict:
    """One completion per prompt, sampled as the two systems will sample it: Hugging Face
    ``generate`` in the systems' dtype (bf16 on a GPU, fp32 on the CPU), temperature 1, the whole
    vocabulary, left-padded. Returns the completion lengths' mean, min and max (the stop token
    included), the share of rows whose first token is the stop token, and whether the first
    position's logits were all finite: a check of the workload before either system runs, in
    the arithmetic they run it in, where the calibration ran in fp32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    enc = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(map(len, enc))
    ids = torch.tensor([[eos] * (width - len(e)) + e for e in enc], device=device)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc], device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        first = model(input_ids=ids, attention_mask=mask).logits[:, -1].float()
        out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos)[:, width:]
    lengths = [row.index(eos) + 1 if eos in row else len(row) for row in out.tolist()]
    return {"dtype": str(dtype).removeprefix("torch."), "mean": round(sum(lengths) / len(lengths), 2),
            "min": min(lengths), "max": max(lengths),
            "stop_first": round(sum(row[0] == eos for row in out.tolist()) / len(lengths), 3),
            "first_logits_finite": bool(torch.isfinite(first).all())}


def stop_trace(model_dir: Path, eos: int, prompts: list[str], max_new_tokens: int, device: str, seed: int = 0):
    """Sample ``max_new_tokens`` tokens after each prompt (fp32, temperature 1, the stop token
    masked) and record, per step and row, the stop token's logit, the output head's input in
    ``CONSTANT_DIM`` and the log-sum-exp of every other logit: a ``[3, steps, rows]`` float64
    tensor.

    Adding ``d`` to the stop token's row in ``CONSTANT_DIM`` adds ``d`` times that input to its
    logit and changes nothing else until it is drawn (it is not in the context before), so a
    row's chance to stop at step t is ``sigmoid(logit_t + d * input_t - lse_t)`` along the very
    path it takes while it does not stop: one masked sampling run prices every shift."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    enc = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(map(len, enc))
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in enc], device=device)  # left-padded
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc], device=device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    gen = torch.Generator(device).manual_seed(seed)
    stop, slope, rest = [], [], []
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, output_hidden_states=True)
        for _ in range(max_new_tokens):
            logits = out.logits[:, -1].double()
            stop.append(logits[:, eos].clone())
            slope.append(out.hidden_states[-1][:, -1, CONSTANT_DIM].double())  # after the final norm
            logits[:, eos] = float("-inf")
            rest.append(torch.logsumexp(logits, -1))
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
            mask = torch.cat([mask, mask.new_ones(len(enc), 1)], 1)
            pos = pos[:, -1:] + 1
            out = model(input_ids=nxt, attention_mask=mask, position_ids=pos, past_key_values=out.past_key_values,
                        use_cache=True, output_hidden_states=True)
    return torch.stack([torch.stack(stop), torch.stack(slope), torch.stack(rest)]).cpu()


def expected_lengths(trace, shift: float):
    """Each row's expected completion length in tokens (the stop token included, at most the
    trace's steps) with ``shift`` added to the stop row's ``CONSTANT_DIM``:
    ``sum_t P(no stop before t)``."""
    import torch

    p = torch.sigmoid(trace[0] + shift * trace[1] - trace[2])  # [steps, rows]
    alive = torch.cumprod(1 - p, 0)
    return 1 + alive[:-1].sum(0)


def calibrate_stop_shift(trace, mean_length: float) -> float:
    """The shift of the stop row whose expected completion length, averaged over the trace's
    rows, is ``mean_length``: bisection (the length falls as the shift grows, the output head's
    input in ``CONSTANT_DIM`` being positive everywhere). Raises ValueError when the length
    asked for lies outside (1, steps), or the trace shows the constant did not dominate."""
    steps = trace.shape[1]
    if not 1 < mean_length < steps:
        raise ValueError(f"--mean-length {mean_length:g}: must lie between 1 and the {steps} new tokens allowed")
    if float(trace[1].min()) <= 0:
        raise ValueError(f"the output head's input in dimension {CONSTANT_DIM} went as low as "
                         f"{float(trace[1].min()):.3g}: the constant did not dominate the model's hidden states, "
                         "so no one shift sets every position's stop chance")

    def mean_at(shift: float) -> float:
        return float(expected_lengths(trace, shift).mean())

    lo, hi = 0.0, 1.0
    if mean_at(lo) < mean_length:
        raise ValueError(f"completions already average {mean_at(lo):.1f} tokens before any shift, under the "
                         f"--mean-length {mean_length:g} asked for")
    while mean_at(hi) > mean_length:
        lo, hi = hi, hi * 2
        if hi > 2.0 ** 40:
            raise ValueError(f"no shift of the stop row gives a mean length of {mean_length:g} tokens")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_at(mid) > mean_length else (lo, mid)
    return (lo + hi) / 2


def shift_stop_row(model_dir: Path, eos: int, shift: float) -> None:
    """Add ``shift`` to the stop token's output row (the embedding where tied) in
    ``CONSTANT_DIM``, in the folder's ``model.safetensors``."""
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    tensors[_output_rows(tensors)][eos, CONSTANT_DIM] += shift
    save_file(tensors, str(path), metadata={"format": "pt"})


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
        prompts = [json.loads(line)["prompt"] for line in data.read_text().splitlines()[:CALIBRATION_PROMPTS]]
        model = write_shaped_model(work, args.model_config, prompts, args.mean_length, size[2], args.device)
        reward = LENGTH_REWARD
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
               "rlhfless_first_step_s": ours["first_step_s"], "trl_first_step_s": theirs["first_step_s"],
               "rlhfless_mean_length": ours["mean_length"], "trl_mean_length": theirs["mean_length"],
               "rlhfless_phases_s": ours["phases_s"], "rlhfless_first_phases_s": ours["first_phases_s"],
               "rlhfless_failed_attempts": ours["failed_attempts"], "rlhfless_reused_state": ours["reused_state"]}
        rows.append(row)
        emit({"bench": "vs_trl_pair", **{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}},
             args.json)
        short = {who: row[f"{who}_mean_length"] for who in ("rlhfless", "trl")
                 if row[f"{who}_mean_length"] < args.mean_length / 10}
        if args.model_config and short:
            print(f"vs TRL: refused, completions averaged {short} tokens against the --mean-length "
                  f"{args.mean_length:g} calibrated for: a step that generates next to nothing is not the step "
                  "compared; check the calibration line above (expected_length, row_expected_length)", file=sys.stderr)
            sys.exit(4)
    emit({"bench": "vs_trl", "size": args.size, "prompts_x_samples_x_tokens": size, "device": args.device,
          "model": args.model_config or "tiny qwen2 folder",
          "median_completions_ratio": statistics.median(r["completions_ratio"] for r in rows)}, args.json)


if __name__ == "__main__":
    main()
