"""``history``: draft from the same prompt's responses in earlier epochs.

RLHF samples every prompt again each epoch, and a policy that has learnt a task answers a
prompt much as it did last time. Each row is matched against its prompt's stored responses
(``flows/drafts.py``), each prefixed by a start marker, with an n-gram index over all of them:
the query is the marker + the row's response so far, so early in a response the match is
aligned with the start of an old response and later it follows whichever old response shares
the last few tokens. The prompt itself is not indexed (``prompt_lookup`` covers it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from actions.engines.drafters.base import NgramIndex

_START = -1  # never a token id
_END = -2  # separates stored responses, so a draft never runs from one into the next


class HistoryDrafter:
    name = "history"

    def __init__(self, responses: Mapping[int, Sequence[Sequence[int]]], min_n: int = 1, max_n: int = 4) -> None:
        """``responses``: prompt_id -> earlier responses (token lists, EOS excluded)."""
        self.min_n, self.max_n = min_n, max_n
        self._indexes: dict[int, NgramIndex] = {}
        for pid, resps in responses.items():
            if resps:
                index = NgramIndex(min_n, max_n)
                for r in resps:
                    index.append([_START, *r, _END])
                self._indexes[int(pid)] = index
        self._rows: dict[int, tuple[NgramIndex | None, list[int]]] = {}

    def start(self, row: int, prompt_id: int, prompt: Sequence[int], response: Sequence[int]) -> None:
        self._rows[row] = (self._indexes.get(int(prompt_id)), [_START, *response])

    def extend(self, row: int, tokens: Sequence[int]) -> None:
        self._rows[row][1].extend(tokens)

    def propose(self, row: int, k: int) -> list[int]:
        index, query = self._rows[row]
        if index is None or k <= 0:
            return []
        pos = index.lookup(query[-self.max_n:])
        if pos is None:
            return []
        out = index.tokens[pos:pos + k]
        if _END in out:
            out = out[:out.index(_END)]
        return out
