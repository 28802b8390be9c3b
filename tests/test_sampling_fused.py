"""Fused draws (``sampling.fused_draw``): one compiled kernel, the unfused draw's tokens.

The fused draw runs the hash, the Gumbel noise and the argmax of ``sample_next`` through
``torch.compile``. It may only change the cost of a draw: on the CPU its noise is the unfused
noise bit for bit, its tokens equal the unfused tokens over batches, vocabularies, temperatures
and filters, and an engine drawing fused generates exactly what it generates unfused (static
and dynamic caches, speculation, cuts and their continuations, early stops), and vLLM's noise
processor draws, fused or not, the tokens ``sample_next`` draws. CUDA's side is in
test_sampling_device.py (``gpu`` marker).
"""

from __future__ import annotations

import logging
import types

import pytest
import torch
import torch._dynamo.utils
from pydantic import ValidationError
from test_sampling_filters import (
    _batch,  # random logits, stream keys, scattered positions
    _load_vllm_worker,  # vllm_worker, on stand-ins where vLLM is missing
)
from transformers import AutoModelForCausalLM, LlamaConfig

from actions.config.workload import GenerationConfig
from actions.engines import sampling, static_speculative
from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.sampling import (
    FUSED_MIN_VOCAB,
    _FusedDraw,
    _noise,
    _vocab_term,
    fused_draw,
    fused_for,
    gumbel_noise,
    sample_next,
)
from actions.engines.speculative import Speculation
from actions.engines.torch_engine import TorchEngine
from flows.config import CampaignConfig


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


# ----------------------------------------------------------------------------- the draw


def test_compiled_noise_is_the_unfused_noise_bit_for_bit():
    """The arithmetic the fused draw compiles, compiled alone: every float32 bit equal, at
    vocabularies that do and do not fill whole vector registers."""
    compiled = torch.compile(_noise, dynamic=True, fullgraph=True)
    for vocab, rows in ((50_257, 3), (151_936, 16), (9_001, 64)):
        _, keys, positions = _batch(rows, 1, seed=vocab)
        want = gumbel_noise(keys, positions, vocab)
        got = compiled(keys, positions, _vocab_term(vocab, keys.device))
        assert torch.equal(want.view(torch.int32), got.view(torch.int32)), vocab


@pytest.mark.parametrize("vocab", [9_000, 50_257, 151_936])
def test_fused_draws_equal_unfused_draws(vocab):
    for rows in (1, 3, 64):
        logits, keys, positions = _batch(rows, vocab, seed=rows)
        for temperature, top_k, top_p in ((1.0, None, None), (0.7, None, None), (1.3, 40, None), (0.9, None, 0.9),
                                          (1.0, 200, 0.8)):
            want = sample_next(logits, keys, positions, temperature, top_k, top_p)
            got = sample_next(logits, keys, positions, temperature, top_k, top_p, fused=True)
            assert torch.equal(want, got), (vocab, rows, temperature, top_k, top_p)
    assert fused_draw.error is None  # the draws above ran compiled, not through the fallback


def cancelling_logits(keys: torch.Tensor, positions: torch.Tensor, vocab: int, probe: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """Logits that cancel the unfused noise exactly, so that every sum is 0 and the draw is entry
    0 (the first of equal maxima); with ``probe`` ([rows] entries), each row's probe entry is one
    float32 step above, so the draw is that entry. A draw whose noise is one bit larger at any
    entry than the unfused noise picks that entry in the first case; one bit smaller at a probe,
    entry 0 in the second."""
    logits = -gumbel_noise(keys, positions, vocab)
    if probe is not None:
        rows = torch.arange(len(probe), device=logits.device)
        logits[rows, probe] = torch.nextafter(logits[rows, probe], torch.tensor(float("inf"), device=logits.device))
    return logits


def test_a_single_bit_of_difference_in_the_noise_would_change_a_draw():
    vocab, rows = 32_000, 64
    _, keys, positions = _batch(rows, 1, seed=5)
    zeros = torch.zeros(rows, dtype=torch.long)
    cancel = cancelling_logits(keys, positions, vocab)
    assert torch.equal(sample_next(cancel, keys, positions, 1.0), zeros)
    assert torch.equal(sample_next(cancel, keys, positions, 1.0, fused=True), zeros)
    probe = torch.randint(1, vocab, (rows,), generator=torch.Generator().manual_seed(3))
    probed = cancelling_logits(keys, positions, vocab, probe)
    assert torch.equal(sample_next(probed, keys, positions, 1.0), probe)
    assert torch.equal(sample_next(probed, keys, positions, 1.0, fused=True), probe)
    # the checks can see one bit: a larger noise anywhere, a smaller one at a probe
    nudged = cancel.clone()
    nudged[3, 777] = torch.nextafter(nudged[3, 777], torch.tensor(float("inf")))
    assert sample_next(nudged, keys, positions, 1.0, fused=True)[3].item() == 777
    nudged = probed.clone()
    nudged[5, probe[5]] = torch.nextafter(nudged[5, probe[5]], torch.tensor(float("-inf")))
    assert sample_next(nudged, keys, positions, 1.0, fused=True)[5].item() == 0
    assert fused_draw.error is None


def test_one_compilation_serves_every_batch_size():
    vocab = 9_011  # a size no other test draws over: its first draw compiles here
    logits, keys, positions = _batch(3, vocab, seed=1)
    sample_next(logits, keys, positions, 1.0, fused=True)
    before = _graphs()
    for rows in (1, 2, 5, 64, 97):
        logits, keys, positions = _batch(rows, vocab, seed=rows)
        for temperature, top_k in ((1.0, None), (0.7, 20)):
            assert torch.equal(sample_next(logits, keys, positions, temperature, top_k, fused=True),
                               sample_next(logits, keys, positions, temperature, top_k))
    assert _graphs() == before  # batch sizes, one row included, recompile nothing
    assert fused_draw.error is None


def test_a_compiler_failure_draws_unfused_after_one_warning(monkeypatch, caplog):
    def broken(fn, **kw):
        def run(*a):
            raise RuntimeError("no C++ compiler found")
        return run

    draw = _FusedDraw()
    monkeypatch.setattr(sampling, "fused_draw", draw)
    monkeypatch.setattr(torch, "compile", broken)
    logits, keys, positions = _batch(4, 9_000, seed=2)
    with caplog.at_level(logging.WARNING, logger=sampling.__name__):
        for _ in range(3):
            got = sample_next(logits, keys, positions, 1.0, fused=True)
            assert torch.equal(got, sample_next(logits, keys, positions, 1.0))
    warned = [r for r in caplog.records if "fused sampling is unavailable" in r.getMessage()]
    assert len(warned) == 1 and "no C++ compiler found" in warned[0].getMessage()
    assert draw.error is not None


# ----------------------------------------------------------------------------- the setting


def test_auto_fuses_real_vocabularies_only_and_every_setting_is_checked():
    assert not fused_for("auto", FUSED_MIN_VOCAB - 1) and fused_for("auto", FUSED_MIN_VOCAB)
    assert fused_for("on", 40) and not fused_for("off", 151_936)
    with pytest.raises(ValueError, match=r"generation.fused_sampling 'yes' is not one of \('auto', 'on', 'off'\)"):
        fused_for("yes", 100)
    assert GenerationConfig(fused_sampling=False).fused_sampling == "off"  # YAML's bare off
    with pytest.raises(ValidationError, match="fused_sampling"):
        GenerationConfig(fused_sampling="fast")
    # how tokens are drawn is not what a run computes: resuming may change it
    fused = CampaignConfig.model_validate({"generation": {"fused_sampling": "off"}})
    assert fused.fingerprint() == CampaignConfig().fingerprint()


# ----------------------------------------------------------------------------- the engine

VOCAB = 9_000
EOS = tuple(range(3, 300))  # 3% of a flat distribution: rows end at different steps
NEW = 20


@pytest.fixture
def compiled_draws(monkeypatch) -> list[int]:
    """Counts the draws that reach the compiled function (``[count]``)."""
    count = [0]
    call = sampling._FusedDraw.__call__

    def counted(self, *args):
        out = call(self, *args)
        count[0] += self.error is None
        return out

    monkeypatch.setattr(sampling._FusedDraw, "__call__", counted)
    return count


@pytest.fixture(scope="module")
def model():
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0,
                      eos_token_id=3)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def _specs() -> list[SampleSpec]:
    g = torch.Generator().manual_seed(1)
    prompts = [tuple(torch.randint(300, VOCAB, (n,), generator=g).tolist()) for n in (5, 9, 14)]
    prompts.append(prompts[0] * 3)  # repeats: something for prompt-lookup drafts to find
    return [SampleSpec(p, i, prompt) for p, prompt in enumerate(prompts) for i in range(3)]


def _run(model, fused: str, specs, *, kv_cache: str = "static", speculation=None, **params):
    engine = TorchEngine(model, eos_id=EOS, pad_id=0, kv_cache=kv_cache, fused_sampling=fused)
    p = GenerationParams(**{"seed": 3, "step": 1, "max_new_tokens": NEW, "temperature": 1.0, **params})
    outs, _ = engine.generate(specs, p, speculation=speculation)
    return engine, [(o.prompt_id, o.sample_index, o.tokens, o.finish_reason) for o in outs]


@pytest.mark.parametrize("case", ["static", "dynamic", "filtered", "speculation", "speculation-in-round",
                                  "dynamic-speculation"])
def test_an_engine_drawing_fused_generates_what_it_generates_unfused(model, case, monkeypatch, compiled_draws):
    drafts = Speculation(strategies=("prompt_lookup",), fixed=("prompt_lookup", 3))
    opts = {"static": {}, "dynamic": {"kv_cache": "dynamic"}, "filtered": {"temperature": 0.8, "top_k": 50},
            "speculation": {"speculation": drafts}, "speculation-in-round": {"speculation": drafts},
            "dynamic-speculation": {"kv_cache": "dynamic", "speculation": drafts}}[case]
    if case == "speculation-in-round":  # the GPU's rounds: every column drawn inside the round, in chunks
        monkeypatch.setattr(static_speculative, "_draws_in_round", lambda device: True)
    engine, fused = _run(model, "auto", _specs(), **opts)
    assert engine.fused_sampling and compiled_draws[0] > 0  # 9,000 entries: auto fuses
    drawn = compiled_draws[0]
    _, plain = _run(model, "off", _specs(), **opts)
    assert compiled_draws[0] == drawn  # off: none
    assert fused == plain
    reasons = {r for *_, r in plain}
    assert "stop" in reasons and "length" in reasons, reasons  # early stops and full-length rows both seen


def test_a_row_cut_under_fused_draws_continues_unfused_exactly(model, compiled_draws):
    """Cut-and-migrate between actors that draw differently: the continuation equals the row
    generated whole."""
    specs = _specs()
    _, whole = _run(model, "off", specs)
    _, first = _run(model, "auto", specs, cut_after=4)
    cut = [(p, i, toks) for p, i, toks, reason in first if reason == "cut"]
    assert cut and compiled_draws[0] > 0
    by_id = {(s.prompt_id, s.sample_index): s for s in specs}
    resumed = [SampleSpec(p, i, by_id[(p, i)].prompt_tokens, tuple(toks)) for p, i, toks in cut]
    _, rest = _run(model, "off", resumed)
    want = {(p, i): toks for p, i, toks, _ in whole}
    assert all(toks == want[(p, i)] for p, i, toks, _ in rest)


def test_a_prewarm_compiles_the_draw_the_first_generate_uses():
    """``TorchEngine.prepare_draws`` (a generate container's pre-warm) compiles with inputs that
    pass the guards real draws pass, so the first generate call compiles nothing."""
    cfg = LlamaConfig(vocab_size=9_013, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, max_position_embeddings=128, pad_token_id=0, eos_token_id=3)
    torch.manual_seed(1)
    small = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    engine = TorchEngine(small, eos_id=EOS, pad_id=0)
    before = _graphs()
    engine.prepare_draws()
    assert _graphs() == before + 1 and fused_draw.error is None  # 9,013 entries: a size of its own
    params = GenerationParams(seed=1, step=0, max_new_tokens=6, temperature=1.0)
    engine.generate(_specs()[:5], params)
    engine.generate(_specs(), GenerationParams(seed=1, step=0, max_new_tokens=6, temperature=0.8, top_k=30))
    assert _graphs() == before + 1  # what the calls drew through was compiled by the pre-warm
    off = TorchEngine(small, eos_id=EOS, pad_id=0, fused_sampling="off")
    off.prepare_draws()  # draws unfused: nothing to compile
    assert _graphs() == before + 1


# ----------------------------------------------------------------------------- vLLM's processor


def _vllm_rows(w, proc, keys, positions, settings):
    """Register ``settings`` ({row: (temperature, top_k, top_p, fused)}) as vLLM requests that
    have drawn two tokens so far (``positions`` are those of the tokens drawn now)."""
    for row, (temperature, top_k, top_p, fused) in settings.items():
        params = types.SimpleNamespace(extra_args={
            w.KEY_ARG: int(keys[row]), w.OFFSET_ARG: int(positions[row]) - 2, w.TEMPERATURE_ARG: temperature,
            w.TOP_K_ARG: top_k, w.TOP_P_ARG: top_p, w.FUSED_ARG: fused})
        proc.rows[row] = w.CounterNoiseLogitsProcessor._new_row(params, None, [11, 12])


def test_vllms_processor_draws_fused_what_sample_next_draws_and_leaves_vllm_only_that_token(compiled_draws):
    """The processor draws each sampling row with the torch engine's ``Sampler`` (fused where the
    request says so) and hands vLLM's greedy argmax a row whose only finite logit is the drawn
    token; rows that are not sampling (greedy requests) keep their logits."""
    w = _load_vllm_worker()
    vocab = 9_000
    logits, keys, positions = _batch(6, vocab, seed=21)
    settings = {0: (1.0, None, None, True), 1: (1.0, None, None, False), 2: (0.8, 40, None, True),
                3: (1.3, None, 0.9, True), 5: (1.0, None, None, True)}  # row 4: a greedy request
    proc = w.CounterNoiseLogitsProcessor(None, torch.device("cpu"), False)
    _vllm_rows(w, proc, keys, positions, settings)
    proc.rows[6] = proc.rows[0]  # a request past this step's logits (vLLM's batch can be shorter)
    out = proc.apply(logits.clone())
    assert compiled_draws[0] == 3  # one fused draw per distinct fused setting: (1.0), (0.8, 40), (1.3, 0.9)
    for row, (temperature, top_k, top_p, _) in settings.items():
        want = int(sample_next(logits[row:row + 1], keys[row:row + 1], positions[row:row + 1], temperature,
                               top_k, top_p)[0])
        finite = torch.isfinite(out[row]).nonzero().flatten().tolist()
        assert finite == [want] and float(out[row, want]) == 0.0, row
    assert torch.equal(out[4], logits[4])


def test_vllms_processor_on_a_whole_batch_of_one_setting_draws_from_the_logits_in_place(compiled_draws,
                                                                                       monkeypatch):
    """The usual step: every row samples with one setting, drawn from vLLM's logits tensor itself,
    without gathering the rows into a copy first."""
    w = _load_vllm_worker()
    logits, keys, positions = _batch(8, 9_000, seed=22)
    proc = w.CounterNoiseLogitsProcessor(None, torch.device("cpu"), False)
    _vllm_rows(w, proc, keys, positions, {r: (1.0, None, None, True) for r in range(8)})
    drawn_from = []
    draw = sampling.Sampler.draw
    monkeypatch.setattr(sampling.Sampler, "draw", lambda self, x, *a: (drawn_from.append(x.data_ptr()),
                                                                       draw(self, x, *a))[1])
    want = sample_next(logits, keys, positions, 1.0)
    given = logits.clone()
    assert torch.equal(proc.apply(given).argmax(dim=-1), want) and compiled_draws[0] == 1
    assert drawn_from == [given.data_ptr()]


def test_vllms_worker_compiles_the_fused_draw_at_engine_start():
    """``WorkerExtension.prepare_draws`` (called by ``VllmEngine`` where it draws fused) compiles
    what the processor's fused draws then use: the first step compiles nothing."""
    w = _load_vllm_worker()
    vocab = 9_017  # a size no other test compiles for
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=torch.nn.Linear(2, 2)))
    before = _graphs()
    w.WorkerExtension.prepare_draws(worker, vocab)
    assert _graphs() == before + 1 and fused_draw.error is None
    logits, keys, positions = _batch(5, vocab, seed=23)
    proc = w.CounterNoiseLogitsProcessor(None, torch.device("cpu"), False)
    _vllm_rows(w, proc, keys, positions, {r: (1.0, None, None, True) for r in range(5)})
    proc.apply(logits)
    assert _graphs() == before + 1
