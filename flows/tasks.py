"""Prefect tasks: one remote effect each (an action invocation), retried only when transient.

Every action is idempotent (its output keys derive from run, step and shard), so retrying a
transient failure -- a lost worker, a 429/503, an injected fault -- gives the same bytes.
Application errors (bad payload, missing input) are not retried.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.context import current
from flows.invokers.base import ActionError

RETRY_DELAYS_S = [0.2, 0.5, 1.0, 2.0]


def _transient_only(task: Any, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except ActionError as exc:
        return exc.transient
    except Exception:
        return False
    return False


@task(retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S, retry_condition_fn=_transient_only,
      cache_policy=NO_CACHE, task_run_name="{action}-{shard}", log_prints=False)
def invoke_action(action: str, payload: dict[str, Any], shard: str) -> dict[str, Any]:
    """Invoke ``action`` and return ``{"result": ..., "accounting": ...}``."""
    ctx = current()
    if ctx.should_inject(action, shard):
        payload = {**payload, "__inject_failure": True}
    activation = ctx.invoker.invoke(action, payload, timeout_s=ctx.config.invoker.timeout_s)
    return {"result": activation.result, "accounting": activation.accounting()}
