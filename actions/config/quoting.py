"""Quoting user values in error messages, bounded.

An error line names the value it refuses, but a value can be a 10 MB prompt or a structure
that a YAML alias chain expanded to millions of entries. :func:`quote` gives ``repr``'s text cut
to about ``limit`` characters, without ever building the whole ``repr`` (``reprlib`` stops
walking a container after a few entries and a string after its first characters).
"""

from __future__ import annotations

import errno
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

    >>> quote("c" * 1000)[:11], len(quote("c" * 1000)) <= 203
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


def unusable_path(field: str, value: str, exc: OSError, *, name_max: int = 255) -> str:
    """The one line for the path ``value`` of setting ``field`` that the system refused to look
    up (``exc``, from ``stat``): naming the setting, the value (quoted; cut to 80 characters when
    it is too long a path, else to ``QUOTE_LIMIT``) and the fix. ``name_max``: the bytes a name
    may have where known (``PC_NAME_MAX``), else the usual 255.

    >>> line = unusable_path("data.train_path", "/tmp/" + "x" * 300, OSError(errno.ENAMETOOLONG, "File name too long"))
    >>> line.endswith("a name in it is 300 bytes, more than a file system allows (255); shorten data.train_path")
    True
    >>> len(line) < 300
    True
    """
    if exc.errno == errno.ENAMETOOLONG:  # the system's words ("File name too long") name no setting
        longest = max(len(part.encode()) for part in value.split("/"))
        why = (f"a name in it is {longest} bytes, more than a file system allows ({name_max})"
               if longest > name_max else f"{len(value.encode())} bytes, more than the system allows in a path")
        return f"{field} {quote(value, 80)} is too long a path: {why}; shorten {field}"
    return (f"{field} {quote(value)} cannot be looked up ({exc.strerror or exc}); point {field} at a path this "
            "user can read")
