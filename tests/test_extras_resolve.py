"""Each optional extra of pyproject.toml resolves with the project (``pip install --dry-run``),
in this environment: what is installed stays, and what is missing must be found on the index.

Marked ``registry`` and ``slow`` (each resolve asks the index for metadata: tens of seconds);
skipped, saying so, where the index cannot be reached. There is deliberately no ``vllm`` extra
(docs/vllm.md: vLLM and Prefect 3.8 need disjoint fastapi versions).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import pytest

REPO = Path(__file__).resolve().parents[1]
EXTRAS = sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])

pytestmark = [pytest.mark.registry, pytest.mark.slow]


def _index_reachable() -> bool:
    host = urlparse(os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple")).hostname or "pypi.org"
    try:
        socket.create_connection((host, 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def project_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pyproject.toml and what its metadata needs (the packages' folders), outside the checkout."""
    if not _index_reachable():
        pytest.skip("the package index is not reachable: extras cannot be resolved here")
    root = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, root / name)
    for package in ("flows", "actions"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")
    return root


def test_no_vllm_extra():
    assert "vllm" not in EXTRAS and "vllm-cpu" not in EXTRAS


@pytest.mark.parametrize("extra", [None, *EXTRAS])
def test_extra_resolves(extra: str | None, project_copy: Path, tmp_path: Path):
    target = f".[{extra}]" if extra else "."
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-build-isolation", "-q",
                           "--report", str(report), target], cwd=project_copy, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"pip install --dry-run '{target}' failed:\n{proc.stderr[-2000:]}"
    names = {i["metadata"]["name"] for i in json.loads(report.read_text())["install"]}
    assert "rlhfless" in names
    assert "torch" not in names, "the extra would replace this environment's torch"
