"""Quoting user values in error messages, bounded.

An error line names the value it refuses, but a value can be a 10 MB prompt or a structure
that a YAML alias chain expanded to millions of entries. :func:`quote` gives ``repr``'s text cut
to about ``limit`` characters, without ever building the whole ``repr`` (``reprlib`` stops
walking a container after a few entries and a string after its first characters).
"""

from __future__ import annotations

import reprlib

QUOTE_LIMIT = 200
"""Characters of a user value an error message quotes at most (plus the ``...`` marker)."""

_REPR = reprlib.Repr()
_REPR.maxstring = QUOTE_LIMIT
_REPR.maxother = QUOTE_LIMIT
_REPR.maxlevel = 3
_REPR.maxdict = _REPR.maxlist = _REPR.maxtuple = _REPR.maxset = 8


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` in at most about ``limit`` characters.

    >>> quote("c" * 1000)[:12], len(quote("c" * 1000)) <= 203
    ("'cccccccccc", True)
    >>> quote([1, 2])
    '[1, 2]'
    """
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clip(text: object, limit: int = QUOTE_LIMIT) -> str:
    """``str(text)`` on one line, cut to about ``limit`` characters: for an exception's message
    quoted inside an error line, which may repeat a long user value (``No module named 'a...'``).

    >>> len(clip("x" * 1000)) <= 200, clip("a\\nb")
    (True, 'a b')
    """
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def chat_template_mode(value: object, key: str, more: tuple[str, ...] = ()) -> object:
    """``value`` when it is a chat-template mode (``auto``, true, false, or one of ``more``), for
    the validators of ``data.chat_template`` (which adds ``messages``) and
    ``reward.models[].chat_template``.

    Raises:
        ValueError: one line naming ``key`` and the (quoted) value.
    """
    if value == "auto" or value in more or isinstance(value, bool):
        return value
    raise ValueError(f"{key} {quote(value)} is not a mode; use {', '.join(('auto', *more))}, true or false")
