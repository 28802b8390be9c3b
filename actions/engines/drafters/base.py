"""The drafter contract, the n-gram index the history drafter searches, and the overlapping copy
both strategies draft with.

A drafter holds per-row state. The engine calls ``start`` once per row with the row's
prompt and response so far, ``extend`` with every token the row accepts afterwards, and
``propose`` before a verification forward. ``propose`` must be cheap: it runs once per row per
decode round, between two forwards of the target model, in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Drafter(Protocol):
    name: str

    def start(self, row: int, prompt_id: int, prompt: Sequence[int], response: Sequence[int]) -> None:
        """Begin tracking ``row`` (its prompt tokens and the response tokens it already has)."""
        ...

    def extend(self, row: int, tokens: Sequence[int]) -> None:
        """Tokens appended to ``row``'s response (accepted or sampled), in order."""
        ...

    def propose(self, row: int, k: int) -> list[int]:
        """Up to ``k`` tokens that may follow ``row``'s response so far (may be empty)."""
        ...

    def kind(self, row: int) -> str:
        """What ``row``'s last proposal was based on (``"<name>/<kind>"``): acceptance is
        tracked per kind, since a long match predicts better than a short one."""
        ...


def overlap_copy(tokens: Sequence[int], pos: int, k: int) -> list[int]:
    """``k`` tokens of ``tokens`` from ``pos`` on; past the end, the copy continues from its own
    output (LZ77-style overlap), so a repeating pattern drafts its next period, not one token."""
    out: list[int] = []
    n = len(tokens)
    for i in range(k):
        j = pos + i
        out.append(tokens[j] if j < n else out[j - n])
    return out


class NgramIndex:
    """Where each n-gram (``min_n <= n <= max_n``) of a growing token list last occurred with a
    known continuation: ``ngram -> index of the token after it``.

    ``lookup(query)`` takes the longest suffix n-gram of ``query`` seen in the index and returns
    the continuation position, so a drafter can copy the tokens that followed it. An n-gram is
    registered only once its next token exists, so the list's own trailing n-gram never matches
    itself.
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._where: dict[tuple[int, ...], int] = {}
        self.last_n = 0
        self.last_pos: int | None = None

    def append(self, tokens: Sequence[int]) -> None:
        if len(tokens) <= 2:  # a decode round's token or two: the plain loop is cheaper
            for t in tokens:
                end = len(self.tokens)  # ``t`` is the continuation of every n-gram ending at end-1
                for n in range(self.min_n, min(self.max_n, end) + 1):
                    self._where[tuple(self.tokens[end - n:end])] = end
                self.tokens.append(t)
            return
        # A prompt or a stored response at once, the same entries in the same order (a later
        # occurrence overwrites an earlier one) with the loops in C: per n, each n-gram zipped
        # from n shifted slices, paired with the index of the token after it
        old = len(self.tokens)
        self.tokens.extend(tokens)
        toks, new = self.tokens, len(self.tokens)
        for n in range(self.min_n, self.max_n + 1):
            first = max(old, n)  # the continuation index of the first new n-gram
            if first < new:
                grams = zip(*(toks[first - n + i:new - n + i] for i in range(n)))
                self._where.update(zip(grams, range(first, new)))

    def lookup(self, query: Sequence[int]) -> int | None:
        """Continuation index of the longest suffix of ``query`` in the index, or None;
        ``last_n`` is the length of the suffix that matched (0: none), ``last_pos`` the index."""
        self.last_n, self.last_pos = 0, None
        for n in range(min(self.max_n, len(query)), self.min_n - 1, -1):
            pos = self._where.get(tuple(query[len(query) - n:]))
            if pos is not None:
                self.last_n, self.last_pos = n, pos
                return pos
        return None
