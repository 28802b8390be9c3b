"""``rlhfless simulate``: replay a length trace on a modelled cluster and compare policies.

``add_arguments(parser)`` + ``run(args)`` let the main CLI mount this as a subcommand;
``main(argv)`` runs it standalone (``python -m flows.simulate``). Bad input (missing trace,
malformed line, unknown policy or profile, a policy named twice, a flag out of range, a fixed
fan-out the cluster cannot hold, a ``--plot`` path that cannot be written) prints one line on
stderr naming the flag or the trace line and returns 2; every input but the trace lines is
checked before the first trace is simulated. ``--json`` prints one trace's report, or
``{"traces": {path: report}}`` for several (a path given twice is kept twice, as ``path#2``),
with the frontier under ``frontier`` when ``--frontier`` asks for it; ``--plot`` writes one
plot per trace and names each file it writes on stderr.

Each trace's generation table is followed by its ``bound`` lines: the critical-path floor of
the phases (``bound.phase_floor``), the most any plan could speed them up over static:N, and
the most a plan without cuts could within static:N's GPU-s (``bill_bound``). Its whole-step
table bills each policy's actors (static:N standalone) and, beside them, the total with the
learner's GPUs (``format_table``).

Defaults model the paper's simulated cluster (paper §4.7): 20 nodes x 8 H100, 2 GPUs per
actor, roofline TPOT of Qwen2.5-7B, lam = cut_threshold (the paper's tau) = 0.7. Inter-node bandwidth: 40 GB/s per GPU
(a 400 Gb/s NIC per GPU at ~80% NCCL efficiency), so an actor of g GPUs receives at g x 40 GB/s.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from flows.planning.lengths import FIRST_EPOCH_PREDICTORS
from flows.planning.objective import KNOB_OBJECTIVE, check_objective, unread_knob_warnings
from flows.planning.tpot import GPUS, LEARNER_MFU, MODELS, TpotProfile, learner_tokens_per_s, parse_roofline_spec
from flows.simulate.bill_bound import capped_time_floor
from flows.simulate.bound import max_speedup, phase_floor
from flows.simulate.plot import plot_paths, unique_names
from flows.simulate.policies import DEFAULT_POLICIES, ClusterModel, Policy, parse_policy
from flows.simulate.replay import MAX_TOKENS, PolicyRun, read_trace, replay


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Replay response-length traces on a modelled GPU cluster. The defaults model the paper's "
                          "setting (20 nodes of 8 H100s, a 7B model, 2 GPUs per actor, the budget objective against "
                          "a static fan-out of 3), not the live campaign's configuration. Planned actors are "
                          "pre-warmed a step ahead and start warm (--prewarm-idle-s bills their wait); the cold start "
                          "(--cold-start-s) applies only to a --continuation actor no warm container is left for.")
    parser.add_argument("--trace", required=True, action="append", dest="traces", metavar="PATH",
                        help="JSONL length trace (repeatable: one report per trace)")
    parser.add_argument("--policy", action="append", dest="policies", metavar="P",
                        help=f"repeatable; default: {' '.join(DEFAULT_POLICIES)}")
    parser.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                        help="the generation cap the traces were made with (predictions are capped at "
                             "it); required unless each trace states it (a max_new_tokens field)")
    _add_cluster(parser)
    _add_planner(parser)
    _add_learner_and_output(parser)


def _add_cluster(parser: argparse.ArgumentParser) -> None:
    """The modelled cluster's flags."""
    parser.add_argument("--nodes", type=int, default=20,
                        help="GPU nodes of the cluster (default %(default)s)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default %(default)s)")
    parser.add_argument("--gpus-per-actor", type=int, default=2,
                        help="GPUs each decode actor holds (default %(default)s)")
    parser.add_argument("--profile", default="roofline:h100:qwen2.5-7b",
                        help="roofline:<gpu>:<model> or a TpotProfile JSON file (default %(default)s)")
    parser.add_argument("--model", default=None, choices=sorted(MODELS),
                        help="model for weight/KV bytes (default: the roofline's, else qwen2.5-7b)")


def _add_planner(parser: argparse.ArgumentParser) -> None:
    """The planner's and the execution model's flags."""
    parser.add_argument("--objective", choices=("budget", "value", "slack", "paper"), default="budget",
                        help="how the planner picks a plan (flows/planning/objective.py; default %(default)s)")
    parser.add_argument("--value-of-time", type=float, default=None, metavar="V",
                        help="objective value: GPU-seconds one second of phase time is worth "
                             "(price 1 per GPU-s); default: the learner's GPUs, which wait for it "
                             "(--learner-gpus, one node's unless given)")
    parser.add_argument("--time-slack", type=float, default=0.05,
                        help="objective slack: cheapest plan within (1 + S) x the fastest (default %(default)s)")
    parser.add_argument("--budget-actors", type=int, default=3, metavar="K",
                        help="objective budget: bill at most K actors held for the phase (default %(default)s)")
    parser.add_argument("--lam", type=float, default=0.7,
                        help="time weight of the paper objective (default %(default)s)")
    parser.add_argument("--cut-threshold", "--tau", dest="cut_threshold", type=float, default=0.7,
                        help="cut-and-migrate threshold (generation.cut_threshold live; the paper's tau; "
                             "default %(default)s)")
    parser.add_argument("--rank-slack", default="0.1", metavar="S",
                        help="ranked slices within (1 + S) x the balanced phase time; 'none' "
                             "for equal prompt counts (default %(default)s)")
    parser.add_argument("--colocated-actors", type=int, default=None, metavar="K",
                        help="decode actors on the learner node after prefill, without transfers "
                             "(default: as many as fit; 1 = the paper's actor 0 alone)")
    parser.add_argument("--n-min", type=int, default=1,
                        help="fewest decode actors a phase may run (default %(default)s)")
    parser.add_argument("--n-max", type=int, default=64,
                        help="most decode actors a phase may run (default %(default)s)")
    parser.add_argument("--bandwidth-gb-per-gpu", type=float, default=40.0,
                        help="learner -> actor transfer GB/s per actor GPU (default %(default)s)")
    parser.add_argument("--cold-start-s", type=float, default=30.0,
                        help="seconds an actor that was not pre-warmed takes to start; planned actors are "
                             "pre-warmed, so it applies only with --continuation, to a continuation actor "
                             "that finds no warm container (default %(default)s)")
    parser.add_argument("--prewarm-idle-s", type=float, default=0.0,
                        help="seconds of waiting billed to each pre-warmed remote actor: what pre-warming "
                             "costs (paper proxy: %(default)s)")
    parser.add_argument("--continuation", action="store_true",
                        help="a cut with no free slots starts a continuation actor")
    parser.add_argument("--migration", choices=("reprefill", "kv"), default="kv",
                        help="cut samples ship their KV blocks over the transfer path the prefill "
                             "KV uses (default), or re-prefill at the destination (a full stall)")
    parser.add_argument("--prefer", choices=("most_free", "least_loaded"), default="most_free",
                        help="order in which destinations with free slots are filled (default %(default)s)")
    parser.add_argument("--first-epoch", choices=FIRST_EPOCH_PREDICTORS, default="learned",
                        help="length predictor of prompts without history: learned online from "
                             "reference and prompt length (default) or the paper's reference rule")


def _add_learner_and_output(parser: argparse.ArgumentParser) -> None:
    """The whole-step learner model's flags and the output's."""
    parser.add_argument("--learner-tokens-per-s", type=float, default=None, metavar="R",
                        help="whole step: scoring + training at R rollout tokens/s (static:N is modelled "
                             "standalone: its actors stay billed through it); default: from the learner model")
    parser.add_argument("--learner-gpus", type=int, default=None, metavar="G",
                        help="whole step: GPUs of the learner (scoring + training), held through every step "
                             "and counted in the total GPU-s (default: one node, --gpus-per-node)")
    parser.add_argument("--learner-mfu", type=float, default=LEARNER_MFU,
                        help="whole step: model FLOP utilisation of the learner's passes (default %(default)s)")
    parser.add_argument("--learner-gpu", choices=sorted(GPUS), default=None,
                        help="whole step: learner GPU type (default: the roofline's, else h100)")
    parser.add_argument("--frontier", action="store_true",
                        help="print rlhfless's time and cost against static:3 over the range of "
                             "the objective's knob (budget actors, value of time, slack or lam)")
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    parser.add_argument("--plot", default=None, metavar="PNG", help="write a per-step plot")


def _slack(text: str) -> float | None:
    if text.lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 10.0:
        raise ValueError(f"--rank-slack={text}: use a number in [0, 10] (a fraction of the "
                         "balanced phase time) or 'none' for equal prompt counts")
    return value


def check_flags(args: argparse.Namespace) -> None:
    """ValueError naming the flag, its value and the range, for every number the cluster and
    planner models take from the command line (NaN fails every range)."""
    def need(ok: bool, flag: str, value: object, rule: str) -> None:
        if not ok:
            raise ValueError(f"{flag}={value}: {rule}")

    for flag in ("nodes", "gpus_per_node", "gpus_per_actor", "n_min", "n_max", "budget_actors", "learner_gpus"):
        value = getattr(args, flag)
        need(value is None or value >= 1, f"--{flag.replace('_', '-')}", value, "must be >= 1")
    need(args.gpus_per_actor <= args.gpus_per_node, "--gpus-per-actor", args.gpus_per_actor,
         f"more than --gpus-per-node={args.gpus_per_node}: an actor's GPUs are on one node; use at most "
         f"{args.gpus_per_node}")
    need(args.n_min <= args.n_max, "--n-max", args.n_max, f"below --n-min={args.n_min}; make --n-max >= --n-min")
    need(0 < args.bandwidth_gb_per_gpu < math.inf, "--bandwidth-gb-per-gpu", args.bandwidth_gb_per_gpu,
         "must be a finite number of GB/s > 0")
    need(0 < args.cut_threshold <= 1, "--cut-threshold", args.cut_threshold, "must be in (0, 1] (1 = never cut)")
    need(0 <= args.lam <= 1, "--lam", args.lam, "must be in [0, 1] (1 = fastest, 0 = cheapest)")
    need(0 <= args.time_slack <= 10, "--time-slack", args.time_slack,
         "must be in [0, 10] (a fraction of the fastest candidate's time)")
    need(args.value_of_time is None or 0 <= args.value_of_time < math.inf, "--value-of-time", args.value_of_time,
         "must be a finite number >= 0 (GPU-seconds one second of phase time is worth)")
    need(0 < args.learner_mfu <= 1, "--learner-mfu", args.learner_mfu, "must be in (0, 1] (a fraction of peak)")
    need(args.learner_tokens_per_s is None or 0 < args.learner_tokens_per_s < math.inf, "--learner-tokens-per-s",
         args.learner_tokens_per_s, "must be > 0 tokens/s (leave it out to derive it from --learner-gpus and "
         "--learner-mfu)")
    for flag in ("cold_start_s", "prewarm_idle_s"):
        need(0 <= getattr(args, flag) < math.inf, f"--{flag.replace('_', '-')}", getattr(args, flag),
             "must be a finite number of seconds >= 0")
    need(args.max_new_tokens is None or 1 <= args.max_new_tokens <= MAX_TOKENS, "--max-new-tokens",
         args.max_new_tokens, f"must be in [1, {MAX_TOKENS}] tokens (the generation cap the traces were made with)")
    need(args.colocated_actors is None or args.colocated_actors >= 1, "--colocated-actors", args.colocated_actors,
         "must be >= 1 (1 = actor 0 alone)")


def check_fits(policy: Policy, model: ClusterModel, source: str = "--policy") -> None:
    """ValueError naming where ``policy`` came from (``source``: ``--policy``, the default
    policy list, ``--frontier``'s baseline) when its fixed fan-out (``static:N``,
    ``round-robin:N``, ``no-scale[:N]``) needs more actors than the modelled cluster holds: the
    plan would hold more GPUs than there are."""
    n, most = policy.scaling.num_actors, model.max_actors
    if n is not None and n > most:
        hint = " (pass --policy to choose)" if source == "default policy" else ""
        raise ValueError(f"{source} {policy.name!r}{hint}: {n} actors of --gpus-per-actor {model.gpus_per_actor} need "
                         f"{n * model.gpus_per_actor} GPUs, but --nodes {model.num_nodes} x --gpus-per-node "
                         f"{model.gpus_per_node} hold {most} such actors; use N <= {most} or raise --nodes")


def _from_identity(args: argparse.Namespace, profile: TpotProfile) -> tuple[str, str]:
    """The model and learner GPU (``MODELS``, ``GPUS`` keys) a profile file's ``identity`` names,
    where ``--model`` / ``--learner-gpu`` do not (qwen2.5-7b, h100 where it names none the
    simulator has a shape for); one warning line on stderr where the file's model or device is
    not the one modelled, as the weights, KV bytes and learner rate would then be another's."""
    ident = profile.identity
    known_model = next((k for k, m in MODELS.items() if ident is not None and m.name == ident.model), None)
    known_gpu = next((k for k, g in GPUS.items() if ident is not None and g.name == ident.device), None)
    model_name, gpu = args.model or known_model or "qwen2.5-7b", args.learner_gpu or known_gpu or "h100"
    if ident is not None and (MODELS[model_name].name != ident.model
                              or (ident.engine == "roofline" and GPUS[gpu].name != ident.device)):
        device = ident.device or "a device it does not state"
        print(f"warning: --profile {args.profile} was measured on {ident.model} ({device}); weights, KV bytes and "
              f"the learner are modelled as {MODELS[model_name].name} on {GPUS[gpu].name}: pass --model and "
              f"--learner-gpu for the profile's own (one of "
              f"{', '.join(MODELS)}; {', '.join(GPUS)})", file=sys.stderr)
    return model_name, gpu


def build_model(args: argparse.Namespace) -> ClusterModel:
    """ClusterModel from parsed arguments (``check_flags``); ValueError on a bad profile; warns of ignored knobs."""
    check_flags(args)
    check_objective(args.objective, args.lam, args.value_of_time, args.time_slack, args.budget_actors)
    if args.profile.startswith("roofline:"):
        profile = parse_roofline_spec(args.profile, args.gpus_per_actor)
        model_name = args.model or args.profile.split(":")[2]
    else:
        profile = TpotProfile.load(args.profile, "--profile")
        model_name, file_gpu = _from_identity(args, profile)
    spec = MODELS[model_name]
    gpu = args.learner_gpu or (args.profile.split(":")[1] if args.profile.startswith("roofline:") else file_gpu)
    learner_gpus = args.learner_gpus or args.gpus_per_node
    rate = args.learner_tokens_per_s or learner_tokens_per_s(GPUS[gpu], spec, learner_gpus, args.learner_mfu)
    args.learner_note = (f"{learner_gpus} GPUs at {args.learner_tokens_per_s:,.0f} tokens/s as given"
                         if args.learner_tokens_per_s
                         else f"{learner_gpus} x {GPUS[gpu].name} at {args.learner_mfu:.0%} MFU, "
                              f"10 x {spec.num_params / 1e9:.2f}B FLOPs per token = {rate:,.0f} tokens/s")
    model = ClusterModel(profile=profile, num_nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                         gpus_per_actor=args.gpus_per_actor, weight_bytes=spec.weight_bytes,
                         kv_bytes_per_token=spec.kv_bytes_per_token, cold_start_s=args.cold_start_s,
                         bandwidth_bytes_per_s=args.bandwidth_gb_per_gpu * 1e9 * args.gpus_per_actor,
                         prewarm_idle_s=args.prewarm_idle_s, lam=args.lam, objective=args.objective,
                         value_of_time_usd_per_s=args.value_of_time, time_slack=args.time_slack,
                         budget_actors=args.budget_actors, cut_threshold=args.cut_threshold,
                         rank_slack=_slack(args.rank_slack), n_min=args.n_min, n_max=args.n_max,
                         colocated_actors=args.colocated_actors, continuation=args.continuation,
                         migration=args.migration, prefer=args.prefer, learner_tokens_per_s=rate,
                         learner_gpus=learner_gpus, first_epoch=args.first_epoch)
    given = {k for k in KNOB_OBJECTIVE if getattr(model, k) != getattr(ClusterModel, k)}  # off the flag's default
    flags = {"objective": "--objective", **{k: "--" + k.removesuffix("_usd_per_s").replace("_", "-") for k in given}}
    sys.stderr.writelines(f"rlhfless simulate: {w}\n" for w in unread_knob_warnings(model.objective, given, flags))
    return model


def format_table(runs: dict[str, PolicyRun], whole_step: bool = False, model: ClusterModel | None = None) -> str:
    """Totals per policy (the generation phases, or the whole steps), with ratios against the
    first static policy when there is one (``-`` and a closing line saying so when there is
    none); the generation table also gives the planner's predicted against replayed phase time
    (median and p90 of the absolute relative error). The whole-step table bills two ways
    (``PolicyRun.summary``): ``actor_gpu_s``, the policy's actors alone, and last
    ``total_gpu_s``, with the learner's GPUs held through every step; ``model`` (the one
    replayed) adds the closing lines that say so and give a hybrid-engine baseline's total."""
    def totals(s: dict) -> tuple[float, float, float, float]:
        """Time (s), GPU-s, the mean idle fraction and the GPU-s with the learner's (0 for the
        generation phases) of the steps or of their generation phases."""
        if whole_step:
            return (s["total_time_s"], s["actor_gpu_seconds"], s["mean_idle_fraction"],
                    s["total_gpu_seconds_with_learner"])
        gen = s["generation"]
        return gen["time_s"], gen["gpu_seconds"], gen["mean_idle_fraction"], 0.0

    summaries = {name: run.summary() for name, run in runs.items()}
    base_name = next((n for n in summaries if n.startswith("static")), None)
    base = totals(summaries[base_name]) if base_name else None
    lines = [f"{'policy':<12} {'time_s':>9} {'actor_gpu_s' if whole_step else 'gpu_s':>11} {'speedup':>8} "
             f"{'actor_cut' if whole_step else 'gpu_s_cut':>9} {'idle':>6} {'plan_ms_p50':>11} {'mean_N':>7}"
             + (f" {'total_gpu_s':>11} {'total_cut':>9}" if whole_step else f" {'pred_err p50/p90':>16}")]
    for name, s in summaries.items():
        time_s, gpu_s, idle, total = totals(s)
        # no baseline, no ratio: a dash rather than nan
        ratios = f"{base[0] / time_s:>7.2f}x {_cut(gpu_s, base[1]):>9.1%}" if base else f"{'-':>8} {'-':>9}"
        mean_n = sum(x["n_actors"] for x in s["steps"]) / len(s["steps"])
        fid = s["fidelity"]
        tail = (f" {total:>11.1f} " + (f"{_cut(total, base[3]):>9.1%}" if base else f"{'-':>9}") if whole_step
                else f" {fid['median_abs_error']:>9.1%}/{fid['p90_abs_error']:<6.1%}")
        lines.append(f"{name:<12} {time_s:>9.1f} {gpu_s:>11.1f} {ratios} "
                     f"{idle:>6.2f} {s['planning_ms_p50']:>11.2f} {mean_n:>7.1f}" + tail)
    if base is None:
        lines.append("(speedup and the cuts compare with the first static:N policy, and --policy names none: "
                     "add one, e.g. --policy static:3)")
    if whole_step and model is not None:
        lines += whole_step_notes(summaries, base_name, model)
    return "\n".join(lines)


def _cut(value: float, base: float) -> float:
    """The fraction ``value`` saves against ``base`` (1 - value / base), 0 where it is under
    the table's 0.05% resolution: a round-off difference would print as "-0.0%"."""
    saved = 1.0 - value / base
    return 0.0 if abs(saved) < 5e-4 else saved


def _product(count: int, seconds: float, total: float) -> str:
    """``count x seconds s = total GPU-s`` with ``seconds`` given to as many decimals as the
    product needs to read right at one decimal (8 x 0.41 s = 3.3, not 8 x 0.4 s = 3.3)."""
    digits = next((d for d in range(1, 7) if f"{count * float(f'{seconds:.{d}f}'):.1f}" == f"{total:.1f}"), 6)
    return f"{count} x {seconds:.{digits}f} s = {total:.1f} GPU-s"


def whole_step_notes(summaries: dict[str, dict], base_name: str | None, model: ClusterModel) -> list[str]:
    """What the whole-step table's GPU-s columns count, and, where the first static policy's
    actors fit on the learner's GPUs, its total as a hybrid engine (the learner's GPUs x its
    step time: its actors add nothing) with each policy's total as a multiple of it."""
    gpus = model.num_learner_gpus
    lines = ["(actor_gpu_s: the policy's actors; static:N is standalone, on GPUs of its own held through the "
             "learner's phases, its weight sync after each step not charged. total_gpu_s: with the learner's "
             f"{gpus} GPUs held through every step, what a policy runs on them counted once)"]
    policy = parse_policy(base_name) if base_name else None
    if policy is None or policy.scaling.num_actors * model.gpus_per_actor > gpus:
        return lines
    hybrid = gpus * summaries[base_name]["total_time_s"]
    shares = ", ".join(f"{name} {s['total_gpu_seconds_with_learner'] / hybrid:.2f}x"
                       for name, s in summaries.items() if name != base_name)
    return lines + [f"(against {base_name} as a hybrid engine, its actors on the learner's GPUs, its total is the "
                    f"learner's alone: {_product(gpus, summaries[base_name]['total_time_s'], hybrid)}; "
                    f"total_gpu_s against that: {shares or 'no other policy'})"]


def bound_report(steps: list, runs: dict[str, PolicyRun], model: ClusterModel) -> dict:
    """The critical-path floors of the generation phases (``bound.phase_floor``: totals and per
    step, s) and, against the first static policy when there is one, the most any plan could
    speed them up (``max_speedup``, and for serverless plans) and the most a plan without cuts
    could within that policy's GPU-s (``bill_bound.capped_time_floor``; None off its grid)."""
    floors = [phase_floor(step, model) for step in steps]
    report = {"time_s": sum(f.time_s for f in floors),
              "serverless_time_s": sum(f.serverless_s for f in floors),
              "serverful_time_s": sum(f.serverful_s for f in floors),
              "steps": [f.time_s for f in floors]}
    # The floor holds only for profiles that meet its conditions (bound.py); a measured one
    # (a loaded or tiny machine: a batch of 2 stepping faster than 1) may not. A policy under the
    # floor shows it, and the bound is then withdrawn rather than contradicting the table.
    under = next(((name, i, s.gen_time_s, f.time_s) for name, run in runs.items()
                  for i, (s, f) in enumerate(zip(run.steps, floors)) if s.gen_time_s < f.time_s * (1 - 1e-9)), None)
    if under is not None:
        name, i, took, floor = under
        report["invalid"] = (f"{name} ran step {i}'s generation in {took:.1f} s, under the floor of {floor:.1f} s: "
                             "the profile breaks the conditions the bound needs (no batch stepping faster than a "
                             "lone sample at the batch's total context, a batch-1 row convex in context; "
                             "flows/simulate/bound.py), as one measured on a loaded or tiny machine can")
        return report
    base = next((name for name in runs if name.startswith("static")), None)
    if base is not None:
        times = [s.gen_time_s for s in runs[base].steps]
        capped = capped_time_floor(steps, model, sum(s.gen_gpu_seconds for s in runs[base].steps))
        report.update(baseline=base, max_speedup=max_speedup(times, [f.time_s for f in floors]),
                      max_speedup_serverless=max_speedup(times, [f.serverless_s for f in floors]),
                      max_speedup_within_bill_no_cut=sum(times) / capped if capped else None)
    return report


def format_bound(report: dict) -> str:
    """``bound_report`` as the text report's lines."""
    if "invalid" in report:
        return f"bound: n/a: {report['invalid']}"
    lines = [f"bound: no plan can run these generation phases in under {report['time_s']:.1f} s "
             f"(serverless plans {report['serverless_time_s']:.1f} s): the longest sample of each "
             "step started as early and decoded as fast (alone) as the replay allows"]
    if "baseline" in report:
        base, capped = report["baseline"], report["max_speedup_within_bill_no_cut"]
        lines.append(f"bound: max speed-up any plan could reach over {base}: {report['max_speedup']:.3f}x "
                     f"(serverless plans {report['max_speedup_serverless']:.3f}x); within {base}'s "
                     "GPU-s, plans without cut-and-migrate: "
                     + (f"{capped:.3f}x" if capped else "n/a (the profile's grid does not cover the trace)"))
    return "\n".join(lines)


FRONTIER = {"budget": ("budget_actors", (1, 2, 3, 4, 6, 8)),
            "value": ("value_of_time_usd_per_s", (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 1e3)),
            "slack": ("time_slack", (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)),
            "paper": ("lam", (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0))}
"""Per objective: the ``ClusterModel`` field the frontier varies and its values."""
KNOB_LABELS = {"value_of_time_usd_per_s": "value_of_time_gpu_s_per_s"}
"""The frontier's name of a knob where the field's is not its unit: the simulator prices a
GPU-second at 1, so a value of time is GPU-seconds per second of phase time (``--value-of-time``)."""


def frontier(steps: list, model: ClusterModel, max_new_tokens: int | None = None) -> dict:
    """rlhfless against static:3 over the objective's knob (``FRONTIER``; named in the report
    by its ``KNOB_LABELS`` label where it has one): per knob value, the generation-only and
    whole-step time and GPU-s ratios (< 1 is faster or cheaper; the whole step's GPU-s of the
    actors, ``step_gpu_seconds``, and with the learner's, ``step_gpu_seconds_with_learner``:
    ``PolicyRun.summary``) and rlhfless's mean actor count; ``max_new_tokens`` as ``replay``'s."""
    field, values = FRONTIER[model.objective]
    label = KNOB_LABELS.get(field, field)
    rows = []
    for value in values:
        runs = replay(steps, ["static:3", "rlhfless"], replace(model, **{field: value}),
                      max_new_tokens=max_new_tokens)
        base, ours = runs["static:3"].summary(), runs["rlhfless"].summary()
        rows.append({label: value,
                     "gen_time": ours["generation"]["time_s"] / base["generation"]["time_s"],
                     "gen_gpu_seconds": ours["generation"]["gpu_seconds"] / base["generation"]["gpu_seconds"],
                     "step_time": ours["total_time_s"] / base["total_time_s"],
                     "step_gpu_seconds": ours["actor_gpu_seconds"] / base["actor_gpu_seconds"],
                     "step_gpu_seconds_with_learner": (ours["total_gpu_seconds_with_learner"]
                                                       / base["total_gpu_seconds_with_learner"]),
                     "mean_n": sum(runs["rlhfless"].planned) / len(runs["rlhfless"].planned)})
    return {"objective": model.objective, "knob": label, "baseline": "static:3", "rows": rows}


def format_frontier(report: dict) -> str:
    """``frontier``'s report as the text report's table."""
    field = report["knob"]
    lines = [f"{field:>24} {'gen time':>9} {'gen GPU-s':>10} {'step time':>10} {'step actor GPU-s':>17} "
             f"{'step total GPU-s':>17} {'mean_N':>7}"]
    for r in report["rows"]:
        lines.append(f"{r[field]:>24g} {r['gen_time']:>8.3f}x {r['gen_gpu_seconds']:>9.3f}x "
                     f"{r['step_time']:>9.3f}x {r['step_gpu_seconds']:>16.3f}x "
                     f"{r['step_gpu_seconds_with_learner']:>16.3f}x {r['mean_n']:>7.1f}")
    return "\n".join(lines)


def report_keys(traces: Sequence[str]) -> list[str]:
    """The JSON report's key of each trace: its path, with ``#2``, ``#3``... on a path given
    again, so every report is kept."""
    return unique_names(list(traces), "#")


def run(args: argparse.Namespace) -> int:
    """The command: every input checked before the first trace is simulated; one line on stderr
    and 2 for bad input (``ValueError``, ``OSError``)."""
    try:
        return _simulate(args)
    except (ValueError, OSError) as exc:
        print(f"rlhfless simulate: {exc}", file=sys.stderr)
        return 2


def check_inputs(traces: Sequence[str], names: Sequence[str]) -> None:
    """ValueError naming the flag and the value: a ``--trace`` that is not a file (the main
    CLI's wording), a ``--policy`` given twice (the runs are keyed by name: a second one would
    be added to the first's totals) or not a policy (``parse_policy``)."""
    for trace in traces:
        if not Path(trace).is_file():
            raise ValueError(f"--trace {trace!r} is not a file; pass a JSONL length trace")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"--policy {name!r} given twice; name each policy once")
        seen.add(name)
        parse_policy(name)


def _simulate(args: argparse.Namespace) -> int:
    names = list(args.policies or DEFAULT_POLICIES)
    check_inputs(args.traces, names)
    model = build_model(args)
    for name in names:
        check_fits(parse_policy(name), model, "--policy" if args.policies else "default policy")
    if args.frontier:
        check_fits(parse_policy("static:3"), model, "--frontier's baseline")
    plots = plot_paths(args.plot, args.traces) if args.plot else [None] * len(args.traces)
    keys = report_keys(args.traces)
    traces = [(path, read_trace(path)) for path in args.traces]
    reports = [(path, steps, replay(steps, names, model, max_new_tokens=args.max_new_tokens))
               for path, steps in traces]
    out = {}
    for key, plot, (path, steps, runs) in zip(keys, plots, reports):
        summaries = {name: r.summary() for name, r in runs.items()}
        bound = bound_report(steps, runs, model)
        out[key] = {"policies": summaries, "generation_floor": bound}
        if args.frontier:
            out[key]["frontier"] = frontier(steps, model, args.max_new_tokens)
        if not args.json:
            print(f"== {path}: {len(steps)} steps")
            print("generation only:")
            print(format_table(runs))
            print(format_bound(bound))
            print(f"whole step (learner: {args.learner_note}):")
            print(format_table(runs, whole_step=True, model=model))
            if args.frontier:
                print(f"frontier of objective {model.objective!r} (rlhfless / static:3):")
                print(format_frontier(out[key]["frontier"]))
        if plot is not None:
            from flows.simulate.plot import plot_runs

            plot_runs(summaries, plot, title=str(path))
            # stderr: the --json report on stdout stays one JSON document
            print(f"rlhfless simulate: wrote {plot} (plot of {path})", file=sys.stderr)
    if args.json:
        print(json.dumps(out[keys[0]] if len(keys) == 1 else {"traces": out}, indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlhfless simulate", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
