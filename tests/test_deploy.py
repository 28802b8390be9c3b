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

from actions.runtime import server
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
    stale_annotations,
)
from flows.commands.deploy_limits import limit_problems
from flows.invokers.openwhisk import OpenWhiskClient, OpenWhiskConfig, OpenWhiskInvoker, annotations_of

try:
    from ow_emulator import (  # noqa: F401
        OPENWHISK_DEFAULTS,
        RAISED_LIMITS,
        OpenWhiskEmulator,
        html_host,
        ow_emulator,
        running_emulator,
    )
except ImportError:  # tests/ imported as a package
    from tests.ow_emulator import (  # noqa: F401
        OPENWHISK_DEFAULTS,
        RAISED_LIMITS,
        OpenWhiskEmulator,
        html_host,
        ow_emulator,
        running_emulator,
    )

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


@pytest.fixture(autouse=True)
def probe_is_an_action(monkeypatch):
    """``probe`` (tests/ow_test_actions.py) is an action in the emulator's containers; the
    deploy's name check reads the same registry, so it is one here too."""
    monkeypatch.setattr(server, "ACTION_NAMES", server.ACTION_NAMES | {"probe"})


class LimitsEmulator(OpenWhiskEmulator):
    """The emulator, plus ``GET /namespaces/{ns}/limits`` answering its action limit ranges as
    recent controllers do (``UserLimits``: min/max action memory, timeout, logs, concurrency)."""

    def _route(self, method, path, query, body, headers):
        parts = path.split("/")
        if method == "GET" and len(parts) == 6 and parts[5] == "limits":
            names = {"memory": "Memory", "timeout": "Timeout", "logs": "Logs", "concurrency": "Concurrency"}
            limits = {}
            for field, (low, high) in self.limits.items():
                limits[f"minAction{names[field]}"], limits[f"maxAction{names[field]}"] = low, high
            return 200, {"invocationsPerMinute": 60, "concurrentInvocations": 30, **limits}, None
        return super()._route(method, path, query, body, headers)


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
        ("actions:\n  generate-7b: {docker: img:1}\n  noop: {docker: img:1}\n",
         "actions: Value error, action name(s) 'generate-7b' unknown to the runtime image, which runs evaluate, "
         "generate, init_critic, noop, prefill, prepare, probe, profile, score, train_step, warmup; "
         "rename or remove them"),
        ("env: {RLHFLESS_S3_CONDITIONAL_WRITES: off}\nactions:\n  noop: {docker: img:1}\n",
         "env: Value error, values must be strings; RLHFLESS_S3_CONDITIONAL_WRITES: YAML read the unquoted value as "
         "the boolean False, which would reach the actions as 'False'; quote it, e.g. "
         'RLHFLESS_S3_CONDITIONAL_WRITES: "off" or "false"'),
        ("env: {RLHFLESS_THREADS: 4, A: yes}\nactions:\n  noop: {docker: img:1}\n",
         'RLHFLESS_THREADS: YAML read the unquoted value as the int 4, not a string; quote it as written, e.g. '
         'RLHFLESS_THREADS: "4"; A: YAML read the unquoted value as the boolean True'),
        ("- just\n- a list\n", "expected a mapping with 'package' and 'actions', got list"),
        ("actions: [unclosed\n", "not valid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>'; "
                                  "fix the syntax"),
        ("actions:\n  noop: {docker: img:1, memory: 1: 2}\n", "not valid YAML at line 2, column 34: expected ',' or '}'"),
        # the last of two entries would win without a word, dropping the first one's definition
        ("x-cpu: &cpu {docker: img:1}\nactions:\n  generate: {docker: gpu:1}\n  noop: {<<: *cpu}\n"
         "  generate: {<<: *cpu}\n",
         "not valid YAML at line 5, column 3: the key 'generate' is stated twice, first at line 3; keep one"),
        ("actions:\n  noop: {docker: img:1, concurrency: true}\n",
         "actions.noop.concurrency: Input should be a valid integer (got True)"),
        ("actions:\n  noop: {docker: img:1, memory: '256'}\n", "actions.noop.memory: Input should be a valid integer"),
        ("actions:\n  noop: {docker: img:1, memory: 10000000000000}\n",
         "actions.noop.memory: Input should be less than or equal to 2147483647 (got 10000000000000)"),
    ],
)
def test_manifest_errors_name_the_field(tmp_path, body, expected):
    path = write(tmp_path, body)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)


def test_a_key_that_overrides_a_merged_one_is_not_a_repeat(tmp_path):
    manifest = load_manifest(write(tmp_path, "x-cpu: &cpu {docker: img:1, memory: 512}\n"
                                              "actions:\n  noop: {<<: *cpu, memory: 1024}\n"))
    assert manifest.actions["noop"].memory == 1024 and manifest.actions["noop"].docker == "img:1"


def test_env_values_stay_strings_and_hide_secret_numbers(tmp_path):
    manifest = load_manifest(write(tmp_path, "env: {A: 'off', B: '4', C:}\nactions:\n  noop: {docker: img:1}\n"))
    assert manifest.env == {"A": "off", "B": "4", "C": ""}
    with pytest.raises(ManifestError) as info:
        load_manifest(write(tmp_path, "env: {AWS_SECRET_ACCESS_KEY: 123456789}\nactions:\n  noop: {docker: img:1}\n"))
    message = str(info.value)
    assert "AWS_SECRET_ACCESS_KEY: YAML read the unquoted value as an int, not a string; quote it as written" in message
    assert "123456789" not in message
    with pytest.raises(ManifestError) as info:  # a list of KEY=value, as docker-compose writes env
        load_manifest(write(tmp_path, "env: [AWS_SECRET_ACCESS_KEY=Literal42]\nactions:\n  noop: {docker: img:1}\n"))
    assert "env: Input should be a valid dictionary (got list)" in str(info.value)
    assert "Literal42" not in str(info.value)


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


def test_stale_annotations_leave_the_controllers_own():
    desired = {"annotations": [{"key": "gpus", "value": 0}]}
    stored = {"annotations": [{"key": "gpus", "value": 1}, {"key": "invoker-resources", "value": ["gpu"]},
                              {"key": "exec", "value": "blackbox"}, {"key": "provide-api-key", "value": False}]}
    assert stale_annotations(desired, stored) == ["invoker-resources"]
    assert stale_annotations(desired, {"annotations": desired["annotations"]}) == []


def test_limit_problems_name_every_action_and_limit():
    # a controller reports what it enforces; fields it leaves out are not checked
    limits = {"maxActionMemory": 512, "minActionMemory": 128, "maxActionTimeout": 300_000, "maxActionConcurrency": 1}
    actions = {
        "rlhfless/generate": {"memory": 32768, "timeout": 1_800_000, "logs": 10, "concurrency": 1},
        "rlhfless/noop": {"memory": 256, "timeout": 60_000, "logs": 99, "concurrency": 1},
        "rlhfless/tiny": {"memory": 64, "timeout": 60_000, "logs": 10, "concurrency": 2},
    }
    assert limit_problems(actions, limits) == [
        "action rlhfless/generate: memory 32768 MB is above maxActionMemory 512, "
        "timeout 1800000 ms is above maxActionTimeout 300000",
        "action rlhfless/tiny: memory 64 MB is below minActionMemory 128, "
        "concurrency 2 activations is above maxActionConcurrency 1",
    ]
    assert limit_problems(actions, {}) == []
    assert limit_problems({}, {"allowedKinds": ["nodejs:20"]}) == [
        "the namespace allows the action kinds nodejs:20 only, not blackbox "
        "(every RLHFless action is a blackbox image)"]


def test_plan_refuses_unset_env_unless_dry_run(tmp_path):
    manifest = load_manifest(write(tmp_path, "env: {KEY: '${NOT_SET_ANYWHERE}'}\nactions:\n  noop: {docker: img:1}\n"))
    with pytest.raises(ManifestError, match="unset or empty variable\\(s\\) NOT_SET_ANYWHERE"):
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


def test_a_removed_annotation_is_deleted_and_deploy_converges(ow_emulator: OpenWhiskEmulator, tmp_path):
    """OpenWhisk merges an update's annotations into the stored ones: an annotation that left the
    manifest goes only when named in delAnnotations, else every deploy would 'update' forever."""
    gpu = SMALL.replace("annotations: {gpus: 0}", "annotations: {gpus: 0, invoker-resources: [gpu]}")
    with client_for(ow_emulator) as client:
        deploy(client, load_manifest(write(tmp_path, gpu, "gpu.yaml")), environ={})
        # the emulator merges as the controller does: a PUT without the key keeps it
        image = {"kind": "blackbox", "image": "rlhfless/runtime-cpu:0.1.0"}
        client.put_action("rlhfless/probe", {"exec": image, "annotations": [{"key": "gpus", "value": 0}]})
        assert annotations_of(client.get_action("rlhfless/probe"))["invoker-resources"] == ["gpu"]
        manifest = load_manifest(write(tmp_path, SMALL))  # the operator moves probe off the GPU invokers
        changed = [c for c in deploy(client, manifest, environ={}) if c.kind != "unchanged"]
        assert [(c.name, c.fields, c.body["delAnnotations"]) for c in changed] == [
            ("rlhfless/probe", ("annotations",), ["invoker-resources"])]
        keys = {a["key"] for a in client.get_action("rlhfless/probe")["annotations"]}
        assert keys == {"gpus", "exec", "provide-api-key"}  # the controller's own stay
        assert {c.kind for c in deploy(client, manifest, environ={})} == {"unchanged"}


def test_limits_precheck_refuses_the_whole_deploy_before_any_put(tmp_path):
    manifest = load_manifest(SHIPPED)
    environ = {"AWS_ENDPOINT_URL": "http://minio:9000", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    emu = LimitsEmulator(limits=OPENWHISK_DEFAULTS).start()
    try:
        with client_for(emu) as client, pytest.raises(DeployError) as info:
            deploy(client, manifest, environ=environ)
        assert puts(emu) == 0 and info.value.applied == () and info.value.report() == []
    finally:
        emu.stop()
    assert not emu.violations, emu.violations
    message = str(info.value)
    assert message.startswith("the limits of namespace _ refuse this deploy, so nothing was changed: "
                              "action rlhfless/prepare: memory 32768 MB is above maxActionMemory 512, "
                              "timeout 1800000 ms is above maxActionTimeout 300000; action rlhfless/init_critic: ")
    over = [name for name, spec in manifest.actions.items() if spec.memory > 512 or spec.timeout > 300_000]
    assert len(over) >= 8 and all(f"action rlhfless/{name}: " in message for name in over)
    assert "action rlhfless/noop" not in message and message.endswith("or ask for less in the manifest")


def test_a_failure_part_way_names_what_changed(ow_emulator: OpenWhiskEmulator, monkeypatch, tmp_path, capsys):
    """No /limits on this controller (the emulator's 404): the PUTs stop at the first refusal,
    and the operator learns which changes went live before it."""
    ow_emulator.limits["memory"] = (128, 512)
    path = write(tmp_path, SMALL.replace("memory: 256", "memory: 1024"))
    for name, value in ow_emulator.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PROBE_SETTING", "x")
    assert cli(["--manifest", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("rlhfless deploy: action rlhfless/probe: put action rlhfless/probe: "
                             "HTTP 400 memory 1024 MB")
    assert err[0].endswith("values-gpu.yaml); 1 change(s) made before it stay (listed below)")
    assert err[1:5] == ["changed before the failure (live now):", "  package rlhfless: create", "not changed:",
                        "  action rlhfless/probe: create"]
    assert err[5] == "  action rlhfless/noop: create" and "run `rlhfless deploy` again" in err[6]
    assert puts(ow_emulator) == 2  # the package and the refused probe; noop was never tried


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
    assert "no OpenWhisk credentials" in err and "unset or empty $AWS_SECRET_ACCESS_KEY" in err


def test_cli_dry_run_reads_the_action_runtime_s_credential_names_too(no_credentials, monkeypatch, capsys):
    """__OW_API_HOST/__OW_API_KEY configure a dry run as they do a deploy: a bad host is reported."""
    monkeypatch.setenv("__OW_API_HOST", "ftp://127.0.0.1:9")
    monkeypatch.setenv("__OW_API_KEY", "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:SECRETKEY")
    assert cli(["--manifest", str(SHIPPED), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "no OpenWhisk credentials" not in err and "SECRETKEY" not in err
    assert "set __OW_API_HOST to https://host[:port]" in err


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


def test_an_environment_variable_under_parameters_is_refused(tmp_path):
    """Default parameters reach every payload (and a refusal quotes them); env vars go under env:."""
    path = write(tmp_path, SMALL.replace("parameters: {echo: bound}", "parameters: {echo: bound, AWS_SECRET_ACCESS_KEY: x}"))
    with pytest.raises(ManifestError, match=r"actions\.probe\.parameters: .*AWS_SECRET_ACCESS_KEY: an environment "
                                            r"variable is not a parameter.*top-level env:"):
        load_manifest(path)


def test_registry_prefixes_every_image(no_credentials, tmp_path, capsys):
    path = write(tmp_path, SMALL)
    assert cli(["--manifest", str(path), "--dry-run", "--registry", "reg.example.org:5000/team/"]) == 0
    out = capsys.readouterr().out
    assert out.count("reg.example.org:5000/team/rlhfless/runtime-cpu:0.1.0") == 2, out
    assert cli(["--manifest", str(path), "--dry-run", "--registry", "https://reg.example.org"]) == 2
    assert "--registry 'https://reg.example.org': give a registry host" in capsys.readouterr().err


def test_dry_run_reports_a_configured_source_that_fails(no_credentials, monkeypatch, capsys):
    """No credentials at all: a plan against an empty namespace. A Secret block that cannot be
    loaded is an error, as in a real deploy, not a silent plan."""
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert cli(["--manifest", str(SHIPPED), "--dry-run", "--secret-block", "openwhisk"]) == 2
    err = capsys.readouterr().err
    assert "rlhfless deploy: cannot load the Prefect Secret block 'openwhisk'" in err
    assert "no OpenWhisk credentials" not in err


def test_a_host_that_is_not_the_api_is_one_line_naming_wsk_apihost(no_credentials, monkeypatch, capsys):
    """An HTML login portal (or a wrong ingress) at WSK_APIHOST: one line naming the host and the
    setting, not a JSON decoder's message."""
    monkeypatch.setenv("WSK_AUTH", "uuid1234:key12345678")
    with html_host() as url:
        monkeypatch.setenv("WSK_APIHOST", url)
        assert cli(["--manifest", str(SHIPPED), "--dry-run"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == (f"rlhfless deploy: get package rlhfless: HTTP 200 from {url} is not JSON (not an OpenWhisk API "
                   "answer); check WSK_APIHOST (the OpenWhisk API host)")


def test_a_secret_block_that_is_not_json_is_named_without_its_value(no_credentials, monkeypatch, capsys):
    import prefect.blocks.system as system

    value = '{"api_host": "https://ow.example", "auth": "23bc46b1-71f6:123zO3xZCLrMN6v2BKK1dX", }'
    monkeypatch.setattr(system.Secret, "load", staticmethod(lambda name: argparse.Namespace(get=lambda: value)))
    assert cli(["--manifest", str(SHIPPED), "--dry-run", "--secret-block", "ow-conn"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("rlhfless deploy: Prefect Secret block 'ow-conn' is not valid JSON (Expecting property name")
    assert "123zO3xZCLrMN6v2BKK1dX" not in err
    # the events worker's progress while it drains at exit stays off the error's line; its other records pass
    import logging

    events = logging.getLogger("EventsWorker")
    drain = logging.LogRecord("EventsWorker", logging.WARNING, __file__, 1, "Still processing items: 1 items "
                              "remaining...", None, None)
    other = logging.LogRecord("EventsWorker", logging.WARNING, __file__, 1, "lost connection", None, None)
    assert not events.filter(drain) and events.filter(other)


def test_env_expansion_follows_the_shell_for_empty_variables():
    """``:-`` takes the default for an empty variable too (an empty RLHFLESS_THREADS would reach
    every action, which reads it with int()); ``-`` keeps the empty value; a plain reference to
    an empty variable is refused as an unset one (an empty secret would fail in every action)."""
    manifest = {"T": "${RLHFLESS_THREADS:-4}", "D": "${RLHFLESS_THREADS-4}", "P": "${RLHFLESS_THREADS}",
                "U": "${UNSET-dflt}", "V": "${UNSET:-dflt}"}
    values, missing = expand_env(manifest, {"RLHFLESS_THREADS": ""})
    assert {k: v for k, v in values.items() if k != "P"} == {"T": "4", "D": "", "U": "dflt", "V": "dflt"}
    assert missing == ["RLHFLESS_THREADS"]
    values = expand_env(manifest, {"RLHFLESS_THREADS": "2"})[0]
    assert values == {"T": "2", "D": "2", "P": "2", "U": "dflt", "V": "dflt"}
