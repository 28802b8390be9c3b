"""A user's dataset rows that are refused, each in one line naming the file, the row, the key and
the fix: chat messages (roles, empty user turns, null content), ids, eval-file columns, rows of
a folder of Parquet shards and bytes that are not UTF-8 (``actions/tasks``)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from actions.tasks.build import build_datasets
from actions.tasks.chat import format_rows
from actions.tasks.dataset import PromptRow, row_where
from actions.tasks.fields import FieldMap, content_id, to_rows
from actions.tasks.rewards.calling import RewardFunctionError
from actions.tasks.sources import read_records
from flows.config import load_config


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _chat(*messages: dict) -> list[tuple[int, dict]]:
    """Two rows, the second (row 3 of the file) holding ``messages``."""
    return [(1, {"prompt": "fine", "answer": "1"}), (3, {"prompt": list(messages), "answer": "2"})]


class _TextOnly:
    """A chat template that adds each content to a string, as ChatML templates do: null fails."""

    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "".join("<" + m["role"] + ">" + m["content"] for m in messages)


def test_a_chat_role_that_is_not_one_is_refused_naming_the_closest():
    user = {"role": "user", "content": "2+2?"}
    for role, closest in (("usr", "user"), ("assistent", "assistant"), ("System", "system"), ("human", "user"),
                          ("gpt", "assistant")):
        with pytest.raises(ValueError, match=rf"^f:3: key 'prompt' message 1 has role '{role}', not a chat role "
                                             r"\(system, user, assistant, tool, developer, ipython\); change it to "
                                             rf"'{closest}'$"):
            to_rows(_chat(user, {"role": role, "content": "x"}), FieldMap(), source="f")
    # a role like none of them is the template's to render (GLM's observation turn)
    rows, _ = to_rows(_chat(user, {"role": "observation", "content": "x"}), FieldMap(), source="f")
    assert rows[1].source_prompt[1]["role"] == "observation"


def test_a_user_turn_without_text_is_refused_and_tool_call_turns_are_kept():
    for content, said in (("", "empty"), ("  \n", "blank"), (None, "null")):
        with pytest.raises(ValueError, match=rf"^f:3: key 'prompt' message 1 \(user\) has {said} content; fill in the "
                                             r"user's text, or remove the message \(or the row\)$"):
            to_rows(_chat({"role": "system", "content": "be brief"}, {"role": "user", "content": content}),
                    FieldMap(), source="f")
    call = {"type": "function", "function": {"name": "calc", "arguments": "{}"}}
    kept = [{"role": "developer", "content": ""}, {"role": "user", "content": "compute"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": ""},
            {"role": "ipython", "content": "4"}]
    rows, _ = to_rows(_chat(*kept), FieldMap(), source="f")
    assert rows[1].source_prompt == kept
    for message in ({"role": "assistant", "content": None}, {"role": "assistant", "content": None, "tool_calls": []},
                    {"role": "tool", "content": None}):
        with pytest.raises(ValueError, match=rf"^f:3: key 'prompt' message 1 \({message['role']}\) has null content "
                                             r"and no tool_calls; give it its text"):
            to_rows(_chat({"role": "user", "content": "q"}, message), FieldMap(), source="f")


def test_null_content_without_tool_calls_is_blamed_on_the_message_not_the_system_prompt():
    """A row not read from a file (the formatting step checks it too): the template would fail
    on the null content, and the error named ``data.system_prompt``, put first by the run."""
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]
    row = PromptRow(prompt_id=5, prompt="", answer="a", source_prompt=messages, line=7)
    with pytest.raises(ValueError, match=r"^f:7 \(prompt_id 5\): message 1 \(assistant\) has null content and no "
                                         r"tool_calls; give it its text") as caught:
        format_rows([row], _TextOnly(), use_template=True, system_prompt="be brief", source="f")
    assert "system_prompt" not in str(caught.value)


def test_the_eval_file_columns_are_checked_for_reward_keywords(tmp_path, monkeypatch):
    from actions.models.modeling import build_char_tokenizer

    monkeypatch.setitem(sys.modules, "my_cols", types.SimpleNamespace(f=lambda completions, **kw: [1.0] *
                                                                       len(completions)))
    train = _jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(16)])
    evals = _jsonl(tmp_path / "e.jsonl", [{"prompt": "e1", "answer": "1", "prompts": "x"}])
    base = [f"data.train_path={train}", "reward.functions=[{name: 'my_cols:f'}]"]
    tok = lambda: build_char_tokenizer()  # noqa: E731
    assert len(build_datasets(load_config(None, base), tok, model_name="tiny").train) == 16
    with pytest.raises(RewardFunctionError, match=r"^reward.functions 'my_cols:f': data.eval_path .*e.jsonl has a "
                                                  r"column named 'prompts', a keyword .* rename the column"):
        build_datasets(load_config(None, base + [f"data.eval_path={evals}"]), tok, model_name="tiny")


def test_rows_of_a_folder_of_parquet_shards_are_named_by_file_and_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "shards"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist([{"prompt": f"q{i}", "answer": "1"} for i in range(3)]),
                   folder / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "answer": "1"}, {"prompt": " ", "answer": "1"}]),
                   folder / "part-1.parquet")
    records = read_records(str(folder), field="data.train_path")
    assert [n for n, _ in records] == [1, 2, 3, 4, 5]  # numbered across the files, as ever
    with pytest.raises(ValueError, match=r"^data.train_path d: part-1.parquet row 2: key 'prompt' is an empty prompt"):
        to_rows(records, FieldMap(), source="data.train_path d")
    rows, _ = to_rows(records[:4], FieldMap(), source="d")  # a slice is a plain list: numbered across the files
    assert (rows[3].line, rows[3].file) == (4, None)
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "answer": "1"}]), folder / "part-1.parquet")
    rows, _ = to_rows(read_records(str(folder), field="data.train_path"), FieldMap(), source="d")
    assert [(r.line, r.file) for r in rows] == [(1, "part-0.parquet"), (2, "part-0.parquet"), (3, "part-0.parquet"),
                                                (1, "part-1.parquet")]
    # what names a row later (the chat template, the prompt length) names its file and row too
    assert row_where("d", rows[3], 4) == f"d: part-1.parquet row 1 (prompt_id {rows[3].prompt_id})"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "answer": "1", "prompt_id": 9}]), folder / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist([{"prompt": "b", "answer": "1", "prompt_id": 9}]), folder / "part-1.parquet")
    with pytest.raises(ValueError, match=r"^d: part-1.parquet row 1: prompt_id 9 appears twice \(first at "
                                         r"part-0.parquet row 1\)"):
        to_rows(read_records(str(folder), field="data.train_path"), FieldMap(), source="d")


def test_a_byte_that_is_not_utf8_is_named_by_line_and_byte(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"prompt": "p", "answer": "1"}\r\n\n{"prompt": "q\xff", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"^data.train_path .*a.jsonl:3: byte 14 of the line \(0xff\) is not UTF-8; "
                                         r"save the file as UTF-8 \(a dataset is UTF-8 JSON Lines\)$"):
        read_records(str(tmp_path / "a.jsonl"), field="data.train_path")
    (tmp_path / "b.json").write_bytes(b'[{"prompt": "p", "answer": "1"},\n {"prompt": "\xfeq", "answer": "2"}]')
    with pytest.raises(ValueError, match=r"^data.eval_path .*b.json:2: byte 14 of the line \(0xfe\) is not UTF-8"):
        read_records(str(tmp_path / "b.json"), field="data.eval_path")


def test_the_prompt_id_column_is_the_id_wherever_a_row_has_it_and_then_every_row_needs_it(tmp_path):
    plain, with_id = {"prompt": "p", "answer": "1"}, {"prompt": "q", "answer": "2", "prompt_id": 5}
    fix = (r"the dataset's 'prompt_id' column is the id because data.id_key is unset, so every row needs one; fill it "
           r"in, set data.id_key to a column of unique ids every row has, or remove the column")
    with pytest.raises(ValueError, match=rf"^f:1: key 'prompt_id' is missing, but row 2 has one: {fix}"):
        to_rows([(1, plain), (2, with_id)], FieldMap(), source="f")
    with pytest.raises(ValueError, match=rf"^f:3: key 'prompt_id' is null, but row 1 has one: {fix}"):
        to_rows([(1, with_id), (2, {**plain, "prompt_id": 6}), (3, {**plain, "prompt_id": None})], FieldMap(),
                source="f")
    # no row with a value: ids from the content, the column kept for the rewards
    rows, _ = to_rows([(1, {**plain, "prompt_id": None}), (2, {"prompt": "q", "answer": "2"})], FieldMap(), source="f")
    assert rows[0].prompt_id == content_id("p", "1") and rows[0].columns == {"prompt_id": None}
    # data.id_key names another column: prompt_id is a column like any other
    rows, _ = to_rows([(1, {**plain, "uid": "a"}), (2, {**with_id, "uid": "b"})], FieldMap(id_key="uid"), source="f")
    assert rows[1].columns["prompt_id"] == 5
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "shards").mkdir()  # a later shard's null in the column
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "answer": "1", "prompt_id": 1}]),
                   tmp_path / "shards" / "part-0.parquet")
    pq.write_table(pa.table({"prompt": ["b"], "answer": ["1"], "prompt_id": pa.array([None], pa.int64())}),
                   tmp_path / "shards" / "part-1.parquet")
    with pytest.raises(ValueError, match=r"^d: part-1.parquet row 1: key 'prompt_id' is null, but part-0.parquet row 1 "
                                         r"has one"):
        to_rows(read_records(str(tmp_path / "shards"), field="data.train_path"), FieldMap(), source="d")


def test_rows_of_one_prompt_and_answer_with_other_columns_are_kept_with_their_own_ids():
    """A row is dropped as a duplicate only when every column equals an earlier row's: a
    ``difficulty`` a reward function reads makes it a row of its own, whose id is a hash over
    its columns too; the first keeps the id of its prompt and answer, as before."""
    def row(difficulty: str, answer: object = 1) -> dict:
        return {"prompt": "What is 1?", "answer": answer, "difficulty": difficulty}

    records = [(1, row("easy")), (2, row("hard")), (3, row("hard")), (4, row("easy")), (5, row("easy", "1")),
               (6, {"prompt": "other", "answer": 2})]
    rows, stats = to_rows(records, FieldMap(), source="x")
    assert [(r.line, r.columns.get("difficulty")) for r in rows] == [(1, "easy"), (2, "hard"), (5, "easy"), (6, None)]
    assert stats.duplicates_dropped == 2  # rows 3 and 4: every column as an earlier row's
    assert rows[0].prompt_id == content_id("What is 1?", "1") and rows[3].prompt_id == content_id("other", "2")
    assert rows[1].prompt_id == content_id("What is 1?", "1", {"answer": 1, "difficulty": "hard"})
    assert len({r.prompt_id for r in rows}) == 4  # "1" is not 1 to a reward function: a row of its own
    again, _ = to_rows(records, FieldMap(), source="x")
    assert [r.prompt_id for r in again] == [r.prompt_id for r in rows]  # the same file, the same ids


def test_a_prompt_longer_than_the_context_alone_is_not_told_to_lower_max_new_tokens(tmp_path):
    """Fewer ``generation.max_new_tokens`` cannot make room for a prompt that fills the model's
    context by itself: the error names the context and the fixes that do help."""
    from actions.models.modeling import build_char_tokenizer

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "x" * n, "answer": "1"} for n in (2041, 505, 3)])
    base = [f"data.train_path={data}", f"model.path={model}", "generation.max_new_tokens=10",
            "data.chat_template=false"]

    def build(*more: str) -> None:
        build_datasets(load_config(None, base + list(more)), build_char_tokenizer, model_name="tiny")

    with pytest.raises(ValueError, match=r"^data.train_path .*d.jsonl:1 \(prompt_id \d+\) has 2041 prompt tokens, "
                                         r"above 502 \(data.max_prompt_tokens unset: the model's context less "
                                         r"generation.max_new_tokens\); the prompt alone leaves no room for a "
                                         r"response in the model's context of 512 \(config.json of model.path .*\), "
                                         r"whatever generation.max_new_tokens is: shorten it, or set "
                                         r"data.long_prompts to truncate_left \(keep its end\) or skip$") as caught:
        build()
    assert "lower generation.max_new_tokens" not in str(caught.value)
    with pytest.raises(ValueError, match=r"has 2041 prompt tokens, above data.max_prompt_tokens=400; the prompt alone "
                                         r"leaves no room"):
        build("data.max_prompt_tokens=400")
    # a prompt that fits the context alone: fewer new tokens do make room
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "x" * 505, "answer": "1"}) + "\n")
    with pytest.raises(ValueError, match=r"has 505 prompt tokens, above 502 \(.*\); lower generation.max_new_tokens, "
                                         r"or set data.long_prompts to truncate_left or skip$"):
        build()
