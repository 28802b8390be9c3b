"""``redact``: a key id is masked as a token of its own, never inside a longer word; secrets are
scrubbed wherever they occur."""

from __future__ import annotations

import pytest

from actions.store.credentials import redact


@pytest.mark.parametrize("text, expected", [
    ("action rlhfless/prepare failed", "action rlhfless/prepare failed"),
    ("image rlhfless-runtime:0.1 in s3://bucket/rlhfless", "image rlhfless-runtime:0.1 in s3://bucket/rlhfless"),
    ("rlhfless_threads=2 myrlhfless", "rlhfless_threads=2 myrlhfless"),
    ("AWS_ACCESS_KEY_ID=rlhfless rejected", "AWS_ACCESS_KEY_ID=rlhf**** rejected"),
    ("S3 rejected the credentials (key rlhfless).", "S3 rejected the credentials (key rlhf****)."),
    ("'rlhfless' \"rlhfless\" rlhfless", "'rlhf****' \"rlhf****\" rlhf****"),
])
def test_a_chosen_key_id_is_masked_only_as_a_whole_token(text: str, expected: str) -> None:
    assert redact(text, env={"AWS_ACCESS_KEY_ID": "rlhfless"}) == expected


def test_the_actions_identity_of_the_docs_keeps_the_project_name_readable() -> None:
    env = {"AWS_ACCESS_KEY_ID": "rlhfless-actions", "AWS_SECRET_ACCESS_KEY": "change-me-actions-secret"}
    text = "action rlhfless/prepare: key rlhfless-actions, secret change-me-actions-secret; run `rlhfless deploy`"
    assert redact(text, env=env) == "action rlhfless/prepare: key rlhf****, secret [REDACTED]; run `rlhfless deploy`"


def test_a_generated_key_id_is_masked_anywhere() -> None:
    """An AWS key id cannot be a word of a message: masked inside SigV4's credential scope too."""
    text = "Authorization: AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20240101/us-east-1/s3/aws4_request"
    assert redact(text, env={"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE"}) == (
        "Authorization: AWS4-HMAC-SHA256 Credential=AKIA****/20240101/us-east-1/s3/aws4_request")


def test_secrets_are_scrubbed_inside_longer_words() -> None:
    env = {"AWS_SECRET_ACCESS_KEY": "rlhfsecret", "AWS_ACCESS_KEY_ID": "rlhfless"}
    out = redact("x/rlhfsecret/y and rlhfsecret-2 by rlhfless", env=env)
    assert out == "x/[REDACTED]/y and [REDACTED]-2 by rlhf****"


def test_the_openwhisk_guide_binds_the_actions_identity_of_the_minio_setup() -> None:
    """A key id equal to the project's name would be masked in every message naming an action
    or a command; the guide's example uses the MinIO setup's actions user instead."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    example = dict(line.split("=", 1) for line in (root / "infra/minio/env.example").read_text().splitlines()
                   if "=" in line and not line.startswith("#"))
    key_ids = re.findall(r"AWS_ACCESS_KEY_ID=(\S+)", (root / "docs/openwhisk.md").read_text())
    assert key_ids and set(key_ids) == {example["RLHFLESS_ACTIONS_USER"]}
