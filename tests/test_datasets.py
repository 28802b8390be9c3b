"""Prompt datasets: JSONL, Parquet and save_to_disk sources, field mapping, ids, chat
formatting and the prompt-length policy (``actions/tasks``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actions.tasks.build import build_datasets
from actions.tasks.chat import format_rows, uses_template
from actions.tasks.fields import FieldMap, content_id, to_rows
from actions.tasks.prompt_length import limit_prompt_length
from actions.tasks.sources import read_records
from flows.config import load_config

GSM8K_ROWS = [
    {"question": "Ann has 3 apples and buys 4 more. How many now?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
    {"question": "Ben had 10 pens and lost 2. How many left?", "answer": "10-2=<<10-2=8>>8\n#### 8"},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_three_formats_give_the_same_rows(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(GSM8K_ROWS)
    ds.to_parquet(str(tmp_path / "t.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "folder").mkdir()
    ds.to_parquet(str(tmp_path / "folder" / "train-00000-of-00001.parquet"))
    fields = FieldMap(prompt_key="question", answer_key="answer")
    sources = [_jsonl(tmp_path / "t.jsonl", GSM8K_ROWS), tmp_path / "t.parquet", tmp_path / "saved", tmp_path / "folder"]
    results = [to_rows(read_records(str(p), field="data.train_path"), fields, source=str(p))[0] for p in sources]
    assert all(r == results[0] for r in results)
    first = results[0][0]
    assert first.prompt == GSM8K_ROWS[0]["question"] and first.answer.endswith("#### 7")
    # No id column: a stable id from the content, the same in every format and run.
    assert first.prompt_id == content_id(GSM8K_ROWS[0]["question"], GSM8K_ROWS[0]["answer"]) < 2**48


def test_ids_columns_and_duplicates():
    records = [(1, {"uid": "a", "q": "x?", "a": 1, "level": 3}), (2, {"uid": "b", "q": "y?", "a": "2", "level": 5})]
    rows, stats = to_rows(records, FieldMap("q", "a", "uid"), source="f")
    assert [r.answer for r in rows] == ["1", "2"]  # a numeric answer is kept as its text
    # every column but the prompt, the id column too, goes to the reward functions by its own name
    assert rows[0].columns == {"uid": "a", "a": 1, "level": 3} and len({r.prompt_id for r in rows}) == 2
    same = [(1, {"prompt": "p", "answer": "a"}), (2, {"prompt": "p", "answer": "a"}), (3, {"prompt": "q", "answer": "a"})]
    rows, stats = to_rows(same, FieldMap(), source="f")
    assert len(rows) == 2 and stats.duplicates_dropped == 1 and stats.rows_read == 3
    with pytest.raises(ValueError, match=r"f:2: prompt_id 7 appears twice \(first at row 1\)"):
        to_rows([(1, {"prompt_id": 7, "prompt": "p", "answer": "a"}), (2, {"prompt_id": 7, "prompt": "q", "answer": "b"})],
                FieldMap(), source="f")


class _ChatTokenizer:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_chat_formatting_and_system_prompt():
    records = [(1, {"prompt": [{"role": "user", "content": "hi"}], "answer": "a"}), (2, {"prompt": "yo", "answer": "b"})]
    rows, _ = to_rows(records, FieldMap(), source="f")
    assert rows[0].source_prompt == [{"role": "user", "content": "hi"}] and rows[1].source_prompt == "yo"
    tok = _ChatTokenizer()
    assert uses_template(tok, "auto", "m") and not uses_template(tok, False, "m") and not uses_template(None, "auto", "m")
    with pytest.raises(ValueError, match="data.chat_template is true"):
        uses_template(None, True, "the tiny default model")
    out = format_rows(rows, tok, use_template=True, system_prompt="be brief", source="f")
    assert [r.prompt for r in out] == ["<system>be brief<user>hi<assistant>", "<system>be brief<user>yo<assistant>"]
    assert [r.source_prompt for r in out] == [rows[0].source_prompt, "yo"]  # the dataset's, for the rewards
    raw = format_rows(rows[1:], None, use_template=False, system_prompt="be brief", source="f")
    assert raw[0].prompt == "be brief\nyo"
    with pytest.raises(ValueError, match=r"^f:1 \(prompt_id \d+\) is a list of chat messages"):
        format_rows(rows, None, use_template=False, system_prompt=None, source="f")


def test_prompt_length_policy():
    from actions.tasks.dataset import rows_to_jsonl

    records = [(i, {"prompt": "x" * n, "answer": "a"}) for i, n in enumerate([3, 9, 5], start=1)]
    rows, _ = to_rows(records, FieldMap(), source="f")
    enc, dec = (lambda t: list(t)), (lambda ids: "".join(ids))  # one token per character
    kept, stats = limit_prompt_length(rows, encode=enc, decode=dec, max_tokens=5, policy="skip", source="f")
    assert [len(r.prompt) for r in kept] == [3, 5] and stats.skipped == 1
    cut, stats = limit_prompt_length(rows, encode=enc, decode=dec, max_tokens=5, policy="truncate_left", source="f")
    assert [len(r.prompt) for r in cut] == [3, 5, 5] and stats.truncated == 1 and stats.longest_prompt_tokens == 5
    # the row as its file numbers it, whatever rows were dropped or held out before it
    with pytest.raises(ValueError, match=r"^f:2 \(prompt_id \d+\) has 9 prompt tokens, above "
                                         r"data.max_prompt_tokens=5; raise it, or set data.long_prompts"):
        limit_prompt_length(rows[1:], encode=enc, decode=dec, max_tokens=5, policy="error", source="f")
    unnumbered = [r.model_copy(update={"line": None}) for r in rows]  # a generated task's
    with pytest.raises(ValueError, match=r"^f: row 2 \(prompt_id \d+\) has 9 prompt tokens, above 5 \(x\); lower"):
        limit_prompt_length(unnumbered, encode=enc, decode=dec, max_tokens=5, policy="error", source="f",
                            limit_text="5 (x)", fix="lower generation.max_new_tokens")
    assert "line" not in rows[1].model_dump() and "line" not in rows_to_jsonl(rows[:1]).decode()  # never stored


def test_build_counts_truncation_in_the_summary_and_keeps_eval_apart(tmp_path):
    from actions.models.modeling import build_char_tokenizer

    cfg = load_config(None, ["data.task=arith", "data.max_prompt_tokens=60", "data.long_prompts=truncate_left",
                             "data.num_train_prompts=40", "data.num_eval_prompts=10"])
    data = build_datasets(cfg, lambda: build_char_tokenizer("#"), model_name="tiny")
    s = data.summary["train"]
    assert s["rows"] == 40 and s["truncated"] > 0 and s["longest_prompt_tokens"] <= 60
    assert all(len(r.prompt) <= 60 for r in data.train)  # one character = one token
    assert not {r.prompt_id for r in data.train} & {r.prompt_id for r in data.evals}
    # Warm-up stays off for a user dataset unless asked for; synthetic tasks keep theirs.
    assert load_config(None, ["data.train_path=x.jsonl"]).warmup.steps == 0
    assert load_config(None, ["data.train_path=x.jsonl", "warmup.steps=50"]).warmup.steps == 50
    assert cfg.warmup.steps == 300 and cfg.data.max_count == 3


def test_too_few_training_prompts_says_where_the_rows_went(tmp_path):
    """A step needs algorithm.batch_size/group_size prompts: when fewer are left, the line counts
    the rows read and what took the others (duplicates, data.eval_fraction, data.long_prompts=skip),
    and gives the fix for each; a limit that skipped every row is not called a small dataset."""
    long = [{"prompt": f"a long question {i}", "answer": "a"} for i in range(4)]
    path = _jsonl(tmp_path / "d.jsonl", [long[0], *long])
    with pytest.raises(ValueError, match=r"^data has 0 training prompts \(of 5 rows read, 1 repeated an earlier row, "
                                         r"4 were skipped by data.long_prompts=skip as longer than "
                                         r"data.max_prompt_tokens=5\) but a step needs algorithm.batch_size/"
                                         r"group_size = 2; raise data.max_prompt_tokens or set "
                                         r"data.long_prompts=truncate_left$"):
        _build(f"data.train_path={path}", "data.long_prompts=skip", "data.max_prompt_tokens=5")
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "answer": "a"}, *long])
    with pytest.raises(ValueError, match=r"^data has 1 training prompt \(of 5 rows read, 1 was held out by "
                                         r"data.eval_fraction=0.2, 3 were skipped by data.long_prompts=skip as longer "
                                         r"than data.max_prompt_tokens=5\) but a step needs algorithm.batch_size/"
                                         r"group_size = 2; lower data.eval_fraction \(or set data.eval_path\); or "
                                         r"raise data.max_prompt_tokens or set data.long_prompts=truncate_left; or "
                                         r"add prompts or lower algorithm.batch_size$"):
        _build(f"data.train_path={path}", "data.long_prompts=skip", "data.max_prompt_tokens=5",
               "data.eval_fraction=0.2", "seed=1")
    with pytest.raises(ValueError, match=r"^data has 1 training prompt but a step needs algorithm.batch_size/"
                                         r"group_size = 2; add prompts or lower algorithm.batch_size$"):
        _build(f"data.train_path={_jsonl(tmp_path / 'one.jsonl', [{'prompt': 'q', 'answer': 'a'}])}")
    # every skipped row fills the context alone: a lower generation.max_new_tokens is no fix
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "x" * 300 + str(i), "answer": "a"} for i in range(3)])
    with pytest.raises(ValueError, match=r"3 were skipped by data.long_prompts=skip as longer than the prompt limit "
                                         r"232 .*group_size = 2; all 3 fill the model's context of 256 "
                                         r"\(model.max_positions\) alone, whatever generation.max_new_tokens is: "
                                         r"shorten them, raise model.max_positions, or set "
                                         r"data.long_prompts=truncate_left \(keep its end\)$"):
        _build(f"data.train_path={path}", "data.long_prompts=skip")


def test_an_eval_set_that_the_prompt_limit_empties_names_the_setting_that_sets_it(tmp_path):
    train = _jsonl(tmp_path / "t.jsonl", [{"prompt": f"q{i}", "answer": "a"} for i in range(4)])
    # 240 characters: above the limit (the tiny model's context of 256 less 24 new tokens), within the context
    evals = _jsonl(tmp_path / "e.jsonl", [{"prompt": "x" * 240, "answer": "a"}])
    with pytest.raises(ValueError, match=r"^the eval set \(.*\) has no prompts left after data.long_prompts; "
                                         r"raise data.max_prompt_tokens$"):
        _build(f"data.train_path={train}", f"data.eval_path={evals}", "data.long_prompts=skip",
               "data.max_prompt_tokens=5")
    with pytest.raises(ValueError, match=r"has no prompts left after data.long_prompts; its limit is 232 tokens "
                                         r"\(data.max_prompt_tokens unset: .*\): lower generation.max_new_tokens$"):
        _build(f"data.train_path={train}", f"data.eval_path={evals}", "data.long_prompts=skip")
    # a prompt that fills the context alone: no limit and no generation.max_new_tokens brings it back
    evals = _jsonl(tmp_path / "e.jsonl", [{"prompt": "x" * 5000, "answer": "a"}])
    fills = (r"it fills the model's context of 256 \(model.max_positions\) alone, whatever generation.max_new_tokens "
             r"is: shorten it, raise model.max_positions, or set data.long_prompts=truncate_left \(keep its end\)$")
    with pytest.raises(ValueError, match=r"has no prompts left after data.long_prompts; " + fills):
        _build(f"data.train_path={train}", f"data.eval_path={evals}", "data.long_prompts=skip",
               "data.max_prompt_tokens=5")
    with pytest.raises(ValueError, match=r"has no prompts left after data.long_prompts; its limit is 232 tokens "
                                         r"\(data.max_prompt_tokens unset: .*\): " + fills):
        _build(f"data.train_path={train}", f"data.eval_path={evals}", "data.long_prompts=skip")


def test_an_eval_fraction_of_a_one_row_dataset_says_it_holds_out_nothing(tmp_path):
    from actions.models.modeling import build_char_tokenizer

    path = _jsonl(tmp_path / "one.jsonl", [{"prompt": "q", "answer": "a"}])
    cfg = load_config(None, [f"data.train_path={path}", "data.eval_fraction=0.5", "algorithm.batch_size=8",
                             "algorithm.group_size=8", "algorithm.num_minibatches=1"])
    assert cfg.algorithm.prompts_per_step == 1
    with pytest.raises(ValueError, match=r"^data.eval_fraction=0.5 holds out no row of 1 training row \(one must "
                                         r"stay to train on\); add rows or set data.eval_path$"):
        build_datasets(cfg, lambda: build_char_tokenizer(), model_name="tiny")


def test_arith_max_value_bounds_every_number_of_problem_and_solution():
    import re

    from actions.models.modeling import build_char_tokenizer

    def numbers(max_value: int | None) -> set[int]:
        overrides = ["data.task=arith", "data.num_train_prompts=200", "data.num_eval_prompts=10"]
        cfg = load_config(None, overrides + ([f"data.max_value={max_value}"] if max_value else []))
        rows = build_datasets(cfg, lambda: build_char_tokenizer("#"), model_name="tiny").train
        return {int(n) for r in rows for n in re.findall(r"\d+", r.prompt + " " + r.answer)}

    assert numbers(4) == set(range(5))
    assert numbers(None) == set(range(10))  # the default: one-digit quantities
    # Quantities 0..1 and one operation allow 144 distinct questions, not 512 + 10.
    cfg = load_config(None, ["data.task=arith", "data.max_value=1", "data.max_count=1"])
    with pytest.raises(ValueError, match="only 144 distinct problems .* raise data.max_value"):
        build_datasets(cfg, lambda: build_char_tokenizer("#"), model_name="tiny")


def test_task_sizes_belong_to_the_generated_task_and_fingerprints_stay():
    """``num_train_prompts``/``num_eval_prompts`` size the generated task; written beside a
    dataset file they would be ignored and are refused where the user wrote them. A config's dump
    (what requests and stored identities carry: every field) validates again, and run ids stay."""
    from flows.config import CampaignConfig, load_config

    task, dataset = load_config(None, []), load_config(None, ["data.train_path=x.jsonl"])
    for cfg in (task, dataset):
        assert CampaignConfig.model_validate(cfg.model_dump(mode="json")).fingerprint() == cfg.fingerprint()
    assert (task.fingerprint(), dataset.fingerprint()) == ("7cd0a181803c", "fd5269a6ddb8")  # the run ids runs carry
    # PPO computed k1 before kl_kind reached it, and its runs keep their ids; a real k3 is new.
    ppo = {kind: load_config(None, ["algorithm.name=ppo"] + ([f"algorithm.kl_kind={kind}"] if kind else []))
           for kind in (None, "k1", "k3")}
    assert ppo[None].fingerprint() == ppo["k1"].fingerprint() == "d9d0676e25bb" != ppo["k3"].fingerprint()
    with pytest.raises(ValueError, match=r"data.num_eval_prompts=8 sizes the generated task, but data.train_path"):
        load_config(None, ["data.train_path=x.jsonl", "data.num_eval_prompts=8"])


def _split_rows(split: str, n: int) -> list[dict]:
    return [{"prompt": f"{split} question {i}", "answer": str(i)} for i in range(n)]


def _build(*overrides: str):
    from actions.models.modeling import build_char_tokenizer

    cfg = load_config(None, ["algorithm.batch_size=8", "algorithm.group_size=4", *overrides]).workload()
    return build_datasets(cfg, lambda: build_char_tokenizer(""), model_name="tiny")


def test_a_long_prompt_is_named_by_its_file_and_line_wherever_it_went(tmp_path):
    """The refusal names the file and the line the row is on (after dropped duplicates), the
    training file for a row held out by data.eval_fraction, and the fix that applies."""
    rows = [{"prompt": f"q{i}", "answer": "a"} for i in range(12)]
    rows[6] = rows[5]  # a duplicate, dropped: row 8 stays line 8
    rows[7] = {"prompt": "a question far too long " * 3, "answer": "a"}
    path = _jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(ValueError, match=rf"^data.train_path {path}:8 \(prompt_id \d+\) has 72 prompt tokens, above "
                                         r"data.max_prompt_tokens=20; raise it, or set data.long_prompts"):
        _build(f"data.train_path={path}", "data.max_prompt_tokens=20")
    held = [seed for seed in range(40) if _held_out(path, seed)]
    assert held  # some seed holds the long row out for evaluation
    with pytest.raises(ValueError, match=rf"^data.train_path {path} \(held out by data.eval_fraction\):8 "):
        _build(f"data.train_path={path}", "data.max_prompt_tokens=20", "data.eval_fraction=0.5", f"seed={held[0]}")


def _held_out(path: Path, seed: int) -> bool:
    try:
        _build(f"data.train_path={path}", "data.max_prompt_tokens=20", "data.eval_fraction=0.5", f"seed={seed}")
    except ValueError as exc:
        return "held out" in str(exc)
    return False


def test_a_folder_of_split_files_gives_each_setting_its_split(tmp_path):
    """A local copy of a hub dataset (``data/gsm8k/main/{train,test}-00000-of-00001.parquet``)
    reads as the hub id does: train_path the train files, eval_path the test files."""
    import datasets

    main = tmp_path / "main"
    main.mkdir()
    datasets.Dataset.from_list(_split_rows("train", 8)).to_parquet(str(main / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_list(_split_rows("test", 4)).to_parquet(str(main / "test-00000-of-00001.parquet"))
    split_of = lambda field: {r["prompt"].split()[0] for _, r in read_records(str(main), field=field)}  # noqa: E731
    assert split_of("data.train_path") == {"train"} and split_of("data.eval_path") == {"test"}
    both = _build(f"data.train_path={main}", f"data.eval_path={main}")
    assert (len(both.train), len(both.evals)) == (8, 4)
    assert not {r.prompt_id for r in both.train} & {r.prompt_id for r in both.evals}
    held = _build(f"data.train_path={main}", "data.eval_fraction=0.25")  # held out of the train split only
    assert (len(held.train), len(held.evals)) == (6, 2)
    assert all(r.prompt.startswith("train ") for r in held.train + held.evals)
    # Names without a split (Spark's part-*.parquet) are read whole, as before.
    plain = tmp_path / "plain"
    plain.mkdir()
    for i in range(2):
        datasets.Dataset.from_list(_split_rows(f"part{i}", 3)).to_parquet(str(plain / f"part-{i}.parquet"))
    assert len(read_records(str(plain), field="data.eval_path")) == 6
    # Splits, but none the setting reads: refused, naming them and a file to point at instead.
    (main / "test-00000-of-00001.parquet").rename(main / "dev-00000-of-00001.parquet")
    with pytest.raises(ValueError, match=r"data.eval_path '.*main' holds Parquet files of splits dev, train, none of "
                                         r"them test or validation; point data.eval_path at the files of the split "
                                         r"to use, e.g. .*main/dev-00000-of-00001.parquet") as exc:
        read_records(str(main), field="data.eval_path")
    assert "\n" not in str(exc.value)


def test_a_folder_of_splits_none_a_setting_reads_is_refused_naming_them(tmp_path):
    """ultrachat_200k's ``train_sft``/``test_sft`` shards (ultrafeedback's ``*_prefs``) are
    splits too: read whole, training would hold the test rows and evaluation the training rows.
    Each setting is refused in one line naming the splits and the files of its own to point at."""
    import datasets

    uc = tmp_path / "uc"
    uc.mkdir()
    for split, n in (("train_sft", 6), ("test_sft", 4)):
        datasets.Dataset.from_list(_split_rows(split, n)).to_parquet(str(uc / f"{split}-00000-of-00001.parquet"))
    for field, split in (("data.train_path", "train_sft"), ("data.eval_path", "test_sft")):
        with pytest.raises(ValueError, match=rf"^{field} '.*uc' holds Parquet files of splits test_sft, train_sft, "
                                             rf"none of them (train|test or validation); point {field} at the files "
                                             rf"of the split to use, e.g. .*uc/{split}-00000-of-00001.parquet, or at "
                                             r"a folder holding only them$") as exc:
            read_records(str(uc), field=field)
        assert "\n" not in str(exc.value)
    # The fix it names works: the split's file, or a folder holding only that split's shards.
    assert len(read_records(str(uc / "train_sft-00000-of-00001.parquet"), field="data.train_path")) == 6
    for i in range(2):
        shard = uc / f"train_prefs-0000{i}-of-00002.parquet"
        datasets.Dataset.from_list(_split_rows(f"s{i}", 3)).to_parquet(str(shard))
    with pytest.raises(ValueError, match=r"splits test_sft, train_prefs, train_sft, none of them train; point "
                                         r"data.train_path at the files of the split to use, e.g. a folder holding "
                                         r"only its 2 train_prefs-\*.parquet files$"):
        read_records(str(uc), field="data.train_path")
    prefs = tmp_path / "prefs"
    prefs.mkdir()
    for shard in uc.glob("train_prefs-*"):
        shard.rename(prefs / shard.name)
    assert len(read_records(str(prefs), field="data.train_path")) == 6
    built = _build(f"data.train_path={prefs}", f"data.eval_path={uc / 'test_sft-00000-of-00001.parquet'}")
    assert all(r.prompt.startswith("s") for r in built.train) and len(built.train) == 6
    assert all(r.prompt.startswith("test_sft ") for r in built.evals)


def test_a_datasetdict_folder_gives_each_setting_its_split(tmp_path):
    import datasets

    def save(name: str, *splits: str):
        folder = tmp_path / name
        dd = datasets.DatasetDict({s: datasets.Dataset.from_list(_split_rows(s, 8)) for s in splits})
        dd.save_to_disk(str(folder))
        return folder

    def split_of(folder, field):
        return {r["prompt"].split()[0] for _, r in read_records(str(folder), field=field)}

    full = save("full", "train", "validation", "test")
    assert split_of(full, "data.train_path") == {"train"} and split_of(full, "data.eval_path") == {"test"}
    assert split_of(save("val", "train", "validation"), "data.eval_path") == {"validation"}
    both = _build(f"data.train_path={full}", f"data.eval_path={full}")
    assert all(r.prompt.startswith("train ") for r in both.train)
    assert all(r.prompt.startswith("test ") for r in both.evals)
    # No split fits: the splits are named, and the suggestion is not the other setting's split.
    odd = save("odd", "dev", "test")
    with pytest.raises(ValueError, match=r"data.train_path '.*odd' holds a DatasetDict with splits dev, test, none "
                                         r"of them train; point data.train_path at the split folder to use, "
                                         r"e.g. .*odd/dev$"):
        read_records(str(odd), field="data.train_path")


def test_a_json_array_file_is_read_as_rows(tmp_path):
    rows = _split_rows("arr", 3)
    (tmp_path / "a.json").write_text(json.dumps(rows, indent=2))  # as json.dump writes a list
    assert read_records(str(tmp_path / "a.json"), field="data.train_path") == list(enumerate(rows, start=1))
    (tmp_path / "a.jsonl").write_text(json.dumps(rows))
    with pytest.raises(ValueError, match=r"a.jsonl starts with a JSON array, not an object; JSON Lines holds one "
                                         r"object per line: convert it \(jq -c '.\[\]' a.jsonl\)"):
        read_records(str(tmp_path / "a.jsonl"), field="data.train_path")
    (tmp_path / "b.json").write_text(json.dumps([rows[0], "x"]))
    with pytest.raises(ValueError, match=r"b.json: element 2 of the array is a str, not an object"):
        read_records(str(tmp_path / "b.json"), field="data.eval_path")
    (tmp_path / "c.json").write_text('[{"prompt": "p",\n "answer": 1},\n oops]')
    with pytest.raises(ValueError, match=r"c.json:3: not valid JSON \(Expecting value\)"):
        read_records(str(tmp_path / "c.json"), field="data.eval_path")


def test_rows_without_a_reference_answer_are_kept_unless_something_reads_it():
    """TRL needs no reference answer: a missing or null one is "" (``has_answer`` false) unless a
    built-in that compares with it or warm-up reads it; then the row is refused, naming that."""
    records = [(1, {"prompt": "Tell a story", "answer": "once"}), (2, {"prompt": "Tell a joke", "answer": None}),
               (3, {"prompt": "Tell a fact"})]
    rows, _ = to_rows(records, FieldMap(), source="f")
    assert [(r.answer, r.has_answer, r.source_answer) for r in rows] == [("once", True, None), ("", False, None),
                                                                         ("", False, None)]
    # a null stays a column of its own, and a row without the key has it as None (every column of the file)
    assert [r.columns for r in rows] == [{}, {"answer": None}, {"answer": None}]
    rows, _ = to_rows([(1, {"prompt": "p", "answer": "a"})], FieldMap(answer_key=None), source="f")
    assert (rows[0].answer, rows[0].has_answer, rows[0].columns) == ("", False, {"answer": "a"})
    need = ("reward.functions gsm8k compares with a reference answer", "or use rewards that need none")
    with pytest.raises(ValueError, match=r"f:2: key 'answer' is null; reward.functions gsm8k compares .* fill it in"):
        to_rows(records, FieldMap(answer_need=need), source="f")
    with pytest.raises(ValueError, match=r"f:3: key 'answer' is missing .* every row needs one: set data.answer_key"):
        to_rows(records[2:], FieldMap(answer_need=need), source="f")
    # an empty or blank answer, as CSV and pandas exports write a missing one, is none
    blank = [(1, {"prompt": "Tell a tale", "answer": ""}), (2, {"prompt": "Tell a riddle", "answer": "  "})]
    rows, _ = to_rows(blank, FieldMap(), source="f")
    assert [(r.answer, r.has_answer) for r in rows] == [("", False), ("", False)]
    with pytest.raises(ValueError, match=r"f:1: key 'answer' is empty; reward.functions gsm8k .* fill it in"):
        to_rows(blank, FieldMap(answer_need=need), source="f")
    with pytest.raises(ValueError, match=r"f:2: key 'answer' is blank; "):
        to_rows(blank[1:], FieldMap(answer_need=need), source="f")
    # an explicit answer_key that no row has is a misspelt name, not a dataset without answers
    with pytest.raises(ValueError, match=r"no row has the column 'solutoin' named by data.answer_key .* null"):
        to_rows(records, FieldMap(answer_key="solutoin"), source="f")


def test_answer_key_null_is_refused_only_where_a_reference_is_read(tmp_path):
    from actions.models.modeling import build_char_tokenizer
    from actions.prepare import token_table

    base = [f"data.train_path={_jsonl(tmp_path / 'd.jsonl', [{'prompt': f'Tell story {i}'} for i in range(16)])}"]
    plugin = ["reward.functions=[{name: format}]"]
    cfg = load_config(None, base + plugin + ["data.answer_key=null"])
    assert cfg.data.answer_key is None and cfg.answer_need() is None
    data = build_datasets(cfg, lambda: build_char_tokenizer(), model_name="tiny")
    assert len(data.train) == 16 and not any(r.has_answer for r in data.train)
    # The default answer_key with no such column: usable too, when nothing reads it.
    assert len(build_datasets(load_config(None, base + plugin), lambda: build_char_tokenizer(),
                              model_name="tiny").train) == 16
    with pytest.raises(ValueError, match=r"reward.functions gsm8k compares with a reference answer and "
                                         r"data.answer_key is null; set data.answer_key .* \(format"):
        load_config(None, base + ["data.answer_key=null", "reward.functions=[{name: gsm8k}]"])
    with pytest.raises(ValueError, match=r"the default reward repeat \(reward.functions unset\) compares"):
        load_config(None, base + ["data.answer_key=null"])
    with pytest.raises(ValueError, match=r"warmup.steps=5 trains on the reference answers and data.answer_key is "
                                         r"null; .* or set warmup.steps: 0"):
        load_config(None, base + plugin + ["data.answer_key=null", "warmup.steps=5"])
    with pytest.raises(ValueError, match=r"d.jsonl:1: key 'answer' is missing .* the default reward repeat"):
        build_datasets(load_config(None, base), lambda: build_char_tokenizer(), model_name="tiny")
    # The first epoch's length prediction of a prompt without a reference: the generation cap.
    table = token_table(data.train[:1] + [data.train[1].model_copy(update={"answer": "ab", "has_answer": True})],
                        lambda text: list(text), max_new_tokens=24)
    assert [t["answer_len"] for t in table.values()] == [24, 2]


def test_chat_messages_keep_every_key_for_the_template_and_the_rewards():
    call = {"type": "function", "function": {"name": "calc", "arguments": {"x": 2}}}
    messages = [{"role": "user", "content": "compute"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "name": "calc", "content": "4"}]
    rows, _ = to_rows([(1, {"prompt": messages, "answer": "4"})], FieldMap(), source="f")
    assert rows[0].source_prompt == messages

    class Recording(_ChatTokenizer):
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            self.seen = messages
            return "<chat>"

    tok = Recording()
    out = format_rows(rows, tok, use_template=True, system_prompt=None, source="f")
    assert tok.seen == messages and out[0].source_prompt == messages  # whole messages, as TRL hands them over

    class TextOnly(_ChatTokenizer):  # a template that adds each content to a string, as ChatML templates do
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "".join("<" + m["role"] + ">" + m["content"] for m in messages)

    # A template that cannot render them says so in one line.
    with pytest.raises(ValueError, match=r"^f:1 \(prompt_id \d+\): the tokenizer's chat template fails on its "
                                         r"messages \(TypeError: .*\); change the messages"):
        format_rows(rows, TextOnly(), use_template=True, system_prompt=None, source="f")
    with pytest.raises(ValueError, match=r"message 0 is \{'role': 'user'\}; .* \"content\": str or null"):
        to_rows([(1, {"prompt": [{"role": "user"}], "answer": "4"})], FieldMap(), source="f")


def test_stored_rows_of_earlier_runs_still_load():
    """A row stored before ``has_answer`` and whole messages: it had a reference and two-key messages."""
    from actions.tasks.dataset import parse_jsonl, rows_to_jsonl
    from actions.tasks.rewards import reward_inputs

    old = (b'{"answer": "7", "columns": {"level": 2}, "prompt": "<t>", "prompt_id": 3, '
           b'"source_answer": 7, "source_prompt": [{"content": "2+5?", "role": "user"}]}\n')
    row = parse_jsonl(old, source="old")[0]
    assert row.has_answer and row.source_prompt == [{"role": "user", "content": "2+5?"}]
    assert reward_inputs([row], ["7"])[2] == {"answer": [7], "level": [2]}
    assert parse_jsonl(rows_to_jsonl([row]), source="again") == [row]


def test_an_automatic_prompt_id_column_says_how_to_choose_another():
    rows = [(1, {"prompt_id": 7, "prompt": "p", "answer": "a"}), (2, {"prompt_id": 7, "prompt": "q", "answer": "b"})]
    with pytest.raises(ValueError, match=r"f:2: prompt_id 7 appears twice \(first at row 1\); the dataset's "
                                         r"'prompt_id' column is the id because data.id_key is unset: .* set "
                                         r"data.id_key to a column of unique values, or rename the column"):
        to_rows(rows, FieldMap(), source="f")
    with pytest.raises(ValueError, match=r"f:2: uid 'x' appears twice \(first at row 1\); make every uid unique"):
        to_rows([(n, {**r, "uid": "x"}) for n, r in rows], FieldMap(id_key="uid"), source="f")
    # The id column reaches the reward functions like any other column.
    mapped, _ = to_rows([(1, {"prompt_id": 7, "prompt": "p", "answer": "a"})], FieldMap(), source="f")
    assert mapped[0].columns == {"prompt_id": 7}


def test_parquet_files_of_no_rows_are_skipped_and_a_damaged_shard_is_named(tmp_path, capfd):
    """An empty Parquet file is valid (an empty shard of a split): skipped, and a dataset of
    nothing else has no rows, as an empty JSON Lines file. A shard damaged past its footer is
    named, with no log line of ``datasets`` before the error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("prompt", pa.string()), ("answer", pa.string())])
    pq.write_table(pa.Table.from_pylist([], schema=schema), tmp_path / "empty.parquet")
    fields = FieldMap()
    with pytest.raises(ValueError, match=r"^data.train_path e: no rows; add at least one row with 'prompt'"):
        to_rows(read_records(str(tmp_path / "empty.parquet"), field="data.train_path"), fields,
                source="data.train_path e")
    (tmp_path / "shards").mkdir()
    rows = [{"prompt": f"question {i} " + "x" * 40, "answer": str(i)} for i in range(20)]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "shards" / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist([], schema=schema), tmp_path / "shards" / "part-1.parquet")
    assert [r for _, r in read_records(str(tmp_path / "shards"), field="data.train_path")] == rows
    good = (tmp_path / "shards" / "part-0.parquet").read_bytes()
    (tmp_path / "shards" / "part-2.parquet").write_bytes(good[:10] + b"\xaa" * 190 + good[200:])  # pages, not footer
    with pytest.raises(ValueError, match=r"data.train_path '.*shards': part-2.parquet is not a readable Parquet file "
                                         r"\(OSError: .*\); write it again"):
        read_records(str(tmp_path / "shards"), field="data.train_path")
    assert "Failed to read file" not in "".join(capfd.readouterr())


def test_parquet_shards_that_disagree_are_named_with_the_column(tmp_path):
    """Shards that datasets would fail on or read wrongly (columns that differ; text in one and
    numbers in another, which would be read as text; untyped nulls first) are refused naming
    both shards and the column, and so are integers after floats (read as floats); what it
    reads right reads as before: whole floats after integers, a later shard's untyped nulls."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def shards(name: str, *tables: list[dict]) -> str:
        (tmp_path / name).mkdir()
        for i, rows in enumerate(tables):
            pq.write_table(pa.Table.from_pylist(rows), tmp_path / name / f"part-{i}.parquet")
        return str(tmp_path / name)

    def answers(folder: str, key: str = "answer") -> list:
        return [r.get(key) for _, r in read_records(folder, field="data.train_path")]

    extra = shards("extra", [{"prompt": "a", "answer": "1"}], [{"prompt": "b", "answer": "2", "level": 3}])
    with pytest.raises(ValueError, match=r"^data.train_path '.*extra': part-0.parquet has no column 'level', which "
                                         r"part-1.parquet has; write every shard with the same columns"):
        read_records(extra, field="data.train_path")
    kinds = shards("kinds", [{"prompt": "a", "answer": "1"}], [{"prompt": "b", "answer": 30}])
    with pytest.raises(ValueError, match=r"^data.train_path '.*kinds': column 'answer' holds integers in "
                                         r"part-1.parquet but text in part-0.parquet; write every shard with the "
                                         r"same type in 'answer'"):
        read_records(kinds, field="data.train_path")
    with pytest.raises(ValueError, match=r"^data.train_path '.*part-\*.parquet' is a pattern, which is not expanded; "
                                         r"name the folder that holds the files instead"):
        read_records(str(tmp_path / "kinds" / "part-*.parquet"), field="data.train_path")
    nulls = shards("nulls", [{"prompt": "a", "note": None}], [{"prompt": "b", "note": "x"}])
    with pytest.raises(ValueError, match=r"column 'note' holds text in part-1.parquet but only nulls \(no type\) in"):
        read_records(nulls, field="data.train_path")
    with pytest.raises(ValueError, match=r"column 'answer' holds integers in part-1.parquet but floating-point "
                                         r"numbers in part-0.parquet"):  # 2 would read as 2.0
        read_records(shards("widen", [{"prompt": "a", "answer": 0.5}], [{"prompt": "b", "answer": 2}]),
                     field="data.train_path")
    assert answers(shards("whole", [{"prompt": "a", "answer": 1}], [{"prompt": "b", "answer": 3.0}])) == [1, 3]
    with pytest.raises(ValueError, match=r"column 'answer' holds floating-point numbers in part-1.parquet, not all "
                                         r"whole \(ArrowInvalid: Float value 2.5.*\), but integers in part-0.parquet"):
        read_records(shards("cut", [{"prompt": "a", "answer": 1}], [{"prompt": "b", "answer": 2.5}]),
                     field="data.train_path")
    assert answers(shards("later", [{"prompt": "a", "note": "x"}], [{"prompt": "b", "note": None}]), "note") == [
        "x", None]
    for name, a, b, said in (("nested", [0.5], [2], "lists of integers in part-1.parquet but lists of floating"),
                             ("inner", {"x": 0.5}, {"x": 2}, "structs {x: integers} in part-1.parquet but structs")):
        with pytest.raises(ValueError, match=rf"column 'cases' holds {said}"):  # 2 would read as 2.0 inside too
            read_records(shards(name, [{"prompt": "a", "cases": a}], [{"prompt": "b", "cases": b}]),
                         field="data.train_path")
    assert answers(shards("nested_ok", [{"prompt": "a", "cases": [1]}], [{"prompt": "b", "cases": [2.0]}]),
                   "cases") == [[1], [2]]
    (tmp_path / "fine").mkdir()
    for i, width in enumerate((pa.int64(), pa.int32())):
        pq.write_table(pa.table({"prompt": ["a"], "answer": pa.array([i], width)}), tmp_path / "fine" / f"{i}.parquet")
    assert answers(str(tmp_path / "fine")) == [0, 1]


def test_text_that_is_not_utf8_in_parquet_or_a_saved_dataset_is_named_by_file_row_and_column(tmp_path):
    """Arrow reads a string column without checking its UTF-8: the first row that fails to
    decode is named (the file of a folder, the row in it, the column), with the fix."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    def table(prompts: list[bytes]) -> pa.Table:  # a string column holding the bytes unchecked
        text = pa.Array.from_buffers(pa.string(), len(prompts), pa.array(prompts, pa.binary()).buffers())
        return pa.table({"prompt": text, "answer": [str(i) for i in range(len(prompts))]})

    (tmp_path / "shards").mkdir()
    pq.write_table(table([b"a", b"b", b"c"]), tmp_path / "shards" / "part-0.parquet")
    pq.write_table(table([b"d", b"e\xff"]), tmp_path / "shards" / "part-1.parquet")
    with pytest.raises(ValueError, match=r"^data.train_path '.*shards': part-1.parquet row 2, column 'prompt' holds "
                                         r"text that is not UTF-8 \(byte 0xff\); write the file again with its text "
                                         r"as UTF-8$"):
        read_records(str(tmp_path / "shards"), field="data.train_path")
    datasets.Dataset(table([b"ok", b"\xfe!"])).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(ValueError, match=r"^data.eval_path '.*saved': row 2, column 'prompt' holds text that is not "
                                         r"UTF-8 \(byte 0xfe\); write the dataset again"):
        read_records(str(tmp_path / "saved"), field="data.eval_path")


def test_a_reference_answer_that_is_nan_or_infinite_is_refused_naming_the_row():
    need = ("reward.functions gsm8k compares with a reference answer", "or use rewards that need none")
    for value in (float("nan"), float("inf")):
        records = [(1, {"prompt": "p", "answer": 1.5}), (2, {"prompt": "q", "answer": value})]
        for fields, fix in ((FieldMap(answer_need=need), "or use rewards that need none"),
                            (FieldMap(), "or set data.answer_key: null")):
            with pytest.raises(ValueError, match=rf"^f:2: key 'answer' is {value!r}; a reference answer is a string or "
                                                 rf"a finite number: fix the row \(a missing answer is null\), {fix}"):
                to_rows(records, fields, source="f")


def test_a_jsonl_file_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"".join(json.dumps(r).encode() + b"\r\n" for r in GSM8K_ROWS))
    assert [r for _, r in read_records(str(path), field="data.train_path")] == GSM8K_ROWS
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(GSM8K_ROWS).encode())
    assert [r for _, r in read_records(str(tmp_path / "bom.json"), field="data.train_path")] == GSM8K_ROWS


def test_a_jsonl_string_may_hold_unicode_line_separators_and_line_numbers_count_newlines(tmp_path):
    """U+2028, U+2029 and U+0085 are valid inside a JSON string: only "\n" ends a row."""
    rows = [{"prompt": "one\u2028two\u2029three\x85four", "answer": "1"}, {"prompt": "p2", "answer": "2"}]
    path = tmp_path / "seps.jsonl"
    path.write_bytes(b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\r\n" for r in rows))
    assert read_records(str(path), field="data.train_path") == [(1, rows[0]), (2, rows[1])]
    path.write_bytes(path.read_bytes() + b"\n{bad\n")
    with pytest.raises(ValueError, match=r"seps.jsonl:4: not valid JSON"):
        read_records(str(path), field="data.train_path")


def test_a_jsonl_file_whose_rows_end_at_a_lone_carriage_return_reads_row_by_row(tmp_path):
    """Rows ended by "\r" alone (classic Mac OS line ends) are rows, numbered as such."""
    path = tmp_path / "cr.jsonl"
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\r" for r in GSM8K_ROWS[:2]))
    assert read_records(str(path), field="data.train_path") == [(1, GSM8K_ROWS[0]), (2, GSM8K_ROWS[1])]
    path.write_bytes(path.read_bytes() + b"{bad\r")
    with pytest.raises(ValueError, match=r"cr.jsonl:3: not valid JSON"):
        read_records(str(path), field="data.train_path")


def test_an_explicit_max_prompt_tokens_must_leave_room_for_the_response_in_the_context():
    """The default limit is the context less ``generation.max_new_tokens``; a value set above
    it would let a sample run past the position embeddings, and is refused naming both."""
    from actions.tasks.input_limits import prompt_token_limit

    def limit(*overrides: str) -> int | None:
        return prompt_token_limit(load_config(None, ["model.max_positions=128", "generation.max_new_tokens=24",
                                                     *overrides]).workload())

    assert limit("data.max_prompt_tokens=104") == 104 and limit() is None  # a generated task: no default limit
    with pytest.raises(ValueError, match=r"data.max_prompt_tokens=105 plus generation.max_new_tokens=24 is 129 tokens, "
                                         r"above the model's context of 128 \(model.max_positions\); lower "
                                         r"data.max_prompt_tokens to at most 104, or lower generation.max_new_tokens"):
        limit("data.max_prompt_tokens=105")
    # the vLLM engine set to hold less than the model's context: that is the context
    vllm = ("generation.engine=vllm", "generation.vllm.max_model_len=100", "data.train_path=x.jsonl")
    assert limit(*vllm) == 76
    with pytest.raises(ValueError, match=r"data.max_prompt_tokens=77 plus generation.max_new_tokens=24 is 101 tokens, "
                                         r"above generation.vllm.max_model_len=100; lower data.max_prompt_tokens to at "
                                         r"most 76"):
        limit(*vllm, "data.max_prompt_tokens=77")


def test_a_generated_tasks_prompts_must_leave_room_for_the_response_in_the_context():
    """A generated task's prompts have no length limit, but each with ``generation.max_new_tokens``
    must fit the context: the torch engine would decode past the position embeddings, the vLLM
    engine refuses the sample. The tiny model's tokenizer is loaded only where a prompt's
    characters (one token each at most) do not already fit."""
    from actions.models.modeling import build_char_tokenizer

    loads = []

    def tokenizer():
        loads.append(1)
        return build_char_tokenizer("")

    def build(*overrides: str):
        return build_datasets(load_config(None, ["data.num_train_prompts=16", "algorithm.batch_size=8",
                                                 "algorithm.group_size=4", *overrides]).workload(),
                              tokenizer, model_name="tiny")

    build()  # 256 positions: about 55-token prompts and 24 new tokens fit
    assert loads == []
    with pytest.raises(ValueError, match=r"^data.task repeat: prompt_id \d+ has (\d+) prompt tokens; with "
                                         r"generation.max_new_tokens=24 its samples need \d+, above the model's "
                                         r"context of 64 \(model.max_positions\); raise model.max_positions, lower "
                                         r"generation.max_new_tokens, or set data.max_prompt_tokens"):
        build("model.max_positions=64")
    assert loads
    with pytest.raises(ValueError, match=r"above generation.vllm.max_model_len=64; raise "
                                         r"generation.vllm.max_model_len"):
        build("generation.engine=vllm", "generation.vllm.max_model_len=64")


def test_a_generated_tasks_room_check_counts_the_bos_a_row_is_encoded_with():
    """Under chat_template: messages a row is encoded with the tokenizer's special tokens (a
    BOS): the check that its samples fit the context counts them, as the engine will."""
    from actions.tasks.dataset import PromptRow
    from actions.tasks.input_limits import check_prompt_room

    cfg = load_config(None, ["model.max_positions=20", "generation.max_new_tokens=10"]).workload()
    plain = PromptRow(prompt_id=1, prompt="x" * 10, answer="a")
    with_bos = plain.model_copy(update={"add_special_tokens": True})
    check_prompt_room(cfg, [plain], list, "data.task", num_special=1)  # 10 + 10 = 20 positions fit
    with pytest.raises(ValueError, match=r"prompt_id 1 has 11 prompt tokens; with generation.max_new_tokens=10 its "
                                         r"samples need 21, above the model's context of 20"):
        check_prompt_room(cfg, [with_bos], list, "data.task", num_special=1)
    with pytest.raises(ValueError, match="need 21"):  # the one-token-per-character shortcut counts it too
        check_prompt_room(cfg, [with_bos], list, "data.task", num_special=1, one_token_per_char=True)


def test_a_stored_dataset_parses_only_the_rows_an_action_reads():
    """StoredRows indexes the stored JSON Lines by prompt id and validates a row when first read:
    the same rows as a whole parse, in the same order; a damaged line is named."""
    from actions.tasks.dataset import PromptRow, parse_jsonl, rows_to_jsonl
    from actions.tasks.stored import StoredRows, rows_for

    rows, _ = to_rows([(i, {"prompt": f"q{i}", "answer": str(i), "level": i % 3}) for i in range(1, 6)], FieldMap(),
                      source="f")
    data = rows_to_jsonl(rows)
    stored = StoredRows(data, "runs/r/data/train")
    ids = [r.prompt_id for r in rows]

    def parsed() -> set[int]:
        return {p for p in ids if isinstance(stored._rows[p], PromptRow)}

    assert len(stored) == 5 and not parsed()  # nothing parsed yet
    assert rows_for(stored, ids[3:1:-1]) == [parse_jsonl(data, source="s")[i] for i in (3, 2)]
    assert parsed() == set(ids[2:4])  # the two read, only
    assert list(stored) == ids and list(stored.values()) == parse_jsonl(data, source="s")
    with pytest.raises(ValueError, match=r"prompt_ids \[7\] are not in the dataset"):
        rows_for(stored, [ids[0], 7])
    first = data.split(b"\n")[0]
    with pytest.raises(ValueError, match=r"^runs/r/data/train:2: not a stored dataset row .* damaged"):
        StoredRows(first + b"\n[1]\n", "runs/r/data/train")
    with pytest.raises(ValueError, match=rf"^runs/r/data/train:2: prompt_id {ids[0]} appears twice \(first at line "
                                         r"1\); the store's copy of the dataset is damaged"):
        StoredRows(first + b"\n" + first + b"\n", "runs/r/data/train")
    with pytest.raises(ValueError, match=r"^s:1: field 'prompt': field required; the store's copy"):
        StoredRows(b'{"prompt_id": 1, "answer": "a"}\n', "s")[1]
    # what json.dumps writes reads back, a lone surrogate's escape included (a column may hold one)
    odd, _ = to_rows([(1, {"prompt": "q", "answer": "a", "note": "x\ud800"})], FieldMap(), source="f")
    assert StoredRows(rows_to_jsonl(odd), "s")[odd[0].prompt_id].columns == {"note": "x\ud800"}


def test_the_summary_counts_the_eval_prompts_that_are_training_prompts():
    from flows.campaign.reporting import evaluation_line

    # the repeat task has 140 questions, which 512 training draws nearly exhaust: its eval set is
    # not held out, and the summary and the printed line say so; arith's eval draw is
    repeat = build_datasets(load_config(None, []), lambda: None, model_name="tiny")
    trained = {r.prompt for r in repeat.train}
    shared = sum(r.prompt in trained for r in repeat.evals)
    assert repeat.summary["eval"]["in_train"] == shared > len(repeat.evals) // 2
    arith = build_datasets(load_config(None, ["data.task=arith"]), lambda: None, model_name="tiny")
    assert arith.summary["eval"]["in_train"] == 0
    summary = {"evals": [{"num_prompts": 64}], "eval_accuracy_first": 0.28125, "eval_accuracy_last": 0.578125,
               "eval_reward_mean_first": 0.28125, "eval_reward_mean_last": None, "data": repeat.summary}
    assert evaluation_line(summary) == (f"eval accuracy 0.281 -> 0.578, mean reward 0.281 -> nan ({shared} of 64 "
                                        "eval prompts are training prompts)")
    summary["data"] = arith.summary
    assert evaluation_line(summary).endswith("-> nan")
    assert evaluation_line({"evals": []}) == "no evaluation (no data.eval_path nor data.eval_fraction)"
