"""What a policy push into a running vLLM engine must hold, checked before it reaches the engine.

vLLM's in-place reload (``model_runner.reload_weights``, ``vllm_worker.WorkerExtension``) first
moves every layer to the meta device, then rebuilds each one from the tensors it receives. A
tensor it cannot place (a name the model lacks, a wrong shape) raises part-way and leaves
layers on the meta device: every later generate fails ("not on the expected device meta"),
and so does a correct push. A module that receives only some of its tensors is rebuilt from
fresh memory with the pushed part only: ``q_proj`` pushed without ``k_proj`` and ``v_proj``,
which vLLM loads into one fused ``qkv_proj``, leaves keys and values uninitialised, silently.

So a push is checked against the checkpoint the engine started from (its safetensors headers;
no tensor data is read): every name known, every shape equal, and every module it touches
complete (all of that module's checkpoint tensors, a fused module's siblings included).
Imports neither torch nor vLLM.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

TIED_HEAD = "lm_head.weight"
"""With tied embeddings vLLM reads the input embedding for the head and skips this tensor, which
a state dict still carries (``Module.state_dict`` lists both names)."""


def checkpoint_shapes(paths: Iterable[str | Path]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of every tensor in these safetensors files (headers only)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in paths:
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        shapes.update({k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"})
    return shapes


def module_of(name: str, fused: Mapping[str, Sequence[str]]) -> str:
    """The vLLM module a checkpoint tensor loads into: its parent module, with a fused member
    renamed to the fused module (``fused``: vLLM's ``packed_modules_mapping``).

    >>> module_of("model.layers.0.self_attn.k_proj.weight", {"qkv_proj": ["q_proj", "k_proj", "v_proj"]})
    'model.layers.0.self_attn.qkv_proj'
    """
    member = {m: f for f, members in fused.items() for m in members}
    parts = name.split(".")[:-1]
    return ".".join(member.get(p, p) for p in parts)


def check_push(pushed: Mapping[str, Sequence[int]], checkpoint: Mapping[str, Sequence[int]],
               fused: Mapping[str, Sequence[str]], tied_head: bool) -> None:
    """Refuse a push the engine could not load whole (module docstring).

    Args:
        pushed: tensor name -> shape of the push.
        checkpoint: tensor name -> shape of the checkpoint the engine started from; empty (a
            model folder without safetensors files, e.g. ``pytorch_model.bin``): nothing is
            known to check against, and the push goes through unchecked.
        fused: vLLM's fused modules, fused name -> member names (``packed_modules_mapping``).
        tied_head: the model ties its head to the input embedding (``TIED_HEAD`` is skipped).
    Raises:
        ValueError: one line naming the first offending tensor and the fix.
    """
    if not checkpoint:
        return
    for name, shape in pushed.items():
        if name == TIED_HEAD and tied_head:
            continue
        if name not in checkpoint:
            raise ValueError(f"weight push refused: tensor {name!r} is not in the model's checkpoint "
                             f"({len(checkpoint)} tensors); push tensors under the names the checkpoint uses "
                             "(Module.state_dict names)")
        if tuple(shape) != tuple(checkpoint[name]):
            raise ValueError(f"weight push refused: tensor {name!r} has shape {list(shape)}, the model's is "
                             f"{list(checkpoint[name])}; push weights of this model's architecture")
    touched = {module_of(n, fused) for n in pushed if not (n == TIED_HEAD and tied_head)}
    for name in checkpoint:
        module = module_of(name, fused)
        if module in touched and name not in pushed:
            sent = sorted(n for n in pushed if module_of(n, fused) == module)
            raise ValueError(f"weight push refused: it carries {', '.join(map(repr, sent))} but not {name!r}, "
                             f"which vLLM loads into the same module ({module}); push every tensor of that module, "
                             "or the whole state dict")
