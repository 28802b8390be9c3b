"""``history``: draft from the same prompt's responses in earlier epochs.

RLHF samples every prompt again each epoch, and a policy that has learnt a task answers a
prompt much as it did last time. The stored responses of a prompt (``flows/campaign/drafts.py``; each
ends with the EOS token that ended it) form a prefix tree with counts. While a row's response
so far is a path of the tree, the draft follows the most frequent continuation (the majority
of the old responses; ties go to the token seen first), through EOS if the old responses
ended there. Once the row leaves the tree, it drafts from an n-gram index over the old
responses instead: whichever old response shares its last few tokens. The prompt itself is not
indexed (``prompt_lookup`` covers it). Trees are built once per prompt per call and shared by
the prompt's rows; a prompt's index only when one of its rows first leaves the tree (many
never do, and building it is most of a call's drafter set-up).

A path draft's kind says how far the old responses agree on its first token: ``patha`` all of
them, ``pathm`` a strict majority, ``paths`` a plurality. Where they split, the policy is
unsure there too and the draft is wrong more often; the selector tracks acceptance per kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from actions.engines.drafters.base import NgramIndex

_START = -1  # never a token id
_END = -2  # separates stored responses, so a draft never runs from one into the next


class _Node:
    __slots__ = ("count", "children", "best", "agree")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}
        self.best: int | None = None  # the child token with the highest count
        self.agree: str | None = None  # the kind of a draft from here, once asked (``kind``)


def _tree(responses: Sequence[Sequence[int]]) -> _Node:
    root = _Node()
    for r in responses:
        node = root
        for t in r:
            child = node.children.setdefault(t, _Node())
            child.count += 1
            if node.best is None or child.count > node.children[node.best].count:
                node.best = t
            node = child
    return root


class HistoryDrafter:
    name = "history"

    def __init__(self, responses: Mapping[int, Sequence[Sequence[int]]], min_n: int = 1, max_n: int = 4) -> None:
        """``responses``: prompt_id -> earlier responses (token lists, each with its EOS)."""
        self.min_n, self.max_n = min_n, max_n
        self._responses = responses
        # prompt_id -> [tree, n-gram index (None until a row needs it), responses], or None
        self._prompts: dict[int, list | None] = {}
        # row -> [its prompt's entry or None, current tree node or None, query tokens]
        self._rows: dict[int, list] = {}

    def _prompt(self, prompt_id: int) -> list | None:
        if prompt_id not in self._prompts:
            resps = self._responses.get(prompt_id) or []
            self._prompts[prompt_id] = [_tree(resps), None, resps] if resps else None
        return self._prompts[prompt_id]

    def _index(self, entry: list) -> NgramIndex:
        if entry[1] is None:
            index = NgramIndex(self.min_n, self.max_n)
            for r in entry[2]:
                index.append([_START, *r, _END])
            entry[1] = index
        return entry[1]

    def start(self, row: int, prompt_id: int, prompt: Sequence[int], response: Sequence[int]) -> None:
        entry = self._prompt(int(prompt_id))
        self._rows[row] = [entry, entry[0] if entry else None, [_START]]
        self.extend(row, response)

    def extend(self, row: int, tokens: Sequence[int]) -> None:
        state = self._rows[row]
        node = state[1]
        for t in tokens:
            node = node.children.get(t) if node is not None else None
        state[1] = node
        state[2].extend(tokens)

    def kind(self, row: int) -> str:
        entry, node, _ = self._rows[row]
        if node is not None and node.best is not None:
            if node.agree is None:
                top, total = node.children[node.best].count, sum(c.count for c in node.children.values())
                node.agree = f"{self.name}/path{'a' if top == total else 'm' if 2 * top > total else 's'}"
            return node.agree
        if entry is None:
            return f"{self.name}/none"
        return f"{self.name}/n{entry[1].last_n if entry[1] is not None else 0}"

    def propose(self, row: int, k: int) -> list[int]:
        entry, node, query = self._rows[row]
        if entry is None or k <= 0:
            return []
        if node is not None and node.best is not None:  # still on an old response's path
            out = []
            while node is not None and node.best is not None and len(out) < k:
                out.append(node.best)
                node = node.children[node.best]
            return out
        index = self._index(entry)
        pos = index.lookup(query[-self.max_n:])
        if pos is None:
            return []
        out = index.tokens[pos:pos + k]
        return out[:out.index(_END)] if _END in out else out
