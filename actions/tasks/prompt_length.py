"""What happens to a prompt longer than ``data.max_prompt_tokens`` (``data.long_prompts``).

* ``error`` (default): refuse the dataset, naming the first such row and the fix;
* ``truncate_left``: keep the prompt's last ``max_prompt_tokens`` tokens (the end of a prompt
  holds the question and the generation prompt, the start is usually the shared preamble);
* ``skip``: drop the row.

Truncated and skipped rows are counted in the campaign summary (``data``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from actions.tasks.dataset import PromptRow, row_where

LongPromptPolicy = Literal["error", "truncate_left", "skip"]


@dataclass
class LengthStats:
    truncated: int = 0
    skipped: int = 0
    skipped_over_context: int = 0
    """Of ``skipped``, the prompts that fill the model's context alone (``alone``): no limit or
    ``generation.max_new_tokens`` brings them back. 0 where the context is unknown."""
    longest_prompt_tokens: int = 0


def limit_prompt_length(rows: Sequence[PromptRow], *, encode: Callable[[str], Sequence[int]],
                        decode: Callable[[Sequence[int]], str], max_tokens: int, policy: LongPromptPolicy,
                        source: str, limit_text: str | None = None, fix: str = "raise it", num_special: int = 0,
                        encode_many: Callable[[list[str]], Sequence[Sequence[int]]] | None = None,
                        alone: tuple[int, str] | None = None) -> tuple[list[PromptRow], LengthStats]:
    """Apply ``policy`` to every row whose encoded prompt exceeds ``max_tokens``.

    ``encode`` gives a text's tokens alone; a row encoded with the tokenizer's special tokens
    (``PromptRow.add_special_tokens``) counts ``num_special`` more, and its text is cut to
    leave room for them.
    A truncated prompt is decoded back to text and re-encoded: where that changes the token
    boundary, one more token is dropped until it fits (text is what the store keeps).
    ``limit_text`` names the limit in the error (default ``data.max_prompt_tokens=N``), ``fix``
    how to lift it. ``alone``: (the context in tokens, the error's fixes for a prompt at least
    that long): such a prompt leaves no room for a response whatever the limit or
    ``generation.max_new_tokens`` is, so ``fix`` cannot help it. ``encode_many``: ``encode`` of a
    list of texts at once (a fast tokenizer's batch call, many times quicker on a large
    dataset), used on chunks of ``CHUNK`` rows.
    """
    stats = LengthStats()
    out: list[PromptRow] = []
    for number, (row, ids) in enumerate(zip(rows, _encoded(rows, encode, encode_many), strict=True), start=1):
        extra = num_special if row.add_special_tokens else 0
        count = len(ids) + extra
        if count <= max_tokens:
            stats.longest_prompt_tokens = max(stats.longest_prompt_tokens, count)
            out.append(row)
            continue
        if policy == "error":
            lift = alone[1] if alone and count >= alone[0] else \
                f"{fix}, or set data.long_prompts to truncate_left or skip"
            raise ValueError(f"{row_where(source, row, number)} has {count} prompt tokens, above "
                             f"{limit_text or f'data.max_prompt_tokens={max_tokens}'}; {lift}")
        if policy == "skip":
            stats.skipped += 1
            stats.skipped_over_context += bool(alone and count >= alone[0])
            continue
        room = max(1, max_tokens - extra)
        keep = room
        text = decode(ids[-keep:])
        while keep > 1 and len(encode(text)) > room:
            keep -= 1
            text = decode(ids[-keep:])
        stats.truncated += 1
        stats.longest_prompt_tokens = max(stats.longest_prompt_tokens, len(encode(text)) + extra)
        out.append(row.model_copy(update={"prompt": text}))
    return out, stats


CHUNK = 1024
"""Rows encoded per batch call: the token ids of a chunk at a time, not of the whole dataset."""


def _encoded(rows: Sequence[PromptRow], encode: Callable[[str], Sequence[int]],
             encode_many: Callable[[list[str]], Sequence[Sequence[int]]] | None) -> Iterator[list[int]]:
    """Each row's prompt encoded, in order."""
    for start in range(0, len(rows), CHUNK):
        texts = [r.prompt for r in rows[start:start + CHUNK]]
        yield from (list(ids) for ids in (encode_many(texts) if encode_many else map(encode, texts)))
