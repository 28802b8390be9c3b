"""Prefix-length choice and prefill plan (paper §3.1, consistent version)."""

import pytest

from flows.planning.prefix import (
    choose_prefix_len,
    count_unique_prefixes,
    plan_prefill,
    prefill_action_pays,
    prefix_hash,
)

# two templates (1,2,3,...) and (9,9,...) shared by several prompts
PROMPTS = {
    0: [1, 2, 3, 4, 5, 6],
    1: [1, 2, 3, 4, 7, 8],
    2: [1, 2, 3, 9],
    3: [9, 9, 9, 1, 2],
    4: [9, 9, 9, 1, 3, 4, 5],
}


def test_unique_prefix_count_is_monotone():
    prompts = list(PROMPTS.values())
    counts = [count_unique_prefixes(prompts, L) for L in range(1, 8)]
    # L=1..3: {1..}, {9..} -> 2; L=4: 1234, 1239, 9991 -> 3; L=5: 12345,12347,1239,99912,99913 -> 5
    assert counts == [2, 2, 2, 3, 5, 5, 5]
    assert all(a <= b for a, b in zip(counts, counts[1:]))


def test_largest_length_under_capacity():
    prompts = list(PROMPTS.values())
    # L ranges over [4, 7]; D(4)=3, D(5..7)=5
    assert choose_prefix_len(prompts, 3) == 4
    assert choose_prefix_len(prompts, 4) == 4
    assert choose_prefix_len(prompts, 5) == 7
    assert choose_prefix_len(prompts, 2) is None  # even L_min = 4 needs 3 slots


def test_prefill_plan_token_accounting():
    plan = plan_prefill(PROMPTS, group_size=3, capacity=3)
    assert plan.prefix_len == 4
    assert plan.num_unique_prefixes == 3
    assert sorted(plan.groups.values()) == [(0, 1), (2,), (3, 4)]
    assert plan.groups[prefix_hash([1, 2, 3, 4])] == (0, 1)
    total_len = 6 + 6 + 4 + 5 + 7  # 28 prompt tokens
    assert plan.tokens_total == total_len * 3
    # unique prefixes 4 + 4 + 4 tokens; suffixes 2 + 2 + 0 + 1 + 3
    assert plan.tokens_computed == 12 + 8
    assert plan.tokens_saved == 84 - 20
    assert plan.to_dict()["tokens_saved"] == 64
    # the prefill action computes the unique prefixes only; each generation action the
    # suffixes of its own prompts (actions/prefill.py, actions/generate.py)
    assert plan.prefix_tokens == 12 and plan.to_dict()["prefix_tokens"] == 12
    assert [plan.suffix_tokens(len(p)) for p in PROMPTS.values()] == [2, 2, 0, 1, 3]


def test_no_dedup_when_capacity_too_small():
    plan = plan_prefill(PROMPTS, group_size=2, capacity=1)
    assert plan.prefix_len is None and plan.groups == {}
    assert plan.tokens_computed == 28  # each prompt once: the group still shares it
    assert plan.tokens_saved == 28
    assert plan.prefix_tokens == 0 and plan.suffix_tokens(6) == 6  # no action: the whole prompt


def test_bad_input():
    with pytest.raises(ValueError, match="capacity"):
        choose_prefix_len([[1]], 0)
    with pytest.raises(ValueError, match="prompts"):
        choose_prefix_len([], 4)
    with pytest.raises(ValueError, match="group_size"):
        plan_prefill(PROMPTS, group_size=0, capacity=3)


def test_the_prefill_action_runs_only_where_shared_prefixes_save_more_than_it_costs():
    total = sum(len(p) for p in PROMPTS.values())  # 28 tokens, each prompt once
    shared = plan_prefill(PROMPTS, group_size=4, capacity=3)  # L = 4
    assert total - shared.tokens_computed == 4 + 4  # (1,2,3,4) and (9,9,9,1), each shared by two
    assert prefill_action_pays(shared, total, seconds_per_token=0.01, fixed_s=0.05)  # 0.08 s saved
    assert not prefill_action_pays(shared, total, seconds_per_token=0.01, fixed_s=0.10)
    # capacity for every prompt: L is the longest prompt, nothing is shared across prompts,
    # and the generation actions' own per-group dedup computes the same tokens
    whole = plan_prefill(PROMPTS, group_size=4, capacity=64)
    assert whole.tokens_computed == total
    assert not prefill_action_pays(whole, total, seconds_per_token=1.0, fixed_s=0.0)
    assert not prefill_action_pays(plan_prefill(PROMPTS, 4, capacity=1), total, 1.0, 0.0)  # no L at all
    with pytest.raises(ValueError, match="seconds_per_token"):
        prefill_action_pays(shared, total, seconds_per_token=0.0, fixed_s=0.0)
