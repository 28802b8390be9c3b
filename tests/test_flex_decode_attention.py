"""``flex`` decode attention (``static_forward.ATTENTIONS``): the same attention as ``sdpa``,
skipping the key/value blocks past the last written column (CPU, fp32).

Checked on the four Llama-shaped families: the logits of plain steps and of forwards of
several new columns (causal among themselves) agree with ``sdpa``'s to fp32 round-off
over left-padded rows, idle rows and windows wider than the columns in use, with the last
column on either side of a block boundary; the block mask visits exactly the blocks up to
the last written column; an engine on ``flex`` draws the dynamic path's tokens, speculation
and cut-then-continue included; its block mask is built on the device, as a CUDA graph
needs; the compiled step meets inductor's conditions for its split-KV decoding kernel
(traced, grouped heads folded, batch fixed per bucket); and a bad setting is refused with the
fix. The compiled step's samples (inductor on the CPU) are in the slow suite.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from cuda_graph_emulator import EmulatedGraph, capture
from llama_family import SHAPES, cut_then_continue, tiny_causal_lm

from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.kv_state import PrefixState
from actions.engines.speculative import Speculation
from actions.engines.static_decode import runtime_for
from actions.engines.static_forward import FLEX_KV_BLOCK, StaticForward
from actions.engines.static_kv import StaticKV
from actions.engines.torch_engine import TorchEngine
from actions.tasks.repeat import make_rows

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _model(name: str, sharp: bool = True):
    """A tiny model of family ``name``; ``sharp``: weights of standard deviation 0.3 (not 0.02),
    so that what a token attends to shows in the logits."""
    cls, extra = SHAPES[name]
    return tiny_causal_lm(cls, initializer_range=0.3 if sharp else 0.02, **extra)


def _loaded(fwd: StaticForward, lengths: list[int], rows: int, cols: int) -> tuple[StaticKV, int]:
    """A cache holding random keys and values for rows of ``lengths`` (left-padded), then idle
    rows up to ``rows``; returns it and the first free column."""
    gen = torch.Generator().manual_seed(11)
    states = [PrefixState(tuple(range(n)), [(torch.randn(fwd.kv_heads, n, fwd.head_dim, generator=gen),
                                              torch.randn(fwd.kv_heads, n, fwd.head_dim, generator=gen))
                                             for _ in fwd.layers], torch.zeros(1)) for n in lengths]
    kv = StaticKV(layers=len(fwd.layers), kv_heads=fwd.kv_heads, head_dim=fwd.head_dim, rows=rows, cols=cols,
                  dtype=torch.float32, device=torch.device("cpu"))
    return kv, kv.load(states, rows)


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("longest", [FLEX_KV_BLOCK - 1, FLEX_KV_BLOCK, 150],
                         ids=["block-end", "block-start", "mid-block"])
def test_flex_logits_equal_sdpa_to_round_off(name, longest):
    """Plain steps then a verification round of 4 columns, over 5 rows of uneven prompts and
    3 idle rows, in a window of 256 and of 512 columns (where the blocks past the used ones
    are skipped): ``flex`` gives ``sdpa``'s logits and writes the same cache."""
    torch.manual_seed(0)
    model, _ = _model(name)
    sdpa, flex = StaticForward(model, "sdpa"), StaticForward(model, "flex")
    lengths = [longest, longest - 20, 7, longest, 1]
    with torch.no_grad():
        for window in (256, 512):
            kv_s, col = _loaded(sdpa, lengths, rows=8, cols=512)
            kv_f, _ = _loaded(flex, lengths, rows=8, cols=512)
            ids = torch.randint(3, model.config.vocab_size, (8, 8))
            pos = torch.tensor(lengths + [0, 0, 0])[:, None]
            for w in (1, 1, 4):
                cols = torch.arange(col, col + w)
                want = sdpa(kv_s, ids[:, :w], pos + torch.arange(w), cols, window)
                got = flex(kv_f, ids[:, :w], pos + torch.arange(w), cols, window)
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
                assert torch.equal(kv_f.mask, kv_s.mask)
                ids, pos, col = ids[:, w:], pos + w, col + w
            for a, b in zip(kv_f.keys + kv_f.values, kv_s.keys + kv_s.values):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # the next layer sees the last one's round-off


def test_the_block_mask_visits_the_blocks_up_to_the_last_new_column():
    model, _ = _model("qwen2-gqa")
    flex = StaticForward(model, "flex")
    kv, _ = _loaded(flex, [3], rows=2, cols=512)
    for last, visited in ((0, 1), (FLEX_KV_BLOCK - 1, 1), (FLEX_KV_BLOCK, 2), (300, 3), (511, 4)):
        cols = torch.tensor([max(last - 2, 0), max(last - 1, 0), last])
        mask = flex.block_mask(kv, 2, 512, cols)
        assert mask.kv_num_blocks.flatten().tolist() == [visited], last
        assert mask.kv_indices.flatten().tolist() == [0, 1, 2, 3]


def _specs(tok, prompts: int = 6, samples: int = 3) -> list[SampleSpec]:
    rows = make_rows(prompts, max_count=9, seed=4)
    return [SampleSpec(r.prompt_id, i, tuple(tok(r.prompt)["input_ids"])) for r in rows for i in range(samples)]


def _gen(engine, specs, speculation=None, **kw):
    params = GenerationParams(**{"seed": 7, "step": 2, "max_new_tokens": 16, "temperature": 1.0, **kw})
    outs, stats = engine.generate(specs, params, speculation=speculation)
    return {(o.prompt_id, o.sample_index): (o.tokens, o.finish_reason) for o in outs}, stats


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_an_engine_on_flex_draws_the_dynamic_paths_tokens(name):
    """Dedup, a batch in parts, cut-then-continue and speculation (its verification rounds
    attend by ``sdpa``, its plain rounds by ``flex``) on ``flex``, against the dynamic path."""
    model, tok = _model(name, sharp=False)  # draws EOS at varied steps
    specs = _specs(tok)
    flex = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, decode_attention="flex")
    dynamic = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kv_cache="dynamic")
    want, _ = _gen(dynamic, specs)
    got, stats = _gen(flex, specs)
    assert got == want and stats.kv_cache == "static"
    assert runtime_for(model, attention="flex").forward.attention == "flex"
    assert len({len(t) for t, _ in want.values()}) > 1, "every row ran to the same length"
    split = {}
    for part in (specs[:4], specs[4:]):
        split.update(_gen(flex, part)[0])
    assert split == want
    assert cut_then_continue(lambda part, **kw: _gen(flex, part, **kw), specs, want)[0] == want
    spec = Speculation(strategies=("prompt_lookup",), fixed=("prompt_lookup", 3))
    spec_got, sstats = _gen(flex, specs, speculation=spec)
    assert spec_got == want and sstats.spec["rounds"] > 0


def test_the_block_mask_is_built_on_the_device_and_replays_with_each_column():
    """A captured step must build its block mask without reading the column back to the host:
    built inside an (emulated) CUDA graph capture, it replays with the next step's column."""
    model, _ = _model("qwen3-gqa")
    flex = StaticForward(model, "flex")
    kv, _ = _loaded(flex, [3], rows=2, cols=512)
    col = torch.tensor([5])
    out = torch.zeros(1, dtype=torch.int32)
    g = EmulatedGraph()
    with capture(g):
        out.copy_(flex.block_mask(kv, 2, 512, col).kv_num_blocks.flatten())
    for last, visited in ((5, 1), (FLEX_KV_BLOCK, 2), (400, 4)):
        col.fill_(last)
        g.replay()
        assert out.tolist() == [visited]


def test_verification_rounds_attend_by_sdpa_and_plain_steps_by_flex(monkeypatch):
    """A round is never compiled, and uncompiled flex attention is its unfused reference: on a
    flex runtime the verification forwards (several columns) run ``sdpa``, plain steps ``flex``."""
    model, tok = _model("qwen2-gqa", sharp=False)
    seen: dict[bool, set[int]] = {True: set(), False: set()}  # flex -> widths attended
    attend = StaticForward._attend

    def spy(self, attn, h, *args):
        seen[args[-1]].add(h.shape[1])
        return attend(self, attn, h, *args)

    monkeypatch.setattr(StaticForward, "_attend", spy)
    flex = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, decode_attention="flex")
    spec = Speculation(strategies=("prompt_lookup",), fixed=("prompt_lookup", 3))
    _, stats = _gen(flex, _specs(tok), speculation=spec)
    assert stats.spec["rounds"] > 0
    assert seen[True] <= {1} and max(seen[False]) > 1, seen  # a round without drafts is a plain step
    _gen(flex, _specs(tok))
    assert seen[True] == {1} and seen[False] - {1} == seen[False], seen


def test_flex_without_the_static_cache_is_refused_with_the_fix():
    model, tok = _model("llama")
    with pytest.raises(ValueError, match="decode attention 'flex' runs on the static KV cache.*use 'sdpa'"):
        TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kv_cache="dynamic",
                    decode_attention="flex")
    with pytest.raises(ValueError, match="decode attention 'flash' is not one of"):
        TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, decode_attention="flash")


@pytest.mark.slow
def test_a_compiled_flex_step_keeps_the_eager_steps_samples():
    """``flex`` through ``torch.compile`` with the batch fixed per bucket and the window
    symbolic, as ``generation.compile_decode`` compiles it (on the CPU inductor's decoding
    template then runs): it compiles (no fallback to eager) and draws the eager ``flex`` step's
    samples in at least 90% of rows, over several batch buckets and across a window boundary;
    a row that differs does so late, as round-off does (fused kernels add in another order),
    not from its first tokens, as a wrong mask would."""
    model, tok = _model("qwen2-gqa", sharp=False)
    eager = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, decode_attention="flex")
    compiled = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, decode_attention="flex",
                           compile_decode=True)
    for n, new in ((5, 16), (4, 260)):
        specs = _specs(tok, prompts=n)
        want, _ = _gen(eager, specs, max_new_tokens=new)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # the unfused reference would warn
            got, _ = _gen(compiled, specs, max_new_tokens=new)
        assert sum(got[k] == want[k] for k in want) >= 0.9 * len(want)
        for k in (k for k in want if got[k] != want[k]):
            same = next((i for i, (a, b) in enumerate(zip(want[k][0], got[k][0])) if a != b), len(want[k][0]))
            assert same >= 16, (k, same)
    rt = runtime_for(model, compiled=True, attention="flex")
    assert rt.compiled and rt._compiled_step is not None, "the step fell back to eager"
    assert rt.kv.cols == 512


def _picks_flex_decoding(query, value, kv_indices, kernel_options) -> bool:
    """Whether inductor lowers this ``flex_attention`` call to its split-KV decoding kernel on
    a GPU: torch's own ``_use_flex_decoding`` (``torch/_inductor/kernel/flex/flex_decoding.py``)
    asked about the traced shapes, which a CPU compile never asks it (the CPU has its own
    template). It wants the batch and heads fixed, a query shorter than 128, a power-of-two
    number of query heads per key/value head and a block mask of one head where heads group."""
    import sympy
    from torch._inductor.kernel.flex.flex_decoding import _use_flex_decoding
    from torch._inductor.sizevars import SizeVarAllocator
    from torch._inductor.virtualized import V

    def node(t):
        sizes = [n.node.expr if isinstance(n, torch.SymInt) else sympy.Integer(n) for n in t.shape]
        return SimpleNamespace(get_size=lambda: sizes)

    with V.set_graph_handler(SimpleNamespace(sizevars=SizeVarAllocator())):
        return _use_flex_decoding(node(query), node(kv_indices), node(value), dict(kernel_options),
                                  query.shape[1] != value.shape[1])


def test_the_compiled_flex_step_has_the_shapes_of_inductors_decoding_kernel(monkeypatch):
    """The compiled flex step (``compile_decode``), traced on the CPU with a backend that records
    each ``flex_attention`` call: with 7 query heads per key/value head (Qwen2.5's grouping)
    torch's own test picks the split-KV decoding kernel for every call -- the heads folded into
    the query length, the batch fixed per bucket -- the window (below the buffer's columns)
    stays symbolic, and the step is traced once per batch bucket."""
    from transformers import Qwen2Config

    calls: list[tuple] = []

    def record(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function" and "flex_attention" in str(node.target):
                query, key, value = (a.meta["example_value"] for a in node.args[:3])
                kv_indices = node.args[4][3].meta["example_value"]  # the block mask's tuple
                picks = _picks_flex_decoding(query, value, kv_indices, node.args[6])
                calls.append((tuple(query.shape), key.shape[2], picks))
        return gm.forward

    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_(fn, **{"backend": record, **kw}))
    model, tok = tiny_causal_lm(Qwen2Config, num_attention_heads=7, num_key_value_heads=1, head_dim=16)
    engine = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, decode_attention="flex",
                         compile_decode=True)
    want = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kv_cache="dynamic")
    rt = runtime_for(model, compiled=True, attention="flex")
    rt.ensure(16, 2 * FLEX_KV_BLOCK + 1)  # a warm container's buffers: wider than these calls' windows
    for prompts in (5, 2):
        specs = _specs(tok, prompts=prompts, samples=2)
        assert _gen(engine, specs, max_new_tokens=6)[0] == _gen(want, specs, max_new_tokens=6)[0]
    assert rt.compiled, "the step fell back to eager"
    assert calls and all(picks for _, _, picks in calls), calls
    assert {q[1:3] for q, _, _ in calls} == {(1, 7)}  # one head per key/value head, 7 grouped queries
    assert all(isinstance(window, torch.SymInt) for _, window, _ in calls), calls
    batches = sorted({q[0] for q, _, _ in calls})
    assert len(batches) == 2 and len(calls) == 2 * len(batches), calls  # 2 layers, one trace per bucket


def test_a_compiled_flex_step_past_the_recompilation_limit_falls_back_to_sdpa_with_a_warning(monkeypatch, caplog):
    """Past the compiler's recompilation limit torch would run the step eagerly without a word
    -- for flex, its unfused reference (scores materialised; on a GPU, many times slower). The
    runtime makes that a failure instead: one warning, and from then on eager ``sdpa`` steps,
    which draw the same tokens."""
    from torch._dynamo import config as dynamo_config

    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_(fn, **{"backend": "eager", **kw}))
    model, tok = _model("qwen2-gqa", sharp=False)
    engine = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, decode_attention="flex",
                         compile_decode=True)
    want = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kv_cache="dynamic")
    first, second = _specs(tok, prompts=5, samples=2), _specs(tok, prompts=2, samples=2)
    assert _gen(engine, first, max_new_tokens=6)[0] == _gen(want, first, max_new_tokens=6)[0]
    rt = runtime_for(model, compiled=True, attention="flex")
    assert rt.compiled
    eager_flex = []  # attention calls run outside the compiler on flex: the unfused reference
    attend = StaticForward._attend

    def spy(self, attn, h, *args):
        eager_flex.append(args[-1] and not torch.compiler.is_compiling())
        return attend(self, attn, h, *args)

    monkeypatch.setattr(StaticForward, "_attend", spy)
    # the next batch bucket one too many (torch's config patch: an undone monkeypatch deletes the setting)
    with dynamo_config.patch(recompile_limit=1):
        got = _gen(engine, second, max_new_tokens=6)[0]
    assert got == _gen(want, second, max_new_tokens=6)[0]
    assert not rt.compiled and eager_flex and not any(eager_flex)
    assert [r.message for r in caplog.records if "torch.compile of the decode step failed" in r.message], \
        caplog.text
