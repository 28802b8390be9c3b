"""Reward functions as TRL writes them (every keyword, async), and learned reward models
(``reward.models``): scoring, the warm cache, and a campaign scored by both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import trl_doc_rewards
import trl_style_rewards
import yaml

import flows.campaign.run  # noqa: F401  (Prefect sets its logging up here, not under a test's capsys)
from actions.config.workload import RewardFunctionConfig as Fn
from actions.config.workload import RewardModelConfig
from actions.contracts import ModelRef, RewardModelRef
from actions.models import warm
from actions.store import LocalStore, put_artifact
from actions.tasks.dataset import PromptRow
from actions.tasks.rewards import check_reward_functions, compute_rewards
from actions.tasks.rewards.model_files import folder_files
from actions.tasks.rewards.model_scoring import score_with_models
from actions.tasks.rewards.trainer_state import make_trainer_state
from flows.commands.tiny_model_dir import write_tiny_model_dir
from flows.config import load_config


def _rows(prompts: list, answers: list[str], **columns: list) -> list[PromptRow]:
    return [PromptRow(prompt_id=i, prompt=p if isinstance(p, str) else "<formatted>", answer=a,
                      source_prompt=None if isinstance(p, str) else p, columns={k: v[i] for k, v in columns.items()})
            for i, (p, a) in enumerate(zip(prompts, answers))]


def test_trl_documented_reward_functions_run_unchanged():
    state = make_trainer_state(step=3, epoch=0.75, max_steps=10, optimizer_steps_per_step=1)
    rows = _rows(["Compute: 2+2", "Compute: 3*3", "Say hi"], ["4", "9", "hi"],
                 ground_truth=["4", "9", "hi"], task=["math", "math", "chat"])
    texts = [r"so \boxed{4}", r"\boxed{8} hence 8", "hi"]
    ids = [[5, 6, 7], [1], []]
    specs = [Fn(name="trl_doc_reward_len:reward_func", weight=0.1), Fn(name="trl_doc_rewards:reward_func"),
             Fn(name="trl_doc_rewards:math_reward_func"), Fn(name="trl_doc_rewards:async_reward_func"),
             Fn(name="trl_doc_rewards:curriculum_reward_func")]
    trl_doc_rewards.SEEN_STEPS.clear()
    r = compute_rewards(specs, rows, texts, completion_ids=ids, trainer_state=state)
    assert r.per_function["trl_doc_reward_len:reward_func"] == [3.0, 1.0, 0.0]  # completion_ids reached it
    assert r.per_function["trl_doc_rewards:reward_func"] == [1.0, 0.0, 0.0]  # a dataset column by keyword
    assert r.per_function["trl_doc_rewards:math_reward_func"] == [-1.0, -1.0, None]  # None: not applicable
    assert r.per_function["trl_doc_rewards:async_reward_func"] == [1.0, 0.0, 0.0]  # awaited
    # target 4 after step 1: |3-4|, |1-4|, |0-4| tokens off, over 16
    assert r.per_function["trl_doc_rewards:curriculum_reward_func"] == [1 - 1 / 16, 1 - 3 / 16, 1 - 4 / 16]
    assert trl_doc_rewards.SEEN_STEPS == [(3, 0.75, 10)]
    assert r.applicable == [True, True, True]
    chat = [[{"role": "user", "content": "think"}]] * 2
    fmt = compute_rewards([Fn(name="trl_doc_rewards:format_reward_func")], _rows(chat, ["", ""]),
                          ["<think>a</think><answer>b</answer>", "b"])
    assert fmt.total == [1.0, 0.0]  # chat prompts: completions arrive as assistant messages
    # the start-up check calls plug-ins with every keyword too (token ids of the reference answers)
    check_reward_functions(specs, rows, encode=lambda text: list(text.encode()))


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory) -> Path:
    return write_tiny_model_dir(tmp_path_factory.mktemp("rm") / "rm", "qwen2", reward=True).path


def test_reward_model_scores_batched_as_alone_and_loads_once(tmp_path, reward_model):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    store = LocalStore(tmp_path / "store")
    put_artifact(store, "runs/r/reward_models/0/manifest.json", folder_files(str(reward_model)))
    prompts = [[{"role": "user", "content": "What is 2+2?"}], [{"role": "user", "content": "Name a colour."}],
               [{"role": "user", "content": "Count to three, slowly please."}]]
    completions = [[{"role": "assistant", "content": c}] for c in ("4", "Blue, or perhaps green.", "one two three")]

    def ref(batch_size: int) -> RewardModelRef:
        return RewardModelRef(index=0, manifest_key="runs/r/reward_models/0/manifest.json",
                              settings=RewardModelConfig(path=str(reward_model), weight=0.5, batch_size=batch_size))

    warm.clear()
    alone = score_with_models([ref(1)], str(tmp_path / "store"), prompts, completions)["reward_model/0"]
    before = warm.stats()
    batched = score_with_models([ref(3)], str(tmp_path / "store"), prompts, completions)["reward_model/0"]
    assert warm.stats()["hits"] == before["hits"] + 1  # the model was loaded once
    assert alone[0] == 0.5 and batched[0] == 0.5
    assert max(abs(a - b) for a, b in zip(alone[1], batched[1])) <= 1e-5
    # the same score as the model read straight from its folder, on TRL's text
    tok = AutoTokenizer.from_pretrained(reward_model)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model).eval()
    text = tok.apply_chat_template(prompts[1] + completions[1], tokenize=False)
    with torch.no_grad():
        direct = float(model(**tok(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0])
    assert abs(batched[1][1] - direct) <= 1e-5
    assert len(set(batched[1])) == 3  # different texts, different scores


def test_campaign_scored_by_reward_model_and_trl_function(tmp_path, reward_model, prefect_harness, capsys):
    """2 steps on the tiny Qwen2 folder: a reward model plus a TRL-style function that reads
    completion_ids and trainer_state; the reward moves and every step is scored by both. The
    function gets the dataset's prompts and numeric answers (the policy reads them through its
    chat template), and what it passes to log_metric is in each step's and evaluation's metrics."""
    from flows.commands.cli import main

    policy = write_tiny_model_dir(tmp_path / "qwen2", "qwen2").path
    rows = [{"prompt": f"Add {a} and {b}.", "answer": a + b} for a in range(4) for b in range(4)]
    for name, part in (("train", rows[:12]), ("eval", rows[12:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    cfg = {"model": {"path": str(policy)},
           "data": {"train_path": str(tmp_path / "train.jsonl"), "eval_path": str(tmp_path / "eval.jsonl")},
           "reward": {"functions": [{"name": "trl_style_rewards:even_token_reward"}],
                      "models": [{"path": str(reward_model), "weight": 0.5, "batch_size": 4}]},
           "algorithm": {"batch_size": 16, "group_size": 4, "num_minibatches": 1},
           "generation": {"max_new_tokens": 12}, "store": {"uri": str(tmp_path / "store")},
           "invoker": {"kind": "inprocess"}, "steps": 2, "eval_every": 0}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    trl_style_rewards.SEEN.clear()
    trl_style_rewards.SEEN_INPUTS.clear()
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run")]) == 0, \
        capsys.readouterr()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps_completed"] == 2
    first, last = summary["reward_mean_first"], summary["reward_mean_last"]
    print(f"reward {first:.4f} -> {last:.4f}")
    # A random tiny policy has nothing to generalise from in one update, so "moves" is checked as:
    # the reward changed, every group had a reward spread and the gradient was not zero.
    assert last != first
    assert all(s["frac_reward_zero_std"] < 1.0 and s["grad_norm"] > 0.0 for s in summary["steps"])
    # a random tiny policy seldom stops before max_new_tokens, so its completions are cut; nothing else is amiss
    assert [w["kind"] for w in summary["warnings"]] in ([], ["truncated"])
    assert all(s["frac_reward_none"] == 0.0 for s in summary["steps"])
    # each scorer's rewards under its short name: the reward model's folder, the function's name
    assert all({k for k in s if k.startswith("rewards/")} == {f"rewards/{n}/{m}" for n in ("rm", "even_token_reward")
                                                              for m in ("mean", "std")} for s in summary["steps"])
    seen = trl_style_rewards.SEEN
    assert seen[0] == (0, 0.0, 2)  # the start-up check: the campaign's max_steps, 2 steps x 1 mini-batch
    assert {(s, e) for s, e, m in seen[1:] if m == 2} >= {(0, 0.0), (1, 4 / 12)}  # steps 0 and 1, 4 of 12 prompts a step
    written = {(r["prompt"], r["answer"]) for r in rows}
    assert trl_style_rewards.SEEN_INPUTS and set(trl_style_rewards.SEEN_INPUTS) <= written
    assert all(type(a) is int for _, a in trl_style_rewards.SEEN_INPUTS)
    assert all(0.0 <= s["reward_fn/even_share"] <= 1.0 for s in summary["steps"])
    assert [e["step"] for e in summary["evals"]] == [0, 2]  # evaluations report what the functions logged too
    assert all(0.0 <= e["reward_metrics"]["even_share"] <= 1.0 for e in summary["evals"])

    # the trained policy leaves the store: the exported folder gives the committed version's logits
    from transformers import AutoModelForCausalLM

    from actions.models.loading import load_model
    from actions.store import open_store
    from flows.campaign.state import load_state

    capsys.readouterr()
    assert main(["export", summary["run_id"], "--store", str(tmp_path / "store"), "--out", str(tmp_path / "hf")]) == 0
    state = load_state(open_store(str(tmp_path / "store")), summary["run_id"])
    stored, _, _ = load_model(ModelRef(store_uri=str(tmp_path / "store"), base_key=state.prepared.base_key,
                                       policy_key=state.policy_key, policy_version=state.policy_version,
                                       weights_sha256=state.weights_sha256, dtype="float32"))
    ids = torch.tensor([[5, 17, 260, 3, 99]])
    with torch.no_grad():
        exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)(ids).logits
        assert (exported - stored(ids).logits).abs().max().item() <= 1e-6


def test_campaign_on_a_dataset_without_reference_answers(tmp_path, prefect_harness, capsys):
    """2 steps on the tiny Qwen2 folder with prompts alone (no answer column) and a length
    reward, as a TRL recipe without references runs: the reward gets the dataset's columns and
    no ``answer``, and the first step is planned with the cap as every prompt's length."""
    from flows.commands.cli import main

    policy = write_tiny_model_dir(tmp_path / "qwen2", "qwen2").path
    rows = [{"prompt": f"Tell a story about {w}.", "topic": w} for w in ("cats", "rain", "ships", "bread", "maps",
                                                                          "owls", "ice", "clocks")]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {"model": {"path": str(policy)}, "data": {"train_path": str(tmp_path / "train.jsonl")},
           "reward": {"functions": [{"name": "trl_style_rewards:short_reward"}]},
           "algorithm": {"batch_size": 16, "group_size": 4, "num_minibatches": 1},
           "generation": {"max_new_tokens": 12}, "store": {"uri": str(tmp_path / "store")},
           "invoker": {"kind": "inprocess"}, "steps": 2, "eval_every": 0}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    trl_style_rewards.SEEN_KEYWORDS.clear()
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run")]) == 0, \
        capsys.readouterr()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps_completed"] == 2
    assert [w["kind"] for w in summary["warnings"]] in ([], ["truncated"])  # as above: a random tiny policy
    assert all(s["frac_reward_none"] == 0.0 and s["grad_norm"] > 0.0 for s in summary["steps"])
    assert summary["reward_mean_first"] != summary["reward_mean_last"]
    keywords = {tuple(k) for k in trl_style_rewards.SEEN_KEYWORDS}
    assert keywords == {("completion_ids", "log_extra", "log_metric", "prompts", "topic", "trainer_state")}
    tokens = json.loads(next((tmp_path / "store").rglob("tokens.json")).read_text())
    assert {t["answer_len"] for t in tokens.values()} == {12}  # generation.max_new_tokens



def _bert_reward_folder(root: Path, labels: tuple[str, ...] = ("LABEL_0",)) -> Path:
    """A tiny BERT-style reward model whose tokenizer is a WordPiece ``vocab.txt`` alone (no
    tokenizer.json), without a chat template: what many classifier checkpoints ship; one
    logit per name of ``labels``."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    root.mkdir(parents=True)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz0123456789+=?:,.",
             "question", "answer", "what", "is", "because"]
    (root / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizer(str(root / "vocab.txt")).save_pretrained(root)
    (root / "tokenizer.json").unlink(missing_ok=True)
    cfg = BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=64, id2label=dict(enumerate(labels)))
    torch.manual_seed(0)
    BertForSequenceClassification(cfg).save_pretrained(root, safe_serialization=True)
    return root


def test_a_wordpiece_reward_tokenizer_is_stored_whole_and_checked(tmp_path, monkeypatch):
    """The stored copy of a reward model reads text as the folder does (``vocab.txt`` stored);
    a tokenizer that needs a file the store would not keep is refused at the CLI."""
    from transformers import AutoTokenizer

    from actions.tasks.rewards import model_files

    folder = _bert_reward_folder(tmp_path / "bert")
    settings = RewardModelConfig(path=str(folder))
    model_files.check_tokenizer(str(folder), "reward.models[0]", RewardModelConfig(path=str(folder),
                                                                                 chat_template=False), False)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name, data in folder_files(str(folder)).items():
        (copy / name).write_bytes(data)
    text = "question: what is 2+2? answer: 4"
    want = AutoTokenizer.from_pretrained(folder)(text)["input_ids"]
    assert AutoTokenizer.from_pretrained(copy)(text)["input_ids"] == want and 1 not in want  # no [UNK]
    monkeypatch.setattr(model_files, "_FILES", tuple(n for n in model_files._FILES if n != "vocab.txt"))
    with pytest.raises(ValueError, match=r"reward.models\[0\].path .*needs files other than.*save_pretrained"):
        model_files.check_tokenizer(str(folder), "reward.models[0]", settings, False)


def test_a_classifier_with_several_labels_scores_the_named_label(tmp_path):
    """A two-label classifier scores the logit of the label it names (by name or index), checked
    at the CLI; with none named it is refused there, since its first label is often the unwanted one."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from actions.tasks.rewards.model_files import check_classifier

    folder = str(_bert_reward_folder(tmp_path / "sentiment", labels=("NEGATIVE", "POSITIVE")))
    assert check_classifier(folder, "reward.models[0]", "POSITIVE") == 1
    assert check_classifier(folder, "reward.models[0]", 0) == 0
    with pytest.raises(ValueError, match=r"reward.models\[0\].label is not set.*2 labels \(0: NEGATIVE, 1: POSITIVE\)"
                                         r".*label: POSITIVE"):
        check_classifier(folder, "reward.models[0]", None)
    with pytest.raises(ValueError, match=r"label 2 is not one of the labels"):
        check_classifier(folder, "reward.models[0]", 2)
    # a run that scored such a model's first logit before labels could be named resumes with label: 0
    fingerprint = {label: load_config(None, [f"reward.models=[{{path: {folder}, label: {label}}}]"]).fingerprint()
                   for label in ("null", "0", "POSITIVE")}
    assert fingerprint["null"] == fingerprint["0"] != fingerprint["POSITIVE"]
    store = LocalStore(tmp_path / "store")
    put_artifact(store, "runs/r/reward_models/0/manifest.json", folder_files(folder))
    texts = ["question: what is 2+2? answer: 4", "what is it? because"]
    refs = [RewardModelRef(index=i, manifest_key="runs/r/reward_models/0/manifest.json",
                           settings=RewardModelConfig(path=folder, label=label, chat_template=False))
            for i, label in enumerate(("POSITIVE", 1, 0))]
    got = score_with_models(refs, str(tmp_path / "store"), ["", ""], texts)
    tok = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        logits = AutoModelForSequenceClassification.from_pretrained(folder).eval()(
            **tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)).logits
    for name, column in (("reward_model/0", 1), ("reward_model/1", 1), ("reward_model/2", 0)):
        assert got[name][1] == pytest.approx(logits[:, column].tolist(), abs=1e-5)
    assert logits[:, 0].tolist() != pytest.approx(logits[:, 1].tolist(), abs=1e-3)  # the columns tell apart


def test_a_reward_model_without_a_chat_template_or_with_too_long_inputs_is_refused_up_front(tmp_path):
    from transformers import AutoTokenizer

    from actions.tasks.rewards.model_files import check_tokenizer, input_limit

    folder = str(_bert_reward_folder(tmp_path / "bert"))
    field = "reward.models[1]"
    with pytest.raises(ValueError, match=r"reward.models\[1\].chat_template is true, .*no chat template.*false"):
        check_tokenizer(folder, field, RewardModelConfig(path=folder, chat_template=True), False)
    with pytest.raises(ValueError, match=r"chat_template is auto, and the prompts are chat messages"):
        check_tokenizer(folder, field, RewardModelConfig(path=folder), True)
    check_tokenizer(folder, field, RewardModelConfig(path=folder), False)  # auto on string prompts: plain text
    tok = AutoTokenizer.from_pretrained(folder)
    tok.save_pretrained(folder)  # model_max_length as BERT checkpoints state it
    config = json.loads((Path(folder) / "tokenizer_config.json").read_text())
    (Path(folder) / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 64}))
    with pytest.raises(ValueError, match=r"reward.models\[1\].max_length 100 is more than the 64 tokens"):
        check_tokenizer(folder, field, RewardModelConfig(path=folder, max_length=100, chat_template=False), False)
    with pytest.raises(ValueError, match=r"max_length null \(no limit\) is more than the 64 tokens"):
        check_tokenizer(folder, field, RewardModelConfig(path=folder, max_length=None, chat_template=False), False)
    check_tokenizer(folder, field, RewardModelConfig(path=folder, max_length=64, chat_template=False), False)
    # The default, also after the JSON round trip into the prepare action, which keeps no "set" marks.
    default = RewardModelConfig(path=folder, chat_template=False)
    for settings in (default, RewardModelConfig.model_validate(json.loads(default.model_dump_json()))):
        check_tokenizer(folder, field, settings, False)
    tok = AutoTokenizer.from_pretrained(folder)
    assert input_limit(1024, tok) == 64 and input_limit(None, tok) == 64 and input_limit(32, tok) == 32
    assert input_limit("auto", tok) == 64 and input_limit("auto", None) == 1024


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def test_weights_are_checked_against_config_json_without_false_alarms(tmp_path, reward_model):
    """The shapes config.json gives match the weights of every tiny folder the tests use (a tied
    policy head is not in its file; BERT holds buffers), also when its weights are sharded; an
    edited config.json is refused naming the folder's setting, the tensor and both shapes."""
    import shutil

    from transformers import AutoModelForSequenceClassification

    from actions.models.weight_shapes import check_weight_shapes

    classifier = "AutoModelForSequenceClassification"
    check_weight_shapes(str(reward_model), "reward.models[0].path", classifier)
    check_weight_shapes(str(_bert_reward_folder(tmp_path / "bert")), "reward.models[0].path", classifier)
    for arch in ("qwen2", "llama"):
        policy = write_tiny_model_dir(tmp_path / arch, arch).path
        check_weight_shapes(str(policy), "model.path", "AutoModelForCausalLM")
    sharded = tmp_path / "sharded"
    AutoModelForSequenceClassification.from_pretrained(reward_model).save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    check_weight_shapes(str(sharded), "reward.models[0].path", classifier)
    _edit_config(sharded, intermediate_size=128)
    with pytest.raises(ValueError, match=r"^reward.models\[0\].path '.*sharded': tensor model.layers.0.mlp.\w+.weight "
                                         r"has shape \[\d+, \d+\] in the weights, but config.json gives .*save_pret"):
        check_weight_shapes(str(sharded), "reward.models[0].path", classifier)
    base = tmp_path / "base"  # a base model's weights (no "model." prefix) under a classifier's config
    shutil.copytree(reward_model, base)
    from safetensors.torch import load_file, save_file

    tensors = load_file(base / "model.safetensors")
    save_file({k.removeprefix("model."): v for k, v in tensors.items()}, base / "model.safetensors")
    check_weight_shapes(str(base), "reward.models[0].path", classifier)
    _edit_config(base, hidden_size=32)
    with pytest.raises(ValueError, match=r"tensor embed_tokens.weight has shape \[576, 64\] in the weights, but "
                                         r"config.json gives \[576, 32\]"):
        check_weight_shapes(str(base), "reward.models[0].path", classifier)
    # a plain save over a sharded one leaves the old index beside model.safetensors, which the
    # loader reads (as the check does); the shards the index names are gone
    resaved = tmp_path / "resaved"
    model = AutoModelForSequenceClassification.from_pretrained(reward_model)
    model.save_pretrained(resaved, max_shard_size="100KB")
    model.save_pretrained(resaved)
    assert (resaved / "model.safetensors.index.json").is_file() and (resaved / "model.safetensors").is_file()
    check_weight_shapes(str(resaved), "reward.models[0].path", classifier)
    (resaved / "model.safetensors").unlink()  # only the stale index: the loader names the missing file, not this
    check_weight_shapes(str(resaved), "reward.models[0].path", classifier)


def test_a_reward_model_whose_config_disagrees_with_its_weights_is_refused_before_anything_is_written(
        tmp_path, reward_model, capsys):
    """The loader would refuse it only in the first evaluation, after the run was prepared,
    warmed up and its critic initialised; the CLI refuses it in one line, exit 2."""
    import shutil

    from flows.commands.cli import main

    folder = tmp_path / "mism"
    shutil.copytree(reward_model, folder)
    _edit_config(folder, intermediate_size=128)
    args = ["train", "--set", f"reward.models=[{{path: {folder}}}]", "--set", f"store.uri={tmp_path / 'store'}",
            "--set", "invoker.kind=inprocess", "--set", "algorithm.name=ppo", "--out", str(tmp_path / "run")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rlhfless: error: reward.models[0].path '{folder}': tensor model.")
    assert "config.json gives [64, 128]" in err[0] or "config.json gives [128, 64]" in err[0]
    store = tmp_path / "store"
    assert not store.exists() or not [p for p in store.rglob("*") if p.is_file()]


@pytest.mark.parametrize("fault", ["model_type", "auto_map", "no_pad"])
def test_a_reward_model_the_scorer_could_not_load_or_pad_is_refused_before_anything_is_written(
        tmp_path, reward_model, capsys, fault):
    """A model_type this transformers does not know, code of the model's own (auto_map: the
    actions never trust remote code, and nothing asks to), or a tokenizer with neither a pad nor
    an EOS token (a batch cannot be padded): each failed only in the first evaluation, after the
    run was written."""
    import shutil

    from flows.commands.cli import main

    folder = tmp_path / "rm"
    shutil.copytree(reward_model, folder)
    if fault == "model_type":
        _edit_config(folder, model_type="myrm", architectures=["MyRMForSequenceClassification"])
        needles = ("reward.models[0].path", "(model_type 'myrm') cannot be read by transformers",
                   "trust_remote_code are not supported")
    elif fault == "auto_map":
        _edit_config(folder, model_type="myrm", architectures=["MyRMForSequenceClassification"],
                     auto_map={"AutoModelForSequenceClassification": "modeling_myrm.MyRM"})
        needles = ("reward.models[0].path", "config.json has auto_map (AutoModelForSequenceClassification: "
                   "modeling_myrm.MyRM)", "model_type 'myrm' is not one", "trust_remote_code are not supported")
    else:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config = {**config, "eos_token": None, "pad_token": None}
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        needles = ("reward.models[0].path", "neither a pad token nor an EOS token", "set pad_token")
    args = ["train", "--set", f"reward.models=[{{path: {folder}}}]", "--set", f"store.uri={tmp_path / 'store'}",
            "--set", "invoker.kind=inprocess", "--out", str(tmp_path / "run")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rlhfless: error: reward.models[0].path '{folder}': "), err
    assert all(n in err[0] for n in needles), err[0]
    store = tmp_path / "store"
    assert not store.exists() or not [p for p in store.rglob("*") if p.is_file()]


def test_a_reward_model_scoring_nan_is_named_with_its_folder_prompt_and_cause(tmp_path, reward_model):
    """A NaN or infinite score fails where the model makes it, naming reward.models[i], its
    folder, the prompt id and the value, and why: the damaged tensor where the weights hold one,
    else the 16-bit dtype its activations overflowed in."""
    import shutil

    from safetensors.torch import load_file, save_file

    from actions.tasks.rewards import RewardModelError
    from actions.tasks.rewards.model_scoring import check_scores

    folder = tmp_path / "nanw"
    shutil.copytree(reward_model, folder)
    tensors = load_file(folder / "model.safetensors")
    save_file({**tensors, "score.weight": torch.full_like(tensors["score.weight"], float("nan"))},
              folder / "model.safetensors", metadata={"format": "pt"})
    store = LocalStore(tmp_path / "store")
    put_artifact(store, "runs/r/reward_models/2/manifest.json", folder_files(str(folder)))
    ref = RewardModelRef(index=2, manifest_key="runs/r/reward_models/2/manifest.json",
                         settings=RewardModelConfig(path=str(folder)))
    warm.clear()
    with pytest.raises(RewardModelError, match=rf"^reward.models\[2\] \('{folder}'\) "
                                               r"scored prompt_id 7 nan, not a finite number: its weights hold NaN or "
                                               r"inf \(tensor score.weight\).*save the model again") as info:
        score_with_models([ref], str(tmp_path / "store"), ["What is 2+2?", "Hi"], ["4", "Hello"], prompt_ids=[7, 8])
    from actions.runtime.errors import one_line

    assert one_line(str(info.value)) == str(info.value)  # whole in the one line a pool worker reports

    class Finite16(torch.nn.Linear):
        dtype = torch.bfloat16  # what a model in bfloat16 reports

    with pytest.raises(RewardModelError, match=r"scored row 1 inf.*its activations overflow in bfloat16 \(its weights "
                                               r"are finite\); score in float32 \(RLHFLESS_DTYPE=float32\)"):
        check_scores(ref, Finite16(2, 1), [0.5, float("inf")], None)
    check_scores(ref, Finite16(2, 1), [0.5, -3.0], [1, 2])  # finite scores pass
