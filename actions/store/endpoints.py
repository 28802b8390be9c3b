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
    """True where a URL may carry a user name or password: an ``@`` anywhere after
    ``scheme://`` (anywhere at all in a value without a scheme, such as a bare host).

    Wider than the URL grammar on purpose: ``urlsplit`` ends the host part at the first
    ``/``, ``?`` or ``#``, and a secret may contain those (AWS secret keys often hold ``/``),
    so in ``http://AKIA:wJal/K7MD@minio:9000`` it would see the host ``AKIA:wJal`` and no
    password. A service endpoint never needs an ``@``. Such a value is refused without being
    quoted: the password would reach every message that names the endpoint.

    >>> has_userinfo("http://AKIA:wJal/K7MD@minio:9000"), has_userinfo("http://minio:9000/a")
    (True, False)
    """
    return "@" in (text.split("://", 1)[1] if "://" in text else text)
