"""The one progress line that says what loading the datasets did (``Prepared.data``, from
``actions/tasks/build.py``): how many prompts each split kept of the rows read, and where
the others went, so rows dropped or changed are seen where the run is watched, not only in
``summary.json``."""

from __future__ import annotations

from typing import Any


def _changes(stats: dict[str, Any], held: int = 0) -> list[str]:
    """What happened to a split's rows, each nonzero count as words."""
    out = []
    if stats.get("duplicates_dropped"):
        out.append(f"{stats['duplicates_dropped']} repeated an earlier row (dropped)")
    if held:
        out.append(f"{held} held out for evaluation (data.eval_fraction)")
    if stats.get("skipped"):
        out.append(f"{stats['skipped']} longer than the prompt limit (skipped: data.long_prompts=skip)")
    if stats.get("truncated"):
        out.append(f"{stats['truncated']} cut to the prompt limit (data.long_prompts=truncate_left)")
    return out


def _split(name: str, stats: dict[str, Any], held: int = 0) -> str:
    rows = stats.get("rows", 0)
    text = f"{rows} {name} prompt{'s' if rows != 1 else ''}"
    changes = _changes(stats, held)
    if changes:
        read = stats.get("rows_read")
        text += f" ({f'of {read} rows read: ' if read else ''}{', '.join(changes)})"
    return text


def data_line(data: dict[str, Any]) -> str:
    """``data: 6 training prompts (of 10 rows read: 4 repeated an earlier row (dropped)); 2 eval
    prompts`` from ``Prepared.data``; a split held out of the training file counts as held there.

    >>> line = data_line({"train": {"rows_read": 10, "duplicates_dropped": 2, "rows": 6},
    ...                   "eval": {"rows": 2, "in_train": 0}, "evaluation": "held_out 0.25 of train_path"})
    >>> line.split(": ", 2)[2].split(", ")
    ['2 repeated an earlier row (dropped)', '2 held out for evaluation (data.eval_fraction)); 2 eval prompts']
    >>> line.split(" (")[0]
    'data: 6 training prompts'
    >>> data_line({"train": {"rows_read": 4, "rows": 4}, "eval": {"rows": 0}, "evaluation": "none"})
    'data: 4 training prompts; no evaluation'
    """
    train, evals = data.get("train") or {}, data.get("eval") or {}
    held_out = str(data.get("evaluation", "")).startswith("held_out")
    line = f"data: {_split('training', train, evals.get('rows', 0) if held_out else 0)}"
    if data.get("evaluation") == "none":
        return line + "; no evaluation"
    in_train = evals.get("in_train") or 0
    return line + f"; {_split('eval', evals)}" + (f", {in_train} of them training prompts too" if in_train else "")
