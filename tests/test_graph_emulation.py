"""The CUDA graph path of the static decode loop, run on the CPU through an emulated graph
(``tests/cuda_graph_emulator.py``: a capture records the aten operations and runs nothing; a
replay reruns them on the captured tensors' memory, every host value fixed at capture time).

What only a GPU runs for real is checked here on every CPU run, for the Llama-shaped families
the static forward supports: replayed plain steps and verification rounds give the eager
step's tokens (fp32, the same windows), through parts of a batch, prefill without dedup and
cut-then-continue; warm calls replay without capturing, a call crossing a window replays the
wider window's graph, growing buffers drops the graphs, a new policy version copied in place
is seen by the graphs captured for the old one, weights moved to new memory get a new runtime,
and a host read inside a captured step falls back to eager. The models are sharper than the
default initialisation (weights of standard deviation 0.3, not 0.02), so that what a step
attends to shows in its tokens, and EOS is a token they draw at varied steps.
``tests/test_gpu.py`` checks the same on real CUDA graphs.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from cuda_graph_emulator import CaptureError, EmulatedGraph, capture, emulated_cuda_graphs
from llama_family import SHAPES, cut_then_continue, tiny_causal_lm

from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.speculative import Speculation
from actions.engines.static_decode import runtime_for
from actions.engines.torch_engine import TorchEngine
from actions.tasks.repeat import make_rows

SEED, STEP, NEW = 7, 2, 20


def test_the_emulated_graph_replays_what_it_captured_and_writes_nothing_while_capturing():
    state = torch.zeros(3)
    step = torch.tensor(1.0)
    g = EmulatedGraph()
    with capture(g):
        state.add_(step)
        state[1:] *= 2
    assert state.tolist() == [0.0, 0.0, 0.0]  # a capture records, it does not run
    g.replay()
    g.replay()
    assert state.tolist() == [2.0, 6.0, 6.0]
    step.fill_(10.0)  # a captured tensor's new value is read by the replay (its address is fixed)
    g.replay()
    assert state.tolist() == [12.0, 32.0, 32.0] and g.replays == 3


def test_the_emulated_capture_refuses_what_cuda_refuses():
    x, mask = torch.ones(4), torch.tensor([True, False, True, True])
    for op in (lambda: x.sum().item(), lambda: bool(x.all()), lambda: x.tolist(), lambda: x.nonzero(),
               lambda: x + torch.tensor([1.0, 2.0, 3.0, 4.0]), lambda: torch.equal(x, x),
               lambda: torch.allclose(x, x), lambda: x[mask], lambda: torch.unique(x),
               lambda: torch.repeat_interleave(x, torch.tensor([1, 2, 1, 1])), lambda: x.unsqueeze_(0)):
        with pytest.raises(CaptureError, match="inside a CUDA graph capture"):
            with capture(EmulatedGraph()):
                op()


def test_a_refused_operation_fails_its_capture_even_where_its_error_was_caught():
    x = torch.ones(4)
    g = EmulatedGraph()
    with pytest.raises(CaptureError, match="the capture was invalidated by .*_local_scalar_dense"):
        with capture(g):
            try:
                x.sum().item()
            except CaptureError:
                pass
            x.add_(1)


def test_the_capture_leaves_its_own_memory_unwritten_and_the_replay_reads_fixed_addresses():
    w, out = torch.arange(4.0), torch.zeros(4)
    g = EmulatedGraph()
    with capture(g):
        y = w * 2  # memory the graph allocates: garbage until the first replay
        out.copy_(y + 1)
    assert torch.isnan(y).all() and out.tolist() == [0.0] * 4
    g.replay()
    assert y.tolist() == [0.0, 2.0, 4.0, 6.0] and out.tolist() == [1.0, 3.0, 5.0, 7.0]
    w.copy_(torch.ones(4))  # new values in the same memory: read by the replay
    g.replay()
    assert out.tolist() == [3.0] * 4
    w.data = torch.zeros(4)  # new memory under the same tensor: a real graph reads the old one
    with pytest.raises(CaptureError, match="moved to other memory"):
        g.replay()


class Tiny(NamedTuple):
    model: torch.nn.Module
    tok: object
    eos: int  # a token the model draws at varied steps: rows end at different lengths


def sharp_model(name: str) -> tuple[torch.nn.Module, object]:
    cls, extra = SHAPES[name]
    return tiny_causal_lm(cls, initializer_range=0.3, **extra)


def _varied_eos(model, tok) -> int:
    """The token whose first draw, over the rows of ``_specs`` with no EOS, falls at the most
    distinct steps (the smallest such id)."""
    never = len(tok) + 1
    outs, _ = _gen(TorchEngine(model, eos_id=never, pad_id=tok.pad_token_id), _specs(tok))
    firsts: dict[int, set[int]] = {}
    for toks, _ in outs.values():
        for t in set(toks):
            firsts.setdefault(t, set()).add(toks.index(t))
    return min(firsts, key=lambda t: (-len(firsts[t]), t))


@pytest.fixture(scope="module", params=sorted(SHAPES))
def tiny(request) -> Tiny:
    torch.set_num_threads(1)
    model, tok = sharp_model(request.param)
    return Tiny(model, tok, _varied_eos(model, tok))


@pytest.fixture
def cold(tiny) -> Tiny:
    """The module's model with no graphs captured yet (each test counts its own captures)."""
    rt = runtime_for(tiny.model)
    rt.graphs.clear()
    rt.graph_error = None
    return tiny


def _specs(tok, prompts: int = 6, samples: int = 4) -> list[SampleSpec]:
    rows = make_rows(prompts, max_count=9, seed=5)
    return [SampleSpec(r.prompt_id, i, tuple(tok(r.prompt)["input_ids"])) for r in rows for i in range(samples)]


def _engine(tiny: Tiny, graphs: bool, eos_id: int | None = None) -> TorchEngine:
    """A CPU engine on the graph path (batch buckets with idle rows, replayed steps) or the
    eager static path with the same buckets."""
    engine = TorchEngine(tiny.model, eos_id=tiny.eos if eos_id is None else eos_id, pad_id=tiny.tok.pad_token_id,
                         cuda_graphs="off")
    engine.graphs, engine.pad_batches = graphs, True
    return engine


def _gen(engine, specs, speculation=None, **kw):
    params = GenerationParams(**{"seed": SEED, "step": STEP, "max_new_tokens": NEW, "temperature": 1.0, **kw})
    outs, stats = engine.generate(specs, params, speculation=speculation)
    return {(o.prompt_id, o.sample_index): (o.tokens, o.finish_reason) for o in outs}, stats


@pytest.mark.parametrize("kw", [{}, {"top_k": 5, "top_p": 0.8}, {"temperature": 0.0}, {"cut_after": 5}],
                         ids=["plain", "top-k-top-p", "greedy", "cut"])
def test_replayed_steps_give_the_eager_steps_tokens(cold, monkeypatch, kw):
    model, tok = cold.model, cold.tok
    made = emulated_cuda_graphs(monkeypatch)
    specs = _specs(tok)
    # a greedy row that starts with EOS would decode nothing: no token is EOS then
    eos = len(tok) + 1 if kw.get("temperature") == 0.0 else None
    eager, estats = _gen(_engine(cold, graphs=False, eos_id=eos), specs, **kw)
    assert not made and estats.kv_cache == "static"
    graphs, gstats = _gen(_engine(cold, graphs=True, eos_id=eos), specs, **kw)
    assert gstats.kv_cache == "static+graphs" and gstats.graph_captures > 0, gstats
    assert runtime_for(model).graph_error is None
    assert graphs == eager
    # pipelined: a step launched while the host applied the last tokens may run past the end
    assert gstats.decode_steps <= sum(g.replays for g in made) <= gstats.decode_steps + 1
    if not kw:  # sampled at temperature 1, rows end at different steps
        assert len({len(t) for t, _ in eager.values()}) > 2, "rows all ended together: no bucket was left"
    again, astats = _gen(_engine(cold, graphs=True, eos_id=eos), specs, **kw)
    assert again == eager and astats.graph_captures == 0  # warm: replayed, not captured


def test_uneven_splits_dedup_off_and_cut_then_continue_replay_exactly(cold, monkeypatch):
    """The calls a campaign makes of one warm engine -- parts of a batch, prefill without
    dedup, rows cut and continued later -- replay graphs captured by earlier calls and still
    draw the eager whole-batch tokens."""
    tok = cold.tok
    emulated_cuda_graphs(monkeypatch)
    specs = _specs(tok)
    want, _ = _gen(_engine(cold, graphs=False), specs)
    engine = _engine(cold, graphs=True)
    split = {}
    for part in (specs[:5], specs[5:14], specs[14:]):
        split.update(_gen(engine, part)[0])
    assert split == want
    assert _gen(engine, specs, dedup=False)[0] == want
    merged, stats = cut_then_continue(lambda part, **kw: _gen(engine, part, **kw), specs, want)
    assert merged == want
    assert stats.kv_cache == "static+graphs"


def test_a_larger_call_drops_the_graphs_of_the_old_buffers_and_stays_exact(cold, monkeypatch):
    """Growing the buffers reallocates them; a graph kept over the old ones would write there
    and the tokens would change."""
    model, tok = cold.model, cold.tok
    emulated_cuda_graphs(monkeypatch)
    small, large = _specs(tok, 2, 2), _specs(tok, 9, 4)
    engine = _engine(cold, graphs=True)
    _gen(engine, small)
    rows_before = runtime_for(model).kv.rows
    got, stats = _gen(engine, large, max_new_tokens=NEW + 300)  # more rows and more columns
    assert runtime_for(model).kv.rows > rows_before and stats.graph_captures > 0
    assert stats.kv_cache == "static+graphs" and runtime_for(model).graph_error is None
    assert got == _gen(_engine(cold, graphs=False), large, max_new_tokens=NEW + 300)[0]


def test_a_call_that_outgrows_its_window_replays_the_wider_windows_graph(cold, monkeypatch):
    """Rows that never stop (no token is EOS) cross column ``WINDOW_STEP``, where the step
    needs the graph of the wider window (a graph of the narrower one would leave the columns
    past it out of the attention)."""
    from actions.engines.static_decode import WINDOW_STEP

    model, tok = cold.model, cold.tok
    emulated_cuda_graphs(monkeypatch)
    specs, new, never = _specs(tok, 2, 2), WINDOW_STEP + 8, len(tok) + 1
    got, _ = _gen(_engine(cold, graphs=True, eos_id=never), specs, max_new_tokens=new)
    assert all(len(t) == new for t, _ in got.values())
    assert {key[1] for key in runtime_for(model).graphs} >= {WINDOW_STEP, 2 * WINDOW_STEP}
    assert got == _gen(_engine(cold, graphs=False, eos_id=never), specs, max_new_tokens=new)[0]


def test_replayed_verification_rounds_keep_plain_decodings_tokens(cold, monkeypatch):
    """Speculative rounds replayed from graphs per (bucket, width, window), their draws in
    chunks, equal plain decoding with right, ragged and wrong history drafts; a warm call
    replays every round."""
    from actions.engines import static_decode

    model, tok = cold.model, cold.tok
    made = emulated_cuda_graphs(monkeypatch)
    # a round's draws in chunks of three rows' columns, as a large vocabulary's are on a GPU
    monkeypatch.setattr(static_decode, "GRAPH_DRAW_ELEMENTS", 3 * len(tok))
    specs = _specs(tok)
    engine = _engine(cold, graphs=True)
    plain, _ = _gen(engine, specs)
    other, _ = _gen(engine, specs, step=STEP + 1)
    right: dict[int, list] = {}
    for (pid, _), (toks, _) in sorted(plain.items()):
        right.setdefault(pid, []).append(toks[:6] if pid % 2 else toks)  # odd prompts run out: ragged
    wrong: dict[int, list] = {}
    for (pid, _), (toks, _) in sorted(other.items()):
        wrong.setdefault(pid, []).append(toks)
    for hist, k in ((right, 6), (wrong, 4), (right, 3)):
        outs, stats = _gen(engine, specs, speculation=Speculation(history=hist, fixed=("history", k)))
        assert outs == plain, k
        assert stats.kv_cache == "static+graphs" and stats.spec["spec_rounds"] > 0, stats
    filtered = {"top_k": 5, "top_p": 0.8}
    lookup = Speculation(strategies=("prompt_lookup",), fixed=("prompt_lookup", 3))
    assert _gen(engine, specs, speculation=lookup, **filtered)[0] == _gen(engine, specs, **filtered)[0]
    verify = [g for key, g in runtime_for(model).graphs.items() if key[0] == "verify"]
    assert verify and all(g.replays > 0 for g in verify)
    replays = sum(g.replays for g in made)
    again, astats = _gen(engine, specs, speculation=Speculation(history=right, fixed=("history", 6)))
    assert again == plain and astats.graph_captures == 0 and sum(g.replays for g in made) > replays


def test_weights_copied_in_place_are_read_by_the_graphs_of_the_old_weights(monkeypatch):
    """What the generation slot does between policy versions: the graphs captured for one
    version sample the next one's tokens once its weights are copied into the same tensors."""
    model, tok = sharp_model("qwen2-gqa")
    tiny = Tiny(model, tok, _varied_eos(model, tok))
    made = emulated_cuda_graphs(monkeypatch)
    specs = _specs(tok, 4, 2)
    engine = _engine(tiny, graphs=True)
    before, _ = _gen(engine, specs)
    old = {id(g): g.replays for g in made}
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    after, stats = _gen(engine, specs)
    assert after != before and stats.kv_cache == "static+graphs"
    # the first step's graph (the full bucket) is the old version's, replayed for the new one
    assert made[0].replays > old[id(made[0])]
    fresh, _ = sharp_model("qwen2-gqa")
    fresh.load_state_dict(model.state_dict())
    assert after == _gen(_engine(Tiny(fresh, tok, tiny.eos), graphs=False), specs)[0]


def test_weights_moved_to_new_memory_get_a_new_runtime_and_new_graphs(monkeypatch):
    """``p.data = ...`` gives a parameter other memory; graphs captured over the old memory
    would read it (the emulation fails such a replay), so the model gets a new runtime
    (``runtime_for`` keys it by the parameters' addresses) and captures again."""
    model, tok = sharp_model("llama")
    tiny = Tiny(model, tok, _varied_eos(model, tok))
    emulated_cuda_graphs(monkeypatch)
    specs = _specs(tok, 4, 2)
    engine = _engine(tiny, graphs=True)
    _gen(engine, specs)
    rt = runtime_for(model)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data + 0.1 * torch.randn(p.shape, generator=g)
    after, stats = _gen(engine, specs)
    assert runtime_for(model) is not rt and stats.graph_captures > 0 and stats.kv_cache == "static+graphs"
    fresh, _ = sharp_model("llama")
    fresh.load_state_dict(model.state_dict())
    assert after == _gen(_engine(Tiny(fresh, tok, tiny.eos), graphs=False), specs)[0]


def test_a_host_read_inside_the_step_falls_back_to_eager_with_one_warning(cold, monkeypatch, caplog):
    """A step that reads a device value on the host cannot be captured: the runtime says so
    once and decodes eagerly, with the same tokens."""
    from actions.engines import static_decode

    model, tok = cold.model, cold.tok
    emulated_cuda_graphs(monkeypatch)
    specs = _specs(tok, 3, 2)
    want, _ = _gen(_engine(cold, graphs=False), specs)
    step = static_decode.DecodeRuntime._step

    def reads_host(self, b, window, sampling, dense=False, **kw):
        int(self.state.col.item())
        return step(self, b, window, sampling, dense, **kw)

    monkeypatch.setattr(static_decode.DecodeRuntime, "_step", reads_host)
    with caplog.at_level("WARNING", logger="actions.engines.static_decode"):
        got, stats = _gen(_engine(cold, graphs=True), specs)
    assert got == want and stats.kv_cache == "static" and stats.graph_captures == 0
    warnings = [r for r in caplog.records if "CUDA graph capture failed" in r.getMessage()]
    assert len(warnings) == 1 and "_local_scalar_dense" in warnings[0].getMessage()
    assert "_local_scalar_dense" in runtime_for(model).graph_error  # eager from now on, until reset


def test_a_fused_draw_a_capture_refuses_leaves_the_graphs_and_draws_unfused(cold, monkeypatch, caplog):
    """Graphs are worth more than the fused draw: where a capture with fused draws fails (here
    a compiled draw that reads a device value, fine eagerly and refused in a capture), the
    draws go unfused with one warning and the step is captured again, with the same tokens."""
    from actions.engines import sampling, static_decode

    emulated_cuda_graphs(monkeypatch)
    specs = _specs(cold.tok, 3, 2)
    want, _ = _gen(_engine(cold, graphs=False), specs)
    draw = sampling._FusedDraw()

    def compiled(scaled, keys, positions, term):
        int(keys.sum().item())  # a host read: an eager draw does it, a captured one cannot
        return sampling._noisy_argmax(scaled, keys, positions, term)

    draw.fn = compiled
    monkeypatch.setattr(sampling, "fused_draw", draw)
    monkeypatch.setattr(static_decode, "fused_draw", draw)
    engine = _engine(cold, graphs=True)
    engine.fused_sampling = True
    with caplog.at_level("WARNING"):
        got, stats = _gen(engine, specs)
    assert got == want and stats.kv_cache == "static+graphs" and stats.graph_captures > 0
    assert "_local_scalar_dense" in draw.error and runtime_for(cold.model).graph_error is None
    messages = [r.getMessage() for r in caplog.records]
    assert sum("fused sampling is unavailable" in m for m in messages) == 1
    assert not any("CUDA graph capture failed" in m for m in messages)


def test_a_pipelined_call_runs_one_step_past_its_end_only_where_a_row_could_go_on(cold, monkeypatch):
    """The step launched before the host applies a step's tokens is wasted at the end of a
    call. A row ended by EOS could have gone on, so its call runs one step more than it keeps;
    rows that all reach max_new_tokens together certainly end, so theirs does not."""
    made = emulated_cuda_graphs(monkeypatch)
    spec = [SampleSpec(0, 0, tuple(cold.tok("ab")["input_ids"]))]
    by_eos, stats = _gen(_engine(cold, graphs=True), spec, max_new_tokens=NEW + 40)
    assert [reason for _, reason in by_eos.values()] == ["stop"]  # the model drew its EOS
    assert sum(g.replays for g in made) == stats.decode_steps + 1
    before = sum(g.replays for g in made)
    never = len(cold.tok) + 1
    by_length, stats = _gen(_engine(cold, graphs=True, eos_id=never), spec)
    assert [reason for _, reason in by_length.values()] == ["length"]
    assert sum(g.replays for g in made) - before == stats.decode_steps == NEW - 1


def test_the_step_past_a_cut_captures_no_graph(cold, monkeypatch):
    """A step that needs a graph not yet captured is launched after the host's bookkeeping, so
    a call that ends there captures nothing for it: here the cut falls where the next step would
    cross into the 512-column window."""
    emulated_cuda_graphs(monkeypatch)
    never = len(cold.tok) + 1
    ids = cold.tok("abcdefghij" * 20)["input_ids"][:200]
    ahead = SampleSpec(0, 0, tuple(ids), tuple(ids[:10]))  # 10 tokens generated: 210 columns
    rest = [SampleSpec(p, 0, tuple(ids)) for p in (1, 2)]
    # ``ahead`` reaches 57 tokens with the draw written at column 255; the cut ends the call
    # there, and the step after it would attend over 512 columns
    got, _ = _gen(_engine(cold, graphs=True, eos_id=never), [ahead, *rest], max_new_tokens=57, cut_after=1)
    assert [r for _, r in got.values()] == ["length", "cut", "cut"]
    assert {key[1] for key in runtime_for(cold.model).graphs} == {256}
    want, _ = _gen(_engine(cold, graphs=False, eos_id=never), [ahead, *rest], max_new_tokens=57, cut_after=1)
    assert got == want
