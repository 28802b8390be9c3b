"""prepare action: put a campaign's inputs into the store (model, initial weights, data).

Builds the tiny default model from its config, or reads a local Hugging Face model directory,
and writes: the base artifact (config + tokenizer files), the initial weights, the train and
eval datasets, and a token table (prompt token ids and reference-answer lengths) that the
planner needs without loading a tokenizer. Everything is content-addressed, so preparing the
same configuration twice writes the same bytes.

It runs where the model files are: in the control-plane process for a local model directory.
"""

from __future__ import annotations

from pydantic import BaseModel

from actions.common.config import CampaignConfig
from actions.common.loading import DATASET_FILE, encode
from actions.common.modeling import (base_files, build_tiny_model, check_model_dir, instantiate, model_summary,
                                     read_model_dir)
from actions.common.storage import ObjectStore, put_artifact, put_json
from actions.common.weights import publish_tensors
from actions.tasks import get_task
from actions.tasks.dataset import PromptRow, load_jsonl, rows_to_jsonl


class Prepared(BaseModel):
    base_key: str
    init_key: str
    train_key: str
    eval_key: str
    tokens_key: str
    model: dict


def _datasets(cfg: CampaignConfig) -> tuple[list[PromptRow], list[PromptRow]]:
    task = get_task(cfg.data.task)
    train = (load_jsonl(cfg.data.train_path) if cfg.data.train_path else
             task.make_rows(cfg.data.num_train_prompts, max_count=cfg.data.max_count, seed=cfg.seed + 1))
    evals = (load_jsonl(cfg.data.eval_path) if cfg.data.eval_path else
             task.make_rows(cfg.data.num_eval_prompts, max_count=cfg.data.max_count, seed=cfg.seed + 2,
                            first_id=1_000_000))
    if len(train) < cfg.algorithm.prompts_per_step:
        raise ValueError(
            f"data has {len(train)} training prompts but a step needs algorithm.batch_size/group_size = "
            f"{cfg.algorithm.prompts_per_step}; add prompts or lower algorithm.batch_size"
        )
    return train, evals


def validate_inputs(cfg: CampaignConfig) -> None:
    """Check the model directory and datasets without writing anything (fails fast at the CLI)."""
    _datasets(cfg)
    if cfg.model.path:
        check_model_dir(cfg.model.path)


def prepare(cfg: CampaignConfig, store: ObjectStore, run_prefix: str) -> Prepared:
    """Validate inputs, then write them. Raises ValueError before writing anything."""
    train, evals = _datasets(cfg)
    if cfg.model.path:
        files, tensors = read_model_dir(cfg.model.path)
    else:
        m = cfg.model
        model, tokenizer = build_tiny_model(hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                                            intermediate_size=m.intermediate_size, max_positions=m.max_positions,
                                            seed=cfg.seed)
        files, tensors = base_files(model, tokenizer), model.state_dict()
    _, tokenizer = instantiate(files, tensors)  # the tokenizer exactly as actions will load it
    tokens = {str(r.prompt_id): {"prompt": list(encode(tokenizer, r.prompt)),
                                 "answer_len": len(encode(tokenizer, r.answer))} for r in train}
    base_key = f"{run_prefix}/base/manifest.json"
    put_artifact(store, base_key, files, {"summary": model_summary(files)})
    init = publish_tensors(store, f"{run_prefix}/init/manifest.json", tensors, {"source": cfg.model.path or "tiny"})
    train_key = f"{run_prefix}/data/train/manifest.json"
    eval_key = f"{run_prefix}/data/eval/manifest.json"
    put_artifact(store, train_key, {DATASET_FILE: rows_to_jsonl(train)})
    put_artifact(store, eval_key, {DATASET_FILE: rows_to_jsonl(evals)})
    tokens_key = f"{run_prefix}/data/tokens.json"
    put_json(store, tokens_key, tokens)
    return Prepared(base_key=base_key, init_key=init.manifest_key, train_key=train_key, eval_key=eval_key,
                    tokens_key=tokens_key, model=model_summary(files))
