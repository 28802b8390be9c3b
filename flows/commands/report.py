"""The run directory's report: ``report.md`` plus PNG plots a CLI user can open.

Plots (matplotlib, Agg backend, axes labelled with units): reward and eval accuracy per
step, response length per step, a histogram of response lengths per prompt (the long tail the
planner sizes the fan-out for), fan-out decisions, and cost per step.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib

from flows.campaign.data_line import data_line
from flows.campaign.reporting import evaluation_line
from flows.step.metrics import PHASES, StepFigures, billing

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def _plot(path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, tuple[list, list]],
          kind: str = "line") -> None:
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    for label, (xs, ys) in series.items():
        if kind == "bar":
            ax.bar(xs, ys, label=label)
            # steps or token counts along x; counts (actions, prompts) up the y axis
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        else:
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def length_histogram(summary: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(lengths, number of prompts) over each prompt's latest observed group maximum, the
    length the planner ranks prompts by (``length_history`` of the summary; empty if absent)."""
    observations = summary.get("length_history", {}).get("observations", {})
    counts = Counter(int(entries[-1][1]) for entries in observations.values() if entries)
    xs = sorted(counts)
    return xs, [counts[x] for x in xs]


def planner_lines(summary: dict[str, Any]) -> list[str]:
    """The planner's inputs and how its predicted generation-phase time (prefill + generation
    actions) compared with the measured one."""
    lines = []
    profile = summary.get("profile")
    if profile:
        lines.append(f"- planner profile: {profile['source']} `{profile['name']}`"
                     + (f" (store key `{profile['key']}`)" if profile.get("key") else "")
                     + f"; store reads {profile['store_read_bytes_per_s'] / 1e6:.0f} MB/s, weights "
                     f"{profile['weight_bytes'] / 1e6:.2f} MB, KV {profile['kv_bytes_per_token']:.0f} B/token, "
                     f"activation round trip {profile['activation_s'] * 1e3:.0f} ms")
    names = {"generate": "generation actions", "prefill": "prefill", "phase": "whole phase"}
    fidelity = summary.get("planner_fidelity") or {}
    order = list(PHASES) + sorted(set(fidelity) - set(PHASES))  # PHASES' order: a summary read back has sorted keys
    for part, fid in ((p, fidelity[p]) for p in order if p in fidelity):
        if part == "lengths":
            if fid.get("steps"):
                lines.append(f"- the length predictor's part: the generation actions' prediction against itself redone "
                             f"at the lengths observed, median relative error {fid['median_relative_error']:+.1%} "
                             f"over {fid['steps']} steps (the rest is speed, which the calibration learns)")
            continue
        if fid.get("steps"):
            lines.append(f"- predicted vs measured {names.get(part, part)} time over {fid['steps']} steps: median "
                         f"relative error {fid['median_relative_error']:+.1%} (median |error| "
                         f"{fid['median_abs_relative_error']:.1%}, 90th percentile {fid['p90_abs_relative_error']:.1%})")
    return lines


def _nan_for_null(values: dict[str, Any]) -> dict[str, Any]:
    """A summary entry whose nulls (NaN or infinite numbers: ``json_safe``) read as NaN again,
    which the tables print as ``nan`` and the plots leave out."""
    return {k: math.nan if v is None else v for k, v in values.items()}


def _by_part(summary: dict[str, Any]) -> str:
    """``; steps 3.1, evaluations 0.4, set-up 2.2`` of billed time (summaries from before the
    breakdown: ""), with the step from which evaluations and set-up are counted, when not 0."""
    parts = summary.get("billed_gpu_seconds_by_part")
    if not parts:
        return ""
    since = summary.get("spend_since_step") or 0
    note = f" (evaluations and set-up counted from step {since} on)" if since else ""
    return (f"; steps {parts['steps']:.1f}, evaluations {parts['evaluations']:.1f}, "
            f"set-up {parts['setup']:.1f}{note}")


def _wall(summary: dict[str, Any]) -> str:
    """``95 s in all, 40 s in this session`` (a resumed run), ``40 s`` (one session, or a
    summary from before the total was kept)."""
    total, session = summary.get("wall_seconds_total"), summary["wall_seconds"]
    if total is None or round(total) == round(session):
        return f"{session:.0f} s"
    since = summary.get("spend_since_step") or 0
    return (f"{total:.0f} s in all{f' from step {since} on' if since else ''}, "
            f"{session:.0f} s in this session")


def write_report(summary: dict[str, Any], out: Path) -> list[Path]:
    """Write ``report.md`` and the plots into ``out``; returns the files written."""
    steps = [StepFigures.of(_nan_for_null(s)) for s in summary["steps"]]
    evals = [_nan_for_null(e) for e in summary["evals"]]
    xs = [s.step + 1 for s in steps]
    files = []
    # billed_gpu_seconds is GPU-seconds only on OpenWhisk; locally it is action wall time.
    bill = summary.get("billing") or billing("local")
    unit, meaning = bill["unit"], bill["meaning"]  # by name: a summary read back has its keys sorted
    plots = {
        "reward.png": ("Reward and eval accuracy", "step", "reward (its own scale); accuracy (0-1)",
                       {"mean reward (training samples)": (xs, [s.reward_mean for s in steps]),
                        "eval greedy accuracy": ([e["step"] for e in evals], [e["accuracy"] for e in evals])},
                       "line"),
        "response_length.png": ("Response length", "step", "tokens",
                                {"mean": (xs, [s.response_length_mean for s in steps]),
                                 "max": (xs, [s.response_length_max for s in steps])}, "line"),
        "response_length_hist.png": ("Longest response per prompt group (latest epoch)", "tokens", "prompts",
                                     {"prompts": length_histogram(summary)}, "bar"),
        "fanout.png": ("Generation fan-out chosen by the planner", "step", "generation actions",
                       {"actions": (xs, [s.num_actors for s in steps])}, "bar"),
        "cost.png": ("Cost per step", "step", f"billed {unit}",
                     {"billed": (xs, [s.billed_gpu_seconds for s in steps]),
                      "useful": (xs, [s.useful_gpu_seconds for s in steps])}, "line"),
    }
    if steps:
        for name, (title, xl, yl, series, kind) in plots.items():
            _plot(out / name, title, xl, yl, series, kind)
            files.append(out / name)
    lines = [f"# Run {summary['run_id']}", "",
             f"- steps completed: {summary['steps_completed']}",
             *([f"- {data_line(summary['data'])}"] if summary.get("data") else []),
             f"- {evaluation_line(summary)}",
             f"- billed {unit}: {summary['billed_gpu_seconds']:.1f} (useful {summary['useful_gpu_seconds']:.1f}),"
             f" cost ${summary['usd']:.4f} at price_per_gpu_second{_by_part(summary)}",
             f"- billing: {meaning}",
             f"- wall time: {_wall(summary)}; policy version {summary['policy_version']}",
             f"- weights sha256: `{summary['weights_sha256']}`"]
    if summary.get("stopped_reason"):
        lines.append(f"- stopped early: {summary['stopped_reason']}")
    lines += planner_lines(summary)
    lines += ["", f"| step | reward | length | actions | migrated | billed {unit} | step s | generation s predicted | "
              "generation s measured |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {x} | {s.reward_mean:.3f} | {s.response_length_mean:.1f} | {s.num_actors} | "
              f"{s.migrated} | {s.billed_gpu_seconds:.2f} | {s.timing_s['step']:.2f} | "
              f"{s.predicted_generate_s:.3f} | {s.timing_s.get('generate', float('nan')):.3f} |"
              for x, s in zip(xs, steps)]
    lines += [""] + [f"![{p.stem}]({p.name})" for p in files]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return [out / "report.md", *files]


def redraw_missing_report(summary_path: Path, out: Path) -> Path | None:
    """``out/report.md`` (and its plots) drawn again from the summary at ``summary_path`` where
    it is missing, as after a stop between the summary's write and the report's: a resume with
    nothing to train writes nothing else. Returns the report's path; None where it is there,
    or the summary or the plotting library is not."""
    if (out / "report.md").is_file():
        return None
    try:
        summary = json.loads(summary_path.read_text())
        return write_report(summary, out)[0] if isinstance(summary, dict) else None
    except (OSError, ValueError, ImportError):
        return None
