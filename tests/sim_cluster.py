"""The simulator tests' cluster: Qwen2.5-7B on H100 (roofline), 2 nodes, 2 GPUs per actor."""

from __future__ import annotations

from flows.planning.tpot import GPUS, MODELS, roofline_profile
from flows.simulate.policies import ClusterModel

QWEN = MODELS["qwen2.5-7b"]


def qwen_cluster(**overrides) -> ClusterModel:
    """That cluster with its weight and KV bytes, 80 GB/s transfers and n_max 8; ``overrides``
    replace any ``ClusterModel`` field."""
    args = dict(profile=roofline_profile(GPUS["h100"], QWEN, 2), num_nodes=2, gpus_per_actor=2,
                weight_bytes=QWEN.weight_bytes, kv_bytes_per_token=QWEN.kv_bytes_per_token,
                bandwidth_bytes_per_s=80e9, n_max=8)
    args.update(overrides)
    return ClusterModel(**args)
