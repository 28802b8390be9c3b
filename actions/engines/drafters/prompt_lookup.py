"""``prompt_lookup``: draft by copying what followed the latest earlier occurrence of the
response's last n tokens in the row's own prompt + response (prompt-lookup decoding, as in
Hugging Face ``prompt_lookup_num_tokens`` and vLLM's ``ngram`` method).

It pays where responses quote their prompts (extraction, editing, code, repetition) and costs
nothing to keep: the index grows by ``max_n - min_n + 1`` dictionary entries per token.

A draft's kind (``kind``) is its match length and where the copy comes from: ``p`` the prompt
(a quote, e.g. a response's first token matching one letter of the prompt, often wrong) or
``r`` the response itself (the row repeating its own output, e.g. inside a run of repeats,
often right to the end). Their acceptance differs by far, and the selector tracks it per kind.
"""

from __future__ import annotations

from collections.abc import Sequence

from actions.engines.drafters.base import NgramIndex


class PromptLookupDrafter:
    name = "prompt_lookup"

    def __init__(self, min_n: int = 1, max_n: int = 3) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._rows: dict[int, NgramIndex] = {}
        self._prompts: dict[tuple[int, ...], NgramIndex] = {}  # one index per distinct prompt

    def start(self, row: int, prompt_id: int, prompt: Sequence[int], response: Sequence[int]) -> None:
        key = tuple(prompt)
        if key not in self._prompts:
            base = NgramIndex(self.min_n, self.max_n)
            base.append(key)
            self._prompts[key] = base
        index = self._prompts[key].fork()
        index.append(response)
        self._rows[row] = index

    def extend(self, row: int, tokens: Sequence[int]) -> None:
        self._rows[row].append(tokens)

    def kind(self, row: int) -> str:
        index = self._rows[row]
        if index.last_pos is None:
            return f"{self.name}/n0"
        return f"{self.name}/n{index.last_n}{'r' if index.last_pos >= index.base_len else 'p'}"

    def propose(self, row: int, k: int) -> list[int]:
        index = self._rows[row]
        pos = index.lookup(index.tokens[-self.max_n:])
        return [] if pos is None or k <= 0 else index.copy(pos, k)
