"""Settings of the S3 backend: a store URI and the environment in, a boto3 client out.

Pure parsing (:func:`settings_from_env`) is apart from building the client
(:func:`make_client`), so a bad URI or variable fails with a one-line ``ValueError`` naming it
before any connection is made.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import boto3
from botocore.config import Config

from actions.store.credentials import S3Credentials
from actions.store.endpoints import has_userinfo, is_http_url

BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
BUCKET_FIX = "use 3-63 lowercase letters, digits, '.', '-'"
REGION_RE = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])?$")
"""A region name as botocore accepts it."""


_CREDENTIALS_IN_URI = ("store.uri carries credentials (key:secret@ before the bucket); use s3://bucket[/prefix] "
                       "and put the keys in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")


def split_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of ``s3://bucket[/prefix]``; ValueError naming the URI otherwise.

    A URI with an ``@`` whose part before the first ``/`` is not a bucket name is taken to
    carry credentials (``s3://key:secret@bucket``, the secret possibly holding ``/``) and
    refused without being quoted. An ``@`` in the prefix of a valid bucket is a key character.
    """
    if not uri.startswith("s3://"):
        if has_userinfo(uri):
            raise ValueError(_CREDENTIALS_IN_URI)
        raise ValueError(f"store.uri {uri!r} is not an s3:// URI")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if "@" in uri and not BUCKET_RE.match(bucket):
        raise ValueError(_CREDENTIALS_IN_URI)
    if not BUCKET_RE.match(bucket):
        raise ValueError(f"store.uri {uri!r}: bucket name {bucket!r} is invalid; {BUCKET_FIX}")
    parts = prefix.strip("/")
    if parts and any(part in ("", ".", "..") for part in parts.split("/")):
        # SeaweedFS writes a//b as a/b but lists nothing under a//b (collection then deletes
        # nothing); other servers refuse . and .. in a key
        raise ValueError(f"store.uri {uri!r}: its prefix {prefix!r} has an empty, '.' or '..' part, which S3 "
                         "servers store or list differently; write the prefix as names joined by single '/'")
    return bucket, prefix


def settings_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """``S3Store`` keyword arguments from the environment.

    Reads AWS_ENDPOINT_URL_S3 (else AWS_ENDPOINT_URL), AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION (else AWS_DEFAULT_REGION, else
    us-east-1) and RLHFLESS_S3_CONDITIONAL_WRITES (``auto``/``on``/``off``).

    Returns:
        ``endpoint_url``, ``endpoint_from`` (the variable it came from, for messages that blame
        it), ``credentials``, ``region`` and ``conditional_writes``.

    Raises:
        ValueError: a bad value, naming its variable and the fix. An endpoint with a path
            (``http://host:9000/s3``) is refused: path-style requests put the bucket after it,
            so the server would take the path's first part for the bucket.
    """
    mode = env.get("RLHFLESS_S3_CONDITIONAL_WRITES", "auto").lower()
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"RLHFLESS_S3_CONDITIONAL_WRITES={mode!r}: use auto, on or off")
    endpoint_var = "AWS_ENDPOINT_URL_S3" if env.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
    endpoint = env.get(endpoint_var) or None
    if endpoint is not None and has_userinfo(endpoint):
        raise ValueError(f"{endpoint_var} carries a user name or password (user:password@host); give the URL "
                         "without them (e.g. http://127.0.0.1:9000) and the keys in AWS_ACCESS_KEY_ID and "
                         "AWS_SECRET_ACCESS_KEY")
    if endpoint is not None and not is_http_url(endpoint):
        raise ValueError(
            f"{endpoint_var}={endpoint!r} is not an http(s) URL; set it to e.g. http://127.0.0.1:9000"
        )
    path = endpoint_path(endpoint) if endpoint is not None else ""
    if endpoint is not None and path:  # quoted whole: a user name or password was refused above
        raise ValueError(f"{endpoint_var}={endpoint!r} has a path ({path!r}), which S3 "
                         "requests would take for the bucket; set it to the server's address alone, "
                         f"{endpoint_var}={endpoint[:-len(path)]}, with the bucket and prefix in store.uri")
    region_var = "AWS_REGION" if env.get("AWS_REGION") else "AWS_DEFAULT_REGION"
    region = env.get(region_var) or "us-east-1"
    if not REGION_RE.match(region):  # botocore's own check, which names no variable
        raise ValueError(f"{region_var}={region!r} is not a region name; set it to the one the S3 server expects "
                         "(e.g. us-east-1: letters, digits and '-')")
    return {
        "endpoint_url": endpoint,
        "endpoint_from": endpoint_var,
        "credentials": S3Credentials.from_env(env),
        "region": region,
        "conditional_writes": {"auto": None, "on": True, "off": False}[mode],
    }


def endpoint_path(url: str) -> str:
    """What follows ``scheme://host[:port]`` in an http(s) URL: its path, query and fragment, or
    ``""`` when that is nothing but ``/``.

    >>> endpoint_path("http://minio:9000/"), endpoint_path("http://minio:9000/s3/"), endpoint_path("http://m?x=1")
    ('', '/s3/', '?x=1')
    """
    parts = urlsplit(url)
    rest = url[len(f"{parts.scheme}://{parts.netloc}"):]
    return "" if not rest.strip("/") else rest


def make_client(endpoint_url: str | None, region: str, credentials: S3Credentials | None, *, max_attempts: int,
                connect_timeout: float, read_timeout: float, max_concurrency: int) -> Any:
    """A boto3 S3 client with the backend's choices (see :mod:`.s3`): path-style addressing
    when an endpoint is given, checksums only when required, standard retries, and a pool
    large enough for one connection per part thread plus one per blob thread.

    Args:
        credentials: static credentials; None uses boto3's default chain.
        max_attempts: requests per call in all, the first included.
        connect_timeout, read_timeout: seconds.
    """
    config = Config(
        signature_version="s3v4",
        s3={"addressing_style": "path" if endpoint_url else "auto"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        # botocore's "max_attempts" counts retries (one more request in all); ours counts requests
        retries={"total_max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_pool_connections=max(10, 2 * max_concurrency + 2),
        # the endpoint is resolved once (settings_from_env), not again from the environment
        ignore_configured_endpoint_urls=True,
    )
    kwargs: dict[str, Any] = {}
    if credentials is not None:
        kwargs = {
            "aws_access_key_id": credentials.access_key_id,
            "aws_secret_access_key": credentials.secret_access_key,
            "aws_session_token": credentials.session_token,
        }
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url, region_name=region, config=config, **kwargs
    )
