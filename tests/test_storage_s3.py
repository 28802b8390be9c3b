"""S3 backend against a real SeaweedFS server: configuration errors, multipart, conditional
writes, presigned URLs, stream retries and a server crash in the middle of a publish.
The fast path (presigned reads, known-payload signing) is tested in test_s3_fastpath.py."""

from __future__ import annotations

import re

import socket
import threading
import urllib.request
import uuid

import boto3
import pytest
import torch
from botocore import exceptions as bce
from botocore.config import Config

from actions.store import (
    BucketNotFound,
    ObjectNotFound,
    StoreAccessDenied,
    StoreCredentialsError,
    StoreError,
    StoreUnreachable,
    open_store,
)
from actions.store.s3 import S3Store
from actions.store.weights import load_tensors, publish_tensors

pytestmark = pytest.mark.s3

MiB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _raw_client(server):
    return boto3.session.Session().client(
        "s3", endpoint_url=server.endpoint, region_name="us-east-1",
        aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key,
        config=Config(s3={"addressing_style": "path"}),
    )  # fmt: skip


def _assert_no_secret(message: str, server) -> None:
    assert server.secret_key not in message
    assert server.access_key not in message  # only the masked form may appear


# ----------------------------------------------------------------------------- configuration


def test_from_uri_reads_the_environment(s3_server) -> None:
    env = {**s3_server.env(), "AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_ENDPOINT_URL_S3": s3_server.endpoint}
    env.pop("AWS_REGION")
    store = S3Store.from_uri(s3_server.uri("cfg/x/"), env=env)  # AWS_ENDPOINT_URL_S3 wins
    assert (store.bucket, store.prefix, store.region) == (s3_server.bucket, "cfg/x", "us-east-1")
    assert store.uri == f"s3://{s3_server.bucket}/cfg/x"
    with pytest.raises(ValueError, match="RLHFLESS_S3_CONDITIONAL_WRITES"):
        S3Store.from_uri(s3_server.uri(), env={**env, "RLHFLESS_S3_CONDITIONAL_WRITES": "maybe"})
    with pytest.raises(ValueError, match="bucket name 'Bad_Bucket' is invalid"):
        S3Store.from_uri("s3://Bad_Bucket/x", env=env)


def test_open_store_uses_os_environ(s3_server, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    store = open_store(s3_server.uri("via-open-store"))
    assert isinstance(store, S3Store) and store.endpoint_url == s3_server.endpoint


def test_unreachable_endpoint_is_one_clear_line(s3_server) -> None:
    endpoint = f"http://127.0.0.1:{_free_port()}"
    env = {**s3_server.env(), "AWS_ENDPOINT_URL": endpoint}
    with pytest.raises(StoreUnreachable) as info:
        S3Store.from_uri(s3_server.uri("x"), env=env, max_attempts=2)
    msg = str(info.value)
    assert re.fullmatch(rf"cannot reach S3 endpoint {re.escape(endpoint)} : connection refused "
                        r"\(2 requests in \d+\.\d s\); check AWS_ENDPOINT_URL", msg), msg
    _assert_no_secret(msg, s3_server)
    with pytest.raises(StoreUnreachable) as info:  # one request is one, not "1 requests"
        S3Store.from_uri(s3_server.uri("x"), env=env, max_attempts=1)
    assert "(1 request in " in str(info.value), str(info.value)


@pytest.mark.parametrize("which", ["secret", "key_id"])
def test_wrong_credentials_are_named_without_leaking(s3_server, which: str) -> None:
    env = s3_server.env()
    if which == "secret":
        env["AWS_SECRET_ACCESS_KEY"] = "wrong-" + s3_server.secret_key[6:]
    else:
        env["AWS_ACCESS_KEY_ID"] = "RLHFNOSUCHKEY1234"
    with pytest.raises(StoreCredentialsError) as info:
        S3Store.from_uri(s3_server.uri("x"), env=env)
    msg = str(info.value)
    assert msg.startswith(f"S3 rejected the credentials (key {env['AWS_ACCESS_KEY_ID'][:4]}****) for bucket ")
    assert msg.endswith("check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
    _assert_no_secret(msg, s3_server)
    assert env["AWS_SECRET_ACCESS_KEY"] not in msg and env["AWS_ACCESS_KEY_ID"] not in msg
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_wrong_secret_found_on_head_is_named_too(s3_server) -> None:
    env = {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "wrong-secret-for-head"}
    store = S3Store.from_uri(s3_server.uri("x"), env=env, check=False)
    with pytest.raises(StoreCredentialsError, match="SignatureDoesNotMatch") as info:
        store.exists("any/key")
    assert "wrong-secret-for-head" not in str(info.value)


def test_missing_bucket(s3_server) -> None:
    with pytest.raises(BucketNotFound, match=rf"bucket 'no-such-bucket' does not exist at {s3_server.endpoint}; create it or fix store.uri"):
        S3Store.from_uri("s3://no-such-bucket/run", env=s3_server.env())


def test_policy_denial_is_not_reported_as_bad_credentials(s3_server, s3_store: S3Store) -> None:
    s3_store.put("readable", b"ok")
    reader = S3Store.from_uri(s3_store.uri, env=s3_server.env(readonly=True))
    assert reader.get("readable") == b"ok"
    with pytest.raises(StoreAccessDenied, match="S3 denied put on .*/written for key RLHF\\*\\*\\*\\*") as info:
        reader.put("written", b"no")
    _assert_no_secret(str(info.value), s3_server)


def test_repr_hides_credentials(s3_server, s3_store: S3Store) -> None:
    for text in (repr(s3_store), str(s3_store), repr(s3_store.__dict__.get("_key_id"))):
        assert s3_server.secret_key not in text
    assert s3_server.access_key not in repr(s3_store)
    assert repr(s3_store) == (
        f"S3Store(uri={s3_store.uri!r}, endpoint={s3_server.endpoint!r}, key_id='RLHF****')"
    )


# ----------------------------------------------------------------------------- transfers


def test_multipart_upload_and_ranged_download(s3_server) -> None:
    store = S3Store.from_uri(
        s3_server.uri(f"mp/{uuid.uuid4().hex[:8]}"), env=s3_server.env(),
        multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=4,
    )  # fmt: skip
    data = bytes(range(251)) * (12 * MiB // 251)  # ~12 MiB: 3 parts, 3 ranges
    store.put("big.bin", data)
    head = _raw_client(s3_server).head_object(Bucket=s3_server.bucket, Key=f"{store.prefix}/big.bin")
    assert head["ETag"].strip('"').endswith("-3")  # a multipart ETag is "<md5>-<parts>"
    assert store.get("big.bin") == data
    buf = store.get_buffer("big.bin")
    assert isinstance(buf, bytearray) and buf == data
    small = b"s" * 1000
    store.put("small.bin", small)
    head = _raw_client(s3_server).head_object(Bucket=s3_server.bucket, Key=f"{store.prefix}/small.bin")
    assert "-" not in head["ETag"] and store.get("small.bin") == small
    store.close()


def test_put_content_uploads_only_new_blobs(s3_server) -> None:
    from actions.store import sha256_hex

    store = S3Store.from_uri(
        s3_server.uri(f"pc/{uuid.uuid4().hex[:8]}"), env=s3_server.env(),
        multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_single_put=6 * MiB,
    )  # fmt: skip
    header, body = b"HEAD", memoryview(bytes(range(256)) * 1000)
    digest = sha256_hex((header, body))
    assert store.put_content("blob", (header, body), digest) is True  # single conditional PUT
    assert store.put_content("blob", (header, body), digest) is False
    assert store.get("blob") == header + bytes(body)
    big = (b"H", memoryview(b"x" * (7 * MiB)))  # above max_single_put: HEAD, then multipart
    assert store.put_content("big", big, sha256_hex(big)) is True
    assert store.put_content("big", big, sha256_hex(big)) is False
    head = _raw_client(s3_server).head_object(Bucket=s3_server.bucket, Key=f"{store.prefix}/big")
    assert head["ETag"].strip('"').endswith("-2") and store.get("big") == b"H" + b"x" * (7 * MiB)


def test_broken_body_stream_is_retried(s3_store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    s3_store.put("k", b"payload")
    real_read, calls = s3_store._reader.read, []

    def flaky(full: str, size, name: str) -> bytearray:
        calls.append(full)
        if len(calls) == 1:
            raise bce.ResponseStreamingError(error="connection reset mid-body")
        return real_read(full, size, name)

    monkeypatch.setattr(s3_store._reader, "read", flaky)
    assert s3_store.get("k") == b"payload" and len(calls) == 2


def test_get_missing_key(s3_store: S3Store) -> None:
    with pytest.raises(ObjectNotFound, match="object 'nope/x' not found in store s3://"):
        s3_store.get("nope/x")


def test_presigned_urls_need_no_credentials(s3_store: S3Store) -> None:
    put_url = s3_store.presign_put("shared/obj", expires_s=60)
    request = urllib.request.Request(put_url, data=b"from a credential-less action", method="PUT")
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(s3_store.presign_get("shared/obj", expires_s=60), timeout=10) as resp:
        assert resp.read() == b"from a credential-less action"


# ----------------------------------------------------------------------------- conditional writes


def test_conditional_write_support_is_detected(s3_store: S3Store) -> None:
    assert s3_store.put_if_absent("m", b"1") is True
    assert s3_store._conditional is True  # SeaweedFS answers 412
    assert s3_store.list("") == ["m"]  # the probe key was cleaned up


def test_store_that_ignores_if_none_match_falls_back(s3_server) -> None:
    store = S3Store.from_uri(s3_server.uri(f"cw/{uuid.uuid4().hex[:8]}"), env=s3_server.env())

    def drop_if_none_match(request, **kwargs) -> None:  # what an old MinIO effectively does
        if "If-None-Match" in request.headers:
            del request.headers["If-None-Match"]

    store._client.meta.events.register("before-sign.s3.PutObject", drop_if_none_match)
    assert store.put_if_absent("m", b"first") is True
    assert store._conditional is False  # the probe saw its second write succeed
    assert store.put_if_absent("m", b"second") is False  # HEAD+PUT fallback
    assert store.get("m") == b"first"


# ----------------------------------------------------------------------------- crash and restart


class KillAfter:
    """Store wrapper that SIGKILLs the S3 server once N blob writes have been made."""

    def __init__(self, store: S3Store, server, num_writes: int) -> None:
        self.inner, self.server, self.left = store, server, num_writes
        self.uri, self.max_concurrency = store.uri, 1
        self._lock = threading.Lock()

    def _tick(self) -> None:
        with self._lock:
            self.left -= 1
            if self.left == 0:
                self.server.stop(kill=True)

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)
        self._tick()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        created = self.inner.put_if_absent(key, data)
        self._tick()
        return created

    def put_content(self, key: str, parts, sha256: str) -> bool:
        created = self.inner.put_content(key, parts, sha256)
        self._tick()
        return created

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_server_crash_mid_publish_leaves_no_version(tmp_path) -> None:
    from s3server import SeaweedS3Server

    torch.manual_seed(0)
    tensors = {f"layer{i}.weight": torch.randn(64, 64) for i in range(8)}  # 16 KiB blobs
    with SeaweedS3Server(tmp_path / "crash") as server:
        uri = server.uri("run")

        def open_() -> S3Store:
            return S3Store.from_uri(uri, env=server.env(), max_attempts=2, connect_timeout=1)

        with pytest.raises(StoreUnreachable, match="connection refused"):
            publish_tensors(KillAfter(open_(), server, num_writes=3), "policy/v1/manifest.json", tensors)
        server.start()  # same data dir and endpoint
        store = open_()
        assert not store.exists("policy/v1/manifest.json")  # no visible version
        assert len(store.list("blobs/")) >= 3  # orphan blobs are harmless
        with pytest.raises(ObjectNotFound):
            load_tensors(store, "policy/v1/manifest.json")
        published = publish_tensors(store, "policy/v1/manifest.json", tensors)
        assert published.stats.num_uploaded == len(tensors) - 3  # the first 3 survived
        loaded, meta = load_tensors(store, "policy/v1/manifest.json")
        assert meta["weights_sha256"] == published.weights_sha256
        assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)


def test_store_error_hierarchy() -> None:
    for cls in (StoreUnreachable, StoreCredentialsError, StoreAccessDenied, BucketNotFound, ObjectNotFound):
        assert issubclass(cls, StoreError)
