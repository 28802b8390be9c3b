"""A user's data files that JSON or a folder listing would read silently wrong, each refused in
one line naming the file, the line, the key or file and the fix (``actions/tasks/sources.py``,
``dataset.py``), and decimal reference answers, which are numbers (``fields.py``)."""

from __future__ import annotations

import base64
import datetime
import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actions.tasks.dataset import parse_jsonl, rows_to_jsonl
from actions.tasks.fields import FieldMap, to_rows
from actions.tasks.sources import read_records

ROOT = Path(__file__).resolve().parent.parent


def _read(path: Path):
    return read_records(str(path), field="data.train_path")


def _parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# ------------------------------------------------------------------ unpaired surrogate escapes


@pytest.mark.parametrize(("row", "at"), [
    (r'{"prompt": "bad \ud800 here", "answer": "1"}', "key 'prompt'"),
    (r'{"prompt": "ok", "answer": "bad \udfff"}', "key 'answer'"),
    (r'{"prompt": [{"role": "user", "content": "x \ud83d"}], "answer": "1"}', r"key 'prompt'\[0\]\['content'\]"),
    (r'{"prompt": "ok", "answer": "1", "n\udc00te": 2}', "a key name"),
    (r'{"prompt": "ok", "answer": "\\ud83d\ude00"}', "key 'answer'"),  # an escaped backslash: the pair is broken
])
def test_an_unpaired_surrogate_escape_is_refused_when_the_row_is_read(tmp_path, row, at):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "fine", "answer": "0"}\n' + row + "\n")
    with pytest.raises(ValueError, match=rf"^data.train_path {path}:2: {at} holds an unpaired surrogate escape "
                                         r"\(character \d+: .*\\ud[89a-f]\w\w.*\); fix the JSON escape: .* or "
                                         "remove it$"):
        _read(path)


def test_a_surrogate_pair_and_an_escaped_backslash_are_read_as_written(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(r'{"prompt": "smile \ud83d\ude00", "answer": "\\ud800 is text"}' + "\n")
    assert _read(path) == [(1, {"prompt": "smile \U0001f600", "answer": "\\ud800 is text"})]


def test_an_unpaired_surrogate_in_a_json_array_names_the_element_and_its_line(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[{"prompt": "a", "answer": "1"},\n {"prompt": "b \\udbff", "answer": "2"}]')
    with pytest.raises(ValueError, match=rf"^data.train_path {path}:2: element 2 of the array: key 'prompt' holds "
                                         "an unpaired surrogate escape"):
        _read(path)


# ------------------------------------------------------------------ a key twice in one object


def test_a_key_twice_in_one_row_is_refused_naming_the_key_the_values_and_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt":"first","prompt":"second","answer":"1"}\n')
    with pytest.raises(ValueError, match=rf"^data.train_path {path}:3: key 'prompt' appears twice in one object "
                                         r"\('first', then 'second'\); keep one of them"):
        _read(path)
    # inside a chat message too: the template would get the last content alone
    path.write_text('{"prompt": [{"role": "user", "content": "a", "content": "b"}], "answer": "1"}\n')
    with pytest.raises(ValueError, match=rf"{path}:1: key 'content' appears twice in one object \('a', then 'b'\)"):
        _read(path)


def test_a_key_twice_in_an_element_of_a_json_array_names_the_element(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[\n  {"prompt": "a", "answer": "1"},\n  {"prompt": "b", "answer": "2", "answer": "3"}\n]\n')
    with pytest.raises(ValueError, match=rf"^data.train_path {path}:3: element 2 of the array: key 'answer' appears "
                                         r"twice in one object \('2', then '3'\)"):
        _read(path)


def test_a_json_array_reads_as_before(tmp_path):
    path = tmp_path / "a.json"
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": 2}]
    for text in (json.dumps(rows), json.dumps(rows, indent=4), " [ ] ", "[]"):
        path.write_text(text)
        assert _read(path) == list(enumerate(rows if "prompt" in text else [], start=1))
    for text, line, problem in (('[{"prompt": "a"}\n {"prompt": "b"}]', 2, "Expecting ',' delimiter"),
                                ('[{"prompt": "a"}]\n[]', 2, "Extra data"),
                                ('[{"prompt": "a"},\n]', 2, "Expecting value"),
                                ('[{"prompt": "a"}', 1, "Expecting ',' delimiter")):
        path.write_text(text)
        with pytest.raises(ValueError, match=rf"^data.train_path {path}:{line}: not valid JSON \({problem}"):
            _read(path)


def test_stored_rows_load_with_the_same_checks():
    rows, _ = to_rows([(1, {"prompt": "smile \U0001f600", "answer": "1"})], FieldMap(), source="f")
    assert parse_jsonl(rows_to_jsonl(rows), source="s")[0].prompt == "smile \U0001f600"
    with pytest.raises(ValueError, match=r"^s:1: key 'prompt' appears twice"):
        parse_jsonl(b'{"prompt_id": 1, "prompt": "a", "prompt": "b", "answer": "1"}\n', source="s")


# ------------------------------------------------------------------ one JSON object as the whole file


def test_a_json_file_holding_one_object_names_the_keys_holding_lists_and_the_fix(tmp_path):
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"version": 2, "data": [{"prompt": "a", "answer": "1"}], "tags": ["x"]}, indent=2))
    with pytest.raises(ValueError, match=rf"^data.train_path {path} holds one JSON object whose keys hold lists "
                                         r"\('data' \(1 items\), 'tags' \(1 items\)\), not rows; write the rows one "
                                         r"object per line, e.g. jq -c '.data\[\]' wrapped.json > rows.jsonl, and "
                                         "point data.train_path at that file"):
        _read(path)
    path.write_text(json.dumps({"prompt": "a", "answer": "1"}, indent=2))  # one row, pretty-printed
    with pytest.raises(ValueError, match=rf"{path} holds one JSON object over several lines, not one object per "
                                         r"line \(JSON Lines\); write it on one line \(jq -c \. wrapped.json"):
        _read(path)


def test_a_wrapping_object_on_one_line_is_named_where_its_prompt_is_missing(tmp_path):
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"data": [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]}))
    with pytest.raises(ValueError, match=rf"^data.train_path {path}:1: key 'prompt' is missing \(row keys: data\); "
                                         r"its key 'data' holds a list of 2 objects with 'prompt': the file wraps "
                                         r"its rows in one object; write them one object per line \(jq -c "
                                         r"'.data\[\]' on the file, into a .jsonl file\) and point data.train_path"):
        to_rows(_read(path), FieldMap(), source=f"data.train_path {path}")


# ------------------------------------------------------------------ folders


def test_a_folder_mixing_parquet_and_other_data_files_is_refused_naming_them(tmp_path):
    _parquet(tmp_path / "data-00000-of-00002.parquet", [{"prompt": "a", "answer": "1"}])
    (tmp_path / "more.jsonl").write_text('{"prompt": "b", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"holds Parquet files \(data-00000-of-00002.parquet\) and data files of "
                                         r"another format \(more.jsonl\), which a folder of Parquet files does not "
                                         r"read; keep one format per folder \(move more.jsonl out, or write its rows "
                                         r"as Parquet\), or point data.train_path at one file$"):
        _read(tmp_path)
    (tmp_path / "more.jsonl").unlink()
    (tmp_path / "extra.CSV").write_text("prompt,answer\nb,2\n")
    with pytest.raises(ValueError, match=r"data files of another format \(extra.CSV\)"):
        _read(tmp_path)


def test_a_folder_reads_parquet_files_whatever_the_case_of_their_suffix(tmp_path):
    _parquet(tmp_path / "a.parquet", [{"prompt": "a", "answer": "1"}])
    _parquet(tmp_path / "B.PARQUET", [{"prompt": "b", "answer": "2"}])
    (tmp_path / "dataset_info.json").write_text("{}")  # a description beside the files, no rows
    (tmp_path / "README.md").write_text("# data")
    assert sorted(r["prompt"] for _, r in _read(tmp_path)) == ["a", "b"]


def test_a_folder_of_other_data_files_alone_names_them(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"prompt": "b", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"is a folder without state.json or \*.parquet files \(it holds "
                                         r"train.jsonl, which a folder is not read as\); point data.train_path at"):
        _read(tmp_path)


def test_saved_datasets_keep_their_metadata_files_beside_the_data(tmp_path):
    import datasets

    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    assert [r for _, r in _read(tmp_path / "saved")] == rows
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dict"))
    assert [r for _, r in _read(tmp_path / "dict")] == rows


# ------------------------------------------------------------------ decimal reference answers


def test_a_decimal_answer_column_is_a_number(tmp_path):
    table = pa.table({"prompt": ["a", "b", "c"],
                      "answer": pa.array([Decimal("0.50"), Decimal("12.00"), Decimal("-3.25")], pa.decimal128(10, 2)),
                      "whole": pa.array([Decimal("7"), Decimal("8"), Decimal("9")], pa.decimal128(5, 0))})
    pq.write_table(table, tmp_path / "d.parquet")
    records = _read(tmp_path / "d.parquet")
    # a plug-in reward reads no reference (answer_need None): every row still has its answer
    rows, _ = to_rows(records, FieldMap(), source="f")
    assert [(r.answer, r.source_answer, r.has_answer) for r in rows] == [
        ("0.50", 0.5, True), ("12.00", 12.0, True), ("-3.25", -3.25, True)]
    rows, _ = to_rows(records, FieldMap(answer_key="whole", answer_need=("gsm8k reads it", "or not")), source="f")
    assert [(r.answer, r.source_answer) for r in rows] == [("7", 7), ("8", 8), ("9", 9)]
    assert all(type(r.source_answer) is int for r in rows)


def test_columns_reach_the_rewards_as_json_values_leaf_by_leaf(tmp_path):
    """A struct stays a dict (its timestamp as text), a decimal column is a number, bytes are base64."""
    when = datetime.datetime(2024, 1, 2, 3, 4, 5)
    table = pa.table({"prompt": ["a", "b"], "answer": ["1", "2"],
                      "meta": [{"source": "web", "created": when}, {"source": "book", "created": when}],
                      "score": pa.array([Decimal("0.50"), Decimal("3")], pa.decimal128(5, 2)),
                      "blob": [b"\x00\xff", b"ok"],
                      "tags": [[{"at": datetime.date(2024, 1, 2)}], []]})
    pq.write_table(table, tmp_path / "c.parquet")
    rows, _ = to_rows(_read(tmp_path / "c.parquet"), FieldMap(), source="f")
    first = rows[0].columns
    assert first["meta"] == {"source": "web", "created": "2024-01-02 03:04:05"}
    assert first["score"] == 0.5 and isinstance(first["score"], float)
    assert rows[1].columns["score"] == 3.0
    assert base64.b64decode(first["blob"]) == b"\x00\xff"
    assert first["tags"] == [{"at": "2024-01-02"}]
    assert json.loads(json.dumps(first)) == first  # what travels is what the function gets


def test_a_decimal_answer_that_is_not_finite_is_refused():
    with pytest.raises(ValueError, match=r"^f:1: key 'answer' is Decimal\('NaN'\); a reference answer is a string "
                                         "or a finite number"):
        to_rows([(1, {"prompt": "a", "answer": Decimal("NaN")})], FieldMap(), source="f")


# ------------------------------------------------------------------ through the CLI


def test_the_cli_refuses_them_in_one_line_with_exit_2(tmp_path):
    files = {"s.jsonl": r'{"prompt": "ok", "answer": "bad \ud800"}' + "\n",
             "k.jsonl": '{"prompt":"first","prompt":"second","answer":"1"}\n',
             "w.json": '{\n "data": [{"prompt": "a", "answer": "1"}]\n}\n'}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        proc = subprocess.run([sys.executable, "-m", "flows.commands.cli", "train", "--set",
                               f"store.uri={tmp_path}/store", "--set", f"data.train_path={tmp_path / name}"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        err = proc.stderr.strip()
        assert proc.returncode == 2 and len(err.splitlines()) == 1 and name in err, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "store").exists()
