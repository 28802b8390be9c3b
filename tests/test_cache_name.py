"""The engines pass a forward's KV cache by the name the installed transformers uses
(``actions/models/cache_name.py``): no deprecation warning in an action's log."""

from __future__ import annotations

import dataclasses
import logging
import warnings

import pytest
import torch
from llama_family import SHAPES, tiny_causal_lm
from transformers.modeling_outputs import CausalLMOutputWithPast

from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.speculative import Speculation
from actions.engines.torch_engine import TorchEngine
from actions.models.cache_name import CACHE, cache_of, with_cache


def test_the_name_is_the_output_classs_own():
    fields = {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
    assert CACHE in fields and CACHE in ("cache", "past_key_values")
    assert with_cache("c") == {CACHE: "c"}
    assert cache_of(CausalLMOutputWithPast(**{CACHE: "c"})) == "c"


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_generation_warns_of_no_deprecated_cache_name(kv_cache, caplog):
    """Prefill, plain decoding and speculative rounds on both cache paths, with every
    FutureWarning an error and transformers' own log captured."""
    torch.manual_seed(0)
    cls, extra = SHAPES["qwen2-gqa"]
    model, tok = tiny_causal_lm(cls, **extra)
    engine = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kv_cache=kv_cache)
    prompt = tuple(tok("ccc ccc ccc")["input_ids"])
    specs = [SampleSpec(p, i, prompt + (p + 5,)) for p in range(3) for i in range(2)]
    params = GenerationParams(seed=1, step=0, max_new_tokens=6, temperature=1.0)
    speculation = Speculation(strategies=("prompt_lookup",), fixed=("prompt_lookup", 3))
    # transformers logs each deprecation once per process (an lru_cache on Logger.warning_once):
    # forget what an earlier test logged, so that this one sees its own
    once = getattr(logging.Logger, "warning_once", None)
    if once is not None and hasattr(once, "cache_clear"):
        once.cache_clear()
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="transformers"):
        warnings.simplefilter("error", FutureWarning)
        outs, _ = engine.generate(specs, params)
        spec, _ = engine.generate(specs, params, speculation=speculation)
    assert len(outs) == len(spec) == len(specs)
    assert not [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
