"""Per-step time and GPU cost of each simulated policy as one PNG (matplotlib, Agg backend),
and where ``rlhfless simulate --plot`` writes each trace's plot."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Mapping, Sequence


def plot_runs(summaries: Mapping[str, dict], path: str | Path, title: str = "") -> None:
    """Two panels (step time in s, the actors' GPU-seconds) per step, one line per policy.

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
    # the summary's per-step figures are the modelled step's: the learner's phases included
    # where the model has them, the GPU-s of the policy's actors alone (the learner's apart)
    ax_time.set(xlabel="training step", ylabel="step time (s)", title="time per step")
    ax_cost.set(xlabel="training step", ylabel="actors' GPU-seconds", title="cost per step")
    for ax in (ax_time, ax_cost):
        ax.grid(alpha=0.3)
    ax_cost.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=120)
    plt.close(fig)


PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def plot_paths(plot: str, traces: Sequence[str]) -> list[Path]:
    """Where each trace's plot goes: ``plot`` for one trace, else ``<plot stem>-<trace stem>``
    with ``-2``, ``-3``... added where trace file names repeat, so no plot overwrites another.

    Raises:
        ValueError: naming ``--plot`` when the suffix is not one of ``PLOT_SUFFIXES``, a path
            is a directory, its folder does not exist or cannot be written, or matplotlib is
            missing: checked before any trace is simulated.
    """
    path = Path(plot)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError(f"--plot {plot!r}: name a file ending in {', '.join(PLOT_SUFFIXES)}")
    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError(f"--plot {plot!r}: matplotlib is not installed; pip install matplotlib, or drop --plot")
    folder = path.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--plot {plot!r}: the folder {str(folder)!r} does not exist or cannot be written; "
                         "create it or pick another path")
    if len(traces) == 1:
        paths = [path]
    else:
        tags = unique_names([Path(trace).stem for trace in traces], "-")
        paths = [folder / f"{path.stem}-{tag}{path.suffix}" for tag in tags]
    for p in paths:
        if p.is_dir():
            raise ValueError(f"--plot {plot!r}: {str(p)!r} is a directory; pass a file path")
    return paths


def unique_names(names: list[str], sep: str) -> list[str]:
    """``names`` made distinct: a name already taken gets ``sep`` and the first free number
    from 2 (so ``a``, ``a-2``, ``a`` give ``a``, ``a-2``, ``a-3``).

    >>> unique_names(["a", "a-2", "a"], "-")
    ['a', 'a-2', 'a-3']
    """
    taken: set[str] = set()
    out = []
    for name in names:
        new, n = name, 1
        while new in taken:
            n += 1
            new = f"{name}{sep}{n}"
        taken.add(new)
        out.append(new)
    return out
