"""Deduplicated-prefill planning: prefix-length choice and the prefill work plan (paper §3.1).

A prefill actor computes each unique prompt prefix's KV once; decode actors reuse it. With
``D(L)`` = number of distinct length-``L`` prefixes of the step's prompts (a prompt shorter
than ``L`` contributes the whole prompt), RLHFless picks the **largest L with D(L) <= B**,
where ``B`` is the prefill actor's batch capacity.

Deviation (consistent version) [I]: the paper says D(L) *decreases* with L; under its own
definition D is non-decreasing (a longer prefix can only tell more prompts apart), so the
largest feasible L is found by binary search over ``[L_min, L_max]`` (min and max prompt
length). ``None`` means even ``L_min`` exceeds capacity: no cross-prompt dedup this step.

Work accounting for ``plan_prefill`` (``g`` = samples per prompt):

- ``tokens_total``    = sum_p len(p) * g  (every sample prefills its own prompt, no dedup)
- ``prefix_tokens``   = sum over unique prefixes of len(prefix): what the prefill action
  computes (``actions/prefill.py``); 0 with ``L = None`` (no action)
- ``suffix_tokens(p)`` = max(0, len(p) - L): what the generation action holding ``p``
  computes itself after loading the prefix KV, once per group (a GRPO group's samples share
  the whole prompt); the whole prompt with ``L = None``
- ``tokens_computed`` = prefix_tokens + sum_p suffix_tokens(p)
- ``tokens_saved``    = tokens_total - tokens_computed

Prefix keys are ``sha256(",".join(decimal token ids))`` hex, first 16 characters.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping, Sequence


def prefix_hash(token_ids: Sequence[int]) -> str:
    """Stable key of a token-id prefix (sha256 of the comma-joined decimal ids, 16 hex)."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


def count_unique_prefixes(prompts: Sequence[Sequence[int]], prefix_len: int) -> int:
    """``D(L)``: number of distinct ``prompt[:L]`` (shorter prompts count whole)."""
    return len({tuple(p[:prefix_len]) for p in prompts})


def choose_prefix_len(prompts: Sequence[Sequence[int]], capacity: int) -> int | None:
    """Largest ``L`` in ``[min len, max len]`` with ``D(L) <= capacity``; None if none."""
    if not prompts:
        raise ValueError("prompts: empty; pass the step's prompt token ids")
    if capacity < 1:
        raise ValueError(f"prefix.capacity={capacity}: must be >= 1 (prefill batch size)")
    lo, hi = min(map(len, prompts)), max(map(len, prompts))
    best = None
    while lo <= hi:  # D is non-decreasing in L, so the feasible L form a prefix of the range
        mid = (lo + hi) // 2
        if count_unique_prefixes(prompts, mid) <= capacity:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


@dataclass(frozen=True)
class PrefillPlan:
    """What the prefill actor computes and how much work dedup saves (tokens)."""

    prefix_len: int | None
    groups: dict[str, tuple[int, ...]]  # prefix hash -> prompt ids sharing that prefix
    num_unique_prefixes: int
    tokens_total: int
    tokens_computed: int
    prefix_tokens: int = 0
    """Tokens of the unique prefixes: the prefill action's own work (module docstring)."""

    @property
    def tokens_saved(self) -> int:
        return self.tokens_total - self.tokens_computed

    def suffix_tokens(self, prompt_len: int) -> int:
        """Tokens of a ``prompt_len``-token prompt that its generation action prefills itself."""
        return prompt_len if self.prefix_len is None else max(0, prompt_len - self.prefix_len)

    def to_dict(self) -> dict:
        return {"prefix_len": self.prefix_len,
                "groups": {k: list(v) for k, v in self.groups.items()},
                "num_unique_prefixes": self.num_unique_prefixes,
                "tokens_total": self.tokens_total, "tokens_computed": self.tokens_computed,
                "prefix_tokens": self.prefix_tokens, "tokens_saved": self.tokens_saved}


def plan_prefill(prompts_by_id: Mapping[int, Sequence[int]], group_size: int,
                 capacity: int) -> PrefillPlan:
    """Choose ``L`` for this step's prompts and group prompt ids by their length-L prefix."""
    if group_size < 1:
        raise ValueError(f"group_size={group_size}: must be >= 1 (samples per prompt)")
    ids = sorted(prompts_by_id)
    prompts = [prompts_by_id[pid] for pid in ids]
    total = sum(len(p) for p in prompts) * group_size
    prefix_len = choose_prefix_len(prompts, capacity)
    if prefix_len is None:
        return PrefillPlan(None, {}, 0, total, sum(len(p) for p in prompts))
    groups: dict[str, list[int]] = {}
    prefix_tokens: dict[str, int] = {}
    for pid, prompt in zip(ids, prompts):
        head = prompt[:prefix_len]
        key = prefix_hash(head)
        groups.setdefault(key, []).append(pid)
        prefix_tokens[key] = len(head)
    suffix = sum(max(0, len(p) - prefix_len) for p in prompts)
    heads = sum(prefix_tokens.values())
    return PrefillPlan(prefix_len, {k: tuple(v) for k, v in groups.items()}, len(groups),
                       total, heads + suffix, heads)


def prefill_action_pays(plan: PrefillPlan, prompt_tokens: int, seconds_per_token: float,
                        fixed_s: float) -> bool:
    """Whether a separate prefill action saves more time than it costs.

    Without it each generation action prefills its own prompts, a GRPO group's samples sharing
    one prefill (the engine's dedup), so ``prompt_tokens`` (the step's prompts, each once) are
    computed either way except for what prompts share across each other: the action saves
    ``prompt_tokens - plan.tokens_computed`` tokens, at ``seconds_per_token`` of a generation
    action's prefill. It costs ``fixed_s`` on the critical path before any decode starts (its
    activation round trip, reading the policy, writing the KV bundle). The saving is counted
    as if one action prefilled every prompt, so the choice does not depend on the fan-out; the
    samples are the same either way (``tests/test_engine.py``).

    Args:
        plan: the step's ``plan_prefill``.
        prompt_tokens: sum of the step's prompt lengths (tokens).
        seconds_per_token: prefill seconds per token on a generation action (> 0).
        fixed_s: the prefill action's fixed seconds beyond its compute (>= 0).
    """
    if seconds_per_token <= 0 or fixed_s < 0:
        raise ValueError(f"seconds_per_token={seconds_per_token}, fixed_s={fixed_s}: "
                         "need a positive prefill time per token and a fixed cost >= 0")
    if plan.prefix_len is None:
        return False
    return max(0, prompt_tokens - plan.tokens_computed) * seconds_per_token > fixed_s
