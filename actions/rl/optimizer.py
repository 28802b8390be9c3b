"""AdamW for the policy and the critic, with fp32 master weights under bf16/fp16 training.

A model trained in bfloat16 (or float16) computes its forward and backward passes in that
dtype, but an update of ``lr * adam_step`` is often smaller than a bfloat16 weight's spacing
(8 significant bits) and would round away. So, as in mixed-precision training generally
(Micikevicius et al., arXiv 1710.03740, sec. 3.1), the optimizer owns an fp32 copy of every
parameter: gradients are cast up to it, clipped and applied there, and the model's weights are
then the rounded copy. The master copy is part of the stored optimizer state
(``p{index}.master``), so a resumed or next step continues from the fp32 values, not from the
published low-precision weights. In fp32 there is no copy: the optimizer steps the
parameters themselves, exactly as a plain ``torch.optim.AdamW``.

Optimizer state is fp32 in both cases (AdamW's moments follow its parameters' dtype).
"""

from __future__ import annotations

import math
import re

import torch

from actions.store.optim_state import load_optimizer_tensors, optimizer_tensors
from actions.store.safe_paths import shown

MASTER = "master"
MASTER_NAME = re.compile(r"^p(0|[1-9][0-9]{0,8})\.master$")


def check_precision(tensors: dict[str, torch.Tensor], dtypes: list[torch.dtype], where: str) -> None:
    """Refuse optimizer state written at another training precision than the learner's
    (``dtypes``: its trainable parameters' dtypes): a float32 run's state has no master weights,
    and masters rebuilt from rounded low-precision weights would silently lose the fp32 values; a
    low-precision run's masters would be dropped by a float32 learner. ``model.dtype: auto``
    resolves where each action runs (bfloat16 on CUDA, float32 on the CPU, or ``RLHFLESS_DTYPE``),
    so a run resumed elsewhere can meet this.

    Raises:
        ValueError: one line naming the state (``where``), both precisions and the fix.
    """
    if not tensors:
        return
    masters = sum(1 for k in tensors if k.endswith(f".{MASTER}"))
    low = sorted({str(d).removeprefix("torch.") for d in dtypes if d != torch.float32})
    if (masters == 0) == (not low) and (not low or masters == len(dtypes)):
        return
    written = "float32 (no fp32 master weights)" if masters == 0 else "low precision (with fp32 master weights)"
    if low and 0 < masters < len(dtypes):
        written = f"low precision, with master weights for {masters} of {len(dtypes)} parameters"
    now = "/".join(low) or "float32"
    raise ValueError(f"optimizer state {where!r} was written by a run training in {written}, and this learner trains "
                     f"in {now}; resume with the precision the run started with (model.dtype, or RLHFLESS_DTYPE "
                     "where model.dtype is auto), or start a new run")


class TrainOptimizer:
    """AdamW (no weight decay) over ``module``'s trainable parameters (all of them, or a LoRA
    model's adapter), in fp32 whatever the module's dtype."""

    def __init__(self, module: torch.nn.Module, lr: float) -> None:
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.mixed = any(p.dtype != torch.float32 for p in self.params)
        self.master = ([p.detach().float().clone().requires_grad_(True) for p in self.params]
                       if self.mixed else [])
        # foreach=False keeps the update order, and so the bytes, independent of tensor grouping.
        self.opt = torch.optim.AdamW(self.master or self.params, lr=lr, weight_decay=0.0, foreach=False)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self, max_grad_norm: float) -> float:
        """Clip the accumulated gradients to ``max_grad_norm`` (L2, in fp32 under mixed
        precision), apply one AdamW step, return the norm before clipping.

        A norm that is not finite (a NaN or infinite gradient) skips the step, as torch.amp's
        ``GradScaler`` does: the gradients are dropped and the weights, the master copies and
        AdamW's moments and step count stay as they were, so a published version never holds
        NaN weights. The norm is still returned (the caller counts the skip, ``update.py``).
        Under FSDP2 every rank sees the same whole norm, so all ranks skip together."""
        if self.mixed:
            for m, p in zip(self.master, self.params):
                m.grad = None if p.grad is None else p.grad.float()
                p.grad = None  # the low-precision copy is not needed past this point
        norm = torch.nn.utils.clip_grad_norm_(self.master or self.params, max_grad_norm)
        if hasattr(norm, "full_tensor"):  # FSDP2's sharded parameters: the norm over every rank
            norm = norm.full_tensor()
        if not math.isfinite(float(norm)):
            for t in self.master or self.params:
                t.grad = None  # clipping scaled them by NaN; AdamW would spread it into every weight
            return float(norm)
        self.opt.step()
        if self.mixed:
            with torch.no_grad():
                for m, p in zip(self.master, self.params):
                    p.copy_(m)  # round to the training dtype
                    m.grad = None
        return float(norm)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """AdamW's state (``optim_state`` names) plus the fp32 master weights when mixed."""
        out = optimizer_tensors(self.opt)
        out.update({f"p{i}.{MASTER}": m.detach() for i, m in enumerate(self.master)})
        return out

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], *, where: str = "") -> None:
        """Restore ``state_tensors`` output (empty: a fresh optimizer, masters from the
        parameters as built).

        Raises:
            ValueError: state of another training precision (``check_precision``), or a master
                tensor that names no parameter or has another shape (one line naming the
                tensor and ``where``, the manifest key).
        """
        check_precision(tensors, [p.dtype for p in self.params], where)
        suffix = f".{MASTER}"
        for key, value in tensors.items():
            if not key.endswith(suffix):
                continue
            match = MASTER_NAME.match(key)
            index = int(match.group(1)) if match else -1
            if not self.mixed or not 0 <= index < len(self.master) or value.shape != self.master[index].shape:
                raise ValueError(f"optimizer state {where!r}: tensor {shown(key)} is not the fp32 master copy of one "
                                 f"of the {len(self.master)} low-precision parameters; re-publish the optimizer state")
            with torch.no_grad():
                self.master[index].copy_(value)
        load_optimizer_tensors(self.opt, {k: v for k, v in tensors.items() if not k.endswith(suffix)}, where=where)
