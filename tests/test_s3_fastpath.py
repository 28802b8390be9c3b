"""The S3 fast path on its own (actions/store/s3_fastpath.py), against the real S3
server: every part is engaged with the installed botocore/urllib3 (so an upgrade that breaks
one fails here, not silently), each falls back to the public path -- with a warning naming
what is missing -- when the private attribute it needs is gone, and the fallback stores and
reads the same bytes."""

from __future__ import annotations

import hashlib
import logging
import socket
import uuid

import pytest
from botocore.awsrequest import AWSRequest

from actions.store import ObjectNotFound, StoreError, StoreUnreachable, as_parts, put_artifact, s3_fastpath
from actions.store.s3 import S3Store
from actions.store.s3_fastpath import FastPath, PartsReader, fill_from_raw, install_known_payload_signer, known_payload
from actions.store.weights import load_tensors

pytestmark = pytest.mark.s3

MiB = 1024 * 1024
# 6 MiB in 5 MiB chunks: two ranged GETs, plus a small and an empty object
OBJECTS = {"big": bytes(range(256)) * (6 * MiB // 256), "small": b"abc", "empty": b""}


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the fast path's once-per-process warnings anew."""
    monkeypatch.setattr(s3_fastpath, "_warned", set())


def _store(s3_server, **options) -> S3Store:
    return S3Store.from_uri(s3_server.uri(f"fast/{uuid.uuid4().hex[:8]}"), env=s3_server.env(),
                            multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, **options)


def _count_get_object_calls(store: S3Store) -> list[str]:
    calls: list[str] = []
    store._client.meta.events.register("before-call.s3.GetObject", lambda **kw: calls.append("GetObject"))
    return calls


def _signed_payload_hashes(store: S3Store) -> list[str]:
    """The x-amz-content-sha256 of every PutObject the store's client sends from now on
    (after the one-time probe of conditional writes, which is two PUTs)."""
    store.conditional_writes()
    seen: list[str] = []
    store._client.meta.events.register(
        "before-send.s3.PutObject",
        lambda request, **kw: seen.append(request.headers["X-Amz-Content-SHA256"].decode()))
    return seen


def _reads_agree(store: S3Store) -> None:
    for key, data in OBJECTS.items():
        store.put(key, data)
    assert {k: store.get(k) for k in OBJECTS} == OBJECTS
    # with the expected size known (as from a manifest), small objects take a plain GET
    assert {k: bytes(store.get_buffer(k, size=len(v))) for k, v in OBJECTS.items()} == OBJECTS
    with pytest.raises(ObjectNotFound):
        store.get("missing")


# ----------------------------------------------------------------------------- engaged


def test_every_part_is_engaged_with_the_installed_botocore(s3_server, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=s3_fastpath.__name__):
        store = _store(s3_server)
        assert store.fast_path == FastPath(http=store._client._endpoint.http_session, known_payload=True)
        calls = _count_get_object_calls(store)
        _reads_agree(store)
    assert calls == []  # every GET went through a presigned request on the client's session
    assert caplog.records == []  # raw._fp was there for every body
    url = store.presign_get("small", expires_s=60)
    request = AWSRequest(method="GET", url=url)
    request.stream_output = True
    resp = store.fast_path.http.send(request.prepare())
    fp = getattr(resp.raw, s3_fastpath.RAW_FP)
    assert callable(fp.readinto) and callable(fp.isclosed)
    view = memoryview(bytearray(3))
    fill_from_raw(resp.raw, view)
    assert view.tobytes() == b"abc"
    store.close()


def test_known_payload_is_what_gets_signed(s3_server) -> None:
    store = _store(s3_server)
    seen = _signed_payload_hashes(store)
    body = b"x" * (128 * 1024)  # above the inline size: streamed from the caller's buffers
    digest = hashlib.sha256(body).hexdigest()
    assert store.put_content("blob", (body[:10], memoryview(body)[10:]), digest) is True
    assert seen == [digest] and store.get("blob") == body
    # The declared hash is what gets signed, whatever the body (AWS S3 and MinIO then refuse
    # a body that does not match; the backend only ever declares the blob's own sha256).
    with known_payload("0" * 64):
        store._client.put_object(Bucket=store.bucket, Key=f"{store.prefix}/raw", Body=b"some bytes")
    assert seen[-1] == "0" * 64
    store.close()


# ----------------------------------------------------------------------------- fallbacks


def _store_without(s3_server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str,
                   value: tuple[str, ...], missing: str) -> S3Store:
    """A store built while the fast path's ``name`` is ``value`` (playing a botocore in which
    the attribute is gone); checks that the warning names ``missing``."""
    monkeypatch.setattr(s3_fastpath, name, value)
    with caplog.at_level(logging.WARNING, logger=s3_fastpath.__name__):
        store = _store(s3_server)
    assert f"{missing} is missing" in caplog.text
    return store


def test_without_the_http_session_reads_use_get_object(s3_server, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    store = _store_without(s3_server, monkeypatch, caplog, "HTTP_SESSION_PATH", ("_endpoint", "renamed_session"),
                           "client._endpoint.renamed_session")
    assert store.fast_path.http is None and store.fast_path.known_payload
    calls = _count_get_object_calls(store)
    _reads_agree(store)
    assert len(calls) >= 5  # big: 2 ranges; small; empty; missing
    store.close()


def test_without_the_signer_hook_botocore_hashes_bodies(s3_server, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    store = _store_without(s3_server, monkeypatch, caplog, "SIGNER_METHODS",
                           ("_should_sha256_sign_payload", "_renamed_in_botocore"), "S3SigV4Auth._renamed_in_botocore")
    assert store.fast_path.known_payload is False and store.fast_path.http is not None
    seen = _signed_payload_hashes(store)
    with known_payload("0" * 64):  # ignored: botocore hashes the body itself
        store._client.put_object(Bucket=store.bucket, Key=f"{store.prefix}/k", Body=b"some bytes")
    body = b"y" * (128 * 1024)
    assert store.put_content("blob", (body[:10], memoryview(body)[10:]), hashlib.sha256(body).hexdigest())
    assert seen == [hashlib.sha256(b"some bytes").hexdigest(), hashlib.sha256(body).hexdigest()]
    assert store.get("k") == b"some bytes" and store.get("blob") == body
    store.close()


def test_a_client_without_a_request_signer_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=s3_fastpath.__name__):
        assert install_known_payload_signer(object()) is False
    assert "client._request_signer.get_auth_instance is missing" in caplog.text


def test_without_raw_fp_bodies_are_read_through_urllib3(s3_server, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(s3_fastpath, "RAW_FP", "_renamed_fp")
    store = _store(s3_server)
    with caplog.at_level(logging.WARNING, logger=s3_fastpath.__name__):
        _reads_agree(store)
    assert "urllib3 HTTPResponse._renamed_fp is missing" in caplog.text
    assert caplog.text.count("is missing") == 1  # once per process, not per response
    store.close()


def test_an_artifact_round_trips_with_no_fast_path_at_all(s3_server, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from actions.store.weights import publish_tensors

    monkeypatch.setattr(s3_fastpath, "HTTP_SESSION_PATH", ("_gone",))
    monkeypatch.setattr(s3_fastpath, "SIGNER_FACTORY_PATH", ("_gone", "get_auth_instance"))
    monkeypatch.setattr(s3_fastpath, "RAW_FP", "_gone")
    store = _store(s3_server)
    assert store.fast_path == FastPath(http=None, known_payload=False)
    tensors = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(7)}
    publish_tensors(store, "v1/manifest.json", tensors)
    loaded, _ = load_tensors(store, "v1/manifest.json")
    assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    put_artifact(store, "v2/manifest.json", {"a": b"1"})
    assert store.exists("v2/manifest.json")
    store.close()


# ----------------------------------------------------------------------------- presigned GETs


class FlakyHTTP:
    """An HTTP session that answers 503 SlowDown to the first N requests."""

    def __init__(self, inner, num_failures: int) -> None:
        self.inner, self.left = inner, num_failures

    def send(self, request):
        if self.left > 0:
            self.left -= 1
            body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            return type("Resp", (), {"status_code": 503, "content": body, "headers": {}})()
        return self.inner.send(request)


def test_presigned_get_retries_transient_errors(s3_store: S3Store) -> None:
    s3_store.put("k", b"payload")
    reader = s3_store._reader
    reader.http = FlakyHTTP(reader.http, num_failures=2)
    assert s3_store.get("k") == b"payload"
    reader.http = FlakyHTTP(reader.http.inner, num_failures=s3_store.max_attempts)
    with pytest.raises(StoreError, match="SlowDown"):
        s3_store.get("k")


def test_get_errors_never_show_the_presigned_url(s3_server) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**s3_server.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    store = S3Store.from_uri(s3_server.uri("x"), env=env, check=False, max_attempts=1)
    with pytest.raises(StoreUnreachable, match="connection refused") as info:
        store.get("some/key")
    message = str(info.value)
    assert "X-Amz" not in message and "Signature" not in message
    assert s3_server.secret_key not in message and s3_server.access_key not in message


def test_parts_reader_is_a_seekable_concatenation() -> None:
    reader = PartsReader(as_parts((b"abc", b"", b"defgh", bytearray(b"ij"))))
    assert len(reader) == 10 and reader.read(2) == b"ab" and reader.read(3) == b"cde"
    assert reader.read() == b"fghij" and reader.read(4) == b""
    reader.seek(-4, 2)
    buf = bytearray(10)
    assert reader.readinto(buf) == 4 and bytes(buf[:4]) == b"ghij"
    reader.seek(0)
    assert reader.read(100) == b"abcdefghij" and reader.tell() == 10
