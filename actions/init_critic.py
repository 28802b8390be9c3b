"""init_critic action (PPO): the critic's first version, published once at campaign start.

The critic is the policy's backbone with a scalar value head (``actions/rl/critic.py``). Its
first version copies policy v0 (after warm-up) exactly as stored, on the host and in the stored
dtype, with the head zero-initialised, so it is the same bytes wherever it runs.
"""

from __future__ import annotations

import torch

from actions.contracts import CriticInitRequest, CriticInitResult
from actions.models.loading import load_base_parts, store_for
from actions.models.modeling import build_model
from actions.rl.critic import build_critic
from actions.runtime.adapter import run_action
from actions.store.weights import load_tensors, publish_tensors


def stored_dtype(tensors: dict[str, torch.Tensor]) -> torch.dtype:
    """The one floating dtype of ``tensors`` (bf16 for a bf16 policy); fp32 for a mix."""
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


def run_init_critic(req: CriticInitRequest) -> CriticInitResult:
    ref = req.model
    store = store_for(ref.store_uri)
    tensors, _ = load_tensors(store, ref.policy_key, expected_sha256=ref.weights_sha256)
    # Built in the stored dtype: a bf16 policy's critic in fp32 would store and load twice the bytes.
    dtype = stored_dtype(tensors)
    lm = build_model(load_base_parts(ref.store_uri, ref.base_key), tensors, dtype=dtype)
    critic = build_critic(lm, None)
    critic.value_head.to(dtype)
    published = publish_tensors(store, req.output_key, critic.tensors(), {"version": 0, "source": "policy v0"})
    return CriticInitResult(critic_key=published.manifest_key, weights_sha256=published.weights_sha256)


def main(args: dict) -> dict:
    return run_action(CriticInitRequest, run_init_critic, args)
