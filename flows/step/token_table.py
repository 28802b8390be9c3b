"""The prepared token table as the control plane holds it: compact, one row made on demand.

``prepare`` stores every training prompt's token ids and first-epoch length prediction
(``Prepared.tokens_key``, rows of :class:`~actions.contracts.PromptTokens` by prompt id). The
flow needs all of them only as lengths (the profile's grid, ``flows/campaign/live_profile.py``)
and ids for a step's prompts (the planner's prefix sharing, ``flows/step/phase.py``). As
pydantic rows, 200,000 prompts of 60 tokens held ~230 MB (more with a real vocabulary, whose
ids above 256 Python does not share) and took 3.4 s to validate; as one ``array('I')`` per
prompt they take 4 bytes a token and a third of that time (docs/results.md).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import Any

from actions.contracts import PromptTokens
from actions.store.keyed_rows import KeyedRows


class TokenTable(KeyedRows[int, PromptTokens]):
    """Prompt id -> :class:`PromptTokens` of a stored token table (the JSON object ``prepare``
    writes: prompt ids as string keys), a row built when it is asked for.

    Raises:
        ValueError: a row that is not ``{"prompt": [ids >= 0], "answer_len": n >= 0}`` under an
            integer key, naming ``source``, the key and the damage.
    """

    def __init__(self, raw: Mapping[str, Any], source: str) -> None:
        self._rows: dict[int, tuple[array, int]] = {}
        for key, row in raw.items():
            try:
                if not isinstance(row, dict) or set(row) != {"prompt", "answer_len"}:
                    raise ValueError("not an object of prompt and answer_len")
                answer_len = row["answer_len"]
                if type(answer_len) is not int or answer_len < 0:
                    raise ValueError(f"answer_len {answer_len!r} is not a count")
                if not isinstance(row["prompt"], list):
                    raise ValueError("prompt is not a list of token ids")
                # TypeError: an id that is not an integer; OverflowError: below 0 or above 2**32
                self._rows[int(key)] = (array("I", row["prompt"]), answer_len)
            except (ValueError, TypeError, OverflowError) as exc:
                raise ValueError(f"{source}: prompt {key!r}: {exc}; the store's copy of the token table is "
                                 "damaged: restore the store from a copy, or start the run again") from None

    def __getitem__(self, prompt_id: int) -> PromptTokens:
        prompt, answer_len = self._rows[prompt_id]
        return PromptTokens(prompt=prompt.tolist(), answer_len=answer_len)

    def prompt_lengths(self) -> list[int]:
        """Every prompt's length in tokens, in the table's order (no row built)."""
        return [len(prompt) for prompt, _ in self._rows.values()]
