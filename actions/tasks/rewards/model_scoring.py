"""Reward models: an ``AutoModelForSequenceClassification`` scores each (prompt, completion).

The text a reward model reads follows TRL's ``GRPOTrainer``: a chat prompt (a list of messages)
plus the completion as the assistant's turn goes through the reward tokenizer's chat template;
a string prompt is joined to the completion. ``chat_template: true`` templates string prompts
too (as the user's turn), ``false`` never templates (a chat prompt's contents are joined).
Inputs are tokenized without special tokens (TRL's ``add_special_tokens=False``), right-padded,
and cut to ``max_length`` tokens from the left (never more than the model takes: the tokenizer's
``model_max_length``, 512 for BERT, and its position embeddings, ``model_files.position_limit``),
so a long prompt loses its beginning and the completion, which the model scores, is kept whole
where it fits (TRL cuts nothing: a text beyond the model's positions fails there). Each cut row is
counted: ``truncated_metric``. They are scored ``batch_size`` at a time on the action's device, and
the logit of ``label`` is the score (of a one-label model, its only logit: TRL's
``logits[:, 0]``). A
tokenizer without a pad token pads with its EOS token (the model's pooling then reads the last
token that is not padding).

Each model is loaded once per warm container (``actions/models/warm.py``), keyed by its
manifest, device and dtype: ``prepare`` stored it, so nothing here reads the user's disk or the
network.
"""

from __future__ import annotations

import math
import posixpath
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

import torch

from actions.config.quoting import quote
from actions.contracts import RewardModelRef
from actions.models import warm
from actions.models.device import action_device, action_dtype
from actions.store import get_artifact, open_store
from actions.store.safe_paths import write_beneath
from actions.tasks.rewards import RewardModelError
from actions.tasks.rewards.model_files import UNSET_MAX_LENGTH, input_limit, label_index, position_limit


def load_reward_model(ref: RewardModelRef, store_uri: str, device: torch.device) -> tuple[Any, Any]:
    """(model in eval mode on ``device``, tokenizer) of a stored reward model, cached while warm."""
    dtype = action_dtype("auto", device)

    def build() -> tuple[Any, Any]:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        files, _ = get_artifact(open_store(store_uri), ref.manifest_key)
        with tempfile.TemporaryDirectory() as tmp:
            for name, data in files.items():  # names come from a checked manifest: never outside tmp
                write_beneath(tmp, name, bytes(data), where="reward model")
            tokenizer = AutoTokenizer.from_pretrained(tmp, trust_remote_code=False)
            model = AutoModelForSequenceClassification.from_pretrained(tmp, dtype=dtype, trust_remote_code=False)
        # the positions before pad_token_id is set below: RoBERTa's offset is config.json's pad id
        positions = position_limit(model.config)
        if positions is not None and (tokenizer.model_max_length or UNSET_MAX_LENGTH) > positions:
            tokenizer.model_max_length = positions  # what input_limit caps by (this tokenizer is the model's own)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id  # the pooling finds each row's last real token by it
        return model.to(device).eval(), tokenizer

    key = ("reward_model", store_uri, ref.manifest_key, str(device), str(dtype))
    return warm.get_or_build(key, build)[0]


def reward_texts(tokenizer: Any, chat_template: str | bool, prompts: Sequence[Any], completions: Sequence[Any]
                 ) -> list[str]:
    """What the reward model reads for each (prompt, completion), in TRL's formats (see the module doc)."""
    texts = []
    for p, c in zip(prompts, completions):
        content = c[0]["content"] if isinstance(c, list) else c
        chat = isinstance(p, list)
        templated = chat_template is True or (chat_template == "auto" and chat)
        if templated:
            messages = (p if chat else [{"role": "user", "content": p}]) + [{"role": "assistant", "content": content}]
            texts.append(tokenizer.apply_chat_template(messages, tokenize=False))
        else:
            texts.append(("".join(m["content"] or "" for m in p) if chat else p) + content)  # null: a tool call
    return texts


@torch.no_grad()
def score_with_models(refs: Sequence[RewardModelRef], store_uri: str, prompts: Sequence[Any],
                      completions: Sequence[Any], device: torch.device | None = None,
                      prompt_ids: Sequence[Any] | None = None, truncated: dict[str, list[float]] | None = None,
                      ) -> dict[str, tuple[float, list[float]]]:
    """Each reward model's (weight, one score per completion), by ``ref.name``; every score finite.

    Args:
        prompts, completions: TRL's formats (``rewards.reward_inputs``).
        device: where the models run (default: the action's device).
        prompt_ids: each completion's prompt id, for the error (default: its row index).
        truncated: receives, per model, one value per completion under ``truncated_metric``:
            1.0 where its text was cut to the model's input limit, else 0.0.
    Raises:
        RewardModelError: a score is NaN or infinite (``check_scores``).
    """
    device = device if device is not None else action_device()
    out = {}
    for ref in refs:
        model, tokenizer = load_reward_model(ref, store_uri, device)
        texts = reward_texts(tokenizer, ref.settings.chat_template, prompts, completions)
        scores: list[float] = []
        size, limit = ref.settings.batch_size, input_limit(ref.settings.max_length, tokenizer)
        column = label_index(model.config.id2label, ref.settings.label, f"reward.models[{ref.index}]",
                             ref.settings.path)  # prepare checked it against the same config
        cut: list[float] = []
        for start in range(0, len(texts), size):
            batch, was_cut = _left_cut_batch(tokenizer, texts[start:start + size], limit)
            cut.extend(was_cut)
            logits = model(**{k: v.to(device) for k, v in batch.items()}).logits
            scores.extend(float(x) for x in logits[:, column].float().cpu())
        check_scores(ref, model, scores, prompt_ids)
        if truncated is not None:
            truncated[truncated_metric(ref)] = cut
        out[ref.name] = (ref.settings.weight, scores)
    return out


def _left_cut_batch(tokenizer: Any, texts: Sequence[str], limit: int | None) -> tuple[Any, list[float]]:
    """(the right-padded batch of ``texts``, each its last ``limit`` tokens; per text 1.0 where
    that cut it, else 0.0). Cut by hand rather than by the tokenizer's ``truncation_side``: the
    texts carry no special tokens to keep (``add_special_tokens=False``), and the whole length,
    which the count needs, is read in the same pass."""
    ids = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
    was_cut = [float(limit is not None and len(row) > limit) for row in ids]
    kept = [row[-limit:] if limit is not None else row for row in ids]
    return tokenizer.pad({"input_ids": kept}, padding=True, padding_side="right", return_tensors="pt"), was_cut


def truncated_metric(ref: RewardModelRef) -> str:
    """The name a reward model's cut inputs are counted under in the rewards' logged metrics:
    ``reward_model/<index>/truncated_frac``; a step reports their mean, the share of its
    completions the model read without the beginning of their text, as
    ``reward_fn/reward_model/<index>/truncated_frac`` (``flows/step/metrics.py``)."""
    return f"{ref.name}/truncated_frac"


def check_scores(ref: RewardModelRef, model: Any, scores: Sequence[float], prompt_ids: Sequence[Any] | None) -> None:
    """Refuse a reward model's NaN or infinite score where it is made, naming the model: summed
    with the functions' rewards it would pass for an overflow of theirs.

    Raises:
        RewardModelError: one line naming ``reward.models[i]``, its folder, the first such
            prompt id and value, and the likely cause: weights that hold NaN or inf (looked up
            only now, on the error's path), else activations beyond the range of the dtype it ran in.
    """
    bad = next((i for i, v in enumerate(scores) if not math.isfinite(v)), None)
    if bad is None:
        return
    row = f"prompt_id {prompt_ids[bad]}" if prompt_ids is not None else f"row {bad}"
    # short: the local pool's worker reports an action's error in one line of 400 characters
    where = f"reward.models[{ref.index}] ({quote(ref.settings.path, 80)}) scored {row} {scores[bad]}"
    damaged = next((n for n, t in model.state_dict().items() if t.is_floating_point() and not t.isfinite().all()),
                   None)
    dtype = str(getattr(model, "dtype", "")).removeprefix("torch.")
    if damaged is not None:
        why = (f"its weights hold NaN or inf (tensor {quote(damaged, 60)[1:-1]}); save the model again "
               "(save_pretrained) and start a new run with it (a run scores with the copy it stored)")
    elif dtype in ("bfloat16", "float16"):
        why = f"its activations overflow in {dtype} (its weights are finite); score in float32 (RLHFLESS_DTYPE=float32)"
    else:
        why = (f"its activations overflow in {dtype or 'its dtype'} on this text (its weights are finite); check the "
               "model with transformers on that input, or use another reward model")
    raise RewardModelError(f"{where}, not a finite number: {why}")


def metric_name(ref: RewardModelRef) -> str:
    """A reward model's scores' name in the step's ``rewards/<name>/*`` metrics,
    ``reward_model.<index>:<folder>``: shown by the part after the first ``:`` (the folder's name,
    as TRL names a reward model) unless another reward shares it."""
    folder = PurePosixPath(posixpath.normpath(ref.settings.path)).name
    return f"reward_model.{ref.index}:{folder if folder not in ('', '..') else 'model'}"


def score_completions(req: Any, rows: Sequence[Any], texts: Sequence[str], completion_ids: Sequence[Sequence[int]],
                      store_uri: str, epoch: float = 0.0) -> Any:
    """A request's rewards (``ScoreRequest`` or ``EvaluateRequest``: its functions and reward
    models) for ``texts``, one completion per row, with TRL's keywords filled; its ``metrics``
    hold each reward model's cut rows too (``truncated_metric``)."""
    from actions.tasks.rewards import compute_rewards, reward_inputs
    from actions.tasks.rewards.trainer_state import make_trainer_state

    algorithm = getattr(req, "algorithm", None)  # a ScoreRequest's; an evaluation counts optimizer steps already
    state = make_trainer_state(step=req.step, epoch=epoch, max_steps=req.max_steps,
                               optimizer_steps_per_step=algorithm.optimizer_steps_per_step if algorithm else 1)
    models, truncated = None, {}
    if req.reward_models:
        prompts, completions, _ = reward_inputs(rows, texts)
        models = score_with_models(req.reward_models, store_uri, prompts, completions,
                                   prompt_ids=[r.prompt_id for r in rows], truncated=truncated)
    rewards = compute_rewards(req.rewards, rows, texts, completion_ids=completion_ids, trainer_state=state,
                              model_scores=models)
    return replace(rewards, metrics={**rewards.metrics, **truncated})  # averaged per step as the logged metrics
