"""PPO critic: the policy's transformer with a scalar value head.

The critic starts as a copy of policy version 0 plus a zero-initialised linear head (so its
first values are 0 and GAE starts from plain Monte-Carlo returns). ``V_t`` is read at the
position *before* response token t is emitted, matching the log-prob alignment in
sequences.py. Tensors are stored like policy weights, with ``value_head.*`` added.

The critic reads hidden states only, so a model's output head that has weights of its own
(untied embeddings) would never get a gradient: the critic drops it from the model it wraps,
and neither trains, stores nor publishes it. A tied head is the input embedding, which the
critic does train and store. Critics stored before the head was dropped still load (the head
is discarded), and so does the optimizer state stored with them (``stored_optimizer_state``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from actions.models.modeling import stored_state, untied_head_keys
from actions.rl.sequences import PackedBatch, response_hidden

HEAD_PREFIX = "value_head."


def drop_untied_head(lm: torch.nn.Module) -> tuple[list[str], list[int]]:
    """Remove ``lm``'s untied output head (its module is set to None) in place.

    Returns:
        ``(keys, positions)``: the head's state-dict keys and the positions its parameters had
        in ``lm.parameters()``; both empty where the head is tied or absent.
    """
    keys = untied_head_keys(lm)
    if not keys:
        return [], []
    head = lm.get_output_embeddings()
    ids = {id(p) for p in head.parameters()}
    positions = [i for i, p in enumerate(lm.parameters()) if id(p) in ids]
    name = next(n for n, m in lm.named_modules() if m is head)
    parent, _, attr = name.rpartition(".")
    setattr(lm.get_submodule(parent) if parent else lm, attr, None)
    return keys, positions


def renumber_state(tensors: Mapping[str, torch.Tensor], removed: list[int]) -> Mapping[str, torch.Tensor]:
    """Optimizer state (``p{index}.{field}``, ``optimizer.py``) written over a parameter list
    that included the parameters at ``removed``, renumbered for the list without them: their
    entries dropped, later indices shifted down. Names of another form are kept for the
    loader to refuse. A set read lazily from the store (``weights.StoredTensors``) is renamed
    without fetching a tensor."""
    names = {}  # new name -> name in ``tensors``
    for key in tensors:
        index, dot, field = key[1:].partition(".")
        if not (key.startswith("p") and index.isdigit() and dot):
            names[key] = key
        elif int(index) not in removed:
            names[f"p{int(index) - sum(r < int(index) for r in removed)}.{field}"] = key
    renamed = getattr(tensors, "renamed", None)
    return renamed(names) if renamed is not None else {new: tensors[old] for new, old in names.items()}


class Critic(torch.nn.Module):
    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.head_keys, self.head_positions = drop_untied_head(lm)
        # Whether the tensors it was loaded from held the untied head (stored before the critic
        # dropped it): their optimizer state then numbers the head's parameters too.
        self.stored_with_head = False
        self.lm = lm
        self.value_head = torch.nn.Linear(lm.config.hidden_size, 1)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Values for each response token: [B, T]. The decoder is the model's
        ``base_model_prefix`` module (``model`` for Llama, ``transformer`` for GPT-2, ...)."""
        hidden = response_hidden(self.lm, batch)
        return self.value_head(hidden).squeeze(-1).float() * batch.response_mask

    def tensors(self) -> dict[str, torch.Tensor]:
        """The stored critic: the backbone (no output head: an untied one is dropped, a tied one is
        the embedding, stored once, ``modeling.stored_state``) and ``value_head.*``."""
        state = stored_state(self.lm)
        state.update({HEAD_PREFIX + k: v for k, v in self.value_head.state_dict().items()})
        return state

    def stored_optimizer_state(self, tensors: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """Stored critic-optimizer state in this critic's parameter numbering: state written
        beside a critic stored with its untied head (an earlier release) also numbered the
        head's parameters (an fp32 master copy under bf16/fp16; no moments, it had no
        gradient), so those entries are dropped and the value head's renumbered."""
        return renumber_state(tensors, self.head_positions) if self.stored_with_head else tensors


def build_critic(lm: torch.nn.Module, tensors: dict[str, torch.Tensor] | None) -> Critic:
    """Wrap ``lm`` (already holding the backbone weights; an untied output head is dropped);
    load the head from ``tensors`` when given, else zero-initialise it."""
    critic = Critic(lm)
    if tensors is None:
        torch.nn.init.zeros_(critic.value_head.weight)
        torch.nn.init.zeros_(critic.value_head.bias)
    else:
        value = {k[len(HEAD_PREFIX):]: v for k, v in tensors.items() if k.startswith(HEAD_PREFIX)}
        critic.value_head.load_state_dict(value)
        critic.stored_with_head = any(k in tensors for k in critic.head_keys)
    return critic


def split_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The backbone part of stored critic tensors."""
    return {k: v for k, v in tensors.items() if not k.startswith(HEAD_PREFIX)}
