"""Reading numbers out of model output and references, the way graders of GSM8K do.

A number is compared by value, so ``1,000``, ``1000.0``, ``$1000`` and ``1000`` are equal.
Fractions written ``a/b`` are read as a/b. Anything else is not a number (None), never an error.
"""

from __future__ import annotations

import re
from fractions import Fraction

# A minus sign only when attached ("- 18" is a dash, then 18); a space only after a dollar sign
# (LaTeX's ``\$`` too: ``-\$24`` is -24); ".42" not when it ends an ellipsis ("...42" is 42).
_NUMBER = re.compile(r"-?(?:\\?\$\s*)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|(?<!\.)-?\.\d+")
# LaTeX and typographic digit-group separators: 14{,}400, 14\,400, 1,\!000, a thin space.
_GROUP_SEPARATOR = re.compile(r"(?<=\d)(?:\{,\}|,\\!|\\[,!]|\u2009|\u202f)(?=\d{3}(?!\d))")
_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-"})  # the minus sign and the en dash a model may write
_BOXED = re.compile(r"\\boxed\s*\{")


def parse_number(text: str) -> Fraction | None:
    """The value of one number written in ``text`` (commas, a dollar sign, a trailing period,
    a percent sign and surrounding words tolerated); None if there is none or several.

    >>> parse_number("1,000"), parse_number("$1000.00"), parse_number(" 1000. ")
    (Fraction(1000, 1), Fraction(1000, 1), Fraction(1000, 1))
    >>> parse_number("3/4"), parse_number("-2.5"), parse_number("no"), parse_number("1 2")
    (Fraction(3, 4), Fraction(-5, 2), None, None)
    """
    found = _NUMBER.findall(_normalised(text))
    if len(found) != 1:
        return None
    return _value(found[0])


def last_number(text: str) -> Fraction | None:
    """The value of the last number in ``text`` (None if it holds none).

    >>> last_number("she has 3 apples, then 12."), last_number(r"so $14{,}400$"), last_number("Left:\\n- 18")
    (Fraction(12, 1), Fraction(14400, 1), Fraction(18, 1))
    >>> last_number("the answer is...42"), last_number("it is \u22125")
    (Fraction(42, 1), Fraction(-5, 1))
    """
    found = _NUMBER.findall(_normalised(text))
    return _value(found[-1]) if found else None


def leading_number(text: str) -> Fraction | None:
    """The value of the number ``text`` starts with, after spaces and Markdown emphasis (None
    where it starts with anything else: a ``#### Step 1`` heading is not an answer).

    >>> leading_number(" 1,000 apples"), leading_number("**-$18**"), leading_number("Step 1: add 2")
    (Fraction(1000, 1), Fraction(-18, 1), None)
    """
    found = _NUMBER.match(_normalised(text).lstrip(" \t*_"))
    return _value(found.group(0)) if found else None


def boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (balanced braces), or None.

    >>> boxed(r"so \\boxed{\\frac{1}{2}} is it")
    '\\\\frac{1}{2}'
    """
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    start = depth = matches[-1].end()
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return None


def _normalised(text: str) -> str:
    """``text`` with a Unicode minus or en dash as ``-`` and digit-group separators of LaTeX or
    typography removed, so that ``14{,}400`` is one number."""
    return _GROUP_SEPARATOR.sub("", text.translate(_MINUS))


def _value(token: str) -> Fraction | None:
    cleaned = token.replace("\\", "").replace("$", "").replace(",", "").replace(" ", "")
    try:
        if "/" in cleaned:
            num, den = cleaned.split("/")
            return Fraction(num) / Fraction(den) if Fraction(den) != 0 else None
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None
