"""Earlier epochs' responses kept as drafts for speculative decoding (``history`` strategy).

One JSON object per step, written by the flow after the step's generation
(``flows/campaign/drafts.py``): ``{"step": s, "responses": {"<prompt_id>": [[token, ...], ...]}}``,
each response with the EOS token that ended it (a draft that ends in EOS lets the engine
finish a row inside a verification round). Storage is bounded: at most
``MAX_RESPONSES_PER_PROMPT`` responses per prompt, and the campaign state keeps, per prompt,
only the step of its latest responses; objects no prompt points to any more are deleted.

Drafts only change speed: a missing or unreadable object means no history drafts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from actions.store import ObjectNotFound, get_json

MAX_RESPONSES_PER_PROMPT = 8

log = logging.getLogger(__name__)


def drafts_from_samples(samples: Iterable[Mapping[str, Any]]) -> dict[str, list[list[int]]]:
    """prompt_id (str) -> its finished responses (tokens + stop token), at most
    ``MAX_RESPONSES_PER_PROMPT``, in sample-index order. ``samples``: rollout sample records."""
    by_prompt: dict[int, list[tuple[int, list[int]]]] = {}
    for s in samples:
        if s.get("finish_reason") == "cut":
            continue
        toks = list(s["tokens"]) + ([s["stop_token"]] if s.get("stop_token") is not None else [])
        by_prompt.setdefault(int(s["prompt_id"]), []).append((int(s["sample_index"]), toks))
    return {str(pid): [t for _, t in sorted(v)[:MAX_RESPONSES_PER_PROMPT]] for pid, v in sorted(by_prompt.items())}


def read_drafts(store: Any, keys: Sequence[str], prompt_ids: Iterable[int]) -> dict[int, list[list[int]]]:
    """prompt_id -> stored responses, for ``prompt_ids``, from the objects ``keys`` (later keys
    win for a prompt in several). Missing objects, objects that are not JSON (a truncated or
    damaged write; one warning line names each) and malformed entries are skipped: they only
    cost the drafts they held."""
    wanted = {int(p) for p in prompt_ids}
    out: dict[int, list[list[int]]] = {}
    for key in keys:
        try:
            obj = get_json(store, key)
        except ObjectNotFound:
            continue
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            log.warning("drafts object %s is not JSON (%s); decoding without its drafts", key, type(exc).__name__)
            continue
        responses = obj.get("responses") if isinstance(obj, dict) else None
        if not isinstance(responses, dict):
            continue
        for pid, resps in responses.items():
            if str(pid).isdigit() and int(pid) in wanted and isinstance(resps, list):
                out[int(pid)] = [[int(t) for t in r] for r in resps
                                 if isinstance(r, list) and all(isinstance(t, int) for t in r)]
    return out
