"""The namespace's action limits, checked before ``rlhfless deploy`` PUTs anything.

The controller refuses an ``ActionPut`` whose limits fall outside the namespace's range (HTTP
400 ``... exceeds allowed threshold``), one action at a time. Checking every action against
``GET /namespaces/{ns}/limits`` (``UserLimits`` in the swagger: ``minActionMemory`` ...
``maxActionConcurrency`` and ``allowedKinds``) first turns that into one refusal naming every
offending action and limit, before any image changes. Controllers report what they enforce;
a field one does not report is not checked, and a controller without the endpoint gets no
pre-check at all (the PUTs then stop at the first refusal, as before).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: ``ActionLimits`` field -> (``UserLimits`` suffix, unit).
LIMIT_FIELDS = {
    "memory": ("ActionMemory", "MB"),
    "timeout": ("ActionTimeout", "ms"),
    "logs": ("ActionLogs", "MB"),
    "concurrency": ("ActionConcurrency", "activations"),
}


def limit_problems(actions: Mapping[str, Mapping[str, int]], limits: Mapping[str, Any],
                   kind: str = "blackbox") -> list[str]:
    """Pure: one line per action whose limits fall outside ``limits`` (a ``UserLimits`` object),
    naming each offending limit, plus one line when ``allowedKinds`` excludes ``kind``.

    Args:
        actions: action name -> its ``ActionLimits`` (``memory`` MB, ``timeout`` ms, ``logs``
            MB, ``concurrency``).
        limits: what the controller answered; missing or non-integer fields are not checked.
    """
    problems = []
    kinds = limits.get("allowedKinds")
    if isinstance(kinds, list) and kinds and kind not in kinds:
        problems.append(f"the namespace allows the action kinds {', '.join(map(str, kinds))} only, "
                        f"not {kind} (every RLHFless action is a {kind} image)")
    for action, wanted in actions.items():
        bad = []
        for name, (suffix, unit) in LIMIT_FIELDS.items():
            value = wanted.get(name)
            low, high = limits.get(f"min{suffix}"), limits.get(f"max{suffix}")
            if value is None:
                continue
            if _is_int(high) and value > high:
                bad.append(f"{name} {value} {unit} is above max{suffix} {high}")
            elif _is_int(low) and value < low:
                bad.append(f"{name} {value} {unit} is below min{suffix} {low}")
        if bad:
            problems.append(f"action {action}: {', '.join(bad)}")
    return problems


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
