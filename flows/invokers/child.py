"""Child-process invoker: each activation is a fresh ``python -m actions.runtime.oneshot`` on
this machine.

For an action that must read this machine's files (``prepare`` reads ``model.path`` and the
datasets) when the campaign's other actions run on a cluster that cannot see them. The child
keeps torch out of the control plane's process and exits with its memory. Its stdout and stderr
go to ``log_path`` (or this process's stderr); the result comes back through a file
(``actions/runtime/oneshot.py``), classified as the runtime server classifies crashes.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from actions.contracts import DecodeSettings
from actions.runtime.errors import crash_text
from flows.config import LOCAL_TIMEOUT_S
from flows.invokers.base import ActionError, Activation


class ChildProcessInvoker:
    """One process per activation, on this machine, with this process's environment."""

    sees_local_files = True

    def __init__(self, log_path: str | Path | None = None) -> None:
        self.log_path = Path(log_path) if log_path else None

    def invoke(self, action: str, payload: dict[str, Any], *, timeout_s: float | None = None) -> Activation:
        started = time.time()
        activation_id = uuid.uuid4().hex

        def spent(result: dict[str, Any]) -> Activation:  # the child's accounting, failed or not
            ended = time.time()
            return Activation(action=action, activation_id=activation_id, result=result, submitted_at=started,
                              started_at=started, ended_at=ended, busy_s=ended - started, worker="child", gpus=0)

        with tempfile.TemporaryDirectory(prefix="rlhfless-oneshot-") as tmp, \
                (self.log_path.open("ab") if self.log_path else contextlib.nullcontext(sys.stderr)) as log:
            out = Path(tmp) / "result.json"
            try:
                proc = subprocess.run([sys.executable, "-m", "actions.runtime.oneshot", action, str(out)],
                                      input=json.dumps(payload).encode(), stdout=log, stderr=log,
                                      timeout=timeout_s, check=False)
            except subprocess.TimeoutExpired:
                raise ActionError(action, _past_timeout(timeout_s), transient=False,
                                  failed_attempts=(spent({}),)) from None
            record = json.loads(out.read_text()) if out.is_file() else None
        activation = spent({})
        if record is None:
            raise ActionError(action, f"the child process exited with status {proc.returncode} before it wrote "
                              "a result", transient=True, failed_attempts=(activation,))
        if "crash" in record:
            crash = record["crash"]
            raise ActionError(action, crash_text(crash), transient=bool(crash.get("transient")),
                              failed_attempts=(activation,))
        result = record["result"]
        if "error" in result:
            raise ActionError(action, str(result["error"]), transient=False, failed_attempts=(activation,))
        activation.result = result
        return activation

    def prewarm(self, action: str, count: int, *, model: dict[str, Any] | None = None,
                decode: DecodeSettings = DecodeSettings()) -> int:
        return 0  # every activation starts its own process

    def close(self) -> None:
        pass


def _past_timeout(timeout_s: float) -> str:
    """The one line for a child past ``invoker.timeout_s``, with the fix that raises it."""
    fix = "raise invoker.timeout_s"
    if timeout_s < LOCAL_TIMEOUT_S:
        fix += f", or unset it for {LOCAL_TIMEOUT_S:g} s"
    return f"the child process ran past {timeout_s:g} s (invoker.timeout_s={timeout_s:g}); {fix}"
