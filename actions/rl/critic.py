"""PPO critic: the policy's transformer with a scalar value head.

The critic starts as a copy of policy version 0 plus a zero-initialised linear head (so its
first values are 0 and GAE starts from plain Monte-Carlo returns). ``V_t`` is read at the
position *before* response token t is emitted, matching the log-prob alignment in
sequences.py. Tensors are stored like policy weights, with ``value_head.*`` added.
"""

from __future__ import annotations

import torch

from actions.rl.sequences import PackedBatch, response_hidden

HEAD_PREFIX = "value_head."


class Critic(torch.nn.Module):
    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm
        self.value_head = torch.nn.Linear(lm.config.hidden_size, 1)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Values for each response token: [B, T]. The decoder is the model's
        ``base_model_prefix`` module (``model`` for Llama, ``transformer`` for GPT-2, ...)."""
        hidden = response_hidden(self.lm, batch)
        return self.value_head(hidden).squeeze(-1).float() * batch.response_mask

    def tensors(self) -> dict[str, torch.Tensor]:
        state = {k: v for k, v in self.lm.state_dict().items()}
        state.update({HEAD_PREFIX + k: v for k, v in self.value_head.state_dict().items()})
        return state


def build_critic(lm: torch.nn.Module, tensors: dict[str, torch.Tensor] | None) -> Critic:
    """Wrap ``lm`` (already holding the backbone weights); load the head from ``tensors``
    when given, else zero-initialise it."""
    critic = Critic(lm)
    if tensors is None:
        torch.nn.init.zeros_(critic.value_head.weight)
        torch.nn.init.zeros_(critic.value_head.bias)
    else:
        head = {k[len(HEAD_PREFIX):]: v for k, v in tensors.items() if k.startswith(HEAD_PREFIX)}
        critic.value_head.load_state_dict(head)
    return critic


def split_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The backbone part of stored critic tensors."""
    return {k: v for k, v in tensors.items() if not k.startswith(HEAD_PREFIX)}
