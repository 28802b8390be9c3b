"""The action images, without a Docker daemon: the base images check every built-in reward at
build time, and the rewards layer (runtime_images/rewards/Dockerfile) adds a user's reward
module. Its COPY and RUN instructions are replayed here against a folder standing in for the
image's file system: the same shell commands, with the image's paths mapped into it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYER = REPO / "runtime_images" / "rewards" / "Dockerfile"

MODULE = '''
def passes(prompts, completions, answer, **kwargs):
    return [float(str(a) in c) for c, a in zip(completions, answer)]
'''


def instructions(path: Path) -> list[tuple[str, str]]:
    """(keyword, rest) per instruction; comments and continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("image", ["cpu", "gpu"])
def test_base_images_check_every_builtin_reward_after_copying_the_actions(image: str):
    steps = instructions(REPO / "runtime_images" / image / "Dockerfile")
    copy_actions = next(i for i, (k, rest) in enumerate(steps) if k == "COPY" and rest.startswith("actions/"))
    check = [i for i, (k, rest) in enumerate(steps) if k == "RUN" and "-m actions.tasks.rewards.check" in rest]
    assert check and check[0] > copy_actions


def replay_layer(context: Path, root: Path, build_args: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the layer's COPY and RUN steps with ``root`` as the image's ``/`` and the repository
    as its WORKDIR (/opt/rlhfless, where the base image put actions/). Returns the last RUN."""
    args: dict[str, str] = {}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    mapped = lambda s: re.sub(r"(?<![\w.])/opt/rlhfless/user", str(root / "opt/rlhfless/user"), s)  # noqa: E731
    proc = None
    for keyword, rest in instructions(LAYER):
        if keyword == "ARG" and "=" in rest:
            name, default = rest.split("=", 1)
            args[name] = build_args.get(name, default)
        elif keyword == "ENV":
            name, value = rest.split("=", 1)
            env[name] = mapped(value)
        elif keyword == "COPY":
            src, dst = rest.split()
            src = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], src)
            target = Path(mapped(dst))
            target.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-R", f"{context / src}/.", str(target)], check=True)
        elif keyword == "RUN":
            run_env = {**env, **args, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
            run_env["PYTHONPATH"] = os.pathsep.join([run_env["PYTHONPATH"], str(REPO)])  # WORKDIR's actions/
            proc = subprocess.run(["bash", "-c", mapped(rest)], cwd=REPO, env=run_env, capture_output=True,
                                  text=True, timeout=120)
            if proc.returncode:
                return proc
    assert proc is not None
    return proc


def _context(tmp_path: Path) -> Path:
    package = tmp_path / "ctx" / "rewards" / "my_rewards"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "code.py").write_text(MODULE)
    return tmp_path / "ctx"


def test_rewards_layer_adds_a_user_module(tmp_path: Path):
    proc = replay_layer(_context(tmp_path), tmp_path / "root", {"REWARD_FUNCTIONS": "my_rewards.code:passes"})
    assert proc.returncode == 0, proc.stderr
    assert "plug-in my_rewards.code:passes: ok" in proc.stdout
    assert "built-in math: ok" in proc.stdout
    assert (tmp_path / "root" / "opt/rlhfless/user/my_rewards/code.py").is_file()


def test_rewards_layer_build_fails_on_a_missing_function(tmp_path: Path):
    proc = replay_layer(_context(tmp_path), tmp_path / "root", {"REWARD_FUNCTIONS": "my_rewards.code:absent"})
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and "has no function 'absent'" in proc.stderr
