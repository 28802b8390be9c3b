"""A local OpenWhisk controller emulator for tests (not shipped).

OpenWhisk itself cannot run on the project's machines (no package, no Docker daemon), so the
client is tested against this emulator. It serves the controller REST API subset RLHFless uses
(``/api/v1``: actions, packages, invoke, activations) and runs every activation in a REAL
action-protocol server process (``python -m actions.runtime.server``, see
``tests/ow_containers.py``): ``/init`` once per container, then ``/run``; containers stay warm,
one activation at a time each, a new one is started when all are busy. Activation records carry ``start``/``end``/``duration``, logs up to
the runtime's sentinel lines, and the ``waitTime``/``initTime``/``timeout``/``path``/``limits``
annotations, as OpenWhisk writes them.

Every request body it accepts and every response it sends is validated against the official
swagger (``infra/openwhisk/apiv1swagger.json``, a byte copy of apache/openwhisk's
``apiv1swagger.json``) with jsonschema. Where the swagger gives no schema (an invoke's 200/502,
a 429) the emulator checks against the definition OpenWhisk actually sends (``Activation``,
``ErrorMessage``). A violation is appended to ``violations`` and answered with HTTP 500; the
``ow_emulator`` fixture fails the test on any violation.

Fault knobs (thread-safe; each counts down per invoke request): ``throttle(k)`` (429),
``unavailable(k)`` (503), ``developer_error(k)`` (502 "action developer error" without running),
``lose(k)`` (202 with an id that is never stored). ``blocking_wait_cap_ms`` shortens every
blocking wait, so a slow action answers 202 and must be polled.

Use: ``with running_emulator() as emu: api_host, auth, namespace = emu.credentials`` (or
``emu.env()`` for ``OpenWhiskConfig.from_env``), or the ``ow_emulator`` fixture.

What it does not emulate: sequences, triggers, rules, package bindings, web actions,
``result=true``, Kafka, real throttling (only the injected 429s), intra-container concurrency,
and container isolation (actions run as local processes without memory limits).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import jsonschema
import pytest

try:
    from ow_containers import Container, ContainerPool
except ImportError:  # tests/ imported as a package
    from tests.ow_containers import Container, ContainerPool

REPO = Path(__file__).resolve().parents[1]
SWAGGER_CANDIDATES = (
    REPO / "infra" / "openwhisk" / "apiv1swagger.json",
    REPO.parent / "shared" / "specs" / "openwhisk-apiv1-swagger.json",
)
NOT_FOUND = "The requested resource does not exist."
DEV_ERROR_INIT = "The action did not initialize and exited unexpectedly."
DEV_ERROR_RUN = "The action did not produce a valid response and exited unexpectedly."

#: Action limit ranges. RAISED matches infra/openwhisk/values-gpu.yaml; OPENWHISK_DEFAULTS are
#: the stock ones, for tests of what an operator sees before raising them.
RAISED_LIMITS = {"memory": (128, 65_536), "timeout": (100, 3_600_000), "logs": (0, 10), "concurrency": (1, 1)}
OPENWHISK_DEFAULTS = {"memory": (128, 512), "timeout": (100, 300_000), "logs": (0, 10), "concurrency": (1, 1)}
STD_LIMITS = {"memory": 256, "timeout": 60_000, "logs": 10, "concurrency": 1}
UNITS = {"memory": "MB", "timeout": "milliseconds", "logs": "MB", "concurrency": "activations"}


class SwaggerViolation(AssertionError):
    pass


class Swagger:
    """Routes and JSON schemas from the swagger; ``check`` validates an instance."""

    def __init__(self, path: Path | None = None) -> None:
        path = path or next((p for p in SWAGGER_CANDIDATES if p.exists()), None)
        if path is None:
            raise FileNotFoundError(f"OpenWhisk swagger not found at any of {[str(p) for p in SWAGGER_CANDIDATES]}")
        self.spec = json.loads(path.read_text())
        self.base = self.spec["basePath"]
        self.routes = [
            (re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", tmpl) + "$"), ops) for tmpl, ops in self.spec["paths"].items()
        ]

    def schema(self, name: str) -> dict[str, Any]:
        return {"$ref": f"#/definitions/{name}"}

    def operation(self, method: str, path: str) -> dict[str, Any] | None:
        rel = path[len(self.base) :]
        for pattern, ops in self.routes:
            if pattern.match(rel):
                return ops.get(method.lower())
        return None

    def body_schema(self, op: dict[str, Any]) -> dict[str, Any] | None:
        return next((p["schema"] for p in op.get("parameters", []) if p.get("in") == "body"), None)

    def response_schema(self, op: dict[str, Any], status: int) -> dict[str, Any] | None:
        resp = op.get("responses", {}).get(str(status))
        if resp is None:
            return None
        if "$ref" in resp:
            resp = self.spec["responses"][resp["$ref"].split("/")[-1]]
        return resp.get("schema")

    def check(self, schema: dict[str, Any], instance: Any, where: str) -> list[str]:
        root = {**schema, "definitions": self.spec["definitions"]}
        errors = jsonschema.Draft4Validator(root).iter_errors(instance)
        return [f"{where}: {e.message} at /{'/'.join(map(str, e.absolute_path))}" for e in errors]



# ---------------------------------------------------------------------------- the controller
@dataclass
class _Pending:
    activation_id: str
    done: threading.Event = field(default_factory=threading.Event)
    record: dict[str, Any] | None = None


class HttpReply(Exception):
    def __init__(self, status: int, body: Any, schema: dict[str, Any] | None = None) -> None:
        super().__init__(status)
        self.status, self.body, self.schema = status, body, schema


class OpenWhiskEmulator:
    """The controller. ``start()`` binds a free loopback port; ``credentials`` is
    ``(api_host, auth, namespace)`` for ``OpenWhiskConfig``."""

    def __init__(
        self,
        *,
        namespace: str = "guest",
        limits: dict[str, tuple[int, int]] | None = None,
        extra_modules: tuple[str, ...] = ("ow_test_actions",),
        max_containers_per_action: int = 16,
        swagger: Swagger | None = None,
    ) -> None:
        self.namespace = namespace
        self.auth = f"{uuid.uuid4()}:{secrets.token_urlsafe(48)}"
        self.limits = dict(limits or RAISED_LIMITS)
        self.swagger = swagger or Swagger()
        self.pool = ContainerPool(extra_modules, max_containers_per_action)
        self.lock = threading.Lock()
        self.packages: dict[str, dict[str, Any]] = {}
        self.actions: dict[str, dict[str, Any]] = {}
        self.activations: dict[str, dict[str, Any]] = {}
        self.violations: list[str] = []
        self.requests: list[tuple[str, str, int]] = []
        self.num_invokes = 0
        self.runs: list[str] = []
        self.blocking_wait_cap_ms = 60_000
        self._faults = {"throttle": 0, "unavailable": 0, "developer_error": 0, "lose": 0, "polls_unavailable": 0}
        self.server: ThreadingHTTPServer | None = None
        self.api_host = ""

    # -- lifecycle and knobs
    def start(self) -> OpenWhiskEmulator:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self.server.daemon_threads = True
        self.api_host = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True, name="ow-emulator").start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self.pool.close()

    @property
    def credentials(self) -> tuple[str, str, str]:
        return self.api_host, self.auth, self.namespace

    def env(self) -> dict[str, str]:
        """The environment variables a client reads (``OpenWhiskConfig.from_env``)."""
        return {"WSK_APIHOST": self.api_host, "WSK_AUTH": self.auth, "__OW_NAMESPACE": self.namespace}

    def throttle(self, k: int) -> None:
        self._set("throttle", k)

    def unavailable(self, k: int) -> None:
        self._set("unavailable", k)

    def developer_error(self, k: int) -> None:
        self._set("developer_error", k)

    def lose(self, k: int) -> None:
        self._set("lose", k)

    def polls_unavailable(self, k: int) -> None:
        """The next ``k`` activation reads answer 503 (a controller restarting while its
        activations run on)."""
        self._set("polls_unavailable", k)

    def _set(self, fault: str, k: int) -> None:
        with self.lock:
            self._faults[fault] = k

    def _take(self, fault: str) -> bool:
        with self.lock:
            if self._faults[fault] > 0:
                self._faults[fault] -= 1
                return True
            return False

    def containers_started(self) -> int:
        return self.pool.num_started

    # -- request handling
    def handle(self, method: str, raw_path: str, headers: Any, body: bytes) -> tuple[int, Any, dict[str, str]]:
        url = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        op = self.swagger.operation(method, url.path)
        extra_headers: dict[str, str] = {}
        try:
            self._authenticate(headers.get("Authorization", ""))
            payload = self._parse_body(method, url.path, op, body)
            status, reply, schema = self._route(method, url.path, query, payload, extra_headers)
        except HttpReply as r:
            status, reply, schema = r.status, r.body, r.schema
        if schema is None and op is not None:
            schema = self.swagger.response_schema(op, status)
        if schema is None and status >= 400:
            schema = self.swagger.schema("ErrorMessage")
        if schema is not None:
            problems = self.swagger.check(schema, reply, f"response {method} {url.path} -> {status}")
            if problems:
                self._violation(problems)
                status, reply = 500, {"error": "emulator response violates the swagger: " + "; ".join(problems)}
        with self.lock:
            self.requests.append((method, url.path, status))
        return status, reply, extra_headers

    def _violation(self, problems: list[str]) -> None:
        with self.lock:
            self.violations.extend(problems)

    def _authenticate(self, header: str) -> None:
        scheme, _, token = header.partition(" ")
        try:
            supplied = base64.b64decode(token).decode() if scheme.lower() == "basic" else ""
        except ValueError:
            supplied = ""
        if not secrets.compare_digest(supplied.encode(), self.auth.encode()):
            raise HttpReply(401, {"error": "The supplied authentication is invalid", "code": _tid()})

    def _parse_body(self, method: str, path: str, op: dict[str, Any] | None, body: bytes) -> Any:
        if method not in ("PUT", "POST"):
            return None
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            raise HttpReply(400, {"error": "The request content was malformed", "code": _tid()}) from None
        schema = self.swagger.body_schema(op) if op else None
        if schema is not None:
            problems = self.swagger.check(schema, payload, f"request {method} {path}")
            if problems:
                self._violation(problems)
                raise HttpReply(400, {"error": "; ".join(problems), "code": _tid()})
        return payload

    def _route(
        self, method: str, path: str, query: dict[str, str], body: Any, headers: dict[str, str]
    ) -> tuple[int, Any, dict[str, Any] | None]:
        parts = [unquote(p) for p in path.split("/")]
        # ['', 'api', 'v1', 'namespaces', NS, COLLECTION, ...]
        if parts[:4] != ["", "api", "v1", "namespaces"] or len(parts) < 6:
            raise HttpReply(404, {"error": NOT_FOUND, "code": _tid()})
        ns, collection, rest = parts[4], parts[5], parts[6:]
        if ns not in ("_", self.namespace):
            raise HttpReply(403, {"error": f"The supplied authentication is not authorized to access '{ns}'.", "code": _tid()})
        if collection == "actions":
            return self._actions(method, rest, query, body, headers)
        if collection == "packages" and len(rest) == 1:
            return self._packages(method, rest[0], query, body)
        if collection == "activations" and rest and method == "GET":
            if self._take("polls_unavailable"):
                raise HttpReply(503, {"error": "Service Unavailable", "code": _tid()})
            return self._activation(rest)
        raise HttpReply(404, {"error": NOT_FOUND, "code": _tid()})

    # -- packages
    def _packages(self, method: str, name: str, query: dict[str, str], body: Any) -> tuple[int, Any, None]:
        with self.lock:
            existing = self.packages.get(name)
            if method == "GET" and existing is not None:
                return 200, self._package_view(name, existing), None
            if method == "PUT":
                if existing is not None and query.get("overwrite") != "true":
                    raise HttpReply(409, {"error": "resource already exists", "code": _tid()})
                version = _bump(existing["version"]) if existing else "0.0.1"
                self.packages[name] = {
                    "version": version,
                    "publish": bool(body.get("publish", False)),
                    "annotations": body.get("annotations", existing["annotations"] if existing else []),
                    "parameters": body.get("parameters", existing["parameters"] if existing else []),
                    "updated": _now_ms(),
                }
                return 200, self._package_view(name, self.packages[name]), None
            if method == "DELETE" and existing is not None:
                if any(k.startswith(name + "/") for k in self.actions):
                    raise HttpReply(409, {"error": "Package not empty (contains actions).", "code": _tid()})
                del self.packages[name]
                return 200, self._package_view(name, existing), None
        raise HttpReply(404, {"error": NOT_FOUND, "code": _tid()})

    def _package_view(self, name: str, pkg: dict[str, Any]) -> dict[str, Any]:
        actions = [
            {"name": k.split("/")[1], "version": a["version"], "annotations": a["annotations"]}
            for k, a in self.actions.items()
            if k.startswith(name + "/")
        ]
        return {"namespace": self.namespace, "name": name, **pkg, "binding": {}, "actions": actions}

    # -- actions
    def _actions(
        self, method: str, rest: list[str], query: dict[str, str], body: Any, headers: dict[str, str]
    ) -> tuple[int, Any, dict[str, Any] | None]:
        if not rest or (len(rest) == 2 and rest[1] == "" and method == "GET"):
            package = rest[0] if rest else None
            return 200, self._list_actions(package, query), {"type": "array", "items": {"$ref": "#/definitions/ActionMeta"}}
        if len(rest) > 2 or not all(rest):
            raise HttpReply(404, {"error": NOT_FOUND, "code": _tid()})
        key = "/".join(rest)
        if len(rest) == 2 and rest[0] not in self.packages:
            raise HttpReply(404, {"error": NOT_FOUND, "code": _tid()})
        if method == "PUT":
            return 200, self._put_action(key, body, query.get("overwrite") == "true"), None
        with self.lock:
            action = self.actions.get(key)
        if action is None:
            raise HttpReply(404, {"error": NOT_FOUND, "code": _tid()})
        if method == "GET":
            return 200, self._action_view(key, action), None
        if method == "DELETE":
            with self.lock:
                self.actions.pop(key, None)
            self.pool.drop(key)
            return 200, self._action_view(key, action), None
        if method == "POST":
            return self._invoke(key, action, body or {}, query, headers)
        raise HttpReply(405, {"error": f"method {method} not allowed", "code": _tid()})

    def _list_actions(self, package: str | None, query: dict[str, str]) -> list[dict[str, Any]]:
        limit = int(query.get("limit", 30)) or 200
        skip = int(query.get("skip", 0))
        if not 0 <= limit <= 200:
            raise HttpReply(400, {"error": "limit must be between 0 and 200", "code": _tid()})
        with self.lock:
            items = [(k, a) for k, a in self.actions.items() if package is None or k.startswith(package + "/")]
        items.sort(key=lambda kv: -kv[1]["updated"])
        out = []
        for key, action in items[skip : skip + limit]:
            view = self._action_view(key, action)
            view["exec"] = {"binary": False}
            view.pop("parameters")
            out.append(view)
        return out

    def _put_action(self, key: str, body: dict[str, Any], overwrite: bool) -> dict[str, Any]:
        with self.lock:
            existing = self.actions.get(key)
        if existing is not None and not overwrite:
            raise HttpReply(409, {"error": "resource already exists", "code": _tid()})
        exec_ = body.get("exec") or (existing or {}).get("exec")
        if not exec_:
            raise HttpReply(400, {"error": "exec undefined", "code": _tid()})
        if exec_.get("kind") != "blackbox" or not exec_.get("image"):
            raise HttpReply(400, {"error": "the emulator runs blackbox (docker) actions with an image only", "code": _tid()})
        limits = {**STD_LIMITS, **(existing or {}).get("limits", {}), **(body.get("limits") or {})}
        for name, (low, high) in self.limits.items():
            value = limits[name]
            if not low <= value <= high:
                side = "below" if value < low else "exceeds"
                unit = UNITS[name]
                raise HttpReply(
                    400, {"error": f"{name} {value} {unit} {side} allowed threshold of {low if value < low else high} {unit}", "code": _tid()}
                )
        # as OpenWhisk's updateWhiskAction (Actions.scala): the stored annotations less those named
        # in delAnnotations, with the body's merged in by key (an update never drops one otherwise)
        dropped = set(body.get("delAnnotations") or [])
        merged = {a["key"]: a for a in (existing or {}).get("annotations", []) if a["key"] not in dropped}
        merged.update({a["key"]: a for a in body.get("annotations") or []})
        annotations = list(merged.values())
        annotations = [a for a in annotations if a.get("key") != "exec"] + [{"key": "exec", "value": "blackbox"}]
        if existing is None and not any(a.get("key") == "provide-api-key" for a in annotations):
            annotations.append({"key": "provide-api-key", "value": False})
        action = {
            "version": _bump(existing["version"]) if existing else "0.0.1",
            "publish": bool(body.get("publish", False)),
            "exec": {"kind": "blackbox", "image": exec_["image"], "binary": False},
            "annotations": annotations,
            "parameters": body.get("parameters", (existing or {}).get("parameters", [])),
            "limits": {k: limits[k] for k in STD_LIMITS},
            "updated": _now_ms(),
        }
        with self.lock:
            self.actions[key] = action
        self.pool.drop(key)  # a new version gets new containers
        return self._action_view(key, action)

    def _action_view(self, key: str, action: dict[str, Any]) -> dict[str, Any]:
        pkg, _, name = key.rpartition("/")
        params = list(action["parameters"])
        if pkg:  # a packaged action is returned with the package's parameters merged in
            own = {p["key"] for p in params}
            params = [p for p in self.packages.get(pkg, {}).get("parameters", []) if p["key"] not in own] + params
        namespace = f"{self.namespace}/{pkg}" if pkg else self.namespace
        return {"namespace": namespace, "name": name, **{k: v for k, v in action.items()}, "parameters": params}

    # -- invoke
    def _invoke(
        self, key: str, action: dict[str, Any], params: dict[str, Any], query: dict[str, str], headers: dict[str, str]
    ) -> tuple[int, Any, dict[str, Any] | None]:
        with self.lock:
            self.num_invokes += 1
        if self._take("throttle"):
            raise HttpReply(429, {"error": "Too many requests in the last minute (count: 61, allowed: 60).", "code": _tid()})
        if self._take("unavailable"):
            raise HttpReply(503, {"error": "Service Unavailable", "code": _tid()})
        blocking = query.get("blocking") == "true"
        wait_ms = int(query.get("timeout", 60_000))
        if blocking and not 1 <= wait_ms <= 60_000:
            raise HttpReply(400, {"error": "timeout must be between 1 and 60000 milliseconds", "code": _tid()})
        if query.get("result") == "true":
            raise HttpReply(400, {"error": "the emulator serves result=false only (the client never asks for it)", "code": _tid()})
        pending = _Pending(uuid.uuid4().hex)
        headers["x-openwhisk-activation-id"] = pending.activation_id
        accepted = (202, {"activationId": pending.activation_id}, None)
        if self._take("lose"):
            return accepted
        received = time.time()
        threading.Thread(target=self._activate, args=(key, action, params, pending, received), daemon=True).start()
        if blocking and pending.done.wait(min(wait_ms, self.blocking_wait_cap_ms) / 1000):
            record = pending.record
            assert record is not None
            status = {0: 200, 1: 502, 2: 502}.get(record["response"]["statusCode"], 500)
            return status, record, self.swagger.schema("Activation")
        return accepted

    def _activate(self, key: str, action: dict[str, Any], params: dict[str, Any], pending: _Pending, received: float) -> None:
        limits = action["limits"]
        all_params = {p["key"]: p for p in self._action_view(key, action)["parameters"]}
        init_env = {k: p["value"] for k, p in all_params.items() if p.get("init")}
        run_params = {**{k: p["value"] for k, p in all_params.items() if not p.get("init")}, **params}
        ann = {a["key"]: a["value"] for a in action["annotations"]}
        outcome: dict[str, Any] = {"init_ms": None, "timeout": False, "logs": []}
        if self._take("developer_error"):
            start = time.time()
            status_code, result = 2, {"error": DEV_ERROR_INIT}
        else:
            container = self.pool.acquire(key, action["exec"]["image"])
            start = time.time()
            status_code, result = self._run_in(container, key, action, init_env, run_params, ann, pending, outcome)
            status_code, result = self._limit_result(status_code, result)
        end = time.time()
        record = self._record(key, action, pending.activation_id, received, start, end, status_code, result, outcome)
        problems = self.swagger.check(self.swagger.schema("Activation"), record, f"activation record {key}")
        if problems:
            self._violation(problems)
        with self.lock:
            self.activations[pending.activation_id] = record
            self.runs.append(key)
        pending.record = record
        pending.done.set()

    def _run_in(
        self,
        container: Container,
        key: str,
        action: dict[str, Any],
        init_env: dict[str, Any],
        run_params: dict[str, Any],
        ann: dict[str, Any],
        pending: _Pending,
        outcome: dict[str, Any],
    ) -> tuple[int, dict[str, Any]]:
        """Init (once) and run; returns (statusCode, result). Broken containers are destroyed."""
        limit_s = action["limits"]["timeout"] / 1000
        destroy = False
        try:
            if not container.initialized:
                t0 = time.time()
                value = {"name": key, "main": "main", "code": "", "binary": False, "env": init_env}
                status, reply = container.post("/init", {"value": value}, limit_s)
                outcome["init_ms"] = int((time.time() - t0) * 1000)
                if status != 200:
                    destroy = True
                    error = reply.get("error") if isinstance(reply, dict) else None
                    return 2, {"error": error or DEV_ERROR_INIT}
                container.initialized = True
            body = {
                "value": run_params,
                "namespace": self.namespace,
                "action_name": f"/{self.namespace}/{key}",
                "api_host": self.api_host,
                "activation_id": pending.activation_id,
                "transaction_id": _tid(),
                "deadline": str(int((time.time() + limit_s) * 1000)),
            }
            if ann.get("provide-api-key") is True:
                body["api_key"] = self.auth
            status, result, outcome["logs"] = container.run(body, limit_s)
        except TimeoutError:
            destroy, outcome["timeout"] = True, True
            return 2, {"error": f"The action exceeded its time limits of {action['limits']['timeout']} milliseconds."}
        except (OSError, http.client.HTTPException):
            destroy = True
            return 2, {"error": DEV_ERROR_RUN}
        finally:
            self.pool.release(key, container, destroy=destroy or not container.alive())
        if not isinstance(result, dict):
            return 2, {"error": DEV_ERROR_RUN}
        if status != 200:  # a container failure: OpenWhisk keeps only the reply's error field
            return 2, {"error": result.get("error") or DEV_ERROR_RUN}
        if "error" in result:
            return 1, result
        return 0, result

    def _record(
        self,
        key: str,
        action: dict[str, Any],
        activation_id: str,
        received: float,
        start: float,
        end: float,
        status_code: int,
        result: dict[str, Any],
        outcome: dict[str, Any],
    ) -> dict[str, Any]:
        status = ("success", "application error", "action developer error")[status_code]
        annotations = [
            {"key": "path", "value": f"{self.namespace}/{key}"},
            {"key": "waitTime", "value": int((start - received) * 1000)},
            {"key": "kind", "value": "blackbox"},
            {"key": "timeout", "value": outcome["timeout"]},
            {"key": "limits", "value": action["limits"]},
        ]
        if outcome["init_ms"] is not None:
            annotations.append({"key": "initTime", "value": outcome["init_ms"]})
        start_ms, end_ms = int(start * 1000), int(end * 1000)
        return {
            "namespace": self.namespace,
            "name": key.rpartition("/")[2],
            "version": action["version"],
            "subject": self.namespace,
            "activationId": activation_id,
            "start": start_ms,
            "end": end_ms,
            "duration": end_ms - start_ms,
            "statusCode": status_code,
            "response": {
                "status": status,
                "statusCode": status_code,
                "success": status_code == 0,
                "result": result,
                "size": len(json.dumps(result)),
            },
            "logs": outcome["logs"],
            "annotations": annotations,
            "publish": False,
        }

    # -- result size limit
    max_result_bytes = 1_048_576
    """OpenWhisk's limit on an activation's result (``whisk.activation.payload.max``, 1 MB)."""

    def _limit_result(self, status_code: int, result: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """A result over ``max_result_bytes`` becomes the developer error OpenWhisk reports
        (``Messages.truncatedResponse``: the sizes, then the response's first bytes)."""
        data = json.dumps(result)
        if len(data) <= self.max_result_bytes:
            return status_code, result
        head = ("The action produced a response that exceeded the allowed length: "
                f"{len(data)} > {self.max_result_bytes} bytes.")
        return 2, {"error": f"{head} The truncated response was: {data[: self.max_result_bytes]}"}

    # -- activations
    def _activation(self, rest: list[str]) -> tuple[int, Any, None]:
        with self.lock:
            record = self.activations.get(rest[0])
        if record is None or len(rest) > 2:
            raise HttpReply(404, {"error": NOT_FOUND, "code": _tid()})
        if len(rest) == 1:
            return 200, record, None
        if rest[1] == "logs":
            return 200, {"logs": record["logs"]}, None
        if rest[1] == "result":
            return 200, record["response"], None
        raise HttpReply(404, {"error": NOT_FOUND, "code": _tid()})


def _make_handler(emulator: OpenWhiskEmulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            try:
                status, reply, headers = emulator.handle(self.command, self.path, self.headers, body)
            except Exception as exc:  # an emulator bug must show up in the test, not hang it
                emulator._violation([f"emulator crashed on {self.command} {self.path}: {exc!r}"])
                status, reply, headers = 500, {"error": f"emulator crashed: {exc!r}"}, {}
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = _serve

    return Handler


def _tid() -> str:
    return uuid.uuid4().hex


def _now_ms() -> int:
    return int(time.time() * 1000)


def _bump(version: str) -> str:
    major, minor, patch = (int(x) for x in version.split("."))
    return f"{major}.{minor}.{patch + 1}"


# ---------------------------------------------------------------------------- fixtures
@contextlib.contextmanager
def running_emulator(**kwargs: Any) -> Iterator[OpenWhiskEmulator]:
    """Start an emulator on a free loopback port; stop it and fail on swagger violations."""
    emulator = OpenWhiskEmulator(**kwargs).start()
    try:
        yield emulator
    finally:
        emulator.stop()
    if emulator.violations:
        raise SwaggerViolation("OpenWhisk emulator saw swagger violations:\n" + "\n".join(emulator.violations))


PORTAL_PAGE = b"<html><body>Login portal</body></html>"


@contextlib.contextmanager
def html_host() -> Iterator[str]:
    """A host that is not the OpenWhisk API (a login portal, a wrong ingress): it answers every
    request 200 with an HTML page. Yields its URL."""
    class Portal(BaseHTTPRequestHandler):
        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(PORTAL_PAGE)))
            self.end_headers()
            self.wfile.write(PORTAL_PAGE)

        do_GET = do_PUT = do_POST = answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Portal)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def ow_emulator() -> Iterator[OpenWhiskEmulator]:
    """A running emulator (guest namespace, raised limits, the ``probe`` test action available)."""
    with running_emulator() as emulator:
        yield emulator
