"""The :class:`~flows.invokers.base.Invoker` for OpenWhisk and the accounting it reads from
activation records."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from actions.contracts import DecodeSettings
from actions.runtime.control import Control, take_activation
from flows.invokers.base import ActionError, Activation
from flows.invokers.openwhisk.activations import annotations_of
from flows.invokers.openwhisk.api import OpenWhiskError, RetryPolicy
from flows.invokers.openwhisk.client import OpenWhiskClient
from flows.invokers.openwhisk.config import OpenWhiskConfig

PREWARM_HOLD_S = 0.5
"""Seconds each pre-warm holds its container, so that ``n`` concurrent ones land on ``n``
different containers: the least a pre-warm takes (the planner's lead before one is measured)."""

log = logging.getLogger(__name__)


def action_gpus(action_record: Mapping[str, Any]) -> int:
    """GPUs an action's container holds, for accounting: the ``gpus`` annotation, else 1 when
    ``invoker-resources`` asks for ``gpu``, else 0."""
    ann = annotations_of(action_record)
    if "gpus" in ann:
        return int(ann["gpus"])
    return 1 if "gpu" in (ann.get("invoker-resources") or []) else 0


def activation_from_record(
    action: str, record: dict[str, Any], action_record: Mapping[str, Any] | None = None
) -> Activation:
    """Accounting from an activation record.

    OpenWhisk's ``start`` is when the container began work (including a cold start's init);
    ``waitTime`` is the time queued before it, ``initTime`` (present only on cold starts) the
    init. So ``submitted_at = start - waitTime``, ``started_at = start + initTime`` (the run
    itself) and ``billed_s`` = run + init = the record's ``duration``. ``busy_s`` comes from
    the runtime's ``__activation`` block, which is moved from the result to ``extra["runtime"]``.
    """
    ann = annotations_of(record)
    start_ms = int(record["start"])
    end_ms = int(record.get("end") or start_ms + int(record.get("duration") or 0))
    wait_ms = int(ann.get("waitTime") or 0)
    init_ms = int(ann.get("initTime") or 0)
    result = dict((record.get("response") or {}).get("result") or {})
    runtime = take_activation(result)
    busy_s = float(runtime.get("busy_s", max(0, end_ms - start_ms - init_ms) / 1000))
    meta = action_record or {}
    extra = {
        "runtime": runtime,
        "image": runtime.get("image", ""),
        "wait_s": wait_ms / 1000,
        "memory_mb": (meta.get("limits") or {}).get("memory"),
        "path": ann.get("path", ""),
    }
    return Activation(
        action=action,
        activation_id=str(record["activationId"]),
        result=result,
        submitted_at=(start_ms - wait_ms) / 1000,
        started_at=(start_ms + init_ms) / 1000,
        ended_at=end_ms / 1000,
        busy_s=busy_s,
        init_s=init_ms / 1000,
        cold="initTime" in ann,
        worker=f"{runtime.get('image', '')}#{runtime.get('pid', '')}" if runtime else "",
        gpus=action_gpus(meta),
        extra=extra,
    )


def failed_activations(action: str, records: list[dict[str, Any]],
                       action_record: Mapping[str, Any] | None = None) -> tuple[Activation, ...]:
    """The accounting of failed activations from their records (``duration``: what OpenWhisk
    bills), without their results. Only what was recorded: a lost activation, or one still
    running at the deadline, is billed by OpenWhisk but unknown here."""
    return tuple(replace(activation_from_record(action, r, action_record), result={}) for r in records)


ENGINE_HOSTS = {"evaluate": "generate", "profile": "generate"}
"""Action -> the action whose containers run it when it uses the vLLM engine. OpenWhisk picks
the container of an activation among its own action's, so an evaluation sent to ``evaluate``
would start a second engine in a container of its own (and the profile one in the torch-only
image of ``profile``); sent to ``generate`` with ``__action`` (``actions/runtime/server.py``:
``ENGINE_GUESTS``), it runs where the generation engines are built and pre-warmed, and pushes its
version into one of them (the profile measures that warm engine's decode grid)."""


def engine_host(action: str, payload: dict[str, Any]) -> str:
    """The action whose containers run ``action`` with ``payload`` (itself but for a vLLM
    evaluation or profile: ``ENGINE_HOSTS``)."""
    return ENGINE_HOSTS.get(action, action) if payload.get("engine") == "vllm" else action


class OpenWhiskInvoker:
    """The :class:`~flows.invokers.base.Invoker` for an OpenWhisk cluster.

    ``invoke("generate", payload)`` runs ``{package}/generate`` and returns its accounting;
    ``package`` is ``PKG`` (in the connection's namespace), ``/NS/PKG`` or ``/NS`` (the
    namespace's own actions), or empty (bare names).
    ``timeout_s`` bounds each activation, queueing and polling included (seconds); None waits as
    long as the controller may take for the action (``RetryPolicy.lost_after_s``: 2 x its time
    limit + 2 min). A ``timeout_s`` below an action's time limit is warned about once per action:
    an activation still running at the deadline fails its step and is not invoked again.
    ``prewarm("generate", n)`` fires ``n`` concurrent ``{"__prewarm": true}`` activations, which
    the runtime server answers before importing the action, so ``n`` containers start. A vLLM
    evaluation runs in the ``generate`` action's containers (``ENGINE_HOSTS``). Failed
    activations come back with their accounting for billing (``failed_activations``): on the
    error raised, and on the activation that a retry in place then gave.
    """

    sees_local_files = False

    def __init__(
        self,
        client: OpenWhiskClient,
        *,
        package: str = "rlhfless",
        timeout_s: float | None = None,
        prewarm_hold_s: float = PREWARM_HOLD_S,
    ) -> None:
        self.client = client
        # A leading "/" names the namespace (/NS/PKG) and must stay: qualified_name then gives
        # /NS/PKG/ACTION, which the client resolves in that namespace.
        self.package = package.rstrip("/")
        self.timeout_s = timeout_s
        self._warned: set[str] = set()
        self.prewarm_hold_s = prewarm_hold_s
        """How long each pre-warm activation holds its container, so that concurrent pre-warm
        calls cannot all be served by one already-warm container."""

    @classmethod
    def from_env(
        cls,
        *,
        package: str = "rlhfless",
        timeout_s: float | None = None,
        secret_block: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> OpenWhiskInvoker:
        """Connection from the environment or a Prefect Secret block (``OpenWhiskConfig.resolve``)."""
        return cls(OpenWhiskClient(OpenWhiskConfig.resolve(secret_block=secret_block), retry=retry), package=package, timeout_s=timeout_s)

    def __repr__(self) -> str:
        return f"OpenWhiskInvoker(package={self.package!r}, client={self.client!r})"

    def qualified_name(self, action: str) -> str:
        if action.startswith("/") or not self.package:
            return action
        return f"{self.package}/{action}"

    def invoke(self, action: str, payload: dict[str, Any], *, timeout_s: float | None = None) -> Activation:
        host = engine_host(action, payload)
        if host != action:  # run in the host action's containers, where its engine lives
            payload = {**payload, **Control(action=action).to_payload()}
        name = self.qualified_name(host)
        timeout_s = timeout_s or self.timeout_s
        deadline = self.client.deadline_after(timeout_s)  # reading the action's limits counts against it too
        failed: list[dict[str, Any]] = []  # the records of failed activations: billed
        meta: Mapping[str, Any] = {}
        try:
            meta = self.client.describe_action(name, deadline=deadline)
            self._check_timeout(name, meta, timeout_s)
            record = self.client.invoke(name, payload, timeout_s=self.client.time_left(deadline), failed=failed)
        except OpenWhiskError as exc:
            raise ActionError(action, str(exc), transient=exc.transient,
                              failed_attempts=failed_activations(action, failed, meta)) from exc
        except ActionError as exc:  # raised under the qualified name; report the logical one
            raise ActionError(action, exc.message, transient=exc.transient, activation_id=exc.activation_id,
                              failed_attempts=failed_activations(action, failed, meta)) from exc
        return replace(activation_from_record(action, record, meta),
                       failed_attempts=failed_activations(action, failed, meta))

    def _check_timeout(self, name: str, meta: Mapping[str, Any], timeout_s: float | None) -> None:
        """Warn, once per action, when ``timeout_s`` is below the action's time limit: an
        activation may then still run, healthy, when the caller stops waiting for it."""
        limit_ms = (meta.get("limits") or {}).get("timeout")
        if timeout_s is None or not limit_ms or timeout_s >= limit_ms / 1000 or name in self._warned:
            return
        self._warned.add(name)
        log.warning("invoker.timeout_s=%g is below the time limit of %s (%g s): an activation still running at "
                    "the deadline fails its step (it is not invoked again); raise invoker.timeout_s to at least "
                    "%g, or unset it to wait as long as OpenWhisk may", timeout_s, name, limit_ms / 1000,
                    limit_ms / 1000)

    def prewarm(self, action: str, count: int, *, model: dict[str, Any] | None = None,
                decode: DecodeSettings = DecodeSettings()) -> int:
        """Start ``count`` containers for ``action``; returns how many were cold starts now.
        With ``model`` each container also loads that policy version (``__prewarm_model``)
        into the engine ``decode`` names, built with its settings (``__prewarm_decode``; a
        vLLM engine is built once per container, then pushed into)."""
        if count <= 0:
            return 0
        name = self.qualified_name(action)

        def warm_one(_: int) -> bool:
            try:
                payload = Control(prewarm=True, prewarm_hold_s=self.prewarm_hold_s, prewarm_model=model,
                                  prewarm_decode=decode).to_payload()
                record = self.client.invoke(name, payload, timeout_s=self.timeout_s)
            except OpenWhiskError as exc:
                if not exc.transient:
                    raise ActionError(action, str(exc), transient=False) from exc
                log.warning("prewarm %s: %s", name, exc)
                return False
            except ActionError as exc:
                log.warning("prewarm %s: %s", name, exc)
                return False
            return "initTime" in annotations_of(record)

        with ThreadPoolExecutor(max_workers=min(count, 32), thread_name_prefix="ow-prewarm") as pool:
            return sum(pool.map(warm_one, range(count)))

    def close(self) -> None:
        self.client.close()
