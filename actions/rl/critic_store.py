"""Loading the PPO critic from the store (backbone + value head), optionally warm-cached: the
cache keeps a run's latest critic version only."""

from __future__ import annotations

from actions.models import warm
from actions.models.device import action_device, action_dtype
from actions.models.loading import TensorReader, load_base_parts, read_tensors, store_for
from actions.models.modeling import build_model
from actions.rl.critic import Critic, build_critic, split_tensors


def load_critic(store_uri: str, base_key: str, critic_key: str, *, fresh: bool = False,
                dtype_setting: str = "auto", read: TensorReader = read_tensors) -> Critic:
    """The critic on ``RLHFLESS_DEVICE`` in the policy's dtype (``model.dtype``, loading.py).
    Not ``fresh``: from the warm cache, where loading a version evicts the run's other ones.
    ``read`` fetches the tensors (``loading.TensorReader``)."""
    device = action_device()
    dtype = action_dtype(dtype_setting, device)

    def build() -> Critic:
        tensors = read(store_for(store_uri), critic_key, None)
        # Built in dtype (its fp32 rotary buffers stay fp32, see build_model); the head is cast.
        # A critic stores no untied output head (critic.py); one stored before may hold it.
        lm = build_model(load_base_parts(store_uri, base_key), split_tensors(tensors), dtype=dtype,
                         output_head=False)
        critic = build_critic(lm, tensors)
        critic.value_head.to(dtype)
        return critic.to(device)

    if fresh:
        return build()
    key = ("critic", store_uri, base_key, critic_key, str(device), str(dtype))
    # Each critic version scores one step (the next train step publishes the next), so a new
    # one supersedes the run's older ones (the run's base_key names the run).
    return warm.get_or_build(key, build, supersedes=lambda k: isinstance(k, tuple) and k[:3] == key[:3])[0]
