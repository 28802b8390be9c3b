"""``rlhfless train --config FILE`` on user datasets with a Qwen2-shaped model folder.

Each test writes a tiny Qwen2 folder (byte-level BPE tokenizer, ``pad_token_id: null``, two
EOS ids, a ChatML template), a dataset in one of the supported formats and a YAML config, runs
the real CLI entry point for two RL steps (in-process invoker, so the session's Prefect
harness is reused) and checks the summary: steps done, the data summary, the chat template in
the stored prompts and finite rewards. ``docs/gsm8k.md``'s config is validated against the same
model shape.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from actions.store import get_artifact, open_store
from actions.tasks import arith
from flows.commands.cli import main
from flows.commands.tiny_model_dir import write_tiny_model_dir
from flows.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def _gsm8k_rows(n: int, seed: int) -> list[dict]:
    """GSM8K-format rows (``question``, ``answer`` ending ``#### N``), capitalised like GSM8K."""
    return [{"question": r["question"].capitalize(), "answer": r["answer"]}
            for r in arith.make_records(n, max_ops=2, seed=seed)]


def _config(tmp: Path, model: Path, data: dict, **extra: dict) -> Path:
    cfg = {
        "model": {"path": str(model)},
        "data": data,
        "reward": {"functions": [{"name": "gsm8k"}, {"name": "format", "weight": 0.1}]},
        "algorithm": {"batch_size": 8, "group_size": 4, "num_minibatches": 1},
        "generation": {"max_new_tokens": 12},
        "store": {"uri": str(tmp / "store")},
        "invoker": {"kind": "inprocess"},
        "steps": 2, "eval_every": 0, **extra,
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(tmp: Path, config: Path, capsys) -> tuple[dict, str]:
    """The summary and the progress output of a 2-step run."""
    rc = main(["train", "--config", str(config), "--out", str(tmp / "run")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "action-seconds" in out  # the in-process invoker bills action wall time, not GPU time
    summary = json.loads((tmp / "run" / "summary.json").read_text())
    assert summary["steps_completed"] == 2 and summary["policy_version"] == 2
    assert all(0.0 <= s["reward/mean"] <= 1.1 for s in summary["steps"])
    assert "billed action-seconds" in (tmp / "run" / "report.md").read_text()
    return summary, out


def _stored_prompts(config: Path, split: str = "train") -> list[dict]:
    cfg = load_config(str(config))
    store = open_store(cfg.store.uri)
    files, _ = get_artifact(store, f"runs/{cfg.resolved_run_id()}/data/{split}/manifest.json")
    return [json.loads(line) for line in files["rows.jsonl"].decode().splitlines()]


@pytest.fixture
def qwen2(tmp_path: Path) -> Path:
    info = write_tiny_model_dir(tmp_path / "qwen2", "qwen2")
    config = json.loads((info.path / "config.json").read_text())
    assert config["pad_token_id"] is None and len(info.eos_token_ids) == 2
    return info.path


def test_parquet_gsm8k_file(tmp_path, qwen2, prefect_harness, capsys):
    import datasets

    datasets.Dataset.from_list(_gsm8k_rows(16, seed=1)).to_parquet(str(tmp_path / "train.parquet"))
    datasets.Dataset.from_list(_gsm8k_rows(4, seed=2)).to_parquet(str(tmp_path / "test.parquet"))
    config = _config(tmp_path, qwen2, {"train_path": str(tmp_path / "train.parquet"),
                                      "eval_path": str(tmp_path / "test.parquet"), "prompt_key": "question",
                                      "system_prompt": "Solve it. End with #### and the number."},
                     warmup={"steps": 2, "batch_size": 4})  # warm-up on the reference solutions, asked for
    summary, _ = _train(tmp_path, config, capsys)
    assert summary["data"]["train"]["rows"] == 16 and summary["data"]["chat_template"] is True
    rows = _stored_prompts(config)
    assert rows[0]["prompt"].startswith("<|im_start|>system\nSolve it.")
    assert rows[0]["prompt"].endswith("<|im_start|>assistant\n") and rows[0]["answer"].split("#### ")[1].isdigit()


def test_jsonl_chat_message_prompts(tmp_path, qwen2, prefect_harness, capsys):
    def write(name: str, rows: list[dict]) -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps({"id": f"{name}-{i}", "messages": [
            {"role": "system", "content": "You are a careful solver."},
            {"role": "user", "content": r["question"]}], "solution": r["answer"], "level": i % 3})
            + "\n" for i, r in enumerate(rows)))
        return path

    config = _config(tmp_path, qwen2, {"train_path": str(write("train.jsonl", _gsm8k_rows(12, seed=3))),
                                      "eval_path": str(write("test.jsonl", _gsm8k_rows(4, seed=4))),
                                      "prompt_key": "messages", "answer_key": "solution", "id_key": "id",
                                      "max_prompt_tokens": 40, "long_prompts": "truncate_left"})
    summary, out = _train(tmp_path, config, capsys)
    rows = _stored_prompts(config)
    assert rows[0]["source_prompt"][0]["role"] == "system" and rows[0]["columns"]["level"] == 0
    assert rows[0]["prompt"].endswith("<|im_start|>assistant\n")
    cut = summary["data"]["train"]["truncated"]
    assert cut > 0 and summary["data"]["train"]["longest_prompt_tokens"] <= 40
    # the rows cut are said where the run is watched and in its report, not only in summary.json
    cut_evals = summary["data"]["eval"]["truncated"]
    line = (f"data: 12 training prompts (of 12 rows read: {cut} cut to the prompt limit "
            f"(data.long_prompts=truncate_left)); 4 eval prompts (of 4 rows read: {cut_evals} cut to the prompt "
            "limit (data.long_prompts=truncate_left))")
    assert line in out.splitlines(), out
    assert f"- {line}" in (tmp_path / "run" / "report.md").read_text()


def test_save_to_disk_folder(tmp_path, qwen2, prefect_harness, capsys):
    import datasets

    datasets.Dataset.from_list(_gsm8k_rows(12, seed=5)).save_to_disk(str(tmp_path / "train"))
    datasets.Dataset.from_list(_gsm8k_rows(4, seed=6)).save_to_disk(str(tmp_path / "test"))
    config = _config(tmp_path, qwen2, {"train_path": str(tmp_path / "train"), "eval_path": str(tmp_path / "test"),
                                      "prompt_key": "question", "chat_template": False})
    summary, _ = _train(tmp_path, config, capsys)
    rows = _stored_prompts(config, "eval")
    assert len(rows) == 4 and "<|im_start|>" not in rows[0]["prompt"]  # chat_template: false keeps the raw text


def test_gsm8k_walkthrough_config_validates_against_a_qwen2_folder(tmp_path, qwen2):
    """The YAML block of docs/gsm8k.md, with its model and data paths swapped for local ones."""
    import datasets

    from actions.prepare import validate_inputs

    text = (ROOT / "docs" / "gsm8k.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    raw = yaml.safe_load(block)
    assert raw["model"]["path"].endswith("Qwen2.5-0.5B-Instruct") and raw["data"]["train_path"].endswith(".parquet")
    train, test = tmp_path / "train-00000-of-00001.parquet", tmp_path / "test-00000-of-00001.parquet"
    big = [{"question": f"Q{i}: " + r["question"], "answer": r["answer"]} for i, r in enumerate(_gsm8k_rows(300, 7))]
    datasets.Dataset.from_list(big).to_parquet(str(train))
    datasets.Dataset.from_list(_gsm8k_rows(8, seed=8)).to_parquet(str(test))
    raw["model"]["path"], raw["data"]["train_path"], raw["data"]["eval_path"] = str(qwen2), str(train), str(test)
    # the stand-in states the context of the model the block names: its prompt and response limits fit that
    model_config = json.loads((qwen2 / "config.json").read_text())
    (qwen2 / "config.json").write_text(json.dumps({**model_config, "max_position_embeddings": 32768}))
    raw["store"]["uri"] = str(tmp_path / "store")
    path = tmp_path / "gsm8k.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(str(path))
    validate_inputs(cfg)  # datasets, chat template, prompt lengths, rewards, model folder
    assert cfg.warmup.steps == 0 and [f.name for f in cfg.reward_functions()][0] == "gsm8k"
    assert not (tmp_path / "store").exists()


def test_sft_shaped_chat_data_is_warned_about_on_the_progress_output(tmp_path, qwen2, prefect_harness, capsys):
    """Conversations that end with the assistant's reply train with the answer in the prompt:
    allowed, but the warning line is printed once, after the data line."""
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": r["question"]},
                                                     {"role": "assistant", "content": r["answer"]}],
                                        "solution": r["answer"]}) + "\n" for r in _gsm8k_rows(12, seed=5)))
    config = _config(tmp_path, qwen2, {"train_path": str(path), "prompt_key": "messages", "answer_key": "solution",
                                      "eval_fraction": 0.25})
    summary, out = _train(tmp_path, config, capsys)
    lines = out.splitlines()
    warned = [i for i, line in enumerate(lines) if line.startswith(f"warning: data.train_path {path}: 12 of its 12")]
    assert len(warned) == 1 and lines[warned[0] - 1].startswith("data: 9 training prompts"), out
    assert summary["data"]["warnings"] == [lines[warned[0]]]
