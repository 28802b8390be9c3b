"""One set of version pins: pyproject.toml's dependencies are the specification, and every
other place that installs the project's packages (the action images' requirements, the Prefect
worker of infra/prefect/docker-compose.yaml and its image tag) agrees with it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
IMAGES = ("cpu", "gpu")
# Dependencies the action images do not need, and why: the images run actions/ only.
CONTROL_PLANE_ONLY = {
    "prefect": "flows only", "fastapi": "Prefect's server", "sqlalchemy": "Prefect's server",
    "minio": "flows' storage helpers",
    "httpx": "the OpenWhisk client in flows", "matplotlib": "reports and the simulator's plots",
    "datasets": "the prepare action, which runs beside the flows (infra/prefect worker)",
}


def project() -> dict[str, Requirement]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {canonicalize_name(r.name): r for r in map(Requirement, deps)}


def pinned(path: Path) -> dict[str, Version]:
    """``name==version`` lines of a requirements file (options and comments skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{path}: {line} is not an exact pin"
            out[canonicalize_name(req.name)] = Version(spec.version)
    return out


def _allows(req: Requirement, version: Version) -> bool:
    return req.specifier.contains(version.public if version.local else version, prereleases=True)


@pytest.mark.parametrize("image", IMAGES)
def test_image_pins_lie_in_the_project_ranges_and_cover_the_data_plane(image: str):
    deps, pins = project(), pinned(REPO / "runtime_images" / image / "requirements.txt")
    outside = {n: str(v) for n, v in pins.items() if n in deps and not _allows(deps[n], v)}
    assert not outside, f"runtime_images/{image}/requirements.txt pins outside pyproject.toml: {outside}"
    missing = sorted(n for n in deps if n not in pins and n not in CONTROL_PLANE_ONLY)
    assert not missing, f"runtime_images/{image}/requirements.txt lacks data-plane dependencies: {missing}"
    assert "math-verify" in pins, "the math reward runs in the score action"


def test_vllm_layer_pins_lie_in_the_project_ranges():
    deps, pins = project(), pinned(REPO / "runtime_images" / "gpu-vllm" / "requirements.txt")
    gpu = pinned(REPO / "runtime_images" / "gpu" / "requirements.txt")
    assert pins["torch"] == gpu["torch"], "the vLLM layer must keep the GPU image's torch"
    for name in ("torch", "transformers"):
        assert _allows(deps[name], pins[name]), f"gpu-vllm pins {name}=={pins[name]} outside {deps[name]}"


def _compose_worker() -> tuple[str, str]:
    compose = yaml.safe_load((REPO / "infra" / "prefect" / "docker-compose.yaml").read_text())
    worker = compose["services"]["worker"]
    return worker["image"], " ".join(worker["command"])


def test_the_compose_server_installs_the_sqlalchemy_its_scheduler_works_with():
    """The Prefect image's SQLAlchemy is whatever it was built with: 2.1 fails the 3.8
    scheduler's every pass, so the server installs the project's specifier first."""
    compose = yaml.safe_load((REPO / "infra" / "prefect" / "docker-compose.yaml").read_text())
    command = " ".join(compose["services"]["server"]["command"])
    [req] = [Requirement(r) for r in re.findall(r"'([A-Za-z][^']*)'", command)]
    assert canonicalize_name(req.name) == "sqlalchemy" and req.specifier == project()["sqlalchemy"].specifier
    assert command.endswith("&& prefect server start --host 0.0.0.0")


def test_prefect_worker_installs_the_project_specifiers():
    deps = project()
    image, command = _compose_worker()
    specs = {canonicalize_name(r.name): r for r in map(Requirement, re.findall(r"'([A-Za-z][^']*)'", command))}
    assert specs, "no quoted requirement found in the worker's command"
    for name, req in specs.items():
        assert name in deps, f"the compose worker installs {req}, which pyproject.toml does not list"
        if name == "torch":  # the worker pins the CPU build, which must lie in the range
            (spec,) = req.specifier
            assert spec.operator == "==" and _allows(deps[name], Version(spec.version)), req
        else:
            assert req.specifier == deps[name].specifier, f"compose says {req}, pyproject.toml says {deps[name]}"
    missing = sorted(set(deps) - set(specs) - {"prefect"})
    assert not missing, f"the compose worker does not install {missing}"
    tag = re.fullmatch(r"prefecthq/prefect:([\d.]+)-python[\d.]+", image)
    assert tag and _allows(deps["prefect"], Version(tag.group(1))), f"{image} is outside {deps['prefect']}"


def test_the_tested_torch_is_in_range():
    import torch

    assert _allows(project()["torch"], Version(torch.__version__)), torch.__version__
