"""Campaign state: what one committed step leaves behind, and the commit itself.

A campaign's state is one JSON record per completed step under ``runs/<run_id>/campaign``
(storage.commit_pointer: create-once records plus a latest hint). Record k describes the
campaign after k RL steps: the policy version to continue from, optimizer and critic keys,
the response-length history, every step's metrics, evaluations and spend. Record 0 is written
after set-up and warm-up. A crash before a commit replays the step from the previous record;
every key a step writes is derived from (run, step, shard), so the replay overwrites the
same objects with the same bytes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from actions.common.storage import ObjectStore, commit_pointer, read_pointer


class CampaignState(BaseModel):
    run_id: str
    fingerprint: str
    identity: dict[str, Any]
    step: int = 0
    policy_key: str
    policy_version: int = 0
    reference_key: str
    optimizer_key: str | None = None
    critic_key: str | None = None
    critic_optimizer_key: str | None = None
    prepared: dict[str, Any]
    length_history: dict[str, Any] = {}
    steps: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    weights_sha256: str = ""
    spend: dict[str, float] = {"billed_gpu_seconds": 0.0, "useful_gpu_seconds": 0.0, "usd": 0.0}
    call_history: dict[str, list[float]] = {}
    stopped_reason: str | None = None


def pointer_key(run_id: str) -> str:
    return f"runs/{run_id}/campaign"


def load_state(store: ObjectStore, run_id: str) -> CampaignState | None:
    record = read_pointer(store, pointer_key(run_id))
    return CampaignState.model_validate(record["state"]) if record else None


def commit_state(store: ObjectStore, state: CampaignState) -> str:
    return commit_pointer(store, pointer_key(state.run_id), {"step": state.step, "state": state.model_dump(mode="json")})
