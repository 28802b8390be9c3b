"""Tiny-model tests of the torch engine: cached == uncached, dedup, fan-out and cut invariance."""

from __future__ import annotations

import pytest
import torch
from reference_sampler import uncached_sample

from actions.engines.base import GenerationParams
from actions.engines.torch_engine import SampleSpec, TorchEngine
from actions.models.modeling import build_tiny_model
from actions.tasks.repeat import make_rows


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    model, tok = build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                  max_positions=128, seed=0)
    model.eval()
    engine = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    rows = make_rows(6, max_count=9, seed=3)
    specs = [SampleSpec(r.prompt_id, i, tuple(tok(r.prompt)["input_ids"])) for r in rows for i in range(3)]
    return model, tok, engine, specs


def _gen(engine, specs, prefixes=None, **kw):
    params = GenerationParams(**{"seed": 7, "step": 2, "max_new_tokens": 12, "temperature": 1.0, **kw})
    outs, stats = engine.generate(specs, params, prefixes=prefixes)
    return {(o.prompt_id, o.sample_index): o for o in outs}, stats


def test_kv_cached_sampling_equals_uncached_forward(setup):
    model, tok, engine, specs = setup
    outs, _ = _gen(engine, specs)
    for s in specs:
        assert outs[(s.prompt_id, s.sample_index)].tokens == uncached_sample(model, s, tok.eos_token_id, 12, seed=7, step=2)


def test_dedup_prefill_reproduces_per_sample_prefill_and_saves_tokens(setup):
    _, _, engine, specs = setup
    a, sa = _gen(engine, specs, dedup=True)
    b, sb = _gen(engine, specs, dedup=False)
    assert {k: v.tokens for k, v in a.items()} == {k: v.tokens for k, v in b.items()}
    # 6 prompts x 3 samples: dedup prefills each prompt once.
    assert sb.prefill_tokens == 3 * sa.prefill_tokens


def test_stacking_states_left_pads_each_row_and_shared_rows_do_not_alias(setup):
    from actions.engines.kv_state import stack_logits, stack_states

    _, _, engine, specs = setup
    seqs = [specs[0].prompt_tokens, specs[3].prompt_tokens + (5, 6)]
    (a, b), _ = engine.prefill(seqs)
    rows = [a, b, a, a, b]  # rows of two groups, as deduplicated prefill hands them out
    width = max(a.length, b.length)
    cache, mask = stack_states(rows)
    for r, st in enumerate(rows):
        pad = width - st.length
        assert mask[r].tolist() == [0] * pad + [1] * st.length
        for layer, (k, v) in zip(cache.layers, st.kv):
            assert torch.equal(layer.keys[r, :, pad:], k) and torch.equal(layer.values[r, :, pad:], v)
            assert not layer.keys[r, :, :pad].any() and not layer.values[r, :, :pad].any()
    assert torch.equal(stack_logits(rows), torch.stack([st.last_logits for st in rows]))
    assert cache.get_seq_length() == width
    before = cache.layers[0].keys[2].clone()
    cache.layers[0].keys[0].zero_()  # the cache is edited per row later: one row's edit stays its own
    assert torch.equal(cache.layers[0].keys[2], before) and torch.equal(a.kv[0][0], before[:, width - a.length:])


def test_fanout_split_gives_same_samples(setup):
    _, _, engine, specs = setup
    whole, _ = _gen(engine, specs)
    parts = {}
    for chunk in (specs[:5], specs[5:11], specs[11:]):
        parts.update(_gen(engine, chunk)[0])
    assert {k: v.tokens for k, v in whole.items()} == {k: v.tokens for k, v in parts.items()}


def test_cut_then_continue_reproduces_uncut_run(setup):
    _, _, engine, specs = setup
    # A random model rarely emits EOS: give it room so samples finish at different steps.
    whole, _ = _gen(engine, specs, max_new_tokens=60)
    cut, _ = _gen(engine, specs, cut_after=4, max_new_tokens=60)
    partial = [SampleSpec(s.prompt_id, s.sample_index, s.prompt_tokens, tuple(cut[(s.prompt_id, s.sample_index)].tokens))
               for s in specs if cut[(s.prompt_id, s.sample_index)].finish_reason == "cut"]
    assert partial, "the cut should leave unfinished samples"
    cont, _ = _gen(engine, partial, max_new_tokens=60)
    merged = {k: v for k, v in cut.items() if v.finish_reason != "cut"} | cont
    assert {k: v.tokens for k, v in merged.items()} == {k: v.tokens for k, v in whole.items()}


def test_prefix_bundle_path_matches_plain_prefill(setup):
    _, _, engine, specs = setup
    template = specs[0].prompt_tokens[:20]
    states, computed = engine.prefill([template])
    assert computed == 20
    a, sa = _gen(engine, specs, prefixes={template: states[0]})
    b, _ = _gen(engine, specs)
    assert {k: v.tokens for k, v in a.items()} == {k: v.tokens for k, v in b.items()}


def test_a_bundle_of_another_version_is_refused_after_a_warm_load(setup, tmp_path):
    """The version check holds on a warm-cache hit too: a container that loaded a bundle for
    version 3 refuses it when asked for version 4, on every call."""
    from actions.engines.kv_bundle import load_bundle, publish_bundle
    from actions.store import LocalStore

    _, _, engine, specs = setup
    states, _ = engine.prefill([specs[0].prompt_tokens[:8]])
    store = LocalStore(tmp_path / "store")
    key = "runs/r/kv/000001/manifest.json"
    publish_bundle(store, key, states, policy_version=3)
    assert list(load_bundle(store, key, 3)) == [specs[0].prompt_tokens[:8]]  # now warm
    for _ in range(2):
        with pytest.raises(ValueError, match="policy version 3, not 4"):
            load_bundle(store, key, 4)
    assert list(load_bundle(store, key, 3)) == [specs[0].prompt_tokens[:8]]


def test_prompt_equal_to_a_cached_prefix_beside_prompts_that_extend_it(setup):
    """One prompt is exactly the bundle's prefix, others extend it: both kinds in one call."""
    _, _, engine, specs = setup
    template = specs[0].prompt_tokens[:20]
    states, _ = engine.prefill([template])
    short = [SampleSpec(99, i, template) for i in range(2)]
    mixed = short + list(specs)
    a, sa = _gen(engine, mixed, prefixes={template: states[0]})
    b, _ = _gen(engine, mixed)
    assert {k: v.tokens for k, v in a.items()} == {k: v.tokens for k, v in b.items()}
    assert sa.prefill_tokens == sum(len(s.prompt_tokens) - 20 for s in specs[::3])  # the template is not recomputed


def test_greedy_is_seed_independent(setup):
    _, _, engine, specs = setup
    a, _ = _gen(engine, specs, temperature=0.0, seed=1)
    b, _ = _gen(engine, specs, temperature=0.0, seed=99)
    assert {k: v.tokens for k, v in a.items()} == {k: v.tokens for k, v in b.items()}


FILTERS = {"top_k": 10, "top_p": 0.9}  # on the 51-token tiny vocabulary both filters bite


def test_top_k_top_p_sampling_equals_the_filtered_uncached_reference(setup):
    model, tok, engine, specs = setup
    outs, _ = _gen(engine, specs, **FILTERS)
    plain, _ = _gen(engine, specs)
    assert {k: v.tokens for k, v in outs.items()} != {k: v.tokens for k, v in plain.items()}
    for s in specs:
        ref = uncached_sample(model, s, tok.eos_token_id, 12, seed=7, step=2, **FILTERS)
        assert outs[(s.prompt_id, s.sample_index)].tokens == ref


def test_cut_then_continue_with_top_k_top_p_reproduces_uncut_run(setup):
    _, _, engine, specs = setup
    kw = {"max_new_tokens": 60, **FILTERS}
    whole, _ = _gen(engine, specs, **kw)
    cut, _ = _gen(engine, specs, cut_after=4, **kw)
    partial = [SampleSpec(s.prompt_id, s.sample_index, s.prompt_tokens, tuple(cut[(s.prompt_id, s.sample_index)].tokens))
               for s in specs if cut[(s.prompt_id, s.sample_index)].finish_reason == "cut"]
    assert partial, "the cut should leave unfinished samples"
    cont, _ = _gen(engine, partial, **kw)
    merged = {k: v for k, v in cut.items() if v.finish_reason != "cut"} | cont
    assert {k: (v.tokens, v.finish_reason) for k, v in merged.items()} == \
        {k: (v.tokens, v.finish_reason) for k, v in whole.items()}


@pytest.mark.parametrize("speculate", [False, True])
@pytest.mark.parametrize("kv_cache", ["static", "dynamic"])
def test_a_continuation_already_at_max_new_tokens_comes_back_as_it_is(setup, kv_cache, speculate):
    """Its next draw would pass the limit: it finishes as "length" with nothing drawn, and the
    call's other samples are the uncut run's (a cut counts it as finished)."""
    from actions.engines.speculative import Speculation

    model, tok, _, specs = setup
    engine = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kv_cache=kv_cache)
    spec = Speculation(strategies=("prompt_lookup",), fixed=("prompt_lookup", 3)) if speculate else None
    whole, _ = _gen(engine, specs)
    at_limit = [s for s in specs if whole[(s.prompt_id, s.sample_index)].finish_reason == "length"][:2]
    assert len(at_limit) == 2
    full = [SampleSpec(s.prompt_id, s.sample_index, s.prompt_tokens, tuple(whole[(s.prompt_id, s.sample_index)].tokens))
            for s in at_limit]
    over = [SampleSpec(s.prompt_id, s.sample_index, s.prompt_tokens, s.generated + (5,)) for s in full[:1]]
    rest = [s for s in specs if s not in at_limit]
    mixed = [rest[0], *full, *rest[1:]]
    for params in ({}, {"cut_after": 2}):
        outs, _ = engine.generate(mixed, GenerationParams(**{"seed": 7, "step": 2, "max_new_tokens": 12,
                                                                 "temperature": 1.0, **params}), speculation=spec)
        assert [(o.prompt_id, o.sample_index) for o in outs] == [(s.prompt_id, s.sample_index) for s in mixed]
        for o, s in zip(outs, mixed):
            want = whole[(s.prompt_id, s.sample_index)]
            if s in full:
                assert (o.tokens, o.finish_reason, o.stop_token) == (list(s.generated), "length", None)
            elif params:  # both full samples count toward the cut: the others draw once, then stop
                assert o.tokens == want.tokens[: len(o.tokens)] and len(o.tokens) <= 1
            else:
                assert (o.tokens, o.finish_reason, o.stop_token) == (want.tokens, want.finish_reason, want.stop_token)
    only, stats = engine.generate(full + over, GenerationParams(seed=7, step=2, max_new_tokens=12, temperature=1.0))
    assert [(o.tokens, o.finish_reason) for o in only] == [(list(s.generated), "length") for s in full + over]
    assert stats.prefill_tokens == 0 and stats.decode_steps == 0
