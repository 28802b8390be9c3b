"""The generation-engine contract (actions/engines/base.py), run against every engine.

torch always runs; vllm runs under ``make test-vllm`` (marker ``vllm``) and is skipped where
vLLM is not importable. The model is a random tiny Llama with head_dim 64 (the smallest the
vLLM CPU attention accepts), saved to a directory; nothing is downloaded. The vLLM engine uses
32-token KV blocks so that the 55-token prompts share one cached block (their instruction
template) and prefix caching is observable.
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch
from reference_sampler import uncached_sample

from actions.engines.base import FINISH_REASONS, GenerationEngine, GenerationParams, SampleSpec
from actions.engines.factory import make_engine
from actions.engines.torch_engine import TorchEngine
from actions.engines.vllm_engine import INSTALL_HINT, vllm_available
from actions.models.loading import encode
from actions.models.modeling import build_tiny_model
from actions.tasks.repeat import make_rows

NO_VLLM = "vLLM is not importable in this environment; `make test-vllm` runs these cases"
ENGINES = ["torch", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.skipif(not vllm_available(),
                                                                                      reason=NO_VLLM)])]
GROUP = 3  # samples per prompt
SEED, STEP = 7, 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.set_num_threads(1)
    model, tok = build_tiny_model(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256,
                                  max_positions=512, seed=0)
    model.eval()
    model_dir = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(model_dir, safe_serialization=True)
    tok.save_pretrained(model_dir)
    rows = make_rows(6, max_count=9, seed=3)
    specs = [SampleSpec(r.prompt_id, i, encode(tok, r.prompt)) for r in rows for i in range(GROUP)]
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return SimpleNamespace(model=model, tok=tok, dir=model_dir, specs=specs, weights=weights)


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, tiny):
    if request.param == "torch":
        # A private model copy: the weight-update test loads other weights into it.
        yield make_engine("torch", copy.deepcopy(tiny.model), tiny.tok)
        return
    eng = make_engine("vllm", None, tiny.tok, model_dir=tiny.dir, block_size=32, max_model_len=512)
    yield eng
    eng.shutdown()


def _gen(engine, specs, **kw):
    params = GenerationParams(**{"seed": SEED, "step": STEP, "max_new_tokens": 12, "temperature": 1.0, **kw})
    outs, stats = engine.generate(specs, params)
    return outs, stats


def _tokens(outs):
    return {(o.prompt_id, o.sample_index): o.tokens for o in outs}


def _load(engine, weights, version):
    """Put a policy version into the engine: vLLM pushes it into the running engine; the torch
    engine reads its model's parameters on every call."""
    if isinstance(engine, TorchEngine):
        engine.model.load_state_dict(weights, strict=False)
    else:
        engine.load_policy(weights, version)


def test_every_sample_returned_once_with_valid_reason_and_bounded_length(engine, tiny):
    outs, _ = _gen(engine, tiny.specs)
    assert [(o.prompt_id, o.sample_index) for o in outs] == [(s.prompt_id, s.sample_index) for s in tiny.specs]
    for o in outs:
        assert o.finish_reason in FINISH_REASONS and o.finish_reason != "cut", o
        assert len(o.tokens) <= 12 and tiny.tok.eos_token_id not in o.tokens, o
        assert (o.finish_reason == "length") == (len(o.tokens) == 12), o
    # Samples of one prompt differ: each has its own random stream.
    assert len({tuple(o.tokens) for o in outs}) == len(outs)


def test_same_identity_same_tokens_and_greedy_ignores_seed(engine, tiny):
    a, _ = _gen(engine, tiny.specs)
    b, _ = _gen(engine, tiny.specs)
    assert _tokens(a) == _tokens(b)
    g1, _ = _gen(engine, tiny.specs, temperature=0.0, seed=1)
    g2, _ = _gen(engine, tiny.specs, temperature=0.0, seed=99)
    assert _tokens(g1) == _tokens(g2) != _tokens(a)


def test_samples_match_the_uncached_reference(engine, tiny):
    # torch is exact (test_engine.py); vLLM runs other kernels, so a rare near-tie may round the
    # other way. Random agreement would be about 1/51 per token.
    outs, _ = _gen(engine, tiny.specs)
    ref = [uncached_sample(tiny.model, s, tiny.tok.eos_token_id, 12, seed=SEED, step=STEP) for s in tiny.specs]
    agree = sum(o.tokens == r for o, r in zip(outs, ref))
    assert agree >= 0.9 * len(ref), (agree, len(ref))


def test_top_k_top_p_samples_match_the_filtered_reference(engine, tiny):
    # Both engines filter the logits before the noise (sampling.filter_logits): with filters
    # too, equal logits give equal tokens, and the filters change what is drawn.
    filters = {"top_k": 8, "top_p": 0.9}
    outs, _ = _gen(engine, tiny.specs, **filters)
    assert _tokens(outs) != _tokens(_gen(engine, tiny.specs)[0])
    ref = [uncached_sample(tiny.model, s, tiny.tok.eos_token_id, 12, seed=SEED, step=STEP, **filters)
           for s in tiny.specs]
    agree = sum(o.tokens == r for o, r in zip(outs, ref))
    assert agree >= 0.9 * len(ref), (agree, len(ref))
    again, _ = _gen(engine, tiny.specs, **filters)
    assert _tokens(again) == _tokens(outs)


def test_fanout_split_gives_the_same_samples(engine, tiny):
    whole, _ = _gen(engine, tiny.specs)
    parts = []
    for chunk in (tiny.specs[:5], tiny.specs[5:11], tiny.specs[11:]):
        parts += _gen(engine, chunk)[0]
    assert _tokens(parts) == _tokens(whole)


def test_dedup_keeps_outputs_and_computes_fewer_prefill_tokens(engine, tiny):
    plain, sp = _gen(engine, tiny.specs, dedup=False)
    dedup, sd = _gen(engine, tiny.specs, dedup=True)
    assert _tokens(plain) == _tokens(dedup)
    assert sp.prefill_tokens == sum(len(s.prompt_tokens) for s in tiny.specs)
    # torch: one prefill per prompt (1/GROUP). vLLM: every sample after the first hits at least
    # the shared 32-token template block.
    assert sd.prefill_tokens <= sp.prefill_tokens - 32 * (len(tiny.specs) - 1), (sd, sp)


def test_weight_update_changes_outputs_and_invalidates_cached_prefixes(engine, tiny):
    base, _ = _gen(engine, tiny.specs)
    gen = torch.Generator().manual_seed(1)
    # lm_head is tied to the embedding: perturb and send the embedding only.
    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=gen)
                 for k, v in tiny.weights.items() if k != "lm_head.weight"}
    try:
        _load(engine, perturbed, 1)
        new, _ = _gen(engine, tiny.specs)
        changed = sum(_tokens(new)[k] != t for k, t in _tokens(base).items())
        assert changed >= len(tiny.specs) // 2, changed
        ref_model = copy.deepcopy(tiny.model)
        ref_model.load_state_dict(perturbed, strict=False)
        ref = [uncached_sample(ref_model, s, tiny.tok.eos_token_id, 12, seed=SEED, step=STEP) for s in tiny.specs]
        assert sum(o.tokens == r for o, r in zip(new, ref)) >= 0.9 * len(ref)
    finally:
        # Back to the original weights. The prefix cache now holds KV computed by the perturbed
        # weights: were it not reset, these outputs would not equal the first ones.
        _load(engine, {k: v for k, v in tiny.weights.items() if k != "lm_head.weight"}, 2)
    again, stats = _gen(engine, tiny.specs[:1])
    assert _tokens(again) == {k: t for k, t in _tokens(base).items() if k == (tiny.specs[0].prompt_id, 0)}
    if not isinstance(engine, TorchEngine):
        assert stats.prefill_tokens == len(tiny.specs[0].prompt_tokens)  # cold: nothing cached
        assert _gen(engine, tiny.specs[:1])[1].prefill_tokens < stats.prefill_tokens  # warm again


def test_cut_stops_at_the_mth_finish_and_continuation_completes_the_uncut_run(engine, tiny):
    # A random model rarely emits EOS: give it room so samples finish at different steps.
    whole, _ = _gen(engine, tiny.specs, max_new_tokens=60)
    eos = tiny.tok.eos_token_id
    # Index of the decode iteration in which each sample finished (all start together).
    last = {(o.prompt_id, o.sample_index): len(o.tokens) - (o.finish_reason == "length") for o in whole}
    m = 4
    cut_iter = sorted(last.values())[m - 1]
    cut, _ = _gen(engine, tiny.specs, max_new_tokens=60, cut_after=m)
    done = {(o.prompt_id, o.sample_index) for o in cut if o.finish_reason != "cut"}
    assert done == {k for k, it in last.items() if it <= cut_iter}
    wanted = _tokens(whole)
    partial = []
    for o, s in zip(cut, tiny.specs):
        if o.finish_reason == "cut":
            assert len(o.tokens) == cut_iter + 1 and o.tokens == wanted[(o.prompt_id, o.sample_index)][: cut_iter + 1]
            assert eos not in o.tokens
            partial.append(SampleSpec(s.prompt_id, s.sample_index, s.prompt_tokens, tuple(o.tokens)))
        else:
            assert o.tokens == wanted[(o.prompt_id, o.sample_index)]
    assert partial, "the cut should leave unfinished samples"
    cont, _ = _gen(engine, partial, max_new_tokens=60)
    assert all(o.finish_reason in ("stop", "length") for o in cont)
    merged = [o for o in cut if o.finish_reason != "cut"] + cont
    # Conservation: every sample exactly once, and it is the uncut run's sample.
    assert sorted((o.prompt_id, o.sample_index) for o in merged) == sorted(wanted)
    assert _tokens(merged) == wanted


# ----------------------------------------------------------------------------- vLLM's own limits


def _vllm_only(engine):
    if isinstance(engine, TorchEngine):
        pytest.skip("a VllmEngine behaviour")


def test_ignore_eos_runs_every_vllm_sample_to_the_budget(engine, tiny, monkeypatch):
    """The profiler's fixed-length runs (``ignore_eos``) end no sample early, even where almost
    every token is an EOS id: vLLM stops at a stop token id whatever its ignore_eos says."""
    _vllm_only(engine)
    monkeypatch.setattr(engine, "eos_ids", tuple(range(10, engine.vocab_size)))
    ended, _ = _gen(engine, tiny.specs)
    assert sum(o.finish_reason == "stop" for o in ended) > len(ended) // 2  # the EOS ids do end samples
    params = GenerationParams(seed=SEED, step=STEP, max_new_tokens=12, temperature=1.0)
    full, _ = engine.generate(tiny.specs, params, ignore_eos=True)
    assert [(len(o.tokens), o.finish_reason) for o in full] == [(12, "length")] * len(full)


def test_a_vllm_sample_past_the_context_is_refused_before_any_request_is_queued(engine, tiny, monkeypatch):
    """A prompt that does not fit ``max_model_len`` (512 here) with its response is refused in
    one ValueError, not cut short as "length" nor refused by vLLM after its batch-mates were
    queued; and a request vLLM refuses part-way leaves none of its call in the engine."""
    _vllm_only(engine)
    before, _ = _gen(engine, tiny.specs)
    prompt = tiny.specs[0].prompt_tokens * 10
    for n in (len(prompt), 505):  # no room for the prompt; room for it but not for 12 new tokens
        long = SampleSpec(99, 0, prompt[:n])
        with pytest.raises(ValueError, match=rf"prompt 99 has {n} tokens; with max_new_tokens=12 a sample needs "
                                             rf"{n + 12} tokens, above the vLLM engine's max_model_len of 512"):
            _gen(engine, [*tiny.specs[:2], long])
    core = engine.llm.llm_engine
    add = core.add_request

    def refuse_third(rid, *args, **kwargs):
        if rid.endswith("-2"):
            raise RuntimeError("refused")
        return add(rid, *args, **kwargs)

    monkeypatch.setattr(core, "add_request", refuse_third)
    with pytest.raises(RuntimeError, match="refused"):
        _gen(engine, tiny.specs)
    monkeypatch.undo()
    assert not core.has_unfinished_requests()
    assert _tokens(_gen(engine, tiny.specs)[0]) == _tokens(before)


def test_the_vllm_profiler_measures_full_rows_at_the_end_of_the_context(engine, tiny, monkeypatch):
    """The profile grid's longest context may fill the model's: the decode step is then measured
    ``2 + steps`` tokens before the end, every row running to its budget."""
    from actions.engines.vllm_profiling import decode_step_seconds, prefill_tokens_per_s

    _vllm_only(engine)
    seen = []
    generate = engine.generate

    def record(specs, params, **kwargs):
        outs, stats = generate(specs, params, **kwargs)
        seen.append((len(specs[0].prompt_tokens) + params.max_new_tokens, {len(o.tokens) for o in outs},
                     params.max_new_tokens))
        return outs, stats

    monkeypatch.setattr(engine, "generate", record)
    assert decode_step_seconds(engine, 2, 512, engine.vocab_size, repeats=1, steps=4) > 0
    assert prefill_tokens_per_s(engine, engine.vocab_size, batch=2, length=600, repeats=1) > 0
    assert seen and all(total <= 512 and lengths == {new} for total, lengths, new in seen), seen


def test_a_vllm_push_that_does_not_fit_the_model_is_refused_and_the_engine_keeps_its_version(engine, tiny):
    """Unknown names, wrong shapes and a fused module pushed in part (q_proj without k_proj and
    v_proj: vLLM loads the three into one qkv_proj) are refused before the engine sees them."""
    _vllm_only(engine)
    before, _ = _gen(engine, tiny.specs)
    q = "model.layers.0.self_attn.q_proj.weight"
    w = tiny.weights
    for bad, match in (({**w, "model.layers.0.self_attn.q_projX.weight": w[q]}, "'model.layers.0.self_attn.q_projX"),
                       ({**w, q: w[q][:, :64]}, r"shape \[128, 64\], the model's is \[128, 128\]"),
                       ({q: w[q] + 0.1}, r"not 'model.layers.0.self_attn.k_proj.weight'.*\(model.layers.0.self_attn"
                                          r".qkv_proj\)")):
        with pytest.raises(ValueError, match=match):
            engine.load_policy(bad, 7)
        assert engine.policy_version != 7 and _tokens(_gen(engine, tiny.specs)[0]) == _tokens(before)
    attention = {k: v for k, v in w.items() if k.startswith("model.layers.0.self_attn.")}
    assert engine.load_policy(attention, 8) == 4  # q, k, v and o: whole modules load


# ----------------------------------------------------------------------------- factory


def test_factory_builds_a_torch_engine_and_names_the_fix_for_bad_kinds(tiny):
    eng = make_engine("torch", tiny.model, tiny.tok)
    assert isinstance(eng, TorchEngine) and isinstance(eng, GenerationEngine)
    with pytest.raises(ValueError, match="'jax' is not supported"):
        make_engine("jax", tiny.model, tiny.tok)
    with pytest.raises(ValueError, match="needs model_dir"):
        make_engine("vllm", None, tiny.tok)


@pytest.mark.skipif(vllm_available(), reason="vLLM is installed here")
def test_vllm_engine_without_vllm_says_how_to_install(tiny):
    with pytest.raises(ImportError, match="make test-vllm") as exc:
        make_engine("vllm", None, tiny.tok, model_dir=tiny.dir)
    assert str(exc.value) == INSTALL_HINT


def test_requests_default_to_torch_and_reject_unknown_engines():
    from actions.contracts import EvaluateRequest, GenerateRequest, parse_request

    ref = {"store_uri": "/s", "base_key": "b", "policy_key": "p", "policy_version": 0}
    gen = {"model": ref, "dataset_key": "d", "run_seed": 0, "step": 0, "shard": "g", "max_new_tokens": 4,
           "temperature": 1.0, "output_key": "o"}
    assert GenerateRequest.model_validate(gen).engine == "torch"
    assert GenerateRequest.model_validate({**gen, "engine": "vllm"}).engine == "vllm"
    ev = {"model": ref, "dataset_key": "d", "rewards": [{"name": "repeat"}], "max_new_tokens": 4, "output_key": "o"}
    assert EvaluateRequest.model_validate(ev).engine == "torch"
    err = parse_request(GenerateRequest, {**gen, "engine": "jax"})
    assert isinstance(err, dict) and err["field"] == "engine", err


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason=NO_VLLM)
def test_a_vllm_engine_drawing_fused_draws_the_unfused_tokens(tiny, monkeypatch):
    """``fused_sampling: on`` in vLLM: the draw is compiled at engine start, the steps' draws go
    through it, and the tokens are those the same engine draws after ``use_fused_sampling("off")``
    (a cut and its continuation included)."""
    from actions.engines import sampling

    count = [0]
    call = sampling._FusedDraw.__call__

    def counted(self, *args):
        count[0] += self.error is None
        return call(self, *args)

    monkeypatch.setattr(sampling._FusedDraw, "__call__", counted)
    eng = make_engine("vllm", None, tiny.tok, model_dir=tiny.dir, block_size=32, max_model_len=512,
                      fused_sampling="on")
    try:
        assert eng.fused_sampling and count[0] == 1  # prepare_draws, at start
        # room for a random model's rare EOS, so that samples finish at different steps
        fused, _ = _gen(eng, tiny.specs, max_new_tokens=60)
        cut, _ = _gen(eng, tiny.specs, max_new_tokens=60, cut_after=4)
        assert count[0] > 1 + 12  # one fused draw per engine step at least
        eng.use_fused_sampling("off")  # the same engine, drawing unfused from here on
        drawn = count[0]
        plain, _ = _gen(eng, tiny.specs, max_new_tokens=60)
        assert count[0] == drawn and _tokens(fused) == _tokens(plain)
        resumed = [SampleSpec(o.prompt_id, o.sample_index, s.prompt_tokens, tuple(o.tokens))
                   for o, s in zip(cut, tiny.specs) if o.finish_reason == "cut"]
        assert resumed
        rest, _ = _gen(eng, resumed, max_new_tokens=60)
        assert all(o.tokens == _tokens(plain)[(o.prompt_id, o.sample_index)] for o in rest)
    finally:
        eng.shutdown()


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """The factory's vLLM slot over stand-in engines (what the factory asks of them): policy
    versions 0..2 of a tiny model in a local store, and every engine the factory made."""
    from actions.contracts import ModelRef
    from actions.engines import factory
    from actions.models.modeling import base_files
    from actions.store import LocalStore, put_artifact
    from actions.store.weights import publish_tensors

    store = LocalStore(str(tmp_path))
    model, tok = build_tiny_model(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                                  max_positions=64, seed=0)
    put_artifact(store, "r/base/manifest.json", base_files(model, tok))
    refs = [ModelRef(store_uri=store.uri, base_key="r/base/manifest.json", policy_key=f"r/v{v}/manifest.json",
                     policy_version=v) for v in (0, 1, 2)]
    for ref in refs:
        publish_tensors(store, ref.policy_key, model.state_dict())
    made = []

    class StandIn:
        def __init__(self, fused_sampling, **kwargs):
            self.settings, self.kwargs, self.pushed, self.closed = [fused_sampling], kwargs, [], False
            self.fail_push = False
            made.append(self)

        def use_fused_sampling(self, setting):
            self.settings.append(setting)

        def load_policy(self, tensors, version):
            if self.fail_push:
                raise RuntimeError("the reload failed in the worker")
            self.pushed.append(version)

        def shutdown(self):
            self.closed = True

    monkeypatch.setattr(factory, "make_engine", lambda *a, fused_sampling, **kw: StandIn(fused_sampling, **kw))
    try:
        yield SimpleNamespace(refs=refs, made=made, load=factory.load_engine)
    finally:
        factory.close_vllm()


def test_the_processs_vllm_engine_takes_each_calls_fused_sampling(stand_in):
    """A pre-warm builds the container's one vLLM engine with the default setting; the calls
    that follow, a hit or a new version pushed in, each draw as their own ``fused_sampling``
    says."""
    refs = stand_in.refs
    engine, _, hit = stand_in.load("vllm", refs[0])  # a pre-warm: the default setting
    assert not hit and engine.settings[-1] == "auto"
    assert stand_in.load("vllm", refs[0], fused_sampling="off")[2]  # a hit, drawing unfused
    assert engine.settings[-1] == "off"
    again, _, hit = stand_in.load("vllm", refs[1], fused_sampling="on")  # a version pushed in
    assert again is engine and not hit and engine.settings[-1] == "on"


def test_a_push_that_fails_in_the_engine_closes_it_and_the_next_call_starts_another(stand_in):
    """A push that raised part-way may leave the engine's layers half-loaded: the process's
    slot shuts that engine down, and the next call starts a fresh one holding its version."""
    first, _, _ = stand_in.load("vllm", stand_in.refs[0])
    first.fail_push = True
    with pytest.raises(RuntimeError, match="failed in the worker"):
        stand_in.load("vllm", stand_in.refs[1])
    assert first.closed
    second, _, hit = stand_in.load("vllm", stand_in.refs[1])
    assert second is not first and not hit and second.kwargs["policy_version"] == 1 and not second.closed
    assert stand_in.load("vllm", stand_in.refs[2])[0] is second and second.pushed == [2]


def test_the_vllm_settings_reach_the_engine_and_other_settings_start_another(stand_in):
    """``generation.vllm`` is passed to ``vllm.LLM`` as it is (the keys set); the process's one
    engine is kept per settings too: a call with others shuts it down and starts one with them."""
    from actions.config.vllm import VllmConfig

    first, _, _ = stand_in.load("vllm", stand_in.refs[0], vllm={"max_model_len": 128})
    assert first.kwargs["max_model_len"] == 128 and "kv_cache_memory_bytes" not in first.kwargs
    assert stand_in.load("vllm", stand_in.refs[0], vllm=VllmConfig(max_model_len=128))[2]  # a hit
    more = {"max_model_len": 128, "kv_cache_memory_bytes": 1 << 28}
    second, _, hit = stand_in.load("vllm", stand_in.refs[1], vllm=more)
    assert first.closed and not hit and {k: second.kwargs[k] for k in more} == more


def test_the_requests_carry_the_vllm_settings_only_where_set():
    """Every request that may start a vLLM engine carries ``generation.vllm``; unset, the field
    is left out, so actions of the revision before it (which refuse unknown fields) take it."""
    from actions.contracts import DecodeSettings, EvaluateRequest
    from flows.config import load_config

    ref = {"store_uri": "/s", "base_key": "b", "policy_key": "p", "policy_version": 0}

    def evaluate(*overrides):
        gen = load_config(None, ["generation.engine=vllm", *overrides]).generation
        return EvaluateRequest(model=ref, dataset_key="d", rewards=[{"name": "repeat"}], max_new_tokens=4,
                               output_key="o", **DecodeSettings.of(gen).model_dump()).model_dump(mode="json")

    assert "vllm" not in evaluate()
    sent = evaluate("generation.vllm.max_model_len=200")
    assert sent["vllm"] == {"max_model_len": 200, "kv_cache_memory_bytes": None, "gpu_memory_utilization": None}
    assert DecodeSettings.of(EvaluateRequest.model_validate(sent)).engine_options()["vllm"]["max_model_len"] == 200


def test_a_push_is_checked_whole_against_the_checkpoint_the_engine_started_from():
    """``vllm_push.check_push``: known names, equal shapes, and every module it touches complete
    (a fused module's members together); a tied head's copy is skipped, as vLLM skips it."""
    from actions.engines.vllm_push import check_push

    fused = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    attn = "model.layers.0.self_attn"
    ckpt = {f"{attn}.{m}.weight": (8, 8) for m in ("q_proj", "k_proj", "v_proj", "o_proj")}
    ckpt |= {f"{attn}.q_proj.bias": (8,), "model.embed_tokens.weight": (50, 8)}
    check_push(ckpt, ckpt, fused, tied_head=False)
    check_push({f"{attn}.o_proj.weight": (8, 8)}, ckpt, fused, tied_head=False)  # a whole module alone
    check_push({**ckpt, "lm_head.weight": (50, 8)}, ckpt, fused, tied_head=True)
    check_push({"x.weight": (1,)}, {}, fused, tied_head=False)  # a .bin checkpoint: nothing to check against
    for pushed, match in (
            ({**ckpt, "lm_head.weight": (50, 8)}, r"tensor 'lm_head.weight' is not in the model's checkpoint \(6 "),
            ({f"{attn}.o_proj.weight": (8, 4)}, r"o_proj.weight' has shape \[8, 4\], the model's is \[8, 8\]"),
            ({f"{attn}.q_proj.weight": (8, 8)}, rf"carries '{attn}.q_proj.weight' but not '{attn}.k_proj.weight'.*"
                                                rf"\({attn}.qkv_proj\); push every tensor of that module"),
            ({k: v for k, v in ckpt.items() if k != f"{attn}.q_proj.bias"}, r"but not '.*q_proj.bias'")):
        with pytest.raises(ValueError, match=match):
            check_push(pushed, ckpt, fused, tied_head=False)


# ----------------------------------------------------------------------------- actions on vLLM


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason=NO_VLLM)
def test_generate_and_evaluate_actions_on_vllm_reuse_one_engine_across_versions(tmp_path):
    import importlib

    from actions.contracts import ModelRef
    from actions.engines import factory
    from actions.prepare import prepare
    from actions.store import LocalStore, get_json
    from actions.store.weights import load_tensors, publish_tensors
    from flows.config import load_config
    from tests.conftest import TINY_OVERRIDES

    cfg = load_config(None, [*TINY_OVERRIDES, "model.hidden_size=128", "model.num_heads=2",
                             f"store.uri={tmp_path}"])
    store = LocalStore(tmp_path)
    p = prepare(cfg, store, "runs/v")
    ref = ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=p.init_key, policy_version=0)

    def call(name, payload):
        out = importlib.import_module(f"actions.{name}").main(json.loads(json.dumps(payload)))
        assert "error" not in out, out
        return out

    VLLM = {"engine": "vllm", "vllm": {"max_model_len": 128}}
    gen = {"model": ref.model_dump(), "dataset_key": p.train_key, "run_seed": 0, "step": 0, "shard": "g",
           "prompt_ids": [0, 1, 2, 3], "group_size": 4, "max_new_tokens": 8, "temperature": 1.0}
    try:
        call("generate", {**gen, "output_key": "runs/v/t.json"})
        # generation.vllm reaches the engine: a context of 128 tokens holds these prompts and responses
        on_vllm = call("generate", {**gen, **VLLM, "output_key": "runs/v/v.json"})
        assert len(on_vllm["samples"]) == 16 and on_vllm["num_cut"] == 0
        t, v = get_json(store, "runs/v/t.json")["samples"], get_json(store, "runs/v/v.json")["samples"]
        assert sum(a == b for a, b in zip(t, v)) >= 0.9 * len(t)
        engine = factory._vllm.engine
        assert engine.max_model_len == 128
        # A new policy version goes into the same running engine.
        tensors, meta = load_tensors(store, p.init_key)
        published = publish_tensors(store, "runs/v/w1/manifest.json",
                                    {k: v + 0.05 * torch.randn_like(v) for k, v in tensors.items()}, meta)
        ref1 = ref.model_copy(update={"policy_key": published.manifest_key, "policy_version": 1})
        call("generate", {**gen, "model": ref1.model_dump(), **VLLM, "output_key": "runs/v/v1.json"})
        assert factory._vllm.engine is engine and engine.policy_version == 1
        assert get_json(store, "runs/v/v1.json")["samples"] != v
        ev = call("evaluate", {"model": ref1.model_dump(), "dataset_key": p.eval_key, "rewards": [{"name": "repeat"}],
                               "max_new_tokens": 8, **VLLM, "output_key": "runs/v/e.json"})
        assert ev["num_prompts"] == 8 and 0.0 <= ev["accuracy"] <= 1.0
        assert factory._vllm.engine is engine
    finally:
        factory.close_vllm()


def test_row_ends_take_all_equals_take_token_by_token():
    """A verification round's tokens at once: the same generated lists, reasons, stops and
    count as one ``take`` per token up to the row's end."""
    import random

    from actions.engines.base import RowEnds

    rng = random.Random(4)
    for _ in range(300):
        max_new = rng.randrange(1, 12)
        eos = (0, 7)
        toks = [rng.randrange(0, 9) if rng.random() < 0.3 else rng.randrange(1, 7) for _ in range(rng.randrange(0, 9))]
        prior = [rng.randrange(1, 7) for _ in range(rng.randrange(0, max_new))]
        one, many = RowEnds(1, eos, max_new), RowEnds(1, eos, max_new)
        g1, g2 = list(prior), list(prior)
        ended = any(one.take(0, t, g1) for t in toks)
        assert many.take_all(0, toks, g2) == ended
        assert (g1, one.reasons, one.stops, one.num_done) == (g2, many.reasons, many.stops, many.num_done)
