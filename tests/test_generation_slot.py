"""The torch engine's generation slot (``actions/engines/torch_slot.py``): one warm model per
base, each new policy version copied into its parameters in place (CPU, fp32, tiny Llama).

A version through the slot samples exactly the tokens of a model built afresh for it, the
parameters keep their storage and the static decode runtime (buffers, graphs) survives the
version change, the warm cache does not fill with one model per version, a version that does
not fit is never half-loaded, the score action's models are left alone, and LoRA versions
copy their adapter into the slot model over the shared backbone.
"""

from __future__ import annotations

import pytest
import torch

from actions.contracts import DecodeSettings, ModelRef
from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.factory import load_engine, make_engine, take_engine_events
from actions.engines.static_decode import runtime_for
from actions.engines.torch_engine import TorchEngine
from actions.engines.torch_slot import close_torch_slot
from actions.models import in_place, warm
from actions.models.in_place import mismatch
from actions.models.loading import encode, load_model
from actions.models.lora import adapter_tensors
from actions.runtime.control import Control, split_control
from actions.store.weights import load_tensors, publish_tensors
from tests.conftest import prepare_tiny

PROMPTS = ("abc 12", "xy", "hello world 7", "q")


def _prepare(root, *extra: str):
    return prepare_tiny(root, "runs/s", *extra)


def _noisy(tensors: dict[str, torch.Tensor], seed: int, scale: float = 0.3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in tensors.items()}


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """A tiny Llama's store with versions 0, 1, 2 (init plus seeded noise) and two that do not
    fit: v3 misses a layer's weight, v4 omits the tied output head (which is allowed)."""
    torch.set_num_threads(1)
    _, store, p = _prepare(tmp_path_factory.mktemp("store"))
    init, _ = load_tensors(store, p.init_key)
    refs = {0: ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=p.init_key, policy_version=0,
                        dtype="float32")}
    versions = {1: _noisy(init, 1), 2: _noisy(init, 2),
                3: {k: v for k, v in _noisy(init, 3).items() if k != "model.layers.0.mlp.up_proj.weight"},
                4: {k: v for k, v in _noisy(init, 4).items() if k != "lm_head.weight"}}
    for v, tensors in versions.items():
        pub = publish_tensors(store, f"runs/s/v{v}/manifest.json", tensors)
        refs[v] = refs[0].model_copy(update={"policy_key": pub.manifest_key, "policy_version": v,
                                             "weights_sha256": pub.weights_sha256})
    return store, refs


def _specs(tokenizer) -> list[SampleSpec]:
    return [SampleSpec(i, j, encode(tokenizer, text)) for i, text in enumerate(PROMPTS) for j in range(2)]


def _tokens(engine, tokenizer) -> dict:
    params = GenerationParams(seed=3, step=1, max_new_tokens=12, temperature=1.0)
    outs, stats = engine.generate(_specs(tokenizer), params)
    assert stats.kv_cache == "static"
    return {(o.prompt_id, o.sample_index): (o.tokens, o.finish_reason) for o in outs}


def _fresh_tokens(ref: ModelRef) -> dict:
    """What a model built for ``ref`` alone samples (no slot, no warm cache)."""
    model, tokenizer, _ = load_model(ref, fresh=True)
    return _tokens(make_engine("torch", model, tokenizer), tokenizer)


def _ptrs(model: torch.nn.Module) -> list[int]:
    return [p.data_ptr() for p in model.parameters()]


def test_a_new_version_is_copied_into_the_slot_model_and_samples_what_a_fresh_build_does(full):
    _, refs = full
    close_torch_slot()
    take_engine_events()
    e1, tok, hit = load_engine("torch", refs[1])
    assert not hit
    model, ptrs = e1.model, _ptrs(e1.model)
    got1 = _tokens(e1, tok)
    rt = runtime_for(model)
    kv = rt.kv
    assert kv is not None  # the call left its buffers in the runtime
    started = take_engine_events()
    assert (started.starts, started.pushes) == (1, 0) and started.start_s > 0

    e2, tok2, hit = load_engine("torch", refs[2])
    assert not hit and e2 is e1 and e2.model is model and tok2 is tok
    assert _ptrs(model) == ptrs  # every parameter kept its storage
    pushed = take_engine_events()
    assert (pushed.starts, pushed.pushes) == (0, 1) and pushed.push_s > 0
    got2 = _tokens(e2, tok)
    assert runtime_for(model) is rt and rt.kv is kv  # the decode runtime and its buffers survived
    assert got2 == _fresh_tokens(refs[2])
    assert got2 != got1  # the versions differ: the copy is what changed the samples

    # back to version 1, then the same version again: a push, then nothing to load
    assert load_engine("torch", refs[1])[0] is e1 and _tokens(e1, tok) == got1
    assert load_engine("torch", refs[1])[2] is True
    again = take_engine_events()
    assert (again.starts, again.pushes) == (0, 1)


def test_generating_through_versions_adds_no_model_per_version_to_the_warm_cache(full):
    _, refs = full
    close_torch_slot()
    warm.clear()
    before = warm.stats()
    for v in (0, 1, 1, 2, 1):
        load_engine("torch", refs[v])
    assert [k for k in warm._cache if k[0] == "model"] == []
    after = warm.stats()
    # the slot's four loads count as misses, its one hit as a hit
    assert after["misses"] - before["misses"] >= 4 and after["hits"] - before["hits"] >= 1


def test_the_warm_cache_keeps_a_run_s_newest_policy_version_and_its_reference(full):
    """A score worker asks for the sampling version and the reference each step: building a
    newer version evicts the older (a full model each), never the reference (no fingerprint)."""
    _, refs = full
    warm.clear()
    reference = refs[0]
    assert reference.weights_sha256 is None
    for v in (1, 2):
        load_model(refs[v])
        load_model(reference)
    assert sorted(k[3] for k in warm._cache if k[0] == "model") == sorted([refs[2].policy_key, reference.policy_key])
    assert load_model(refs[2])[2] and load_model(reference)[2]  # both warm
    warm.clear()


def test_an_older_version_is_one_of_the_same_run_and_never_the_reference():
    from actions.models.loading import _older_version

    def key(store, base, policy, sha):
        return ("model", store, base, policy, sha, "cpu", "torch.float32", None)

    v2, v1 = key("s", "runs/a/base", "p2", "h2"), key("s", "runs/a/base", "p1", "h1")
    reference, other_run = key("s", "runs/a/base", "p0", None), key("s", "runs/b/base", "q1", "g1")
    assert _older_version(v2, v1) and not _older_version(v2, reference) and not _older_version(v2, other_run)
    assert not _older_version(reference, v2)  # loading the reference evicts no policy version
    assert not _older_version(v2, ("critic", "s", "runs/a/base", "c1"))


def test_a_generate_prewarm_loads_the_version_into_the_slot(full, monkeypatch):
    from actions.runtime.server import _preload_model

    _, refs = full
    close_torch_slot()
    take_engine_events()
    prepared = []
    monkeypatch.setattr(TorchEngine, "prepare_draws", lambda self: prepared.append(self))
    assert _preload_model(refs[1].model_dump(mode="json"), "generate", DecodeSettings()) is True
    assert _preload_model(refs[2].model_dump(mode="json"), "generate", DecodeSettings()) is True
    assert load_engine("torch", refs[2])[2] is True  # the activation finds it there
    events = take_engine_events()  # reported by the process's next generate result
    assert (events.starts, events.pushes) == (1, 1)
    # each generate pre-warm compiles the engine's fused draw (sampling.fused_draw.prepare)
    assert len(prepared) == 2 and all(e is load_engine("torch", refs[2])[0] for e in prepared)
    _preload_model(refs[2].model_dump(mode="json"), "evaluate", DecodeSettings())  # greedy: nothing to prepare
    assert len(prepared) == 2
    # the run's decode settings build the engine its generate actions then use, fused draw included
    run = DecodeSettings(kv_cache="dynamic", fused_sampling="on")
    _preload_model(refs[2].model_dump(mode="json"), "generate", run)
    engine = load_engine("torch", refs[2], **run.engine_options())[0]
    assert prepared[-1] is engine and engine.fused_sampling and engine.kv_cache == "dynamic"
    wire = Control(prewarm=True, prewarm_model=refs[2].model_dump(mode="json"), prewarm_decode=run).to_payload()
    assert split_control(wire)[1].prewarm_decode == run  # as the worker's runtime reads it
    # runtimes and flows of the revision before __prewarm_decode name the engine alone
    assert wire["__prewarm_engine"] == "torch"
    assert split_control({"__prewarm": True, "__prewarm_engine": "vllm"})[1].prewarm_decode.engine == "vllm"


def test_the_engine_and_its_estimates_are_kept_per_decode_settings(full):
    _, refs = full
    close_torch_slot()
    static, _, _ = load_engine("torch", refs[1])
    prior = static.forward_cost.seconds(4, 1)
    for _ in range(20):
        static.forward_cost.observe(4, 1, 1.0)  # far slower than the prior: the estimate moves
    learned = static.forward_cost.seconds(4, 1)
    assert learned > 10 * prior
    dynamic, _, _ = load_engine("torch", refs[2], kv_cache="dynamic")
    assert dynamic is not static and dynamic.model is static.model and not dynamic.static
    assert dynamic.forward_cost.seconds(4, 1) == prior  # its own estimates, from the prior
    again, _, _ = load_engine("torch", refs[1])
    assert again is static and again.forward_cost.seconds(4, 1) == learned  # kept across versions


def test_a_tied_head_left_out_of_a_version_is_still_a_push_and_exact(full):
    _, refs = full
    close_torch_slot()
    engine, tok, _ = load_engine("torch", refs[1])
    take_engine_events()
    assert load_engine("torch", refs[4])[0] is engine
    assert take_engine_events().pushes == 1
    assert engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()
    assert _tokens(engine, tok) == _fresh_tokens(refs[4])


def test_a_version_that_does_not_fit_is_built_afresh_and_never_half_loaded(full, monkeypatch):
    _, refs = full
    close_torch_slot()
    engine, tok, _ = load_engine("torch", refs[1])
    # v3 lacks a weight: nothing is copied, the fresh build refuses it as load_model always has
    with pytest.raises(ValueError, match="weights do not match the model config"):
        load_engine("torch", refs[3])
    take_engine_events()
    e2, tok, _ = load_engine("torch", refs[2])
    assert e2 is not engine and take_engine_events().starts == 1
    assert _tokens(e2, tok) == _fresh_tokens(refs[2])

    # a copy that fails midway drops the slot: the next request builds, never serves the mix
    def fail_midway(targets, tensors):
        name = next(iter(tensors))
        targets[name].copy_(tensors[name])
        raise RuntimeError("device lost")

    monkeypatch.setattr("actions.engines.torch_slot.copy_version", fail_midway)
    with pytest.raises(RuntimeError, match="device lost"):
        load_engine("torch", refs[1])
    monkeypatch.setattr("actions.engines.torch_slot.copy_version", in_place.copy_version)
    e1, tok, hit = load_engine("torch", refs[1])
    assert not hit and e1 is not e2 and take_engine_events().starts == 1
    assert _tokens(e1, tok) == _fresh_tokens(refs[1])


def test_mismatch_names_what_is_missing_extra_or_reshaped():
    a, b = torch.zeros(2, 3), torch.zeros(4)
    targets = {"emb": a, "head": a, "w": b}  # head tied to emb
    assert mismatch(targets, {"emb": a, "w": b}) is None  # the tied head may be left out
    assert mismatch(targets, {"emb": a, "head": a, "w": b.double()}) is None  # dtype converts
    assert "missing ['w']" in mismatch(targets, {"emb": a})
    assert "unexpected ['x']" in mismatch(targets, {"emb": a, "w": b, "x": b})
    assert "shape mismatch" in mismatch(targets, {"emb": a, "w": torch.zeros(5)})


def test_the_score_actions_policy_and_reference_models_are_left_alone(full):
    store, refs = full
    close_torch_slot()
    reference, _, _ = load_model(refs[0])  # as the score action loads version 0
    policy, _, _ = load_model(refs[1])
    for v in (1, 2):
        engine, _, _ = load_engine("torch", refs[v])
        assert engine.model is not reference and engine.model is not policy
    assert load_model(refs[0])[0] is reference and load_model(refs[1])[0] is policy
    init, _ = load_tensors(store, refs[0].policy_key)
    assert all(torch.equal(t, init[k]) for k, t in reference.state_dict().items() if k in init)


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    """A LoRA store: version 0 (backbone, seeded adapter) and adapters 1, 2 of seeded noise."""
    torch.set_num_threads(1)
    cfg, store, p = _prepare(tmp_path_factory.mktemp("lora"), "model.lora.r=4")
    refs = {0: ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=p.init_key, policy_version=0,
                        dtype="float32", lora=cfg.model.lora, backbone_key=p.init_key)}
    adapter = {k: v.clone() for k, v in adapter_tensors(load_model(refs[0], fresh=True)[0]).items()}
    for v in (1, 2):
        pub = publish_tensors(store, f"runs/s/lora{v}/manifest.json", _noisy(adapter, v))
        refs[v] = refs[0].model_copy(update={"policy_key": pub.manifest_key, "policy_version": v,
                                             "weights_sha256": pub.weights_sha256})
    return store, refs


def test_lora_versions_copy_their_adapter_into_the_slot_over_the_shared_backbone(lora):
    from actions.models.loading import load_backbone

    store, refs = lora
    close_torch_slot()
    take_engine_events()
    e1, tok, _ = load_engine("torch", refs[1])
    model, ptrs = e1.model, _ptrs(e1.model)
    got1 = _tokens(e1, tok)
    e2, _, _ = load_engine("torch", refs[2])
    assert e2 is e1 and _ptrs(model) == ptrs
    assert take_engine_events().pushes == 1
    got2 = _tokens(e2, tok)
    assert got2 == _fresh_tokens(refs[2]) and got2 != got1
    # the backbone is the shared one, unwritten
    w = "model.layers.0.self_attn.q_proj.weight"
    backbone = load_backbone(refs[2], torch.device("cpu"), torch.float32)
    q = dict(model.named_parameters())["model.layers.0.self_attn.q_proj.base_layer.weight"]
    assert q.data_ptr() == backbone[w].data_ptr()
    assert torch.equal(backbone[w], load_tensors(store, refs[0].policy_key)[0][w])
    # version 0's seeded adapter is stored nowhere: built afresh, and exact
    e0, _, _ = load_engine("torch", refs[0])
    assert e0 is not e1 and take_engine_events().starts == 1
    assert _tokens(e0, tok) == _fresh_tokens(refs[0])


def test_score_reads_the_slot_model_only_while_it_holds_that_very_version(full):
    """The score action's policy log-probs in the process that just generated: the slot's
    model for exactly that version (no second copy); any other version: not the slot's."""
    from actions.engines.torch_slot import held_model
    from actions.score import _policy_model

    _, refs = full
    close_torch_slot()
    assert held_model(refs[1]) is None
    engine, _, _ = load_engine("torch", refs[1])
    assert _policy_model(refs[1]) is engine.model
    other = _policy_model(refs[2])
    assert other is not engine.model
    load_engine("torch", refs[2])  # the slot moves on to version 2
    assert held_model(refs[1]) is None and _policy_model(refs[2]) is engine.model
    assert held_model(refs[2].model_copy(update={"weights_sha256": "0" * 64})) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_captured_for_one_version_are_replayed_for_the_next(full, monkeypatch):
    """On CUDA (fp32), version 2 copied into the slot replays the graphs version 1 captured
    (no capture in its call) and samples what a model built for version 2 samples."""
    _, refs = full
    monkeypatch.setenv("RLHFLESS_DEVICE", "cuda")
    close_torch_slot()
    params = GenerationParams(seed=3, step=1, max_new_tokens=12, temperature=1.0)
    engine, tok, _ = load_engine("torch", refs[1])
    _, first = engine.generate(_specs(tok), params)
    assert first.kv_cache == "static+graphs" and first.graph_captures > 0, first
    engine2, _, _ = load_engine("torch", refs[2])
    outs, second = engine2.generate(_specs(tok), params)
    assert engine2 is engine and second.graph_captures == 0 and second.graph_capture_s == 0.0, second
    model, _, _ = load_model(refs[2], fresh=True)
    fresh, _ = make_engine("torch", model, tok).generate(_specs(tok), params)
    assert [o.tokens for o in outs] == [o.tokens for o in fresh]
    close_torch_slot()
    warm.clear()
