"""Speculative decoding on the static KV cache equals plain decoding token for token (CPU, fp32).

Grouped and plain KV heads, history drafts that are right, partly right (ragged acceptance:
holes in the cache) and wrong, prompt lookup, the selector's own choices, greedy and top-k /
top-p, padded batch buckets with idle rows, cuts mid-round and their continuation, packing
of the holes, and the GPU's verification round (every column drawn inside the round, read
back once) run eagerly here.
"""

from __future__ import annotations

import pytest
import torch
from llama_family import SHAPES, tiny_causal_lm
from transformers import AutoModelForCausalLM, LlamaConfig

from actions.engines import static_decode, static_speculative
from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.kv_state import PrefixState
from actions.engines.speculative import Speculation
from actions.engines.static_decode import runtime_for
from actions.engines.static_kv import StaticKV
from actions.engines.torch_engine import TorchEngine
from actions.tasks.repeat import make_rows

KW = {"seed": 7, "step": 2, "max_new_tokens": 24, "temperature": 1.0}


MODELS = {name: SHAPES[name] for name in ("llama", "qwen2-gqa", "qwen3-gqa")}


@pytest.fixture(scope="module", params=sorted(MODELS))
def setup(request):
    torch.set_num_threads(1)
    cls, extra = MODELS[request.param]
    model, tok = tiny_causal_lm(cls, seed=1, **extra)
    rows = make_rows(5, max_count=9, seed=3)
    specs = [SampleSpec(r.prompt_id, i, tuple(tok(r.prompt)["input_ids"])) for r in rows for i in range(3)]
    dynamic = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kv_cache="dynamic")
    plain = {st: _gen(dynamic, specs, step=st)[0] for st in (2, 5)}
    return model, tok, specs, plain


def _engine(model, tok, **kw):
    engine = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, **kw)
    assert engine.static
    return engine


def _gen(engine, specs, speculation=None, **kw):
    outs, stats = engine.generate(specs, GenerationParams(**{**KW, **kw}), speculation=speculation)
    return {(o.prompt_id, o.sample_index): (o.tokens, o.finish_reason, o.stop_token) for o in outs}, stats


def _history(plain, short_odd: bool):
    """Responses of an 'earlier epoch' per prompt. From the step generated (2) every draft is
    right; with ``short_odd`` odd prompts' responses are cut to 5 tokens, so their rows run out
    of right drafts while others still accept (ragged rounds, holes)."""
    hist: dict[int, list[list[int]]] = {}
    for (pid, _), (toks, _, stop) in sorted(plain.items()):
        full = toks + ([stop] if stop is not None else [])
        hist.setdefault(pid, []).append(full[:5] if short_odd and pid % 2 else full)
    return hist


@pytest.mark.parametrize("case", ["right-ragged", "wrong", "prompt-lookup", "selector"])
def test_static_speculation_equals_plain(setup, case):
    model, tok, specs, plain = setup
    spec = {
        "right-ragged": Speculation(history=_history(plain[2], True), fixed=("history", 6)),
        "wrong": Speculation(history=_history(plain[5], False), fixed=("history", 4)),
        "prompt-lookup": Speculation(strategies=("prompt_lookup",), fixed=("prompt_lookup", 3)),
        "selector": Speculation(history=_history(plain[2], True)),
    }[case]
    got, stats = _gen(_engine(model, tok), specs, speculation=spec)
    assert got == plain[2]
    assert stats.kv_cache == "static"
    s = stats.spec
    assert s["rounds"] == stats.decode_steps
    # the speculative rounds' share of the timed rounds: some, and no more than all
    assert (0 < s["spec_seconds"] <= s["seconds"]) == (s["spec_rounds"] > 0), s
    if case == "right-ragged":
        assert 0 < s["accepted"] < s["proposed"], s  # kept and rejected drafts: ragged rows
        assert s["forwards_saved"] > 0
    if case == "wrong":
        assert s["spec_rounds"] > 0 and s["accepted"] < s["proposed"] / 2, s


@pytest.mark.parametrize("kw", [{"temperature": 0.0}, {"top_k": 5, "top_p": 0.8}, {"dedup": False}],
                         ids=["greedy", "top-k-top-p", "no-dedup"])
def test_static_speculation_with_other_sampling_settings(setup, kw):
    model, tok, specs, _ = setup
    dynamic = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kv_cache="dynamic")
    want, _ = _gen(dynamic, specs, **kw)
    spec = Speculation(history=_history(want, True), fixed=("history", 5))
    assert _gen(_engine(model, tok), specs, speculation=spec, **kw)[0] == want


def test_padded_buckets_and_the_gpu_verification_round_equal_plain(setup, monkeypatch):
    """What a GPU runs, eagerly: batch buckets with idle rows, and verification rounds that
    draw every column inside the round (``DecodeRuntime.verify``) and compare on the host."""
    model, tok, specs, plain = setup
    engine = _engine(model, tok)
    engine.pad_batches = True
    monkeypatch.setattr(static_speculative, "_draws_in_round", lambda device: True)
    monkeypatch.setattr(static_decode, "GRAPH_DRAW_ELEMENTS", 5 * len(tok))  # draws of 5 cells at a time
    verified = []
    real = type(runtime_for(model)).verify

    def spy(self, b, w, *args):
        verified.append((b, w))
        return real(self, b, w, *args)

    monkeypatch.setattr(type(runtime_for(model)), "verify", spy)
    spec = Speculation(history=_history(plain[2], True), fixed=("history", 6))
    got, _ = _gen(engine, specs, speculation=spec)
    assert got == plain[2]
    assert verified and all(b in (16, 12, 8, 4, 2, 1) for b, _ in verified), verified  # 15 rows: bucket 16
    assert all(w in static_speculative.WIDTH_BUCKETS for _, w in verified), verified  # k = 6 runs at width 9


def test_packing_the_holes_every_round_keeps_the_tokens(setup, monkeypatch):
    model, tok, specs, plain = setup
    packs = []
    real = StaticKV.pack

    def spy(self, rows, used):
        packs.append(used)
        return real(self, rows, used)

    monkeypatch.setattr(StaticKV, "pack", spy)
    monkeypatch.setattr(static_speculative, "HOLE_SHARE", 10_000)  # any hole triggers a pack
    spec = Speculation(history=_history(plain[2], True), fixed=("history", 6))
    assert _gen(_engine(model, tok), specs, speculation=spec)[0] == plain[2]
    assert len(packs) > 2, packs


@pytest.mark.parametrize("cut_after", [1, 8])
def test_cut_mid_round_then_continue_speculatively(setup, cut_after):
    model, tok, specs, plain = setup
    engine = _engine(model, tok)
    spec = Speculation(history=_history(plain[2], True), fixed=("history", 5))
    first, _ = _gen(engine, specs, speculation=spec, cut_after=cut_after)
    cut = [k for k, v in first.items() if v[1] == "cut"]
    assert cut, "nothing was cut"
    for k in cut:  # a prefix of the plain sample: no drafted token that was not kept
        assert plain[2][k][0][: len(first[k][0])] == first[k][0]
    prompts = {(s.prompt_id, s.sample_index): s.prompt_tokens for s in specs}
    resumed = [SampleSpec(p, i, prompts[(p, i)], tuple(first[(p, i)][0])) for p, i in cut]
    rest, _ = _gen(engine, resumed, speculation=spec)
    assert {**{k: v for k, v in first.items() if v[1] != "cut"}, **rest} == plain[2]


def test_rounds_that_would_overflow_the_buffers_pack_or_shrink_their_drafts(setup):
    """Right drafts longer than any response (the buffers hold prompt + max_new_tokens +
    max_draft_len columns): rounds near the end are cut to what fits, and the tokens stay."""
    model, tok, specs, plain = setup
    hist = {pid: [d * 3 for d in ds] for pid, ds in _history(plain[2], False).items()}
    spec = Speculation(history=hist, fixed=("history", 8), max_draft_len=8)
    got, _ = _gen(_engine(model, tok), specs, speculation=spec)
    assert got == plain[2]
    rt = runtime_for(model)
    assert int(rt.state.col) <= rt.kv.cols


def test_pack_moves_each_rows_valid_columns_right_in_order():
    kv = StaticKV(layers=1, kv_heads=1, head_dim=1, rows=3, cols=8, dtype=torch.float32, device=torch.device("cpu"))
    kv.keys[0][:, 0, :, 0] = torch.arange(24, dtype=torch.float32).view(3, 8)
    kv.mask[:, :6] = torch.tensor([[0, 1, 1, 0, 1, 0],   # holes after a ragged round
                                   [1, 1, 1, 1, 0, 1],
                                   [0, 0, 1, 0, 0, 1]], dtype=torch.bool)
    width = kv.pack(3, 6)
    assert width == 5  # row 1 has five valid columns
    assert kv.mask[:, :6].int().tolist() == [[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 0]]
    keys = kv.keys[0][:, 0, :5, 0]
    assert keys[0, 2:].tolist() == [1.0, 2.0, 4.0]
    assert keys[1].tolist() == [8.0, 9.0, 10.0, 11.0, 13.0]
    assert keys[2, 3:].tolist() == [18.0, 21.0]


def test_load_then_pack_keeps_a_left_padded_batch_attending_to_the_same_columns():
    kv = StaticKV(layers=1, kv_heads=1, head_dim=2, rows=2, cols=6, dtype=torch.float32, device=torch.device("cpu"))
    states = [PrefixState((1, 2, 3), [(torch.ones(1, 3, 2), torch.ones(1, 3, 2))], torch.zeros(4)),
              PrefixState((1,), [(2 * torch.ones(1, 1, 2), 2 * torch.ones(1, 1, 2))], torch.zeros(4))]
    width = kv.load(states, 2)
    assert kv.pack(2, width) == width == 3  # nothing to close: left padding stays where it was
    assert kv.mask[:, :3].int().tolist() == [[1, 1, 1], [0, 0, 1]]
    assert kv.keys[0][1, 0, 2].tolist() == [2.0, 2.0]


def test_a_row_that_races_ahead_and_finishes_in_a_bucket_frees_its_columns():
    """One row accepts every draft and reaches the length limit long before the others, which
    stay in its batch bucket: its slot must stop counting columns (it held more than any running
    row may, and packs sized by it could free nothing: the buffers overflowed)."""
    torch.set_num_threads(1)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048)
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    specs = [SampleSpec(p, 0, tuple(range(1 + p, 11 + p))) for p in range(8)]
    params = GenerationParams(seed=7, step=2, max_new_tokens=200, temperature=1.0)
    engine = TorchEngine(model, eos_id=99, pad_id=0)  # no draw ends a row: every row runs 200 tokens
    engine.pad_batches = True
    plain, _ = engine.generate(specs, params)
    spec = Speculation(strategies=("history",), history={0: [plain[0].tokens]}, fixed=("history", 8))
    outs, stats = engine.generate(specs, params, speculation=spec)
    assert [o.tokens for o in outs] == [o.tokens for o in plain]
    assert stats.spec["accepted"] > 150  # row 0 ran ahead on right drafts
