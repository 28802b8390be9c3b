"""Checking service endpoints from the environment (S3, OpenWhisk) before any connection."""

from __future__ import annotations

import re
from urllib.parse import urlsplit


def is_http_url(text: str) -> bool:
    """True for ``http(s)://host[:port][/path]``: a scheme, a host, a numeric non-zero port if
    one is given, and no whitespace. Callers word the error, naming their own setting."""
    try:
        parts = urlsplit(text)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number
        return False
    return valid and not any(c.isspace() for c in text)


def has_userinfo(text: str) -> bool:
    """True where a URL carries a user name or password (``scheme://user:pass@host``).
    Such a URL is refused without being quoted: the password would reach every message that
    names the endpoint."""
    rest = text.partition("://")[2] if "://" in text else text
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    return "@" in authority
