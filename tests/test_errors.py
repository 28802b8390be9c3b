"""Which crashes are worth a retry (actions.runtime.errors)."""

from __future__ import annotations

import socket

import pytest
from botocore import exceptions as bce

from actions.runtime.errors import OOM_ADVICE, InjectedFault, crash_text, describe_crash
from actions.store import StoreError, StoreUnreachable


def _store_error_over(exc: Exception) -> StoreError:
    """A StoreError raised while handling ``exc``, as the S3 store translates client errors."""
    try:
        try:
            raise exc
        except Exception:
            raise StoreError("S3 put on s3://b/k failed: SlowDown") from None
    except StoreError as err:
        return err


def _client_error(status: int) -> bce.ClientError:
    return bce.ClientError({"Error": {"Code": str(status)}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


@pytest.mark.parametrize("exc", [
    ConnectionRefusedError(111, "Connection refused"), ConnectionResetError(104, "reset by peer"),
    TimeoutError("timed out"), socket.timeout("timed out"),
    InjectedFault("injected fault (faults.fail_fraction): simulated container crash"),
    StoreUnreachable("cannot reach S3 endpoint http://127.0.0.1:9"),
    bce.EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
    _client_error(503), _client_error(429), _client_error(502), _store_error_over(_client_error(503)),
])
def test_transient(exc):
    assert describe_crash(exc)["transient"] is True


@pytest.mark.parametrize("exc", [
    TypeError("unsupported operand type(s) for +: 'int' and 'str'"), ImportError("No module named 'vllm'"),
    KeyError("input_ids"), RuntimeError("shape mismatch"), _client_error(404), _store_error_over(_client_error(400)),
    StoreError("S3 put failed: InvalidArgument"),
])
def test_permanent(exc):
    crash = describe_crash(exc)
    assert crash["transient"] is False and crash["type"] == type(exc).__name__


def test_cuda_out_of_memory_is_named_with_advice_and_not_retried():
    exc = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity;\n"
                       "77.3 GiB already allocated)")
    crash = describe_crash(exc)
    assert crash["type"] == "CUDA out of memory" and crash["transient"] is False and crash["advice"] == OOM_ADVICE
    text = crash_text(crash)
    assert "\n" not in text and text.startswith("CUDA out of memory: RuntimeError: CUDA out of memory. Tried")
    assert "generation.max_new_tokens" in text and "algorithm.batch_size" in text
    oom_class = type("OutOfMemoryError", (RuntimeError,), {})  # torch.cuda.OutOfMemoryError's name
    assert describe_crash(oom_class("Tried to allocate 20.00 MiB"))["type"] == "CUDA out of memory"


def test_messages_are_one_bounded_line():
    crash = describe_crash(ValueError("a\nb\n" + "x" * 1000))
    assert "\n" not in crash["message"] and len(crash["message"]) <= 400


def test_a_crash_description_carries_no_secret(monkeypatch):
    """An action's crash is stored and logged as its activation result: secret values from the
    environment and URL passwords are scrubbed from it, whatever raised."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "crashSecretValue123")
    monkeypatch.setenv("HF_TOKEN", "hf_crashTokenValue456")
    crash = describe_crash(RuntimeError("boom crashSecretValue123 at http://u:urlPw789@10.0.0.1:9000 "
                                        "with hf_crashTokenValue456"))
    text = crash_text(crash)
    assert not any(s in text for s in ("crashSecretValue123", "urlPw789", "hf_crashTokenValue456")), text
    assert "[REDACTED]" in text and "10.0.0.1:9000" in text  # where, not who


def test_a_refused_payload_carries_no_secret(monkeypatch):
    """A refusal quotes the offending value, and OpenWhisk merges an action's default parameters
    into every payload: a secret bound there by mistake is scrubbed from the stored result."""
    from actions import warmup

    payload = dict(store_uri="s", base_key="b", init_key="i", dataset_key="d", output_key="o", warmup={},
                   task=None, seed=0)
    # bound as a default parameter only (wsk action update -p), not in the container's environment
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    result = warmup.main(payload | {"AWS_SECRET_ACCESS_KEY": "refusedSecretValue123"})
    assert "refusedSecretValue123" not in str(result), result
    assert result == {"error": "WarmupRequest.AWS_SECRET_ACCESS_KEY: extra inputs are not permitted",
                      "field": "AWS_SECRET_ACCESS_KEY"}
    # a value the container's environment holds is scrubbed wherever a refusal quotes it
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "refusedSecretValue123")
    result = warmup.main(payload | {"seed": "refusedSecretValue123"})
    assert "refusedSecretValue123" not in str(result) and "[REDACTED]" in result["error"], result
