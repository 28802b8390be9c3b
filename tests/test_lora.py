"""LoRA over a shared backbone (``model.lora``, ``actions/models/lora.py``).

A LoRA campaign on the tiny Qwen2 folder learns the repeat task; its policy versions are
adapters only; warm actions share one backbone; the reference log-probs are the backbone's
own (the adapter switched off, no second copy).
"""

from __future__ import annotations

import pytest
import torch

from actions.config.workload import LoraConfig
from actions.models.lora import adapter_disabled, adapter_tensors, attach_adapter
from actions.store import read_manifest
from flows.campaign.run import run_campaign
from flows.commands.tiny_model_dir import write_tiny_model_dir
from flows.config import load_config

LORA_LEARNING = [
    "invoker.kind=inprocess", "data.max_count=6", "data.num_eval_prompts=32", "warmup.steps=45",
    "algorithm.batch_size=64", "steps=12", "eval_every=0", "model.lora.r=8", "model.lora.alpha=16",
    "algorithm.lr=3e-3",
]
LORA_MIN_GAIN = 0.2
"""Held-out accuracy gain required. Measured with these settings: 0.500 -> 0.781 (+0.281, 9 of 32
prompts; docs/scale.md). The 45-step warm-up leaves the tiny Qwen2 folder half right, where
RL has room both ways."""


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return write_tiny_model_dir(tmp_path_factory.mktemp("qwen") / "m", "qwen2").path


def test_lora_campaign_on_tiny_qwen2_raises_held_out_accuracy(tmp_path, qwen_dir, prefect_harness):
    cfg = load_config(None, [*LORA_LEARNING, f"model.path={qwen_dir}", f"store.uri={tmp_path / 'store'}"])
    summary = run_campaign(cfg, progress=lambda m: None)
    gain = summary["eval_accuracy_last"] - summary["eval_accuracy_first"]
    assert gain >= LORA_MIN_GAIN, summary["evals"]
    # the planner's profile is the adapter's from the start, not the bare model's
    from actions.store import get_json, open_store

    store = open_store(cfg.store.uri)
    profiles = [get_json(store, k) for k in store.list("profiles/") if k.endswith(".json")]
    assert profiles and all(p["facts"]["lora"] == cfg.model.lora.model_dump(mode="json") for p in profiles)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from tests.conftest import prepare_tiny

    return prepare_tiny(tmp_path_factory.mktemp("store"), "runs/l", "model.lora.r=4")


def _call(name: str, payload: dict) -> dict:
    import importlib
    import json

    result = importlib.import_module(f"actions.{name}").main(json.loads(json.dumps(payload)))
    assert "error" not in result, result
    return result


def _ref(cfg, store, p, key: str, version: int, sha: str | None = None):
    from actions.contracts import ModelRef

    return ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=key, policy_version=version,
                    weights_sha256=sha, lora=cfg.model.lora, backbone_key=p.init_key)


def train_one_step(cfg, store, p, v0, prefix: str) -> dict:
    """The train_step result of one step from ``v0``: its generate and score actions, then rewards
    set to mixed groups so that every adapter tensor gets a gradient; objects under ``prefix``."""
    from actions.store.weights import load_tensors, publish_tensors

    gen = _call("generate", {"model": v0.model_dump(), "dataset_key": p.train_key, "run_seed": 0, "step": 0,
                             "shard": "g", "prompt_ids": [0, 1, 2, 3], "group_size": 4, "max_new_tokens": 8,
                             "temperature": 1.0, "output_key": f"{prefix}/roll.json"})
    score = _call("score", {"policy": v0.model_dump(), "reference_key": p.init_key, "dataset_key": p.train_key,
                            "rollout_keys": [gen["rollout_key"]], "rewards": [{"name": "repeat"}],
                            "algorithm": cfg.algorithm.model_dump(), "output_key": f"{prefix}/scored/manifest.json"})
    tensors, meta = load_tensors(store, score["scored_key"])
    tensors["rewards"] = torch.tensor([1.0, 0.0] * 8)
    publish_tensors(store, f"{prefix}/scored2/manifest.json", tensors, meta)
    return _call("train_step", {"policy": v0.model_dump(), "optimizer_key": None, "seed": 0, "step": 0,
                                "scored_keys": [f"{prefix}/scored2/manifest.json"],
                                "algorithm": cfg.algorithm.model_dump(), "output_prefix": f"{prefix}/train"})


def test_lora_version_is_the_adapter_and_warm_actions_share_the_backbone(prepared):
    from actions.models import warm
    from actions.models.loading import load_backbone, load_model
    from actions.store.weights import load_tensors

    cfg, store, p = prepared
    v0 = _ref(cfg, store, p, p.init_key, 0)
    train = train_one_step(cfg, store, p, v0, "runs/l")
    files = read_manifest(store, train["policy_key"])["files"]
    assert files and all("lora_A" in k or "lora_B" in k for k in files), sorted(files)[:4]
    full = sum(e["size"] for e in read_manifest(store, p.init_key)["files"].values())
    assert sum(e["size"] for e in files.values()) * 2 < full  # r=4 adapters on a 32-wide model
    v1 = _ref(cfg, store, p, train["policy_key"], 1, train["weights_sha256"])
    m0, _, _ = load_model(v0)
    m1, _, _ = load_model(v1)
    backbone = load_backbone(v1, torch.device("cpu"), torch.float32)
    # Both versions hold the one backbone (same storage), and training did not write it.
    w = "model.layers.0.self_attn.q_proj.weight"
    q0, q1 = (dict(m.named_parameters())["model.layers.0.self_attn.q_proj.base_layer.weight"] for m in (m0, m1))
    assert q0.data_ptr() == q1.data_ptr() == backbone[w].data_ptr()
    assert torch.equal(backbone[w], load_tensors(store, p.init_key)[0][w])
    # The B of every adapter moved away from its zero initialisation.
    assert all(p.abs().sum() > 0 for n, p in m1.named_parameters() if "lora_B" in n)
    assert warm.stats()["hits"] > 0


def test_lora_reference_is_the_backbone_with_the_adapter_off(prepared):
    from actions.models.loading import load_model
    from actions.rl.sequences import pack, response_logprobs

    cfg, store, p = prepared
    lora_model, _, _ = load_model(_ref(cfg, store, p, p.init_key, 0))
    plain, _, _ = load_model(_ref(cfg, store, p, p.init_key, 0).model_copy(update={"lora": None,
                                                                                   "backbone_key": None}))
    with torch.no_grad():
        for n, t in lora_model.named_parameters():
            if "lora_B" in n:
                t.normal_(0, 0.5)  # an adapter that changes the output
    batch = pack([[3, 4, 5, 6]] * 2, [[7, 8, 9], [10, 11, 12]], 0)
    with torch.no_grad():
        on = response_logprobs(lora_model, batch)
        with adapter_disabled(lora_model):
            off = response_logprobs(lora_model, batch)
        ref = response_logprobs(plain, batch)
        on_again = response_logprobs(lora_model, batch)
    assert torch.equal(off, ref)  # the same kernels on the same weights: bit for bit
    assert not torch.allclose(on, ref) and torch.equal(on, on_again)


def test_attach_adapter_refuses_targets_that_match_nothing():
    from actions.models.modeling import build_tiny_model

    model, _ = build_tiny_model(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_positions=32,
                                seed=0)
    with pytest.raises(ValueError, match="q_prj"):
        attach_adapter(model, LoraConfig(r=2, target_modules=["q_prj"]), None)
    peft_model = attach_adapter(model, LoraConfig(r=2, target_modules=["q_proj"]), None)
    assert set(adapter_tensors(peft_model)) == {"model.layers.0.self_attn.q_proj.lora_A.default.weight",
                                                "model.layers.0.self_attn.q_proj.lora_B.default.weight"}


def test_attaching_an_adapter_logs_no_library_deprecation():
    """PEFT reads a property transformers deprecates: that FutureWarning, which no setting can
    act on, stays out of every LoRA action's log; the wrap itself still works."""
    import warnings

    from actions.models.modeling import build_tiny_model

    model, _ = build_tiny_model(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_positions=32,
                                seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        peft_model = attach_adapter(model, LoraConfig(r=2, target_modules=["q_proj"]), None)
    assert len(adapter_tensors(peft_model)) == 2


def test_the_head_of_a_tied_model_folder_is_a_target(tmp_path):
    """A tied model (Qwen2.5-0.5B, the tiny Qwen2 folder) saves no ``lm_head.weight``, yet has the
    module PEFT wraps: the check at the CLI takes it, also where config.json leaves the tying to
    the architecture's default, and refuses it where config.json unties a head that is not saved;
    a folder that saves its head is checked by its weights as before."""
    import json

    from actions.models.lora_targets import check_targets

    def check(path, *extra):
        check_targets(load_config(None, [f"model.path={path}", "model.lora={r: 4, target_modules: [lm_head]}",
                                         *extra]).workload())

    tied = write_tiny_model_dir(tmp_path / "tied", "qwen2", hidden_size=32).path
    assert "lm_head.weight" not in _weight_names(tied)
    check(tied)
    check(write_tiny_model_dir(tmp_path / "untied", "qwen2", hidden_size=32, tie_word_embeddings=False).path)
    config = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    with pytest.raises(ValueError, match=r"^model.lora.target_modules: 'lm_head' matches no module"):
        check(tied)
    config.pop("tie_word_embeddings")  # the architecture's default; no head saved: it must be tied
    (tied / "config.json").write_text(json.dumps(config))
    check(tied)


def _weight_names(folder) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


def test_a_rank_above_every_targeted_matrix_is_refused_at_the_cli(tmp_path):
    """``r`` above the smaller side of every targeted weight can add nothing an adapter can learn
    (r=100000 on a 32-wide model did not finish a step in 200 s): one line naming the field, the
    value and the largest rank; the bound is the widest targeted matrix's, so a narrow
    grouped-query k_proj does not bound an all-linear adapter."""
    from actions.models.lora_targets import check_targets

    folder = write_tiny_model_dir(tmp_path / "m", "qwen2", hidden_size=32).path  # k_proj, v_proj: 16 x 32

    def check(*extra):
        check_targets(load_config(None, [f"model.path={folder}", *extra]).workload())

    check("model.lora.r=32")
    check("model.lora.r=16", "model.lora.target_modules=[k_proj]")
    check("model.lora.r=32", "model.lora.target_modules=[lm_head]")
    with pytest.raises(ValueError, match=r"^model.lora.r=33 is above 32, .* set model.lora.r to at most 32$"):
        check("model.lora.r=33")
    with pytest.raises(ValueError, match=r"^model.lora.r=17 is above 16, .*k_proj is 16 x 32.* at most 16$"):
        check("model.lora.r=17", "model.lora.target_modules=[k_proj]")
    with pytest.raises(ValueError, match=r"^model.lora.r=100000 is above 96,"):  # the tiny default, 96 wide
        check_targets(load_config(None, ["model.lora.r=100000"]).workload())


def test_a_model_folder_of_pickled_weights_is_checked_by_the_model_its_config_builds(tmp_path):
    """A ``pytorch_model.bin`` folder has no header to read: its targets and rank are checked
    against the model config.json builds on the meta device (a typo was dropped silently)."""
    import torch
    from safetensors.torch import load_file

    from actions.models.lora_targets import check_targets

    folder = write_tiny_model_dir(tmp_path / "m", "qwen2", hidden_size=32).path
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()

    def check(*extra):
        check_targets(load_config(None, [f"model.path={folder}", *extra]).workload())

    check("model.lora={r: 16, target_modules: [q_proj, k_proj, lm_head]}")
    with pytest.raises(ValueError, match=r"^model.lora.target_modules: 'v_porj' matches no module .*k_proj"):
        check("model.lora={r: 4, target_modules: [q_proj, v_porj]}")
    with pytest.raises(ValueError, match=r"^model.lora.r=33 is above 32, "):
        check("model.lora.r=33")


def test_a_target_may_name_one_layer_of_the_tiny_default_by_its_path():
    """As on a model folder, a target names a module by its path's tail: one layer's q_proj of
    the tiny default (2 layers) is a target; a layer it does not have is refused."""
    from actions.models.lora_targets import check_targets

    def check(targets):
        check_targets(load_config(None, [f"model.lora={{r: 4, target_modules: {targets}}}"]).workload())

    check("[layers.0.self_attn.q_proj]")
    check("[model.layers.1.mlp.up_proj, v_proj, lm_head]")
    with pytest.raises(ValueError, match=r"^model.lora.target_modules: 'layers.2.self_attn.q_proj' matches no module"):
        check("[layers.2.self_attn.q_proj]")


def _tiny_tied():
    from actions.models.modeling import build_tiny_model

    model, _ = build_tiny_model(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_positions=32,
                                seed=0)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    return model.eval()


def test_lora_dropout_is_off_in_an_eval_model_and_on_in_a_training_one():
    """PEFT adds its layers in train mode; an adapter attached to an eval model (generation,
    scoring) must compute the same log-probs twice."""
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    cfg = LoraConfig(r=2, dropout=0.5, target_modules=["q_proj", "v_proj"])
    model = attach_adapter(_tiny_tied(), cfg, None)
    assert not any(m.training for m in model.modules())
    with torch.no_grad():
        for n, t in model.named_parameters():
            if "lora_B" in n:
                t.normal_(0, 0.5)  # an adapter whose dropout would show
        assert torch.equal(model(ids).logits, model(ids).logits)
    trained = attach_adapter(_tiny_tied().train(), cfg, None)
    assert all(m.training for m in trained.modules())


@pytest.mark.parametrize("target", ["lm_head", "embed_tokens"])
def test_merging_an_adapter_on_a_tied_layer_unties_it_and_keeps_the_logits(target, tmp_path):
    """The output head tied to the input embedding: an adapter on either changes that layer
    only, so the merged model unties them (and says so in its config) and computes what the
    unmerged adapter computes, through a save and load too."""
    from transformers import AutoModelForCausalLM

    from actions.models.lora import merge_adapter

    ids = torch.tensor([[3, 4, 5, 6, 7]])
    model = attach_adapter(_tiny_tied(), LoraConfig(r=2, target_modules=[target]), None)
    with torch.no_grad():
        for n, t in model.named_parameters():
            if "lora_B" in n:
                t.normal_(0, 0.5)
        want = model(ids).logits
    merged = merge_adapter(model)
    assert not merged.config.tie_word_embeddings
    assert merged.lm_head.weight.data_ptr() != merged.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        assert (merged(ids).logits - want).abs().max() <= 1e-5
    merged.save_pretrained(tmp_path, safe_serialization=True)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert (again(ids).logits - want).abs().max() <= 1e-5


def test_the_profile_of_a_lora_policy_is_its_own(prepared):
    """A LoRA campaign decodes adapters over the backbone: its speed profile is measured (and
    cached) apart from the full model's, never reused from it."""
    cfg, store, p = prepared
    grid = {"batch_sizes": [1, 2], "contexts": [4, 8], "prefill_shape": [2, 4]}
    v0 = _ref(cfg, store, p, p.init_key, 0)
    full = _call("profile", {"model": v0.model_copy(update={"lora": None, "backbone_key": None}).model_dump(),
                             **grid})
    lora = _call("profile", {"model": v0.model_dump(), **grid})
    assert lora["source"] == "measured" and lora["profile_key"] != full["profile_key"]
    assert lora["facts"]["lora"] == cfg.model.lora.model_dump(mode="json") and full["facts"].get("lora") is None


@pytest.mark.parametrize("target", ["embed_tokens", "lm_head"])
def test_an_adapter_on_a_tied_layer_does_not_warn_in_every_action(target):
    """PEFT warns that an adapter on a tied layer "can lead to complications, for example when
    merging"; the export's merge unties the layers first, so the warning, printed by every LoRA
    action (and four times in a one-step run's console), has nothing to act on."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        attach_adapter(_tiny_tied(), LoraConfig(r=2, target_modules=[target]), None)
    assert not [w for w in seen if "tie_word_embeddings=True" in str(w.message)], [str(w.message) for w in seen]
