"""Loading the PPO critic from the store (backbone + value head), optionally warm-cached."""

from __future__ import annotations

from actions.models import warm
from actions.models.device import action_device, action_dtype
from actions.models.loading import load_base_parts, store_for
from actions.models.modeling import build_model
from actions.rl.critic import Critic, build_critic, split_tensors
from actions.store.weights import load_tensors


def load_critic(store_uri: str, base_key: str, critic_key: str, *, fresh: bool = False,
                dtype_setting: str = "auto") -> Critic:
    """The critic on ``RLHFLESS_DEVICE`` in the policy's dtype (``model.dtype``, loading.py)."""
    device = action_device()
    dtype = action_dtype(dtype_setting, device)

    def build() -> Critic:
        tensors, _ = load_tensors(store_for(store_uri), critic_key)
        # Built in dtype (its fp32 rotary buffers stay fp32, see build_model); the head is cast.
        # A critic stores no untied output head (critic.py); one stored before may hold it.
        lm = build_model(load_base_parts(store_uri, base_key), split_tensors(tensors), dtype=dtype,
                         output_head=False)
        critic = build_critic(lm, tensors)
        critic.value_head.to(dtype)
        return critic.to(device)

    if fresh:
        return build()
    return warm.get_or_build(("critic", store_uri, base_key, critic_key, str(device), str(dtype)), build)[0]
