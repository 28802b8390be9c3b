"""Prefect artifacts for each committed step: metrics table, planner candidates, a report,
and one progress artifact per campaign run (updated in place after every commit).

Artifacts appear in the Prefect UI next to the campaign's flow run. Keys may hold only
lowercase letters, digits and dashes, so the run id is slugged. Outside a flow run (library
use, unit tests) nothing is published.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from flows.step.metrics import (
    ACTORS_MIGRATED,
    ACTORS_N,
    BILLED,
    RESPONSE_LENGTH_MEAN,
    REWARD_MEAN,
    USD,
    StepFigures,
    timing_key,
)

if TYPE_CHECKING:
    from flows.campaign.state import EvalRecord

TABLE_METRICS = (REWARD_MEAN, RESPONSE_LENGTH_MEAN, ACTORS_N, ACTORS_MIGRATED, BILLED, USD, timing_key("step"), "kl",
                 "loss/policy")  # the last two: the train action's names


TABLE_ROWS = 200
"""Steps in the metrics table: the latest ones. Prefect keeps every version of a keyed artifact,
so a table of every step, published after every step, would grow its database with the square
of the run's length; the whole history is in the run's summary and trackers. Each new version
of the table replaces the one before (``_replace_table``): 200 rows a step were still 49 KB of
Prefect's database a step, 0.5 GB over 10,000 steps."""

_tables: dict[tuple[UUID, str], UUID] = {}
"""The metrics table version published last, by (flow run, artifact key): a flow run replaces
only its own versions (two runs whose ids slug alike, or a resume, in one process keep theirs)."""


def slug(run_id: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-") or "run"


PLAN_COLUMNS = ("n", "kind", "time_s", "gpu_seconds", "score", "feasible", "reason")
"""The plan table's columns after ``chosen``: ``kind`` tells apart candidates of one fan-out
(ranked, round_robin, contiguous, sized: ``plan.Candidate.kind``)."""


def plan_rows(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan artifact's rows: each candidate of a step's ``plan`` (its ``to_dict``), the
    chosen one marked; a record of an earlier revision lacks ``kind`` (empty)."""
    return [{"chosen": i == plan.get("chosen"), **{k: c.get(k, "") for k in PLAN_COLUMNS}}
            for i, c in enumerate(plan.get("candidates", []))]


def metrics_rows(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The metrics table's rows: each step's ``TABLE_METRICS`` rounded to 5 decimals, blank
    where the step has no such metric (``kl`` where no KL is computed: ``algorithm.kl_coef`` 0),
    never a 0 it did not measure.

    >>> metrics_rows([{"step": 0, "kl": 0.0123456, "loss/policy": -0.5}])[0]["kl"]
    0.01235
    >>> metrics_rows([{"step": 1, "loss/policy": -0.5}])[0]["kl"]
    ''
    """
    return [{"step": int(s["step"]) + 1, **{m: round(float(s[m]), 5) if s.get(m) is not None else ""
                                            for m in TABLE_METRICS}} for s in steps]


def publish_step_artifacts(run_id: str, steps: list[dict[str, Any]], evals: Sequence[EvalRecord],
                           unit: str) -> bool:
    """Publish the artifacts of the latest step; ``unit`` names what billed time is on this
    invoker (``billing(kind)["unit"]``: GPU-seconds on OpenWhisk, action-seconds on this
    machine). Returns False outside a flow run."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return False
    key, last = slug(run_id), steps[-1]
    shown = steps[-TABLE_ROWS:]
    table = create_table_artifact(key=f"{key}-metrics", description=_table_description(len(steps), len(shown)),
                                  table=metrics_rows(shown))
    _replace_table((FlowRunContext.get().flow_run.id, f"{key}-metrics"), table)
    plan = last.get("plan", {})
    create_table_artifact(key=f"{key}-plan", description=f"fan-out candidates, step {int(last['step']) + 1}: "
                                                         f"chose {plan.get('num_actors')} actions ({plan.get('policy')})",
                          table=plan_rows(plan) or [{"n": plan.get("num_actors"), "chosen": True}])
    acc = evals[-1].accuracy if evals else None
    f = StepFigures.of(last)
    create_markdown_artifact(key=f"{key}-report", markdown=(
        f"# {run_id}: step {f.step + 1}\n\n"
        f"- reward {f.reward_mean:.3f}, mean length {f.response_length_mean:.1f} tokens\n"
        f"- {f.num_actors} generation actions, {f.migrated} samples migrated\n"
        f"- billed {f.billed_gpu_seconds:.2f} {unit} (${f.usd:.5f}), step {f.timing_s['step']:.2f} s\n"
        f"- latest eval accuracy: {acc}\n"))
    return True


def _replace_table(key: tuple[UUID, str], new: UUID | None) -> None:
    """Delete the version of table ``key`` (flow run, artifact key) published before ``new``:
    every version holds the latest rows, so only the newest tells anything. Best effort: a
    version left behind costs database space, never the campaign."""
    from prefect.client.orchestration import get_client

    old, _tables[key] = _tables.get(key), new
    if old is None or new is None or old == new:
        return
    try:
        with get_client(sync_client=True) as client:
            client.delete_artifact(old)
    except Exception:  # noqa: BLE001 -- an API that is busy or gone: the next step tries its own
        pass


def _table_description(done: int, shown: int) -> str:
    if shown == done:
        return "per-step metrics"
    return f"per-step metrics of the latest {shown} of {done} steps (every step: the run's summary JSON and trackers)"


def _percent(done: int, total: int) -> float:
    return 100.0 * min(done, total) / total if total > 0 else 100.0


def start_progress(run_id: str, done: int, total: int) -> UUID | None:
    """Create the campaign's progress artifact at ``done`` of ``total`` steps (a resumed run
    starts part-way). Returns its id, or None outside a flow run."""
    from prefect.artifacts import create_progress_artifact
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return None
    return create_progress_artifact(progress=_percent(done, total), key=f"{slug(run_id)}-progress",
                                    description=f"{run_id}: {done}/{total} steps committed")


def update_progress(artifact_id: UUID | None, run_id: str, done: int, total: int) -> None:
    """Move the progress artifact to ``done`` committed steps (no-op without an artifact)."""
    from prefect.artifacts import update_progress_artifact

    if artifact_id is not None:
        update_progress_artifact(artifact_id=artifact_id, progress=_percent(done, total),
                                 description=f"{run_id}: {done}/{total} steps committed")
