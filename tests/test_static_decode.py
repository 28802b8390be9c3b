"""The static KV cache path equals the dynamic path token for token (CPU, fp32).

Covers what the decode loop can vary: Llama without and Qwen2 / Qwen3 / Mistral with grouped
KV heads, dedup prefill, uneven splits of a batch, cut-then-continue, top-k / top-p, greedy,
speculation on and off, the batch buckets with idle rows that CUDA graphs need (run eagerly
here), warm buffers reused by a smaller call and grown by a larger one, and the fallback for
models the static forward does not support.
"""

from __future__ import annotations

import pytest
import torch
from llama_family import SHAPES, tiny_causal_lm
from reference_sampler import uncached_sample
from transformers import AutoModelForCausalLM, GPT2Config

from actions.config.workload import GenerationConfig
from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.sampling import Sampler
from actions.engines.speculative import Speculation
from actions.engines.static_decode import runtime_for
from actions.engines.torch_engine import TorchEngine
from actions.models.modeling import build_char_tokenizer
from actions.tasks.repeat import make_rows

NEW = 14


MODELS = {name: (lambda cls=cls, extra=extra: tiny_causal_lm(cls, **extra)) for name, (cls, extra) in SHAPES.items()}


@pytest.fixture(scope="module", params=sorted(MODELS))
def setup(request):
    torch.set_num_threads(1)
    model, tok = MODELS[request.param]()
    rows = make_rows(5, max_count=9, seed=3)
    specs = [SampleSpec(r.prompt_id, i, tuple(tok(r.prompt)["input_ids"])) for r in rows for i in range(3)]
    return model, tok, specs


def _engines(model, tok):
    static = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    dynamic = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kv_cache="dynamic")
    assert static.static and not dynamic.static
    return static, dynamic


def _gen(engine, specs, speculation=None, **kw):
    params = GenerationParams(**{"seed": 7, "step": 2, "max_new_tokens": NEW, "temperature": 1.0, **kw})
    outs, stats = engine.generate(specs, params, speculation=speculation)
    return {(o.prompt_id, o.sample_index): (o.tokens, o.finish_reason, o.stop_token) for o in outs}, stats


@pytest.mark.parametrize("kw", [{}, {"dedup": False}, {"temperature": 0.0}, {"top_k": 5, "top_p": 0.8}],
                         ids=["dedup", "no-dedup", "greedy", "top-k-top-p"])
def test_static_equals_dynamic(setup, kw):
    model, tok, specs = setup
    static, dynamic = _engines(model, tok)
    got, stats = _gen(static, specs, **kw)
    want, dstats = _gen(dynamic, specs, **kw)
    assert got == want
    assert stats.kv_cache == "static" and dstats.kv_cache == "dynamic"
    assert stats.decode_steps == dstats.decode_steps


def test_static_logits_equal_the_dynamic_paths_bit_for_bit(setup, monkeypatch):
    """On the CPU the static step attends over exactly the columns in use, so every draw sees
    the dynamic path's logits to the last bit (a campaign's weights then cannot differ)."""
    model, tok, specs = setup
    seen: dict[str, list[torch.Tensor]] = {"static": [], "dynamic": []}
    path = ["static"]
    draw = Sampler.draw

    def spy(self, logits, keys, positions):
        seen[path[0]].append(logits.detach().clone())
        return draw(self, logits, keys, positions)

    monkeypatch.setattr(Sampler, "draw", spy)
    for name, engine in zip(("static", "dynamic"), _engines(model, tok)):
        path[0] = name
        _gen(engine, specs)
    assert len(seen["static"]) == len(seen["dynamic"]) > 5
    for a, b in zip(seen["static"], seen["dynamic"]):
        assert torch.equal(a, b)


def test_static_equals_the_uncached_reference(setup):
    model, tok, specs = setup
    static, _ = _engines(model, tok)
    got, _ = _gen(static, specs)
    for s in specs:
        ref = uncached_sample(model, s, tok.eos_token_id, NEW, seed=7, step=2)
        assert got[(s.prompt_id, s.sample_index)][0] == ref, s


def test_uneven_splits_and_early_release(setup):
    model, tok, specs = setup
    static, dynamic = _engines(model, tok)
    want, _ = _gen(dynamic, specs)
    split = {}
    for part in (specs[:4], specs[4:11], specs[11:]):
        split.update(_gen(static, part)[0])
    assert split == want
    _, stats = _gen(static, specs)
    # rows that finished left the batch: fewer row-steps than rows x steps
    lengths = [len(t) for t, _, _ in want.values()]
    assert min(lengths) < max(lengths), "every row ran to the same length; nothing to release"
    assert stats.decode_token_slots < len(specs) * stats.decode_steps


def test_batch_buckets_with_idle_rows_equal_exact_batches(setup):
    """The padded batches CUDA graphs run (idle rows kept until a smaller bucket fits),
    exercised eagerly on the CPU, draw the tokens of exact batches."""
    model, tok, specs = setup
    static, dynamic = _engines(model, tok)
    static.pad_batches = True
    assert _gen(static, specs)[0] == _gen(dynamic, specs)[0]
    assert runtime_for(model).kv.rows >= 16  # 15 rows ran in the 16-row bucket


def test_cut_then_continue_on_the_static_cache(setup):
    model, tok, specs = setup
    static, dynamic = _engines(model, tok)
    want, _ = _gen(dynamic, specs)
    ends = sorted(len(t) for t, _, _ in want.values())
    cut_after = sum(e == ends[0] for e in ends)
    first, _ = _gen(static, specs, cut_after=cut_after)
    cut = [k for k, v in first.items() if v[1] == "cut"]
    assert cut, "nothing was cut"
    prompts = {(s.prompt_id, s.sample_index): s.prompt_tokens for s in specs}
    resumed = [SampleSpec(p, i, prompts[(p, i)], tuple(first[(p, i)][0])) for p, i in cut]
    rest, _ = _gen(static, resumed)
    assert {**{k: v for k, v in first.items() if v[1] != "cut"}, **rest} == want


def test_speculation_on_and_off_agree_with_the_static_path(setup):
    model, tok, specs = setup
    static, _ = _engines(model, tok)
    plain, _ = _gen(static, specs)
    spec = Speculation(strategies=("prompt_lookup",), fixed=("prompt_lookup", 3))
    assert _gen(static, specs, speculation=spec)[0] == plain


def test_warm_buffers_are_reused_by_smaller_calls_and_grown_by_larger_ones(setup):
    model, tok, specs = setup
    static, dynamic = _engines(model, tok)
    _gen(static, specs)
    rt = runtime_for(model)
    kv = rt.kv
    assert _gen(static, specs[:3])[0] == _gen(dynamic, specs[:3])[0]
    assert rt.kv is kv  # fewer rows: the same buffers
    long = [SampleSpec(s.prompt_id, s.sample_index, s.prompt_tokens * 12) for s in specs[:2]]
    assert _gen(static, long)[0] == _gen(dynamic, long)[0]
    assert rt.kv is not kv and rt.kv.cols > kv.cols and rt.kv.rows >= kv.rows


def test_unsupported_models_decode_on_the_dynamic_path():
    tok = build_char_tokenizer("")
    cfg = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=128,
                     eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    engine = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    assert not engine.static
    spec = SampleSpec(0, 0, tuple(tok("ccc")["input_ids"]))
    outs, stats = engine.generate([spec], GenerationParams(seed=1, step=0, max_new_tokens=5, temperature=1.0))
    assert stats.kv_cache == "dynamic"
    assert outs[0].tokens == uncached_sample(model, spec, tok.eos_token_id, 5, seed=1, step=0)


def test_cuda_graphs_on_without_cuda_is_refused_with_the_fix():
    model, tok = MODELS["llama"]()
    with pytest.raises(ValueError, match=r"generation.cuda_graphs 'on' needs a CUDA device.*use 'auto' or 'off'"):
        TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, cuda_graphs="on")
    with pytest.raises(ValueError, match="generation.kv_cache"):
        TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kv_cache="paged")
    with pytest.raises(ValueError, match="cuda_graphs 'on' needs generation.kv_cache 'static'"):
        GenerationConfig(kv_cache="dynamic", cuda_graphs="on")
    assert GenerationConfig(cuda_graphs=False).cuda_graphs == "off"  # YAML's bare off


@pytest.mark.slow
def test_a_compiled_decode_step_compiles_a_few_times_per_container_and_keeps_the_samples(monkeypatch):
    """``compile_decode`` on the CPU: batch buckets and 256-column windows, compiled with the
    batch and the window symbolic, so calls over many buckets and two windows compile a few
    times in all (static shapes compiled ten times here), and the samples of the eager step,
    plain and speculative (fused kernels may round differently: at least 90% of rows equal;
    here, in practice, all)."""
    import torch._dynamo.utils

    from actions.engines import static_decode

    cls, extra = SHAPES["qwen2-gqa"]
    model, tok = tiny_causal_lm(cls, **extra)

    def specs(n, seed):
        return [SampleSpec(r.prompt_id, i, tuple(tok(r.prompt)["input_ids"]))
                for r in make_rows(n, max_count=9, seed=seed) for i in range(3)]

    eager = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    compiled = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, compile_decode=True)
    assert compiled.pad_batches
    buckets: set[int] = set()  # the buckets the compiled engine's rows shrink into
    compact = static_decode.compact_rows

    def compacting(rt, keep, rows, cols):
        if rt.wants_compiled:
            buckets.add(rows)
        compact(rt, keep, rows, cols)

    monkeypatch.setattr(static_decode, "compact_rows", compacting)
    frames = torch._dynamo.utils.counters["stats"]
    before = frames["unique_graphs"]
    for n, new in ((5, NEW), (13, 40), (3, 300)):  # 15, 39 and 9 rows; the last past 256 columns
        call = specs(n, n)
        want, _ = _gen(eager, call, max_new_tokens=new)
        got, _ = _gen(compiled, call, max_new_tokens=new)
        assert sum(got[k] == want[k] for k in want) >= 0.9 * len(want)
    rt = runtime_for(model, compiled=True)
    assert rt.compiled and rt._compiled_step is not None, "the step fell back to eager"
    assert len(buckets) >= 4 and rt.kv.cols == 512, (buckets, rt.kv.cols)  # many shapes were run
    assert frames["unique_graphs"] - before <= 3
    spec = Speculation(strategies=("prompt_lookup",), fixed=("prompt_lookup", 3))
    call = specs(5, 3)
    spec_got, _ = _gen(compiled, call, speculation=spec)
    eager_got, _ = _gen(eager, call)
    assert sum(spec_got[k] == eager_got[k] for k in eager_got) >= 0.9 * len(eager_got)


@pytest.mark.slow  # it compiles the step (30-50 s on 2 cores), as the test above does
def test_a_compiled_step_writes_the_kv_cache_in_place(monkeypatch, fresh_compiles):
    """The compiled step writes each new key and value into the cache in place, in full buckets
    and in smaller ones alike: no out-of-place copy of a cache buffer (or of its validity mask)
    is left in the compiled graphs. An in-place write into the view ``keys[:b]`` with ``b``
    symbolic compiled to a copy of the whole view plus a copy back, twice per layer and step,
    2.7 ms of a 9.6 ms step on one H200 (``StaticForward._write``)."""
    import torch._dynamo
    from torch._inductor.fx_passes import post_grad

    aten = torch.ops.aten
    functional = {aten.index_put.default, aten.index_copy.default, aten.index_fill.int_Scalar,
                  aten.index_fill.int_Tensor}
    seen: list[str] = []
    ran = []
    reinplace = post_grad.reinplace_inplaceable_ops

    def checked(*args, **kwargs):
        out = reinplace(*args, **kwargs)
        graph = args[-1]
        ran.append(1)
        for node in graph.nodes:
            val = node.meta.get("val")
            big = isinstance(val, torch.Tensor) and val.dim() >= 2
            copy_back = node.target is aten.copy_.default and big
            if big and node.target in functional or copy_back:
                seen.append(f"{node.target}: {node.format_node()}"[:200])
        return out

    monkeypatch.setattr(post_grad, "reinplace_inplaceable_ops", checked)
    # compiled afresh (fresh_compiles): a cached graph skips the compiler's passes, and this check with them
    torch._dynamo.reset()
    cls, extra = SHAPES["qwen2-gqa"]
    model, tok = tiny_causal_lm(cls, **extra)
    engine = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, compile_decode=True)
    rows = make_rows(3, max_count=9, seed=1)
    specs = [SampleSpec(r.prompt_id, i, tuple(tok(r.prompt)["input_ids"])) for r in rows for i in range(3)]
    eager = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    want = {n: _gen(eager, specs[:n], max_new_tokens=4)[0] for n in (9, 2)}
    for n in (9, 2):  # 9 rows, then 2 in a smaller bucket of the same buffers
        got, _ = _gen(engine, specs[:n], max_new_tokens=4)
        assert got == want[n]
    rt = runtime_for(model, compiled=True)
    assert rt.compiled and rt.kv.rows > 2, "the step fell back to eager, or no smaller bucket ran"
    assert ran, "the compiler's reinplacing pass never ran: nothing was checked"
    assert not seen, seen
