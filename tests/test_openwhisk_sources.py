"""Where the OpenWhisk namespace and a Secret block come from is named in the messages that
ask to fix them: a 403 names the namespace's source, a block that cannot be loaded names
PREFECT_API_URL, and a JSON block without a namespace takes it from the environment."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from flows.invokers.openwhisk import OpenWhiskAuthError, OpenWhiskClient, OpenWhiskConfig

try:
    from ow_emulator import OpenWhiskEmulator, ow_emulator  # noqa: F401
    from test_openwhisk import FAST
except ImportError:  # tests/ imported as a package
    from tests.ow_emulator import OpenWhiskEmulator, ow_emulator  # noqa: F401
    from tests.test_openwhisk import FAST

BLOCK_KEY = "23bc46b1-71f6:123zO3xZCLrMN6v2BKK1dX"


def _block(monkeypatch, value):
    import prefect.blocks.system as system

    monkeypatch.setattr(system.Secret, "load", staticmethod(lambda name: SimpleNamespace(get=lambda: value)))


def _denied(config: OpenWhiskConfig) -> str:
    with OpenWhiskClient(config, retry=FAST) as client:
        with pytest.raises(OpenWhiskAuthError) as info:
            client.get_action("rlhfless/probe")
    return str(info.value)


@pytest.mark.parametrize("source", ["WSK_NAMESPACE", "__OW_NAMESPACE", "wskprops", "block"])
def test_a_denied_namespace_is_named_where_it_was_set(ow_emulator: OpenWhiskEmulator, monkeypatch, tmp_path: Path,
                                                      source: str):
    host, auth, _ = ow_emulator.credentials
    env = {"WSK_APIHOST": host, "WSK_AUTH": auth, "HOME": str(tmp_path)}
    where = source
    if source == "wskprops":
        (tmp_path / ".wskprops").write_text("NAMESPACE=someone-else\n")
        where = f"NAMESPACE in {tmp_path / '.wskprops'}"
    elif source == "block":
        _block(monkeypatch, {"api_host": host, "auth": auth, "namespace": "someone-else"})
        where = "the namespace key of Prefect Secret block 'ow-conn'"
    else:
        env[source] = "someone-else"
    config = OpenWhiskConfig.resolve(secret_block="ow-conn" if source == "block" else None, env=env)
    assert config.namespace == "someone-else"
    assert _denied(config) == (f"OpenWhisk denied the credentials access to namespace someone-else at {host} "
                               f"(HTTP 403); check {config.setting('auth')} and the namespace ({where}, or _ for "
                               f"the key's own)")


@pytest.mark.parametrize("env, props, expected", [
    ({"WSK_NAMESPACE": "team"}, "", "team"),
    ({"__OW_NAMESPACE": "inner", "WSK_NAMESPACE": "team"}, "", "inner"),
    ({}, "NAMESPACE=from-props\n", "from-props"),
    ({}, "", "_"),
])
def test_a_json_block_without_a_namespace_takes_it_from_the_environment(monkeypatch, tmp_path: Path, env: dict,
                                                                         props: str, expected: str):
    (tmp_path / ".wskprops").write_text(props)
    _block(monkeypatch, {"api_host": "https://ow.example", "auth": BLOCK_KEY})
    config = OpenWhiskConfig.resolve(secret_block="ow-conn", env={**env, "HOME": str(tmp_path)})
    assert config.namespace == expected
    # the block's own namespace wins over the environment
    _block(monkeypatch, {"api_host": "https://ow.example", "auth": BLOCK_KEY, "namespace": "blocks"})
    assert OpenWhiskConfig.resolve(secret_block="ow-conn", env={**env, "HOME": str(tmp_path)}).namespace == "blocks"


def test_a_json_block_without_an_api_host_takes_it_from_the_environment_or_wskprops(monkeypatch, tmp_path: Path):
    """As the namespace: WSK_APIHOST, else APIHOST of ~/.wskprops, each named as the host's source."""
    (tmp_path / ".wskprops").write_text("APIHOST=https://props.example\n")
    _block(monkeypatch, {"auth": BLOCK_KEY})
    config = OpenWhiskConfig.resolve(secret_block="ow-conn", env={"HOME": str(tmp_path)})
    assert config.api_host == "https://props.example"
    assert config.origins["api_host"] == f"APIHOST in {tmp_path / '.wskprops'}"
    config = OpenWhiskConfig.resolve(secret_block="ow-conn", env={"HOME": str(tmp_path),
                                                                  "WSK_APIHOST": "https://env.example"})
    assert (config.api_host, config.origins["api_host"]) == ("https://env.example", "WSK_APIHOST")
    (tmp_path / ".wskprops").write_text("")
    with pytest.raises(ValueError, match=r"has no api_host key, WSK_APIHOST is not set and .*\.wskprops has no "
                                         r"APIHOST; add \"api_host\""):
        OpenWhiskConfig.resolve(secret_block="ow-conn", env={"HOME": str(tmp_path)})


def test_a_block_behind_an_unreachable_prefect_api_names_prefect_api_url():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/api"
    with temporary_settings(updates={PREFECT_API_URL: url}):
        with pytest.raises(ValueError) as info:
            OpenWhiskConfig.resolve(secret_block="ow-conn", env={})
    message = str(info.value)
    assert message.startswith("cannot load the Prefect Secret block 'ow-conn': ")
    assert f"the Prefect API at PREFECT_API_URL={url} does not answer: start the Prefect server there" in message
    assert message.endswith("or leave the block out (--secret-block, RLHFLESS_OPENWHISK_SECRET) and set "
                            "WSK_APIHOST and WSK_AUTH") and "\n" not in message


def test_a_block_the_server_does_not_hold_keeps_its_own_reason_and_names_the_fix(monkeypatch):
    import prefect.blocks.system as system

    def missing(name):
        raise ValueError(f"Unable to find block document named {name} for block type secret")

    monkeypatch.setattr(system.Secret, "load", staticmethod(missing))
    with pytest.raises(ValueError) as info:
        OpenWhiskConfig.resolve(secret_block="ow-conn", env={})
    message = str(info.value)
    assert message.startswith("cannot load the Prefect Secret block 'ow-conn': Unable to find block document named "
                              "ow-conn for block type secret; the Prefect API at PREFECT_API_URL")
    assert "holds no Secret block of that name: check the name" in message and ".save('ow-conn')" in message
    assert "\n" not in message
