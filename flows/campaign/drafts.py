"""The campaign's draft history: earlier epochs' responses for speculative decoding.

After a step's generation the flow copies the finished responses of the step's prompts from
its rollouts into ``<run>/drafts/<step>.json`` (``actions/store/drafts.py``), and the campaign
state's ``draft_index`` maps each prompt to the step holding its latest responses. The next
time a prompt comes round (the next epoch), its generation action reads that object. Drafts
live outside ``steps/``, so garbage collection of old steps leaves them alone; this module
deletes, after each commit, the objects no prompt points to any more, which keeps storage
bounded by the dataset (one epoch's responses per prompt, at most 8 each).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from actions.store import ObjectNotFound, ObjectStore, get_json, put_json
from actions.store.drafts import drafts_from_samples


def drafts_key(prefix: str, step: int) -> str:
    return f"{prefix}/drafts/{step:06d}.json"


def keys_for(prefix: str, index: Mapping[str, int], prompt_ids: Iterable[int]) -> list[str]:
    """The draft objects holding the latest responses of ``prompt_ids``, oldest first."""
    steps = {index[str(p)] for p in prompt_ids if str(p) in index}
    return [drafts_key(prefix, s) for s in sorted(steps)]


def record_drafts(store: ObjectStore, prefix: str, step: int, rollout_keys: Iterable[str],
                  index: Mapping[str, int]) -> dict[str, int]:
    """Write the step's responses as drafts; returns the updated prompt -> step index.
    Rewriting the object on a replayed step gives the same bytes (the same rollouts)."""
    samples: list[dict[str, Any]] = []
    for key in rollout_keys:
        try:
            samples.extend(get_json(store, key).get("samples", []))
        except ObjectNotFound:
            continue
    responses = drafts_from_samples(samples)
    if not responses:
        return dict(index)
    put_json(store, drafts_key(prefix, step), {"step": step, "responses": responses})
    return {**index, **{pid: step for pid in responses}}


def drop_unreferenced(store: ObjectStore, prefix: str, old: Mapping[str, int], new: Mapping[str, int]) -> int:
    """Delete the draft objects ``old`` pointed to and ``new`` does not (after the commit of
    ``new``); returns how many were deleted."""
    gone = set(old.values()) - set(new.values())
    for s in sorted(gone):
        store.delete(drafts_key(prefix, s))
    return len(gone)
