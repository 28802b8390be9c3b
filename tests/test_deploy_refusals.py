"""``rlhfless deploy`` refuses, naming the fix: ``env`` keys the runtime cannot export, ``$`` that no
supported reference form consumes, a controller that accepts connections but never answers (given
up on within a minute), and a Prefect Secret block that does not exist."""

from __future__ import annotations

import contextlib
import logging
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flows.commands import deploy as deploy_mod
from flows.commands.deploy import ManifestError, expand_env, load_manifest
from flows.invokers.openwhisk import OpenWhiskClient, OpenWhiskConfig, OpenWhiskError, RetryPolicy

try:
    from test_deploy import SHIPPED, cli, no_credentials  # noqa: F401 - a fixture
except ImportError:  # tests/ imported as a package
    from tests.test_deploy import SHIPPED, cli, no_credentials  # noqa: F401

KEY = "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dX"


def _write(tmp_path: Path, env: str) -> Path:
    path = tmp_path / "actions.yaml"
    path.write_text(textwrap.dedent(f"env:\n{env}\nactions:\n  noop: {{docker: 'rlhfless/runtime-cpu:0.1.0'}}\n"))
    return path


# ---------------------------------------------------------------------------- env keys
@pytest.mark.parametrize("key, suggestion", [("A=B", "A_B"), ("9LIVES", "_9LIVES"), ("S3 ENDPOINT", "S3_ENDPOINT")])
def test_an_env_key_the_runtime_cannot_export_is_refused(tmp_path, key, suggestion):
    with pytest.raises(ManifestError) as info:
        load_manifest(_write(tmp_path, f"  '{key}': x"))
    message = str(info.value)
    assert f"env: Value error, key '{key}' is not an environment variable name" in message
    assert f"rename it, e.g. {suggestion}" in message and "/init" in message


def test_env_keys_that_are_names_load(tmp_path):
    manifest = load_manifest(_write(tmp_path, "  _PRIVATE: a\n  aws_region: b\n  X9: c"))
    assert manifest.env == {"_PRIVATE": "a", "aws_region": "b", "X9": "c"}


# ---------------------------------------------------------------------------- env references
@pytest.mark.parametrize("key, value", [("A", "${X"), ("B", "${R:=us-east-1}"), ("C", "${R:-${DEF}}"),
                                        ("D", "$HOME"), ("E", "pre-${X}-$"), ("F", "${1BAD}")])
def test_a_dollar_no_supported_form_consumes_is_refused(key, value):
    with pytest.raises(ManifestError) as info:
        expand_env({key: value}, {"DEF": "eu", "X": "x", "R": "r", "HOME": "/root"})
    message = str(info.value)
    assert message.startswith(f"env {key}: {value!r} holds a '$' that is not part of ${{VAR}}, ${{VAR:-default}} "
                              "or ${VAR-default}")
    assert "for a literal '$', export the value in a variable and write ${VAR}" in message


def test_the_manifest_refuses_them_naming_the_file_and_hiding_secret_values(tmp_path):
    path = _write(tmp_path, "  AWS_REGION: ${AWS_REGION:=us-east-1}\n  AWS_SECRET_ACCESS_KEY: 'abc$def'")
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    message = str(info.value)
    assert message.startswith(f"{path}: env: Value error, AWS_REGION: '${{AWS_REGION:=us-east-1}}' holds a '$'")
    assert "AWS_SECRET_ACCESS_KEY: (value not shown: the key looks secret)" in message and "abc$def" not in message


def test_supported_forms_still_expand_and_a_variable_may_hold_a_dollar():
    values, missing = expand_env({"A": "${X}", "B": "${Y:-d}", "C": "${Y-}", "D": "plain", "E": "${X}/${Z-z}"},
                                 {"X": "p$ss${W}"})
    assert values == {"A": "p$ss${W}", "B": "d", "C": "", "D": "plain", "E": "p$ss${W}/z"} and missing == []


# ---------------------------------------------------------------------------- a silent controller
@contextlib.contextmanager
def silent_listener() -> Iterator[str]:
    """A socket that accepts connections (the kernel's backlog) and never answers; yields its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_a_host_that_never_answers_names_wsk_apihost(caplog):
    policy = RetryPolicy(max_attempts=2, request_timeout_s=0.2, backoff_base_s=0.01, backoff_max_s=0.01)
    with silent_listener() as url, caplog.at_level(logging.WARNING):
        config = OpenWhiskConfig.from_env({"WSK_APIHOST": url, "WSK_AUTH": KEY})
        with OpenWhiskClient(config, retry=policy) as client, pytest.raises(OpenWhiskError) as info:
            client.get_package("rlhfless")
    message = str(info.value)
    assert message.startswith(f"get package rlhfless: ReadTimeout talking to {url}")
    assert message.endswith("after 2 attempt(s), the last waiting 0.2 s; check WSK_APIHOST (the OpenWhisk API "
                            "host: this one accepts connections but does not answer)")
    assert info.value.transient and "123zO3xZCLrMN6v2BKK1dX" not in message
    retries = [r.getMessage() for r in caplog.records if "; retry 1/1" in r.getMessage()]
    assert retries and retries[0].startswith(f"get package rlhfless: ReadTimeout talking to {url}; retry 1/1")


def test_deploy_gives_up_on_a_silent_controller_within_a_minute(no_credentials, monkeypatch, capsys):
    """The CLI's retry policy, with the clock simulated: each read runs out its whole timeout."""
    now = [0.0]

    def hangs(request: httpx.Request) -> httpx.Response:
        now[0] += request.extensions["timeout"]["read"]
        raise httpx.ReadTimeout("timed out", request=request)

    def client(config, *, retry=None):
        return OpenWhiskClient(config, retry=retry, transport=httpx.MockTransport(hangs), seed=0,
                               clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))

    monkeypatch.setattr(deploy_mod, "OpenWhiskClient", client)
    monkeypatch.setenv("WSK_APIHOST", "http://ow.test")
    monkeypatch.setenv("WSK_AUTH", KEY)
    assert cli(["--manifest", str(SHIPPED)]) == 2
    assert 20 < now[0] <= 60
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("rlhfless deploy: get package rlhfless: ReadTimeout talking to http://ow.test")
    policy = deploy_mod.DEPLOY_RETRY
    assert err.endswith(f"after {policy.max_attempts} attempt(s), the last waiting {policy.request_timeout_s:g} s; "
                        "check WSK_APIHOST (the OpenWhisk API host: this one accepts connections but does not answer)")


def test_the_invokers_policy_is_unchanged():
    assert (RetryPolicy().max_attempts, RetryPolicy().request_timeout_s) == (8, 30.0)


# ---------------------------------------------------------------------------- a missing Secret block
def test_a_secret_block_that_does_not_exist_names_the_fix(no_credentials, monkeypatch, capsys):
    """Prefect's ``Block.load`` raises ``ValueError`` from ``ObjectNotFound`` (the API's 404)."""
    import prefect.blocks.system as system
    from prefect.exceptions import ObjectNotFound

    def load(name):
        request = httpx.Request("GET", f"http://127.0.0.1:4200/api/block_types/slug/secret/block_documents/name/{name}")
        try:
            raise ObjectNotFound(httpx.HTTPStatusError("404", request=request,
                                                       response=httpx.Response(404, request=request)))
        except ObjectNotFound as exc:
            raise ValueError(f"Unable to find block document named {name} for block type secret") from exc

    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setattr(system.Secret, "load", staticmethod(load))
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        assert cli(["--manifest", str(SHIPPED), "--dry-run", "--secret-block", "nosuch"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("rlhfless deploy: cannot load the Prefect Secret block 'nosuch': Unable to find block "
                          "document named nosuch for block type secret; the Prefect API at "
                          "PREFECT_API_URL=http://127.0.0.1:4200/api holds no Secret block of that name: check the "
                          "name (`prefect block ls`")
    assert ".save('nosuch')" in err and "set PREFECT_API_URL to the server holding it" in err
    assert err.endswith("set WSK_APIHOST and WSK_AUTH")
