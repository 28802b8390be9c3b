"""Credentials: where the S3 and OpenWhisk secrets come from, and how to keep them out of text.

Actions and flows receive a store *URI* only (``s3://bucket/prefix``), never credentials in a
payload. Credentials come from the process environment -- for OpenWhisk actions, from action
parameters bound at deploy time, which the runtime exposes as environment variables -- or, when
``AWS_ACCESS_KEY_ID`` is absent, from boto3's default chain (shared config, IRSA, instance
profile). See ``docs/storage.md`` for the least-privilege policy that scopes them.

:func:`redact` scrubs every known secret value from a string. Call it on anything that may
echo a request, a header or an environment dump before it is logged, raised or returned in an
action result.

What this module does not cover: fetching or rotating credentials (STS, vault).
"""

from __future__ import annotations

import base64
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

#: Environment variables whose values are secret. Access key ids are only semi-secret: they are
#: shown masked (first 4 characters) so an operator can tell which key was used.
#: Tokens are long random strings; a human-chosen password (MLflow's) is left out, since scrubbing
#: a word such as "mlflow" from every message would garble them.
SECRET_ENV_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "WSK_AUTH", "__OW_API_KEY", "HF_TOKEN",
                   "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN")
KEY_ID_ENV_VARS = ("AWS_ACCESS_KEY_ID",)

# Values shorter than this are not scrubbed: replacing every "a" in a message helps nobody, and
# no real key is this short.
_MIN_SECRET_LEN = 4
_REDACTED = "[REDACTED]"
_URL_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^\s'\"]*@")
"""The ``user[:password]@`` of a URL: everything from ``scheme://`` to the last ``@`` before a
space or quote. A password may hold ``/``, ``?``, ``#``, ``:`` or ``@``, so the URL grammar
(which ends the host part at the first of ``/?#``) would leave part of it; a path that holds an
``@`` is redacted too, which costs a message some detail, never a secret."""

_GENERATED_KEY_ID = re.compile(r"[A-Z0-9]{16,}")
_KEY_ID_CHAR = r"[A-Za-z0-9_\-/+]"
"""A character that continues a token around a key id: ``=`` and punctuation end one, so
``AWS_ACCESS_KEY_ID=ID`` and ``key ID.`` are masked."""

_extra_lock = threading.Lock()
_extra_secrets: set[str] = set()
_extra_key_ids: set[str] = set()


def mask_key_id(key_id: str | None) -> str:
    """The masked form of an access key id that may appear in messages (``AKIA****``)."""
    if not key_id:
        return "<none>"
    return key_id[:4] + "****"


def register_secret(value: str | None, *, key_id: bool = False) -> None:
    """Make :func:`redact` scrub ``value`` too (credentials passed in code, not via env)."""
    if not value or len(value) < _MIN_SECRET_LEN:
        return
    with _extra_lock:
        (_extra_key_ids if key_id else _extra_secrets).add(value)


def _variants(value: str) -> list[str]:
    """A secret and the encodings under which it leaks: an OpenWhisk ``uuid:key`` auth string
    also travels base64-encoded in ``Authorization: Basic``, and each half is secret alone.
    A URL's scheme is not a half: an auth variable that holds a URL (host and key swapped)
    would otherwise scrub ``https`` from every message, the one saying they are swapped too."""
    out = [value, base64.b64encode(value.encode()).decode()]
    head, colon, tail = value.partition(":")
    if colon and not tail.startswith("//"):
        out.extend(part for part in (head, tail) if len(part) >= _MIN_SECRET_LEN)
    return out


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """Remove current secret values from ``text``.

    Scrubs the values of ``SECRET_ENV_VARS`` (plus the base64 form and both halves of
    ``uuid:key`` auth strings) wherever they occur, masks AWS_ACCESS_KEY_ID to its first 4
    characters where it stands as a token of its own (``_key_id_pattern``), does the
    same for values passed to :func:`register_secret`, and removes the user name and password
    of any URL (``scheme://user:pass@host``: the endpoints refuse them, this is the backstop).

    Args:
        text: any message, log line, repr or traceback text.
        env: the environment to read secrets from (default ``os.environ``).

    Returns:
        ``text`` with each secret replaced by ``[REDACTED]`` and each key id masked.

    >>> redact("auth=23bc46b1:123zO3xZCLrMN6v2BKK ok", env={"WSK_AUTH": "23bc46b1:123zO3xZCLrMN6v2BKK"})
    'auth=[REDACTED] ok'
    >>> redact("cannot reach http://minio:pw123@10.0.0.5:9000/b", env={})
    'cannot reach http://[REDACTED]@10.0.0.5:9000/b'
    >>> redact("AWS_ENDPOINT_URL='http://AKIAX:wJal/K7MD?x#y@minio:9000' is bad", env={})
    "AWS_ENDPOINT_URL='http://[REDACTED]@minio:9000' is bad"
    >>> redact("action rlhfless/prepare: key rlhfless denied", env={"AWS_ACCESS_KEY_ID": "rlhfless"})
    'action rlhfless/prepare: key rlhf**** denied'
    """
    env = os.environ if env is None else env
    with _extra_lock:
        secrets = set(_extra_secrets)
        key_ids = set(_extra_key_ids)
    secrets.update(v for name in SECRET_ENV_VARS if len(v := env.get(name, "")) >= _MIN_SECRET_LEN)
    key_ids.update(v for name in KEY_ID_ENV_VARS if len(v := env.get(name, "")) >= _MIN_SECRET_LEN)
    replacements = [(v, _REDACTED) for s in secrets for v in _variants(s)]
    # Longest first, so a secret that contains another one is replaced whole.
    for value, repl in sorted(replacements, key=lambda r: -len(r[0])):
        if value in text:
            text = text.replace(value, repl)
    for key_id in sorted(key_ids, key=len, reverse=True):
        if key_id in text:
            text = _key_id_pattern(key_id).sub(mask_key_id(key_id), text)
    return _URL_USERINFO.sub(rf"\1{_REDACTED}@", text)


def _key_id_pattern(key_id: str) -> re.Pattern[str]:
    """Where ``key_id`` is masked. A generated id (AWS's ``AKIA...``: 16+ upper-case letters and
    digits) is masked anywhere, even inside SigV4's ``Credential=ID/date/...``. A shorter or
    lower-case id may be a word its owner chose (MinIO's ``rlhfless-actions``), so it is masked
    only as a whole token: not inside a longer name, path or key such as ``rlhfless/prepare``
    when the id is ``rlhfless``."""
    if _GENERATED_KEY_ID.fullmatch(key_id):
        return re.compile(re.escape(key_id))
    return re.compile(rf"(?<!{_KEY_ID_CHAR}){re.escape(key_id)}(?!{_KEY_ID_CHAR})")


@dataclass(frozen=True)
class S3Credentials:
    """Static S3 credentials. ``repr`` shows the masked key id only."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"S3Credentials(access_key_id={mask_key_id(self.access_key_id)!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Credentials | None:
        """Read AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN).

        Returns None when no key id is set: boto3's default chain (profile, IRSA, instance
        role) then applies. Raises ValueError when only one half of the pair is set.
        """
        env = os.environ if env is None else env
        key_id = env.get("AWS_ACCESS_KEY_ID") or None
        secret = env.get("AWS_SECRET_ACCESS_KEY") or None
        if key_id is None and secret is None:
            return None
        if key_id is None or secret is None:
            missing = "AWS_SECRET_ACCESS_KEY" if key_id else "AWS_ACCESS_KEY_ID"
            raise ValueError(f"{missing} is not set but its pair is; set both or neither")
        creds = cls(key_id, secret, env.get("AWS_SESSION_TOKEN") or None)
        register_secret(creds.secret_access_key)
        register_secret(creds.session_token)
        register_secret(creds.access_key_id, key_id=True)
        return creds
