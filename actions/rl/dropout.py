"""Model dropout off in the learner, as TRL's ``disable_dropout`` does for its RL trainers.

The learner trains in train mode (gradient checkpointing needs it), and a model that ships
dropout (GPT-2's ``resid/embd/attn_pdrop``, OPT's ``dropout``, Phi's, a Qwen2 with
``attention_dropout``) would then compute its log-probs with random masks: the ratio to the
scored ``old_logp`` (computed in eval mode) would be noise before any update, and the one-pass
shortcut (``update.needs_old_logp``), which takes the update's own log-probs as the old ones,
would train on a noisy policy. So every dropout of the model is set to 0: ``nn.Dropout``
modules (``p``) and the float rates attention and decoder layers keep as attributes and pass
to the functional dropout (``attention_dropout``, ``hidden_dropout``, OPT's ``layerdrop``),
and the same fields of the config, which some forwards read directly.

Mixture-of-experts routers that are random in train mode get the same treatment: Mixtral's
and MiniMax's ``jitter_noise`` multiplies the router's input by uniform noise, DBRX's
``moe_jitter_eps`` likewise, and PhiMoE's router samples its experts (Gumbel) and jitters its
input. Their rates are not simply zeroed (PhiMoE's ``router_jitter_noise`` is also the masking
threshold of its eval-mode routing, so 0 would change the model); instead every module that
carries a ``jitter`` setting is put in eval mode, which is exactly the routing the scorer used.
The experts' weights and the router's still get gradients: eval mode routes deterministically,
it does not stop autograd. Gradient checkpointing is unaffected (it keys on the decoder layers'
own mode).

LoRA's own dropout (``model.lora.dropout``, PEFT's ``lora_dropout`` modules) is kept: it is
a setting of this run, chosen for the adapter. A model without dropout is left as it was.

Its masks are drawn from a generator seeded per forward call (``seeded_masks``), keyed on the
optimizer step and the call's first row (``mask_seed``), not from whatever state the global
generator has reached: the sharded learner deals the calls out among its ranks, and a row must
get the same mask whichever rank computes it, and whichever calls ran before it there.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch

KEEP = "lora_dropout"
"""Modules under a name containing this are left alone (PEFT's LoRA dropout)."""


def _is_rate(name: str, value: object) -> bool:
    return "drop" in name and isinstance(value, float) and value > 0


def _routes_at_random(module: torch.nn.Module) -> bool:
    """A module with a router jitter setting (float or None), whose train mode is random."""
    return any("jitter" in attr and (value is None or isinstance(value, (int, float)))
               for attr, value in vars(module).items())


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout rate of ``model`` (and of its ``config``, if any) to 0, LoRA's aside,
    and put random-routing MoE modules in eval mode; call it after ``model.train()``. Returns
    how many rates and modules were changed (0 for a model without either)."""
    changed = 0
    for name, module in model.named_modules():
        if KEEP in name:
            continue
        if name and module.training and _routes_at_random(module):  # never the root: checkpointing
            module.eval()
            changed += 1
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            module.p = 0.0
            changed += 1
        for attr, value in list(vars(module).items()):
            if _is_rate(attr, value):
                setattr(module, attr, 0.0)
                changed += 1
    configs = {id(c): c for c in (getattr(m, "config", None) for m in model.modules()) if c is not None}
    for config in configs.values():
        for attr, value in list(vars(config).items()):
            if _is_rate(attr, value):
                setattr(config, attr, 0.0)
                changed += 1
    return changed


def mask_seed(*key: int) -> int:
    """A seed (below 2**63) that depends on every integer of ``key`` and on nothing else."""
    digest = hashlib.sha256(",".join(map(str, key)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@contextmanager
def seeded_masks(seed: int, device: torch.device) -> Iterator[None]:
    """Inside: the CPU's generator, and ``device``'s where it is a CUDA device, seeded with
    ``seed``; after: both as they were, so the code around sees no change. A checkpointed
    layer recomputes its forward with the state it stashed here (``preserve_rng_state``)."""
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(seed)
        for d in cuda:
            with torch.cuda.device(d):
                torch.cuda.manual_seed(seed)
        yield
