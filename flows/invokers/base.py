"""How the control plane calls an action, whatever runs it.

An :class:`Invoker` takes an action name (``generate``, ``score``, ...) and a JSON payload and
returns an :class:`Activation`: the action's result plus the accounting the flow needs
(every second is accounted). Three implementations share it:

* ``InProcessInvoker`` -- calls ``actions.<name>.main`` in this process (unit tests).
* ``LocalPoolInvoker`` -- a warm pool of worker processes serving the action protocol on
  loopback (the embedded default).
* ``OpenWhiskInvoker`` -- the OpenWhisk REST API (clusters).
* ``ChildProcessInvoker`` -- one child process per activation on this machine (``prepare``
  when the other actions run on a cluster that cannot read this machine's files).

Billing: a platform charges for an activation that crashed, was killed or returned an error,
so every failure carries the accounting of the attempts it consumed
(``ActionError.failed_attempts``, ``Activation.failed_attempts``): the step bills them and counts
none of them as useful work.

Errors: an action that rejects its payload returns ``{"error": ...}``; the invoker raises
:class:`ActionError` with ``transient=False`` (retrying cannot help). An action that raises is
classified where it ran (``actions.runtime.errors``): connection refused/reset, timeouts, a
store's 429/502/503 and fault injection's simulated crash are transient; anything else (a
``TypeError``, CUDA out of memory) is permanent and fails at once. Infrastructure failures (a
killed or lost worker, 429/502/503, timeouts) raise :class:`ActionError` with
``transient=True`` so the flow's retry policy may try again -- actions are idempotent, so a
retry gives the same bytes. Messages are one line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from actions.contracts import DecodeSettings


class ActionError(RuntimeError):
    """An activation that did not produce a result.

    ``failed_attempts``: the accounting of the activations this failure consumed, as far as
    the invoker knows it (a platform bills them though they gave no result): one for a crash,
    an error or a killed worker; none where no activation ran or nothing of it is known (a
    refused request; an OpenWhisk activation never recorded, or still running at the deadline).
    ``crash_type``: the class name of the exception the action raised (``StoreUnreachable``),
    where the runtime described a crash; "" for every other failure.
    """

    def __init__(self, action: str, message: str, *, transient: bool, activation_id: str = "",
                 failed_attempts: tuple[Activation, ...] = (), crash_type: str = "") -> None:
        super().__init__(f"action {action} failed: {message}")
        self.action = action
        self.message = message
        self.transient = transient
        self.activation_id = activation_id
        self.failed_attempts = failed_attempts
        self.crash_type = crash_type

    @classmethod
    def from_crash(cls, action: str, crash: dict[str, Any], where: str = "", *, activation_id: str = "",
                   failed_attempts: tuple[Activation, ...] = ()) -> ActionError:
        """The failure of an action whose runtime described its crash (``{"type", "message",
        "transient"[, "advice"]}``, ``actions.runtime.errors.describe_crash``); ``where`` (the
        worker's log) follows the crash's line."""
        from actions.runtime.errors import crash_text

        text = f"{crash_text(crash)}; {where}" if where else crash_text(crash)
        return cls(action, text, transient=crash.get("transient") is True, activation_id=activation_id,
                   failed_attempts=failed_attempts, crash_type=str(crash.get("type", "")))


@dataclass
class Activation:
    """One completed activation and its accounting.

    Times are epoch seconds; durations are seconds. ``billed_s`` is what a serverless
    platform charges for: the activation's wall time inside the container, including a cold
    start's init time.
    """

    action: str
    activation_id: str
    result: dict[str, Any]
    submitted_at: float
    started_at: float
    ended_at: float
    busy_s: float
    init_s: float = 0.0
    cold: bool = False
    worker: str = ""
    gpus: int = 1
    extra: dict[str, Any] = field(default_factory=dict)
    shard: str = ""
    """The flow's name for this activation (``gen-3``, ``cont-0``, ``score-gen-0``), set by
    the step's invoke task (``flows/step/invoke.py``); empty where no flow named it."""
    failed_attempts: tuple[Activation, ...] = ()
    """Attempts the invoker retried itself before this one (OpenWhisk's developer errors
    retried in place): billed, without a result."""

    @property
    def queue_s(self) -> float:
        return max(0.0, self.started_at - self.submitted_at)

    @property
    def billed_s(self) -> float:
        return max(self.busy_s, self.ended_at - self.started_at) + self.init_s

    def accounting(self) -> dict[str, Any]:
        """A JSON-able record without the result payload."""
        record = asdict(self)
        record.pop("result")
        record.update(queue_s=self.queue_s, billed_s=self.billed_s)
        return record


class Invoker(Protocol):
    """Calls actions. Implementations must be safe to call from several threads."""

    sees_local_files: bool
    """Whether its actions run on this machine and can read its files (``model.path``, datasets)."""

    def invoke(self, action: str, payload: dict[str, Any], *, timeout_s: float | None = None) -> Activation:
        """Run ``action`` on ``payload`` and wait for its result.

        Raises:
            ActionError: the action returned an error or could not be run.
        """

    def prewarm(self, action: str, count: int, *, model: dict[str, Any] | None = None,
                decode: DecodeSettings = DecodeSettings()) -> int:
        """Make ``count`` containers for ``action`` warm ahead of use; returns how many
        were started now (already-warm ones are not counted). With ``model`` (a ``ModelRef``
        as JSON) each container also loads that policy version, so the activation that
        follows finds the weights in memory: into the generation slot (``decode.engine``
        torch) or into the container's vLLM engine (``vllm``: built once, then pushed into in
        place), whose engine is built with ``decode``'s settings."""

    def close(self) -> None:
        """Release workers and connections."""
