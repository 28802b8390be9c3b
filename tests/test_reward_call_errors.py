"""A reward plug-in's failure at the start-up check names what the user can find: the row by
its place in the dataset file (as the dataset's own errors do), and a parameter of the function
that no column fills by its name, with the columns there are (``actions/tasks/rewards/calling.py``)."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest

from actions.config.workload import RewardFunctionConfig as Fn
from actions.tasks.build import build_datasets
from actions.tasks.dataset import PromptRow
from actions.tasks.rewards import check_reward_functions, compute_rewards
from actions.tasks.rewards.calling import RewardFunctionError
from flows.config import load_config


def _picky(completions, answer, **kw):
    if "1" in answer:  # the file's second row
        raise ZeroDivisionError("float division by zero")
    return [1.0] * len(completions)


def _misspelt(completions, answer, dificulty, **kw):
    return [1.0] * len(completions)


def _no_kwargs(completions, answer):
    return [1.0] * len(completions)


def _own_type_error(completions, **kw):
    raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.setitem(sys.modules, "my_calls", types.SimpleNamespace(
        picky=_picky, misspelt=_misspelt, no_kwargs=_no_kwargs, own=_own_type_error))


def _build(tmp_path: Path, fn: str) -> None:
    from actions.models.modeling import build_char_tokenizer

    train = tmp_path / "d.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i), "difficulty": i % 3, "level": 1}) + "\n"
                             for i in range(16)))
    cfg = load_config(None, [f"data.train_path={train}", f"reward.functions=[{{name: 'my_calls:{fn}'}}]"])
    build_datasets(cfg, lambda: build_char_tokenizer(), model_name="tiny")


def test_a_raising_function_names_the_row_by_its_line_in_the_file(tmp_path, plugins):
    with pytest.raises(RewardFunctionError) as info:
        _build(tmp_path, "picky")
    text = str(info.value)
    assert re.search(r"reward function 'my_calls:picky' raised ZeroDivisionError: float division by zero on "
                     r"data.train_path \S+d.jsonl:2 \(prompt_id \d+\); fix the function$", text), text
    assert "of the batch" not in text


def test_a_row_of_one_of_several_parquet_files_is_named_by_file_and_row(plugins):
    rows = [PromptRow(prompt_id=7, prompt="q0", answer="0", line=4, file="part-0.parquet"),
            PromptRow(prompt_id=9, prompt="q1", answer="1", line=2, file="part-1.parquet")]
    with pytest.raises(RewardFunctionError, match=r"on data.train_path shards: part-1.parquet row 2 \(prompt_id 9\); "):
        check_reward_functions([Fn(name="my_calls:picky")], rows, sources=[("data.train_path shards", rows)])


def test_during_training_the_row_is_named_by_prompt_id_and_place_in_the_batch(plugins):
    """The stored copy's rows carry no line: the message is as it was."""
    rows = [PromptRow(prompt_id=5, prompt="q0", answer="0"), PromptRow(prompt_id=6, prompt="q1", answer="1")]
    with pytest.raises(RewardFunctionError, match=r"raised ZeroDivisionError: float division by zero on prompt_id 6 "
                                                  r"\(row 1 of the batch\); fix the function \(a reward error"):
        compute_rewards([Fn(name="my_calls:picky")], rows, ["x", "y"])


def test_a_parameter_that_is_not_a_column_is_named_with_the_columns_there_are(tmp_path, plugins):
    with pytest.raises(RewardFunctionError) as info:
        _build(tmp_path, "misspelt")
    text = str(info.value)
    assert ("reward function 'my_calls:misspelt': its parameter 'dificulty' is not a column of the dataset "
            "(columns: 'difficulty', 'answer', 'level'; keywords always passed: prompts, completions, "
            "completion_ids") in text, text
    assert "rename the parameter to a column, or give it a default (dificulty=None), or drop it and read" in text
    assert "prompt_id" not in text and "missing 1 required" not in text


def test_a_function_without_kwargs_is_told_to_take_them(tmp_path, plugins):
    with pytest.raises(RewardFunctionError) as info:
        _build(tmp_path, "no_kwargs")
    text = str(info.value)
    assert re.search(r"'my_calls:no_kwargs' takes neither \*\*kwargs nor keywords the call passes it \('completion_ids'"
                     r", .*\); add \*\*kwargs to its parameters", text), text
    assert "prompt_id" not in text


def test_a_type_error_of_the_function_s_own_still_names_the_row(tmp_path, plugins):
    with pytest.raises(RewardFunctionError, match=r"raised TypeError: unsupported operand .* on data.train_path "
                                                  r"\S+d.jsonl:1 \(prompt_id \d+\)"):
        _build(tmp_path, "own")


def _by_difficulty(prompts, completions, difficulty, **kw):
    return [1.0] * len(completions)


def _by_difficulty_or_none(prompts, completions, difficulty=None, **kw):
    return [1.0] * len(completions)


def _files(tmp_path: Path, eval_rows: list[dict]) -> tuple[Path, Path]:
    train, evals = tmp_path / "d.jsonl", tmp_path / "e.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i), "difficulty": i % 3}) + "\n"
                             for i in range(20)))
    evals.write_text("".join(json.dumps(r) + "\n" for r in eval_rows))
    return train, evals


def test_a_parameter_the_eval_file_lacks_is_refused_at_start_up_naming_the_eval_file(tmp_path, monkeypatch):
    """The plug-in is called on two training rows at start-up; evaluation calls it on the eval
    rows, whose file lacks the column: refused before anything is written, not at the first
    evaluation after set-up."""
    from actions.models.modeling import build_char_tokenizer

    monkeypatch.setitem(sys.modules, "my_evals", types.SimpleNamespace(strict=_by_difficulty,
                                                                       lenient=_by_difficulty_or_none))
    train, evals = _files(tmp_path, [{"prompt": f"e{i}", "answer": str(i)} for i in range(4)])
    args = [f"data.train_path={train}", f"data.eval_path={evals}"]
    cfg = load_config(None, [*args, "reward.functions=[my_evals:strict]"])
    with pytest.raises(RewardFunctionError) as info:
        build_datasets(cfg, build_char_tokenizer, model_name="tiny")
    text = str(info.value)
    assert text.startswith(f"reward function 'my_evals:strict': its parameter 'difficulty' is not a column of "
                           f"data.eval_path {evals} (columns: 'answer'; "), text
    assert text.endswith(f"; data.train_path {train} has it, but the reward functions are called on these rows too: "
                         f"add the column to data.eval_path {evals}, or give the parameter a default "
                         "(difficulty=None)"), text
    # a default, the column in the eval file, or an eval set held out of the training file: all pass
    build_datasets(load_config(None, [*args, "reward.functions=[my_evals:lenient]"]), build_char_tokenizer,
                   model_name="tiny")
    _files(tmp_path, [{"prompt": f"e{i}", "answer": str(i), "difficulty": 1} for i in range(4)])
    build_datasets(cfg, build_char_tokenizer, model_name="tiny")
    build_datasets(load_config(None, [f"data.train_path={train}", "data.eval_fraction=0.2",
                                      "reward.functions=[my_evals:strict]"]), build_char_tokenizer, model_name="tiny")


def _every_keyword(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, answer):
    return [1.0] * len(completions)


def test_an_eval_column_a_function_without_kwargs_cannot_take_is_refused_naming_the_eval_file(tmp_path, monkeypatch):
    from actions.models.modeling import build_char_tokenizer

    monkeypatch.setitem(sys.modules, "my_evals", types.SimpleNamespace(every=_every_keyword))
    train, evals = _files(tmp_path, [{"prompt": f"e{i}", "answer": str(i), "level": 2} for i in range(4)])
    train.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(16)))
    cfg = load_config(None, [f"data.train_path={train}", f"data.eval_path={evals}",
                             "reward.functions=[my_evals:every]"])
    with pytest.raises(RewardFunctionError, match=re.escape(
            f"'my_evals:every' takes neither **kwargs nor keywords the call passes it on the rows of data.eval_path "
            f"{evals} ('level'); add **kwargs")):
        build_datasets(cfg, build_char_tokenizer, model_name="tiny")
