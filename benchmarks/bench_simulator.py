"""RLHFless vs the static serverful baseline on length traces (paper §4.7).

It replays every ``../shared/traces/*.jsonl`` (skipped with a note when absent) and four
seeded synthetic traces of other length shapes (``benchmarks/make_traces.py``) on the paper's
simulated cluster (20 nodes x 8 H100, roofline TPOT, Qwen2.5-7B-sized actors), then the
paper's own simulated model, Llama2-70B on 2 GPUs per actor (paper §4.7), where the KV memory
left beside the weights (~18k tokens per actor) bounds the batch.

Per trace and policy it prints, against ``static:3``: the generation phase's speedup and
GPU-s ratio, the whole step's (the learner's scoring and training after generation on one
8-GPU node at 40% MFU), the planner's predicted against replayed phase time (median and p90
absolute error), and planning time. The whole step's GPU-s are given two ways: the actors'
alone (``step act GPU-s``: static:3 standalone, its 6 GPUs its own and held through the
learner's phases, while rlhfless has released its actors) and the total with the learner's 8
GPUs held through every step (``step tot GPU-s``: what rlhfless runs on the learner's node
counted once). A verdict table checks the bars: generation GPU-s <= static:3's at <= 1.02x
its time on every trace and >= 1.05x faster on average; whole step >= 50% fewer GPU-s at
<= 1.0x time, on either basis, and against static:3 as a hybrid engine (its actors on the
learner's GPUs, so its total is the learner's alone); median prediction error <= 10%.

Modelling choices (details in flows/simulate/*.py docstrings):
- 2 GPUs per actor: verl's Qwen2.5-7B recipes run rollouts at TP=2 and the paper's H100
  simulation uses 2 GPUs per actor.
- static:3 is favoured where in doubt: no weight transfer, no cold start, prompt shared by
  its n samples; it is billed N x GPUs x phase time (held for the whole phase); in the whole
  step it is standalone and the weight sync to its actors after each step is not charged.
- rlhfless actors are pre-warmed (plan made a step ahead); cost proxy = GPU x busy time of
  each invocation, as in the paper. Its default objective, ``budget``, takes the fastest plan
  billing no more than 3 actors held for the phase and does not cut (the ablations that cut
  ship the cut samples' KV to the destination).

``bound``: the most any plan could speed up static:3's generation phases: per step, the
critical-path floor of ``flows/simulate/bound.py`` (the longest sample started as early and
decoded, alone, as fast as the replay allows), aggregated as the speedups are (total static:3
time over total floor); the verdict gives, per trace, the share of that reachable gain that
rlhfless takes, (speed - 1) / (bound - 1). Beside it, what plans the replay can run reach
within static:3's bill (``best_within_bill``: per step the fastest ranked or round-robin plan
of 1-12 actors at no more GPU-s than static:3's), made from the predictions and from the true
lengths. And the bound within static:3's bill for plans without cut-and-migrate
(``flows/simulate/bill_bound.py``), which the default objective runs.

The shared traces state no generation cap; they were made with 2,048 tokens
(``--max-new-tokens``), which the replay caps predictions at. The synthetic traces state theirs.

    .venv/bin/python benchmarks/bench_simulator.py [--models qwen2.5-7b] [--sensitivity]
        [--first-epoch learned|reference] [--max-new-tokens 2048]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # `benchmarks.make_traces` and this checkout's flows, without PYTHONPATH

from benchmarks.make_traces import SHAPES, make_trace  # noqa: E402
from flows.planning.lengths import FIRST_EPOCH_PREDICTORS  # noqa: E402
from flows.planning.tpot import (  # noqa: E402
    GPUS,
    LEARNER_MFU,
    MODELS,
    kv_capacity_tokens,
    learner_tokens_per_s,
    roofline_profile,
)
from flows.simulate.cli import bound_report  # noqa: E402
from flows.simulate.policies import DEFAULT_POLICIES, ClusterModel, Policy, parse_policy  # noqa: E402
from flows.simulate.replay import TraceStep, read_trace, replay, replay_step, step_predictions  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"
SHARED_TRACES_CAP = 2048  # max_new_tokens of the shared traces (lcb's 608 responses at 2,048)
TARGET_SPEEDUP, TARGET_SAVING = 1.35, 0.45
# for context: the cheapest serverless plan (one ranked actor) and a bigger static baseline
CONTEXT_POLICIES = ("no-scale:1", "static:6")
SENSITIVITY = {"budget of 4 actors": {"budget_actors": 4},
               "value of time 8": {"objective": "value"},
               "value of time 32": {"objective": "value", "value_of_time_usd_per_s": 32.0},
               "paper lam=0.7": {"objective": "paper"}, "n_max=8": {"n_max": 8},
               "reprefill-migration": {"migration": "reprefill"},
               "prewarm-idle=1s": {"prewarm_idle_s": 1.0}}


def default_model(name: str = "qwen2.5-7b") -> ClusterModel:
    spec = MODELS[name]
    return ClusterModel(profile=roofline_profile(GPUS["h100"], spec, 2), num_nodes=20,
                        gpus_per_node=8, gpus_per_actor=2, weight_bytes=spec.weight_bytes,
                        kv_bytes_per_token=spec.kv_bytes_per_token,
                        bandwidth_bytes_per_s=2 * 40e9)


def best_within_bill(steps: list[TraceStep], model: ClusterModel, exact: bool,
                     max_actors: int = 12, max_new_tokens: int | None = None) -> tuple[float, float]:
    """(speed, GPU-s ratio) of the generation phases against static:3 of a chooser that sees
    each plan's replayed outcome: per step, the fastest of static:3 and the serverless plans
    of N = 1..``max_actors`` actors (ranked or round-robin assignment, no cut) whose replayed
    GPU-s is within static:3's on that step. The plans are made from the true group max
    lengths (``exact``) or from the replay's predictions (capped at ``max_new_tokens``, as
    ``replay``'s). It is no planner: it shows what plans the replay can run reach within
    static:3's bill."""
    static = parse_policy("static:3")
    plans = [Policy(f"{kind}:{n}", False, f"fixed:{n}", kind, cut=False)
             for kind in ("ranked", "round_robin") for n in range(1, max_actors + 1)]
    base_t = base_g = own_t = own_g = 0.0
    for step, predicted, truth in step_predictions(steps, model, max_new_tokens=max_new_tokens):
        lengths = truth if exact else predicted
        base = replay_step(static, step, lengths, model)[1]
        within = [g for g in (replay_step(p, step, lengths, model)[1] for p in plans)
                  if g.gpu_seconds <= base.gpu_seconds]
        best = min([base] + within, key=lambda g: g.time_s)
        base_t, base_g = base_t + base.time_s, base_g + base.gpu_seconds
        own_t, own_g = own_t + best.time_s, own_g + best.gpu_seconds
    return base_t / own_t, own_g / base_g


def ratios(runs: dict) -> dict[str, tuple[float, float, float, float]]:
    """policy -> (speedup, GPU-s saving, mean N, mean idle fraction) against static:3."""
    base = runs["static:3"].summary()
    out = {}
    for name, run in runs.items():
        s = run.summary()
        out[name] = (base["total_time_s"] / s["total_time_s"],
                     1 - s["total_gpu_seconds"] / base["total_gpu_seconds"],
                     sum(run.planned) / len(run.planned), s["mean_idle_fraction"])
    return out


def epoch_split(runs: dict, epochs: dict[int, int]) -> str:
    """rlhfless's generation speed and GPU-s ratio to static:3 in epoch 0 (first-epoch
    predictions) and in the later epochs (history), as one line."""
    parts = []
    for label, first in (("epoch 0", True), ("later", False)):
        pick = {name: [s for s in runs[name].steps if (epochs[s.step] == 0) == first]
                for name in ("static:3", "rlhfless")}
        if not pick["rlhfless"]:
            continue
        base, own = pick["static:3"], pick["rlhfless"]
        speed = sum(s.gen_time_s for s in base) / sum(s.gen_time_s for s in own)
        cost = sum(s.gen_gpu_seconds for s in own) / sum(s.gen_gpu_seconds for s in base)
        parts.append(f"{label} {speed:.3f}x at {cost:.3f}x")
    return ", ".join(parts)


def report_trace(path: Path, model: ClusterModel, sensitivity: bool = True,
                 model_name: str = "qwen2.5-7b", max_new_tokens: int | None = None,
                 steps: list[TraceStep] | None = None) -> dict[str, tuple[float, float]]:
    """Print the trace's tables (``steps``: the trace read already, else read here); return
    rlhfless's (time, GPU-s) ratios to static:3 for the
    generation phase ('gen') and the whole step ('step': time, the actors' GPU-s, the total
    with the learner's, and that total over static:3's as a hybrid engine, the learner's GPUs x
    its step time), and its fidelity ('fid': median and p90 absolute error of the predicted
    phase time). ``max_new_tokens``: the generation cap of a trace that states none."""
    steps = read_trace(path) if steps is None else steps
    cap = None if steps[0].max_new_tokens else max_new_tokens
    rate = learner_tokens_per_s(GPUS["h100"], MODELS[model_name], model.gpus_per_node)
    start = time.perf_counter()
    runs = replay(steps, list(DEFAULT_POLICIES) + list(CONTEXT_POLICIES),
                  dataclasses.replace(model, learner_tokens_per_s=rate), max_new_tokens=cap)
    wall = time.perf_counter() - start
    base = runs["static:3"].summary()
    # the one-entry dict: bound_report's baseline is the first static policy it is given
    r = bound_report(steps, {"static:3": runs["static:3"]}, model)
    bound = (r["max_speedup"], r["max_speedup_serverless"], r["max_speedup_within_bill_no_cut"])
    print(f"\n== {path.name}: {len(steps)} steps, replayed in {wall:.1f} s "
          f"(bound: no plan runs generation faster than {bound[0]:.3f}x static:3, "
          f"no serverless plan faster than {bound[1]:.3f}x, no plan without cuts within "
          f"static:3's GPU-s faster than {_speed(bound[2])})")
    print(f"{'policy':<11} {'gen speed':>9} {'gen GPU-s':>10} {'step speed':>10} {'step act GPU-s':>14} "
          f"{'step tot GPU-s':>14} {'mean N':>7} {'pred err p50/p90':>17} {'plan ms p50/max':>16}")
    hybrid = model.num_learner_gpus * base["total_time_s"]  # static:3's actors on the learner's GPUs
    out = {}
    for name, run in runs.items():
        s = run.summary()
        gen = (s["generation"]["time_s"] / base["generation"]["time_s"],
               s["generation"]["gpu_seconds"] / base["generation"]["gpu_seconds"])
        step = (s["total_time_s"] / base["total_time_s"], s["total_gpu_seconds"] / base["total_gpu_seconds"],
                s["total_gpu_seconds_with_learner"] / base["total_gpu_seconds_with_learner"],
                s["total_gpu_seconds_with_learner"] / hybrid)
        fid = (s["fidelity"]["median_abs_error"], s["fidelity"]["p90_abs_error"])
        if name == "rlhfless":
            out = {"gen": gen, "step": step, "fid": fid, "bound": bound,
                   "predicted": best_within_bill(steps, model, exact=False, max_new_tokens=cap),
                   "exact": best_within_bill(steps, model, exact=True, max_new_tokens=cap)}
        print(f"{name:<11} {1 / gen[0]:>8.3f}x {gen[1]:>9.3f}x {1 / step[0]:>9.3f}x "
              f"{step[1]:>13.3f}x {step[2]:>13.3f}x "
              f"{sum(run.planned) / len(run.planned):>7.1f} {fid[0]:>8.1%}/{fid[1]:<8.1%} "
              f"{s['planning_ms_p50']:>7.2f}/{s['planning_ms_max']:<7.2f}")
    epochs = {st.step: st.epoch for st in steps}
    print("  rlhfless generation by epoch (speed, GPU-s vs static:3): " + epoch_split(runs, epochs))
    print(f"  (whole step: learner on one node of {model.gpus_per_node} H100 at {LEARNER_MFU:.0%} MFU, "
          f"{rate:,.0f} tokens/s; GPU-s columns are ratios to static:3, < 1 is cheaper; act: the actors' alone, "
          f"static:3 standalone; tot: with the learner's {model.num_learner_gpus} GPUs. Against static:3 as a "
          f"hybrid engine, its total the learner's alone ({hybrid:,.0f} GPU-s), rlhfless's total is "
          f"{out['step'][3]:.3f}x)")
    for label, change in (SENSITIVITY.items() if sensitivity else ()):
        sens = ratios(replay(steps, ["static:3", "rlhfless"], dataclasses.replace(model, **change),
                             max_new_tokens=cap))
        speed, saved, mean_n, _ = sens["rlhfless"]
        print(f"  sensitivity {label:<18} rlhfless {speed:.2f}x, {saved:+.1%} GPU-s saved (generation), "
              f"mean N {mean_n:.1f}")
    return out


def verdict(results: dict[str, dict]) -> None:
    """The issue's bars, per trace and on average (generation only and whole step)."""
    print("\n#### verdict (rlhfless vs static:3, default settings)")
    speeds = []
    for name, r in results.items():
        (gt, gg), (st, sg, stot, shyb), (f50, f90) = r["gen"], r["step"], r["fid"]
        speeds.append(1 / gt)
        gen_ok = gg <= 1.0 and gt <= 1.02
        print(f"  {name:<16} generation: time x{gt:.3f}, GPU-s x{gg:.3f} "
              f"({'PASS' if gen_ok else 'FAIL'}: <= 1.02x time, <= 1.0x GPU-s) | whole step (bar: <= 1.0x time, "
              f"<= 0.5x GPU-s): time x{st:.3f}, actors' GPU-s x{sg:.3f} ({_bar(st, sg)}), with the learner's "
              f"x{stot:.3f} ({_bar(st, stot)}), vs static:3 hybrid x{shyb:.3f} ({_bar(st, shyb)}) "
              f"| predicted vs replayed phase time: median {f50:.1%}, p90 {f90:.1%} "
              f"({'PASS' if f50 <= 0.10 else 'FAIL'}: median <= 10%)")
    mean = sum(speeds) / len(speeds)
    print(f"  mean generation speedup {mean:.3f}x ({'PASS' if mean >= 1.05 else 'FAIL'}: >= 1.05x)")
    reach(results)


def reach(results: dict[str, dict]) -> None:
    """Per trace: rlhfless's generation speed; the best plan within static:3's bill made from
    the predictions and from the true lengths (speed at GPU-s, ``best_within_bill``); the
    bound's speed (any plan, serverless plans); and the share of the reachable gain rlhfless
    takes, (speed - 1) / (bound - 1). Then the means."""
    print("\n#### how much faster any plan could be (generation, vs static:3; bound = critical path)")
    print(f"  {'trace':<16} {'rlhfless':>9} {'best <= bill, predicted':>24} {'best <= bill, exact':>24} "
          f"{'bound <= bill, no cut':>22} {'bound':>8} {'serverless bound':>17} {'share of gain':>14}")
    rows = []
    for name, r in results.items():
        speed, (any_plan, serverless, capped) = 1 / r["gen"][0], r["bound"]
        rows.append((speed, r["predicted"][0], r["exact"][0], capped, any_plan, serverless))
        best = " ".join(f"{x:>8.3f}x at {g:.3f}x GPU-s" for x, g in (r["predicted"], r["exact"]))
        print(f"  {name:<16} {speed:>8.3f}x {best} {_speed(capped):>22} {any_plan:>7.3f}x {serverless:>16.3f}x "
              f"{_share(speed, any_plan):>14}")
    means = [None if None in col else sum(col) / len(rows) for col in zip(*rows)]
    print(f"  {'mean':<16} {means[0]:>8.3f}x {means[1]:>8.3f}x {'':>15} {means[2]:>8.3f}x {'':>15} "
          f"{_speed(means[3]):>22} {means[4]:>7.3f}x {means[5]:>16.3f}x {_share(means[0], means[4]):>14}  "
          f"(the bar, a mean of 1.05x, is {'below' if 1.05 <= means[4] else 'above'} the bound)")


def _bar(time_ratio: float, gpu_ratio: float) -> str:
    """The whole-step bar on one basis: <= 1.0x static:3's time at <= 0.5x its GPU-s."""
    return "PASS" if time_ratio <= 1.0 and gpu_ratio <= 0.5 else "FAIL"


def _speed(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}x"


def _share(speed: float, bound: float) -> str:
    """The share of the reachable gain a speed takes; '-' where no gain is reachable."""
    return f"{(speed - 1) / (bound - 1):.1%}" if bound > 1 else "-"


def model_names(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """``--models``' names, each a known model (``MODELS``), else ``parser.error`` listing them."""
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"--models {text!r}: unknown model {', '.join(map(repr, unknown))}; use a comma-separated "
                     f"list of {', '.join(sorted(MODELS))}")
    return names


def read_traces(paths: list[Path]) -> dict[Path, list[TraceStep]] | None:
    """Every trace read before the first is replayed; None, with the one line ``read_trace``
    raises (path:line and what is wrong) on stderr, where one is malformed."""
    try:
        return {path: read_trace(path) for path in paths}
    except ValueError as exc:
        print(f"bench_simulator.py: {exc}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="RLHFless vs static:3 on the shared length traces.")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic traces")
    parser.add_argument("--traces", default=str(TRACES), metavar="DIR",
                        help="directory of the shared length traces (default: ../shared/traces beside the repository)")
    parser.add_argument("--max-new-tokens", type=int, default=SHARED_TRACES_CAP, metavar="N",
                        help="generation cap of the traces that state none (default: the shared traces')")
    parser.add_argument("--sensitivity", action="store_true", help="also the sensitivity lines")
    parser.add_argument("--first-epoch", choices=FIRST_EPOCH_PREDICTORS, default="learned",
                        help="length predictor of prompts without history (flows/planning/first_epoch.py)")
    parser.add_argument("--models", default="qwen2.5-7b,llama2-70b",
                        help="comma-separated actor models: qwen2.5-7b is the issue's setting, "
                             "llama2-70b the paper's simulated one (paper §4.7), where KV memory binds")
    args = parser.parse_args(argv)
    names = model_names(parser, args.models)
    traces = Path(args.traces)
    paths = sorted(traces.glob("*.jsonl"))
    if not paths:
        why = "has no *.jsonl traces" if traces.is_dir() else "does not exist"
        print(f"(shared traces skipped: {traces} {why}; they sit beside the repository, in ../shared/traces: "
              "pass --traces DIR where they are elsewhere. Replaying the synthetic ones only)")
    synthetic = Path(tempfile.mkdtemp(prefix="rlhfless-traces-"))
    for shape in SHAPES:  # other length shapes in the same format (benchmarks/make_traces.py)
        path = synthetic / f"{shape}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in make_trace(shape, args.seed)))
        paths.append(path)
    steps = read_traces(paths)
    if steps is None:
        return 2
    for name in names:
        model = dataclasses.replace(default_model(name), first_epoch=args.first_epoch)
        capacity = kv_capacity_tokens(GPUS["h100"], MODELS[name], model.gpus_per_actor)
        print(f"\n#### cluster: {model.num_nodes} nodes x {model.gpus_per_node} H100, "
              f"{model.gpus_per_actor} GPUs/actor, profile {model.profile.name}, "
              f"KV capacity {capacity:,.0f} tokens/actor, objective {model.objective} "
              f"(the bill of {model.budget_actors} actors held for the phase; no cut), "
              f"cut_threshold={model.cut_threshold}, "
              f"migration {model.migration}, N in [{model.n_min}, {model.n_max}], "
              f"first-epoch predictor {model.first_epoch}")
        results = {path.stem: report_trace(path, model, sensitivity=name == "qwen2.5-7b" and args.sensitivity,
                                           model_name=name, max_new_tokens=args.max_new_tokens,
                                           steps=steps[path]) for path in paths}
        verdict(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
