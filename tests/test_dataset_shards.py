"""A folder of Parquet shards read as one dataset (``actions/tasks/sources.py``): shards whose
columns or column types differ are refused naming the column and both shards, and a folder of
one split that the setting does not read is refused with a fix that works."""

from __future__ import annotations

from pathlib import Path

import pytest

from actions.tasks.sources import read_records


def _shards(folder: Path, *tables: object, names: tuple[str, ...] = ()) -> str:
    """``folder`` holding one Parquet file per table (a list of rows or a ``pyarrow.Table``),
    named ``part-<i>.parquet`` unless ``names`` names them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    for i, rows in enumerate(tables):
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows)
        pq.write_table(table, folder / (names[i] if names else f"part-{i}.parquet"))
    return str(folder)


def test_shards_whose_columns_differ_are_refused_in_either_order(tmp_path):
    """A later shard without a column of the first read as null in all its rows, which a reward
    function reading the column cannot tell from rows without a value: refused as the other
    order is, naming the column, the shard that lacks it and the one that has it."""
    import pyarrow as pa

    with_level = [{"prompt": "a", "answer": "1", "level": "easy"}]
    without = [{"prompt": "b", "answer": "2"}]
    for name, tables, lacking, having in (("fewer", (with_level, without), "part-1", "part-0"),
                                          ("more", (without, with_level), "part-0", "part-1")):
        with pytest.raises(ValueError, match=rf"^data.train_path '.*{name}': {lacking}.parquet has no column 'level', "
                                             rf"which {having}.parquet has; write every shard with the same columns: "
                                             rf"add it to {lacking}.parquet with its type in {having}.parquet \(null "
                                             r"where a row has no value\), or drop it from every shard$"):
            read_records(_shards(tmp_path / name, *tables), field="data.train_path")
    with pytest.raises(ValueError, match=r"part-2.parquet has no columns 'level', 'topic', which part-0.parquet has"):
        read_records(_shards(tmp_path / "two", [{**with_level[0], "topic": "x"}], [{**with_level[0], "topic": "y"}],
                             without), field="data.train_path")
    # the fix the message gives: the column written, null, in the shard that lacked it
    fixed = _shards(tmp_path / "fixed", with_level,
                    pa.table({"prompt": ["b"], "answer": ["2"], "level": pa.array([None], pa.string())}))
    assert [r["level"] for _, r in read_records(fixed, field="data.train_path")] == ["easy", None]


def test_a_shard_of_floats_that_are_not_whole_after_integers_is_refused_naming_the_column(tmp_path):
    """``datasets`` casts a later shard to the first's types: floats after integers read right
    when whole, and otherwise failed in Arrow naming neither the column nor the shard."""
    first = [{"prompt": "a", "answer": "1", "n": 3, "cases": [1]}]
    for name, later, column in (("top", {"n": 9.5, "cases": [2]}, "n"), ("nested", {"n": 4, "cases": [2.5]}, "cases")):
        folder = _shards(tmp_path / name, first, [{"prompt": "b", "answer": "2", **later}])
        with pytest.raises(ValueError, match=rf"^data.train_path '.*{name}': column '{column}' holds .*floating-point "
                                             r"numbers in part-1.parquet, not all whole \(ArrowInvalid: .*\), but "
                                             rf".*integers in part-0.parquet; write every shard with the same type in "
                                             rf"'{column}' \(floating-point numbers in every shard"):
            read_records(folder, field="data.train_path")
    whole = _shards(tmp_path / "whole", first, [{"prompt": "b", "answer": "2", "n": 4.0, "cases": [2.0]}])
    assert [(r["n"], r["cases"]) for _, r in read_records(whole, field="data.train_path")] == [(3, [1]), (4, [2])]


def test_a_folder_of_one_split_the_setting_does_not_read_suggests_a_fix_that_works(tmp_path):
    """An eval_path folder of ``train-*`` shards alone is the train split, refused; the fix it
    names (the shards renamed to ``test-*``, or one file) reads, unlike the folder it named."""
    rows = ([{"prompt": "a", "answer": "1"}], [{"prompt": "b", "answer": "2"}])
    names = ("train-00000-of-00002.parquet", "train-00001-of-00002.parquet")
    folder = _shards(tmp_path / "evals", *rows, names=names)
    with pytest.raises(ValueError, match=r"^data.eval_path '.*evals' holds Parquet files of splits train, none of them "
                                         r"test or validation; point data.eval_path at the files of the split to use, "
                                         r"e.g. a folder holding only its 2 train-\*.parquet files renamed to "
                                         r"test-\*.parquet \(a folder's train-\* files are its train split, which "
                                         r"data.eval_path does not read\), or one .parquet file holding their rows$"):
        read_records(folder, field="data.eval_path")
    renamed = _shards(tmp_path / "renamed", *rows, names=tuple(n.replace("train", "test") for n in names))
    assert len(read_records(renamed, field="data.eval_path")) == 2
    # one shard: the file itself, which reads whatever its name
    one = _shards(tmp_path / "one", rows[0], names=("train-00000-of-00001.parquet",))
    with pytest.raises(ValueError, match=r"e.g. .*one/train-00000-of-00001.parquet \(a file is read whatever its "
                                         r"name\)$"):
        read_records(one, field="data.eval_path")
    assert len(read_records(f"{one}/train-00000-of-00001.parquet", field="data.eval_path")) == 1
    # the same for data.train_path and a folder of test shards alone
    tests = _shards(tmp_path / "tests", *rows, names=tuple(n.replace("train", "test") for n in names))
    with pytest.raises(ValueError, match=r"e.g. a folder holding only its 2 test-\*.parquet files renamed to "
                                         r"train-\*.parquet"):
        read_records(tests, field="data.train_path")
    # a split no setting reads, alone, is read whole (the fix the message names for it)
    sft = _shards(tmp_path / "sft", *rows, names=tuple(n.replace("train", "train_sft") for n in names))
    assert len(read_records(sft, field="data.eval_path")) == 2
