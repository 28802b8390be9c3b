"""What a user's model folder may be and what its export keeps: generation settings the run
never applied are not exported; a folder that is not a causal LM (T5), that brings code of its
own (``auto_map``) or whose weights lack the causal LM's head (a classifier, a bare base model)
is refused in one line before anything is written, and the folder's code never runs; every
tokenizer file of the folder is exported verbatim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from actions.store import LocalStore
from flows.commands.cli import main
from flows.commands.tiny_model_dir import write_tiny_model_dir
from flows.config import load_config


def prepare_and_commit(tmp: Path, folder: Path, run: str, *overrides: str):
    """(store, commit 0, config) of run ``run`` prepared from ``folder`` (no warm-up: commit 0's
    policy is the initial weights as read, in fp32)."""
    from actions.prepare import prepare
    from flows.campaign.state import CampaignState, commit_state

    cfg = load_config(None, [f"model.path={folder}", f"store.uri={tmp / 'store'}", f"run_id={run}",
                             "warmup.steps=0", *overrides])
    store = LocalStore(tmp / "store")
    prepared = prepare(cfg.workload(), store, f"runs/{run}")
    state = CampaignState(run_id=run, fingerprint=cfg.fingerprint(), identity=cfg.identity(), step=0,
                          policy_key=prepared.init_key, reference_key=prepared.init_key, prepared=prepared)
    commit_state(store, state)
    return store, state, cfg


def _nothing_written(tmp: Path) -> bool:
    return not [p for p in (tmp / "store").rglob("*") if p.is_file()]


# ----------------------------------------------------------------------------- generation settings

def test_the_export_drops_lengths_and_token_rules_the_run_never_applied(tmp_path, capsys):
    """A folder's generation_config.json with a 3-token budget, a 2-token minimum (EOS cannot be
    drawn before it), suppressed, banned and forced tokens: the run sampled up to
    generation.max_new_tokens with none of them, and so does the export."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    folder = write_tiny_model_dir(tmp_path / "m", "llama").path
    source = GenerationConfig.from_pretrained(folder)
    odd = dict(max_new_tokens=3, min_new_tokens=2, min_length=4, max_length=9, suppress_tokens=[5, 6],
               begin_suppress_tokens=[8], bad_words_ids=[[7]], forced_bos_token_id=10, forced_eos_token_id=9,
               sequence_bias={(11,): -5.0}, exponential_decay_length_penalty=(2, 1.5), stop_strings=["ab"])
    GenerationConfig(eos_token_id=source.eos_token_id, do_sample=True, temperature=0.6, **odd).save_pretrained(folder)
    store, _, _ = prepare_and_commit(tmp_path, folder, "gen", "generation.max_new_tokens=7")
    assert main(["export", "gen", "--store", str(store.root), "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    saved = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert saved["max_new_tokens"] == 7
    assert not {k: saved[k] for k in odd if k != "max_new_tokens" and saved.get(k) is not None}, saved
    gen = GenerationConfig.from_pretrained(tmp_path / "out")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    prompt = torch.tensor([[5, 9, 14]])
    # greedy, no stop: 7 tokens, and the first step's scores are the model's own logits (within
    # round-off of one forward): nothing suppressed, banned or forced
    gen.update(do_sample=False, output_scores=True, return_dict_in_generate=True, eos_token_id=None)
    out = model.generate(prompt, generation_config=gen)
    assert out.sequences.shape[1] - prompt.shape[1] == 7
    with torch.no_grad():
        first = model(prompt).logits[0, -1]
    assert torch.isfinite(out.scores[0]).all() and torch.allclose(out.scores[0][0], first, atol=1e-6)


def test_an_export_without_the_runs_length_states_none():
    """``RunSettings`` without ``max_new_tokens`` (not known): the folder's is cleared, not kept."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from actions.models.export import RunSettings, _sample_as_trained

    model = SimpleNamespace(generation_config=GenerationConfig(max_new_tokens=3, min_new_tokens=2, max_length=5))
    _sample_as_trained(model, RunSettings())
    assert (model.generation_config.max_new_tokens, model.generation_config.min_new_tokens,
            model.generation_config.max_length) == (None, None, None)


# ----------------------------------------------------------------------------- not a causal LM

def _t5_folder(tmp: Path) -> Path:
    from transformers import T5Config, T5ForConditionalGeneration

    folder = write_tiny_model_dir(tmp / "t5", "llama", chat_template=False).path
    for name in ("model.safetensors", "config.json", "generation_config.json"):
        (folder / name).unlink()
    T5ForConditionalGeneration(T5Config(vocab_size=576, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16,
                                        eos_token_id=1, pad_token_id=0, decoder_start_token_id=0)
                               ).save_pretrained(folder)
    return folder


def test_a_t5_folder_is_refused_at_the_cli_in_one_line(tmp_path, capsys):
    """An encoder-decoder is not a causal LM: one line at the CLI naming model.path, the
    architecture and model type and the fix, before the store is touched, rather than the
    loader's list of every causal model type inside prepare."""
    folder = _t5_folder(tmp_path)
    capsys.readouterr()
    assert main(["train", "--set", f"model.path={folder}", "--set", f"store.uri={tmp_path / 'store'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and len(err) < 400, err
    assert (f"model.path {str(folder)!r}: T5ForConditionalGeneration (model_type t5) is not a causal language "
            "model; use a decoder-only model") in err, err
    assert not (tmp_path / "store").exists()


# ----------------------------------------------------------------------------- code of the model's own

def _custom_code_folder(tmp: Path, model_type: str = "mycustomlm") -> tuple[Path, Path]:
    """(a llama folder whose config.json maps AutoConfig and AutoModelForCausalLM to modules of
    its own, the file those modules create when they run)."""
    folder = write_tiny_model_dir(tmp / "custom", "llama").path
    marker = tmp / "custom-code-ran"
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type=model_type, architectures=["MyLM"],
                  auto_map={"AutoConfig": "configuration_my.MyConfig", "AutoModelForCausalLM": "modeling_my.MyLM"})
    (folder / "config.json").write_text(json.dumps(config))
    for module in ("configuration_my", "modeling_my"):
        (folder / f"{module}.py").write_text(
            f"open({str(marker)!r}, 'w').close()\nfrom transformers import LlamaConfig, LlamaForCausalLM\n"
            f"class MyConfig(LlamaConfig):\n    model_type = {model_type!r}\n"
            "class MyLM(LlamaForCausalLM):\n    config_class = MyConfig\n")
    return folder, marker


@pytest.mark.parametrize("field", ["model.path", "reward.models[0].path"])
def test_a_folder_with_auto_map_is_refused_before_transformers_reads_it(tmp_path, monkeypatch, field):
    """validate_model_dir refuses auto_map itself, naming the field, the map and the fix: no
    transformers call is made, so none can ask whether to run the folder's code."""
    import transformers

    from actions.prepare import validate_model_dir

    folder, marker = _custom_code_folder(tmp_path)
    called = []
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda *a, **k: called.append(a))
    with pytest.raises(ValueError) as exc:
        validate_model_dir(str(folder), field=field)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{field} {str(folder)!r}: config.json has auto_map (AutoConfig: "
                                              "configuration_my.MyConfig, AutoModelForCausalLM: modeling_my.MyLM)")
    assert "trust_remote_code are not supported" in msg and "'mycustomlm' is not one the installed" in msg
    assert not called and not marker.exists()


def test_a_built_in_model_type_with_auto_map_loads_with_transformers_own_code(tmp_path, user_says_yes):
    """An older checkpoint of a type transformers has built in (Phi-3's had an auto_map) is
    accepted: every read passes trust_remote_code=False, so its own classes load it and the
    folder's code never runs, even where a user would allow it."""
    from actions.models.modeling import read_model_dir
    from actions.prepare import validate_model_dir

    folder, marker = _custom_code_folder(tmp_path, model_type="llama")
    validate_model_dir(str(folder))
    files, tensors = read_model_dir(folder)
    assert "model.embed_tokens.weight" in tensors and "config.json" in files
    assert not marker.exists()


def test_the_cli_refuses_a_folder_with_auto_map_in_one_line(tmp_path, capsys):
    folder, marker = _custom_code_folder(tmp_path)
    capsys.readouterr()
    assert main(["train", "--set", f"model.path={folder}", "--set", f"store.uri={tmp_path / 'store'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.json has auto_map" in err, err
    assert not marker.exists() and not (tmp_path / "store").exists()


@pytest.fixture
def user_says_yes(monkeypatch):
    """transformers as a user at a terminal answering y to "Do you wish to run the custom code?":
    any load that leaves trust_remote_code unset would run the folder's code."""
    from transformers.models.auto import auto_factory, configuration_auto, tokenization_auto

    def resolve(trust_remote_code, *args, **kwargs):
        return True if trust_remote_code is None else trust_remote_code

    for module in (auto_factory, configuration_auto, tokenization_auto):
        monkeypatch.setattr(module, "resolve_trust_remote_code", resolve)


def _readers():
    """Every reader of a user's folder past validate_model_dir, as (name, call(folder))."""
    from actions.models import modeling, special_tokens, weight_shapes
    from actions.tasks.rewards import model_files

    tok = modeling.build_char_tokenizer()
    return {
        "load_tokenizer": lambda f: model_files.load_tokenizer(str(f), "model.path"),
        "special_tokens_of_dir": lambda f: special_tokens.special_tokens_of_dir(f, tok),
        "check_config": lambda f: weight_shapes.check_config(f, "model.path"),
        "check_causal_lm": lambda f: weight_shapes.check_causal_lm(f, "model.path"),
        "built_shapes": lambda f: weight_shapes.built_shapes(f, "AutoModelForCausalLM"),
        "folder_positions": lambda f: model_files.folder_positions(str(f)),
        "read_model_dir": lambda f: modeling.read_model_dir(f),
        "read_base": lambda f: modeling.read_base({p.name: p.read_bytes() for p in f.iterdir() if p.is_file()}),
    }


@pytest.mark.parametrize("model_type", ["mycustomlm", "llama"])
@pytest.mark.parametrize("reader", sorted(_readers()))
def test_no_reader_of_a_folder_runs_its_code_even_when_the_user_would_allow_it(tmp_path, user_says_yes, reader,
                                                                               model_type):
    folder, marker = _custom_code_folder(tmp_path, model_type)
    try:
        _readers()[reader](folder)
    except (ValueError, OSError):
        pass  # refusing the folder is fine; running its code is not
    assert not marker.exists()


# ----------------------------------------------------------------------------- weights without the causal LM's head

@pytest.mark.parametrize("kind", ["classifier", "bare-untied"])
def test_weights_without_the_lm_head_are_refused_by_prepare_before_any_write(tmp_path, kind):
    """A sequence classifier's folder (score head, no lm_head.weight) and a bare LlamaModel's
    with an untied head would train from a randomly initialised head: refused in one line
    naming model.path, the missing tensor and the folder's architectures."""
    from actions.prepare import prepare

    if kind == "classifier":
        folder = write_tiny_model_dir(tmp_path / "m", "llama", reward=True, tie_word_embeddings=False).path
        arch = "LlamaForSequenceClassification"
    else:
        from transformers import AutoConfig, LlamaModel

        folder = write_tiny_model_dir(tmp_path / "m", "llama", tie_word_embeddings=False).path
        LlamaModel(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
        arch = "LlamaModel"
    cfg = load_config(None, [f"model.path={folder}"]).workload()
    with pytest.raises(ValueError) as exc:
        prepare(cfg, LocalStore(tmp_path / "store"), "runs/x")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"model.path {str(folder)!r}: its weights have no lm_head.weight "
                                              f"(config.json architectures: {arch}), which AutoModelForCausalLM "
                                              "would initialise at random"), msg
    assert _nothing_written(tmp_path)


def test_a_bare_base_model_with_a_tied_head_is_a_whole_causal_lm(tmp_path):
    """Qwen2Model's weights under tie_word_embeddings: the head is the input embedding, so
    nothing is missing and the folder reads as the causal LM."""
    from transformers import AutoConfig, Qwen2Model

    from actions.models.modeling import read_model_dir

    folder = write_tiny_model_dir(tmp_path / "m", "qwen2").path
    bare = Qwen2Model(AutoConfig.from_pretrained(folder))
    bare.save_pretrained(folder)
    _, tensors = read_model_dir(folder)
    assert torch.equal(tensors["lm_head.weight"], bare.embed_tokens.weight)


# ----------------------------------------------------------------------------- tokenizer files

def test_a_slow_tokenizer_s_files_beside_tokenizer_json_are_exported_verbatim(tmp_path, capsys):
    """tokenizer.model, vocab.json and merges.txt (what llama.cpp's converter and slow
    tokenizers read) are kept with the base and written to the export byte for byte."""
    from transformers import AutoTokenizer

    folder = write_tiny_model_dir(tmp_path / "m", "llama").path
    slow = {"vocab.json": b'{"a": 0}', "merges.txt": b"#version: 0.2\n", "tokenizer.model": bytes(range(256))}
    for name, data in slow.items():
        (folder / name).write_bytes(data)
    store, _, _ = prepare_and_commit(tmp_path, folder, "tok")
    assert main(["export", "tok", "--store", str(store.root), "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    for name in ("tokenizer.json", "tokenizer_config.json", *slow):
        assert (tmp_path / "out" / name).read_bytes() == (folder / name).read_bytes(), name
    text = "Ann has 12 apples.\n#### 42"
    assert AutoTokenizer.from_pretrained(tmp_path / "out")(text)["input_ids"] == \
        AutoTokenizer.from_pretrained(folder)(text)["input_ids"]

