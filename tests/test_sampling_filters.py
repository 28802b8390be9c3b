"""Top-k and top-p (nucleus) sampling: what is kept, what is drawn, and that off is today's rule.

The filters act on the logits before the counter-based Gumbel noise (``sampling.py``), so a draw
is still a pure function of (logits, key, position). Engine-level exactness with filters (cut and
continue, speculative decoding, the uncached reference) is in test_engine.py, test_speculative.py
and test_engine_contract.py.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from actions.config.workload import GenerationConfig
from actions.contracts import GenerateRequest
from actions.engines.sampling import (
    filter_logits,
    gumbel_noise,
    sample_next,
    stream_key,
)
from actions.engines.vllm_engine import vllm_available
from flows.config import CampaignConfig

FILTERS = [(1, None), (5, None), (40, None), (None, 0.3), (None, 0.8), (None, 0.97), (8, 0.6), (3, 0.99)]


def _batch(rows: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random logits with some spread, one stream key per row, scattered positions."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 3.0
    keys = torch.tensor([stream_key(seed, 1, r, r % 3) for r in range(rows)])
    positions = torch.randint(0, 500, (rows,), generator=g)
    return logits, keys, positions


def _kept_reference(scaled_row: list[float], top_k: int | None, top_p: float | None) -> set[int]:
    """The kept set by the documented rule, in plain Python floats (float64)."""
    idx = list(range(len(scaled_row)))
    if top_k:
        kth = sorted(scaled_row, reverse=True)[top_k - 1]
        idx = [i for i in idx if scaled_row[i] >= kth]
    if top_p is not None and top_p < 1.0:
        top = max(scaled_row[i] for i in idx)
        weights = {i: math.exp(scaled_row[i] - top) for i in idx}
        total = sum(weights.values())
        mass, floor = 0.0, None
        for i in sorted(idx, key=lambda i: -scaled_row[i]):
            floor = scaled_row[i]
            mass += weights[i] / total
            if mass >= top_p:
                break
        idx = [i for i in idx if scaled_row[i] >= floor]
    return set(idx)


@pytest.mark.parametrize(("top_k", "top_p"), FILTERS)
@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
def test_kept_set_follows_the_rule_and_every_draw_is_inside_it(top_k, top_p, temperature):
    logits, keys, positions = _batch(64, 120, seed=11)
    scaled = logits.float() / temperature
    kept = torch.isfinite(filter_logits(scaled, top_k, top_p))
    for r in range(logits.shape[0]):
        want = _kept_reference(scaled[r].double().tolist(), top_k, top_p)
        assert set(torch.nonzero(kept[r]).flatten().tolist()) == want, r
    # many keys and positions over the same rows: never a token outside the kept set
    for shift in range(25):
        tok = sample_next(logits, keys, positions + 37 * shift, temperature, top_k, top_p)
        assert kept[torch.arange(64), tok].all(), shift


def test_ties_with_the_boundary_are_kept_and_the_set_ignores_token_order():
    row = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.0, 2.0]])
    assert torch.isfinite(filter_logits(row, 1, None)).tolist() == [[False, True, False, True, False, False]]
    assert torch.isfinite(filter_logits(row, 3, None)).tolist() == [[False, True, True, True, False, True]]
    # p(3) = 0.355 each: 0.5 needs both 3s; 0.75 needs a 2, and its twin comes along
    assert torch.isfinite(filter_logits(row, None, 0.5)).tolist() == [[False, True, False, True, False, False]]
    assert torch.isfinite(filter_logits(row, None, 0.75)).tolist() == [[False, True, True, True, False, True]]
    logits, _, _ = _batch(8, 50, seed=3)
    perm = torch.randperm(50, generator=torch.Generator().manual_seed(0))
    for top_k, top_p in FILTERS:
        a = torch.isfinite(filter_logits(logits, top_k, top_p))
        b = torch.isfinite(filter_logits(logits[:, perm], top_k, top_p))
        assert torch.equal(a[:, perm], b), (top_k, top_p)


@pytest.mark.parametrize(("top_k", "top_p", "temperature"), [(3, None, 1.0), (None, 0.7, 1.0), (5, 0.8, 0.8),
                                                             (None, 0.9, 1.5)])
def test_draws_follow_the_renormalised_filtered_softmax(top_k, top_p, temperature):
    vocab, draws = 10, 40_000
    logits = torch.tensor([[2.0, 1.5, 1.2, 1.0, 0.7, 0.5, 0.2, 0.0, -0.5, -1.0]])
    scaled = filter_logits(logits / temperature, top_k, top_p)[0].double()
    expected = torch.softmax(scaled, dim=-1)  # zero outside the kept set
    kept = int(torch.isfinite(scaled).sum())
    assert 1 < kept < vocab  # the filter does something and leaves a distribution
    keys = torch.tensor([stream_key(5, 0, i, 0) for i in range(draws)])
    tok = sample_next(logits.expand(draws, vocab), keys, torch.zeros(draws, dtype=torch.long), temperature,
                      top_k, top_p)
    counts = torch.bincount(tok, minlength=vocab).double()
    assert (counts[expected == 0] == 0).all()
    e = expected[expected > 0] * draws
    chi2 = float(((counts[expected > 0] - e) ** 2 / e).sum())
    df = kept - 1
    # 0.1% tail of chi-square with df <= 9 is below df + 4.5 sqrt(2 df) + 4; fixed keys, so no flakes
    assert chi2 < df + 4.5 * math.sqrt(2 * df) + 4, (chi2, df)


def test_filters_off_are_bit_identical_to_the_unfiltered_rule():
    logits, keys, positions = _batch(32, 1000, seed=5)
    for temperature in (0.5, 1.0, 2.0):
        today = (logits.float() / temperature + gumbel_noise(keys, positions, 1000)).argmax(dim=-1)
        for top_k, top_p in [(None, None), (0, None), (1000, None), (5000, 1.0), (None, 1.0)]:
            assert torch.equal(sample_next(logits, keys, positions, temperature, top_k, top_p), today)
        assert torch.equal(sample_next(logits, keys, positions, temperature), today)
        assert filter_logits(logits, None, None) is logits


def test_filtering_only_redraws_the_tokens_it_removed_and_greedy_ignores_it():
    logits, keys, positions = _batch(256, 300, seed=9)
    plain = sample_next(logits, keys, positions, 1.0)
    moved = 0
    for top_k, top_p in FILTERS:
        kept = torch.isfinite(filter_logits(logits.float(), top_k, top_p))
        tok = sample_next(logits, keys, positions, 1.0, top_k, top_p)
        inside = kept[torch.arange(256), plain]
        # Gumbel-max: removing competitors never changes a draw that survived the filter
        assert torch.equal(tok[inside], plain[inside])
        moved += int((~inside).sum())
        assert torch.equal(sample_next(logits, keys, positions, 0.0, top_k, top_p), logits.argmax(dim=-1))
    assert moved > 0


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(("field", "value", "needles"), [
    ("top_k", -1, ("generation.top_k=-1", "integer >= 1", "0 / null")),
    ("top_p", 0.0, ("generation.top_p=0.0", "(0, 1]", "1.0 / null")),
    ("top_p", 1.5, ("generation.top_p=1.5", "e.g. 0.9")),
    ("top_p", float("nan"), ("top_p", "finite number")),  # every config float is finite or refused
])
def test_bad_filter_settings_name_the_field_value_and_fix(field, value, needles):
    with pytest.raises(ValidationError) as err:
        GenerationConfig(**{field: value})
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_off_values_normalise_and_set_filters_are_part_of_the_run_identity():
    assert GenerationConfig(top_k=0, top_p=1.0).top_k is None
    assert GenerationConfig(top_k=0, top_p=1.0).top_p is None
    base = CampaignConfig()
    off = CampaignConfig.model_validate({"generation": {"top_k": 0, "top_p": 1.0}})
    assert "top_k" not in base.identity()["generation"]  # fingerprints of runs without filters unchanged
    assert off.fingerprint() == base.fingerprint()
    on = CampaignConfig.model_validate({"generation": {"top_k": 50, "top_p": 0.9}})
    assert (on.identity()["generation"]["top_k"], on.identity()["generation"]["top_p"]) == (50, 0.9)
    assert on.fingerprint() != base.fingerprint()
    assert CampaignConfig.model_validate({"generation": {"top_p": 0.95}}).fingerprint() != on.fingerprint()


def test_generate_request_rejects_filters_out_of_range():
    kw = {"model": {"store_uri": "s", "base_key": "b", "policy_key": "p", "policy_version": 0}, "dataset_key": "d",
          "run_seed": 0, "step": 0, "shard": "g", "max_new_tokens": 4, "temperature": 1.0, "output_key": "o"}
    assert GenerateRequest(**kw, top_k=4, top_p=0.5).top_k == 4
    for field, value in (("top_k", 0), ("top_k", -3), ("top_p", 0.0), ("top_p", 1.2)):
        with pytest.raises(ValidationError) as err:
            GenerateRequest(**kw, **{field: value})
        assert [e["loc"] for e in err.value.errors()] == [(field,)]


# ----------------------------------------------------------------------------- vLLM processor


def _load_vllm_worker():
    """``vllm_worker`` under a private name; where vLLM is missing, on stand-ins for the few
    vLLM names it imports (the processor's arithmetic is plain torch)."""
    path = Path(__file__).resolve().parents[1] / "actions" / "engines" / "vllm_worker.py"
    saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
    if not vllm_available():
        stubs = {"vllm.model_executor.layers.vocab_parallel_embedding": {
                     "ParallelLMHead": type("ParallelLMHead", (), {}),
                     "VocabParallelEmbedding": type("VocabParallelEmbedding", (), {})},
                 "vllm.v1.sample.logits_processor": {"BatchUpdate": object, "LogitsProcessor": object},
                 "vllm.v1.sample.logits_processor.builtin": {"process_dict_updates": lambda *a: None}}
        for name, attrs in stubs.items():
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
            sys.modules[name].__dict__.update(attrs)
    try:
        spec = importlib.util.spec_from_file_location("_vllm_worker_under_test", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        for k in [k for k in sys.modules if (k == "vllm" or k.startswith("vllm.")) and k not in saved]:
            del sys.modules[k]


def test_vllm_noise_processor_draws_what_sample_next_draws_with_filters():
    w = _load_vllm_worker()
    logits, keys, positions = _batch(5, 200, seed=13)
    logits = logits / 3  # flat rows: the filters remove tokens that would be drawn
    settings = {0: (1.0, 10, None), 2: (0.8, None, 0.5), 3: (1.3, 6, 0.9), 4: (1.0, None, None)}  # row 1: greedy
    proc = w.CounterNoiseLogitsProcessor(None, torch.device("cpu"), False)
    for row, (temperature, top_k, top_p) in settings.items():
        params = types.SimpleNamespace(extra_args={
            w.KEY_ARG: int(keys[row]), w.OFFSET_ARG: int(positions[row]) - 2, w.TEMPERATURE_ARG: temperature,
            w.TOP_K_ARG: top_k, w.TOP_P_ARG: top_p})
        proc.rows[row] = w.CounterNoiseLogitsProcessor._new_row(params, None, [11, 12])  # 2 tokens drawn so far
    greedy = types.SimpleNamespace(extra_args={w.KEY_ARG: 1, w.TEMPERATURE_ARG: 0.0, w.TOP_K_ARG: 3})
    assert w.CounterNoiseLogitsProcessor._new_row(greedy, None, []) is None
    drawn = proc.apply(logits.clone()).argmax(dim=-1)  # vLLM then runs greedy
    for row in range(5):
        temperature, top_k, top_p = settings.get(row, (0.0, None, None))
        want = sample_next(logits[row:row + 1], keys[row:row + 1], positions[row:row + 1], temperature, top_k, top_p)
        assert int(drawn[row]) == int(want[0]), row
    unfiltered = [int(sample_next(logits[r:r + 1], keys[r:r + 1], positions[r:r + 1], settings[r][0])[0])
                  for r in (0, 2, 3)]
    assert unfiltered != [int(drawn[r]) for r in (0, 2, 3)]  # the filters decided some of these draws
