"""A campaign's train and eval prompt rows, from the configuration: read, map, format, limit.

The order is the order in which a user fixes things: the files and their rows first (no
tokenizer needed, so most mistakes are reported in well under a second), then the model's
tokenizer for the chat template and the prompt-length limit, then the dataset's size, then the
reward functions (imported and, for plug-ins, called once on two rows and their signatures
checked against the columns of the train and the eval rows). Nothing is written: ``prepare``
stores the result, and the CLI calls the same function before anything starts. What loads but
will likely not train as meant is said in ``Datasets.warnings``, not refused.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from actions.config.workload import WorkloadConfig
from actions.tasks import get_task
from actions.tasks.chat import answer_in_prompt_warning, format_rows, uses_template
from actions.tasks.dataset import PromptRow
from actions.tasks.fields import FieldMap, to_rows
from actions.tasks.input_limits import check_prompt_room, prompt_token_limit, sequence_limit
from actions.tasks.prompt_length import limit_prompt_length
from actions.tasks.rewards import check_reward_functions
from actions.tasks.rewards.trainer_state import make_trainer_state
from actions.tasks.sources import read_records

TokenizerSource = Callable[[], Any]
"""Returns the tokenizer the actions will use (loaded only when formatting needs it)."""

EVAL_FIRST_ID = 1_000_000
"""Synthetic eval ids start here (the repeat task numbers its rows)."""


@dataclass
class Datasets:
    train: list[PromptRow]
    evals: list[PromptRow]
    summary: dict[str, Any] = field(default_factory=dict)
    """Per split: rows read, kept, duplicates dropped, truncated and skipped long prompts; under
    ``warnings`` (where there are any), :attr:`warnings`."""
    warnings: list[str] = field(default_factory=list)
    """Lines for data that loads but will likely not train as meant (``warning: ...``, naming
    the file and the fix), for the caller to print once: chat prompts that end with the
    assistant's reply (``chat.answer_in_prompt_warning``)."""


def _split(cfg: WorkloadConfig, which: str, exclude: frozenset[str]) -> tuple[list[PromptRow], dict[str, Any]]:
    d = cfg.data
    path = d.train_path if which == "train" else d.eval_path
    if path:
        setting = f"data.{which}_path"
        records = read_records(path, field=setting)
        fields = FieldMap(d.prompt_key, d.answer_key, d.id_key, answer_need=cfg.answer_need(which))
        rows, stats = to_rows(records, fields, source=f"{setting} {path}")
    else:
        task = get_task(d.task)
        num = d.num_train_prompts if which == "train" else d.num_eval_prompts
        seed = cfg.seed + (1 if which == "train" else 2)
        made = task.make_records(num, max_count=d.max_count, max_value=d.max_value, seed=seed, exclude=exclude,
                                 first_id=0 if which == "train" else EVAL_FIRST_ID)
        rows, stats = to_rows(list(enumerate(made, start=1)), task.fields, source=f"data.task {d.task} ({which})")
    return rows, asdict(stats)


def build_datasets(cfg: WorkloadConfig, tokenizer: TokenizerSource, *, model_name: str, steps: int = 1) -> Datasets:
    """Validate and format the train and eval rows, and call the reward plug-ins once on two of
    them as step 0 of a campaign of ``steps`` RL steps. Raises ValueError (one line, with the fix)."""
    d = cfg.data
    train, train_stats = _split(cfg, "train", frozenset())
    if d.train_path and not d.eval_path:
        train, evals = hold_out(train, d.eval_fraction or 0.0, cfg.seed)
        if d.eval_fraction and not evals:  # one row: it stays for training (hold_out)
            raise ValueError(f"data.eval_fraction={d.eval_fraction} holds out no row of {len(train)} training "
                             f"row{'s' if len(train) != 1 else ''} (one must stay to train on); add rows or set "
                             "data.eval_path")
        eval_stats: dict[str, Any] = {"rows": len(evals)}
        held = len(evals)
    else:  # arith's eval draw repeats no training question; repeat's 140 questions are too few to
        # draw one apart (data.eval.in_train counts the eval prompts that are training prompts)
        evals, eval_stats = _split(cfg, "eval", frozenset(r.prompt for r in train))
        held = 0
    evaluation = evaluation_source(d.train_path, d.eval_path, d.eval_fraction)
    stats = {"train": train_stats, "eval": eval_stats}
    # The tiny model's character tokenizer has no chat template: without model.path only the
    # length limit needs it (and the CLI answers a bad chat_template without importing torch).
    max_tokens = prompt_token_limit(cfg)
    look = max_tokens or (cfg.model.path and d.chat_template is not False)
    tok = tokenizer() if look else None
    template = uses_template(tok, d.chat_template, model_name)

    def encode(text: Any) -> Any:  # a text's tokens alone, or a list of texts' in one batch call
        return (tok or tokenizer())(text, add_special_tokens=False, verbose=False)["input_ids"]

    split_rows = {"train": train, "eval": evals}
    # per file read, as read (a held-out eval set is the training file's: counted with it, once)
    files = {"train": train + evals if d.train_path and not d.eval_path else train,
             "eval": evals if d.eval_path else []}
    warnings = [line for which, rows in files.items()
                if (line := answer_in_prompt_warning(rows, d.prompt_key, split_source(d, which)))]
    for which, rows in split_rows.items():
        source = split_source(d, which)
        rows = format_rows(rows, tok, use_template=template, system_prompt=d.system_prompt, source=source,
                           strings_as_text=d.chat_template == "messages")
        if max_tokens:
            rows, length = limit_prompt_length(
                rows, encode=encode, encode_many=encode, decode=tok.decode,
                num_special=tok.num_special_tokens_to_add(), max_tokens=max_tokens, policy=d.long_prompts,
                source=source,
                limit_text=None if d.max_prompt_tokens else
                f"{max_tokens} (data.max_prompt_tokens unset: the model's context less generation.max_new_tokens)",
                fix="raise it" if d.max_prompt_tokens else "lower generation.max_new_tokens", alone=_alone(cfg))
            stats[which].update(asdict(length))
        elif not d.train_path:  # a generated task: no limit, but the response must still fit the context
            check_prompt_room(cfg, rows, encode, source, one_token_per_char=not cfg.model.path,
                              num_special=(tok or tokenizer()).num_special_tokens_to_add()
                              if any(r.add_special_tokens for r in rows) else 0)
        stats[which]["rows"] = len(rows)
        split_rows[which] = rows
    train, evals = split_rows["train"], split_rows["eval"]
    trained = {r.prompt for r in train}
    stats["eval"]["in_train"] = sum(r.prompt in trained for r in evals)  # not held out: the summary says so
    if len(train) < cfg.algorithm.prompts_per_step:
        raise ValueError(_too_few_prompts(cfg, len(train), stats["train"], held, max_tokens))
    if not evals and evaluation != "none":
        over = _over_context(cfg, stats["eval"])
        raise ValueError(f"the eval set ({evaluation}) has no prompts left after data.long_prompts; "
                         + (over or "raise data.max_prompt_tokens" if d.max_prompt_tokens else
                            f"its limit is {max_tokens} tokens (data.max_prompt_tokens unset: the model's context "
                            f"less generation.max_new_tokens): {over or 'lower generation.max_new_tokens'}")
                         + (" or raise data.eval_fraction" if d.eval_fraction else ""))
    state = make_trainer_state(step=0, epoch=0.0, max_steps=steps,
                               optimizer_steps_per_step=cfg.algorithm.optimizer_steps_per_step)
    # evaluation calls the plug-ins on the eval rows: each set's columns are checked against their
    # signatures (and for names that clash with the keywords), not only the two rows called
    sources = [(split_source(d, which), split_rows[which]) for which in ("train", "eval")]
    check_reward_functions(cfg.reward_functions(), train, trainer_state=state, encode=encode, sources=sources)
    summary = stats | {"chat_template": template, "evaluation": evaluation}
    if warnings:
        summary["warnings"] = warnings
    return Datasets(train=train, evals=evals, summary=summary, warnings=warnings)


def _alone(cfg: WorkloadConfig) -> tuple[int, str] | None:
    """(the context in tokens, the fixes for a prompt that fills it alone), for
    ``limit_prompt_length``: neither a higher limit nor fewer ``generation.max_new_tokens`` make
    room for its response. None where the context is unknown."""
    context, what, key = sequence_limit(cfg)
    if context is None:
        return None
    return context, (f"the prompt alone leaves no room for a response in {what}, whatever generation.max_new_tokens "
                     "is: shorten it, " + (f"raise {key}, " if key else "")
                     + "or set data.long_prompts to truncate_left (keep its end) or skip")


def _over_context(cfg: WorkloadConfig, stats: dict[str, Any]) -> str | None:
    """The fix for a split whose skipped prompts all fill the model's context alone
    (``LengthStats.skipped_over_context``), where neither a higher limit nor fewer
    ``generation.max_new_tokens`` brings one back; None where some would come back."""
    skipped, over = stats.get("skipped", 0), stats.get("skipped_over_context", 0)
    if not skipped or over < skipped:
        return None
    _, what, key = sequence_limit(cfg)
    return (f"{'it fills' if over == 1 else f'all {over} fill'} {what} alone, whatever generation.max_new_tokens "
            "is: shorten " + ("it" if over == 1 else "them") + (f", raise {key}," if key else "")
            + " or set data.long_prompts=truncate_left (keep its end)")


def split_source(d: Any, which: str) -> str:
    """The rows of split ``which`` (train or eval) as errors name them: the file they are read
    from (a training file's held-out share, for the eval set of ``data.eval_fraction``), or the
    generated task."""
    path = getattr(d, f"{which}_path")
    if path:
        return f"data.{which}_path {path}"
    if which == "eval" and d.train_path:
        return f"data.train_path {d.train_path} (held out by data.eval_fraction)"
    return f"data.task {d.task}"


def _too_few_prompts(cfg: WorkloadConfig, kept: int, stats: dict[str, Any], held: int, max_tokens: int | None
                     ) -> str:
    """The line for a training set of ``kept`` prompts, fewer than a step needs: where the rows
    read went (duplicates, ``held`` out for evaluation, skipped as too long; only those that
    took any) and the fix for each, so that a limit that skipped every row is not reported as
    a dataset too small."""
    d = cfg.data
    lost, fixes = [], []
    if stats.get("duplicates_dropped"):
        lost.append(f"{stats['duplicates_dropped']} repeated an earlier row")
    if held:
        lost.append(f"{held} {'was' if held == 1 else 'were'} held out by data.eval_fraction={d.eval_fraction}")
        fixes.append("lower data.eval_fraction (or set data.eval_path)")
    skipped = stats.get("skipped", 0)
    if skipped:
        limit = (f"data.max_prompt_tokens={d.max_prompt_tokens}" if d.max_prompt_tokens else
                 f"the prompt limit {max_tokens} (data.max_prompt_tokens unset: the model's context less "
                 "generation.max_new_tokens)")
        lost.append(f"{skipped} {'was' if skipped == 1 else 'were'} skipped by data.long_prompts=skip as longer "
                    f"than {limit}")
        fixes.append(_over_context(cfg, stats) or
                     f"{'raise data.max_prompt_tokens' if d.max_prompt_tokens else 'lower generation.max_new_tokens'}"
                     " or set data.long_prompts=truncate_left")
    if skipped and not kept:  # every row left was too long: no other change brings one back
        fixes = fixes[-1:]
    else:  # with none kept, a smaller step would still have nothing to train on
        fixes.append(("add prompts" if d.train_path else "raise data.num_train_prompts")
                     + (" or lower algorithm.batch_size" if kept else ""))
    read = f" (of {stats.get('rows_read')} rows read, {', '.join(lost)})" if lost else ""
    return (f"data has {kept} training prompt{'s' if kept != 1 else ''}{read} but a step needs "
            f"algorithm.batch_size/group_size = {cfg.algorithm.prompts_per_step}; {'; or '.join(fixes)}")


def evaluation_source(train_path: str | None, eval_path: str | None, eval_fraction: float | None) -> str:
    """What the campaign evaluates on, as the summary names it: ``eval_path``, ``held_out
    <fraction> of train_path``, ``none`` or ``task``."""
    if eval_path:
        return "eval_path"
    if not train_path:
        return "task"
    return f"held_out {eval_fraction} of train_path" if eval_fraction else "none"


def hold_out(rows: list[PromptRow], fraction: float, seed: int) -> tuple[list[PromptRow], list[PromptRow]]:
    """(train, eval): ``round(fraction * len(rows))`` rows (at least one when ``fraction`` > 0,
    at most all but one, so none of a single row), chosen by a seeded shuffle of the prompt ids,
    move to eval; both keep the file's order.

    >>> rows = [PromptRow(prompt_id=i, prompt=f"q{i}", answer="a") for i in range(10)]
    >>> train, evals = hold_out(rows, 0.2, seed=0)
    >>> len(train), len(evals), {r.prompt_id for r in train} & {r.prompt_id for r in evals}
    (8, 2, set())
    """
    if fraction <= 0:
        return rows, []
    count = min(len(rows) - 1, max(1, round(fraction * len(rows))))
    ids = sorted(r.prompt_id for r in rows)
    random.Random(seed).shuffle(ids)
    chosen = set(ids[:count])
    return [r for r in rows if r.prompt_id not in chosen], [r for r in rows if r.prompt_id in chosen]
