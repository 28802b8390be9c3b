"""``rlhfless export`` gives the policy as the run computed and sampled it (dtype, sampling
settings, a merged tied head without PEFT's tying warning), names the steps it can export and
an empty --out, and a LoRA export folder is refused as ``model.path`` rather than trained from
without its adapter."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from actions.contracts import ModelRef
from actions.store import LocalStore
from flows.commands.cli import main
from flows.commands.tiny_model_dir import write_tiny_model_dir

try:
    from test_model_folder_checks import prepare_and_commit
except ImportError:  # tests/ imported as a package
    from tests.test_model_folder_checks import prepare_and_commit

IDS = torch.tensor([[5, 9, 14, 3, 22, 7]])


def _run(tmp: Path, run: str, *overrides: str) -> tuple[LocalStore, object, object]:
    """(store, commit 0, config) of run ``run``, prepared from a tiny Qwen2 folder."""
    return prepare_and_commit(tmp, write_tiny_model_dir(tmp / "qwen2", "qwen2").path, run, *overrides)


def _ref(store: LocalStore, state, cfg, **update) -> ModelRef:
    return ModelRef(store_uri=str(store.root), base_key=state.prepared.base_key, policy_key=state.policy_key,
                    policy_version=state.policy_version, dtype=cfg.model.dtype, lora=cfg.model.lora,
                    backbone_key=state.reference_key if cfg.model.lora else None).model_copy(update=update)


def _commit_adapter(store: LocalStore, state, cfg, step: int, dtype: torch.dtype, shift: float = 0.05):
    """Commit ``step``: the seeded adapter moved by ``shift`` (B off zero), published in ``dtype``."""
    from actions.models.loading import load_model
    from actions.models.lora import adapter_tensors
    from actions.store.weights import publish_tensors
    from flows.campaign.state import commit_state

    seeded, _, _ = load_model(_ref(store, state, cfg, dtype="float32"), fresh=True)
    adapter = {k: (v.detach() + shift).to(dtype) for k, v in adapter_tensors(seeded).items()}
    v = publish_tensors(store, f"runs/{state.run_id}/steps/{step - 1:06d}/train/policy/manifest.json", adapter)
    later = state.model_copy(update={"step": step, "policy_key": v.manifest_key, "policy_version": step,
                                     "weights_sha256": v.weights_sha256})
    commit_state(store, later)
    return later


def _export(store: LocalStore, run: str, out: Path, *args: str) -> dict:
    assert main(["export", run, "--store", str(store.root), "--out", str(out), *args]) == 0
    return json.loads((out / "config.json").read_text())


# ----------------------------------------------------------------------------- dtype and sampling

def test_step_0_of_a_bf16_run_without_warm_up_exports_in_bf16_with_the_runs_sampling(tmp_path, capsys):
    """Version 0 is the model folder as read (fp32); the actions cast it to model.dtype, and so
    does the export: bf16, with the logits the run evaluated bit for bit. Its generation config
    samples as the run did (temperature 0.9, top_k 5, no top_p), not as the folder's (0.7)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from actions.models.loading import load_model

    store, state, cfg = _run(tmp_path, "bf", "model.dtype=bfloat16", "generation.temperature=0.9",
                             "generation.top_k=5")
    assert json.loads((tmp_path / "qwen2" / "generation_config.json").read_text())["temperature"] == 0.7
    assert _export(store, "bf", tmp_path / "v0", "--step", "0")["dtype"] == "bfloat16"
    assert json.loads(capsys.readouterr().out)["dtype"] == "bfloat16"
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "v0", dtype=torch.bfloat16).eval()
    assert {p.dtype for p in exported.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        want = load_model(_ref(store, state, cfg), fresh=True)[0](IDS).logits
        assert torch.equal(exported(IDS).logits, want)
    gen = GenerationConfig.from_pretrained(tmp_path / "v0")
    assert (gen.do_sample, gen.temperature, gen.top_k, gen.top_p) == (True, 0.9, 5, 1.0)


def test_sampling_settings_the_run_had_off_are_written_neutral(tmp_path):
    """A run without top_k or top_p (an absent top_k is 50 to generate()) and a greedy run
    (temperature 0: do_sample false), over a folder whose generation config carries an
    instruct model's settings (temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05)."""
    from transformers import GenerationConfig

    from actions.models.export import export_policy
    from actions.store import get_artifact, put_artifact

    store, state, _ = _run(tmp_path, "gs")
    base, policy = state.prepared.base_key, state.policy_key
    export_policy(store, base, policy, tmp_path / "default", run="gs")
    gen = GenerationConfig.from_pretrained(tmp_path / "default")
    assert (gen.do_sample, gen.temperature, gen.top_k, gen.top_p) == (True, 1.0, 0, 1.0)

    from actions.models.export import RunSettings

    files, meta = get_artifact(store, base)
    instruct = {**json.loads(files["generation_config.json"]), "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                "repetition_penalty": 1.05}
    put_artifact(store, "runs/gs/base2/manifest.json",
                 {**files, "generation_config.json": json.dumps(instruct).encode()}, meta)
    export_policy(store, "runs/gs/base2/manifest.json", policy, tmp_path / "hot", run="gs",
                  settings=RunSettings(temperature=1.3, top_p=0.95))
    gen = GenerationConfig.from_pretrained(tmp_path / "hot")
    assert (gen.do_sample, gen.temperature, gen.top_k, gen.top_p, gen.repetition_penalty) == (True, 1.3, 0, 0.95,
                                                                                              None)
    export_policy(store, "runs/gs/base2/manifest.json", policy, tmp_path / "greedy", run="gs",
                  settings=RunSettings(temperature=0.0, top_k=7))
    saved = json.loads((tmp_path / "greedy" / "generation_config.json").read_text())
    assert saved["do_sample"] is False and not {"temperature", "top_k", "top_p", "repetition_penalty"} & set(saved)
    assert saved["eos_token_id"] == instruct["eos_token_id"]  # the stop tokens stay the run's


# ----------------------------------------------------------------------------- LoRA exports

@pytest.fixture(scope="module")
def bf16_lora(tmp_path_factory):
    """A bf16 ``model.lora`` run whose adapter targets the tied output head too: its backbone
    (commit 0, stored as read: fp32) and one bf16 adapter (commit 1)."""
    tmp = tmp_path_factory.mktemp("bf16-lora")
    with warnings.catch_warnings():  # PEFT's tied-head warning, when the adapter is attached to seed it
        warnings.simplefilter("ignore")
        store, state, cfg = _run(tmp, "lb", "model.lora.r=4", "model.dtype=bfloat16",
                                 "model.lora.target_modules=[q_proj,v_proj,lm_head]")
        v1 = _commit_adapter(store, state, cfg, 1, torch.bfloat16)
    return store, v1, cfg


def test_the_readmes_bf16_adapter_load_gives_the_runs_logits_bit_for_bit(tmp_path, bf16_lora):
    """README ("export") names the one form of loading a bf16 adapter export that is exact:
    PeftModel.from_pretrained with autocast_adapter_dtype=False. It is run here as written there."""
    from peft import PeftModel  # noqa: F401 -- named by the README's snippet
    from transformers import AutoModelForCausalLM

    from actions.models.loading import load_model

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    snippet = re.search(r'`(PeftModel\.from_pretrained\(base, DIR \+ "/adapter", autocast_adapter_dtype=False\))`',
                        readme)
    assert snippet, "README's export section names the exact bf16 load"
    assert "`AutoPeftModelForCausalLM` refuses the flag" in readme
    store, v1, cfg = bf16_lora
    out = tmp_path / "adapter-form"
    _export(store, "lb", out)
    base = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    model = eval(snippet.group(1), {"PeftModel": PeftModel, "base": base, "DIR": str(out)}).eval()
    with torch.no_grad():
        want = load_model(_ref(store, v1, cfg), fresh=True)[0](IDS).logits
        assert torch.equal(model(IDS).logits, want)


def test_merging_a_tied_head_adapter_unties_it_without_peft_s_warning(tmp_path, bf16_lora, capsys):
    """PEFT warns that a LoRA on a tied output head "can lead to complications, for example
    when merging"; the export unties the head before merging (its own copy, config untied), so
    the warning is not printed, and the merged model keeps the trained head."""
    from transformers import AutoModelForCausalLM

    from actions.models.loading import load_model

    store, v1, cfg = bf16_lora
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        config = _export(store, "lb", tmp_path / "merged", "--merge-lora")
    assert not [str(w.message) for w in seen if "tie_word_embeddings" in str(w.message)]
    assert "tie_word_embeddings" not in capsys.readouterr().err
    assert config["tie_word_embeddings"] is False and config["dtype"] == "bfloat16"
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    with torch.no_grad():
        want = load_model(_ref(store, v1, cfg, dtype="float32"), fresh=True)[0](IDS).logits
        # merged weights rounded to bf16 once each: within bf16 rounding of the run's model
        assert float((merged(IDS).logits - want).abs().max()) <= 0.1


@pytest.mark.parametrize("where", ["", "adapter"])
@pytest.mark.parametrize("command", ["train", "profile"])
def test_a_lora_export_folder_as_model_path_is_refused_in_one_line(tmp_path, bf16_lora, capsys, where, command):
    """An adapter export (backbone + adapter/) would start a run from the backbone alone, its
    adapter ignored; its adapter/ folder alone has no config.json. Both are refused naming
    model.path, the value, the adapter file and the --merge-lora export to train from."""
    store, _, _ = bf16_lora
    out = tmp_path / "exp"
    _export(store, "lb", out)
    path = str(out / where) if where else str(out)
    args = {"train": ["train", "--set", f"store.uri={tmp_path / 'runs'}"],
            "profile": ["profile", "--output", str(tmp_path / "p.json")]}[command]
    capsys.readouterr()
    assert main([*args, "--set", f"model.path={path}"]) == 2
    err = capsys.readouterr().err.strip()
    adapter = "adapter_config.json" if where else "adapter/adapter_config.json"
    assert len(err.splitlines()) == 1, err
    for needle in (f"model.path {path!r} holds a LoRA adapter ({adapter}), which training would ignore",
                   "`rlhfless export RUN_ID --merge-lora --out DIR`", "set model.path to DIR"):
        assert needle in err, f"{needle!r} not in: {err}"
    assert not (tmp_path / "runs").exists() and not (tmp_path / "p.json").exists()


# ----------------------------------------------------------------------------- the error lines

def test_a_step_not_committed_names_the_steps_that_can_be_exported(tmp_path, capsys):
    """Steps 1 and 2 collected (store.keep_last): --step 9 lists 0, 3, 4, not "0..4"."""
    from actions.store.weights import publish_tensors
    from flows.campaign.state import commit_state

    store, state, _ = _run(tmp_path, "gc")
    tensors = {"x": torch.zeros(2)}
    for step in range(1, 5):
        v = publish_tensors(store, f"runs/gc/steps/{step - 1:06d}/train/policy/manifest.json",
                            {**tensors, "x": torch.full((2,), float(step))})
        commit_state(store, state.model_copy(update={"step": step, "policy_key": v.manifest_key,
                                                     "policy_version": step, "weights_sha256": v.weights_sha256}))
    for step in (1, 2):  # what collection deletes: the versions' manifests under steps/
        shutil.rmtree(tmp_path / "store" / "runs" / "gc" / "steps" / f"{step - 1:06d}")
    assert main(["export", "gc", "--store", str(tmp_path / "store"), "--step", "9", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "export --step 9: run 'gc' can export steps 0, 3, 4 (the versions of the other steps up to 4 were " \
           "collected, store.keep_last); pass one of them" in err, err
    assert not (tmp_path / "o").exists()
    from flows.commands.export import compact

    assert (compact([0, 3, 4]), compact([0, 1, 2, 3, 7, 9, 10, 11]), compact([0, 1])) == \
        ("0, 3, 4", "0..3, 7, 9..11", "0, 1")


def test_an_empty_out_is_refused_by_name(tmp_path, capsys, monkeypatch):
    """``--out ''`` is not the current folder: it is named as given, with the fix."""
    monkeypatch.chdir(tmp_path)
    assert main(["export", "ex", "--store", str(tmp_path / "s"), "--out", ""]) == 2
    err = capsys.readouterr().err
    assert "export --out '' is empty; pass the folder to write, e.g. --out ./policy" in err, err
    assert "'.'" not in err


def test_a_ppo_runs_report_says_its_critic_stays_in_the_store(tmp_path, capsys):
    """The policy alone is exported (as TRL's PPOTrainer saves it); the report names where the
    run's critic stays, and a run without one has no such field."""
    from flows.campaign.state import commit_state

    store, state, _ = _run(tmp_path, "pp", "algorithm.name=ppo")
    critic = "runs/pp/critic/v000000/manifest.json"
    commit_state(store, state.model_copy(update={"step": 1, "critic_key": critic}))  # the policy as at 0
    _export(store, "pp", tmp_path / "out")
    assert json.loads(capsys.readouterr().out)["critic"] == f"not exported: it stays in the store at {critic}"
    store, _, _ = _run(tmp_path / "grpo", "gr")
    _export(store, "gr", tmp_path / "grpo-out")
    assert "critic" not in json.loads(capsys.readouterr().out)
