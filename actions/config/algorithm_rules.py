"""Cross-field rules of the ``algorithm`` section that depend on ``algorithm.name``
(``AlgorithmConfig`` in ``workload.py`` runs them after its fields are validated)."""

from __future__ import annotations

from typing import Any

PPO_ONLY = ("critic_lr", "gamma", "gae_lambda", "value_clip")
"""Settings of PPO's critic and GAE, which GRPO has neither of."""


def check_algorithm_name(algo: Any) -> None:
    """Raise ValueError where a setting of ``algo`` (an ``AlgorithmConfig``) does not fit its
    ``name``: GRPO with one completion per prompt (``group_size`` 1: every group-relative
    advantage is 0; TRL refuses ``num_generations`` below 2 too), GRPO's normalisation settings
    with PPO, or PPO's critic settings (``PPO_ONLY``) off their defaults with GRPO (refused, not
    ignored: they would change nothing computed, yet the run's id)."""
    if algo.name == "grpo" and algo.group_size < 2:
        raise ValueError(f"algorithm.group_size={algo.group_size} gives GRPO one completion per prompt, so every "
                         "group-relative advantage is 0 and nothing is learned; set algorithm.group_size to 2 or more "
                         "(as TRL's num_generations must be), or set algorithm.name=ppo, whose critic needs no group")
    if algo.name == "ppo" and not algo.scale_by_std:
        raise ValueError("algorithm.scale_by_std=false sets GRPO's group normalisation, but algorithm.name is "
                         "ppo, which whitens its GAE advantages over the batch; remove algorithm.scale_by_std")
    if algo.std_scope == "batch" and (algo.name == "ppo" or not algo.scale_by_std):
        why = ("algorithm.name is ppo, which whitens its GAE advantages over the batch" if algo.name == "ppo"
               else "algorithm.scale_by_std is false, so no std divides them")
        raise ValueError(f"algorithm.std_scope=batch sets the std GRPO divides its centred rewards by, but {why}; "
                         "remove algorithm.std_scope")
    ppo = [k for k in PPO_ONLY if algo.name == "grpo" and getattr(algo, k) != type(algo).model_fields[k].default]
    if ppo:
        given = ", ".join(f"algorithm.{k}={getattr(algo, k)}" for k in ppo)
        raise ValueError(f"{given} {'sets' if len(ppo) == 1 else 'set'} PPO's critic and GAE, but algorithm.name "
                         "is grpo, which has neither; remove "
                         f"{' and '.join(f'algorithm.{k}' for k in ppo)} or set algorithm.name=ppo")
