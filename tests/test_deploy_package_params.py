"""``rlhfless deploy`` with parameters bound to the package (``wsk package update rlhfless -p K V``).

OpenWhisk's GET of an action in a package answers the package's parameters merged under the
action's own (``WhiskAction.resolveActionAndMergeParameters``); the emulator does the same. The
deploy must compare the action's own parameters only, or it PUTs every action on every run (a
new version each time: every warm container lost), and it must leave the package's bindings alone.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from actions.runtime import server
from flows.commands.deploy import action_body, deploy, diff_action, load_manifest, plan_deploy
from flows.invokers.openwhisk import OpenWhiskClient, OpenWhiskConfig, OpenWhiskInvoker

try:
    from ow_emulator import OpenWhiskEmulator, ow_emulator  # noqa: F401
except ImportError:  # tests/ imported as a package
    from tests.ow_emulator import OpenWhiskEmulator, ow_emulator  # noqa: F401

MANIFEST = """
package: rlhfless
env:
  PROBE_SETTING: ${PROBE_SETTING:-from-default}
actions:
  probe:
    docker: rlhfless/runtime-cpu:0.1.0
    parameters: {echo: bound}
  noop:
    docker: rlhfless/runtime-cpu:0.1.0
"""


@pytest.fixture(autouse=True)
def probe_is_an_action(monkeypatch):
    monkeypatch.setattr(server, "ACTION_NAMES", server.ACTION_NAMES | {"probe"})


def _manifest(tmp_path: Path, text: str = MANIFEST):
    path = tmp_path / "actions.yaml"
    path.write_text(textwrap.dedent(text))
    return load_manifest(path)


def _puts(emu: OpenWhiskEmulator) -> int:
    return sum(1 for method, _, _ in emu.requests if method == "PUT")


def test_deploy_settles_with_parameters_bound_to_the_package(ow_emulator: OpenWhiskEmulator, tmp_path):
    manifest = _manifest(tmp_path)
    api_host, auth, _ = ow_emulator.credentials
    with OpenWhiskClient(OpenWhiskConfig(api_host, auth)) as client:
        deploy(client, manifest, environ={})
        # the operator binds a package parameter, one shadowing an action's own with the same
        # value, and one shadowing an init parameter
        bound = [{"key": "team", "value": "ml"}, {"key": "echo", "value": "bound"},
                 {"key": "PROBE_SETTING", "value": "from-default", "init": True}]
        client.put_package("rlhfless", {"parameters": bound}, overwrite=True)
        before = _puts(ow_emulator)
        for _ in range(2):
            plan = deploy(client, manifest, environ={})
            assert [(c.name, c.kind, c.fields) for c in plan if c.kind != "unchanged"] == []
        assert _puts(ow_emulator) == before  # no new action version: warm containers kept
        # the deploy leaves the operator's bindings in place, and the action still gets its own
        assert client.get_package("rlhfless")["parameters"] == bound
        assert OpenWhiskInvoker(client).invoke("probe", {}).result["echo"] == "bound"
        # a manifest value that differs from the package's is the action's own: one update, then settled
        manifest.actions["probe"].parameters = {"echo": "changed"}
        changed = deploy(client, manifest, environ={})
        assert [(c.name, c.fields) for c in changed if c.kind == "update"] == [("rlhfless/probe", ("parameters",))]
        assert {c.kind for c in deploy(client, manifest, environ={})} == {"unchanged"}
        assert OpenWhiskInvoker(client).invoke("probe", {}).result["echo"] == "changed"


def test_only_the_actions_own_parameters_are_compared(tmp_path):
    """Pure: the merged GET less the package's parameters that the manifest does not set."""
    spec = _manifest(tmp_path).actions["probe"]
    desired = action_body(spec, {"PROBE_SETTING": "x"})
    package = [{"key": "team", "value": "ml"}, {"key": "echo", "value": "bound"}]
    merged = {**desired, "parameters": [package[0]] + desired["parameters"]}
    assert diff_action(desired, merged, package) == []
    assert diff_action(desired, merged) == ["parameters"]  # without the package: a difference
    # an own parameter that left the manifest, with a value other than the package's, is stale
    stale = {**desired, "parameters": [{"key": "team", "value": "old"}] + desired["parameters"]}
    assert diff_action(desired, stale, package) == ["parameters"]
    # the package's value where the manifest sets another: the action's own is missing
    shadowed = {**desired, "parameters": [p for p in desired["parameters"] if p["key"] != "echo"] + [package[1]]}
    assert diff_action({**desired, "parameters": [{"key": "echo", "value": "new"}]},
                       {**shadowed, "parameters": [package[1]]}, package) == ["parameters"]


def test_the_plan_passes_the_package_parameters_on(tmp_path):
    manifest = _manifest(tmp_path)
    package = [{"key": "team", "value": "ml"}]
    stored = {name: {**action_body(spec, {"PROBE_SETTING": "from-default"})} for name, spec in manifest.actions.items()}
    for record in stored.values():
        record["parameters"] = package + record["parameters"]
    assert {c.kind for c in plan_deploy(manifest, stored, environ={}, inherited=package)} == {"unchanged"}
    assert {c.kind for c in plan_deploy(manifest, stored, environ={})[1:]} == {"update"}
