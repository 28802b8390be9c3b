"""``rlhfless deploy``: manifest validation, the pure plan, idempotent deploys (emulator), CLI."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from actions.runtime.server import ACTION_NAMES
from flows.commands import deploy as deploy_mod
from flows.commands.deploy import (
    DeployError,
    ManifestError,
    action_body,
    deploy,
    expand_env,
    load_manifest,
    plan_deploy,
)
from flows.invokers.openwhisk import OpenWhiskClient, OpenWhiskConfig, OpenWhiskInvoker

try:
    from ow_emulator import OPENWHISK_DEFAULTS, RAISED_LIMITS, OpenWhiskEmulator, ow_emulator, running_emulator  # noqa: F401
except ImportError:  # tests/ imported as a package
    from tests.ow_emulator import OPENWHISK_DEFAULTS, RAISED_LIMITS, OpenWhiskEmulator, ow_emulator, running_emulator  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "infra" / "openwhisk" / "actions.yaml"

SMALL = """
package: rlhfless
env:
  PROBE_SETTING: ${PROBE_SETTING:-from-default}
actions:
  probe:
    docker: rlhfless/runtime-cpu:0.1.0
    memory: 256
    timeout: 20000
    annotations: {gpus: 0}
    parameters: {echo: bound}
  noop:
    docker: rlhfless/runtime-cpu:0.1.0
"""


def write(tmp_path: Path, text: str, name: str = "actions.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def client_for(emu: OpenWhiskEmulator) -> OpenWhiskClient:
    api_host, auth, _ = emu.credentials
    return OpenWhiskClient(OpenWhiskConfig(api_host, auth))


def puts(emu: OpenWhiskEmulator) -> int:
    return sum(1 for method, _, _ in emu.requests if method == "PUT")


# ---------------------------------------------------------------------------- manifest
def test_shipped_manifest_covers_every_runtime_action():
    manifest = load_manifest(SHIPPED)
    assert manifest.package == "rlhfless"
    assert set(manifest.actions) == set(ACTION_NAMES), "infra/openwhisk/actions.yaml and ACTION_NAMES disagree"
    generate = manifest.actions["generate"]
    assert generate.annotations["invoker-resources"] == ["gpu"] and generate.annotations["gpus"] >= 1
    assert generate.memory > 512 and generate.timeout > 300_000  # needs the raised limits
    assert manifest.actions["noop"].annotations["gpus"] == 0
    assert {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(manifest.env)


def test_shipped_manifest_fits_the_helm_limits():
    """actions.yaml must deploy on a cluster installed with values-gpu.yaml (and the emulator's
    raised limits must be those)."""
    values = yaml.safe_load((REPO / "infra" / "openwhisk" / "values-gpu.yaml").read_text())
    limits = values["whisk"]["limits"]["actions"]
    max_memory_mb = int(limits["memory"]["max"].removesuffix("m"))
    max_time_ms = int(limits["time"]["max"].removesuffix("m")) * 60_000
    assert RAISED_LIMITS["memory"][1] == max_memory_mb and RAISED_LIMITS["timeout"][1] == max_time_ms
    assert RAISED_LIMITS["concurrency"][1] == limits["concurrency"]["max"]
    for name, spec in load_manifest(SHIPPED).actions.items():
        assert spec.memory <= max_memory_mb and spec.timeout <= max_time_ms, name
        assert spec.concurrency <= limits["concurrency"]["max"], name


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("actions:\n  generate: {docker: img:1, memory: 0}\n", "actions.generate.memory: Input should be greater than or equal to 128 (got 0)"),
        ("actions:\n  generate: {docker: img:1, memroy: 512}\n", "actions.generate.memroy: Extra inputs are not permitted"),
        ("actions:\n  generate: {memory: 512}\n", "actions.generate.docker: Field required"),
        ("actions:\n  generate: {docker: img:1, annotations: {gpus: -1}}\n", "actions.generate.annotations: Value error, annotation gpus"),
        ("package: 'bad name'\nactions:\n  noop: {docker: img:1}\n", "package: String should match pattern"),
        ("actions: {}\n", "actions: Dictionary should have at least 1 item"),
        ("actions:\n  'no/slash': {docker: img:1}\n", "actions: Value error, action name 'no/slash'"),
        ("- just\n- a list\n", "expected a mapping with 'package' and 'actions', got list"),
        ("actions: [unclosed\n", "not valid YAML"),
    ],
)
def test_manifest_errors_name_the_field(tmp_path, body, expected):
    path = write(tmp_path, body)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)


def test_missing_manifest_file(tmp_path):
    with pytest.raises(ManifestError, match="cannot read the manifest: No such file"):
        load_manifest(tmp_path / "absent.yaml")


def test_env_expansion():
    values, missing = expand_env({"A": "${X}", "B": "${Y:-dflt}", "C": "pre-${X}-${Z}"}, {"X": "x"})
    assert values == {"A": "x", "B": "dflt", "C": "pre-x-<unset $Z>"}
    assert missing == ["Z"]


# ---------------------------------------------------------------------------- plan (pure)
def test_plan_is_pure_and_ignores_controller_annotations(tmp_path):
    manifest = load_manifest(write(tmp_path, SMALL))
    plan = plan_deploy(manifest, {}, package_exists=False, environ={})
    assert [(c.entity, c.name, c.kind) for c in plan] == [
        ("package", "rlhfless", "create"),
        ("action", "rlhfless/probe", "create"),
        ("action", "rlhfless/noop", "create"),
    ]
    # what the controller stores: our body plus its own exec/provide-api-key annotations
    stored = {}
    for name, spec in manifest.actions.items():
        body = action_body(spec, {"PROBE_SETTING": "from-default"})
        stored[name] = {
            **body,
            "exec": {**body["exec"], "binary": False},
            "limits": {**body["limits"], "instances": 30},
            "annotations": body["annotations"] + [{"key": "exec", "value": "blackbox"}, {"key": "provide-api-key", "value": False}],
        }
    assert {c.kind for c in plan_deploy(manifest, stored, environ={})} == {"unchanged"}
    stored["probe"]["limits"]["memory"] = 512
    stored["noop"]["exec"]["image"] = "rlhfless/runtime-cpu:0.0.9"
    changed = {c.name: c.fields for c in plan_deploy(manifest, stored, environ={"PROBE_SETTING": "new"}) if c.kind == "update"}
    assert changed == {"rlhfless/probe": ("limits.memory", "parameters"), "rlhfless/noop": ("exec.image", "parameters")}


def test_plan_refuses_unset_env_unless_dry_run(tmp_path):
    manifest = load_manifest(write(tmp_path, "env: {KEY: '${NOT_SET_ANYWHERE}'}\nactions:\n  noop: {docker: img:1}\n"))
    with pytest.raises(ManifestError, match="unset variable\\(s\\) NOT_SET_ANYWHERE"):
        plan_deploy(manifest, {}, environ={})
    plan = plan_deploy(manifest, {}, environ={}, allow_unset_env=True)
    assert plan[1].body["parameters"] == [{"key": "KEY", "value": "<unset $NOT_SET_ANYWHERE>", "init": True}]


# ---------------------------------------------------------------------------- deploy (emulator)
def test_deploy_is_idempotent_and_actions_run(ow_emulator: OpenWhiskEmulator, tmp_path):
    manifest = load_manifest(write(tmp_path, SMALL))
    with client_for(ow_emulator) as client:
        first = deploy(client, manifest, environ={})
        assert [c.kind for c in first] == ["create", "create", "create"]
        assert puts(ow_emulator) == 3
        second = deploy(client, manifest, environ={})
        assert [c.kind for c in second] == ["unchanged"] * 3
        assert puts(ow_emulator) == 3  # nothing was PUT again
        # default and init parameters reach the running action
        invoker = OpenWhiskInvoker(client)
        assert invoker.invoke("probe", {"getenv": "PROBE_SETTING"}).result == {"env": "from-default"}
        assert invoker.invoke("probe", {}).result["echo"] == "bound"
        assert invoker.invoke("noop", {}).result == {"ok": True}
        # one changed field -> one PUT
        manifest.actions["probe"].memory = 1024
        third = deploy(client, manifest, environ={})
        assert [(c.name, c.kind, c.fields) for c in third if c.kind != "unchanged"] == [("rlhfless/probe", "update", ("limits.memory",))]
        assert puts(ow_emulator) == 4


def test_shipped_manifest_deploys_and_its_actions_answer(ow_emulator: OpenWhiskEmulator):
    environ = {"AWS_ENDPOINT_URL": "http://minio:9000", "AWS_ACCESS_KEY_ID": "rlhfless", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    with client_for(ow_emulator) as client:
        changes = deploy(client, load_manifest(SHIPPED), environ=environ)
        assert len(changes) == 1 + len(ACTION_NAMES) and {c.kind for c in changes} == {"create"}
        stored = client.get_action("rlhfless/generate")
        assert {"key": "AWS_SECRET_ACCESS_KEY", "value": "s3cr3t", "init": True} in stored["parameters"]
        invoker = OpenWhiskInvoker(client, prewarm_hold_s=0.2)
        assert invoker.invoke("noop", {}).gpus == 0
        # a GPU action answers a pre-warm probe without importing its module (or torch)
        assert invoker.prewarm("generate", 2) == 2
        probe = client.invoke("rlhfless/generate", {"__prewarm": True})
        assert probe["response"]["result"]["prewarm"] is True


def test_dry_run_changes_nothing(ow_emulator: OpenWhiskEmulator, tmp_path):
    manifest = load_manifest(write(tmp_path, SMALL))
    with client_for(ow_emulator) as client:
        plan = deploy(client, manifest, dry_run=True, environ={})
    assert [c.kind for c in plan] == ["create"] * 3
    assert puts(ow_emulator) == 0


def test_limits_below_the_manifest_are_refused_with_a_hint(tmp_path):
    manifest = load_manifest(SHIPPED)
    environ = {"AWS_ENDPOINT_URL": "http://minio:9000", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    with running_emulator(limits=OPENWHISK_DEFAULTS) as emu, client_for(emu) as client:
        with pytest.raises(DeployError) as info:
            deploy(client, manifest, environ=environ)
    message = str(info.value)
    # the first action of the manifest that exceeds the stock limits
    assert message.startswith("action rlhfless/prepare: put action rlhfless/prepare: HTTP 400 memory 32768 MB exceeds allowed threshold of 512 MB")
    assert "values-gpu.yaml" in message


# ---------------------------------------------------------------------------- CLI
def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    deploy_mod.add_arguments(parser)
    return deploy_mod.run(parser.parse_args(argv))


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    for name in ("WSK_APIHOST", "__OW_API_HOST", "WSK_AUTH", "__OW_API_KEY", "__OW_NAMESPACE", "RLHFLESS_OPENWHISK_SECRET", "WSK_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def test_cli_dry_run_needs_no_credentials(no_credentials, monkeypatch, capsys):
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    assert cli(["--manifest", str(SHIPPED), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "action rlhfless/generate: create" in out
    assert out.strip().endswith(f"{1 + len(ACTION_NAMES)} to create, 0 to update, 0 unchanged (dry run: nothing was changed)")
    assert "no OpenWhisk credentials" in err and "unset $AWS_SECRET_ACCESS_KEY" in err


def test_cli_errors_are_one_line_with_exit_code_2(no_credentials, tmp_path, capsys):
    assert cli(["--manifest", str(tmp_path / "absent.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlhfless deploy: ") and err.count("\n") == 1
    assert cli(["--manifest", str(SHIPPED)]) == 2  # a real deploy needs credentials
    assert "set WSK_APIHOST and WSK_AUTH" in capsys.readouterr().err


def test_cli_deploys_against_the_emulator(ow_emulator: OpenWhiskEmulator, monkeypatch, tmp_path, capsys):
    for name, value in ow_emulator.env().items():
        monkeypatch.setenv(name, value)
    path = write(tmp_path, SMALL)
    assert cli(["--manifest", str(path)]) == 0
    assert "3 to create" in capsys.readouterr().out
    assert cli(["--manifest", str(path)]) == 0
    out = capsys.readouterr().out
    assert "0 to create, 0 to update, 3 unchanged" in out and ow_emulator.auth.split(":")[1] not in out


# ---------------------------------------------------------------------------- runtime image
@pytest.mark.skipif(shutil.which("flock") is None or shutil.which("bash") is None, reason="needs bash and flock")
def test_gpu_image_entrypoint_claims_distinct_gpus(tmp_path):
    """The GPU claim in runtime_images/gpu/Dockerfile, run with a fake two-GPU nvidia-smi: two
    containers get GPUs 0 and 1, a third finds none and exits, and a claim ends with its process."""
    dockerfile = (REPO / "runtime_images" / "gpu" / "Dockerfile").read_text()
    script = re.search(r"COPY <<'EOF_ENTRY' /usr/local/bin/rlhfless-entrypoint\n(.*?)\nEOF_ENTRY", dockerfile, re.S).group(1)
    assert "exec python -m actions.runtime.server --port 8080" in script
    entry = tmp_path / "entrypoint"
    entry.write_text(script.replace("exec python -m actions.runtime.server --port 8080", 'echo "$CUDA_VISIBLE_DEVICES"; exec sleep 1'))
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'GPU 0: fake'\necho 'GPU 1: fake'\n")
    for path in (entry, fake):
        path.chmod(0o755)
    (tmp_path / "locks").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(PATH=f"{fake.parent}{os.pathsep}{env['PATH']}", RLHFLESS_CLAIM_GPUS="1", RLHFLESS_GPU_LOCK_DIR=str(tmp_path / "locks"))

    def start() -> subprocess.Popen[str]:
        proc = subprocess.Popen([str(entry)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.2)  # let it take its lock before the next one starts
        return proc

    first, second, third = start(), start(), start()
    outputs = [p.communicate(timeout=10) for p in (first, second, third)]
    assert [o.strip() for o, _ in outputs[:2]] == ["0", "1"]
    assert third.returncode == 1 and "wanted 1 free GPU(s), found 0 of 2" in outputs[2][1]
    assert start().communicate(timeout=10)[0].strip() == "0"  # the locks died with their processes
