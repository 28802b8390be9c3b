"""Prefect tasks: one remote effect each (an action invocation), retried only when transient.

Every action is idempotent (its output keys derive from run, step and shard), so retrying a
transient failure -- a killed or lost worker, a 429/502/503, a timeout, an injected fault --
gives the same bytes. Application errors (bad payload, missing input) and permanent crashes (a
``TypeError``, CUDA out of memory: ``actions.runtime.errors``) fail on the first attempt, and
so does an OpenWhisk activation still running when ``invoker.timeout_s`` runs out: it goes on,
and a retry would start a second copy beside it. An action whose store did not answer is
retried once (``STORE_UNREACHABLE_RETRIES``): its store client has retried already.

GPU actions hold slots of an optional Prefect global concurrency limit while they run
(``invoker.gpu_concurrency_limit``), so several campaigns share one GPU pool without
oversubscribing it. Only the activation holds the slots, never a retry's back-off.

A platform bills a failed attempt as it bills a successful one, but a retry leaves only the
last attempt's result to the caller: each failed attempt's accounting, as its invoker knew it
(``ActionError.failed_attempts``, and ``Activation.failed_attempts`` for attempts retried inside
the invoker), goes to the list of the enclosing :func:`failed_attempts` (the step's).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency
from pydantic import BaseModel

from actions.contracts import parse_result
from actions.store.profile_cache import ProfileResult
from flows.config import CampaignConfig
from flows.invokers.base import ActionError, Activation
from flows.step.context import current

R = TypeVar("R", bound=BaseModel)
log = logging.getLogger(__name__)

RESULTS = {"profile": ProfileResult}
"""Result contracts beyond ``contracts.RESULT_MODELS`` (defined where the action's logic is)."""

RETRY_DELAYS_S = [0.2, 0.5, 1.0, 2.0]
STORE_UNREACHABLE_RETRIES = 1
"""Retries of an action that failed because its store did not answer: the store client had
already tried ``max_attempts`` times (up to 5 x 60 s on a hung endpoint); one more activation
covers a fault of that worker's network, and four more would only keep a dead endpoint's
campaign waiting 20 minutes longer."""

GPU_ACTIONS = frozenset({"prefill", "generate", "score", "train_step", "evaluate", "warmup", "profile"})
"""The actions on the GPU image (``x-gpu-action`` in infra/openwhisk/actions.yaml). ``score`` is
one: it runs forward passes of the policy and the reference (and the critic for PPO)."""


GPU_SLOT_LEASE_S = 60.0
"""Seconds of the server's lease on a GPU action's slots, renewed in the background while it
runs: how long the slots of a process that died without unwinding (``kill -9``, a cancelled
deployment run whose process outlived Prefect's 30 s grace period and was killed) stay held
before the server frees them (within about 75 s: its sweep runs every 15 s). A cancel that
unwinds (the worker's SIGTERM, which the flow answers within about a second) releases them at
once. Prefect's default, 300 s, kept a killed process's slots from the next run for five
minutes."""


def gpu_slots(action: str, cfg: CampaignConfig) -> contextlib.AbstractContextManager:
    """Hold ``scaling.gpus_per_actor`` slots of the GPU limit while a GPU action runs.

    ``strict=False``: a limit the server does not know is skipped with a warning, so a
    missing ``prefect gcl create`` degrades to "no limit" instead of failing the campaign.
    The lease (``GPU_SLOT_LEASE_S``) is renewed in the background, so activations may outlast it.
    """
    name = cfg.invoker.gpu_concurrency_limit
    if name is None or action not in GPU_ACTIONS:
        return contextlib.nullcontext()
    return concurrency(name, occupy=cfg.scaling.gpus_per_actor, strict=False, lease_duration=GPU_SLOT_LEASE_S)


@contextlib.contextmanager
def spare_gpu_slots(action: str, count: int, cfg: CampaignConfig) -> Iterator[int]:
    """Hold, without waiting, the GPU limit's slots for as many of ``count`` actors of
    ``action`` as it has free now, and yield that number (``count`` where no limit applies:
    none named, a CPU action, a name the server does not know, a disabled limit).

    For a pre-warm: its containers take GPUs as activations do, but one that waited for slots
    would start after the activations it warms for, so it warms fewer containers instead (0
    where the limit cannot be read: a pre-warm is best effort)."""
    name = cfg.invoker.gpu_concurrency_limit
    if name is None or action not in GPU_ACTIONS or count < 1:
        yield count
        return
    per_actor = cfg.scaling.gpus_per_actor
    try:
        from prefect.client.orchestration import get_client
        from prefect.concurrency._asyncio import ConcurrencySlotAcquisitionError  # sync.concurrency raises it
        from prefect.exceptions import ObjectNotFound

        with get_client(sync_client=True) as client:
            try:
                limit = client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                limit = None
    except Exception as exc:  # an unreachable server: no pre-warm rather than oversubscribe
        log.warning("pre-warm of %s skipped: the GPU limit %r cannot be read (%s)", action, name, exc)
        yield 0
        return
    if limit is None or not limit.active:
        yield count
        return
    spare = min(count, (limit.limit - limit.active_slots) // per_actor)
    if spare < 1:
        yield 0
        return
    with contextlib.ExitStack() as held:
        try:
            # One request, no retry: the server answers 423 at once where the slots were taken
            # between the read and now. The timeout bounds a server too slow to answer, not a
            # wait for slots (a tight one refused free slots on a loaded control plane).
            held.enter_context(concurrency(name, occupy=spare * per_actor, max_retries=0, timeout_seconds=30.0,
                                           strict=False, lease_duration=GPU_SLOT_LEASE_S))
        except (TimeoutError, ConcurrencySlotAcquisitionError) as exc:
            log.info("pre-warm of %s skipped: the GPU limit %r has no %d free slots now (%s)",
                        action, name, spare * per_actor, exc)
            spare = 0
        yield spare


def _transient_only(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition: a transient :class:`ActionError`, and an unreachable store
    only ``STORE_UNREACHABLE_RETRIES`` times (``task_run.run_count``: attempts so far)."""
    try:
        state.result()
    except ActionError as exc:
        if exc.crash_type == "StoreUnreachable":
            return exc.transient and task_run.run_count <= STORE_UNREACHABLE_RETRIES
        return exc.transient
    except Exception:
        return False
    return False


_FAILED: ContextVar[list[Activation] | None] = ContextVar("rlhfless_failed_attempts", default=None)
_RETURNED: ContextVar[list[Activation] | None] = ContextVar("rlhfless_returned_activations", default=None)
_FAILED_LOCK = threading.Lock()


@contextlib.contextmanager
def failed_attempts() -> Iterator[list[Activation]]:
    """Collect into the list it yields the failed attempts of every action invoked in this
    context: by the caller and by the tasks it submits (Prefect runs a submitted task in a copy
    of the submitter's context, which holds the same list). A step's: its flow collects its
    successful activations itself (``StepOutcome.records``)."""
    attempts: list[Activation] = []
    token = _FAILED.set(attempts)
    try:
        yield attempts
    finally:
        _FAILED.reset(token)


@dataclass(frozen=True)
class Ledger:
    """The accounting of the activations invoked in an :func:`accounted` block: those that
    returned (``records``) and the failed attempts (``failed``), as a step's cost counts them."""

    records: list[Activation]
    failed: list[Activation]


@contextlib.contextmanager
def accounted() -> Iterator[Ledger]:
    """Collect into the :class:`Ledger` it yields every activation of the actions invoked in
    this context, as :func:`failed_attempts` collects failed ones (submitted tasks included; a
    thread pool's job only when submitted with a copy of the context). For what the campaign
    invokes outside its steps: set-up and evaluations. An inner block keeps its activations
    from the outer one."""
    ledger = Ledger([], [])
    returned, failed = _RETURNED.set(ledger.records), _FAILED.set(ledger.failed)
    try:
        yield ledger
    finally:
        _FAILED.reset(failed)
        _RETURNED.reset(returned)


def _note(collector: ContextVar[list[Activation] | None], activations: Sequence[Activation], shard: str) -> None:
    collected = collector.get()
    if collected is not None and activations:
        with _FAILED_LOCK:
            collected.extend(replace(a, shard=shard) for a in activations)


def _note_failed(attempts: Sequence[Activation], shard: str) -> None:
    _note(_FAILED, attempts, shard)


@dataclass(frozen=True)
class Returned(Generic[R]):
    """One action's validated result (its contract in ``actions/contracts.py``) and
    the activation's accounting."""

    result: R
    record: Activation


@task(retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S, retry_condition_fn=_transient_only,
      cache_policy=NO_CACHE, task_run_name="{action}-{shard}", log_prints=False)
def invoke_action(action: str, payload: dict[str, Any], shard: str) -> Returned:
    """Invoke ``action`` and validate its result against the action's contract on arrival
    (``contracts.parse_result``: a result that does not fit fails the task, not a later read)."""
    ctx = current()
    payload = {**payload, **ctx.faults.control(action, shard).to_payload()}  # empty unless faults.* are set
    try:
        with gpu_slots(action, ctx.config):
            activation = ctx.invoker.invoke(action, payload, timeout_s=ctx.config.invoker.timeout_s)
    except ActionError as exc:
        _note_failed(exc.failed_attempts, shard)  # billed, whether or not a retry follows
        raise
    _note_failed(activation.failed_attempts, shard)
    _note(_RETURNED, [activation], shard)  # inside accounted() only: a step collects its own records
    return Returned(parse_result(action, activation.result, RESULTS.get(action)), replace(activation, shard=shard))
