"""Size limits on user data, checked before anything is parsed or tokenised.

A dataset is read whole into memory and every prompt is tokenised, so a bound on what is read
keeps a mistaken or hostile input (a 10 MB prompt, a multi-gigabyte file) from turning into a
multi-gigabyte allocation minutes later in an action. Three bounds, cheapest first:

* ``MAX_DATASET_BYTES``: the files of one split, by their size on disk, before any is read;
* ``MAX_ROW_BYTES``: one JSON Lines line (found by scanning for newlines, before decoding), and
  one prompt's text in any format (its characters, before tokenising);
* ``data.max_prompt_tokens``, whose default for user data is the model's context minus
  ``generation.max_new_tokens`` (:func:`default_max_prompt_tokens`): a longer prompt leaves no
  room for its response, whatever ``data.long_prompts`` then does with it. An explicit value
  may not exceed that room either (:func:`prompt_token_limit`). A generated task's prompts have
  no such limit, but each must leave that room too (:func:`check_prompt_room`).

The context is the model's, or ``generation.vllm.max_model_len`` where the vLLM engine is set
to hold less (:func:`sequence_limit`): the torch engine would decode past the position
embeddings, the vLLM engine refuses the sample, so the room is checked for both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from actions.config.workload import WorkloadConfig
from actions.tasks.dataset import PromptRow

MAX_DATASET_BYTES = 1 << 30
"""1 GiB per split: far above prompt sets in use (GSM8K's train split is 4 MB)."""
MAX_ROW_BYTES = 1 << 20
"""1 MiB per row or prompt: about 250k tokens, above any model's context."""
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""Where a Hugging Face ``config.json`` states the context length (first found wins)."""


def check_dataset_size(files: Sequence[Path], where: str, field: str) -> None:
    """Raise ValueError if ``files`` together are over ``MAX_DATASET_BYTES`` on disk."""
    total = sum(f.stat().st_size for f in files)
    if total > MAX_DATASET_BYTES:
        raise ValueError(f"{where} is {total / 2**20:.0f} MiB, above the {MAX_DATASET_BYTES >> 20} MiB a split may "
                         f"hold; point {field} at a sample of the prompts a campaign uses")


def check_line_lengths(data: bytes, where: str) -> None:
    """Raise ValueError naming the first JSON Lines line over ``MAX_ROW_BYTES`` (no copy made)."""
    start, lineno = 0, 1
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        if end - start > MAX_ROW_BYTES:
            raise ValueError(f"{where}:{lineno}: the row is {end - start:,} bytes, above the limit of "
                             f"{MAX_ROW_BYTES:,}; shorten its prompt or remove the row")
        start, lineno = end + 1, lineno + 1


def check_prompt_size(text_chars: int, where: str, key: str) -> None:
    """Raise ValueError if a prompt's text (all its messages) is over ``MAX_ROW_BYTES`` characters."""
    if text_chars > MAX_ROW_BYTES:
        raise ValueError(f"{where}: key {key!r} holds a prompt of {text_chars:,} characters, above the limit of "
                         f"{MAX_ROW_BYTES:,}; shorten it or remove the row")


def model_context(cfg: WorkloadConfig) -> int | None:
    """The model's context length in tokens: the tiny model's ``max_positions``, or the
    ``config.json`` of ``model.path`` (None when it states none or cannot be read)."""
    if not cfg.model.path:
        return cfg.model.max_positions
    try:
        config = json.loads((Path(cfg.model.path) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # validate_model_dir names the problem
    if not isinstance(config, dict):
        return None
    for source in (config, config.get("text_config") or {}):
        for key in CONTEXT_KEYS:
            value = source.get(key) if isinstance(source, dict) else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def sequence_limit(cfg: WorkloadConfig) -> tuple[int | None, str, str | None]:
    """(longest sample, prompt plus response, in tokens; what sets it, for messages; the key
    that raises it, if any): the model's context (:func:`model_context`), or
    ``generation.vllm.max_model_len`` where the vLLM engine is set to less. None where neither
    is known."""
    context = model_context(cfg)
    engine = cfg.generation.vllm.max_model_len if cfg.generation.engine == "vllm" else None
    if engine is not None and (context is None or engine < context):
        return engine, f"generation.vllm.max_model_len={engine}", "generation.vllm.max_model_len"
    if not cfg.model.path:
        return context, f"the model's context of {context} (model.max_positions)", "model.max_positions"
    return context, f"the model's context of {context} (config.json of model.path {cfg.model.path!r})", None


def check_prompt_room(cfg: WorkloadConfig, rows: Sequence[PromptRow], encode: Callable[[str], Sequence[int]],
                      source: str, *, one_token_per_char: bool = False, num_special: int = 0) -> None:
    """Refuse a prompt that leaves less than ``generation.max_new_tokens`` of
    :func:`sequence_limit` (a generated task's: a dataset file's are held to
    ``data.max_prompt_tokens``, whose default leaves that room). ``encode`` adds no special
    tokens; a row the engine encodes with them (``PromptRow.add_special_tokens``: a BOS under
    ``chat_template: messages``) counts ``num_special`` more, as ``limit_prompt_length`` does.
    ``one_token_per_char``: the tokenizer makes at most one token of a character (the tiny
    model's), so a prompt with no more characters than the room is not tokenised.

    Raises:
        ValueError: the first such prompt, its length, the limit and the fix.
    """
    limit, what, key = sequence_limit(cfg)
    new = cfg.generation.max_new_tokens
    if limit is None:
        return
    for row in rows:
        extra = num_special if row.add_special_tokens else 0
        if one_token_per_char and len(row.prompt) + extra + new <= limit:
            continue
        if (n := len(encode(row.prompt)) + extra) + new > limit:
            raise ValueError(f"{source}: prompt_id {row.prompt_id} has {n} prompt tokens; with "
                             f"generation.max_new_tokens={new} its samples need {n + new}, above {what}; "
                             + (f"raise {key}, " if key else "") + "lower generation.max_new_tokens, or set "
                             "data.max_prompt_tokens with data.long_prompts truncate_left or skip")


def default_max_prompt_tokens(cfg: WorkloadConfig) -> int | None:
    """``data.max_prompt_tokens`` when unset: for user data, :func:`sequence_limit` (the model's
    context) less ``generation.max_new_tokens``; None (no limit) for the generated tasks, whose
    prompts are short by construction (:func:`check_prompt_room` checks they leave the room), or
    a model whose context is unknown.

    Raises:
        ValueError: the responses alone fill the context.
    """
    if not cfg.data.train_path:
        return None
    limit, what, _ = sequence_limit(cfg)
    if limit is None:
        return None
    room = limit - cfg.generation.max_new_tokens
    if room < 1:
        raise ValueError(f"generation.max_new_tokens={cfg.generation.max_new_tokens} leaves no room for a prompt in "
                         f"{what}; lower generation.max_new_tokens")
    return room


def prompt_token_limit(cfg: WorkloadConfig) -> int | None:
    """The prompt-length limit in tokens: ``data.max_prompt_tokens``, else its default
    (:func:`default_max_prompt_tokens`); None: no limit.

    Raises:
        ValueError: an explicit ``data.max_prompt_tokens`` whose prompts, with
            ``generation.max_new_tokens`` of response, would not fit :func:`sequence_limit` (a
            sample would run past the position embeddings, or vLLM would refuse it), or the
            default's error.
    """
    limit = cfg.data.max_prompt_tokens
    if limit is None:
        return default_max_prompt_tokens(cfg)
    context, what, key = sequence_limit(cfg)
    new = cfg.generation.max_new_tokens
    if context is not None and limit + new > context:
        head = (f"data.max_prompt_tokens={limit} plus generation.max_new_tokens={new} is {limit + new} tokens, "
                f"above {what}; ")
        if context > new:
            raise ValueError(f"{head}lower data.max_prompt_tokens to at most {context - new}, or lower "
                             "generation.max_new_tokens")
        raise ValueError(f"{head}generation.max_new_tokens alone leaves no room for a prompt there, so no smaller "
                         f"data.max_prompt_tokens fits: lower generation.max_new_tokens below {context}, or "
                         + longer_context(key, limit + new))
    return limit


def longer_context(key: str | None, need: int) -> str:
    """The fix that gives a sample of ``need`` tokens (prompt plus response) room: raise ``key``
    (:func:`sequence_limit`'s), or, where the context is ``model.path``'s ``config.json``, a
    model with a longer one.

    >>> longer_context("model.max_positions", 1280)
    'raise model.max_positions to 1280 or more'
    >>> longer_context(None, 1280).startswith("point model.path at a model with a context of 1280 tokens or more")
    True
    """
    if key:
        return f"raise {key} to {need} or more"
    return (f"point model.path at a model with a context of {need} tokens or more (`rlhfless tiny-model --out DIR "
            f"--max-positions {need}` writes a tiny one)")
