"""Where the OpenWhisk controller is and how to authenticate: arguments, a Prefect Secret
block, the environment (``WSK_*`` / ``__OW_*``) or ``~/.wskprops``. The key is registered with
``credentials.redact`` and never shown by ``repr``."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from actions.store.credentials import register_secret
from actions.store.endpoints import has_userinfo, is_http_url

API_PATH = "/api/v1"
SECRET_BLOCK_ENV = "RLHFLESS_OPENWHISK_SECRET"
"""Names a Prefect Secret block holding the OpenWhisk connection (see ``OpenWhiskConfig.from_secret``)."""


def _truthy(value: str | None) -> bool:
    return str(value or "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class OpenWhiskConfig:
    """Where the controller is and how to authenticate. ``repr`` never shows the key."""

    api_host: str
    """``https://host[:port]``; a bare host gets ``https://`` (as the ``wsk`` CLI does)."""
    auth: str = field(repr=False)
    """``uuid:key``, the AUTH value of ``~/.wskprops``."""
    namespace: str = "_"
    """``_`` means the key's default namespace."""
    verify: bool | str = True
    """TLS verification: True, False (``WSK_INSECURE``), or a CA bundle path."""

    def __post_init__(self) -> None:
        host = (self.api_host or "").strip().rstrip("/")
        if not host:
            raise ValueError("OpenWhisk API host is not set; set WSK_APIHOST (or __OW_API_HOST)")
        if has_userinfo(host):
            raise ValueError("OpenWhisk API host carries a user name or password (user:password@host); set "
                             "WSK_APIHOST to https://host[:port] and the credentials in WSK_AUTH")
        if "://" not in host:
            host = "https://" + host
        if host.endswith(API_PATH):
            host = host[: -len(API_PATH)]
        if not is_http_url(host):
            raise ValueError(f"OpenWhisk API host {self.api_host!r} is not a URL; set WSK_APIHOST to https://host[:port]")
        object.__setattr__(self, "api_host", host)
        uuid, _, key = (self.auth or "").partition(":")
        if not uuid or not key:
            raise ValueError("OpenWhisk auth must look like 'uuid:key' (the AUTH of ~/.wskprops); check WSK_AUTH")
        register_secret(self.auth)
        object.__setattr__(self, "namespace", (self.namespace or "_").strip("/") or "_")

    def __repr__(self) -> str:
        subject = self.auth.partition(":")[0][:4] + "****"
        return f"OpenWhiskConfig(api_host={self.api_host!r}, namespace={self.namespace!r}, subject={subject!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OpenWhiskConfig:
        """Read ``WSK_APIHOST``/``__OW_API_HOST``, ``WSK_AUTH``/``__OW_API_KEY``,
        ``__OW_NAMESPACE``/``WSK_NAMESPACE``, ``WSK_INSECURE``/``__OW_IGNORE_CERTS`` and
        ``WSK_CA_BUNDLE``; values missing there come from ``~/.wskprops`` (``WSK_CONFIG_FILE``)."""
        env = os.environ if env is None else env
        props = _read_wskprops(env)
        host = env.get("WSK_APIHOST") or env.get("__OW_API_HOST") or props.get("APIHOST", "")
        auth = env.get("WSK_AUTH") or env.get("__OW_API_KEY") or props.get("AUTH", "")
        if not host or not auth:
            missing = " and ".join(n for n, v in (("WSK_APIHOST", host), ("WSK_AUTH", auth)) if not v)
            raise ValueError(f"OpenWhisk connection not configured: set {missing} (or write ~/.wskprops)")
        namespace = env.get("__OW_NAMESPACE") or env.get("WSK_NAMESPACE") or props.get("NAMESPACE") or "_"
        return cls(host, auth, namespace, _verify_from(env))

    @classmethod
    def from_secret(cls, block_name: str, env: Mapping[str, str] | None = None) -> OpenWhiskConfig:
        """Load a Prefect Secret block. Its value is either a JSON object with ``api_host``,
        ``auth`` and optional ``namespace``, ``insecure``, ``ca_bundle``, or the bare
        ``uuid:key`` string (host and namespace then come from the environment)."""
        from prefect.blocks.system import Secret  # lazy: the client works without a Prefect server

        try:
            value = Secret.load(block_name).get()
        except Exception as exc:  # Prefect raises ValueError, httpx or its own errors here
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(f"cannot load the Prefect Secret block {block_name!r}: {reason}") from None
        if isinstance(value, str) and value.lstrip().startswith("{"):
            value = json.loads(value)
        env = os.environ if env is None else env
        if isinstance(value, str):
            return cls.from_env({**env, "WSK_AUTH": value.strip()})
        if not isinstance(value, Mapping):
            raise ValueError(f"Prefect Secret {block_name!r} must hold 'uuid:key' or an object with api_host and auth")
        verify: bool | str = value.get("ca_bundle") or not _truthy(str(value.get("insecure", "")))
        host = value.get("api_host") or value.get("apihost") or env.get("WSK_APIHOST") or env.get("__OW_API_HOST", "")
        namespace = value.get("namespace") or env.get("__OW_NAMESPACE") or "_"
        return cls(host, str(value.get("auth", "")), str(namespace), verify)

    @classmethod
    def resolve(
        cls,
        *,
        api_host: str | None = None,
        auth: str | None = None,
        namespace: str | None = None,
        secret_block: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> OpenWhiskConfig:
        """Explicit arguments win, then a Secret block (argument or ``RLHFLESS_OPENWHISK_SECRET``),
        then the environment."""
        env = os.environ if env is None else env
        block = secret_block or env.get(SECRET_BLOCK_ENV)
        if api_host and auth:
            return cls(api_host, auth, namespace or "_", _verify_from(env))
        base = cls.from_secret(block, env) if block else cls.from_env(env)
        return cls(api_host or base.api_host, auth or base.auth, namespace or base.namespace, base.verify)


def credentials_configured(secret_block: str | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Whether any source of an OpenWhisk connection is configured: a Secret block (argument or
    ``RLHFLESS_OPENWHISK_SECRET``), ``WSK_APIHOST``/``WSK_AUTH``, or a ``.wskprops`` with either.
    A configured source that fails to resolve is an error to report, not "no credentials"."""
    env = os.environ if env is None else env
    props = _read_wskprops(env)
    return bool(secret_block or env.get(SECRET_BLOCK_ENV) or env.get("WSK_APIHOST") or env.get("WSK_AUTH")
                or props.get("APIHOST") or props.get("AUTH"))


def _verify_from(env: Mapping[str, str]) -> bool | str:
    if _truthy(env.get("WSK_INSECURE")) or _truthy(env.get("__OW_IGNORE_CERTS")):
        return False
    return env.get("WSK_CA_BUNDLE") or True


def _read_wskprops(env: Mapping[str, str]) -> dict[str, str]:
    path = Path(env.get("WSK_CONFIG_FILE") or Path(env.get("HOME", "~")).expanduser() / ".wskprops")
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in lines if "=" in line and not line.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}
