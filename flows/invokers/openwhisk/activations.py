"""What an activation record means for the flow: success, a failure to raise, or a failure
to retry in place (pure: a record in, an :class:`ActionError` or None out)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flows.invokers.base import ActionError

LIMIT_ERRORS = (
    ("produced a response that exceeded the allowed length",
     "an action's result must stay under OpenWhisk's result limit (1 MB by default): it writes its data to "
     "the object store and returns the keys; a larger result fails the same way every time"),
    ("exhausted its memory",
     "raise the action's memory in infra/openwhisk/actions.yaml (and whisk.limits.actions.memory.max) "
     "or give it less work; it fails the same way every time"),
)
"""(marker in OpenWhisk's developer-error message, fix) for limits an activation ran into: the
size of its result (``Messages.truncatedResponse``) and its memory (``Messages.memoryExhausted``)."""
TRUNCATED_TAIL = "The truncated response was:"


def classify_activation(action: str, record: dict[str, Any]) -> tuple[ActionError | None, bool]:
    """Map an activation record to (error or None, whether to invoke again in place).

    The runtime server answers an exception raised by ``main`` with HTTP 502 and
    ``{"error": {"type", "message", "transient"}}``; OpenWhisk files that as an action developer
    error and keeps the ``error`` object, so the runtime's classification decides: a transient
    crash (connection refused, timeout, injected fault) is left to the flow's retry policy, a
    permanent one (a ``TypeError``, CUDA out of memory) fails at once. OpenWhisk's own
    developer errors for a limit the action ran into -- its time limit, a result over the size
    limit, its memory limit (``LIMIT_ERRORS``) -- recur on every attempt and fail at once with
    the fix; the others (the container died, init failed) are retried in place.
    """
    response = record.get("response") or {}
    status = response.get("status") or ("success" if response.get("success") else "unknown")
    if status == "success":
        return None, False
    activation_id = str(record.get("activationId", ""))
    result = response.get("result") if isinstance(response.get("result"), dict) else {}
    error = result.get("error")
    if isinstance(error, dict) and "type" in error:  # the runtime server's classified crash
        return ActionError.from_crash(action, error, activation_id=activation_id), False
    message = str(error or status)
    if status == "application error":  # the action refused its input: the same every time
        return ActionError(action, message, transient=False, activation_id=activation_id), False
    if status == "action developer error":
        if annotations_of(record).get("timeout") is True or "time limit" in message:
            hint = "; raise its timeout in infra/openwhisk/actions.yaml (and whisk.limits.actions.time.max) or give it less work"
            return ActionError(action, message + hint, transient=False, activation_id=activation_id), False
        limit = next((fix for marker, fix in LIMIT_ERRORS if marker in message), None)
        if limit is not None:
            # The truncated result OpenWhisk appends is the action's data: not for a message.
            head = message.split(TRUNCATED_TAIL, 1)[0].rstrip()
            return ActionError(action, f"{head}; {limit}", transient=False, activation_id=activation_id), False
        return ActionError(action, f"developer error: {message}", transient=True, activation_id=activation_id), True
    return ActionError(action, f"{status}: {message}", transient=True, activation_id=activation_id), True


def annotations_of(record: Mapping[str, Any]) -> dict[str, Any]:
    return {kv.get("key"): kv.get("value") for kv in record.get("annotations") or [] if isinstance(kv, dict)}
