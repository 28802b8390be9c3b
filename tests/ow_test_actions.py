"""A test-only action, ``probe``, registered inside the emulator's action containers.

Never shipped and never placed under ``actions/``: the emulator imports this module in each
container before it starts the real action-protocol server, which then dispatches
``.../probe`` activations here. Behaviour is driven by the payload:

* ``sleep_s``: sleep first (slow actions, blocking waits that run out)
* ``print``: write a line to stdout (activation logs)
* ``raise``: raise an exception of type ``raise_type`` (a builtin name, default RuntimeError)
  with that message (the runtime answers 502 with its classification)
* ``error``: return ``{"error": ...}`` (an application error)
* ``getenv``: return ``{"env": os.environ.get(name)}`` (init parameters reach the container)
* otherwise ``{"ok": true, "echo": payload["echo"], "pid": ...}``
"""

from __future__ import annotations

import os
import sys
import time
import types
from typing import Any

from actions.runtime import server


def probe(args: dict[str, Any]) -> dict[str, Any]:
    if args.get("sleep_s"):
        time.sleep(float(args["sleep_s"]))
    if args.get("print"):
        print(args["print"], flush=True)
    if "raise" in args:
        import builtins

        raise getattr(builtins, str(args.get("raise_type") or "RuntimeError"))(str(args["raise"]))
    if "error" in args:
        return {"error": str(args["error"]), "field": "probe"}
    if "getenv" in args:
        return {"env": os.environ.get(str(args["getenv"]))}
    return {"ok": True, "echo": args.get("echo"), "pid": os.getpid()}


def register() -> None:
    module = types.ModuleType("actions.probe")
    module.main = probe  # type: ignore[attr-defined]
    sys.modules["actions.probe"] = module
    server.ACTION_NAMES = server.ACTION_NAMES | {"probe"}


register()
