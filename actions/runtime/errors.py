"""What an exception raised by an action means for the caller: retry it, or stop.

A crash (an exception out of ``main``) is described by :func:`describe_crash` as a small JSON
object, the same on every path (the runtime server's 502 reply, the in-process invoker)::

    {"type": "TypeError", "message": "one line", "transient": false, "advice": "..."}

Transient -- trying the same payload again may succeed, so the flow retries with back-off:
connection refused/reset/aborted, timeouts, an unreachable store, a store answering 429, 502 or
503, and fault injection's simulated crash (``InjectedFault``, which models a crashed
container). Everything else is permanent: a ``TypeError`` or an ``ImportError`` is a bug that
fails the same way on every attempt, and a CUDA out-of-memory error recurs with the same
payload on the same hardware, so it is named as such with advice on what to make smaller.

The runtime's own refusals (an action name it does not know, a malformed control key) take
the same form with ``transient`` false (:func:`describe_refusal`): the caller stops at once
instead of retrying what fails the same way every time.
"""

from __future__ import annotations

from typing import Any

TRANSIENT_STATUS = frozenset({429, 502, 503})
"""HTTP answers (from the store, or from a controller) that say "try again later"."""

# Third-party exception classes that mean "the network or the peer failed", matched by
# (module prefix, class name) on the exception's MRO, so this module imports neither botocore
# nor httpx (actions import them only where used).
_TRANSIENT_CLASSES = frozenset({
    ("botocore", "ConnectionError"), ("botocore", "EndpointConnectionError"), ("botocore", "ConnectTimeoutError"),
    ("botocore", "ReadTimeoutError"), ("botocore", "ConnectionClosedError"),
    ("urllib3", "ProtocolError"), ("httpx", "TransportError"),
})

OOM_ADVICE = ("give each activation less work: set a smaller algorithm.micro_batch_size (score, train_step), "
              "lower generation.max_new_tokens or algorithm.batch_size, or raise scaling.n_min/n_max so each "
              "generation action gets fewer prompts")


class InjectedFault(RuntimeError):
    """Raised on purpose by fault injection (``faults``): it models a crashed container, so it
    is transient by definition, whatever the action was doing."""


LINE_LIMIT = 400
"""Characters :func:`one_line` keeps by default: a crash's message (:func:`describe_crash`)."""


def one_line(text: str, limit: int = LINE_LIMIT) -> str:
    """``text`` with line breaks folded and cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def is_cuda_oom(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, or a RuntimeError whose text says so (older torch, NCCL)."""
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)


def is_transient(exc: BaseException) -> bool:
    """True for failures that another attempt with the same payload may not meet."""
    from actions.store import StoreError, StoreUnreachable

    if isinstance(exc, (InjectedFault, StoreUnreachable, ConnectionError, TimeoutError)):
        return True
    if isinstance(getattr(exc, "transient", None), bool):  # classified where it was raised (actions/rl/ranks.py)
        return exc.transient  # type: ignore[attr-defined]
    if isinstance(exc, StoreError) and exc.__context__ is not None:
        # the store translates client errors into one-line StoreErrors (``raise ... from None``
        # keeps the original as the context): a 429/503 underneath is still worth a retry
        return is_transient(exc.__context__)
    for cls in type(exc).__mro__:
        if (cls.__module__.split(".")[0], cls.__name__) in _TRANSIENT_CLASSES:
            return True
    status = _http_status(exc)
    return status in TRANSIENT_STATUS


def describe_crash(exc: BaseException) -> dict[str, Any]:
    """The JSON description of an exception raised by an action (see the module docstring)."""
    from actions.store.credentials import redact  # an activation result is stored and logged

    if is_cuda_oom(exc):
        return {"type": "CUDA out of memory", "message": redact(one_line(f"{type(exc).__name__}: {exc}")),
                "transient": False, "advice": OOM_ADVICE}
    return {"type": type(exc).__name__, "message": redact(one_line(str(exc))) or "(no message)",
            "transient": is_transient(exc)}


def describe_refusal(kind: str, message: str, advice: str | None = None) -> dict[str, Any]:
    """A request the runtime refuses before any action runs, in :func:`describe_crash`'s form:
    permanent (``transient`` false), since the same request is refused the same way again."""
    from actions.store.credentials import redact

    described: dict[str, Any] = {"type": kind, "message": redact(one_line(message)), "transient": False}
    if advice:
        described["advice"] = advice
    return described


def crash_text(crash: dict[str, Any]) -> str:
    """One line for a crash description: ``Type: message[; advice]``."""
    text = f"{crash.get('type', 'Error')}: {crash.get('message', '')}"
    return f"{text}; {crash['advice']}" if crash.get("advice") else text


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status a client exception carries (botocore ClientError, httpx HTTPStatusError)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        return int(status) if isinstance(status, int) else None
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None
