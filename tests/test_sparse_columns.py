"""A JSON Lines column that only some rows have: every row gets it (None where the row leaves
the key out), as a Hugging Face dataset gives it to TRL, so a step whose batch holds no row
with it still passes it to the reward functions; the rows' ids stay those of the columns as
written (CPU, no model)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from actions.contracts import EvaluateRequest, ModelRef
from actions.tasks.dataset import rows_to_jsonl
from actions.tasks.fields import FieldMap, content_id, to_rows
from actions.tasks.rewards import RewardFunctionError
from actions.tasks.rewards.model_scoring import score_completions
from actions.tasks.sources import read_records
from actions.tasks.stored import StoredRows

SEEN: list[list] = []


def by_difficulty(prompts, completions, difficulty, **kwargs):
    """A plug-in that needs the sparse column: 1.0 where the row has a difficulty, None where not."""
    SEEN.append(list(difficulty))
    return [None if d is None else 1.0 for d in difficulty]


def by_level(prompts, completions, level, **kwargs):
    return [1.0] * len(completions)


@pytest.fixture(autouse=True)
def _plugin(monkeypatch):
    monkeypatch.setitem(sys.modules, "sparse_plugin", types.SimpleNamespace(rew=by_difficulty, level=by_level))
    SEEN.clear()


def _records(n: int = 16, having: range = range(4)) -> list[dict]:
    return [{"prompt": f"q{i}", "answer": str(i), **({"difficulty": i} if i in having else {})} for i in range(n)]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_row_gets_every_column_and_keeps_the_id_its_columns_as_written_give():
    records = _records()
    records.append({"prompt": "q0", "answer": "0"})  # q0's prompt and answer without its difficulty: a row of its own
    records.append(dict(records[1]))  # a repeat of row 2 in every column: dropped
    rows, stats = to_rows(list(enumerate(records, start=1)), FieldMap(), source="f")
    assert stats.duplicates_dropped == 1 and len(rows) == 17
    assert [r.columns for r in rows] == [{"difficulty": i if i < 4 else None} for i in range(16)] + \
        [{"difficulty": None}]
    # ids as before the fill: prompt and answer, and for the repeated pair the columns as written
    assert [r.prompt_id for r in rows[:16]] == [content_id(f"q{i}", str(i)) for i in range(16)]
    as_written = content_id("q0", "0", {"answer": "0"})
    assert rows[16].prompt_id == as_written != content_id("q0", "0", {"answer": "0", "difficulty": None})
    # the stored copy keeps the Nones (the score action reads it)
    stored = StoredRows(rows_to_jsonl(rows), "runs/r/data/train/manifest.json")
    assert stored[rows[9].prompt_id].columns == {"difficulty": None}


def test_a_row_without_a_reference_under_answer_gets_the_answer_column_as_none():
    """``answer`` is a column of its own in a row without a reference (an answer-less row, as
    the dataset allows without something that reads it); a row that leaves it out has it as None."""
    records = [(1, {"prompt": "p", "answer": "a", "topic": "t"}), (2, {"prompt": "q", "answer": ""}),
               (3, {"prompt": "r"})]
    rows, _ = to_rows(records, FieldMap(), source="f")
    assert [r.columns for r in rows] == [{"topic": "t"}, {"answer": "", "topic": None}, {"topic": None, "answer": None}]
    assert [r.prompt_id for r in rows] == [content_id("p", "a"), content_id("q", ""), content_id("r", "")]


def test_parquet_rows_still_have_their_nulls(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    records = _records(6, range(2))
    table = pa.table({"prompt": [r["prompt"] for r in records], "answer": [r["answer"] for r in records],
                      "difficulty": [r.get("difficulty") for r in records]})
    pq.write_table(table, tmp_path / "d.parquet")
    from_parquet, _ = to_rows(read_records(str(tmp_path / "d.parquet"), field="data.train_path"), FieldMap(),
                              source="p")
    from_jsonl, _ = to_rows(read_records(str(_jsonl(tmp_path / "d.jsonl", records)), field="data.train_path"),
                            FieldMap(), source="j")
    assert [r.columns for r in from_parquet] == [r.columns for r in from_jsonl] == \
        [{"difficulty": 0}, {"difficulty": 1}] + [{"difficulty": None}] * 4
    assert [r.prompt_id for r in from_parquet] == [r.prompt_id for r in from_jsonl]


def _build(tmp_path, *overrides: str):
    from actions.models.modeling import build_char_tokenizer
    from actions.tasks.build import build_datasets
    from flows.config import load_config

    cfg = load_config(None, ["algorithm.batch_size=8", "algorithm.group_size=4", *overrides]).workload()
    return build_datasets(cfg, lambda: build_char_tokenizer(""), model_name="tiny"), cfg


def test_a_batch_without_the_column_passes_it_as_none_when_scored(tmp_path):
    """Rows 0-3 of 16 have ``difficulty``: the start-up check passes, and so does a step whose
    batch holds no row with it, read from the stored copy as the score action reads it: the
    plug-in gets ``difficulty=None`` for those rows."""
    path = _jsonl(tmp_path / "d.jsonl", _records(16, range(4)))
    data, cfg = _build(tmp_path, f"data.train_path={path}", "reward.functions=[{name: 'sparse_plugin:rew'}]")
    assert len(SEEN) == 1  # the start-up call
    stored = StoredRows(rows_to_jsonl(data.train), "runs/r/data/train/manifest.json")
    batch = [stored[r.prompt_id] for r in data.train if r.columns.get("difficulty") is None][:4]
    assert len(batch) == 4
    model = ModelRef(store_uri=str(tmp_path), base_key="b", policy_key="p", policy_version=0)
    req = EvaluateRequest(model=model, dataset_key="d", max_new_tokens=4, output_key="e",
                          rewards=cfg.reward_functions(), step=1, max_steps=2)
    SEEN.clear()
    rewards = score_completions(req, batch, ["x"] * 4, [[1]] * 4, str(tmp_path))
    assert SEEN == [[None] * 4] and rewards.per_function["sparse_plugin:rew"] == [None] * 4
    assert rewards.applicable == [False] * 4


def test_a_copy_stored_before_the_fill_gives_every_row_every_column(tmp_path):
    """A stored copy whose rows leave a sparse column out (as one stored before the fill, by a
    run now resumed): each row read has it as None; a row's reference under ``answer`` stays
    out of its columns (the reward functions still get it as ``answer``)."""
    path = _jsonl(tmp_path / "d.jsonl", _records(8, range(2)))
    data, _ = _build(tmp_path, f"data.train_path={path}", "reward.functions=[{name: 'sparse_plugin:rew'}]")
    old = [r.model_copy(update={"columns": {k: v for k, v in r.columns.items() if v is not None}})
           for r in data.train]
    assert any("difficulty" not in r.columns for r in old) and any("difficulty" in r.columns for r in old)
    stored = StoredRows(rows_to_jsonl(old), "runs/r/data/train/manifest.json")
    read = [stored[r.prompt_id] for r in old]
    assert all("difficulty" in r.columns for r in read)
    assert [r.columns["difficulty"] for r in read] == [r.columns.get("difficulty") for r in data.train]
    assert all("answer" not in r.columns for r in read if r.has_answer)


def test_the_startup_check_accepts_a_column_some_rows_have_and_refuses_one_none_has(tmp_path):
    """The two rows the start-up check calls the plug-in on lack the column (the last four of
    the training file have it, one of the eval file's): they pass it as None."""
    train = _jsonl(tmp_path / "t.jsonl", _records(16, range(12, 16)))
    evals = _jsonl(tmp_path / "e.jsonl", _records(8, range(7, 8)))
    _build(tmp_path, f"data.train_path={train}", f"data.eval_path={evals}",
           "reward.functions=[{name: 'sparse_plugin:rew'}]")
    # an eval file without the column: no row of it has it
    bare = _jsonl(tmp_path / "bare.jsonl", _records(8, range(0)))
    with pytest.raises(RewardFunctionError, match=r"parameter 'difficulty' is not a column of data.eval_path "
                                                  rf"{bare} .* data.train_path {train} has it"):
        _build(tmp_path, f"data.train_path={train}", f"data.eval_path={bare}",
               "reward.functions=[{name: 'sparse_plugin:rew'}]")
    # a parameter no row of either file has
    with pytest.raises(RewardFunctionError, match=r"parameter 'level' is not a column of "):
        _build(tmp_path, f"data.train_path={train}", f"data.eval_path={evals}",
               "reward.functions=[{name: 'sparse_plugin:level'}]")
