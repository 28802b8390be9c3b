"""The text the policy sees: a prompt row put through the tokenizer's chat template, or not.

``data.chat_template``:

* ``auto`` (default): the tokenizer's chat template when it has one, else the raw prompt;
* ``true``: the template is required (an error names the model when it has none);
* ``false``: the raw prompt; a chat-message prompt is then an error;
* ``messages``: as TRL's GRPOTrainer formats prompts: a chat-message prompt goes through the
  template (which it then requires), a string prompt never does, and is encoded with the
  tokenizer's special tokens (its BOS, where its post-processor adds one), as TRL's
  ``processing_class(text=prompts)`` encodes it (``PromptRow.add_special_tokens``).

With a template, a string prompt becomes one user message, ``data.system_prompt`` (if set) is
put first unless the prompt already starts with a system turn of its own (a ``system`` or a
``developer`` message, :data:`SYSTEM_ROLES`: the row's own is kept, and the setting is not
added beside it), and the generation prompt
(the assistant turn's header) is appended: the completion starts right after it. Without one,
the system prompt and the prompt are joined by a newline. Templated text and raw text under
``auto``, ``true`` and ``false`` are encoded without special tokens (a template writes its own
BOS). Either way ``source_prompt`` keeps the
dataset's prompt as written: the reward functions and reward models read that, as TRL's do.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, Literal

from actions.config.quoting import quote
from actions.tasks.dataset import PromptRow, row_where

ChatMode = Literal["auto", "messages"] | bool

ROLES = ("system", "user", "assistant", "tool", "developer", "ipython")
"""The roles a chat message may have: OpenAI's and TRL's (``developer`` is the system turn of
OpenAI's newer models and some templates), and ``ipython``, Llama 3's tool-result turn. Names
are case-sensitive, as the templates compare them."""

SYSTEM_ROLES = ("system", "developer")
"""The roles of a system turn: a chat prompt that starts with one has its own, and
``data.system_prompt`` is not put before it (two system turns, the second overriding the first
or refused by the template)."""

SFT_SHARE = 0.9
"""Share of a file's prompts that end with an assistant message from which
:func:`answer_in_prompt_warning` warns."""

_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant", "ai": "assistant"}
"""Roles other chat formats (ShareGPT, Gemma's turns) write, and the role meant."""


def message_problem(message: dict[str, Any]) -> str | None:
    """What is wrong with one chat message whose role is a string and content a string or
    null (the shape ``fields.py`` checks), with the fix; None when nothing is. Refused: a role
    not in :data:`ROLES` that is one misspelt, in other case, or another format's name for one
    (it would reach the template as a turn of its own, or be dropped by it; a role unlike any,
    as GLM's ``observation``, is the template's to render), a user message without text (null,
    empty or blank), and null content in any message but an assistant turn that calls tools (``tool_calls`` or ``function_call``): a
    template writes it as "None" or fails. Empty content elsewhere is kept (a tool's empty
    result, an assistant turn before its tool calls).

    >>> message_problem({"role": "assistent", "content": "4"}).split("; ")[1]
    "change it to 'assistant'"
    >>> message_problem({"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}) is None
    True
    """
    role, content = message["role"], message["content"]
    close = None if role in ROLES else _ALIASES.get(role.strip().lower()) or next(
        iter(difflib.get_close_matches(role.strip().lower(), ROLES, n=1, cutoff=0.7)), None)
    if close:  # another role is the template's to render (GLM's observation, a legacy function turn)
        return f"has role {quote(role, 40)}, not a chat role ({', '.join(ROLES)}); change it to {close!r}"
    if role == "user" and (content is None or not content.strip()):
        said = "null" if content is None else "empty" if not content else "blank"
        return f"(user) has {said} content; fill in the user's text, or remove the message (or the row)"
    if content is None and not (role == "assistant" and (message.get("tool_calls") or message.get("function_call"))):
        return (f"({role}) has null content and no tool_calls; give it its text (\"\" for none) or remove it: null "
                "content is for an assistant turn that calls tools")
    return None


def has_chat_prompts(rows: Sequence[PromptRow]) -> bool:
    """Whether any row's prompt, as the dataset wrote it, is a list of chat messages."""
    return any(isinstance(r.source_prompt, list) for r in rows)


def uses_template(tokenizer: Any, mode: ChatMode, model_name: str) -> bool:
    """Resolve ``mode`` against a tokenizer: whether its template is used (under ``messages``,
    for chat-message prompts only). Raises ValueError when ``true`` cannot be met."""
    has = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
    if mode is True and not has:
        raise ValueError(f"data.chat_template is true but the tokenizer of {model_name} has no chat template; "
                         "set data.chat_template to auto or false, or use a model whose tokenizer has one")
    return has and mode is not False


def _apply_template(tokenizer: Any, messages: list[dict[str, Any]], where: str, system_added: bool) -> str:
    """The chat template's text of ``messages`` plus the generation prompt. Raises ValueError
    naming ``where`` when the template fails on them (e.g. a tool call it does not render), and
    ``data.system_prompt`` where it put the first message there (``system_added``: a template
    that takes no system role fails on that message, not on the row's)."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # the template is the model's own code (jinja): any failure is a data mismatch
        fix = ("data.system_prompt was put first as a system message, which this template may not take: unset "
               "data.system_prompt, change the messages" if system_added else "change the messages")
        raise ValueError(f"{where}: the tokenizer's chat template fails on its messages ({type(exc).__name__}: "
                         f"{str(exc)[:200]}); {fix}, or use a model whose chat template renders "
                         "them (tool calls, null content)") from None


def _check_messages(messages: list[dict[str, Any]], where: str) -> None:
    """Raise ValueError naming ``where`` and the first message :func:`message_problem` refuses
    (a row read from a file was checked as it was read; one built otherwise is here). A message
    of another shape (content parts) is left to the template, as before."""
    for i, m in enumerate(messages):
        shaped = isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m and (
            m["content"] is None or isinstance(m["content"], str))
        problem = message_problem(m) if shaped else None
        if problem:
            raise ValueError(f"{where}: message {i} {problem}")


def format_rows(rows: Sequence[PromptRow], tokenizer: Any, *, use_template: bool, system_prompt: str | None,
                source: str, strings_as_text: bool = False) -> list[PromptRow]:
    """Rows whose ``prompt`` is the final text and whose ``source_prompt`` is the dataset's
    prompt (see the module docstring). ``system_prompt`` is put first as a system message,
    but not in a chat prompt whose first message is a ``system`` or ``developer`` one
    (:data:`SYSTEM_ROLES`). ``strings_as_text`` (``messages``): string prompts are never
    templated and are encoded with the tokenizer's special tokens."""
    out = []
    for number, row in enumerate(rows, start=1):
        written = row.source_prompt if row.source_prompt is not None else row.prompt
        as_text = strings_as_text and not isinstance(written, list)
        if use_template and not as_text:
            if isinstance(written, list):  # checked before the system prompt is put first: a failing template
                _check_messages(written, row_where(source, row, number))  # then blames the row, not it
            messages = list(written) if isinstance(written, list) else [{"role": "user", "content": written}]
            added = bool(system_prompt) and messages[0]["role"] not in SYSTEM_ROLES
            if added:
                messages.insert(0, {"role": "system", "content": system_prompt})
            text = _apply_template(tokenizer, messages, row_where(source, row, number), added)
        elif isinstance(written, list):
            raise ValueError(f"{row_where(source, row, number)} is a list of chat messages but no "
                             "chat template is used; set data.chat_template to auto, true or messages with a model "
                             "whose tokenizer has a chat template, or give string prompts")
        else:
            text = f"{system_prompt}\n{written}" if system_prompt else written
        out.append(row.model_copy(update={"prompt": text, "source_prompt": written, "add_special_tokens": as_text}))
    return out


def answer_in_prompt_warning(rows: Sequence[PromptRow], prompt_key: str, source: str) -> str | None:
    """The warning line for ``rows`` (read from ``source``) of which at least :data:`SFT_SHARE`
    have a chat prompt whose last message is the assistant's, as an SFT dataset's conversations
    do: the template closes that turn and opens a new one (README, Data: ``prompt_key``), so the
    policy is prompted with the reply already written. None for fewer, and for no rows. A
    warning, not a refusal: a multi-turn prompt may end with an assistant turn on purpose.

    >>> turn = lambda role: {"role": role, "content": "x"}
    >>> rows = [PromptRow(prompt_id=i, prompt="", answer="", source_prompt=[turn("user"), turn("assistant")])
    ...         for i in range(9)] + [PromptRow(prompt_id=9, prompt="q", answer="")]
    >>> answer_in_prompt_warning(rows, "messages", "f").split(";")[0]
    "warning: f: 9 of its 10 prompts (90%) end with an assistant message (data.prompt_key 'messages')"
    >>> answer_in_prompt_warning(rows[1:], "messages", "f") is None  # 8 of 9
    True
    """
    ending = sum(_ends_with_assistant(r.source_prompt if r.source_prompt is not None else r.prompt) for r in rows)
    if not rows or ending < SFT_SHARE * len(rows):
        return None
    return (f"warning: {source}: {ending} of its {len(rows)} prompts ({ending / len(rows):.0%}) end with an assistant "
            f"message (data.prompt_key {prompt_key!r}); the chat template closes that turn and opens a new one, so "
            "the policy is prompted with the reply already written, as in an SFT dataset's conversations: drop the "
            "final assistant message from each prompt, and put its text in the answer column (data.answer_key) "
            "where a reward reads a reference (README, Data: prompt_key)")


def _ends_with_assistant(prompt: Any) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[-1], dict) and \
        prompt[-1].get("role") == "assistant"
