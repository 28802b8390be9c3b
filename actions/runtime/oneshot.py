"""Run one action once, in a process of its own: ``python -m actions.runtime.oneshot ACTION OUT``.

The request (JSON) comes on stdin. The file ``OUT`` receives, whole or not at all (so nothing
the action or its libraries print can corrupt it), ``{"result": ...}`` -- the action's result,
an application error ``{"error": ...}`` included -- or, when the action raised,
``{"crash": ...}``: the exception classified as the runtime server classifies it
(``actions.runtime.errors.describe_crash``), with the traceback, secrets scrubbed, on stderr.
Used by the control plane for an action that must read its machine's files while the other
actions run elsewhere (``flows/invokers/child.py``). A Ctrl-C (SIGINT) ends it with one line on
stderr, no traceback and no ``OUT``, and exit status 130.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys

from actions.runtime.errors import describe_crash
from actions.runtime.server import ACTION_NAMES, print_redacted_traceback


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ACTION_NAMES:
        print(f"usage: python -m actions.runtime.oneshot ACTION OUT (ACTION one of {sorted(ACTION_NAMES)})",
              file=sys.stderr)
        return 2
    action, out = args
    try:
        record = {"result": importlib.import_module(f"actions.{action}").main(json.load(sys.stdin))}
    except KeyboardInterrupt:
        # Ctrl-C at the terminal reaches the caller too, which stops and kills this process if it
        # lingers: one line, not a traceback that reads like a failure of the action.
        print(f"[rlhfless] {action} interrupted (SIGINT); no result written", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    except Exception as exc:  # classified for the caller, which decides on a retry
        print_redacted_traceback()  # stderr is the worker's log: no secret in it
        record = {"crash": describe_crash(exc)}
    tmp = f"{out}.part"
    with open(tmp, "w") as fh:
        json.dump(record, fh)
    os.replace(tmp, out)
    return 1 if "crash" in record else 0


if __name__ == "__main__":
    sys.exit(main())
