"""Models with sliding-window attention on the torch engine: tokens equal the uncached reference.

Mistral (every layer windowed), Gemma 2 and 3 (windowed and full layers alternating), Qwen2
and Qwen3 with ``use_sliding_window`` (the later layers windowed), each a tiny random model with
an 8-token window, prompts of 16 to 34 tokens and 24 new tokens: prefill and decoding both run
past the window. Hugging Face counts the window in cache columns (``kv_state.sliding_window``), so the
engine must hold every column (no cache of Hugging Face's own, which keeps window - 1) and
keep each row's tokens in consecutive columns: after a KV bundle's prefix, and after a
speculative round's rejected drafts.
"""

from __future__ import annotations

import pytest
import torch
from llama_family import tiny_causal_lm
from reference_sampler import uncached_sample
from transformers import Gemma2Config, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.kv_state import sliding_window
from actions.engines.speculative import Speculation
from actions.engines.torch_engine import TorchEngine
from actions.tasks.repeat import make_rows

WINDOW = 8
NEW = 24
KW = {"seed": 7, "step": 2, "max_new_tokens": NEW, "temperature": 1.0}
FAMILIES = {
    "mistral": (MistralConfig, {"num_key_value_heads": 2, "sliding_window": WINDOW}),
    "gemma2": (Gemma2Config, {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": WINDOW}),
    "gemma3": (Gemma3TextConfig, {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": WINDOW,
                                  "layer_types": ["sliding_attention", "full_attention"]}),
    "qwen2": (Qwen2Config, {"num_key_value_heads": 2, "use_sliding_window": True, "sliding_window": WINDOW,
                            "max_window_layers": 1}),
    "qwen3": (Qwen3Config, {"num_key_value_heads": 2, "head_dim": 16, "use_sliding_window": True,
                            "sliding_window": WINDOW, "max_window_layers": 1}),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    torch.set_num_threads(1)
    cls, extra = FAMILIES[request.param]
    model, tok = tiny_causal_lm(cls, seed=1, initializer_range=0.3, **extra)  # sharp: a wrong window shows
    assert sliding_window(model) == WINDOW
    rows = make_rows(4, max_count=9, seed=3)
    # prompts of different lengths, all past the window; two samples each
    specs = [SampleSpec(r.prompt_id, i, tuple(tok(r.prompt)["input_ids"])[: 16 + 6 * r.prompt_id])
             for r in rows for i in range(2)]
    reference = {(s.prompt_id, s.sample_index): uncached_sample(model, s, tok.eos_token_id, NEW, seed=7, step=2)
                 for s in specs}
    return model, tok, specs, reference


def _gen(engine, specs, **options):
    params = GenerationParams(**{**KW, **{k: v for k, v in options.items() if k in ("dedup", "cut_after")}})
    extra = {k: v for k, v in options.items() if k in ("prefixes", "speculation")}
    outs, stats = engine.generate(specs, params, **extra)
    return {(o.prompt_id, o.sample_index): o for o in outs}, stats


def _tokens(outs):
    return {k: o.tokens for k, o in outs.items()}


def _engine(model, tok, kv_cache="static"):
    return TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kv_cache=kv_cache)


def test_the_window_is_detected_only_where_a_layer_slides():
    assert sliding_window(tiny_causal_lm(LlamaConfig)[0]) is None
    assert sliding_window(tiny_causal_lm(MistralConfig, sliding_window=None)[0]) is None
    assert sliding_window(tiny_causal_lm(Qwen2Config)[0]) is None  # use_sliding_window off
    # windowed from layer 2 on, of 2 layers: no layer slides
    assert sliding_window(tiny_causal_lm(Qwen2Config, use_sliding_window=True, sliding_window=4,
                                         max_window_layers=2)[0]) is None


def test_the_reference_depends_on_the_window(family):
    """The cases below would pass with a window ignored only if it changed nothing: it does."""
    model, tok, specs, reference = family
    unwindowed = TorchEngine(_full_attention_twin(model), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    assert _tokens(_gen(unwindowed, specs)[0]) != reference


def _full_attention_twin(model):
    """The same weights with a window wider than any context here."""
    cfg = model.config.to_dict()
    cfg["sliding_window"] = 4096
    twin = type(model)(type(model.config).from_dict(cfg)).eval()
    twin.load_state_dict(model.state_dict())
    return twin


@pytest.mark.parametrize("dedup", [True, False])
@pytest.mark.parametrize("kv_cache", ["static", "dynamic"])
def test_prompts_longer_than_the_window_equal_the_uncached_reference(family, dedup, kv_cache):
    model, tok, specs, reference = family
    engine = _engine(model, tok, kv_cache)
    assert not engine.static  # the static cache does not run windowed layers: the dynamic path does
    assert _tokens(_gen(engine, specs, dedup=dedup)[0]) == reference


def test_a_kv_bundle_prefix_longer_than_the_window_equals_the_reference(family):
    """Suffixes of different lengths after a 12-token prefix share one call: padding between
    prefix and suffix would count in the window."""
    model, tok, specs, reference = family
    engine = _engine(model, tok)
    template = specs[0].prompt_tokens[:12]
    assert all(s.prompt_tokens[:12] == template for s in specs)
    states, _ = engine.prefill([template])
    outs, stats = _gen(engine, specs, prefixes={template: states[0]})
    assert _tokens(outs) == reference
    assert stats.prefill_tokens == sum(len(s.prompt_tokens) - 12 for s in specs[::2])
    # the states themselves, which a lucky draw could hide: as a prefill from scratch computes them
    prompts = [s.prompt_tokens for s in specs[::2]]
    for whole, extended in zip(engine.prefill(prompts)[0], engine.prefill(prompts, {template: states[0]})[0]):
        assert torch.allclose(whole.last_logits, extended.last_logits, atol=1e-5)
        assert all(torch.allclose(a, b, atol=1e-5) for pa, pb in zip(whole.kv, extended.kv) for a, b in zip(pa, pb))


@pytest.mark.parametrize("fixed", [("history", 4), ("prompt_lookup", 3)])
def test_speculative_rounds_with_ragged_acceptance_equal_the_reference(family, fixed):
    model, tok, specs, reference = family
    engine = _engine(model, tok)
    # sample 0's own response drafts right all the way, sample 1's only for its first 6 tokens
    history = {pid: [reference[(pid, 0)], reference[(pid, 1)][:6]] for pid in {s.prompt_id for s in specs}}
    outs, stats = _gen(engine, specs, speculation=Speculation(history=history, fixed=fixed))
    assert _tokens(outs) == reference
    if fixed[0] == "history":
        assert 0 < stats.spec["accepted"] < stats.spec["proposed"]


@pytest.mark.parametrize("speculate", [False, True])
@pytest.mark.parametrize("prefixed", [False, True])
def test_continuations_past_the_window_equal_the_reference(family, prefixed, speculate):
    """Samples cut after 3 to 15 tokens continue from prompt + tokens so far, longer than the
    window, in one call (a KV bundle's prefix under them or not)."""
    model, tok, specs, reference = family
    engine = _engine(model, tok)
    partial = []
    for j, s in enumerate(specs):
        done = reference[(s.prompt_id, s.sample_index)]
        so_far = tuple(done[: min(3 + 2 * j, len(done))])
        partial.append(SampleSpec(s.prompt_id, s.sample_index, s.prompt_tokens, so_far))
    options = {}
    if prefixed:
        template = specs[0].prompt_tokens[:12]
        options["prefixes"] = {template: engine.prefill([template])[0][0]}
    if speculate:
        options["speculation"] = Speculation(strategies=("prompt_lookup",), fixed=("prompt_lookup", 3))
    assert _tokens(_gen(engine, partial, **options)[0]) == reference
