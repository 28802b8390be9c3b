"""Real Hugging Face model folders (Qwen2, Llama, Mistral; tied and untied; no pad token and
several EOS ids) through prepare, generate, score and train_step, and the tiny-model builder."""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path

import pytest
import torch

from actions.contracts import ModelRef
from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.factory import make_engine
from actions.engines.torch_engine import TorchEngine
from actions.models.modeling import build_model, instantiate, read_base, read_model_dir
from actions.models.special_tokens import special_tokens
from actions.prepare import prepare
from actions.store import LocalStore, get_json, put_json
from actions.store.weights import load_tensors, publish_tensors
from flows.commands.tiny_model_dir import write_tiny_model_dir
from flows.config import load_config

VARIANTS = {
    # The Qwen2 default shape: pad_token_id null, no pad token, two EOS ids, tied embeddings.
    "qwen2-nopad-2eos": dict(arch="qwen2"),
    "qwen2-untied-pad": dict(arch="qwen2", tie_word_embeddings=False, pad_token="<|endoftext|>"),
    "llama-chat-eoslist": dict(arch="llama"),
    "llama-untied-plain": dict(arch="llama", tie_word_embeddings=False, chat_template=False),
    "mistral-untied-newpad": dict(arch="mistral", tie_word_embeddings=False, pad_token="<pad>", chat_template=False),
}


def _files_digest(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def test_builder_writes_the_qwen2_default_shape_and_is_deterministic(tmp_path):
    info = write_tiny_model_dir(tmp_path / "a", "qwen2", seed=5)
    config = json.loads((info.path / "config.json").read_text())
    generation = json.loads((info.path / "generation_config.json").read_text())
    tok_config = json.loads((info.path / "tokenizer_config.json").read_text())
    assert "pad_token_id" in config and config["pad_token_id"] is None
    assert tok_config["pad_token"] is None and "<|im_start|>" in tok_config["chat_template"]
    assert generation["eos_token_id"] == list(info.eos_token_ids) and len(info.eos_token_ids) == 2
    assert config["eos_token_id"] == info.eos_token_ids[0] and config["tie_word_embeddings"] is True
    # Special tokens follow the learned vocabulary, and the embedding has spare rows (as Qwen's).
    assert min(info.eos_token_ids) >= 512 and info.vocab_size % 64 == 0 and info.vocab_size > info.tokenizer_size
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(info.path)
    text = "Ann has 12 apples. She buys 30 more.\n#### 42"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and len(ids) < len(text) / 2  # merges, not one token per character
    assert tok.pad_token is None and tok.eos_token_id == info.eos_token_ids[0]
    assert _files_digest(info.path) == _files_digest(write_tiny_model_dir(tmp_path / "b", "qwen2", seed=5).path)
    other = _files_digest(write_tiny_model_dir(tmp_path / "c", "qwen2", seed=6).path)
    assert other["model.safetensors"] != _files_digest(info.path)["model.safetensors"]
    assert other["tokenizer.json"] == _files_digest(info.path)["tokenizer.json"]


def test_special_tokens_take_every_eos_id_and_a_pad_id(tmp_path):
    info = write_tiny_model_dir(tmp_path / "m", "qwen2")
    model, tok = instantiate(*read_model_dir(info.path))
    ids = special_tokens(model, tok)
    assert ids.eos_ids == info.eos_token_ids and ids.pad_id == info.eos_token_ids[0]
    llama = write_tiny_model_dir(tmp_path / "l", "llama", pad_token="<pad>")
    model, tok = instantiate(*read_model_dir(llama.path))
    assert json.loads((llama.path / "config.json").read_text())["eos_token_id"] == list(llama.eos_token_ids)
    assert special_tokens(model, tok).pad_id == llama.pad_token_id


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_base_read_once_builds_every_version_and_names_its_special_tokens_without_weights(tmp_path, variant):
    """The parsed base (config, tokenizer, generation settings) is shared by the models built
    from it: each equals ``instantiate``'s, none changes the shared config, and the special
    tokens read from the base alone are those of a built model (what scoring without a
    forward relies on)."""
    info = write_tiny_model_dir(tmp_path / "m", **VARIANTS[variant])
    files, tensors = read_model_dir(info.path)
    base = read_base(files)
    config_before = base.config.to_json_string()
    first, second = build_model(base, tensors), build_model(base, {k: v + 1 for k, v in tensors.items()})
    model, tok = instantiate(files, tensors)
    assert base.special_tokens() == special_tokens(first, base.tokenizer) == special_tokens(model, tok)
    assert base.config.to_json_string() == config_before and first.config is not second.config
    assert first.generation_config is not second.generation_config
    assert first.generation_config.to_json_string() == model.generation_config.to_json_string()
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        assert torch.equal(first(input_ids=ids).logits, model(input_ids=ids).logits)
        assert not torch.equal(second(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("variant", ["qwen2-nopad-2eos", "llama-untied-plain"])
def test_instantiate_loads_the_stored_weights_without_a_random_init(tmp_path, variant, monkeypatch):
    """No random init runs (every weight is overwritten); the tensors stay the caller's; a tied
    output head is the embedding; the model equals Hugging Face's own load of the folder."""
    from transformers import AutoModelForCausalLM

    info = write_tiny_model_dir(tmp_path / "m", **VARIANTS[variant])
    files, tensors = read_model_dir(info.path)
    inits = []
    monkeypatch.setattr(torch.nn.init, "normal_", lambda t, *a, **k: inits.append(t))
    model, _ = instantiate(files, tensors)
    monkeypatch.undo()
    assert inits == []
    assert all(p.data_ptr() != tensors[n].data_ptr() for n, p in model.named_parameters() if n in tensors)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == VARIANTS[variant].get("tie_word_embeddings", True)
    reference = AutoModelForCausalLM.from_pretrained(info.path, dtype=torch.float32).eval()
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, reference(input_ids=ids).logits)


class _Biased(torch.nn.Module):
    """A model whose logits get ``bias`` added: steers sampling to chosen tokens."""

    def __init__(self, lm: torch.nn.Module, bias: torch.Tensor) -> None:
        super().__init__()
        self.lm, self.bias = lm, bias

    def forward(self, **kwargs):
        out = self.lm(**kwargs)
        out.logits = out.logits + self.bias
        return out


def test_generation_stops_at_the_second_eos_id_and_records_it(tmp_path):
    info = write_tiny_model_dir(tmp_path / "m", "qwen2")
    model, tok = instantiate(*read_model_dir(info.path))
    engine = make_engine("torch", model, tok)
    assert isinstance(engine, TorchEngine) and engine.eos_ids == info.eos_token_ids
    second = info.eos_token_ids[1]
    bias = torch.zeros(info.vocab_size)
    bias[second] = 100.0
    engine.model = _Biased(model, bias)
    specs = [SampleSpec(0, i, tuple(tok("Ann has 3 pens.", add_special_tokens=False)["input_ids"])) for i in range(3)]
    outs, _ = engine.generate(specs, GenerationParams(seed=0, step=0, max_new_tokens=8, temperature=1.0))
    assert [(o.tokens, o.finish_reason, o.stop_token) for o in outs] == [([], "stop", second)] * 3


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def prepared(request, tmp_path_factory):
    from tests.conftest import TINY_OVERRIDES

    root = tmp_path_factory.mktemp(request.param)
    info = write_tiny_model_dir(root / "model", **VARIANTS[request.param])
    cfg = load_config(None, [*TINY_OVERRIDES, f"store.uri={root / 'store'}", f"model.path={info.path}"])
    store = LocalStore(root / "store")
    return info, cfg, store, prepare(cfg, store, "runs/h")


def _call(name, payload):
    result = importlib.import_module(f"actions.{name}").main(json.loads(json.dumps(payload)))
    assert "error" not in result, result
    return result


def test_generate_score_train_on_each_architecture(prepared):
    info, cfg, store, p = prepared
    ref = ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=p.init_key, policy_version=0)
    gen = _call("generate", {"model": ref.model_dump(), "dataset_key": p.train_key, "run_seed": 0, "step": 0,
                             "shard": "g", "prompt_ids": [0, 1, 2, 3], "group_size": 4, "max_new_tokens": 6,
                             "temperature": 1.0, "output_key": "runs/h/roll.json"})
    assert len(gen["samples"]) == 16
    # One sample is made to stop at the last EOS id: score must append that id, not the first.
    rollout = get_json(store, "runs/h/roll.json")
    rollout["samples"][0].update(tokens=rollout["samples"][0]["tokens"][:2], finish_reason="stop",
                                 stop_token=info.eos_token_ids[-1])
    put_json(store, "runs/h/roll2.json", rollout)
    score = _call("score", {"policy": ref.model_dump(), "reference_key": p.init_key, "dataset_key": p.train_key,
                            "rollout_keys": ["runs/h/roll2.json"], "rewards": [{"name": "repeat"}],
                            "algorithm": cfg.algorithm.model_dump(), "output_key": "runs/h/scored/manifest.json"})
    tensors, meta = load_tensors(store, score["scored_key"])
    first = next(s for s in meta["samples"] if (s["prompt_id"], s["sample_index"]) == (0, 0))
    assert first["response"][-1] == info.eos_token_ids[-1] and first["finish_reason"] == "stop"
    assert torch.isfinite(tensors["old_logp"]).all() and score["num_samples"] == 16
    tensors["rewards"] = torch.tensor([1.0, 0.0] * 8)  # mixed rewards: every group has a gradient
    publish_tensors(store, "runs/h/scored2/manifest.json", tensors, meta)
    train = _call("train_step", {"policy": ref.model_dump(), "optimizer_key": None,
                                 "scored_keys": ["runs/h/scored2/manifest.json"],
                                 "algorithm": cfg.algorithm.model_dump(), "seed": 0, "step": 0,
                                 "output_prefix": "runs/h/train"})
    before, _ = load_tensors(store, p.init_key)
    after, _ = load_tensors(store, train["policy_key"])
    assert set(before) == set(after) and all(torch.isfinite(t).all() for t in after.values())
    assert not torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    tied = json.loads((info.path / "config.json").read_text())["tie_word_embeddings"]
    assert ("lm_head.weight" in after) is not tied  # a tied head is the embedding: stored once, under its name
    if "lm_head.weight" in after:
        same = torch.equal(after["lm_head.weight"], after["model.embed_tokens.weight"])
        assert same == tied  # tied stays tied after an update; untied heads move on their own
    # The next version loads back and generates (version 1 through the same actions).
    ref1 = ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=train["policy_key"], policy_version=1)
    _call("generate", {"model": ref1.model_dump(), "dataset_key": p.train_key, "run_seed": 0, "step": 1,
                       "shard": "g", "prompt_ids": [4], "group_size": 2, "max_new_tokens": 4,
                       "temperature": 1.0, "output_key": "runs/h/roll3.json"})


def test_tiny_model_cli_writes_a_loadable_folder_and_refuses_bad_flags(tmp_path, capsys):
    from flows.commands.cli import main

    assert main(["tiny-model", "--out", str(tmp_path / "m"), "--arch", "mistral", "--untied",
                 "--pad-token", "<pad>", "--hidden-size", "32", "--num-heads", "2", "--num-kv-heads", "1"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["model_type"] == "mistral" and config["tie_word_embeddings"] is False
    assert config["pad_token_id"] == printed["pad_token_id"] is not None and config["hidden_size"] == 32
    assert main(["tiny-model", "--out", str(tmp_path / "x"), "--num-heads", "3"]) == 2
    assert main(["tiny-model", "--out", str(tmp_path / "y"), "--eos-token", "<nope>"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--num-heads 3" in err[0] and "<nope>" in err[1]
    assert not (tmp_path / "x").exists()


def test_tiny_model_cli_refuses_what_it_cannot_write_or_run_and_replaces_a_folder_only_whole(tmp_path, capsys):
    from flows.commands.cli import main

    (tmp_path / "afile").write_text("")
    assert main(["tiny-model", "--out", str(tmp_path / "afile" / "m")]) == 2
    assert main(["tiny-model", "--out", str(tmp_path / "odd"), "--hidden-size", "6", "--num-heads", "2",
                 "--num-kv-heads", "2"]) == 2  # heads of 3 dimensions: rotary embeddings need pairs
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "which is a file, not a folder" in err[0] and "even number" in err[1]
    assert not (tmp_path / "odd").exists()
    m = tmp_path / "m"
    assert main(["tiny-model", "--out", str(m), "--hidden-size", "32", "--num-heads", "2"]) == 0
    assert (m / "generation_config.json").exists()
    (m / "notes.txt").write_text("the user's")
    before = {p.name: p.read_bytes() for p in m.iterdir()}
    # a folder with something in it (a trained export, say) is not written over unasked
    assert main(["tiny-model", "--out", str(m), "--reward"]) == 2
    err = capsys.readouterr().err
    assert f"--out {str(m)!r} is not empty (6 entries, e.g. 'config.json')" in err and "--force" in err, err
    # --force with a flag the writer refuses part-way: the folder stays as it was
    assert main(["tiny-model", "--out", str(m), "--force", "--eos-token", "<nope>"]) == 2
    assert {p.name: p.read_bytes() for p in m.iterdir()} == before
    # --force replaces the folder whole: a reward model over a causal LM's folder keeps neither
    # its generation config nor anything else that was there
    assert main(["tiny-model", "--out", str(m), "--hidden-size", "32", "--num-heads", "2", "--reward", "--force"]) == 0
    assert sorted(p.name for p in m.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                   "tokenizer_config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "m"]  # nothing staged is left beside it


def test_a_policy_folder_whose_config_disagrees_with_its_weights_is_refused_by_prepare_in_one_line(tmp_path):
    """prepare names the tensor, rather than passing on the loader's report, and writes nothing."""
    folder = write_tiny_model_dir(tmp_path / "qwen2", "qwen2").path
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    cfg = load_config(None, [f"model.path={folder}"]).workload()
    with pytest.raises(ValueError, match=r"^model.path '.*qwen2': tensor model.layers.0.mlp.\w+.weight has shape "
                                         r"\[\d+, \d+\] in the weights, but config.json gives "):
        prepare(cfg, LocalStore(tmp_path / "store"), "runs/x")
    assert not [p for p in (tmp_path / "store").rglob("*") if p.is_file()]


def test_a_model_whose_embedding_is_smaller_than_its_tokenizer_is_refused_by_prepare_in_one_line(tmp_path):
    """config.json vocab_size 400 under a tokenizer of 516 tokens: the prompts' ids past 399
    would fail the warm-up's first forward after the run was written; prepare names the id,
    where it occurs and the fix, and writes nothing."""
    from transformers import AutoModelForCausalLM

    folder = write_tiny_model_dir(tmp_path / "m", "llama", chat_template=False).path
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.resize_token_embeddings(400)
    model.save_pretrained(folder)
    cfg = load_config(None, [f"model.path={folder}"]).workload()
    with pytest.raises(ValueError, match=r"^model.path '.*m': token id \d+ \((train prompt \d+|the \w+ id)\) is beyond "
                                         r"the model's 400 embedding rows .*resize_token_embeddings"):
        prepare(cfg, LocalStore(tmp_path / "store"), "runs/x")
    assert not [p for p in (tmp_path / "store").rglob("*") if p.is_file()]


def test_check_vocab_names_the_first_id_past_the_embedding_and_where_it_occurs():
    from actions.prepare import check_vocab

    tokens = {"0": {"prompt": [1, 9]}, "1": {"prompt": [2]}}
    check_vocab("m", 10, tokens, [[3], [9]], {"pad": [0], "EOS": [9]})  # ids up to 9 fit 10 rows
    for train, evals, special, where in (([1, 10], [[3]], [0], "train prompt 0"),
                                         ([1], [[3], [12]], [0], "eval prompt 1"),
                                         ([1], [[3]], [10], "the pad id")):
        with pytest.raises(ValueError, match=rf"token id \d+ \({where}\) is beyond the model's 10 embedding rows"):
            check_vocab("m", 10, {"0": {"prompt": train}}, evals, {"pad": special, "EOS": [9]})


def test_the_profile_reads_a_gpt2_config_s_own_names():
    """GPT-2 names its sizes n_head, n_embd and n_layer: the profile's KV bytes per token read
    them as transformers does (a KeyError in the campaign's profile action otherwise)."""
    from actions.profile import kv_bytes_per_token

    gpt2 = {"model_type": "gpt2", "n_head": 4, "n_embd": 64, "n_layer": 3, "vocab_size": 100}
    llama = {"model_type": "llama", "num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 3,
             "vocab_size": 100}
    assert kv_bytes_per_token(gpt2, torch.float32) == kv_bytes_per_token(llama, torch.float32) == 2 * 3 * 4 * 16 * 4
    assert kv_bytes_per_token({**llama, "num_key_value_heads": 1, "head_dim": 32}, torch.bfloat16) == 2 * 3 * 32 * 2
    llava = {"model_type": "llava", "text_config": llama}  # a multimodal config: its text part decodes
    assert kv_bytes_per_token(llava, torch.float32) == kv_bytes_per_token(llama, torch.float32)


def test_the_first_step_s_reference_is_the_policy_s_model_and_its_log_probs(prepared):
    """Score at the first step, whose reference is the sampling version itself: one model in the
    warm cache (no second copy built), and the reference log-probs are the policy's."""
    from actions.models import warm

    info, cfg, store, p = prepared
    ref = ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=p.init_key, policy_version=0)
    gen = _call("generate", {"model": ref.model_dump(), "dataset_key": p.train_key, "run_seed": 0, "step": 0,
                             "shard": "r", "prompt_ids": [0, 1], "group_size": 2, "max_new_tokens": 5,
                             "temperature": 1.0, "output_key": "runs/h/ref-roll.json"})
    assert len(gen["samples"]) == 4
    warm.clear()
    algorithm = cfg.algorithm.model_copy(update={"kl_coef": 0.05}).model_dump()
    score = _call("score", {"policy": ref.model_dump(), "reference_key": p.init_key, "dataset_key": p.train_key,
                            "rollout_keys": ["runs/h/ref-roll.json"], "rewards": [{"name": "repeat"}],
                            "algorithm": algorithm, "output_key": "runs/h/ref-scored/manifest.json"})
    tensors, _ = load_tensors(store, score["scored_key"])
    assert torch.equal(tensors["ref_logp"], tensors["old_logp"]) and score["kl_mean"] == 0.0
    # generate ran here: its slot's model served the policy and the reference, and no model was built
    assert [k for k in warm._cache if k[0] == "model"] == []
    # one epoch of one mini-batch: no old log-probs (the update's own are), the reference's still the policy's
    on_policy = cfg.algorithm.model_copy(update={"kl_coef": 0.05, "num_minibatches": 1, "epochs": 1}).model_dump()
    score = _call("score", {"policy": ref.model_dump(), "reference_key": p.init_key, "dataset_key": p.train_key,
                            "rollout_keys": ["runs/h/ref-roll.json"], "rewards": [{"name": "repeat"}],
                            "algorithm": on_policy, "output_key": "runs/h/ref-scored1/manifest.json"})
    alone, _ = load_tensors(store, score["scored_key"])
    assert "old_logp" not in alone and torch.equal(alone["ref_logp"], tensors["ref_logp"])
    assert [k for k in warm._cache if k[0] == "model"] == []
