"""AdamW state <-> flat tensors, so optimizer state is stored like weights (safetensors).

Names: ``p{index}.exp_avg``, ``p{index}.exp_avg_sq``, ``p{index}.step`` where index is the
parameter's position in ``model.parameters()``; hyper-parameters stay in the config.
"""

from __future__ import annotations

import torch


def optimizer_tensors(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {}
    for idx, state in opt.state_dict()["state"].items():
        for name, value in state.items():
            out[f"p{idx}.{name}"] = value if torch.is_tensor(value) else torch.tensor(value)
    return out


def load_optimizer_tensors(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor]) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        idx, name = key[1:].split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    sd = opt.state_dict()
    sd["state"] = state
    opt.load_state_dict(sd)
