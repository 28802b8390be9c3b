"""Math answers checked for symbolic equivalence with the ``math-verify`` package.

The reference and the completion are parsed by ``math_verify.parse`` (LaTeX, ``\\boxed{}``,
plain expressions) and compared by ``math_verify.verify``, so ``\\frac{1}{2}``, ``0.5`` and
``1/2`` are equal. A reference that does not parse makes the row not applicable (None); a
completion that does not parse earns 0.0. A GSM8K-style reference (``... #### N``) is reduced
to its final answer first. Parsing runs with math-verify's own timeouts, which use
``signal.alarm`` and so need a main thread: called from any other thread (an action server's
request thread), the rows are scored in a helper process (``main_thread.py``), by the same code.
"""

from __future__ import annotations

import re

from actions.tasks.rewards.main_thread import call_in_main_thread
from actions.tasks.rewards.text import completion_text


def math_reward(completions: list, answer: list[str], **kwargs: object) -> list[float | None]:
    """1.0 when the completion is mathematically equal to the reference, else 0.0.

    >>> math_reward([r"so \\boxed{\\frac{1}{2}}", r"\\boxed{0.5}", r"\\boxed{3}"], answer=["$0.5$"] * 3)
    [1.0, 1.0, 0.0]
    """
    return call_in_main_thread("actions.tasks.rewards.symbolic:score_rows", list(completions), list(answer))


def score_rows(completions: list, answer: list) -> list[float | None]:
    """:func:`math_reward`'s rows, scored in this thread (which must be a main thread)."""
    from math_verify import parse, verify  # imported on use: it pulls in sympy and antlr

    out: list[float | None] = []
    for completion, reference in zip(completions, answer, strict=True):
        ref = str(reference).rsplit("####", 1)[-1].strip() if "####" in str(reference) else str(reference)
        gold = parse(_as_math(ref))
        if not gold and _as_math(ref) != ref:  # a reference math-verify reads only as written
            gold = parse(ref)
        if not gold:
            out.append(None)
            continue
        pred = parse(completion_text(completion))
        out.append(1.0 if pred and verify(gold, pred) else 0.0)
    return out


_DELIMITED = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed")


def _as_math(reference: str) -> str:
    """``reference`` as math-verify reads an answer: inside ``$...$`` unless it has delimiters
    of its own (an unescaped ``$``, ``\\(``, ``\\[``) or a ``\\boxed``. MATH's answer column is
    bare LaTeX (``2\\sqrt{3}``, ``\\frac{\\pi}{2}``, ``\\$32,348``), which math-verify reads
    wrongly or not at all without them.

    >>> _as_math(r"2\\sqrt{3}"), _as_math("$x$"), _as_math(r"\\$5"), _as_math(r"\\boxed{1}")
    ('$2\\\\sqrt{3}$', '$x$', '$\\\\$5$', '\\\\boxed{1}')
    """
    return reference if _DELIMITED.search(reference) else f"${reference}$"
