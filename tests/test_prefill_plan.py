"""Prefill calls per length bucket: the pure planner, and the engine's samples unchanged by it."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.prefill_plan import plan_prefill_calls
from actions.engines.torch_engine import TorchEngine
from actions.models.modeling import build_tiny_model


def _cost(lengths, groups, call_tokens):
    return len(groups) * call_tokens + sum(len(g) * max(lengths[i] for i in g) for g in groups)


def _brute_force(lengths, call_tokens):
    """The cheapest split of the length-sorted sequences into contiguous runs."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = None
    for cuts in itertools.product((False, True), repeat=len(order) - 1):
        groups, cur = [], [order[0]]
        for c, i in zip(cuts, order[1:]):
            if c:
                groups.append(cur)
                cur = []
            cur.append(i)
        groups.append(cur)
        cost = _cost(lengths, groups, call_tokens)
        best = cost if best is None else min(best, cost)
    return best


def test_every_sequence_lands_in_exactly_one_call_in_length_order():
    lengths = [40, 600, 45, 580, 300, 41, 600]
    groups = plan_prefill_calls(lengths, call_tokens=64)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(g == sorted(g) for g in groups)
    spans = [(min(lengths[i] for i in g), max(lengths[i] for i in g)) for g in groups]
    assert spans == sorted(spans) and all(a[1] < b[0] for a, b in zip(spans, spans[1:]))
    assert spans == [(40, 45), (300, 300), (580, 600)]


def test_the_price_of_a_call_sets_how_far_buckets_merge():
    lengths = [40, 600, 45, 580, 300, 41, 600]
    assert plan_prefill_calls(lengths, 0) == [[0], [5], [2], [4], [3], [1, 6]]  # one call per length
    assert plan_prefill_calls(lengths, float("inf")) == [list(range(7))]
    assert plan_prefill_calls(lengths, 1e6) == [list(range(7))]  # a GPU-like price: all in one
    assert plan_prefill_calls([], 64) == []
    assert plan_prefill_calls([7, 7, 7], 0) == [[0, 1, 2]]


@pytest.mark.parametrize("seed", range(6))
def test_the_split_is_optimal(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(5, 30), rng.randint(200, 260), rng.randint(500, 700)]) for _ in range(9)]
    for price in (0, 16, 64, 500, 5000):
        groups = plan_prefill_calls(lengths, price)
        assert _cost(lengths, groups, price) == _brute_force(lengths, price), (lengths, price)


def test_bucketed_prefill_generates_the_samples_of_one_padded_call():
    torch.set_num_threads(1)
    model, tok = build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                  max_positions=512, seed=0)
    model.eval()
    prompts = ["abc", "abcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabc" * 3, "ab", "cab" * 40]
    specs = [SampleSpec(p, i, tuple(tok(text)["input_ids"])) for p, text in enumerate(prompts) for i in range(2)]
    params = GenerationParams(seed=3, step=1, max_new_tokens=10, temperature=1.0)
    outs = {}
    for price in (float("inf"), 0.0, 64.0):
        engine = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
        engine.prefill_call_tokens = price
        got, stats = engine.generate(specs, params)
        outs[price] = [(o.prompt_id, o.sample_index, o.tokens, o.finish_reason) for o in got]
        assert stats.prefill_tokens == sum(len(tok(t)["input_ids"]) for t in prompts)  # dedup: once per prompt
        if price == 0.0:
            assert engine.prefill_calls == 4  # four distinct lengths
        if price == float("inf"):
            assert engine.prefill_calls == 1
    assert outs[0.0] == outs[float("inf")] == outs[64.0]
