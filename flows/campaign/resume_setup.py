"""What a resume's set-up cost, kept where a resume that stops after paying it can leave it.

A resume judges its budget before it pays its set-up (the profile action and the round-trip
probes), with the cost the last commit recorded (``CampaignState.resume_setup_s``). A new run
records what those cost on its warm workers; a resume starts cold ones, and pays more (on this
project's CPU machine 4-5 s against 0.1 s). Where the budget then stops the resume before its
first step, nothing is committed (commit records are create-once per step), so the next resume
would pay and stop again. Each resume therefore writes what its set-up cost to
``runs/<run>/campaign/resume_setup.json`` (``{"step": N, "billed_s": S}``, overwritten), and a
resume from the same committed step counts the larger of that and the committed estimate.
"""

from __future__ import annotations

import json

from actions.store import ObjectNotFound, ObjectStore
from flows.campaign.state import pointer_key


def setup_key(run_id: str) -> str:
    return f"{pointer_key(run_id)}/resume_setup.json"


def observed_setup_s(store: ObjectStore, run_id: str, step: int) -> float | None:
    """What the last resume from committed ``step`` paid for its set-up, or None (none was
    recorded at this step, or the record is unreadable: the committed estimate stands)."""
    try:
        record = json.loads(store.get(setup_key(run_id)))
    except (ObjectNotFound, ValueError):
        return None
    if not isinstance(record, dict) or record.get("step") != step:
        return None
    billed = record.get("billed_s")
    return float(billed) if isinstance(billed, (int, float)) and billed >= 0 else None


def record_setup(store: ObjectStore, run_id: str, step: int, billed_s: float) -> None:
    """Keep what a resume from committed ``step`` paid for its set-up (``observed_setup_s``)."""
    store.put(setup_key(run_id), json.dumps({"step": step, "billed_s": billed_s}).encode())
