"""Hub ids in model.path and data.*_path, and the optional eval set.

Nothing here downloads: the hub library's ``snapshot_download`` is replaced by a local
"hub" (folders named like repositories) that honours ``allow_patterns`` as the real one does,
so everything after the download (which files are asked for, which split is read, what lands
in the store, what the summary says) runs for real. Offline refusals go through the real CLI
in tests/test_bad_input_battery.py.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

import pytest
import yaml

from actions.models.hub import hub_allowed, parse_hub_id, resolve_hub_ids
from actions.store import LocalStore, get_artifact
from actions.tasks.build import build_datasets, hold_out
from flows.commands.tiny_model_dir import write_tiny_model_dir
from flows.config import load_config


def _rows(n: int, start: int = 0) -> list[dict]:
    return [{"prompt_id": i, "question": f"write c {i % 5 + 1} times", "answer": "c" * (i % 5 + 1)}
            for i in range(start, start + n)]


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A local hub with ``tiny/qwen2`` (a model) and ``tiny/gsm8k`` (a dataset with subsets
    ``main`` and ``socratic``, Parquet files per split). Returns the list of calls."""
    import datasets
    import huggingface_hub

    hub = tmp_path / "hub"
    write_tiny_model_dir(hub / "model" / "tiny/qwen2", "qwen2")
    for subset in ("main", "socratic"):
        folder = hub / "dataset" / "tiny/gsm8k" / subset
        folder.mkdir(parents=True)
        datasets.Dataset.from_list(_rows(16)).to_parquet(str(folder / "train-00000-of-00001.parquet"))
        datasets.Dataset.from_list(_rows(4, 100)).to_parquet(str(folder / "test-00000-of-00001.parquet"))
    (hub / "dataset" / "tiny/gsm8k" / "README.md").write_text("not data")
    calls: list[dict] = []

    def snapshot_download(repo_id: str, *, repo_type: str | None = None, allow_patterns=None, **_: object) -> str:
        calls.append({"repo_id": repo_id, "repo_type": repo_type, "allow_patterns": allow_patterns})
        source = hub / (repo_type or "model") / repo_id
        if not source.is_dir():
            import httpx

            url = f"https://huggingface.co/api/{repo_type}s/{repo_id}"
            raise huggingface_hub.errors.RepositoryNotFoundError(
                f"404 Client Error: Repository Not Found for url: {url}",
                response=httpx.Response(404, request=httpx.Request("GET", url)))
        snapshot = tmp_path / "cache" / (repo_type or "model") / repo_id
        for f in source.rglob("*"):
            rel = f.relative_to(source).as_posix()
            if f.is_file() and (allow_patterns is None or any(fnmatch.fnmatch(rel, p) for p in allow_patterns)):
                (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, snapshot / rel)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    return {"calls": calls}


def test_what_reads_as_a_hub_id(tmp_path: Path):
    (tmp_path / "org").mkdir()
    assert parse_hub_id("Qwen/Qwen2.5-0.5B-Instruct", model=True) == ("Qwen/Qwen2.5-0.5B-Instruct", None)
    assert parse_hub_id("openai/gsm8k/main", model=False) == ("openai/gsm8k", "main")
    assert parse_hub_id("openai/gsm8k/main", model=True) is None  # a model is a repository, no folder
    for local in ("./data/x", "/abs/path", "~/x", "data/train.jsonl", "plain", str(tmp_path / "org")):
        assert parse_hub_id(local, model=False) is None, local


@pytest.mark.parametrize("value, allowed", [(None, True), ("0", True), ("false", True), ("1", False), ("ON", False)])
def test_downloads_follow_hf_hub_offline(value, allowed, monkeypatch):
    if value is None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert hub_allowed() is allowed


def test_offline_hub_id_is_one_line_naming_the_variable(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config(None, ["model.path=Qwen/Qwen2.5-0.5B-Instruct"]).workload()
    with pytest.raises(ValueError, match=r"model.path 'Qwen/Qwen2.5-0.5B-Instruct' .* set HF_HUB_OFFLINE=0") as exc:
        resolve_hub_ids(cfg)
    assert "\n" not in str(exc.value)


def test_hub_ids_resolve_to_the_split_files(fake_hub):
    cfg = load_config(None, ["model.path=tiny/qwen2", "data.train_path=tiny/gsm8k/main",
                             "data.eval_path=tiny/gsm8k/main", "data.prompt_key=question"]).workload()
    local, fetched = resolve_hub_ids(cfg)
    assert fetched == {"model.path": "tiny/qwen2", "data.train_path": "tiny/gsm8k/main",
                       "data.eval_path": "tiny/gsm8k/main"}
    assert (Path(local.model.path) / "config.json").is_file()
    assert Path(local.data.train_path).name.startswith("train-") and Path(local.data.eval_path).name.startswith("test-")
    assert cfg.model.path == "tiny/qwen2"  # the configuration keeps the id (the run's identity)
    model_call = fake_hub["calls"][0]
    assert model_call["repo_type"] == "model" and "*.safetensors" in model_call["allow_patterns"]
    assert all(c["repo_type"] == "dataset" and all(p.startswith("main/") for p in c["allow_patterns"])
               for c in fake_hub["calls"][1:])


def test_a_local_copy_reads_as_the_hub_id(fake_hub, tmp_path: Path):
    """``hf download --local-dir`` of a dataset: the folder of a subset, given as a local path,
    gives each setting the split the hub id gives it (the rule is one function, hub.py's)."""
    from actions.models.modeling import build_char_tokenizer

    def rows(train: str, evals: str) -> tuple[list, list]:
        cfg = load_config(None, [f"data.train_path={train}", f"data.eval_path={evals}", "data.prompt_key=question",
                                 "algorithm.batch_size=8", "algorithm.group_size=4"]).workload()
        data = build_datasets(resolve_hub_ids(cfg)[0], lambda: build_char_tokenizer(""), model_name="tiny")
        return [r.prompt_id for r in data.train], [r.prompt_id for r in data.evals]

    local = tmp_path / "hub" / "dataset" / "tiny/gsm8k" / "main"
    hub_train, hub_eval = rows("tiny/gsm8k/main", "tiny/gsm8k/main")
    assert (len(hub_train), len(hub_eval)) == (16, 4) and rows(str(local), str(local)) == (hub_train, hub_eval)


def test_ambiguous_or_missing_hub_data_is_one_line(fake_hub):
    cfg = load_config(None, ["data.train_path=tiny/gsm8k", "data.eval_path=tiny/gsm8k/main"]).workload()
    with pytest.raises(ValueError, match=r"split 'train' in several folders \(main, socratic\); name one, e\.g\. "
                                         r"tiny/gsm8k/main"):
        resolve_hub_ids(cfg)
    cfg = load_config(None, ["model.path=tiny/absent"]).workload()
    with pytest.raises(ValueError, match=r"model.path 'tiny/absent': the model cannot be fetched .*RepositoryNotFound"):
        resolve_hub_ids(cfg)


def test_prepare_puts_hub_inputs_into_the_store(fake_hub, tmp_path: Path):
    from actions.prepare import prepare

    cfg = load_config(None, ["model.path=tiny/qwen2", "data.train_path=tiny/gsm8k/main", "data.eval_fraction=0.25",
                             "data.prompt_key=question", "algorithm.batch_size=8", "algorithm.group_size=4"])
    store = LocalStore(tmp_path / "store")
    prepared = prepare(cfg.workload(), store, "runs/r")
    assert prepared.data["hub"] == {"model.path": "tiny/qwen2", "data.train_path": "tiny/gsm8k/main"}
    assert prepared.data["evaluation"] == "held_out 0.25 of train_path"
    assert prepared.data["train"]["rows"] == 12 and prepared.data["eval"]["rows"] == 4
    files, meta = get_artifact(store, prepared.base_key)
    assert "config.json" in files and "tokenizer.json" in files
    assert json.loads(store.get(prepared.init_key))["meta"]["source"] == "tiny/qwen2"


def test_hold_out_and_evaluate_nothing(tmp_path: Path):
    from actions.models.modeling import build_char_tokenizer

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({**r, "prompt": r["question"]}) + "\n" for r in _rows(40)))
    tok = lambda: build_char_tokenizer("")  # noqa: E731
    held = build_datasets(load_config(None, [f"data.train_path={train}", "data.eval_fraction=0.1"]).workload(), tok,
                          model_name="tiny")
    assert (len(held.train), len(held.evals)) == (36, 4) and held.summary["evaluation"] == "held_out 0.1 of train_path"
    assert not {r.prompt_id for r in held.train} & {r.prompt_id for r in held.evals}
    again = build_datasets(load_config(None, [f"data.train_path={train}", "data.eval_fraction=0.1"]).workload(), tok,
                           model_name="tiny")
    assert [r.prompt_id for r in again.evals] == [r.prompt_id for r in held.evals]  # the seed decides
    none = build_datasets(load_config(None, [f"data.train_path={train}"]).workload(), tok, model_name="tiny")
    assert len(none.train) == 40 and none.evals == [] and none.summary["evaluation"] == "none"
    assert hold_out(held.train, 0.5, seed=1)[1] != hold_out(held.train, 0.5, seed=2)[1]


@pytest.mark.parametrize("overrides, needle", [
    (["data.eval_fraction=0.1"], "the generated task has its own eval set"),
    (["data.train_path=a.jsonl", "data.eval_path=b.jsonl", "data.eval_fraction=0.1"], "data.eval_path is set"),
    (["data.train_path=a.jsonl", "data.eval_fraction=1.5"], "data.eval_fraction"),
])
def test_eval_fraction_needs_train_path_alone(overrides, needle):
    with pytest.raises(ValueError, match=needle):
        load_config(None, overrides)


def test_campaign_from_hub_ids_without_an_eval_set(fake_hub, tmp_path: Path, prefect_harness):
    # no capsys: Prefect's console handler keeps the stream of the test that first logs a flow
    # run, and capsys closes its stream when its test ends
    from flows.commands.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"path": "tiny/qwen2"}, "data": {"train_path": "tiny/gsm8k/main", "prompt_key": "question"},
        "reward": {"functions": [{"name": "exact_match"}]},
        "algorithm": {"batch_size": 8, "group_size": 4}, "generation": {"max_new_tokens": 6},
        "store": {"uri": str(tmp_path / "store")}, "invoker": {"kind": "inprocess"}, "steps": 2, "eval_every": 1}))
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps_completed"] == 2 and summary["evals"] == [] and summary["eval_accuracy_last"] is None
    assert summary["data"]["evaluation"] == "none" and summary["data"]["hub"]["model.path"] == "tiny/qwen2"
    assert not any("evals/" in str(p) for p in (tmp_path / "store").rglob("*"))


def test_split_folders_win_over_shard_names_and_data_shards_declare_no_split(tmp_path):
    """``train/data-00000-of-00001.parquet`` (a hub snapshot's layout) is the train split, and a
    local folder of ``data-0000X-of-00002.parquet`` shards (``datasets``' name for the shards of
    one split) is one dataset, read whole."""
    from actions.models.hub import files_by_split
    from actions.tasks.sources import read_records

    nested = [tmp_path / "snap" / s / "data-00000-of-00001.parquet" for s in ("train", "test")]
    assert files_by_split(nested, by_folder=True) == {"train": [nested[0]], "test": [nested[1]]}
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    folder = tmp_path / "shards"
    folder.mkdir()
    for i in range(2):
        pq.write_table(pa.table({"prompt": [f"q{i}"], "answer": ["a"]}), folder / f"data-0000{i}-of-00002.parquet")
    assert sorted(r["prompt"] for _, r in read_records(str(folder), field="data.train_path")) == ["q0", "q1"]


def test_a_path_too_long_to_look_up_is_refused_naming_its_setting(tmp_path):
    """``stat`` of a name over 255 bytes raises ENAMETOOLONG, which pathlib passes on: each
    setting that is looked up as a path answers in one line naming itself, the value (cut) and
    the fix; a store beneath missing folders is refused before any of them is made."""
    from actions.store import LocalStore
    from actions.tasks.sources import read_records

    name = "x" * 300
    line = r" '.*\.\.\. is too long a path: a name in it is 300 bytes, more than a file system allows \(\d+\); "
    with pytest.raises(ValueError, match="^model.path" + line + "shorten model.path$"):
        parse_hub_id(str(tmp_path / name), model=True, field="model.path")
    with pytest.raises(ValueError, match="^data.eval_path" + line + "shorten data.eval_path$"):
        read_records(str(tmp_path / name), field="data.eval_path")
    with pytest.raises(ValueError, match="^store.uri" + line + "shorten store.uri$") as exc:
        LocalStore(tmp_path / "store" / name)
    assert len(str(exc.value)) < 250 and not (tmp_path / "store").exists()


def test_a_split_in_upper_case_parquet_and_beside_json_lines_reads_its_parquet_shards(tmp_path: Path):
    """A snapshot's split given as ``.PARQUET`` shards (any case) and again as JSON Lines: the
    split is the Parquet shards, each read once, not a folder of mixed formats refused."""
    import datasets

    from actions.models.hub import _split_files
    from actions.tasks.sources import read_records

    root = tmp_path / "snapshot"
    root.mkdir()
    datasets.Dataset.from_list(_rows(3)).to_parquet(str(root / "train-00000-of-00002.PARQUET"))
    datasets.Dataset.from_list(_rows(2, 3)).to_parquet(str(root / "train-00001-of-00002.parquet"))
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(5)))
    split = _split_files(root, None, "train", "data.train_path", "tiny/mixed")
    assert sorted(p.name.lower() for p in split.iterdir()) == ["train-00000-of-00002.parquet",
                                                             "train-00001-of-00002.parquet"]
    assert sorted(rec["prompt_id"] for _, rec in read_records(str(split), field="data.train_path")) == list(range(5))
