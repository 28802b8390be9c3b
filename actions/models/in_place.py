"""Copying a policy version's tensors into an already built model, in place.

A warm generation model (``actions/engines/torch_slot.py``) takes each new policy version of
its base by overwriting its own parameters: the tensors keep their storage, so everything
that holds their addresses stays valid -- the static decode runtime's buffers and the CUDA
graphs captured over them (``static_decode.runtime_for`` keys them by those addresses).

The copy is all or nothing: :func:`mismatch` checks that the version names exactly the
tensors the model holds, with their shapes, before anything is written, and a caller whose
copy fails midway must drop the model (:func:`copy_version` says so), never serve it.

What a version writes (:func:`version_targets`): every tensor of a full model's
``state_dict``; of a LoRA model only the adapter (``lora.adapter_tensors``), the shared,
frozen backbone never being written.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from actions.models.lora import adapter_tensors, is_lora


def version_targets(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Name -> the model's tensor a policy version overwrites (shares the model's storage)."""
    return adapter_tensors(model) if is_lora(model) else model.state_dict()


def mismatch(targets: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor]) -> str | None:
    """Why ``tensors`` cannot overwrite ``targets`` exactly (None: they can).

    Every target must be written: a name may be missing only where its storage is another
    name's that is present (a tied output head, which a version may omit, as ``build_model``
    allows). No name may be extra, and every shape must match; dtypes may differ (the copy
    converts, as building the model in fp32 and casting it would).
    """
    written = {targets[k].data_ptr() for k in tensors if k in targets}
    missing = [k for k, t in targets.items() if k not in tensors and t.data_ptr() not in written]
    unexpected = [k for k in tensors if k not in targets]
    if missing or unexpected:
        return f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
    shapes = [f"{k} {tuple(t.shape)} != {tuple(targets[k].shape)}" for k, t in tensors.items()
              if t.shape != targets[k].shape]
    return f"shape mismatch: {shapes[:3]}" if shapes else None


def copy_version(targets: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor]) -> None:
    """Overwrite ``targets`` with ``tensors`` in place (converting device and dtype).

    In ``targets``' order (the model's own, as ``load_state_dict`` writes): where two names
    share storage (tied weights) and a version stores both, the one the model lists last wins
    in both, so the model holds what ``build_model`` would give. The caller has checked
    :func:`mismatch`. If this raises, some targets hold the new version and some the old: the
    caller must drop the model.
    """
    with torch.no_grad():
        for name, target in targets.items():
            if name in tensors:
                target.copy_(tensors[name])
