"""What a campaign shows of itself: the progress line, Prefect artifacts, TensorBoard scalars
and the JSON summary.

:class:`Reporter` is the one object the campaign loop tells about a committed step; the
artifacts go through the background queue (``flows/campaign/overhead.py``), off the step's
critical path, the scalars and the progress line at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from flows.campaign.artifacts import publish_step_artifacts, start_progress, update_progress
from flows.campaign.learning_warnings import new_warning_lines
from flows.campaign.overhead import Background
from flows.campaign.state import SPEND_PARTS, CampaignState
from flows.campaign.trackers import RunEnd, Trackers
from flows.config import CampaignConfig
from flows.planning.record import StepRecord
from flows.step.metrics import StepFigures, billing, engine_totals, planner_fidelity

Progress = Callable[[str], None]


class Reporter:
    """Reports of one campaign run: open before its first step, :meth:`close` at its end."""

    def __init__(self, cfg: CampaignConfig, run_id: str, publisher: Background, progress: Progress,
                 tracker_key: str = "") -> None:
        self.run_id, self.total, self.publisher, self.progress = run_id, cfg.steps, publisher, progress
        self.algorithm = cfg.algorithm.name  # which learning warnings apply
        self.mask_truncated = cfg.algorithm.mask_truncated  # and what they advise
        self.unit = billing(cfg.invoker.kind)["unit"]  # what billed time is on this invoker
        # observability.report_to: TensorBoard, wandb, MLflow, trackio; runs keyed by the campaign
        self.board = Trackers.open(cfg, run_id, tracker_key)
        self.progress_id: Any = None

    def start(self, done: int) -> None:
        """The campaign's progress artifact, at ``done`` committed steps."""
        self.progress_id = start_progress(self.run_id, done, self.total)

    def committed(self, state: CampaignState, record: StepRecord) -> None:
        """The step ``record`` was committed as ``state``: queue its artifacts, write its
        scalars, print its line."""
        self.publisher.submit(_publish, self.run_id, list(state.steps), list(state.evals), self.progress_id,
                              state.step, self.total, self.unit)
        self.board.add_step(state.step, dict(record.metrics), state.evals)
        self.progress(progress_line(state, StepFigures.of(record.metrics), self.total))
        # a run that cannot learn says so
        for line in new_warning_lines(state.steps, self.total, self.algorithm, self.mask_truncated):
            self.progress(line)

    def close(self, failure: BaseException | None = None) -> None:
        """End the trackers' runs: finished, or as ``failure`` (the exception that ended the
        campaign) makes it failed or killed; a tracker's own failure to end is then only
        logged, so it does not replace the campaign's."""
        self.board.close(RunEnd.of(failure), quiet=failure is not None)


def _publish(run_id: str, steps: list[dict[str, Any]], evals: list[Any], progress_id: Any,
             done: int, total: int, unit: str) -> None:
    publish_step_artifacts(run_id, steps, evals, unit)
    update_progress(progress_id, run_id, done, total)


PROGRESS_PHASES = ("plan", "prefill", "generate", "score", "train", "overhead", "commit")


def progress_line(state: CampaignState, last: StepFigures, total: int, width: int = 20) -> str:
    """A text progress bar for the campaign plus the phases of the step just finished (``last``)."""
    done = int(width * state.step / max(1, total))
    phases = " ".join(f"{p} {last.timing_s[p]:.1f}s" for p in PROGRESS_PHASES)
    acc = f" | eval acc {state.evals[-1].accuracy:.3f}" if state.evals and state.evals[-1].step == state.step else ""
    return (f"[{'#' * done}{'.' * (width - done)}] step {state.step}/{total} | {phases} | "
            f"actions {last.num_actors} migrated {last.migrated} | "
            f"reward {last.reward_mean:.3f} len {last.response_length_mean:.1f}{acc}")


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None, so it is strict JSON (null):
    what the commit records hold for the same number (pydantic writes them so) and ``rlhfless
    status`` shows. A tuple becomes a list.

    >>> json_safe({"grad_norm": float("nan"), "kl": [0.5, float("inf")], "n": 3})
    {'grad_norm': None, 'kl': [0.5, None], 'n': 3}
    """
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def summarize(state: CampaignState, wall: float, wall_total: float | None = None, **extra: Any) -> dict[str, Any]:
    """The campaign's JSON summary (README, The CLI), with the entries of ``extra`` added;
    strict JSON: a metric that is NaN or infinite is null (:func:`json_safe`). ``wall``: this
    process's seconds on the run; ``wall_total``: every process's, resumes included (default:
    what ``state`` committed, ``spend["wall_seconds"]``)."""
    steps = [{k: v for k, v in s.items() if k != "plan"} for s in state.steps]
    return json_safe({
        "run_id": state.run_id,
        "steps_completed": state.step,
        "eval_accuracy_first": state.evals[0].accuracy if state.evals else None,
        "eval_accuracy_last": state.evals[-1].accuracy if state.evals else None,
        "eval_reward_mean_first": state.evals[0].reward_mean if state.evals else None,
        "eval_reward_mean_last": state.evals[-1].reward_mean if state.evals else None,
        "reward_mean_first": StepFigures.of(steps[0]).reward_mean if steps else None,
        "reward_mean_last": StepFigures.of(steps[-1]).reward_mean if steps else None,
        # every activation the campaign invoked through its invoker (README, Billing), and by part
        "billed_gpu_seconds": state.spend["billed_gpu_seconds"],
        "useful_gpu_seconds": state.spend["useful_gpu_seconds"],
        "usd": state.spend["usd"],
        "billed_gpu_seconds_by_part": {part: state.spend[f"{part}_billed_gpu_seconds"] for part in SPEND_PARTS},
        "spend_since_step": state.spend_since_step,
        "wall_seconds": wall,  # this process's: `train --resume` starts it again
        "wall_seconds_total": state.spend["wall_seconds"] if wall_total is None else wall_total,
        "policy_version": state.policy_version,
        "data": state.prepared.data,
        "weights_sha256": state.weights_sha256,
        "stopped_reason": state.stopped_reason,
        "length_history": state.length_history,  # per prompt: [epoch, longest response of its group]
        "evals": [e.model_dump(mode="json") for e in state.evals],
        "planner_fidelity": planner_fidelity(steps),
        "engine": engine_totals(steps, state.evals),
        "steps": steps,
        **extra,
    })


def evaluation_line(summary: dict[str, Any]) -> str:
    """The summary's evaluation in one line, as ``train`` prints it and the report writes it:
    accuracy and mean reward at the first and last evaluation, and how many eval prompts are
    also training prompts where any are (``data.eval.in_train``: an eval set that is not
    held out, as the ``repeat`` task's, whose 140 questions training draws almost all of)."""
    if not summary.get("evals"):
        return "no evaluation (no data.eval_path nor data.eval_fraction)"
    evals = summary["evals"]
    shared = ((summary.get("data") or {}).get("eval") or {}).get("in_train")
    note = f" ({shared} of {evals[0]['num_prompts']} eval prompts are training prompts)" if shared else ""
    first, last = (_figure(summary.get(f"eval_accuracy_{end}")) for end in ("first", "last"))
    reward_first, reward_last = (_figure(summary.get(f"eval_reward_mean_{end}")) for end in ("first", "last"))
    return f"eval accuracy {first} -> {last}, mean reward {reward_first} -> {reward_last}{note}"


def _figure(value: float | None) -> str:
    """Three decimals; ``nan`` for None (a summary holds a NaN as null)."""
    return format(float("nan") if value is None else value, ".3f")
