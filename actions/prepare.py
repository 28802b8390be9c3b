"""prepare action: put a campaign's inputs into the store (model, initial weights, data).

Builds the tiny default model from its config, or reads a local Hugging Face model directory,
and writes: the base artifact (config + tokenizer files), the initial weights, the train and
eval datasets, and a token table (prompt token ids and reference-answer lengths) that the
planner needs without loading a tokenizer. Everything is content-addressed, so preparing the
same configuration twice writes the same bytes.

It reads ``model.path`` and ``data.*_path`` where it runs, so the control plane runs it where
those files are (``flows/campaign/inputs.py``): on its pool, or in a child process of its own
when the actions run on a cluster. ``validate_inputs`` checks the same inputs at the CLI, before
anything is written, without torch for the tiny default model (transformers imports it to read
a ``model.path``'s tokenizer and config.json, and reward models' weights are checked against
their config.json there: a mismatch would otherwise surface in the first evaluation).
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actions.config.quoting import clip, quote, unusable_path
from actions.config.reward import reward_model_key
from actions.config.workload import WorkloadConfig
from actions.contracts import Prepared, PrepareRequest
from actions.models.hub import resolve_hub_ids
from actions.models.lora_targets import check_targets
from actions.runtime.adapter import run_action
from actions.store import ObjectStore, open_store, put_artifact, put_json
from actions.tasks import get_task
from actions.tasks.build import Datasets, build_datasets
from actions.tasks.chat import has_chat_prompts
from actions.tasks.dataset import DATASET_FILE, PromptRow, rows_to_jsonl
from actions.tasks.rewards.model_files import check_classifier, check_tokenizer, folder_files, load_tokenizer
from actions.tasks.source_digest import recorded_sources

# torch and transformers are imported inside prepare(): validate_inputs runs at the CLI and
# answers bad input in well under a second.


def _tokenizer_source(cfg: WorkloadConfig) -> Callable[[], Any]:
    """The tokenizer the actions will use, loaded on demand (once): from ``model.path``
    (checked first), or the tiny model's character tokenizer."""
    @functools.cache
    def load() -> Any:
        if cfg.model.path:
            validate_policy_dir(cfg.model.path)
            return load_tokenizer(cfg.model.path, "model.path")
        from actions.models.modeling import build_char_tokenizer

        return build_char_tokenizer(get_task(cfg.data.task).extra_chars)

    return load


def _datasets(cfg: WorkloadConfig, tokenizer: Callable[[], Any] | None = None, *, steps: int) -> Datasets:
    return build_datasets(cfg, tokenizer or _tokenizer_source(cfg), steps=steps,
                          model_name=f"model.path {cfg.model.path!r}" if cfg.model.path else "the tiny default model")


def validate_inputs(cfg: WorkloadConfig, *, steps: int = 1, resumed: bool = False) -> None:
    """Check the datasets, the reward functions (called as at step 0 of ``steps`` RL steps), the
    model directory (its files and its EOS token) and the reward models without writing
    anything (fails fast at the CLI). Hub ids are
    fetched into the local hub cache where downloads are allowed, and refused in one line where
    they are not (``actions/models/hub.py``). ``resumed``: the run exists, and its data, model
    and reward models are the copies stored (and checked) at its start, so their files and hub
    ids, perhaps moved or offline since, are not read again: only the reward functions, code
    the run calls at every step, are imported."""
    if resumed:
        from actions.tasks.rewards import load_reward

        for spec in cfg.reward_functions():
            load_reward(spec.name, spec.pattern)
        return
    cfg, _ = resolve_hub_ids(cfg)
    tokenizer = _tokenizer_source(cfg)
    data = _datasets(cfg, tokenizer, steps=steps)
    if cfg.model.path:
        validate_policy_dir(cfg.model.path)
        check_eos(cfg.model.path, tokenizer())
    check_targets(cfg)
    _validate_reward_models(cfg, data)


def _validate_reward_models(cfg: WorkloadConfig, data: Datasets) -> None:
    """Each reward model folder as the score action will load it: its files, a classifier with
    the label to score, weights of the shapes its config.json gives (the loader would refuse
    them only in the first evaluation, after the run was written) and its tokenizer."""
    if not cfg.reward.models:
        return
    # torch: only for runs with reward models (the control plane of the others never loads it)
    from actions.models.weight_shapes import check_weight_shapes

    chat = has_chat_prompts([*data.train, *data.evals])
    for i, m in enumerate(cfg.reward.models):
        validate_model_dir(m.path, field=f"reward.models[{i}].path")
        check_classifier(m.path, f"reward.models[{i}]", m.label)
        check_weight_shapes(m.path, f"reward.models[{i}].path", "AutoModelForSequenceClassification")
        check_tokenizer(m.path, f"reward.models[{i}]", m, chat)


def check_eos(path: str, tokenizer: Any) -> None:
    """Refuse a model folder that names no EOS token, found as the generate action finds it
    (``special_tokens_of_dir``: tokenizer, config.json, generation_config.json). Checked here,
    before the run is written: the actions read the stored copy, so a run prepared from such a
    folder would fail at every generate, even resumed after the folder is fixed.

    Raises:
        ValueError: one line naming ``model.path``, what was looked at and the fix.
    """
    from actions.models.special_tokens import special_tokens_of_dir

    try:
        special_tokens_of_dir(path, tokenizer)
    except ValueError as exc:
        raise ValueError(f"model.path {path!r}: {exc}") from None


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


_ADAPTER_CONFIGS = ("adapter_config.json", "adapter/adapter_config.json")
"""Where a folder holds a PEFT adapter: at its root (an adapter saved alone), or under
``adapter/`` (``rlhfless export`` of a ``model.lora`` run without ``--merge-lora``)."""


def validate_policy_dir(path: str) -> None:
    """``model.path``'s folder: :func:`validate_model_dir`, then a ``config.json`` that the
    installed transformers reads as a causal language model's (``check_causal_lm``: an
    encoder-decoder such as T5 is refused here, not by the loader inside ``prepare``). The
    second part imports transformers (and torch), which reading the folder's tokenizer next
    imports anyway.

    Raises:
        ValueError: one line naming ``model.path``, the value and the fix.
    """
    from actions.models.weight_shapes import check_causal_lm

    validate_model_dir(path)
    check_causal_lm(Path(path), "model.path")


def validate_model_dir(path: str, field: str = "model.path") -> None:
    """What ``from_pretrained`` needs, checked from file headers only (no torch, no tensor
    reads): the directory, for ``model.path`` no LoRA adapter (``_ADAPTER_CONFIGS``: the policy
    is read without it, so a run would silently start from the untrained backbone), a JSON
    config.json without ``auto_map`` (code of the model's own, which is never run: checked
    before anything hands the folder to transformers, which would offer to run it) unless its
    ``model_type`` is one transformers has built in (its own classes load it, every read
    passing ``trust_remote_code=False``, as older Phi-3 checkpoints load), tokenizer
    files, and weight files whose safetensors headers parse and whose sizes match them. Raises
    ValueError naming ``field``."""
    root = Path(path)
    where = f"{field} {quote(str(root))}"
    try:
        is_dir = root.is_dir()
    except OSError as exc:  # a name longer than the file system allows: not False on Python 3.11
        raise ValueError(unusable_path(field, str(root), exc)) from None
    if not is_dir:
        raise ValueError(f"{where} is not a directory; point it at a local Hugging Face model directory")
    adapter = next((name for name in _ADAPTER_CONFIGS if (root / name).is_file()), None)
    # before config.json: an adapter folder has none, and "no config.json" would hide why. The
    # policy's folder only: prepare reads its config.json and weights alone (read_model_dir)
    if adapter is not None and field == "model.path":
        raise ValueError(f"{where} holds a LoRA adapter ({adapter}), which training would ignore (it loads the "
                         "backbone alone); export the run with the adapter merged into the weights, `rlhfless export "
                         "RUN_ID --merge-lora --out DIR` (an adapter from elsewhere: PEFT's merge_and_unload, then "
                         f"save_pretrained), and set {field} to DIR")
    try:
        config = json.loads((root / "config.json").read_text())
    except FileNotFoundError:
        raise ValueError(f"{where} has no config.json; point it at a local Hugging Face model directory") from None
    except (OSError, ValueError):
        raise ValueError(f"{where}: config.json is not valid JSON; save the model again with save_pretrained") from None
    if not isinstance(config, dict):
        raise ValueError(f"{where}: config.json is not a JSON object; save the model again with save_pretrained")
    if config.get("auto_map") and not _built_in(config.get("model_type")):
        raise ValueError(_own_code(where, config))
    if not any((root / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        raise ValueError(f"{where} has no tokenizer files; save the tokenizer next to the model")
    found = [n for n in _WEIGHT_FILES if (root / n).is_file()]
    if not found:
        raise ValueError(f"{where} has no weights ({' or '.join(_WEIGHT_FILES[::2])}); save them with save_pretrained")
    for name in _weight_shards(root, found[0], where):
        if name.endswith(".safetensors"):
            _check_safetensors(root / name, where)
        elif (root / name).stat().st_size == 0:
            raise ValueError(f"{where}: weight file {name} is empty; save the model again with save_pretrained")


def _built_in(model_type: Any) -> bool:
    """Whether the installed transformers has ``model_type`` built in. Imports transformers'
    auto mapping (and torch, seconds): only a folder with an ``auto_map`` asks."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return isinstance(model_type, str) and model_type in CONFIG_MAPPING_NAMES


def _own_code(where: str, config: dict[str, Any]) -> str:
    """The refusal of a folder whose ``config.json`` maps transformers' auto classes to code of
    its own (``auto_map``): which, the model type, and the fix. Such code is never run (models
    that need ``trust_remote_code`` are not supported); where transformers has the model type
    built in, its own classes load the folder once the map is gone."""
    auto_map = config["auto_map"]
    listed = ", ".join(f"{k}: {v}" for k, v in auto_map.items()) if isinstance(auto_map, dict) else auto_map
    return (f"{where}: config.json has auto_map ({clip(listed)}), code of the model's own, which rlhfless never "
            "runs (models that need trust_remote_code are not supported), and its model_type "
            f"{quote(config.get('model_type'))} is not one the installed transformers has built in; use a "
            "checkpoint of a built-in model type, or a newer transformers that has this one")


def _weight_shards(root: Path, name: str, where: str) -> list[str]:
    if not name.endswith(".index.json"):
        return [name]
    try:
        shards = sorted(set(json.loads((root / name).read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"{where}: {name} is not a weight index (no weight_map); save the model again") from None
    missing = [s for s in shards if not (root / s).is_file()]
    if missing:
        raise ValueError(f"{where}: {name} lists missing shard(s) {', '.join(missing[:3])}; copy every shard")
    return shards


def _check_safetensors(file: Path, where: str) -> None:
    """The safetensors layout: an 8-byte little-endian header length, a JSON header whose
    data_offsets end exactly at the end of the file."""
    size = file.stat().st_size
    bad = f"{where}: weight file {file.name} is truncated or not safetensors; copy or save the model again"
    with file.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError(bad)
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, 100 * 2**20):
            raise ValueError(bad)
        try:
            header = json.loads(fh.read(length))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            raise ValueError(bad) from None
    if 8 + length + end != size:
        raise ValueError(bad)


def prepare(cfg: WorkloadConfig, store: ObjectStore, run_prefix: str, *, steps: int = 1) -> Prepared:
    """Validate inputs (the reward plug-ins called as at step 0 of ``steps`` RL steps), then
    write them. Raises ValueError before writing anything."""
    from actions.models.loading import encode, encode_prompt
    from actions.models.modeling import (
        base_files,
        build_tiny_model,
        instantiate,
        model_summary,
        read_model_dir,
        tied_head_keys,
    )
    from actions.models.special_tokens import special_tokens
    from actions.models.weight_shapes import check_weight_shapes
    from actions.rl.head import check_head
    from actions.store.weights import publish_tensors

    source = cfg.model.path or "tiny"
    typed = {"data.train_path": cfg.data.train_path, "data.eval_path": cfg.data.eval_path}
    cfg, fetched = resolve_hub_ids(cfg)  # the campaign's only network access, where allowed
    data = _datasets(cfg, steps=steps)
    if fetched:
        data.summary["hub"] = fetched
    if sources := recorded_sources(typed, fetched):  # what a resume compares the files with
        data.summary["sources"] = sources
    _validate_reward_models(cfg, data)
    train, evals = data.train, data.evals
    check_targets(cfg)
    if cfg.model.path:
        validate_policy_dir(cfg.model.path)
        # one line naming the tensor, rather than the loader's report; here, not at the CLI, where
        # building the model's classes would cost every run seconds to answer what this answers
        check_weight_shapes(cfg.model.path, "model.path", "AutoModelForCausalLM")
        files, tensors = read_model_dir(cfg.model.path)
    else:
        m = cfg.model
        model, tokenizer = build_tiny_model(hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                                            intermediate_size=m.intermediate_size, max_positions=m.max_positions,
                                            seed=cfg.seed, extra_chars=get_task(cfg.data.task).extra_chars)
        files, tensors = base_files(model, tokenizer), model.state_dict()
    built, tokenizer = instantiate(files, tensors)  # the tokenizer exactly as actions will load it
    tensors = {k: t for k, t in tensors.items() if k not in tied_head_keys(built)}  # as every version stores them
    check_head(built.config)  # a logit scale the learner cannot reproduce is refused before any write
    try:  # as the generate action will ask, before any write
        special = special_tokens(built, tokenizer)
    except ValueError as exc:
        raise ValueError(f"model.path {source!r}: {exc}") from None
    tokens = token_table(train, lambda text: encode(tokenizer, text), cfg.generation.max_new_tokens,
                         encode_row=lambda row: encode_prompt(tokenizer, row))
    if len(tokenizer) > (rows := built.get_input_embeddings().num_embeddings):  # ids the model may not embed
        check_vocab(source, rows, tokens, [list(encode_prompt(tokenizer, r)) for r in evals],
                    {"pad": [special.pad_id], "EOS": list(special.eos_ids)})
    base_key = f"{run_prefix}/base/manifest.json"
    put_artifact(store, base_key, files, {"summary": model_summary(files)})
    init = publish_tensors(store, f"{run_prefix}/init/manifest.json", tensors, {"source": source})
    train_key = f"{run_prefix}/data/train/manifest.json"
    eval_key = f"{run_prefix}/data/eval/manifest.json"
    put_artifact(store, train_key, {DATASET_FILE: rows_to_jsonl(train)})
    put_artifact(store, eval_key, {DATASET_FILE: rows_to_jsonl(evals)})
    tokens_key = f"{run_prefix}/data/tokens.json"
    put_json(store, tokens_key, tokens)
    for i, m in enumerate(cfg.reward.models):  # the actions read reward models from the store only
        put_artifact(store, reward_model_key(run_prefix, i), folder_files(m.path), {"source": m.path})
    return Prepared(base_key=base_key, init_key=init.manifest_key, train_key=train_key, eval_key=eval_key,
                    tokens_key=tokens_key, model=model_summary(files), data=data.summary)


def check_vocab(source: str, rows: int, tokens: dict[str, dict], eval_prompts: list[list[int]],
                special: dict[str, list[int]]) -> None:
    """Refuse a model whose input embedding (``rows`` = config.json ``vocab_size``) is smaller
    than the ids it would be fed: a train (``tokens``, the token table) or eval prompt's token,
    the pad id or an EOS id. Checked before any write: the first forward (the warm-up) would
    fail on it with an index error, after the run was written.

    Raises:
        ValueError: one line naming ``model.path``, the id and where it occurs, the size and the fix.
    """
    found = [(max(t["prompt"], default=-1), f"train prompt {pid}") for pid, t in tokens.items()]
    found += [(max(ids, default=-1), f"eval prompt {i}") for i, ids in enumerate(eval_prompts)]
    found += [(i, f"the {name} id") for name, ids in special.items() for i in ids]
    top, where = max(found, default=(-1, ""))
    if top >= rows:
        raise ValueError(f"model.path {source!r}: token id {top} ({where}) is beyond the model's {rows} embedding rows "
                         "(config.json vocab_size is smaller than the tokenizer); resize the embeddings to the "
                         "tokenizer (resize_token_embeddings(len(tokenizer)) in transformers) and save the model "
                         "again")


def token_table(rows: list[PromptRow], encode: Callable[[str], Any], max_new_tokens: int,
                encode_row: Callable[[PromptRow], Any] | None = None) -> dict[str, dict]:
    """The planner's token table (``contracts.PromptTokens`` by prompt id): each prompt's token
    ids (``encode_row``, as the actions encode it, ``loading.encode_prompt``; default: ``encode``
    of its text) and its first-epoch length prediction, the reference answer's length in tokens. A row
    without a reference gets ``max_new_tokens``, the same for every such prompt: the first step
    is planned for groups that run to the cap, and later prompts are predicted from the group
    lengths observed so far (with one reference length for all, its scale is their mean,
    ``flows/planning/lengths.py``)."""
    return {str(r.prompt_id): {"prompt": list(encode_row(r) if encode_row else encode(r.prompt)),
                               "answer_len": len(encode(r.answer)) if r.has_answer else max_new_tokens}
            for r in rows}


def run_prepare(req: PrepareRequest) -> Prepared:
    return prepare(req.workload, open_store(req.store_uri), req.run_prefix, steps=req.steps)


def main(args: dict) -> dict:
    return run_action(PrepareRequest, run_prepare, args)
