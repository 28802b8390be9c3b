"""The S3 backend on a faulty network, against the real SeaweedFS server behind a loopback
proxy (``faultproxy.py``): a conditional write whose reply is lost, or turned into a 503, after
the server acted reports what it did; a lease renewal whose reply is lost keeps the lease; a
read of a server that never answers costs ``max_attempts`` requests and says so; a blob that is
not its manifest's size is refused before its body is downloaded."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from actions.store import IntegrityError, StoreUnreachable, blob_key, get_artifact, sha256_hex
from actions.store.s3 import S3Store
from flows.campaign.lease import RunLease, read_lease

try:
    from faultproxy import FaultProxy, SilentServer
except ImportError:  # tests/ imported as a package
    from tests.faultproxy import FaultProxy, SilentServer

pytestmark = pytest.mark.s3

MiB = 1024 * 1024
FAULTS = ["drop", "503"]


@pytest.fixture
def proxy(s3_server):
    proxy = FaultProxy(s3_server.ports["s3"])
    yield proxy
    proxy.close()


@pytest.fixture
def store(s3_server, proxy):
    """An S3Store that reaches the server through ``proxy`` (conditional writes probed first)."""
    store = S3Store.from_uri(s3_server.uri(f"faults/{uuid.uuid4().hex[:12]}"),
                             env={**s3_server.env(), "AWS_ENDPOINT_URL": proxy.endpoint})
    assert store.conditional_writes()
    yield store
    store.close()


def _request(method: str, key: str, header: str) -> bytes:
    """A pattern for the head of ``method`` on ``key`` carrying ``header``."""
    return rf"^{method} [^ ]*/{key} .*\r\n{header}:".encode()


# ----------------------------------------------------------------------------- conditional writes


@pytest.mark.parametrize("fault", FAULTS)
def test_a_create_whose_reply_is_lost_reports_that_it_created(store: S3Store, proxy: FaultProxy, fault: str) -> None:
    proxy.spoil(_request("PUT", "created", "If-None-Match"), fault)
    assert store.put_if_absent("created", b"mine") is True  # botocore resent it: 412, our own bytes
    assert proxy.spoiled == 1 and store.get("created") == b"mine"
    store.put("taken", b"theirs")
    proxy.spoil(_request("PUT", "taken", "If-None-Match"), fault)
    assert store.put_if_absent("taken", b"mine") is False  # resent too, but the bytes are another's
    assert proxy.spoiled == 2 and store.get("taken") == b"theirs"


@pytest.mark.parametrize("fault", FAULTS)
def test_a_compare_and_swap_whose_reply_is_lost_reports_that_it_swapped(store: S3Store, proxy: FaultProxy,
                                                                         fault: str) -> None:
    store.put("cas", b"v1")
    proxy.spoil(_request("PUT", "cas", "If-Match"), fault)
    assert store.replace_if("cas", b"v1", b"v2") is True
    assert proxy.spoiled == 1 and store.get("cas") == b"v2"
    proxy.spoil(_request("DELETE", "cas", "If-Match"), fault)
    assert store.delete_if("cas", b"v2") is True
    assert proxy.spoiled == 2 and not store.exists("cas")
    store.put("cas", b"v3")
    assert store.replace_if("cas", b"v1", b"v4") is False and store.delete_if("cas", b"v1") is False
    assert store.get("cas") == b"v3"


def test_a_lease_renewal_whose_reply_is_lost_keeps_the_lease(store: S3Store, proxy: FaultProxy) -> None:
    lease = RunLease.acquire(store, "r1", ttl_s=60, renew=False, progress=lambda message: None)
    try:
        first = lease.record
        proxy.spoil(_request("PUT", r"runs/r1/lease\.json", "If-Match"), "drop")
        lease.renew()
        assert proxy.spoiled == 1 and lease.lost is None
        lease.check()  # no LeaseLost naming this very process
        stored = read_lease(store, "r1")
        assert stored == lease.record and stored.token == first.token and stored.renewed >= first.renewed
    finally:
        lease.release()
    assert read_lease(store, "r1") is None


# ----------------------------------------------------------------------------- reads


@pytest.mark.parametrize("fast_path", [True, False], ids=["presigned", "get_object"])
def test_a_server_that_never_answers_gets_max_attempts_requests_per_read(s3_server, fast_path: bool) -> None:
    silent = SilentServer()
    store = S3Store.from_uri(s3_server.uri("hung"), env={**s3_server.env(), "AWS_ENDPOINT_URL": silent.endpoint},
                             check=False, max_attempts=3, connect_timeout=1.0, read_timeout=0.5)
    if not fast_path:
        store._reader.http = None  # reads through get_object, which botocore retries
    try:
        with pytest.raises(StoreUnreachable) as info:
            store.get("k")
    finally:
        store.close()
        silent.close()
    assert silent.requests == 3  # one level of retries: not 3 x 3
    message = str(info.value)
    assert message.startswith(f"cannot reach S3 endpoint {silent.endpoint} : no response within the 0.5 s read "
                              "timeout (")
    assert ("3 reads in " if fast_path else "1 read in ") in message
    assert ("retried by botocore" in message) is not fast_path


def test_opening_a_store_on_a_server_that_never_answers_fails_within_the_probe_budget(s3_server, monkeypatch) -> None:
    """The probe every open makes has a budget of its own (2 requests, timeouts capped at
    PROBE_TIMEOUT_S), whatever the store's read timeout: a hung endpoint is named in about half
    a minute, not max_attempts x read_timeout (5 minutes at the defaults)."""
    monkeypatch.setattr("actions.store.s3.PROBE_TIMEOUT_S", 0.5)
    silent = SilentServer()
    try:
        with pytest.raises(StoreUnreachable) as info:
            S3Store.from_uri(s3_server.uri("hung"), env={**s3_server.env(), "AWS_ENDPOINT_URL": silent.endpoint},
                             max_attempts=5, read_timeout=60.0)
    finally:
        silent.close()
    assert silent.requests == 2
    assert str(info.value).startswith(f"cannot reach S3 endpoint {silent.endpoint} : no response within the 0.5 s "
                                      "read timeout (2 requests in ")
    assert str(info.value).endswith("; check AWS_ENDPOINT_URL")


def test_a_blob_larger_than_its_manifest_says_is_refused_before_its_body_is_read(store: S3Store,
                                                                                 proxy: FaultProxy) -> None:
    data = os.urandom(40 * MiB)  # where the manifest promises 10 bytes
    digest = sha256_hex(data)
    store.put(blob_key(digest), data)
    manifest = {"schema": "rlhfless.artifact/v1", "files": {"f": {"sha256": digest, "size": 10}}, "meta": {}}
    store.put("m/manifest.json", json.dumps(manifest).encode())
    for zero_copy in (False, True):
        before = proxy.bytes_to_client
        expected = (rf"blob {blob_key(digest)} for file 'f' is truncated or padded \(manifest 'm/manifest.json'\): "
                    rf"expected 10 bytes, found {len(data)}; re-publish the artifact")
        with pytest.raises(IntegrityError, match=expected):
            get_artifact(store, "m/manifest.json", zero_copy=zero_copy)
        # what reached the client before it hung up: socket buffers, not the 40 MiB body
        assert proxy.bytes_to_client - before < 16 * MiB, zero_copy
