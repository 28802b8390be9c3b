"""S3 errors name the setting at fault: the variable the endpoint came from
(``AWS_ENDPOINT_URL_S3`` wins over ``AWS_ENDPOINT_URL``) or the argument it was given in; an
endpoint with a path is refused before any request; a session token is named (never shown)
when the server rejects the credentials it goes with."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from actions.store import BucketNotFound, StoreCredentialsError, StoreError, StoreUnreachable
from actions.store.credentials import S3Credentials
from actions.store.s3 import S3Store
from actions.store.s3_settings import settings_from_env


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(params=[b"<html><body>not found</body></html>", b"not found"])
def not_s3(request: pytest.FixtureRequest) -> Iterator[str]:
    """A web server on loopback that answers every request 404 with a page (which an XML
    parser reads, finding no error code) or plain text, never an S3 error."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 -- the handler's name is the HTTP method
            body = request.param
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.s3
def test_an_unreachable_endpoint_names_the_variable_it_came_from(s3_server) -> None:
    """A good AWS_ENDPOINT_URL and a bad AWS_ENDPOINT_URL_S3: the latter is used, and named."""
    bad = _closed_port()
    env = {**s3_server.env(), "AWS_ENDPOINT_URL_S3": bad}
    with pytest.raises(StoreUnreachable) as info:
        S3Store.from_uri(s3_server.uri("x"), env=env, max_attempts=1)
    assert str(info.value).startswith(f"cannot reach S3 endpoint {bad} : connection refused"), info.value
    assert str(info.value).endswith("; check AWS_ENDPOINT_URL_S3"), info.value
    with pytest.raises(StoreUnreachable) as info:  # AWS_ENDPOINT_URL alone: named as before
        S3Store.from_uri(s3_server.uri("x"), env={**s3_server.env(), "AWS_ENDPOINT_URL": bad}, max_attempts=1)
    assert str(info.value).endswith("; check AWS_ENDPOINT_URL"), info.value
    # given in code, not by the environment: the argument is named, not a variable
    with pytest.raises(StoreUnreachable) as info:
        S3Store.from_uri(s3_server.uri("x"), env=s3_server.env(), endpoint_url=bad, max_attempts=1)
    assert str(info.value).endswith("; check the endpoint_url S3Store was given"), info.value


def test_a_server_that_is_not_s3_names_the_variable_it_came_from(not_s3: str) -> None:
    env = {"AWS_ENDPOINT_URL": _closed_port(), "AWS_ENDPOINT_URL_S3": not_s3,
           "AWS_ACCESS_KEY_ID": "RLHFTESTKEY00001", "AWS_SECRET_ACCESS_KEY": "not-a-real-secret-0001"}
    with pytest.raises(StoreError) as info:
        S3Store.from_uri("s3://rlhfless-test/x", env=env, max_attempts=1)
    said = str(info.value)
    assert said == (f"S3 endpoint {not_s3} answered HTTP 404 without an S3 error to a bucket listing; is "
                    "AWS_ENDPOINT_URL_S3 an S3 server?"), said
    with pytest.raises(StoreError, match=r"; is the endpoint_url S3Store was given an S3 server\?$"):
        S3Store("rlhfless-test", "x", endpoint_url=not_s3, max_attempts=1,
                credentials=S3Credentials("RLHFTESTKEY00001", "not-a-real-secret-0001")).check()


@pytest.mark.parametrize("var", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_an_endpoint_with_a_path_is_refused_naming_the_variable_and_the_fix(var: str) -> None:
    for endpoint, path in (("http://127.0.0.1:15720/foo", "/foo"), ("https://s3.example.org/a/b/", "/a/b/"),
                           ("http://minio:9000?x=1", "?x=1")):
        with pytest.raises(ValueError) as info:
            settings_from_env({var: endpoint})
        base = endpoint[:-len(path)]
        assert str(info.value) == (
            f"{var}={endpoint!r} has a path ({path!r}), which S3 requests would take for the bucket; set it to the "
            f"server's address alone, {var}={base}, with the bucket and prefix in store.uri"), info.value
    for fine in ("http://minio:9000", "http://minio:9000/", "https://s3.example.org"):
        assert settings_from_env({var: fine})["endpoint_url"] == fine
    assert settings_from_env({var: "http://minio:9000"})["endpoint_from"] == var


@pytest.mark.s3
def test_an_endpoint_with_a_path_is_not_reported_as_a_missing_bucket(s3_server) -> None:
    env = {**s3_server.env(), "AWS_ENDPOINT_URL": s3_server.endpoint + "/foo"}
    with pytest.raises(ValueError, match=r"^AWS_ENDPOINT_URL='http://127\.0\.0\.1:\d+/foo' has a path") as info:
        S3Store.from_uri(s3_server.uri("x"), env=env, max_attempts=1)
    assert not isinstance(info.value, BucketNotFound)


@pytest.mark.s3
def test_a_rejected_session_token_is_named_but_never_shown(s3_server) -> None:
    """A valid key pair with a session token the server refuses: the advice names
    AWS_SESSION_TOKEN along with the pair, and the token's value appears nowhere."""
    token = "FwoGZXIvYXdzEBogusSessionToken0123456789"
    with pytest.raises(StoreCredentialsError) as info:
        S3Store.from_uri(s3_server.uri("x"), env={**s3_server.env(), "AWS_SESSION_TOKEN": token}, max_attempts=1)
    said = str(info.value)
    assert "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN (it is set:" in said, said
    assert token not in said and token[:12] not in said and s3_server.secret_key not in said
    env = {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "wrong-" + s3_server.secret_key[6:]}
    with pytest.raises(StoreCredentialsError) as info:  # no token: the pair alone, as before
        S3Store.from_uri(s3_server.uri("x"), env=env, max_attempts=1)
    assert str(info.value).endswith("check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"), info.value
