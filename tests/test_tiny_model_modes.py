"""``rlhfless tiny-model`` writes a folder whose files have the modes a file the user writes
gets (``0o666`` less the umask), the weights included, as ``rlhfless export`` does."""

from __future__ import annotations

import os
import stat

import pytest


@pytest.mark.parametrize("umask, file_mode", [(0o022, 0o644), (0o027, 0o640)])
def test_every_file_of_a_tiny_model_gets_the_umask_s_mode(tmp_path, capsys, umask, file_mode):
    from flows.commands.cli import main

    previous = os.umask(umask)
    try:
        assert main(["tiny-model", "--out", str(tmp_path / "m"), "--hidden-size", "16", "--num-layers", "1",
                     "--num-heads", "2", "--num-kv-heads", "1"]) == 0
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "m").iterdir()}
    assert "model.safetensors" in modes and "tokenizer.json" in modes, modes
    assert set(modes.values()) == {file_mode}, modes  # safetensors alone writes its file owner-only (0o600)
