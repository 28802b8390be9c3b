"""AdamW state <-> flat tensors, so optimizer state is stored like weights (safetensors).

Names: ``p{index}.exp_avg``, ``p{index}.exp_avg_sq``, ``p{index}.step`` where index is the
parameter's position in ``model.parameters()``; hyper-parameters stay in the config.
"""

from __future__ import annotations

import re

import torch

from actions.store.safe_paths import shown


def optimizer_tensors(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {}
    for idx, state in opt.state_dict()["state"].items():
        for name, value in state.items():
            out[f"p{idx}.{name}"] = value if torch.is_tensor(value) else torch.tensor(value)
    return out


_NAME = re.compile(r"^p(0|[1-9][0-9]{0,8})\.(step|exp_avg|exp_avg_sq|max_exp_avg_sq)$")  # AdamW's state fields


def load_optimizer_tensors(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], *, where: str = "") -> None:
    """Put stored state back into ``opt``. Names come from a manifest, so each must be
    ``p<index>.<field>`` with an index of one of the optimizer's parameters and an AdamW field,
    and every parameter with state must have its ``step``, ``exp_avg`` and ``exp_avg_sq``.

    Raises:
        ValueError: one line naming the tensor and ``where`` (the manifest key).
    """
    num_params = sum(len(g["params"]) for g in opt.param_groups)
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        match = _NAME.match(key)
        if match is None or int(match.group(1)) >= num_params:
            raise ValueError(f"optimizer state {where!r}: tensor {shown(key)} is not p<index>.<field> for one of "
                             f"the {num_params} parameters; re-publish the optimizer state")
        state.setdefault(int(match.group(1)), {})[match.group(2)] = value
    # AdamW keeps all three for every parameter it has stepped; a missing one would fail later
    # as a bare KeyError inside torch, or restart the moments of one parameter without a word.
    for idx, fields in sorted(state.items()):
        missing = [f for f in ("step", "exp_avg", "exp_avg_sq") if f not in fields]
        if missing:
            raise ValueError(f"optimizer state {where!r}: parameter p{idx} has no {' or '.join(missing)}; "
                             "re-publish the optimizer state")
    sd = opt.state_dict()
    sd["state"] = state
    opt.load_state_dict(sd)
