"""The action-protocol server answers without transport stalls, refuses what it cannot run as a
permanent typed error, and sends strict JSON."""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import threading
import types
from http.server import ThreadingHTTPServer

import httpx
import pytest

from actions.contracts import TrainStepResult
from actions.runtime.server import SENTINEL, ActionRuntime, encode_reply, make_handler


def test_replies_go_out_with_nagle_disabled():
    """A reply is two small writes (headers, body); with Nagle's algorithm the body waits for
    the client's delayed ACK (~40 ms a call on loopback), so every accepted connection must
    have TCP_NODELAY set."""
    handler = make_handler(ActionRuntime())
    seen: list[int] = []

    class Recording(handler):  # type: ignore[misc, valid-type]
        def setup(self) -> None:
            super().setup()
            seen.append(self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        with httpx.Client() as client:
            assert client.get(f"http://127.0.0.1:{port}/").json()["ok"] is True
    finally:
        server.shutdown()
        server.server_close()
    assert seen and all(flag != 0 for flag in seen), seen


@pytest.mark.parametrize(
    ("body", "kind", "message"),
    [
        ({"value": {}, "action_name": "/guest/rlhfless/generate-7b"}, "UnknownAction",
         "unknown action 'generate-7b'; known: evaluate, generate, init_critic, noop,"),
        ({"value": {"__threads": 0}, "action_name": "/guest/rlhfless/noop"}, "InvalidControlKey",
         "control key __threads: input should be greater than or equal to 1 (got 0)"),
        ({"value": [1], "action_name": "/guest/rlhfless/noop"}, "BadRequest",
         "run body must carry a JSON object under 'value'"),
    ],
)
def test_refusals_are_permanent_typed_errors_ending_with_sentinels(capsys, body, kind, message):
    """OpenWhisk would file a non-200 reply as a developer error, which the client retries on
    fresh containers; a refusal fails the same way every time, so it says so (transient false)."""
    runtime = ActionRuntime()
    status, reply = runtime.run(body)
    assert status == 200 and set(reply) == {"error"}
    assert reply["error"]["type"] == kind and reply["error"]["transient"] is False
    assert reply["error"]["message"].startswith(message)
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == SENTINEL and err.splitlines()[-1] == SENTINEL
    assert runtime.num_runs == 0


def _strict(literal: str) -> None:
    raise ValueError(f"invalid JSON literal {literal}")  # as OpenWhisk's JSON parser refuses them


def test_non_finite_floats_go_out_as_strings_the_typed_result_reads_back():
    metrics = {"grad_norm": math.inf, "loss/policy": math.nan, "kl": -math.inf, "entropy": 0.5}
    data = encode_reply({"metrics": metrics, "list": [math.nan, 1.0], "ok": True})
    parsed = json.loads(data, parse_constant=_strict)
    assert parsed["metrics"] == {"grad_norm": "Infinity", "loss/policy": "NaN", "kl": "-Infinity", "entropy": 0.5}
    assert parsed["list"] == ["NaN", 1.0]
    result = TrainStepResult(policy_key="p", policy_version=1, weights_sha256="0" * 64, optimizer_key="o",
                             bytes_uploaded=1, metrics=metrics)
    read = TrainStepResult.model_validate(json.loads(encode_reply(result.model_dump()), parse_constant=_strict))
    assert read.metrics["grad_norm"] == math.inf and read.metrics["kl"] == -math.inf
    assert math.isnan(read.metrics["loss/policy"]) and read.metrics["entropy"] == 0.5


def test_a_diverged_result_reaches_the_client_as_strict_json(monkeypatch):
    stub = types.ModuleType("actions.noop")
    stub.main = lambda args: {"metrics": {"grad_norm": math.inf, "loss/policy": math.nan}}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "actions.noop", stub)
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(ActionRuntime()))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with httpx.Client() as client:
            assert client.post(f"{url}/init", json={"value": {}}).status_code == 200
            resp = client.post(f"{url}/run", json={"value": {}, "action_name": "/guest/rlhfless/noop"})
    finally:
        server.shutdown()
        server.server_close()
    assert resp.status_code == 200
    metrics = json.loads(resp.content, parse_constant=_strict)["metrics"]
    assert metrics == {"grad_norm": "Infinity", "loss/policy": "NaN"}


def test_an_interrupted_oneshot_writes_one_line_and_no_result(monkeypatch, tmp_path, capsys):
    """Ctrl-C reaches the child invoker's process too: it stops with one line, no traceback."""
    import io

    import actions.noop
    from actions.runtime import oneshot

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(actions.noop, "main", interrupted)
    monkeypatch.setattr("sys.stdin", io.StringIO("{}"))
    assert oneshot.main(["noop", str(tmp_path / "out.json")]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "out.json").exists()


def test_a_malformed_init_is_refused_with_an_error_and_a_good_one_still_initializes(monkeypatch):
    from actions.runtime.server import ActionRuntime

    monkeypatch.setenv("RLHFLESS_TEST_INIT", "0")  # restored after the test: init sets the environment

    runtime = ActionRuntime()
    monkeypatch.delenv("RLHFLESS_TEST_INIT_SET", raising=False)
    bad_names = [{"RLHFLESS_TEST_INIT_SET": "1", name: "1"} for name in ("A=B", "", "A\0B")]
    for body in ({"value": "x"}, {"value": []}, {"value": 0}, {"value": {"env": ["A"]}}, {"value": {"env": []}},
                 ["value"], *({"value": {"env": env}} for env in bad_names),
                 {"value": {"env": {"RLHFLESS_TEST_INIT_SET": "1", "X": "a\0b"}}},
                 {"value": {"env": {"RLHFLESS_TEST_INIT_SET": "1", "X": "\ud800"}}},
                 {"value": {"env": {"RLHFLESS_TEST_INIT_SET": "1", "X": "\udc80"}}}):
        status, reply = runtime.init(body)
        assert status == 400 and "'value.env' an object whose keys are environment variable names" in reply["error"]
        assert "RLHFLESS_TEST_INIT_SET" not in os.environ  # a refused init sets nothing
    assert not runtime.initialized
    assert runtime.init({"value": {"env": {"RLHFLESS_TEST_INIT": "1", "RLHFLESS_TEST_INIT_SET": {"a": [1]}}}}) == (
        200, {"ok": True})
    assert runtime.initialized and os.environ["RLHFLESS_TEST_INIT"] == "1"
    assert os.environ["RLHFLESS_TEST_INIT_SET"] == '{"a": [1]}'  # a non-string value as its JSON text
    assert ActionRuntime().init({"value": {"env": None}}) == ActionRuntime().init({}) == (200, {"ok": True})


_LEAKY_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzz0secret"


def _leaky(args):
    raise RuntimeError(f"S3 said no to AWS_SECRET_ACCESS_KEY={_LEAKY_SECRET}")


def test_a_crashing_activation_logs_its_traceback_without_the_secret(monkeypatch, capsys):
    """stderr is the activation's log: the traceback printed there is scrubbed like the result."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", _LEAKY_SECRET)
    stub = types.ModuleType("actions.noop")
    stub.main = _leaky  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "actions.noop", stub)
    status, reply = ActionRuntime().run({"value": {}, "action_name": "/guest/rlhfless/noop"})
    assert status == 502 and _LEAKY_SECRET not in json.dumps(reply)
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: S3 said no to AWS_SECRET_ACCESS_KEY=[REDACTED]" in err
    assert _LEAKY_SECRET not in err


def test_a_failed_prewarm_load_logs_its_traceback_without_the_secret(monkeypatch, capsys):
    from actions.runtime.server import _preload_model

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", _LEAKY_SECRET)
    monkeypatch.setattr("importlib.import_module", lambda name: _leaky({}))
    assert _preload_model({}, "noop", None) is False  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "Traceback" in err and "[REDACTED]" in err and _LEAKY_SECRET not in err


def test_a_crashing_oneshot_logs_its_traceback_without_the_secret(monkeypatch, tmp_path, capsys):
    import io

    import actions.noop
    from actions.runtime import oneshot

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", _LEAKY_SECRET)
    monkeypatch.setattr(actions.noop, "main", _leaky)
    monkeypatch.setattr("sys.stdin", io.StringIO("{}"))
    assert oneshot.main(["noop", str(tmp_path / "out.json")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "[REDACTED]" in err and _LEAKY_SECRET not in err
    assert _LEAKY_SECRET not in (tmp_path / "out.json").read_text()
