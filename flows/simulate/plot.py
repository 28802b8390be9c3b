"""Per-step time and GPU cost of each simulated policy as one PNG (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping


def plot_runs(summaries: Mapping[str, dict], path: str | Path, title: str = "") -> None:
    """Two panels (phase time in s, GPU-seconds) per step, one line per policy.

    Args:
        summaries: policy name -> ``PolicyRun.summary()`` dict (uses its ``steps``).
        path: PNG file to write.
        title: figure title (e.g. the trace name).
    """
    import matplotlib

    matplotlib.use("Agg")  # headless: never needs a display
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_cost) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for name, summary in summaries.items():
        steps = [s["step"] for s in summary["steps"]]
        ax_time.plot(steps, [s["time_s"] for s in summary["steps"]], marker="o", ms=3,
                     label=name)
        ax_cost.plot(steps, [s["gpu_seconds"] for s in summary["steps"]], marker="o", ms=3,
                     label=name)
    ax_time.set(xlabel="training step", ylabel="generation phase time (s)", title="time per step")
    ax_cost.set(xlabel="training step", ylabel="cost (GPU-seconds)", title="cost per step")
    for ax in (ax_time, ax_cost):
        ax.grid(alpha=0.3)
    ax_cost.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
