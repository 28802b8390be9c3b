"""``train --resume`` of a run with nothing left to do: print its status, write nothing.

A run whose committed steps already reach ``steps``, or whose budget stops it before its next
step, would otherwise start Prefect and the workers, evaluate nothing and write its summary
again (with a new wall time and a stop reason its store does not hold). The check only
reads the store; a run made with another configuration is left to ``check_resume`` to refuse.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flows.campaign.state import CampaignState
    from flows.config import CampaignConfig


def finished_run_line(cfg: CampaignConfig, summary_path: Path) -> tuple[str, str | None, dict[str, float]] | None:
    """One status line when the configured run is complete, or its budget cannot pay for the
    next step (``budget.resume_stop``), with that stop's reason (None for a complete run) and
    the run's committed spend (``CampaignState.spend``); None when there is work to do.

    A run whose lease is still there did not end cleanly (its process died, perhaps in the
    middle of a garbage collection after its last commit): that is work left, which the
    normal resume does (take the lease over, finish the collection, write the summary). So is
    a summary at ``summary_path`` that is missing or not of the last commit (a process that
    committed and failed before writing it)."""
    from actions.store import open_store
    from flows.campaign.budget import resume_stop
    from flows.campaign.lease import read_lease
    from flows.campaign.resume_setup import observed_setup_s
    from flows.campaign.state import CampaignRefused, check_resume, load_state

    store = open_store(cfg.store.uri)
    state = load_state(store, cfg.resolved_run_id())
    stop = (resume_stop(cfg, state, observed_setup_s(store, state.run_id, state.step))
            if state is not None and state.step < cfg.steps else None)
    if state is None or (state.step < cfg.steps and stop is None):
        return None
    try:
        check_resume(state, cfg, True, store)  # a reward model path spelled otherwise is the same run
    except CampaignRefused:
        return None
    if read_lease(store, state.run_id) is not None or not _summary_of(summary_path, state):
        return None
    acc = (f"; eval accuracy {state.evals[0].accuracy:.3f} -> {state.evals[-1].accuracy:.3f}"
           if state.evals else "")
    if stop is not None:
        return (f"run {state.run_id!r} stops before its next step: {state.step}/{cfg.steps} steps committed, "
                f"{stop}; nothing to resume, nothing written (raise the budget to train further)"), stop, state.spend
    return (f"run {state.run_id!r} is complete: {state.step}/{cfg.steps} steps committed, policy version "
            f"{state.policy_version}, weights_sha256 {state.weights_sha256[:12] or '-'}{acc}; nothing to resume, "
            f"nothing written (pass --steps N with N > {state.step} to train further)"), None, state.spend


def _summary_of(path: Path, state: CampaignState) -> bool:
    """Whether ``path`` holds the summary of ``state``'s commit (run, steps and weights)."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    held = {"run_id": state.run_id, "steps_completed": state.step, "weights_sha256": state.weights_sha256}
    return isinstance(summary, dict) and all(summary.get(k) == v for k, v in held.items())
