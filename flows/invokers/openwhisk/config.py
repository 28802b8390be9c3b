"""Where the OpenWhisk controller is and how to authenticate: arguments, a Prefect Secret
block, the environment (``WSK_*`` / ``__OW_*``) or ``~/.wskprops``. The key is registered with
``credentials.redact`` and never shown by ``repr``."""

from __future__ import annotations

import json
import logging
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from actions.store.credentials import register_secret
from actions.store.endpoints import has_userinfo, is_http_url

API_PATH = "/api/v1"
AUTH_FORM = re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}:\S+")
"""An OpenWhisk auth key (``uuid:key``), wherever it turns up: never shown."""
SECRET_BLOCK_ENV = "RLHFLESS_OPENWHISK_SECRET"
"""Names a Prefect Secret block holding the OpenWhisk connection (see ``OpenWhiskConfig.from_secret``)."""
ENV_SETTINGS = {"api_host": "WSK_APIHOST", "auth": "WSK_AUTH", "ca_bundle": "WSK_CA_BUNDLE",
                "namespace": "WSK_NAMESPACE or __OW_NAMESPACE"}
"""How messages name a setting that came from arguments or the environment."""


def _truthy(value: str | None) -> bool:
    return str(value or "").strip().lower() in {"1", "true", "yes", "on"}


def _not_drain_progress(record: logging.LogRecord) -> bool:
    """Whether a record of Prefect's events worker is other than its progress while it drains at exit."""
    return not record.getMessage().startswith("Still processing items")


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
    origins: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    """Where ``api_host``, ``auth``, ``ca_bundle`` and ``namespace`` were set, as messages name it
    (``WSK_AUTH``, ``NAMESPACE in ~/.wskprops``, ``the auth key of Prefect Secret block 'NAME'``...);
    one not given is named by its environment variable (``ENV_SETTINGS``). Messages tell the
    user what to fix there."""

    def __post_init__(self) -> None:
        for value in (self.auth, self.api_host):  # first: no message below may show a key, wherever it was put
            if value and AUTH_FORM.fullmatch(value.strip()):
                register_secret(value.strip())
        host = (self.api_host or "").strip().rstrip("/")
        if not host:
            raise ValueError(f"OpenWhisk API host is not set; set {self.setting('api_host')} (or __OW_API_HOST)")
        if has_userinfo(host):  # the value is not shown: it holds a password
            raise ValueError(f"OpenWhisk API host carries a user name or password (user:password@host); set "
                             f"{self.setting('api_host')} to https://host[:port] and the credentials in "
                             f"{self.setting('auth')}")
        if "://" not in host:
            host = "https://" + host
        if host.endswith(API_PATH):
            host = host[: -len(API_PATH)]
        if not is_http_url(host) and "://" not in self.api_host:  # not shown: it may be the key, put here
            raise ValueError(f"OpenWhisk API host is neither a URL nor a host name (its value is not shown: it may be "
                             f"a key); set {self.setting('api_host')} to https://host[:port] and the key in "
                             f"{self.setting('auth')} (are the two swapped?)")
        if not is_http_url(host):
            raise ValueError(f"OpenWhisk API host {self.api_host!r} is not a URL; set {self.setting('api_host')} "
                             "to https://host[:port]")
        object.__setattr__(self, "api_host", host)
        uuid, _, key = (self.auth or "").partition(":")
        if not uuid or not key:
            raise ValueError("OpenWhisk auth must look like 'uuid:key' (the AUTH of ~/.wskprops); "
                             f"check {self.setting('auth')}")
        register_secret(self.auth)
        object.__setattr__(self, "namespace", (self.namespace or "_").strip("/") or "_")

    def __repr__(self) -> str:
        subject = self.auth.partition(":")[0][:4] + "****"
        return f"OpenWhiskConfig(api_host={self.api_host!r}, namespace={self.namespace!r}, subject={subject!r})"

    def setting(self, key: str) -> str:
        """Where ``key`` (``api_host``, ``auth``, ``ca_bundle`` or ``namespace``) was set, as a message names it."""
        return self.origins.get(key) or ENV_SETTINGS[key]

    def tls_verify(self) -> bool | ssl.SSLContext:
        """What the controller's certificate is verified with: ``verify``, or a context loaded
        from the CA bundle it names.

        Raises:
            ValueError: the bundle is not a readable file of PEM certificates (naming the setting
                and the path).
        """
        if not isinstance(self.verify, str):
            return self.verify
        where, path = self.setting("ca_bundle"), self.verify
        if not Path(path).is_file():
            raise ValueError(f"{where} names {path!r}, which is not a file; set it to the PEM file of the "
                             "controller's CA certificate")
        try:
            return ssl.create_default_context(cafile=path)
        except (OSError, ssl.SSLError) as exc:
            reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc).__name__
            raise ValueError(f"{where} names {path!r}, which holds no readable CA certificate ({reason}); set it "
                             "to the PEM file of the controller's CA certificate") from None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OpenWhiskConfig:
        """Read ``WSK_APIHOST``/``__OW_API_HOST``, ``WSK_AUTH``/``__OW_API_KEY``,
        ``__OW_NAMESPACE``/``WSK_NAMESPACE``, ``WSK_INSECURE``/``__OW_IGNORE_CERTS`` and
        ``WSK_CA_BUNDLE``; values missing there come from ``~/.wskprops`` (``WSK_CONFIG_FILE``)."""
        env = os.environ if env is None else env
        props = _read_wskprops(env)
        host, host_from = _host_from(env, props)
        auth_from = _first_set(env, "WSK_AUTH", "__OW_API_KEY")
        auth = env.get(auth_from, "") if auth_from else props.get("AUTH", "")
        if not host or not auth:
            missing = " and ".join(n for n, v in (("WSK_APIHOST", host), ("WSK_AUTH", auth)) if not v)
            raise ValueError(f"OpenWhisk connection not configured: set {missing} (or write ~/.wskprops)")
        namespace, ns_from = _namespace_from(env, props)
        origins = {"api_host": host_from, "auth": auth_from or f"AUTH in {_wskprops_path(env)}", **ns_from}
        return cls(host, auth, namespace, _verify_from(env), origins)

    @classmethod
    def from_secret(cls, block_name: str, env: Mapping[str, str] | None = None) -> OpenWhiskConfig:
        """Load a Prefect Secret block. Its value is either a JSON object with ``api_host``,
        ``auth`` and optional ``namespace``, ``insecure``, ``ca_bundle``, or the bare
        ``uuid:key`` string (host and namespace then come from the environment). A host or
        namespace the block does not hold comes from the environment or ``~/.wskprops``, as in
        :meth:`from_env`, else ``_``. Errors name the block and its key, never the value; one
        that cannot be loaded names ``PREFECT_API_URL``."""
        from prefect.blocks.system import Secret  # lazy: the client works without a Prefect server

        # Loading a block emits an event; a process that exits soon after (a refused deploy) would
        # print Prefect's "Still processing items" progress below its one-line error.
        logging.getLogger("EventsWorker").addFilter(_not_drain_progress)
        try:
            value = Secret.load(block_name).get()
        except Exception as exc:  # Prefect raises ValueError, httpx or its own errors here
            raise ValueError(_block_load_error(block_name, exc)) from None
        block = f"Prefect Secret block {block_name!r}"
        value = _parse_block(block, value)
        env = os.environ if env is None else env
        if isinstance(value, str):
            uuid, _, key = value.strip().partition(":")
            if not uuid or not key:
                raise ValueError(f"{block} holds a string that is not 'uuid:key' (the AUTH of ~/.wskprops); store "
                                 "the key, or an object with api_host and auth")
            base = cls.from_env({**env, "WSK_AUTH": value.strip()})
            return cls(base.api_host, base.auth, base.namespace, base.verify, {**base.origins, "auth": block})
        if not value.get("auth"):
            raise ValueError(f"{block} has no auth key; add \"auth\": \"UUID:KEY\" (the AUTH of ~/.wskprops)")
        verify: bool | str = value.get("ca_bundle") or not _truthy(str(value.get("insecure", "")))
        host_key = next((k for k in ("api_host", "apihost") if value.get(k)), None)
        host, host_from = (value[host_key], f"the {host_key} key of {block}") if host_key else _host_from(env)
        if not host:
            raise ValueError(f"{block} has no api_host key, WSK_APIHOST is not set and {_wskprops_path(env)} has no "
                             "APIHOST; add \"api_host\": \"https://host[:port]\" to the block")
        namespace, ns_from = (value["namespace"], {}) if value.get("namespace") else _namespace_from(env)
        origins = {key: f"the {key} key of {block}" for key in ("auth", "ca_bundle", "namespace")} | ns_from
        origins["api_host"] = host_from
        return cls(str(host), str(value["auth"]), str(namespace), verify, origins)

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
        given = {"api_host": api_host, "auth": auth, "namespace": namespace}
        origins = {k: v for k, v in base.origins.items() if not given.get(k)}
        return cls(api_host or base.api_host, auth or base.auth, namespace or base.namespace, base.verify, origins)


def _parse_block(block: str, value: object) -> str | Mapping[str, object]:
    """A Secret block's value as the bare key string or a mapping (a JSON object string parsed).

    Raises:
        ValueError: naming the block and what is wrong, never the value (it holds the key).
    """
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{block} is not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno}); "
                             "store an object with api_host and auth, or the bare 'uuid:key'") from None
    if not isinstance(value, (str, Mapping)):
        raise ValueError(f"{block} must hold 'uuid:key' or an object with api_host and auth")
    return value


def credentials_configured(secret_block: str | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Whether any source of an OpenWhisk connection is configured: a Secret block (argument or
    ``RLHFLESS_OPENWHISK_SECRET``), ``WSK_APIHOST``/``WSK_AUTH`` or their ``__OW_API_HOST``/
    ``__OW_API_KEY`` (as ``from_env`` reads them), or a ``.wskprops`` with either.
    A configured source that fails to resolve is an error to report, not "no credentials"."""
    env = os.environ if env is None else env
    props = _read_wskprops(env)
    return bool(secret_block or env.get(SECRET_BLOCK_ENV)
                or _first_set(env, "WSK_APIHOST", "WSK_AUTH", "__OW_API_HOST", "__OW_API_KEY")
                or props.get("APIHOST") or props.get("AUTH"))


def _host_from(env: Mapping[str, str], props: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(the API host the environment names: ``WSK_APIHOST``, ``__OW_API_HOST``, else ``APIHOST``
    of ``~/.wskprops``, "" where none does; its origin, for messages)."""
    if name := _first_set(env, "WSK_APIHOST", "__OW_API_HOST"):
        return env.get(name, ""), name
    props = _read_wskprops(env) if props is None else props
    return props.get("APIHOST", ""), f"APIHOST in {_wskprops_path(env)}"


def _namespace_from(env: Mapping[str, str], props: Mapping[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """The namespace the environment names (``__OW_NAMESPACE``, ``WSK_NAMESPACE``, else
    ``NAMESPACE`` of ``~/.wskprops``; ``_``, the key's own, when none does) and, when one does,
    its origin (``{"namespace": where}``) for messages."""
    props = _read_wskprops(env) if props is None else props
    if name := _first_set(env, "__OW_NAMESPACE", "WSK_NAMESPACE"):
        return env[name], {"namespace": name}
    if props.get("NAMESPACE"):
        return props["NAMESPACE"], {"namespace": f"NAMESPACE in {_wskprops_path(env)}"}
    return "_", {}


def _block_load_error(block_name: str, exc: Exception) -> str:
    """The message for a Secret block that cannot be loaded, with the ways out where the cause
    is known: a Prefect API that cannot be reached, or one that holds no block of that name
    (Prefect's ``ValueError`` raised from ``ObjectNotFound``). Both name ``PREFECT_API_URL``
    and its value (an address, not a secret; any ``user:password@`` in it is removed)."""
    import httpx

    from actions.store.credentials import redact

    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    message = f"cannot load the Prefect Secret block {block_name!r}: {reason}"
    without = f"or leave the block out (--secret-block, {SECRET_BLOCK_ENV}) and set WSK_APIHOST and WSK_AUTH"
    if _block_missing(exc):
        return redact(f"{message}; the Prefect API at {_prefect_api()} holds no Secret block of that name: check "
                      "the name (`prefect block ls` lists the blocks there), create it there (`from "
                      "prefect.blocks.system import Secret; Secret(value='{\"api_host\": ..., \"auth\": ...}')"
                      f".save({block_name!r})`), set PREFECT_API_URL to the server holding it, {without}")
    if not isinstance(exc, (httpx.TransportError, OSError)):
        return redact(message)
    return redact(f"{message}; the Prefect API at {_prefect_api()} does not answer: start the Prefect server there "
                  f"(`prefect server start`) or set PREFECT_API_URL to the one holding the block, {without}")


def _block_missing(exc: BaseException) -> bool:
    """Whether Prefect's error says the API holds no block of that name: its ``ObjectNotFound``
    (a 404), which ``Block.load`` raises as the cause of a ``ValueError``."""
    from prefect.exceptions import ObjectNotFound

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ObjectNotFound):
            return True
        seen = seen.__cause__
    return str(exc).startswith("Unable to find block document named")


def _prefect_api() -> str:
    """``PREFECT_API_URL`` and its value, as a message names the Prefect API used."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    return f"PREFECT_API_URL={url}" if url else "PREFECT_API_URL (not set: this machine's own Prefect database)"


def _verify_from(env: Mapping[str, str]) -> bool | str:
    if _truthy(env.get("WSK_INSECURE")) or _truthy(env.get("__OW_IGNORE_CERTS")):
        return False
    return env.get("WSK_CA_BUNDLE") or True


def _first_set(env: Mapping[str, str], *names: str) -> str | None:
    return next((name for name in names if env.get(name)), None)


def _wskprops_path(env: Mapping[str, str]) -> Path:
    return Path(env.get("WSK_CONFIG_FILE") or Path(env.get("HOME", "~")).expanduser() / ".wskprops")


def _read_wskprops(env: Mapping[str, str]) -> dict[str, str]:
    path = _wskprops_path(env)
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in lines if "=" in line and not line.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}
