"""A reward model's input limit: a text longer than it loses the beginning of its prompt, never
the completion it scores, and each cut row is counted; the limit is what the model's tokenizer
and its position embeddings take, checked at start-up. Also the dataset columns TRL leaves out
of the reward functions' keywords (``completion``, ``completion_ids``)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
from test_reward_models import _bert_reward_folder

from actions.config.workload import RewardFunctionConfig as Fn
from actions.config.workload import RewardModelConfig
from actions.contracts import EvaluateRequest, ModelRef, RewardModelRef
from actions.models import warm
from actions.store import LocalStore, put_artifact
from actions.tasks.dataset import PromptRow
from actions.tasks.rewards import check_reward_functions, compute_rewards
from actions.tasks.rewards.model_files import check_tokenizer, folder_files, input_limit, position_limit
from actions.tasks.rewards.model_scoring import load_reward_model, score_completions, score_with_models

KEY = "runs/r/reward_models/0/manifest.json"
LONG = "question: " + " ".join(["what is 12 + 30"] * 12) + "? answer: "  # about 80 WordPiece tokens


def _stored(tmp_path: Path, folder: Path, **settings) -> tuple[str, RewardModelRef]:
    store = tmp_path / "store"
    put_artifact(LocalStore(store), KEY, folder_files(str(folder)))
    ref = RewardModelRef(index=0, manifest_key=KEY,
                         settings=RewardModelConfig(path=str(folder), chat_template=False, **settings))
    return str(store), ref


def test_a_long_prompt_is_cut_from_the_left_and_each_cut_row_is_counted(tmp_path):
    """The model reads a text's last ``max_length`` tokens, the same ids as the text's own
    encoding ends with and no special token added (TRL's ``add_special_tokens=False``), so two
    completions of one long prompt score apart; each row cut is 1.0 under
    ``reward_model/<i>/truncated_frac``, which the score and evaluate actions' metrics carry."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = _bert_reward_folder(tmp_path / "bert")
    store, ref = _stored(tmp_path, folder, max_length=16)
    prompts, completions = [LONG, LONG, "what is 2+2? "], ["42, because 12 + 30 = 42.", "7", "4"]
    warm.clear()
    cut: dict[str, list[float]] = {}
    scores = score_with_models([ref], store, prompts, completions, truncated=cut)["reward_model/0"][1]
    assert cut == {"reward_model/0/truncated_frac": [1.0, 1.0, 0.0]}
    assert scores[0] != pytest.approx(scores[1], abs=1e-4)  # cut from the right, both read the prompt alone
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    ends = [tok(p + c, add_special_tokens=False)["input_ids"][-16:] for p, c in zip(prompts, completions)]
    with torch.no_grad():
        direct = [float(model(input_ids=torch.tensor([ids])).logits[0, 0]) for ids in ends]
    assert scores == pytest.approx(direct, abs=1e-5)
    seen = []  # what reaches the stored model: the ends above, right-padded
    scorer, _ = load_reward_model(ref, store, torch.device("cpu"))
    hook = scorer.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].tolist()), with_kwargs=True)
    try:
        score_with_models([ref], store, prompts, completions)
    finally:
        hook.remove()
    assert [row[:len(ids)] for row, ids in zip(seen[0], ends)] == ends and seen[0][0][0] != tok.cls_token_id
    # (transformers' own left truncation keeps a [CLS] it adds after cutting; the scorer adds none, as TRL)
    tok.truncation_side = "left"
    assert tok(LONG, truncation=True, max_length=8)["input_ids"][0] == tok.cls_token_id
    # the actions' metrics: a step averages them, as it averages what the functions log
    model_ref = ModelRef(store_uri=store, base_key="b", policy_key="p", policy_version=0)
    req = EvaluateRequest(model=model_ref, dataset_key="d", max_new_tokens=4, output_key="e", reward_models=[ref])
    rows = [PromptRow(prompt_id=i, prompt=p, answer="") for i, p in enumerate(prompts)]
    rewards = score_completions(req, rows, completions, [[1]] * 3, store)
    assert rewards.metrics == {"reward_model/0/truncated_frac": [1.0, 1.0, 0.0]}


def test_the_input_limit_is_the_models_positions_where_the_tokenizer_states_none(tmp_path):
    """A BERT folder whose tokenizer states no ``model_max_length`` and whose model has 64
    positions: ``auto`` reads 64 tokens (1024 failed the first step on a longer text with an
    index error), and an explicit ``max_length`` above 64 is refused at start-up in one line."""
    from transformers import AutoConfig, AutoTokenizer

    folder = _bert_reward_folder(tmp_path / "bert")
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.model_max_length > 1e9  # transformers' "no limit known"
    positions = position_limit(AutoConfig.from_pretrained(folder))
    assert positions == 64 and input_limit("auto", tok, positions) == 64 and input_limit(32, tok, positions) == 32
    field = "reward.models[0]"
    for value in (100, None):
        with pytest.raises(ValueError, match=rf"^reward.models\[0\].max_length {'100' if value else 'null'}.* is more "
                                             r"than the 64 tokens the model in .* takes \(its position embeddings: "
                                             r"config.json max_position_embeddings.*set it to 64 or less, or to auto"):
            check_tokenizer(str(folder), field, RewardModelConfig(path=str(folder), max_length=value,
                                                                   chat_template=False), False)
    for value in (64, "auto"):
        check_tokenizer(str(folder), field, RewardModelConfig(path=str(folder), max_length=value,
                                                               chat_template=False), False)
    store, ref = _stored(tmp_path, folder)  # auto
    warm.clear()
    cut: dict[str, list[float]] = {}
    text = LONG * 2  # about 160 tokens
    scores = score_with_models([ref], store, [text, "hi "], ["42", "4"], truncated=cut)["reward_model/0"][1]
    assert len(scores) == 2 and cut["reward_model/0/truncated_frac"] == [1.0, 0.0]


def test_position_limits_follow_transformers():
    """RoBERTa's family numbers positions from ``pad_token_id + 1``: 20 positions take 18
    tokens (the model fails on 19); GPT-2 names its count ``n_positions``; a config without one
    has no limit."""
    from transformers import BertConfig, GPT2Config, RobertaConfig, RobertaForSequenceClassification

    small = dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, num_labels=1)
    roberta = RobertaConfig(vocab_size=50, max_position_embeddings=20, **small)
    assert position_limit(roberta) == 18
    model = RobertaForSequenceClassification(roberta).eval()
    with torch.no_grad():
        model(input_ids=torch.full((1, 18), 5))
        with pytest.raises((IndexError, RuntimeError)):
            model(input_ids=torch.full((1, 19), 5))
    assert position_limit(RobertaConfig(max_position_embeddings=514, pad_token_id=1)) == 512
    assert position_limit(GPT2Config(n_positions=32)) == 32
    assert position_limit(BertConfig(max_position_embeddings=64)) == 64
    assert position_limit(types.SimpleNamespace(model_type="t5")) is None


def test_a_max_length_beyond_the_models_positions_is_refused_by_the_cli(tmp_path, capsys):
    from flows.commands.cli import main

    folder = _bert_reward_folder(tmp_path / "bert")
    capsys.readouterr()  # the folder's save progress bars
    args = ["train", "--set", f"reward.models=[{{path: {folder}, max_length: 100, chat_template: false}}]",
            "--set", f"store.uri={tmp_path / 'store'}", "--set", "invoker.kind=inprocess",
            "--out", str(tmp_path / "run")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "reward.models[0].max_length 100 is more than the 64 tokens" in err[0], err
    store = tmp_path / "store"
    assert not store.exists() or not [p for p in store.rglob("*") if p.is_file()]


def test_completion_columns_are_left_out_of_the_reward_keywords_as_trl_does(monkeypatch):
    """TRL's GRPOTrainer passes every dataset column but ``prompt``, ``completion`` and
    ``completion_ids``: a prompt-completion dataset's ``completion`` never reads as the sampled
    one, and ``completion_ids`` is always the sampled ids; neither column is refused at start-up."""
    seen: list[dict] = []

    def record(prompts, completions, completion_ids, **kwargs):
        seen.append({"completion_ids": completion_ids, **kwargs})
        return [1.0] * len(completions)

    def wants_completion(completions, completion, **kwargs):
        return [1.0] * len(completions)

    monkeypatch.setitem(sys.modules, "my_cols", types.SimpleNamespace(record=record, wants=wants_completion))
    rows = [PromptRow(prompt_id=i, prompt=f"say {i}", answer=str(i),
                      columns={"completion": f"given {i}", "completion_ids": [9, 9], "topic": "t"})
            for i in range(2)]
    check_reward_functions([Fn(name="my_cols:record")], rows, encode=lambda t: [1])
    seen.clear()
    compute_rewards([Fn(name="my_cols:record")], rows, ["a", "b"], completion_ids=[[1, 2], [3]])
    assert len(seen) == 1 and seen[0]["completion_ids"] == [[1, 2], [3]] and seen[0]["topic"] == ["t", "t"]
    assert set(seen[0]) == {"completion_ids", "topic", "answer", "trainer_state", "log_extra", "log_metric"}
    from actions.tasks.rewards import RewardFunctionError

    with pytest.raises(RewardFunctionError, match=r"parameter 'completion' is never passed \(as in TRL.*completions"):
        check_reward_functions([Fn(name="my_cols:wants")], rows)

