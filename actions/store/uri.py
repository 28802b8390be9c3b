"""``open_store(uri)``: the backend a store URI names.

The S3 backend (and with it boto3) is imported only when an ``s3://`` URI is opened, so the
local default costs no boto3 import.
"""

from __future__ import annotations

from actions.store.endpoints import has_userinfo
from actions.store.local import LocalStore
from actions.store.protocol import ObjectStore


def open_store(uri: str) -> ObjectStore:
    """Open the store named by ``uri``.

    Args:
        uri: ``s3://bucket[/prefix]`` for S3 (endpoint and credentials come from the standard
            AWS environment variables; the endpoint, credentials and bucket are checked once
            here), ``file:///abs/dir`` or a plain directory path for the local backend.

    Raises:
        ValueError: an unsupported scheme (names the value and the accepted forms), or a local
            root that is a file or lies beneath one.
        StoreError: the S3 endpoint, credentials or bucket failed the check.
    """
    if uri.startswith("s3://"):
        from actions.store.s3 import S3Store  # boto3 is imported only when needed

        return S3Store.from_uri(uri)
    path = local_path(uri)
    if path is None:
        if has_userinfo(uri):  # not quoted: the part before '@' may be a password
            raise ValueError("store.uri carries a user name or password (user:password@) and has an unsupported "
                             "scheme: use a directory path or s3://bucket/prefix, with the keys in AWS_* variables")
        raise ValueError(
            f"store.uri {uri!r} has an unsupported scheme: use a directory path or s3://bucket/prefix"
        )
    return LocalStore(path)


def local_path(uri: str) -> str | None:
    """The directory a local store URI names (``file://`` removed), or None for any other
    scheme (``s3://`` and those :func:`open_store` refuses)."""
    path = uri[len("file://"):] if uri.startswith("file://") else uri
    return None if "://" in path else path
