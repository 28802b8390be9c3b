"""What an installed package carries: the wheel holds the deploy manifest, and ``rlhfless``
works from it in an empty directory, away from any checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from actions.runtime.server import ACTION_NAMES

REPO = Path(__file__).resolve().parents[1]


def _env_without_credentials(home: Path, pythonpath: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WSK_", "__OW_", "RLHFLESS_OPENWHISK", "PYTHONPATH"))}
    env.update({"HOME": str(home), "WSK_CONFIG_FILE": str(home / "wskprops"), "PYTHONDONTWRITEBYTECODE": "1"})
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy of the sources (the checkout gets no build
    files) and unpacked as pip would install it (a pure-Python wheel: one tree)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("flows", "actions"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(work / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "No module named pip" in proc.stderr:
        pytest.skip("pip is not installed in this environment: the wheel cannot be built")
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (work / "dist").glob("rlhfless-*.whl")
    site = work / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


def test_the_wheel_carries_the_manifest_and_the_entry_point(unpacked_wheel: Path):
    assert (unpacked_wheel / "flows" / "commands" / "openwhisk_actions.yaml").is_file()
    (dist_info,) = unpacked_wheel.glob("rlhfless-*.dist-info")
    assert "rlhfless = flows.commands.cli:main" in (dist_info / "entry_points.txt").read_text()


def test_deploy_dry_run_from_the_wheel_in_an_empty_directory(unpacked_wheel: Path, tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    code = ("import sys, flows; assert flows.__file__.startswith(sys.argv[1]), flows.__file__; "
            "from flows.commands.cli import main; sys.exit(main(['deploy', '--dry-run']))")
    proc = subprocess.run([sys.executable, "-c", code, str(unpacked_wheel)], cwd=empty, capture_output=True,
                          text=True, timeout=120, env=_env_without_credentials(tmp_path, str(unpacked_wheel)))
    assert proc.returncode == 0, proc.stderr
    planned = {line.split()[1].rstrip(":").split("/")[-1] for line in proc.stdout.splitlines()
               if line.startswith("action ") and ": create [image rlhfless/runtime-" in line}
    assert planned == set(ACTION_NAMES), proc.stdout
    assert list(empty.iterdir()) == [], "a dry run wrote into the working directory"


def test_version_matches_the_project(tmp_path: Path):
    expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    proc = subprocess.run([sys.executable, "-m", "flows.commands.cli", "--version"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=_env_without_credentials(tmp_path, str(REPO)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"rlhfless {expected}"
