"""Apache OpenWhisk: a thin REST client and the invoker that runs RLHFless actions on it.

Modules: ``config`` (where the controller is, credentials), ``client`` (REST calls, retries,
polling), ``invoker`` (the Invoker protocol and activation accounting). Import from here.

:class:`OpenWhiskClient` follows the controller's swagger (``/api/v1``; see
``infra/openwhisk/apiv1swagger.json``) for the calls RLHFless needs: actions and
packages (list/get/put/delete), invoke, and activations (get/logs/result). No maintained Python
client exists, so this is ~one method per endpoint over one pooled, thread-safe
``httpx.Client``. :class:`OpenWhiskInvoker` maps ``generate`` to ``{package}/generate`` and turns
activation records into :class:`~flows.invokers.base.Activation` accounting.

What the controller says, and what the client does (``RetryPolicy`` holds every bound):

============================================  ===============================================
controller answer                             client behaviour
============================================  ===============================================
200 / 502 / 500 with an activation record     classify ``response.status`` (below)
202 ``{activationId}`` (non-blocking, or a    poll ``/activations/{id}`` with backoff; 404 there
blocking wait that ran out)                   means "not stored yet"
activation never stored within the            "lost": invoke again with the same payload,
controller's bound (``lost_after_s``: 2 x     at most ``lost_retries`` times (actions are
the time limit + 2 min; queueing counts)      idempotent), then ActionError(transient)
the caller's deadline passes while the        ActionError(transient=False) naming the id: it
activation is queued or running               runs on, and a retry would run a second copy
``success``                                   return the record
``application error`` (action returned        ActionError(transient=False) with the action's
``{"error": ...}``)                           message
``action developer error`` with the runtime's  ActionError(transient as the runtime classified
crash ``{"error": {"type", "message",         the exception: connection refused/reset, timeouts,
"transient"}}`` (``main`` raised: 502)        a store's 429/502/503 and injected faults are
                                              transient; a TypeError, CUDA OOM... permanent)
``action developer error``: time limit,       ActionError(transient=False): raise the limit,
result over the size limit, memory            return store keys, raise the memory
exhausted
``action developer error``: other (init       invoke again in place ``developer_error_retries``
failure, crash, bad response); ``whisk        times (a fresh container usually fixes it), then
internal error``                              ActionError(transient=True)
401 / 403                                     OpenWhiskAuthError (never retried, key never shown)
404 on an action                              OpenWhiskNotFound: "run `rlhfless deploy`"
413                                           non-transient: payload over ~1 MB
429                                           exponential backoff with jitter (honours
                                              Retry-After up to ``retry_after_max_s``),
                                              ``max_attempts`` and the deadline
503 / 500 / 504 / 408 / gateway 502 without   retried like 429 only when the call is idempotent
a record; timeouts and dropped connections    (a flag; every RLHFless action is)
connection refused / DNS failure              ``connect_attempts`` tries, then one line naming
                                              the host (OpenWhiskUnreachable, transient)
a body that is not JSON, a redirect           not the controller: one line naming the host and
                                              the setting (OpenWhiskError, not transient)
============================================  ===============================================

The requests of an invoke with a deadline (reading the action's limits, the invoke, its polls)
have their timeouts and retries cut to what is left of it; a blocking wait ends
``blocking_margin_s`` before it, so the controller's 202 (the activation id) arrives before the
read gives up. The auth key appears in no message, log line or repr (it is also registered with
``credentials.redact``).
"""

from flows.invokers.openwhisk.activations import annotations_of, classify_activation
from flows.invokers.openwhisk.api import (OpenWhiskAuthError, OpenWhiskError, OpenWhiskNotFound, OpenWhiskUnreachable,
                                          RetryPolicy)
from flows.invokers.openwhisk.client import DEFAULT_TIME_LIMIT_MS, MAX_BLOCKING_WAIT_MS, OpenWhiskClient
from flows.invokers.openwhisk.config import API_PATH, SECRET_BLOCK_ENV, OpenWhiskConfig
from flows.invokers.openwhisk.invoker import OpenWhiskInvoker, action_gpus, activation_from_record

__all__ = [
    "API_PATH",
    "DEFAULT_TIME_LIMIT_MS",
    "MAX_BLOCKING_WAIT_MS",
    "SECRET_BLOCK_ENV",
    "OpenWhiskAuthError",
    "OpenWhiskClient",
    "OpenWhiskConfig",
    "OpenWhiskError",
    "OpenWhiskInvoker",
    "OpenWhiskNotFound",
    "OpenWhiskUnreachable",
    "RetryPolicy",
    "action_gpus",
    "activation_from_record",
    "annotations_of",
    "classify_activation",
]
