"""The layers' import boundaries, checked by what importing them really loads.

Each check imports every module of a package in a fresh interpreter and reads ``sys.modules``
afterwards, so a heavy import hidden behind another module (a transitive one) is caught too;
``tests/test_import_layers.py`` reads the import statements themselves.

- ``flows.planning`` is pure: no Prefect, torch or HTTP client;
- ``flows`` loads no torch (heavy imports happen inside actions only);
- ``actions`` loads neither Prefect nor ``flows`` (actions run in containers without them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import importlib, json, pkgutil, sys
root = importlib.import_module(sys.argv[1])
for info in pkgutil.walk_packages(root.__path__, sys.argv[1] + "."):
    if info.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(info.name)
    except ModuleNotFoundError as exc:  # an optional engine (vllm) absent here: its module is skipped
        if exc.name.split(".")[0] not in ("vllm",):
            raise
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def loaded_by(package: str) -> set[str]:
    """Top-level names in ``sys.modules`` after importing every module of ``package``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", PROBE, package], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(("package", "forbidden"), [
    ("flows.planning", {"prefect", "torch", "httpx"}),
    ("flows", {"torch"}),
    ("actions", {"prefect", "flows"}),
])
def test_a_layer_loads_nothing_it_must_not(package: str, forbidden: set[str]) -> None:
    assert not loaded_by(package) & forbidden


def test_the_probe_sees_a_transitive_import(tmp_path: Path) -> None:
    """The check can fail: a module of the probed package that imports something (here the
    standard library's ``email``) shows it among the loaded names, as a planning module that
    imported Prefect would show ``prefect``."""
    pkg = tmp_path / "probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "uses.py").write_text("import email.message\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", PROBE, "probe_pkg"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "email" in json.loads(out.stdout.strip().splitlines()[-1])
