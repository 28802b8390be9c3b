"""The environment an OpenWhisk ``/init`` sets in an action container (``value.env``: the
action's parameters marked for init, such as the store's keys), checked whole before any of it
is set. Imports only the standard library: a container answers ``/init`` before anything loads."""

from __future__ import annotations

import json
import os
from typing import Any


def init_environment(body: Any) -> dict[str, str] | None:
    """The environment an ``/init`` body sets (``value.env``; absent or null = none), each
    value a string as given or its JSON text, as OpenWhisk's runtimes set them; None for a
    body that is not of that shape or names a variable the OS would refuse."""
    if not isinstance(body, dict):
        return None
    value = {} if body.get("value") is None else body["value"]
    if not isinstance(value, dict):
        return None
    env = {} if value.get("env") is None else value["env"]
    if not isinstance(env, dict):
        return None
    out = {key: val if isinstance(val, str) else json.dumps(val) for key, val in env.items()}
    if any(not isinstance(key, str) or not key or "=" in key or "\0" in key or "\0" in val for key, val in out.items()):
        return None
    try:  # a lone surrogate JSON allows, the environment does not (nor as os.fsencode's raw bytes)
        for key, val in out.items():
            key.encode("utf-8"), val.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return out
