"""Which rollouts each score activation takes when scores wait for generation to end.

Where scores start only after the generation phase (``CampaignConfig.overlap_scoring`` off:
the local warm pool, where score and generation actions share the host's processors), every
rollout is known when scoring starts. One score activation per rollout would then pay one
activation's fixed cost (request, loading the step's policy version, output write) per
rollout, continuations included, and its shards would be as uneven as the generation slices
(a ranked plan's short slice holds many short responses, a continuation a few). Instead the
rollouts are packed into at most ``bins`` activations (the phase's fan-out) by the longest
processing time rule: heaviest first, each into the lightest activation so far. A rollout's
weight is its scoring work, the tokens of its finished samples (cut samples are scored by
their continuation). Packing changes which activation scores a sample, never its score: a
row's log-probs do not depend on its batch-mates (``actions/rl/sequences.py``), and training
sorts the gathered samples (``actions/rl/batch.py``).
"""

from __future__ import annotations

from typing import Mapping


def pack_score_batches(weights: Mapping[str, float], bins: int) -> list[list[str]]:
    """Rollout keys grouped into at most ``bins`` non-empty score activations.

    Args:
        weights: rollout key -> scoring work (any unit, >= 0), in submission order.
        bins: most activations to use (>= 1).
    Returns:
        groups of keys, each group in ``weights``' order; groups ordered by their first key.
        Ties go to the lower bin, so the result is a pure function of the arguments.
    """
    if bins < 1:
        raise ValueError(f"bins={bins}: must be >= 1 (score activations per step)")
    order = {key: i for i, key in enumerate(weights)}
    loads = [0.0] * min(bins, len(weights))
    groups: list[list[str]] = [[] for _ in loads]
    for key in sorted(weights, key=lambda k: (-weights[k], order[k])):
        b = min(range(len(loads)), key=lambda i: (loads[i], i))
        loads[b] += weights[key]
        groups[b].append(key)
    out = [sorted(g, key=order.__getitem__) for g in groups if g]
    return sorted(out, key=lambda g: order[g[0]])
