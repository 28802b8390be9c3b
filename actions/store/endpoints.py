"""Checking service endpoints from the environment (S3, OpenWhisk) before any connection."""

from __future__ import annotations

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
    try:
        return "@" in urlsplit(text if "://" in text else "//" + text).netloc
    except ValueError:  # a malformed host (an unclosed IPv6 bracket): is_http_url refuses it
        return False
