"""``prompt_lookup``: draft by copying what followed the latest earlier occurrence of the
response's last n tokens in the row's own prompt + response (prompt-lookup decoding, as in
Hugging Face ``prompt_lookup_num_tokens`` and vLLM's ``ngram`` method).

It pays where responses quote their prompts (extraction, editing, code, repetition) and costs
little to keep: a row's tokens are kept twice, as a list and packed as C ints
(``array("i")``, native byte order), and a proposal searches the packing backwards
(``bytearray.rfind``, in C) for the longest suffix n-gram (``max_n`` down to ``min_n``) that has
a token after it. Appending a verification round's tokens is then two extends, where an n-gram
index would insert ``max_n - min_n + 1`` tuples per token: this runs for every row of every
round, between two forwards of the target model. The price is a search that grows with the
row: a suffix with no earlier occurrence scans the whole row, once per n tried. Up to a few
thousand tokens a row that is cheaper than the index's inserts; at tens of thousands it costs
more (per 64-row round, prompt 4096 + response 28000 tokens: 1.7 ms against the index's 0.9 ms
for Zipf-distributed tokens, 9.4 against 1.3 ms for uniform ones), still small beside a
forward over that context.

A draft's kind (``kind``) is its match length and where the copy comes from: ``p`` the prompt
(a quote, e.g. a response's first token matching one letter of the prompt, often wrong) or
``r`` the response itself (the row repeating its own output, e.g. inside a run of repeats,
often right to the end). Their acceptance differs by far, and the selector tracks it per kind.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from actions.engines.drafters.base import overlap_copy

WIDTH = array("i").itemsize
"""Bytes per packed token (a C int: token ids below 2**31)."""


def _pack(tokens: Sequence[int]) -> bytes:
    return array("i", tokens).tobytes()


class _Row:
    __slots__ = ("tokens", "packed", "prompt_len", "last_n", "last_pos")

    def __init__(self, tokens: list[int], packed: bytearray, prompt_len: int) -> None:
        self.tokens, self.packed, self.prompt_len = tokens, packed, prompt_len
        self.last_n, self.last_pos = 0, None  # the last proposal's match length and continuation


def latest_match(packed: bytearray, length: int, n: int) -> int | None:
    """The continuation index of the latest occurrence of the last ``n`` of ``length`` packed
    tokens that has a token after it (so not the suffix itself), or None."""
    pattern = packed[(length - n) * WIDTH:]
    end = (length - 1) * WIDTH  # the occurrence must end before the last token
    while True:
        at = packed.rfind(pattern, 0, end)
        if at < 0:
            return None
        if at % WIDTH == 0:
            return at // WIDTH + n
        end = at + len(pattern) - 1  # a match across token boundaries: search left of it


class PromptLookupDrafter:
    name = "prompt_lookup"

    def __init__(self, min_n: int = 1, max_n: int = 3) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._rows: dict[int, _Row] = {}
        self._prompts: dict[tuple[int, ...], bytes] = {}  # a GRPO group's rows share their prompt's packing

    def start(self, row: int, prompt_id: int, prompt: Sequence[int], response: Sequence[int]) -> None:
        key = tuple(prompt)
        if key not in self._prompts:
            self._prompts[key] = _pack(key)
        packed = bytearray(self._prompts[key])
        packed += _pack(response)
        self._rows[row] = _Row([*key, *response], packed, len(key))

    def extend(self, row: int, tokens: Sequence[int]) -> None:
        state = self._rows[row]
        state.tokens.extend(tokens)
        state.packed += _pack(tokens)

    def kind(self, row: int) -> str:
        state = self._rows[row]
        if state.last_pos is None:
            return f"{self.name}/n0"
        return f"{self.name}/n{state.last_n}{'r' if state.last_pos >= state.prompt_len else 'p'}"

    def propose(self, row: int, k: int) -> list[int]:
        state = self._rows[row]
        state.last_n, state.last_pos = 0, None
        length = len(state.tokens)
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            pos = latest_match(state.packed, length, n)
            if pos is not None:
                state.last_n, state.last_pos = n, pos
                break
        if state.last_pos is None or k <= 0:
            return []
        return overlap_copy(state.tokens, state.last_pos, k)
