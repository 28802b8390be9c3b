"""Deployment hardening: secrets stay out of git, servers stay on loopback unless told
otherwise and require auth, entrypoints never evaluate environment values, and the declared
dependency floor is one the code runs on."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ENTRY_RE = re.compile(r"COPY <<'EOF_ENTRY' /usr/local/bin/rlhfless-entrypoint\n(.*?)\nEOF_ENTRY", re.S)


# ----------------------------------------------------------------------------- secrets in git
@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout")
@pytest.mark.parametrize("path", ["infra/prefect/.env", "infra/minio/.env", "deploy/prod.env", ".env.local", ".wskprops"])
def test_secret_bearing_env_files_are_ignored(path: str) -> None:
    proc = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO)
    assert proc.returncode == 0, f"{path} is not in .gitignore"


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout")
@pytest.mark.parametrize("path", ["infra/prefect/env.example", "infra/minio/env.example"])
def test_env_templates_stay_tracked(path: str) -> None:
    assert subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO).returncode == 1


# ----------------------------------------------------------------------------- compose servers
COMPOSE = sorted((REPO / "infra").glob("*/docker-compose.yaml"))


def _default(text: str) -> str:
    """``${VAR:-default}`` -> default (what compose uses when .env does not set VAR)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


@pytest.mark.parametrize("path", COMPOSE, ids=lambda p: p.parent.name)
def test_compose_ports_are_published_on_loopback_by_default(path: Path) -> None:
    services = yaml.safe_load(path.read_text())["services"]
    published = [(name, str(p)) for name, svc in services.items() for p in svc.get("ports", [])]
    assert published, f"{path} publishes no port"
    for name, port in published:
        assert _default(port).startswith("127.0.0.1:"), f"{path.name}: {name} publishes {port} beyond loopback"


def test_prefect_compose_server_requires_basic_auth_and_the_worker_sends_it() -> None:
    services = yaml.safe_load((REPO / "infra" / "prefect" / "docker-compose.yaml").read_text())["services"]
    server_auth = services["server"]["environment"]["PREFECT_SERVER_API_AUTH_STRING"]
    worker_auth = services["worker"]["environment"]["PREFECT_API_AUTH_STRING"]
    # ":?" makes compose refuse to start without a value: no silent unauthenticated server.
    assert server_auth == worker_auth and server_auth.startswith("${PREFECT_AUTH_STRING:?")
    assert "PREFECT_AUTH_STRING=" in (REPO / "infra" / "prefect" / "env.example").read_text()


def test_prefect_auth_setting_names_exist_in_the_installed_prefect() -> None:
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_SERVER_API_AUTH_STRING

    assert PREFECT_API_AUTH_STRING.name == "PREFECT_API_AUTH_STRING"
    assert PREFECT_SERVER_API_AUTH_STRING.name == "PREFECT_SERVER_API_AUTH_STRING"


# ----------------------------------------------------------------------------- entrypoints
def test_no_eval_in_runtime_images() -> None:
    for path in (REPO / "runtime_images").rglob("*"):
        if path.is_file():
            for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                code = line.split("#", 1)[0]
                assert not re.search(r"\beval\b", code), f"{path.relative_to(REPO)}:{i} uses eval: {line.strip()}"


@pytest.mark.skipif(shutil.which("flock") is None or shutil.which("bash") is None, reason="needs bash and flock")
def test_gpu_entrypoint_treats_hostile_environment_values_as_data(tmp_path: Path) -> None:
    """A lock directory whose name is shell code is used as a name, and a GPU count that is an
    arithmetic expression with a command substitution is refused before bash evaluates it."""
    script = ENTRY_RE.search((REPO / "runtime_images" / "gpu" / "Dockerfile").read_text()).group(1)
    entry = tmp_path / "entrypoint"
    entry.write_text(script.replace("exec python -m actions.runtime.server --port 8080", 'echo "$CUDA_VISIBLE_DEVICES"'))
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'GPU 0: fake'\necho 'GPU 1: fake'\n")
    for path in (entry, fake):
        path.chmod(0o755)
    pwned = tmp_path / "pwned"
    lockdir = tmp_path / 'locks"; touch pwned; echo "'  # run with cwd=tmp_path: would create ./pwned
    lockdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(PATH=f"{fake.parent}{os.pathsep}{env['PATH']}", RLHFLESS_CLAIM_GPUS="1", RLHFLESS_GPU_LOCK_DIR=str(lockdir))

    claimed = subprocess.run([str(entry)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=10)
    assert claimed.returncode == 0 and claimed.stdout.strip() == "0", claimed.stderr
    assert (lockdir / "gpu0.lock").is_file() and not pwned.exists()

    env["RLHFLESS_CLAIM_GPUS"] = "a[$(touch pwned)]"
    refused = subprocess.run([str(entry)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=10)
    assert refused.returncode == 2 and "RLHFLESS_CLAIM_GPUS must be a whole number" in refused.stderr
    assert not pwned.exists()


# ----------------------------------------------------------------------------- dependency floor
def test_transformers_floor_accepts_the_dtype_keyword() -> None:
    """The code passes ``dtype=`` to ``from_pretrained``/``from_config``. transformers 4.56.0
    introduced it (huggingface/transformers#39782, renaming ``torch_dtype``); older releases
    ignore it or fail, so the floor must not drop below 4.56."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if re.match(r"transformers\b", d))
    floor = re.search(r">=\s*([0-9.]+)", spec).group(1)
    assert tuple(int(x) for x in floor.split(".")[:2]) >= (4, 56), spec
    uses = [p for p in (REPO / "actions").rglob("*.py") if re.search(r"from_(pretrained|config)\([^)]*\bdtype=", p.read_text())]
    assert uses, "no dtype= call left: revisit the floor"
