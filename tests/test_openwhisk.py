"""OpenWhisk client and invoker, against the swagger-validating controller emulator.

OpenWhisk cannot run on these machines; ``tests/ow_emulator.py`` serves the controller API and
runs each activation in a real action-protocol server process. The ``ow_emulator`` fixture
fails a test whose requests or responses violate the official swagger.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from flows.config import InvokerConfig
from flows.invokers.base import ActionError
from flows.invokers.factory import make_invoker
from flows.invokers.openwhisk import (
    OpenWhiskAuthError,
    OpenWhiskClient,
    OpenWhiskConfig,
    OpenWhiskError,
    OpenWhiskInvoker,
    OpenWhiskNotFound,
    OpenWhiskUnreachable,
    RetryPolicy,
    activation_from_record,
    classify_activation,
)

try:
    from ow_emulator import PORTAL_PAGE, OpenWhiskEmulator, SwaggerViolation, html_host, ow_emulator, running_emulator  # noqa: F401
except ImportError:  # tests/ imported as a package
    from tests.ow_emulator import (  # noqa: F401
        PORTAL_PAGE,
        OpenWhiskEmulator,
        SwaggerViolation,
        html_host,
        ow_emulator,
        running_emulator,
    )

FAST = RetryPolicy(
    backoff_base_s=0.01,
    backoff_max_s=0.05,
    poll_initial_s=0.01,
    poll_max_s=0.05,
    min_time_limit_s=0.0,  # the controller's bound, 2 x limit + grace, on the tests' short limits
    lost_grace_s=0.2,
    blocking_wait_ms=10_000,
    request_timeout_s=10.0,
)
CPU_IMAGE = "rlhfless/runtime-cpu:0.1.0"

MISSING_FIX = ("run `rlhfless deploy` with a manifest whose `package:` is 'rlhfless', or set invoker.package to "
               "the package your manifest deploys")


def make_client(emu: OpenWhiskEmulator, retry: RetryPolicy = FAST, **overrides: str) -> OpenWhiskClient:
    api_host, auth, _ = emu.credentials
    config = OpenWhiskConfig(overrides.get("api_host", api_host), overrides.get("auth", auth), overrides.get("namespace", "_"))
    return OpenWhiskClient(config, retry=retry, seed=0)


def put_action(client: OpenWhiskClient, name: str, *, timeout_ms: int = 20_000, gpus: int = 0) -> dict:
    try:
        client.get_package("rlhfless")
    except OpenWhiskNotFound:
        client.put_package("rlhfless", {"publish": False})
    body = {
        "exec": {"kind": "blackbox", "image": CPU_IMAGE},
        "limits": {"timeout": timeout_ms, "memory": 256},
        "annotations": [{"key": "gpus", "value": gpus}],
    }
    return client.put_action(f"rlhfless/{name}", body)


@pytest.fixture
def client(ow_emulator: OpenWhiskEmulator):
    client = make_client(ow_emulator)
    put_action(client, "probe", gpus=2)
    put_action(client, "noop")
    yield client
    client.close()


@pytest.fixture
def invoker(client: OpenWhiskClient):
    return OpenWhiskInvoker(client, package="rlhfless", timeout_s=30.0, prewarm_hold_s=0.3)


# ---------------------------------------------------------------------------- configuration
def test_config_from_env_normalises_host_and_hides_key(monkeypatch, tmp_path):
    env = {"WSK_APIHOST": "ow.example.org:31001", "WSK_AUTH": "23bc46b1-71f6:s3cr3tKEYvalue", "WSK_INSECURE": "true", "HOME": str(tmp_path)}
    config = OpenWhiskConfig.from_env(env)
    assert config.api_host == "https://ow.example.org:31001"
    assert config.namespace == "_" and config.verify is False
    assert "s3cr3tKEYvalue" not in repr(config) and "s3cr3tKEYvalue" not in repr(OpenWhiskClient(config))
    # inside an action, __OW_* variables are what OpenWhisk provides
    inner = OpenWhiskConfig.from_env({"__OW_API_HOST": "https://x/api/v1", "__OW_API_KEY": "a:b", "__OW_NAMESPACE": "team", "HOME": str(tmp_path)})
    assert (inner.api_host, inner.namespace) == ("https://x", "team")
    with pytest.raises(ValueError, match="set WSK_APIHOST and WSK_AUTH"):
        OpenWhiskConfig.from_env({"HOME": str(tmp_path)})
    with pytest.raises(ValueError, match="uuid:key") as info:
        OpenWhiskConfig("https://x", "no-colon-secret")
    assert "no-colon-secret" not in str(info.value)
    (tmp_path / ".wskprops").write_text("APIHOST=10.0.0.1:443\nAUTH=u:k\nNAMESPACE=ns1\n")
    props = OpenWhiskConfig.from_env({"HOME": str(tmp_path)})
    assert (props.api_host, props.auth, props.namespace) == ("https://10.0.0.1:443", "u:k", "ns1")


def test_config_from_prefect_secret_block(monkeypatch):
    import prefect.blocks.system as system

    stored = {"api_host": "http://127.0.0.1:3233", "auth": "uuid:key123", "namespace": "guest", "insecure": True}
    loads = []

    def fake_load(name):
        loads.append(name)
        return SimpleNamespace(get=lambda: stored)

    monkeypatch.setattr(system.Secret, "load", staticmethod(fake_load))
    config = OpenWhiskConfig.resolve(secret_block="ow-prod", env={})
    assert loads == ["ow-prod"]
    assert (config.api_host, config.auth, config.namespace, config.verify) == ("http://127.0.0.1:3233", "uuid:key123", "guest", False)
    # explicit arguments win over the block
    assert OpenWhiskConfig.resolve(api_host="http://h", auth="a:b", env={}).api_host == "http://h"


def _block(monkeypatch, value):
    import prefect.blocks.system as system

    monkeypatch.setattr(system.Secret, "load", staticmethod(lambda name: SimpleNamespace(get=lambda: value)))


BLOCK_KEY = "23bc46b1-71f6:123zO3xZCLrMN6v2BKK1dX"


@pytest.mark.parametrize("value, expected", [
    ('{"api_host": "https://ow.example", "auth": "%s", }' % BLOCK_KEY,
     "Prefect Secret block 'ow-conn' is not valid JSON (Expecting property name enclosed in double quotes: line 1"),
    ('{"api_host": "https://ow.example"}', "Prefect Secret block 'ow-conn' has no auth key; add \"auth\""),
    ({"auth": BLOCK_KEY}, "Prefect Secret block 'ow-conn' has no api_host key, WSK_APIHOST is not set and "),
    ({"api_host": "ht tp://bad", "auth": BLOCK_KEY},
     "'ht tp://bad' is not a URL; set the api_host key of Prefect Secret block 'ow-conn' to https://"),
    ({"api_host": "https://ow.example", "auth": "nocolon"}, "check the auth key of Prefect Secret block 'ow-conn'"),
    ("no-colon-key", "Prefect Secret block 'ow-conn' holds a string that is not 'uuid:key'"),
    ({"api_host": BLOCK_KEY, "auth": "https://ow.example"},  # swapped: the key in the host is not shown either
     "OpenWhisk API host is neither a URL nor a host name (its value is not shown: it may be a key); set the "
     "api_host key of Prefect Secret block 'ow-conn' to https://host[:port] and the key in the auth key of Prefect "
     "Secret block 'ow-conn' (are the two swapped?)"),
    ([BLOCK_KEY], "Prefect Secret block 'ow-conn' must hold 'uuid:key' or an object with api_host and auth"),
])
def test_a_bad_secret_block_is_named_with_its_key_never_its_value(monkeypatch, value, expected):
    """A block's errors name the block and the key to fix, not WSK_* variables it did not use,
    and never quote the value (it holds the key)."""
    _block(monkeypatch, value)
    with pytest.raises(ValueError) as info:
        OpenWhiskConfig.resolve(secret_block="ow-conn", env={})
    message = str(info.value)
    assert expected in message and "\n" not in message and "WSK_AUTH" not in message
    assert "123zO3xZCLrMN6v2BKK1dX" not in message and "nocolon" not in message and "no-colon-key" not in message


def test_connection_retries_are_counted_against_their_own_budget(caplog):
    """A refused connection is tried ``connect_attempts`` times: the warnings count those retries
    (1/2, 2/2), not the budget of throttled or unavailable answers (max_attempts)."""
    config = OpenWhiskConfig.from_env({"WSK_APIHOST": "http://127.0.0.1:9", "WSK_AUTH": "uuid1234:key12345678"})
    policy = RetryPolicy(max_attempts=8, connect_attempts=3, backoff_base_s=0.01, backoff_max_s=0.01)
    with caplog.at_level(logging.WARNING), OpenWhiskClient(config, retry=policy) as client:
        with pytest.raises(OpenWhiskUnreachable):
            client.get_action("rlhfless/generate")
    retries = [r.getMessage() for r in caplog.records if "connection to http://127.0.0.1:9 failed; retry" in r.getMessage()]
    assert [m.split("retry ")[1].split(" ")[0] for m in retries] == ["1/2", "2/2"], retries


def test_connection_errors_name_where_the_setting_came_from(monkeypatch, tmp_path):
    """A host that does not answer, or a key the controller rejects, names the setting to fix:
    the block's key for a block, the variable (or ~/.wskprops) it was read from otherwise."""
    closed = "http://127.0.0.1:9"
    _block(monkeypatch, {"api_host": closed, "auth": "uuid1234:key12345678", "namespace": 5})
    config = OpenWhiskConfig.resolve(secret_block="ow-conn", env={})
    assert config.namespace == "5"
    fast = RetryPolicy(connect_attempts=1, backoff_base_s=0.01)
    with OpenWhiskClient(config, retry=fast) as client, pytest.raises(OpenWhiskUnreachable) as info:
        client.get_action("rlhfless/generate")
    assert str(info.value).endswith("; check the api_host key of Prefect Secret block 'ow-conn'")
    inner = OpenWhiskConfig.from_env({"__OW_API_HOST": closed, "__OW_API_KEY": "a:b", "HOME": str(tmp_path)})
    with OpenWhiskClient(inner, retry=fast) as client:
        with pytest.raises(OpenWhiskUnreachable, match="check __OW_API_HOST$"):
            client.get_action("rlhfless/generate")
    (tmp_path / ".wskprops").write_text(f"APIHOST={closed}\nAUTH=u:k\n")
    props = OpenWhiskConfig.from_env({"HOME": str(tmp_path)})
    assert props.setting("api_host") == f"APIHOST in {tmp_path / '.wskprops'}"

    def rejects(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": "The supplied authentication is invalid"})

    with OpenWhiskClient(config, transport=httpx.MockTransport(rejects)) as client:
        with pytest.raises(OpenWhiskAuthError) as info:
            client.get_action("rlhfless/generate")
    assert str(info.value).endswith("(HTTP 401); check the auth key of Prefect Secret block 'ow-conn'")


def test_a_ca_bundle_that_is_missing_or_not_pem_names_the_setting_and_the_path(monkeypatch, tmp_path):
    import certifi

    garbage = tmp_path / "ca.pem"
    garbage.write_text("junk\n")
    env = {"WSK_APIHOST": "https://ow.example", "WSK_AUTH": "uuid1234:key12345678", "HOME": str(tmp_path)}
    for path, why in (("/nonexistent/ca.pem", "is not a file"), (str(garbage), "holds no readable CA certificate")):
        config = OpenWhiskConfig.from_env({**env, "WSK_CA_BUNDLE": path})
        with pytest.raises(ValueError) as info:
            OpenWhiskClient(config)
        message = str(info.value)
        assert message.startswith(f"WSK_CA_BUNDLE names {path!r}, which {why}")
        assert "set it to the PEM file" in message
    _block(monkeypatch, {"api_host": "https://ow.example", "auth": "uuid1234:key12345678", "ca_bundle": str(garbage)})
    block_config = OpenWhiskConfig.resolve(secret_block="ow-conn", env={})
    with pytest.raises(ValueError, match=r"^the ca_bundle key of Prefect Secret block 'ow-conn' names '.*ca\.pem'"):
        OpenWhiskClient(block_config)
    OpenWhiskClient(OpenWhiskConfig.from_env({**env, "WSK_CA_BUNDLE": certifi.where()})).close()  # a real one loads


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """(certificate, key) PEM files of a self-signed certificate for 127.0.0.1."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ow.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_a_controller_certificate_not_trusted_names_the_ca_bundle_setting_at_once(tmp_path):
    """A self-signed controller: one line naming WSK_CA_BUNDLE (not "check WSK_APIHOST"), and
    no retry, since verification fails the same way every time; with the bundle it is trusted."""
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"name": "generate", "namespace": "_/rlhfless", "version": "0.0.1", "exec": {"kind": "blackbox"}}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    cert, key = _self_signed(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {"WSK_APIHOST": f"https://127.0.0.1:{server.server_address[1]}", "WSK_AUTH": "uuid1234:key12345678",
           "HOME": str(tmp_path)}
    try:
        with OpenWhiskClient(OpenWhiskConfig.from_env(env)) as client:
            with pytest.raises(OpenWhiskError) as info:
                client.get_action("rlhfless/generate")
        message = str(info.value)
        assert "presented a TLS certificate this client does not trust" in message and "\n" not in message
        assert message.endswith("set WSK_CA_BUNDLE to the CA bundle that signed it (or WSK_INSECURE=true on a test "
                                "cluster)") and not info.value.transient and client.stats["connect"] == 0
        with OpenWhiskClient(OpenWhiskConfig.from_env({**env, "WSK_CA_BUNDLE": str(cert)})) as client:
            assert client.get_action("rlhfless/generate")["name"] == "generate"
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------- CRUD
def test_action_crud_roundtrip(ow_emulator: OpenWhiskEmulator):
    with make_client(ow_emulator) as client:
        with pytest.raises(OpenWhiskNotFound, match="package rlhfless does not exist; create it first"):
            client.put_action("rlhfless/probe", {"exec": {"kind": "blackbox", "image": CPU_IMAGE}})
        created = put_action(client, "probe")
        assert created["version"] == "0.0.1" and created["exec"]["image"] == CPU_IMAGE
        assert created["limits"] == {"timeout": 20_000, "memory": 256, "logs": 10, "concurrency": 1}
        put_action(client, "noop")
        assert client.get_action("rlhfless/probe")["namespace"] == "guest/rlhfless"
        assert {a["name"] for a in client.list_actions()} == {"probe", "noop"}
        assert {a["name"] for a in client.list_actions(package="rlhfless", page_size=1)} == {"probe", "noop"}
        assert put_action(client, "probe", timeout_ms=5000)["version"] == "0.0.2"
        with pytest.raises(OpenWhiskError) as conflict:
            client.put_action("rlhfless/probe", {"exec": {"kind": "blackbox", "image": CPU_IMAGE}}, overwrite=False)
        assert conflict.value.status == 409 and not conflict.value.transient
        client.delete_action("rlhfless/probe")
        with pytest.raises(OpenWhiskNotFound) as gone:
            client.get_action("rlhfless/probe")
        assert str(gone.value) == f"action rlhfless/probe does not exist in namespace _; {MISSING_FIX}"


def test_emulator_fails_loudly_on_a_swagger_violation():
    with pytest.raises(SwaggerViolation, match=r"request PUT .*'abc' is not of type 'integer' at /limits/timeout"):
        with running_emulator() as emu, make_client(emu) as client:
            client.put_package("rlhfless", {"publish": False})
            with pytest.raises(OpenWhiskError) as info:
                client.put_action("rlhfless/x", {"exec": {"kind": "blackbox", "image": CPU_IMAGE}, "limits": {"timeout": "abc"}})
            assert info.value.status == 400 and not info.value.transient


# ---------------------------------------------------------------------------- invoke
def test_invoke_returns_result_and_accounting(invoker: OpenWhiskInvoker, client: OpenWhiskClient):
    first = invoker.invoke("probe", {"echo": 7, "print": "hello from probe"})
    assert first.result["ok"] is True and first.result["echo"] == 7
    assert "__activation" not in first.result and first.extra["runtime"]["image"] == CPU_IMAGE
    assert first.cold and first.init_s > 0 and first.gpus == 2 and first.extra["memory_mb"] == 256
    assert first.submitted_at <= first.started_at <= first.ended_at
    assert first.billed_s == pytest.approx(first.ended_at - first.started_at + first.init_s, abs=2e-3)
    assert first.worker == f"{CPU_IMAGE}#{first.result['pid']}"
    logs = client.activation_logs(first.activation_id)
    assert any(line.endswith("stdout: hello from probe") for line in logs), logs
    assert client.activation_result(first.activation_id)["status"] == "success"
    second = invoker.invoke("probe", {"echo": 8})
    assert not second.cold and second.init_s == 0 and second.result["pid"] == first.result["pid"]


def test_non_blocking_invoke_polls_until_recorded(client: OpenWhiskClient):
    record = client.invoke("rlhfless/probe", {"echo": "nb", "sleep_s": 0.2}, blocking=False, timeout_s=20)
    assert record["response"]["result"]["echo"] == "nb"
    assert client.stats["polls"] >= 2  # the first polls found nothing yet (404)


def test_blocking_wait_running_out_falls_back_to_polling(ow_emulator: OpenWhiskEmulator, invoker: OpenWhiskInvoker):
    ow_emulator.blocking_wait_cap_ms = 100
    activation = invoker.invoke("probe", {"echo": "slow", "sleep_s": 0.6})
    assert activation.result["echo"] == "slow"
    assert ("POST", "/api/v1/namespaces/_/actions/rlhfless/probe", 202) in ow_emulator.requests
    assert invoker.client.stats["polls"] >= 1


def test_deadline_bounds_the_wait(ow_emulator: OpenWhiskEmulator, invoker: OpenWhiskInvoker):
    ow_emulator.blocking_wait_cap_ms = 100
    started = time.monotonic()
    with pytest.raises(ActionError, match="no result before the deadline") as info:
        invoker.invoke("probe", {"sleep_s": 3}, timeout_s=0.5)
    assert time.monotonic() - started < 2.0
    # The activation runs on: not transient, so the flow's retries do not start a second copy
    # beside it (flows/step/invoke.py retries transient errors only); the message says where it is.
    activation_id = info.value.activation_id
    assert not info.value.transient and activation_id and ow_emulator.num_invokes == 1
    assert f"`wsk activation get {activation_id}`" in info.value.message and "invoker.timeout_s" in info.value.message


def test_polls_that_fail_never_invoke_again():
    """An accepted activation whose polls fail (a controller restarting) is polled on, never
    invoked again: a retry would run it twice. Polls failing past the controller's bound give a
    non-transient error naming the activation, which may still be running."""
    with running_emulator() as emu, make_client(emu) as client:
        put_action(client, "probe", timeout_ms=2000)  # lost after 2 x 2 s + FAST's 0.2 s grace
        invoker = OpenWhiskInvoker(client, package="rlhfless", timeout_s=30.0)
        emu.blocking_wait_cap_ms = 100
        emu.polls_unavailable(FAST.max_attempts + 3)  # more than one poll's own retries
        assert invoker.invoke("probe", {"echo": "back", "sleep_s": 0.3}).result["echo"] == "back"
        assert emu.num_invokes == 1
        emu.polls_unavailable(10_000)
        with pytest.raises(ActionError, match="polls of it failed") as info:
            invoker.invoke("probe", {"sleep_s": 0.3})
        assert not info.value.transient and emu.num_invokes == 2
        assert f"`wsk activation get {info.value.activation_id}`" in info.value.message


@pytest.mark.parametrize("timeout_s", [None, 30.0])
def test_any_5xx_on_polls_is_polled_on_then_named(timeout_s):
    """A proxy's 520 on polls (a 5xx the request does not retry itself) is polled on like a
    503, never turned into a retry; at the controller's bound, or the deadline, the error names
    the failing polls, not a slow action."""
    posts: list[int] = []

    def controller(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            posts.append(1)
            return httpx.Response(202, json={"activationId": "a1"})
        if "/activations/" in request.url.path:
            return httpx.Response(520, json={"error": "origin error"})
        return httpx.Response(200, json={"name": "probe", "limits": {"timeout": 60000}, "annotations": []})

    now = [0.0]
    config = OpenWhiskConfig("http://ow.test", "uuid1234:key12345678")
    with OpenWhiskClient(config, retry=RetryPolicy(), transport=httpx.MockTransport(controller),
                         clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)) as client:
        with pytest.raises(ActionError, match="polls of it failed") as info:
            OpenWhiskInvoker(client, package="rlhfless", timeout_s=timeout_s).invoke("generate", {})
    assert not info.value.transient and len(posts) == 1 and "HTTP 520" in info.value.message


def _poll_503(request: httpx.Request, now: list[float]) -> httpx.Response:
    return httpx.Response(503, json={"error": "Service Unavailable"})


def _poll_hangs(request: httpx.Request, now: list[float]) -> httpx.Response:
    now[0] += request.extensions["timeout"]["read"]  # the read runs out its whole timeout
    raise httpx.ReadTimeout("timed out", request=request)


@pytest.mark.parametrize("poll, timeout_s", [(_poll_503, 10.0), (_poll_hangs, 900.0)])
def test_the_deadline_ends_the_retries_of_a_failing_poll(poll, timeout_s):
    """``invoker.timeout_s`` bounds polling and its retries: a poll answering 503, or hanging,
    is retried only while time is left, so the error comes at the deadline, not minutes after."""
    now = [0.0]

    def controller(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(202, json={"activationId": "a1"})
        if "/activations/" in request.url.path:
            return poll(request, now)
        return httpx.Response(200, json={"name": "generate", "limits": {"timeout": 600_000}, "annotations": []})

    config = OpenWhiskConfig("http://ow.test", "uuid1234:key12345678")
    with OpenWhiskClient(config, retry=RetryPolicy(), transport=httpx.MockTransport(controller), seed=0,
                         clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)) as client:
        with pytest.raises(ActionError, match="polls of it failed") as info:
            OpenWhiskInvoker(client, package="rlhfless", timeout_s=timeout_s).invoke("generate", {})
    assert not info.value.transient and now[0] <= timeout_s + 0.1


def test_the_deadline_ends_the_retries_of_reading_the_action():
    """Reading the action's limits before the invoke counts against ``invoker.timeout_s`` too."""
    now = [0.0]

    def controller(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": "Service Unavailable"})

    config = OpenWhiskConfig("http://ow.test", "uuid1234:key12345678")
    with OpenWhiskClient(config, retry=RetryPolicy(), transport=httpx.MockTransport(controller), seed=0,
                         clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)) as client:
        with pytest.raises(ActionError, match="get action rlhfless/generate: HTTP 503") as info:
            OpenWhiskInvoker(client, package="rlhfless", timeout_s=10.0).invoke("generate", {})
    assert info.value.transient and now[0] <= 10.0  # nothing was invoked: trying again is safe


def test_retry_after_is_honoured_up_to_a_bound():
    """A ``Retry-After`` longer than ``retry_after_max_s`` (a proxy's 3600) waits that bound."""
    answers = iter([3600, 7])
    sleeps: list[float] = []

    def controller(request: httpx.Request) -> httpx.Response:
        wait = next(answers, None)
        if wait is not None:
            return httpx.Response(429, headers={"Retry-After": str(wait)}, json={"error": "Too many requests"})
        record = {"activationId": "a1", "response": {"status": "success", "success": True, "result": {}}}
        return httpx.Response(200, json=record)

    config = OpenWhiskConfig("http://ow.test", "uuid1234:key12345678")
    with OpenWhiskClient(config, transport=httpx.MockTransport(controller), sleep=sleeps.append, seed=0) as client:
        client.invoke("rlhfless/noop", {})
    assert sleeps[0] == RetryPolicy().retry_after_max_s == 60.0 and 7.0 <= sleeps[1] < 20.0


def test_blocking_wait_ends_a_margin_before_the_deadline():
    """The controller answers 202 with the activation id when the blocking wait ends; the HTTP
    read must outlast the wait, or the id is lost with the read timeout. Near the deadline the
    wait is shortened by ``blocking_margin_s``; under the margin the invoke does not wait."""
    seen = []

    def controller(request: httpx.Request) -> httpx.Response:
        seen.append((dict(request.url.params), request.extensions["timeout"]["read"]))
        record = {"activationId": "a1", "response": {"status": "success", "success": True, "result": {}}}
        return httpx.Response(200, json=record)

    config = OpenWhiskConfig("http://ow.test", "uuid1234:key12345678")
    with OpenWhiskClient(config, retry=RetryPolicy(blocking_margin_s=5.0), transport=httpx.MockTransport(controller),
                         clock=lambda: 100.0, sleep=lambda s: None) as client:  # a stopped clock: 20 s stay left
        client.invoke("rlhfless/probe", {}, timeout_s=20.0)
        client.invoke("rlhfless/probe", {}, timeout_s=3.0)
    (waited, read), (submitted, _) = seen
    assert waited["blocking"] == "true" and waited["timeout"] == "15000" and read >= 15.0 + 5.0
    assert submitted["blocking"] == "false" and "timeout" not in submitted


def test_an_activation_queued_behind_others_is_not_lost():
    """One container, as on a GPU invoker with one slot: the third of three concurrent calls
    waits two runs in the invoker's queue, past its time limit + grace but within the
    controller's bound (2 x limit + grace). It is waited for, not invoked again."""
    retry = replace(FAST, lost_grace_s=0.3, blocking_wait_ms=200)
    with running_emulator(max_containers_per_action=1) as emu, make_client(emu, retry=retry) as client:
        put_action(client, "probe", timeout_ms=2000)
        invoker = OpenWhiskInvoker(client, package="rlhfless", timeout_s=30.0)
        invoker.invoke("probe", {"echo": "warm"})  # the container's cold start is not what this is about
        before = emu.num_invokes
        with ThreadPoolExecutor(max_workers=3) as pool:
            runs = list(pool.map(lambda i: invoker.invoke("probe", {"echo": i, "sleep_s": 1.0}), range(3)))
        echoes = [run.result["echo"] for run in runs]
        assert echoes == [0, 1, 2]
        assert emu.num_invokes - before == 3 and client.stats["lost"] == 0


def test_lost_after_follows_the_controllers_bound():
    # the controller: 2 x max(limit, 60 s) + 1 min; the client adds a minute for the record
    assert RetryPolicy().lost_after_s(3600.0) == 2 * 3600 + 120
    assert RetryPolicy().lost_after_s(10.0) == 2 * 60 + 120


def test_429_storm_is_ridden_out_with_bounded_retries(ow_emulator: OpenWhiskEmulator, invoker: OpenWhiskInvoker):
    ow_emulator.throttle(3)
    assert invoker.invoke("probe", {"echo": 1}).result["echo"] == 1
    assert invoker.client.stats["throttled"] == 3
    assert ow_emulator.num_invokes == 4
    # a storm longer than max_attempts gives up, transient, after exactly max_attempts requests
    ow_emulator.throttle(100)
    with pytest.raises(ActionError, match=r"HTTP 429 .* after 8 attempts") as info:
        invoker.invoke("probe", {"echo": 2})
    assert info.value.transient
    assert ow_emulator.num_invokes == 4 + FAST.max_attempts


def test_503_is_retried_only_for_idempotent_calls(ow_emulator: OpenWhiskEmulator, client: OpenWhiskClient):
    ow_emulator.unavailable(2)
    assert client.invoke("rlhfless/probe", {"echo": 3})["response"]["success"]
    assert client.stats["unavailable"] == 2
    ow_emulator.unavailable(1)
    with pytest.raises(OpenWhiskError) as info:
        client.invoke("rlhfless/probe", {"echo": 4}, idempotent=False)
    assert info.value.status == 503 and info.value.transient


def test_application_error_is_not_transient(invoker: OpenWhiskInvoker):
    with pytest.raises(ActionError) as info:
        invoker.invoke("probe", {"error": "prompt_ids: must not be empty"})
    assert not info.value.transient
    assert info.value.message == "prompt_ids: must not be empty"
    assert info.value.action == "probe" and info.value.activation_id


def test_action_that_raises_is_classified_by_the_runtime(invoker: OpenWhiskInvoker):
    """The runtime answers a crash with 502 and its classification, which survives OpenWhisk."""
    with pytest.raises(ActionError) as info:
        invoker.invoke("probe", {"raise": "S3 endpoint unreachable", "raise_type": "ConnectionRefusedError"})
    assert info.value.transient and "ConnectionRefusedError: S3 endpoint unreachable" in info.value.message
    with pytest.raises(ActionError) as info:
        invoker.invoke("probe", {"raise": "unsupported operand", "raise_type": "TypeError"})
    assert not info.value.transient and info.value.message == "TypeError: unsupported operand"
    assert invoker.client.stats["developer_retry"] == 0  # a classified crash is not retried in place


def test_runtime_refusals_fail_at_once_and_keep_the_container(ow_emulator: OpenWhiskEmulator, client: OpenWhiskClient,
                                                              invoker: OpenWhiskInvoker):
    """An action name the runtime does not know (a misnamed deploy), or a malformed control key,
    fails the same way on every container: one activation, a permanent error, no fresh container."""
    put_action(client, "generate-7b")
    for action, payload, expected in (
        ("generate-7b", {}, "UnknownAction: unknown action 'generate-7b'; known: evaluate, generate"),
        ("probe", {"__threads": 0}, "InvalidControlKey: control key __threads: input should be greater than"),
    ):
        before = ow_emulator.num_invokes
        with pytest.raises(ActionError) as info:
            invoker.invoke(action, payload)
        assert not info.value.transient and info.value.message.startswith(expected)
        assert ow_emulator.num_invokes - before == 1
        record = client.get_activation(info.value.activation_id)
        assert record["response"]["status"] == "application error"
        assert record["logs"] and "refused" in record["logs"][-1]  # the logs end at the sentinel
    started = ow_emulator.containers_started()
    assert invoker.invoke("probe", {"echo": 1}).result["echo"] == 1
    assert ow_emulator.containers_started() == started  # the container that refused serves the next
    assert invoker.client.stats["developer_retry"] == 0


def test_developer_error_is_retried_once_in_place(ow_emulator: OpenWhiskEmulator, invoker: OpenWhiskInvoker):
    ow_emulator.developer_error(1)
    done = invoker.invoke("probe", {"echo": 5})
    assert done.result["echo"] == 5
    assert invoker.client.stats["developer_retry"] == 1
    # the failed activation is billed too: its record comes with the one that succeeded
    [retried] = done.failed_attempts
    assert retried.activation_id != done.activation_id and retried.result == {}
    assert retried.billed_s == invoker.client.get_activation(retried.activation_id)["duration"] / 1000
    ow_emulator.developer_error(5)
    before = ow_emulator.num_invokes
    with pytest.raises(ActionError, match="developer error: The action did not initialize") as info:
        invoker.invoke("probe", {"echo": 6})
    assert info.value.transient
    assert ow_emulator.num_invokes - before == 1 + FAST.developer_error_retries
    assert len(info.value.failed_attempts) == 1 + FAST.developer_error_retries


def test_a_crashed_activation_is_billed_for_its_duration(invoker: OpenWhiskInvoker):
    """A crash that ran 0.3 s before raising: OpenWhisk bills its duration, and the error
    carries that accounting (``ActionError.failed_attempts``) for the step's billed time."""
    with pytest.raises(ActionError) as info:
        invoker.invoke("probe", {"sleep_s": 0.3, "raise": "S3 endpoint unreachable",
                                 "raise_type": "ConnectionRefusedError"})
    [spent] = info.value.failed_attempts
    record = invoker.client.get_activation(info.value.activation_id)
    assert spent.activation_id == info.value.activation_id and spent.action == "probe"
    assert spent.billed_s == pytest.approx(record["duration"] / 1000) and spent.billed_s >= 0.3
    assert spent.gpus == 2  # the action's annotation, as for a successful activation


def test_time_limit_is_a_non_transient_developer_error(client: OpenWhiskClient, invoker: OpenWhiskInvoker):
    put_action(client, "probe", timeout_ms=300)
    with pytest.raises(ActionError, match="exceeded its time limits of 300 milliseconds") as info:
        invoker.invoke("probe", {"sleep_s": 2})
    assert not info.value.transient and "raise its timeout" in info.value.message


def test_lost_activation_is_invoked_again_a_bounded_number_of_times(
    ow_emulator: OpenWhiskEmulator, client: OpenWhiskClient, invoker: OpenWhiskInvoker
):
    put_action(client, "probe", timeout_ms=1000)  # lost after 2 x 1 s time limit + 0.2 s grace
    # Warm the container first: its /init (a cold Python import) falls under the same 1 s
    # limit and can overrun it on a busy machine, which is not what this test is about.
    assert invoker.invoke("probe", {"echo": "warm"}).result["echo"] == "warm"
    ow_emulator.lose(1)
    assert invoker.invoke("probe", {"echo": "again"}).result["echo"] == "again"
    assert client.stats["lost"] == 1 and ow_emulator.num_invokes == 1 + 2
    ow_emulator.lose(10)
    with pytest.raises(ActionError, match="accepted but never recorded") as info:
        invoker.invoke("probe", {"echo": "gone"})
    assert info.value.transient
    assert info.value.failed_attempts == ()  # never recorded: nothing known to bill
    assert ow_emulator.num_invokes == 1 + 2 + 1 + FAST.lost_retries


# ---------------------------------------------------------------------------- clear failures
def test_bad_credentials_give_a_clear_message_without_the_key(ow_emulator: OpenWhiskEmulator, caplog):
    caplog.set_level(logging.DEBUG)
    uuid_part = ow_emulator.auth.split(":")[0]
    wrong = f"{uuid_part}:WRONGwrongWRONGwrongWRONG"
    with make_client(ow_emulator, auth=wrong) as client:
        with pytest.raises(OpenWhiskAuthError) as info:
            client.list_actions()
        invoker = OpenWhiskInvoker(client)
        with pytest.raises(ActionError) as via_invoker:
            invoker.invoke("generate", {})
    host = ow_emulator.api_host
    assert str(info.value) == f"OpenWhisk rejected the credentials for namespace _ at {host} (HTTP 401); check WSK_AUTH"
    assert not via_invoker.value.transient
    for text in (str(info.value), str(via_invoker.value), repr(invoker), caplog.text):
        assert "WRONGwrong" not in text and ow_emulator.auth.split(":")[1] not in text


def test_foreign_namespace_is_denied(ow_emulator: OpenWhiskEmulator):
    with make_client(ow_emulator, namespace="someone-else") as client:
        with pytest.raises(OpenWhiskAuthError, match="denied the credentials access to namespace someone-else"):
            client.get_action("rlhfless/probe")


def test_unreachable_host_is_one_line_naming_the_host():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    retry = RetryPolicy(connect_attempts=2, backoff_base_s=0.01)
    for host in (f"http://127.0.0.1:{port}", "http://no-such-host.invalid"):
        with OpenWhiskClient(OpenWhiskConfig(host, "uuid:secretkey123"), retry=retry) as client:
            with pytest.raises(OpenWhiskUnreachable) as info:
                client.invoke("rlhfless/generate", {})
        message = str(info.value)
        assert message.startswith(f"cannot reach the OpenWhisk API at {host}: ") and "\n" not in message
        assert "secretkey123" not in message and info.value.transient


def _portal(record_polls: bool = False):
    """A host that is not the OpenWhisk API: it answers an HTML page to everything (with
    ``record_polls``, only the activation polls; the rest as a controller would)."""
    def answer(request: httpx.Request) -> httpx.Response:
        if record_polls and request.method == "POST":
            return httpx.Response(202, json={"activationId": "a1"})
        if record_polls and "/activations/" not in request.url.path:
            return httpx.Response(200, json={"name": "probe", "limits": {"timeout": 60000}, "annotations": []})
        return httpx.Response(200, content=PORTAL_PAGE, headers={"Content-Type": "text/html"})

    return httpx.MockTransport(answer)


def test_a_host_that_answers_html_is_named_not_a_json_error():
    """A login portal or a wrong ingress answers 200 with an HTML page: every call says the
    host is not the OpenWhisk API and names the setting, and the invoker raises ActionError."""
    config = OpenWhiskConfig("http://portal.test", "uuid1234:key12345678")
    expected = "from http://portal.test is not JSON (not an OpenWhisk API answer); check WSK_APIHOST"
    with OpenWhiskClient(config, transport=_portal(), sleep=lambda s: None) as client:
        calls = [client.list_actions, client.get_limits, lambda: client.get_action("rlhfless/probe"),
                 lambda: client.get_package("rlhfless"), lambda: client.put_action("rlhfless/probe", {}),
                 lambda: client.put_package("rlhfless", {}), lambda: client.get_activation("a1"),
                 lambda: client.invoke("rlhfless/probe", {})]
        for call in calls:
            with pytest.raises(OpenWhiskError) as info:
                call()
            assert expected in str(info.value) and "HTTP 200" in str(info.value) and not info.value.transient
        with pytest.raises(ActionError) as via_invoker:
            OpenWhiskInvoker(client).invoke("probe", {})
        assert expected in via_invoker.value.message and not via_invoker.value.transient
    with OpenWhiskClient(config, transport=_portal(record_polls=True), sleep=lambda s: None) as client:
        with pytest.raises(ActionError, match="poll activation a1: HTTP 200 .* is not JSON") as info:
            OpenWhiskInvoker(client).invoke("probe", {})
    # an ingress's 404 page is not "the action does not exist", nor a portal's 401 "wrong key"; a
    # redirect is a login portal's way in
    for status, headers in ((404, {}), (401, {}), (302, {"Location": "https://sso.test/"})):
        page = httpx.MockTransport(lambda request: httpx.Response(status, content=PORTAL_PAGE, headers=headers))
        with OpenWhiskClient(config, transport=page) as client:
            with pytest.raises(OpenWhiskError, match=f"HTTP {status} .*not JSON") as info:
                client.get_action("rlhfless/probe")
        assert type(info.value) is OpenWhiskError and not info.value.transient
    # a proxy's 429 page in front of the controller is throttling all the same
    answers = iter([httpx.Response(429, content=PORTAL_PAGE), httpx.Response(200, json={"name": "probe"})])
    proxy = httpx.MockTransport(lambda request: next(answers))
    with OpenWhiskClient(config, transport=proxy, sleep=lambda s: None) as client:
        assert client.get_action("rlhfless/probe") == {"name": "probe"} and client.stats["throttled"] == 1
    # an ingress's 413 page (its body limit) is the payload's size, not a wrong host
    too_big = httpx.MockTransport(lambda request: httpx.Response(413, content=PORTAL_PAGE))
    with OpenWhiskClient(config, transport=too_big) as client:
        with pytest.raises(OpenWhiskError, match=r"HTTP 413 Request Entity Too Large: the payload is over the "
                                                 r"controller's limit \(whisk.limits.activation.payload.max") as info:
            client.invoke("rlhfless/probe", {})
    assert "WSK_APIHOST" not in str(info.value)
    # a Retry-After of a digit float() refuses is a plain backoff, not a crash
    answers = iter([httpx.Response(429, headers=[(b"Retry-After", "\u00b2".encode())], json={"error": "busy"}),
                    httpx.Response(200, json={"name": "probe"})])
    throttled = httpx.MockTransport(lambda request: next(answers))
    with OpenWhiskClient(config, transport=throttled, sleep=lambda s: None) as client:
        assert client.get_action("rlhfless/probe") == {"name": "probe"}


def test_a_result_over_the_size_limit_fails_at_once(ow_emulator: OpenWhiskEmulator, invoker: OpenWhiskInvoker):
    ow_emulator.max_result_bytes = 1000
    before = ow_emulator.num_invokes
    with pytest.raises(ActionError, match="exceeded the allowed length") as info:
        invoker.invoke("probe", {"echo": "x" * 2000})
    assert not info.value.transient and "returns the keys" in info.value.message
    assert "xxxx" not in info.value.message  # the truncated result is the action's data, not for a message
    assert ow_emulator.num_invokes - before == 1 and invoker.client.stats["developer_retry"] == 0


def test_timeout_below_an_actions_time_limit_is_warned_once(client: OpenWhiskClient, caplog):
    invoker = OpenWhiskInvoker(client, package="rlhfless", timeout_s=5.0)  # probe's time limit: 20 s
    with caplog.at_level(logging.WARNING, logger="flows.invokers.openwhisk.invoker"):
        invoker.invoke("probe", {"echo": 1})
        invoker.invoke("probe", {"echo": 2})
        OpenWhiskInvoker(client, package="rlhfless", timeout_s=20.0).invoke("probe", {"echo": 3})
    warned = [r.getMessage() for r in caplog.records if "invoker.timeout_s" in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].startswith("invoker.timeout_s=5 is below the time limit of rlhfless/probe (20 s)")
    assert "raise invoker.timeout_s to at least 20" in warned[0]


def test_make_invoker_passes_invoker_timeout_s(monkeypatch):
    """prewarm and invoke both wait ``invoker.timeout_s``; unset, as long as OpenWhisk may."""
    monkeypatch.setenv("WSK_APIHOST", "http://127.0.0.1:1")
    monkeypatch.setenv("WSK_AUTH", "uuid1234:key12345678")
    monkeypatch.delenv("RLHFLESS_OPENWHISK_SECRET", raising=False)
    for timeout_s in (3600.0, None):
        cfg = SimpleNamespace(invoker=InvokerConfig(kind="openwhisk", timeout_s=timeout_s))
        invoker = make_invoker(cfg, 1)
        try:
            assert invoker.timeout_s == timeout_s
        finally:
            invoker.close()
    assert InvokerConfig().timeout_s is None and InvokerConfig().local_timeout_s() == 600.0


def test_missing_action_says_run_deploy(invoker: OpenWhiskInvoker):
    with pytest.raises(ActionError) as info:
        invoker.invoke("train_step", {})
    assert not info.value.transient
    assert info.value.message == f"action rlhfless/train_step does not exist in namespace _; {MISSING_FIX}"


# ---------------------------------------------------------------------------- prewarm, threads
def test_prewarm_starts_distinct_containers(ow_emulator: OpenWhiskEmulator, invoker: OpenWhiskInvoker):
    assert invoker.prewarm("noop", 3) == 3
    assert ow_emulator.pool.warm("rlhfless/noop") == 3
    assert invoker.prewarm("noop", 3) == 0  # all three already warm
    assert ow_emulator.pool.warm("rlhfless/noop") == 3
    activation = invoker.invoke("noop", {})
    assert activation.result == {"ok": True} and not activation.cold


def test_concurrent_invokes_share_one_client(invoker: OpenWhiskInvoker):
    with ThreadPoolExecutor(max_workers=6) as pool:
        activations = list(pool.map(lambda i: invoker.invoke("probe", {"echo": i, "sleep_s": 0.1}), range(6)))
    assert [a.result["echo"] for a in activations] == list(range(6))
    assert len({a.activation_id for a in activations}) == 6


# ---------------------------------------------------------------------------- pure mapping
def test_activation_from_record_accounting():
    record = {
        "activationId": "a1",
        "start": 10_000,
        "end": 12_500,
        "duration": 2_500,
        "annotations": [{"key": "waitTime", "value": 300}, {"key": "initTime", "value": 500}, {"key": "path", "value": "guest/rlhfless/generate"}],
        "response": {"status": "success", "success": True, "result": {"k": 1, "__activation": {"busy_s": 1.75, "pid": 9, "image": "img:1"}}},
    }
    meta = {"limits": {"memory": 32768}, "annotations": [{"key": "invoker-resources", "value": ["gpu"]}]}
    act = activation_from_record("generate", record, meta)
    # submitted = start - wait; started = start + init; billed = run wall + init = duration
    assert (act.submitted_at, act.started_at, act.ended_at) == (9.7, 10.5, 12.5)
    assert act.init_s == 0.5 and act.cold and act.busy_s == 1.75
    assert act.billed_s == pytest.approx(2.5) and act.queue_s == pytest.approx(0.8)
    assert act.result == {"k": 1} and act.extra["runtime"]["pid"] == 9 and act.extra["wait_s"] == 0.3
    assert act.gpus == 1 and act.extra["memory_mb"] == 32768  # invoker-resources gpu, no gpus annotation


@pytest.mark.parametrize(
    ("status", "result", "annotations", "expected"),
    [
        ("success", {"ok": True}, [], None),
        ("application error", {"error": "bad payload"}, [], (False, False)),
        ("action developer error", {"error": {"type": "ConnectionResetError", "message": "reset", "transient": True}}, [], (True, False)),
        ("action developer error", {"error": {"type": "TypeError", "message": "bad", "transient": False}}, [], (False, False)),
        ("action developer error", {"error": "The action exceeded its time limits of 10 milliseconds."}, [{"key": "timeout", "value": True}], (False, False)),
        ("action developer error", {"error": "The action did not initialize and exited unexpectedly."}, [], (True, True)),
        # limits the action ran into: the same on every attempt (OpenWhisk's Messages.scala)
        ("action developer error", {"error": "The action produced a response that exceeded the allowed length: "
                                             "1048577 > 1048576 bytes. The truncated response was: {\"tokens\": [1"},
         [], (False, False)),
        ("action developer error", {"error": "The action exhausted its memory and was aborted."}, [], (False, False)),
        ("whisk internal error", {"error": "internal"}, [], (True, True)),
    ],
)
def test_classify_activation(status, result, annotations, expected):
    error, retry_in_place = classify_activation("a", {"activationId": "x", "annotations": annotations, "response": {"status": status, "result": result}})
    if expected is None:
        assert error is None
    else:
        assert (error.transient, retry_in_place) == expected and error.activation_id == "x"


def test_client_imports_without_torch():
    """flows never import torch; checked in a clean interpreter."""
    code = "import flows.invokers.openwhisk, flows.commands.deploy, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


# ---------------------------------------------------------------------------- the vLLM engine's containers
def test_a_vllm_evaluation_and_profile_run_in_the_generate_containers(ow_emulator: OpenWhiskEmulator,
                                                                     client: OpenWhiskClient):
    put_action(client, "generate", timeout_ms=120_000)  # a cold container imports torch first
    put_action(client, "evaluate", timeout_ms=120_000)
    invoker = OpenWhiskInvoker(client, package="rlhfless", timeout_s=120.0)
    # An incomplete request: the evaluate action refuses it, which shows which action ran where.
    with pytest.raises(ActionError, match=r"EvaluateRequest\.model: field required") as vllm:
        invoker.invoke("evaluate", {"engine": "vllm"})
    assert vllm.value.action == "evaluate"
    assert ow_emulator.pool.warm("rlhfless/generate") == 1 and ow_emulator.pool.warm("rlhfless/evaluate") == 0
    with pytest.raises(ActionError, match=r"EvaluateRequest\.model: field required"):
        invoker.invoke("evaluate", {"engine": "torch"})  # the torch engine: its own containers
    assert ow_emulator.pool.warm("rlhfless/evaluate") == 1
    with pytest.raises(ActionError, match=r"GenerateRequest\.model"):  # only evaluate and profile may be guests
        invoker.invoke("generate", {"engine": "vllm", "__action": "score"})
    put_action(client, "profile", timeout_ms=120_000)
    with pytest.raises(ActionError, match=r"ProfileRequest") as profile:  # a vLLM profile: the warm engine's
        invoker.invoke("profile", {"engine": "vllm"})
    assert profile.value.action == "profile" and ow_emulator.pool.warm("rlhfless/profile") == 0


def test_campaign_preflight_compares_gpus_annotation_with_gpus_per_actor(ow_emulator: OpenWhiskEmulator, monkeypatch):
    """Billing counts scaling.gpus_per_actor GPUs per activation: a generate action deployed with
    another ``gpus`` annotation is refused before the campaign writes anything."""
    from flows.config import load_config
    from flows.invokers.factory import check_invoker

    for key, value in ow_emulator.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RLHFLESS_OPENWHISK_SECRET", raising=False)
    client = make_client(ow_emulator)
    put_action(client, "evaluate", gpus=2)
    put_action(client, "generate", gpus=2)
    client.close()
    with pytest.raises(ValueError, match=r"scaling.gpus_per_actor=1, but the deployed action rlhfless/generate holds "
                                         r"2 GPU\(s\).*set scaling.gpus_per_actor: 2, or deploy the action with gpus: 1"):
        check_invoker(load_config(None, ["invoker.kind=openwhisk"]))
    check_invoker(load_config(None, ["invoker.kind=openwhisk", "scaling.gpus_per_actor=2"]))


def test_campaign_preflight_names_a_host_that_is_not_the_api(monkeypatch):
    from flows.config import load_config
    from flows.invokers.factory import check_invoker

    monkeypatch.delenv("RLHFLESS_OPENWHISK_SECRET", raising=False)
    with html_host() as url:
        monkeypatch.setenv("WSK_APIHOST", url)
        monkeypatch.setenv("WSK_AUTH", "uuid1234:key12345678")
        with pytest.raises(ValueError, match=f"get action rlhfless/evaluate: HTTP 200 from {url} is not JSON .*; "
                                             "check WSK_APIHOST"):
            check_invoker(load_config(None, ["invoker.kind=openwhisk"]))
