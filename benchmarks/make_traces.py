"""Seeded synthetic response-length traces in the shared trace format (JSONL).

The two shared traces (gsm8k, lcb) are one length shape each. The planner must hold on any
trace of that format, so this writes four more with other shapes, seeded and reproducible:

- ``lognormal``: long-tailed lengths (median 350 tokens, sigma 0.8), few at the cap;
- ``bimodal``: 70% short answers (~150 tokens) and 30% long ones (~1,200 tokens);
- ``capheavy``: long answers (median 1,100 tokens, sigma 0.7): about 24% of groups run to the
  2,048-token cap (seed 0; the script prints each trace's share);
- ``uniform``: group means spread evenly over 60-1,500 tokens.

Every trace has the shared traces' layout: 512 prompts, 3 epochs of 4 steps of 128 prompts
(the same prompts in the same steps each epoch, shuffled within a step), 4 samples per prompt,
a 2,048-token cap, which every line states (``max_new_tokens``; the shared traces do not, so
their replays are given it). Each prompt has a latent mean length ``mu`` drawn from the shape;
its reference answer is ``mu / 1.65`` times a lognormal error (sigma 0.35, giving a correlation of
about 0.8 with the group max, as in the shared traces); each epoch moves ``mu`` by a lognormal
drift (sigma 0.1) and each sample is ``mu`` times a lognormal spread (sigma 0.15), rounded and
capped. Prompt lengths are uniform in 60-700 tokens, independent of the response length.

    .venv/bin/python benchmarks/make_traces.py --out /tmp/traces [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

CAP = 2048
PROMPTS, EPOCHS, STEPS_PER_EPOCH, SAMPLES = 512, 3, 4, 4


def _mu(shape: str, rng: random.Random) -> float:
    if shape == "lognormal":
        return rng.lognormvariate(math.log(350), 0.8)
    if shape == "bimodal":
        return (rng.lognormvariate(math.log(150), 0.3) if rng.random() < 0.7
                else rng.lognormvariate(math.log(1200), 0.25))
    if shape == "capheavy":
        return rng.lognormvariate(math.log(1100), 0.7)
    if shape == "uniform":
        return rng.uniform(60, 1500)
    raise ValueError(f"shape={shape!r}: use one of {SHAPES}")


SHAPES = ("lognormal", "bimodal", "capheavy", "uniform")


def make_trace(shape: str, seed: int) -> list[dict]:
    """The trace's rows in file order (epoch, step, then the step's prompts)."""
    rng = random.Random(f"{shape}:{seed}")
    mu = [_mu(shape, rng) for _ in range(PROMPTS)]
    answer = [max(8, round(m / 1.65 * rng.lognormvariate(0.0, 0.35))) for m in mu]
    prompt_len = [rng.randint(60, 700) for _ in range(PROMPTS)]
    ids = list(range(PROMPTS))
    rng.shuffle(ids)
    per_step = PROMPTS // STEPS_PER_EPOCH
    rows = []
    for epoch in range(EPOCHS):
        drift = [m * rng.lognormvariate(0.0, 0.1) for m in mu]
        for s in range(STEPS_PER_EPOCH):
            chunk = ids[s * per_step:(s + 1) * per_step]
            chunk = rng.sample(chunk, len(chunk))
            for pid in chunk:
                lens = [min(CAP, max(1, round(drift[pid] * rng.lognormvariate(0.0, 0.15))))
                        for _ in range(SAMPLES)]
                rows.append({"epoch": epoch, "step": epoch * STEPS_PER_EPOCH + s, "prompt_id": pid,
                             "prompt_len": prompt_len[pid], "answer_len": answer[pid],
                             "response_lens": lens, "max_new_tokens": CAP})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for <shape>.jsonl")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for shape in SHAPES:
        rows = make_trace(shape, args.seed)
        path = out / f"{shape}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        capped = sum(max(r["response_lens"]) >= CAP for r in rows) / len(rows)
        mean = sum(max(r["response_lens"]) for r in rows) / len(rows)
        print(f"{path}: {len(rows)} rows, mean group max {mean:.0f} tokens, {capped:.0%} at the cap")


if __name__ == "__main__":
    main()
