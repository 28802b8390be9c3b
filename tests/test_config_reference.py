"""``rlhfless config``: the reference of every key (``docs/config.md``) and the resolved
configuration a ``train`` with the same arguments would run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from actions.config.workload import AlgorithmConfig
from flows.commands.cli import main
from flows.commands.config_show import keys, reference, type_text
from flows.config import CampaignConfig, load_config

ROOT = Path(__file__).resolve().parents[1]


def _leaves(tree: dict, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k, v in tree.items():
        if isinstance(v, dict):
            out |= _leaves(v, f"{prefix}{k}.")
        else:
            out.add(f"{prefix}{k}")
    return out


def test_docs_config_is_the_reference():
    page = (ROOT / "docs" / "config.md").read_text()
    assert page == reference(), "docs/config.md is stale: run `rlhfless config --reference > docs/config.md`"


def test_every_key_is_listed_and_explained():
    listed = dict(keys(CampaignConfig))
    # every value a configuration holds is a row (sections that hold others are walked, not listed)
    assert _leaves(CampaignConfig().model_dump(mode="json")) <= set(listed)
    # and the keys of optional and repeated sections too
    assert {"model.lora.r", "model.lora.target_modules", "reward.functions[].name", "reward.models[].label",
            "generation.vllm.max_model_len"} <= set(listed)
    unexplained = [k for k, entry in listed.items() if not entry.description.strip()]
    assert not unexplained, f"config keys without a docstring (docs/config.md would show no meaning): {unexplained}"


def test_types_read_as_values():
    from typing import Annotated, Literal

    from pydantic import Field

    assert type_text(Literal["a", "b"] | None) == '"a" \\| "b" or null'
    assert type_text(Annotated[int, Field(gt=0)]) == "int"
    assert type_text(list[str]) == "list of str"
    rows = dict(keys(CampaignConfig))
    assert type_text(rows["reward.functions"].annotation) == "list of mapping or null"


def test_config_prints_what_train_would_run(capsys):
    assert main(["config", "--set", "steps=3", "--set", "algorithm.name=ppo"]) == 0
    out = capsys.readouterr().out
    expected = load_config(None, ["steps=3", "algorithm.name=ppo"])
    assert f"# run_id derived from this configuration: {expected.resolved_run_id()}" in out.splitlines()[0]
    printed = yaml.safe_load(out)
    assert printed["steps"] == 3 and printed["algorithm"]["kl_kind"] == "k1"  # resolved, not as typed
    # the printed configuration, given back, is the same run
    assert CampaignConfig.model_validate(printed).resolved_run_id() == expected.resolved_run_id()
    # every setting, those a dump leaves out at their defaults included, in field order
    assert list(printed["algorithm"]) == list(AlgorithmConfig.model_fields)
    assert (printed["algorithm"]["loss_agg"], printed["algorithm"]["mask_truncated"]) == ("token_mean", False)


def test_automatic_values_are_named_so_a_template_drops_them(capsys, tmp_path):
    """``warmup.steps`` is 300 for the generated task and 0 for a dataset: the printed file runs
    the same, and says which values it chose itself."""
    assert main(["config", "--set", "algorithm.name=ppo", "--set", "data.max_count=5"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("# resolved automatically"))
    named = line.split(": ", 1)[1].split(";")[0].split(", ")
    assert {"warmup.steps", "algorithm.kl_kind", "warmup.error_rate"} <= set(named)
    assert "data.max_count" not in named  # set by the user
    assert yaml.safe_load(out)["algorithm"]["kl_kind"] == "k1"
    saved = tmp_path / "c.yaml"
    saved.write_text(out)
    again = load_config(str(saved))
    assert again.resolved_run_id() == load_config(None, ["algorithm.name=ppo", "data.max_count=5"]).resolved_run_id()


def test_a_dataset_configuration_given_back_runs_the_same(capsys, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "say a", "answer": "a"}\n')
    args = ["data.train_path=" + str(data), "algorithm.name=ppo"]
    assert main(["config", *[w for a in args for w in ("--set", a)]]) == 0
    saved = tmp_path / "c.yaml"
    saved.write_text(capsys.readouterr().out)
    assert "num_train_prompts" not in saved.read_text()  # refused beside a dataset file
    assert load_config(str(saved)).resolved_run_id() == load_config(None, args).resolved_run_id()


def test_an_explicit_null_is_named_as_resolved_too(capsys):
    assert main(["config", "--set", "algorithm.kl_kind=null", "--set", "warmup.steps=null"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("# resolved automatically"))
    assert "algorithm.kl_kind" in line and "warmup.steps" in line


@pytest.mark.parametrize("words", [["config"], ["--version"], ["simulate", "--help"]])
def test_a_closed_pipe_ends_the_output_quietly(words):
    """``rlhfless config | head``: the reader is gone before the first line is written (written
    by the command, flushed by ``main``, or by argparse's --help, which exits)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout block-buffered, as in a shell
    proc = subprocess.Popen([sys.executable, "-m", "flows.commands.cli", *words], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    proc.stdout.close()  # closed while the command still imports: its first write meets no reader
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert "Broken pipe" not in err and "Traceback" not in err and "Exception ignored" not in err, err


def test_a_broken_pipe_that_is_not_stdout_s_stays_an_error(capsys):
    """A connection's broken pipe (stdout is no pipe without a reader) is reported, never a quiet 141."""
    from flows.commands.closed_pipe import closed_or

    assert closed_or(BrokenPipeError(), lambda exc: 7) == 7


@pytest.mark.parametrize("words", [["--version"], ["config"], ["nosuchcommand"]])
def test_a_command_started_with_stdout_closed_ends_as_it_would_otherwise(words):
    """``rlhfless ... >&-``: Python's stdout is None; the command's status is its own (a usage
    error's 2), with no traceback about flushing it."""
    proc = subprocess.run(["bash", "-c", 'exec "$0" -m flows.commands.cli "$@" >&-', sys.executable, *words],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == (2 if words == ["nosuchcommand"] else 0), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("setting, words", [("algorithm.lr=-1", "greater than 0"),
                                            ("algorithm.clip_low=1", "less than 1")])  # a ratio clipped at 0
def test_config_refuses_bad_input_in_one_line(capsys, setting, words):
    assert main(["config", "--set", setting]) == 2
    err = capsys.readouterr().err
    key = setting.split("=")[0]
    assert err.startswith("rlhfless: error: ") and key in err and words in err and "Traceback" not in err
    assert main(["config", "--reference", "--set", "steps=3"]) == 2
    assert "drop --config and --set" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["model.lora.r", "store.uri", "steps"])
def test_reference_rows_carry_type_default_and_meaning(key):
    row = next(line for line in reference().splitlines() if line.startswith(f"| `{key}` |"))
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert len(cells) == 4 and all(cells), row


def test_the_data_path_rows_name_every_form_the_reader_takes(tmp_path):
    """``data.train_path`` reads a .json array and a folder of .parquet files besides .jsonl and
    .parquet files, and takes a hub id: its reference row names each, and ``data.eval_path``'s
    takes the same forms."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from actions.models.hub import HUB_ID
    from actions.tasks.sources import read_records

    (tmp_path / "rows.json").write_text(json.dumps([{"prompt": "q1", "answer": "1"}, {"prompt": "q2", "answer": "2"}]))
    (tmp_path / "shards").mkdir()
    for i in range(2):
        pq.write_table(pa.table({"prompt": [f"q{i}"], "answer": [str(i)]}), tmp_path / "shards" / f"part-{i}.parquet")
    for form in ("rows.json", "shards"):
        for field in ("data.train_path", "data.eval_path"):
            assert len(read_records(str(tmp_path / form), field=field)) == 2
    assert HUB_ID.match("openai/gsm8k/main")
    listed = dict(keys(CampaignConfig))
    train = listed["data.train_path"].description
    for form in (".jsonl", ".parquet file", ".json file (JSON Lines or one array of objects)",
                 "folder of .parquet files", "save_to_disk", "hub id (``owner/name[/subset]``)"):
        assert form in train, form
    assert "any form ``train_path`` takes" in listed["data.eval_path"].description
