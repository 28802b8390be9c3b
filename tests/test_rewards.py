"""Reward functions: the built-ins on hand-written cases, plug-ins with TRL's signature, the
weighted sum, "not applicable", and failures that name the function and the row."""

from __future__ import annotations

import re
import sys
import types

import pytest

from actions.config.workload import RewardFunctionConfig as Fn
from actions.tasks.dataset import PromptRow
from actions.tasks.rewards import RewardFunctionError, compute_rewards, is_best
from actions.tasks.rewards.gsm8k import gsm8k_reward
from actions.tasks.rewards.symbolic import math_reward


def _rows(answers: list[str], **columns: list) -> list[PromptRow]:
    return [PromptRow(prompt_id=i, prompt=f"q{i}", answer=a, columns={k: v[i] for k, v in columns.items()})
            for i, a in enumerate(answers)]


def test_gsm8k_reads_the_final_answer_by_value():
    ref = ["Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 1000"] * 6
    got = gsm8k_reward(["so #### 1,000", "#### $1000.00", r"the answer is \boxed{1000}", "I think 999 or 1000",
                        "#### 1000 (or 999)", "#### 100"], answer=ref)
    assert got == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    # "####" wins over a boxed or a later number; a negative and a decimal answer.
    assert gsm8k_reward(["#### 5 \\boxed{6}", "#### -3", "#### 2.50"], answer=["#### 5", "#### -3", "#### 2.5"]) == [1.0] * 3


def test_gsm8k_takes_a_markdown_heading_after_hashes_for_no_answer():
    """``#### Step 1`` is a heading a model writes, not GSM8K's ``#### N``: the answer is then the
    last ``####`` a number follows, else ``\\boxed{}``, else the last number (a heading had hidden
    a boxed answer, and rewarded the step number when it matched the reference)."""
    texts = ["#### Step 1: add\n24 + 48 = 72\n#### Final Answer\n\\boxed{72}",
             "#### Step 3: Compute\n5 + 4 = 9\nThe answer is 9.", "#### Plan\n#### 12\n#### Check\nok",
             "#### **18**", r"so \boxed{-\$24}", r"so \boxed{-\$24}"]
    answers = ["#### 72", "#### 3", "#### 12", "#### 18", "#### -24", "#### 24"]
    assert gsm8k_reward(texts, answer=answers) == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]


def test_gsm8k_reads_dashes_latex_group_separators_ellipses_and_unicode_minus_as_graders_mean_them():
    texts = ["Final answer - 18", "Eggs left:\n- 18", r"\boxed{14{,}400}", r"The total is $14{,}400$.",
             r"\boxed{14\,400}", "So the answer is...42", "The answer is \u22125", "The answer is \u22125"]
    answers = ["#### 18", "#### 18", "#### 14400", "#### 14400", "#### 14400", "#### 42", "#### -5", "#### 5"]
    assert gsm8k_reward(texts, answer=answers) == [1.0] * 7 + [0.0]
    assert gsm8k_reward(["Answer - 18"], answer=["#### -18"]) == [0.0]  # a dash is not a minus


def test_math_reward_is_symbolic():
    assert math_reward([r"\boxed{\frac{2}{4}}", r"\boxed{x+1}", r"\boxed{2}"], answer=["0.5", "1+x", "3"]) == [1.0, 1.0, 0.0]


def test_math_reward_reads_bare_latex_references_as_math():
    """MATH's answer column is LaTeX without $...$: read as math, not by its leading number."""
    refs = [r"2\sqrt{3}", r"\left( 3, \frac{\pi}{2} \right)", r"1,\!000", r"\sqrt{2}", r"\dfrac{9}{7}", r"\$32,348"]
    right = [r"\boxed{2\sqrt{3}}", r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\boxed{1000}", r"\boxed{\sqrt{2}}",
             r"\boxed{\frac{9}{7}}", r"\boxed{32348}"]
    wrong = [r"The answer is \boxed{2}", r"\boxed{3}", r"\boxed{1}", r"\boxed{7}", r"\boxed{9}", r"\boxed{32}"]
    assert math_reward(right, answer=refs) == [1.0] * 6
    assert math_reward(wrong, answer=refs) == [0.0] * 6


def test_the_default_reward_takes_chat_completions():
    from actions.tasks.rewards import load_reward

    assert load_reward("repeat")([[{"role": "assistant", "content": "aaa"}], "aa"], answer=["aaa", "aaa"]) == [1.0, 0.0]


def test_weighted_sum_none_and_best():
    rows = _rows(["#### 4", "#### 5", "no number"])
    texts = ["2+2=4.\n#### 4", "the answer is 6", "#### 1"]
    r = compute_rewards([Fn(name="gsm8k"), Fn(name="format", weight=0.5)], rows, texts)
    assert r.per_function == {"gsm8k": [1.0, 0.0, None], "format": [1.0, 0.0, 1.0]}
    assert r.total == [1.5, 0.0, 0.5] and r.best == [1.5, 1.5, 0.5]
    # Row 3: gsm8k does not apply (its reference has no number); format alone decides.
    assert is_best(r) == [True, False, True]


def test_reward_model_scores_add_to_the_total_but_not_to_what_reaches_the_best():
    rows = _rows(["0", "1", "2", "3"])
    r = compute_rewards([Fn(name="exact_match")], rows, ["0", "wrong", "2", "wrong"],
                        model_scores={"reward_model/0": (1.0, [-0.2, 1.3, 0.1, 0.4])})
    assert r.total == pytest.approx([0.8, 1.3, 1.1, 0.4]) and r.best == [1.0] * 4
    # row 0 is right however the model scores it; row 1 is wrong however high
    assert is_best(r) == [True, False, True, False]
    alone = compute_rewards([], rows, ["0"] * 4, model_scores={"reward_model/0": (1.0, [5.0, 0.0, -1.0, 1.0])})
    assert alone.applicable == [True] * 4 and is_best(alone) == [False] * 4  # a model alone defines no best


def test_a_reward_models_score_is_weighted():
    rows = _rows(["#### 7", "#### 7"])
    r = compute_rewards([Fn(name="exact_match")], rows, ["x", "y"], model_scores={"rm/0": (0.5, [1.0, 2.0])})
    assert r.total == pytest.approx([0.5, 1.0]) and r.function_total == [0.0, 0.0]


def test_the_best_of_a_negatively_weighted_function_is_its_lowest_reward():
    """A penalty (format at weight -0.5) is best where it does not fire: the best total is
    gsm8k's 1.0 plus 0, not 1.0 - 0.5."""
    rows = _rows(["#### 4", "#### 4"])
    r = compute_rewards([Fn(name="gsm8k"), Fn(name="format", weight=-0.5, pattern="^####")], rows, ["#### 4", "4"])
    assert r.total == [0.5, 1.0] and r.best == [1.0, 1.0]
    assert is_best(r) == [False, True]


def test_built_ins_grade_against_the_configured_reference_not_a_column_named_answer():
    """With ``data.answer_key: solution`` the row's reference is the solution; a column that
    happens to be called ``answer`` (free text here) reaches plug-ins, not the built-ins."""
    rows = _rows(["#### 4"], answer=["a free-text explanation, no number"])
    r = compute_rewards([Fn(name="gsm8k")], rows, ["#### 4"])
    assert r.per_function["gsm8k"] == [1.0]


def test_an_unparsable_math_reference_does_not_apply():
    assert math_reward([r"\boxed{1}"], answer=[""]) == [None]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_reward_models_non_finite_score_is_blamed_on_the_model_not_on_the_functions_sum(bad):
    from actions.tasks.rewards import RewardModelError

    rows = _rows(["0", "1"])
    with pytest.raises(RewardModelError, match=rf"^reward.models\[1\] scored prompt_id {rows[1].prompt_id} {bad}, "
                                               r"not a finite number: its weights hold NaN or inf.*float32") as err:
        compute_rewards([Fn(name="exact_match")], rows, ["0", "1"],
                        model_scores={"reward_model/0": (1.0, [0.5, 0.5]), "reward_model/1": (1.0, [0.1, bad])})
    assert "overflows" not in str(err.value) and "reward.functions" not in str(err.value)


def test_a_penalty_whose_best_is_zero_is_reached_and_a_row_no_function_applies_to_is_not(monkeypatch):
    def penalty(completions, **kwargs):
        return [None if c == "n/a" else 0.0 if len(c) < 5 else -1.0 for c in completions]

    penalty.max_reward, penalty.min_reward = 0.0, -1.0
    module = types.ModuleType("my_penalty")
    module.penalty = penalty
    monkeypatch.setitem(sys.modules, "my_penalty", module)
    r = compute_rewards([Fn(name="my_penalty:penalty")], _rows(["a"] * 3), ["ok", "far too long", "n/a"])
    assert r.total == [0.0, -1.0, 0.0] and r.best == [0.0, 0.0, 0.0]
    assert is_best(r) == [True, False, False]


def test_plugin_gets_trl_arguments_and_failures_name_function_and_row(monkeypatch):
    seen = {}

    def length_bonus(prompts, completions, answer, level, **kwargs):
        seen.update(prompts=prompts, completions=completions, answer=answer, level=level)
        return [None if lv is None else float(len(c[0]["content"]) <= lv) for c, lv in zip(completions, level)]

    def wrong_length(prompts, completions, **kwargs):
        return [1.0]

    def boom(prompts, completions, answer, **kwargs):
        return [1.0 / len(a) for a in answer]  # ZeroDivisionError on an empty reference

    module = types.ModuleType("my_rewards")
    module.length_bonus, module.wrong_length, module.boom = length_bonus, wrong_length, boom
    monkeypatch.setitem(sys.modules, "my_rewards", module)
    chat = [{"role": "user", "content": "hi"}]
    rows = [PromptRow(prompt_id=7, prompt="<formatted>", answer="ok", source_prompt=chat, columns={"level": 3}),
            PromptRow(prompt_id=8, prompt="<formatted>", answer="", source_prompt=chat, columns={"level": None})]
    r = compute_rewards([Fn(name="my_rewards:length_bonus", weight=2.0)], rows, ["abc", "abcd"])
    assert r.total == [2.0, 0.0] and r.best == [2.0, 0.0] and is_best(r) == [True, False]
    # TRL's conversational format: prompts as messages, completions as assistant messages.
    assert seen["prompts"] == [chat, chat] and seen["completions"][1] == [{"role": "assistant", "content": "abcd"}]
    assert seen["answer"] == ["ok", ""] and seen["level"] == [3, None]
    with pytest.raises(RewardFunctionError, match="'my_rewards:wrong_length' returned 1 values for 2 completions"):
        compute_rewards([Fn(name="my_rewards:wrong_length")], rows, ["a", "b"])
    with pytest.raises(RewardFunctionError, match=r"'my_rewards:boom' raised ZeroDivisionError.*prompt_id 8 \(row 1"):
        compute_rewards([Fn(name="my_rewards:boom")], rows, ["a", "b"])
    assert issubclass(RewardFunctionError, ValueError)  # an application error: the action does not retry it


def picky(prompts, completions, answer, **kwargs):
    """Fine on the reference answers (the start-up check passes), raises on anything else."""
    if any(c != a for c, a in zip(completions, answer)):
        raise RuntimeError("cannot score this")
    return [1.0] * len(completions)


def test_a_reward_that_raises_mid_campaign_fails_the_step_once(tiny_config, prefect_harness, monkeypatch):
    from flows.campaign.run import run_campaign
    from flows.invokers.base import ActionError
    from flows.invokers.inprocess import InProcessInvoker

    calls = []
    invoke = InProcessInvoker.invoke
    monkeypatch.setattr(InProcessInvoker, "invoke",
                        lambda self, action, *a, **k: calls.append(action) or invoke(self, action, *a, **k))
    cfg = tiny_config("invoker.kind=inprocess", "run_id=picky", f"reward.functions=[{{name: '{__name__}:picky'}}]")
    with pytest.raises(ActionError, match=rf"reward function '{__name__}:picky' raised RuntimeError: cannot score "
                                          r"this on prompt_id \d+"):
        run_campaign(cfg, progress=lambda m: None)
    # The first action to score a sampled completion fails (the evaluation before RL), and it is
    # not retried: a bug in the function does not heal.
    # (the set-up's prepare, the campaign-start engine profile and its noop probes aside).
    assert [c for c in calls if c not in ("prepare", "profile", "noop")] == ["warmup", "evaluate"]
    assert calls[-1] == "evaluate"


class _ChatTokenizer:
    """ChatML-like text from messages, as a policy's or a reward model's tokenizer writes it."""

    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt=False):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt
                                                                            else "")


def _stored(records: list[dict], *, system_prompt: str | None = None) -> list[PromptRow]:
    """Rows as the score action reads them: mapped, formatted for a chat-template policy and
    round-tripped through the stored dataset's format."""
    from actions.tasks.chat import format_rows
    from actions.tasks.dataset import parse_jsonl, rows_to_jsonl
    from actions.tasks.fields import FieldMap, to_rows

    rows, _ = to_rows(list(enumerate(records, start=1)), FieldMap(), source="f")
    rows = format_rows(rows, _ChatTokenizer(), use_template=True, system_prompt=system_prompt, source="f")
    return parse_jsonl(rows_to_jsonl(rows), source="stored")


def test_rewards_and_reward_models_read_the_datasets_prompt_not_the_policys_text(monkeypatch):
    from actions.tasks.dataset import parse_jsonl
    from actions.tasks.rewards import reward_inputs
    from actions.tasks.rewards.model_scoring import reward_texts

    seen = {}

    def record(prompts, completions, **kwargs):
        seen["prompts"] = prompts
        return [0.0] * len(prompts)

    monkeypatch.setitem(sys.modules, "my_prompts", types.SimpleNamespace(record=record))
    chat = [{"role": "user", "content": "hi"}]
    rows = _stored([{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": chat, "answer": "5"}],
                   system_prompt="Be brief.")
    # The policy generates from the templated text; TRL's reward functions get the dataset's prompt.
    assert rows[0].prompt == "<system>Be brief.<user>What is 2+2?<assistant>"
    compute_rewards([Fn(name="my_prompts:record")], rows, ["4", "5"])
    assert seen["prompts"] == ["What is 2+2?", chat]
    # A reward model with chat_template: true templates the dataset's prompt once, as the user's turn.
    prompts, completions, _ = reward_inputs(rows, ["4", "5"])
    assert reward_texts(_ChatTokenizer(), True, prompts, completions) == [
        "<user>What is 2+2?<assistant>4", "<user>hi<assistant>5"]
    # A dataset stored before string prompts were kept: its prompt stands in.
    old = parse_jsonl(b'{"prompt_id": 1, "prompt": "<user>q<assistant>", "answer": "a", "source_prompt": null}\n',
                      source="old")
    assert reward_inputs(old, ["a"])[0] == ["<user>q<assistant>"]


def test_a_numeric_answer_reaches_plugins_as_a_number_and_builtins_as_text(monkeypatch):
    seen = {}

    def int_match(completions, answer, level, **kwargs):
        seen.update(answer=answer, level=level)
        return [1.0 if int(c) == a else 0.0 for c, a in zip(completions, answer)]  # as TRL's examples compare

    monkeypatch.setitem(sys.modules, "my_numbers", types.SimpleNamespace(int_match=int_match))
    rows = _stored([{"prompt": "2+5?", "answer": 7, "level": 2}, {"prompt": "1/2?", "answer": 0.5, "level": 1.5},
                    {"prompt": "say 3", "answer": "3", "level": None}])
    r = compute_rewards([Fn(name="my_numbers:int_match"), Fn(name="exact_match"), Fn(name="gsm8k")], rows,
                        ["7", "0", "3"])
    assert seen["answer"] == [7, 0.5, "3"] and [type(a) for a in seen["answer"]] == [int, float, str]
    assert seen["level"] == [2, 1.5, None]
    assert r.per_function["my_numbers:int_match"] == [1.0, 0.0, 0.0]  # 3 != "3": the string stays a string
    # The built-ins compare text: "7" == "7", "0" != "0.5".
    assert r.per_function["exact_match"] == [1.0, 0.0, 1.0] and r.per_function["gsm8k"] == [1.0, 0.0, 1.0]
    assert [row.answer for row in rows] == ["7", "0.5", "3"]


def test_log_metric_values_are_kept_by_name_and_checked(monkeypatch):
    from flows.step.metrics import reward_function_metrics

    def logs(completions, log_metric, log_extra, **kwargs):
        hits = [float(c == "a") for c in completions]
        log_metric("accuracy/a", sum(hits) / len(hits))
        log_metric("num_long", len([c for c in completions if len(c) > 1]))
        log_extra("hit", hits)  # TRL's completions table: accepted, nothing to keep
        return hits

    def bad_name(completions, log_metric, **kwargs):
        log_metric("my metric", 1.0)
        return [0.0] * len(completions)

    def bad_value(completions, log_metric, **kwargs):
        log_metric("mean", float("nan"))
        return [0.0] * len(completions)

    module = types.SimpleNamespace(logs=logs, bad_name=bad_name, bad_value=bad_value)
    monkeypatch.setitem(sys.modules, "my_logs", module)
    rows = _rows(["a", "a"])
    first = compute_rewards([Fn(name="my_logs:logs")], rows, ["a", "bb"])
    assert first.total == [1.0, 0.0] and first.metrics == {"accuracy/a": [0.5], "num_long": [1.0]}
    second = compute_rewards([Fn(name="my_logs:logs")], rows, ["a", "a"])
    # Two score actions of one step: each name's mean over every call, as TRL's logging step.
    assert reward_function_metrics([first.metrics, second.metrics]) == {"reward_fn/accuracy/a": 0.75,
                                                                          "reward_fn/num_long": 0.5}
    with pytest.raises(RewardFunctionError, match=r"'my_logs:bad_name' called log_metric with the name 'my metric'.*"
                                                  "fix the name"):
        compute_rewards([Fn(name="my_logs:bad_name")], rows, ["a", "b"])
    with pytest.raises(RewardFunctionError, match=r"'my_logs:bad_value' logged nan \(float\) as metric 'mean'; "
                                                  "log_metric takes one finite number"):
        compute_rewards([Fn(name="my_logs:bad_value")], rows, ["a", "b"])


def _mapped(records: list[dict], **fields) -> list[PromptRow]:
    """Rows mapped with ``FieldMap(**fields)`` and round-tripped through the stored format."""
    from actions.tasks.dataset import parse_jsonl, rows_to_jsonl
    from actions.tasks.fields import FieldMap, to_rows

    rows, _ = to_rows(list(enumerate(records, start=1)), FieldMap(**fields), source="f")
    return parse_jsonl(rows_to_jsonl(rows), source="stored")


def test_plugins_get_every_column_under_its_own_name(monkeypatch):
    """As TRL passes them: ``answer`` is the dataset's answer column even when the reference is
    another; without an answer column it is the reference; without any reference it is absent."""
    seen = []

    def spy(prompts, completions, **kwargs):
        seen.append(kwargs)
        return [1.0] * len(completions)

    monkeypatch.setitem(sys.modules, "my_spy", types.SimpleNamespace(spy=spy))
    specs = [Fn(name="my_spy:spy"), Fn(name="gsm8k")]
    rows = _mapped([{"prompt": f"q{i}", "solution": f"work #### {i}", "answer": i, "uid": f"r{i}", "prompt_id": i}
                    for i in range(2)], answer_key="solution", id_key="uid")
    r = compute_rewards(specs, rows, ["#### 0", "#### 0"])
    assert seen[-1]["answer"] == [0, 1] and seen[-1]["solution"] == ["work #### 0", "work #### 1"]
    assert seen[-1]["uid"] == ["r0", "r1"] and seen[-1]["prompt_id"] == [0, 1]  # id columns, as any other
    assert r.per_function["gsm8k"] == [1.0, 0.0]  # the built-ins compare with the reference, data.answer_key
    compute_rewards(specs[:1], _mapped([{"prompt": "q", "solution": 5}], answer_key="solution"), ["5"])
    assert seen[-1]["answer"] == [5] and seen[-1]["solution"] == [5]  # no answer column: the reference stands in
    compute_rewards(specs[:1], _mapped([{"prompt": "q", "n": 1}, {"prompt": "r", "answer": None}]), ["a", "b"])
    assert (seen[-1]["n"], seen[-1]["answer"]) == ([1, None], [None, None])  # a missing or null value is None
    compute_rewards(specs[:1], _mapped([{"prompt": "q"}], answer_key=None), ["a"])
    assert "answer" not in seen[-1]  # no reference and no answer column: no answer keyword, as in TRL


def test_chat_prompts_reach_rewards_and_reward_models_whole():
    from actions.tasks.rewards import reward_inputs
    from actions.tasks.rewards.model_scoring import reward_texts

    call = {"type": "function", "function": {"name": "calc", "arguments": "{}"}}
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "name": "calc", "content": "4"}]
    rows = _mapped([{"prompt": chat, "answer": "4"}])
    prompts, completions, _ = reward_inputs(rows, ["4"])
    assert prompts == [chat] and completions == [[{"role": "assistant", "content": "4"}]]
    assert reward_texts(None, False, prompts, completions) == ["2+2?44"]  # a tool call's null content adds nothing


def test_a_column_named_like_a_reward_keyword_is_refused_at_start_up(monkeypatch):
    from actions.tasks.rewards import check_reward_functions

    ok = types.SimpleNamespace(ok=lambda completions, **kw: [1.0] * len(completions))
    monkeypatch.setitem(sys.modules, "my_ok", ok)
    rows = _rows(["a"], completions=["given"])
    with pytest.raises(RewardFunctionError, match=r"reward.functions 'my_ok:ok': the dataset has a column named "
                                                  r"'completions', a keyword .* rename the column"):
        check_reward_functions([Fn(name="my_ok:ok")], rows)
    check_reward_functions([Fn(name="exact_match")], rows)  # the built-ins take no columns


def test_numpy_and_torch_rewards_are_taken_as_trl_takes_them(monkeypatch):
    """A 1-D array or tensor, NumPy scalars and 0-d tensors are numbers to TRL
    (``torch.tensor(result)``); bools, NaN, inf and other shapes are still refused."""
    import numpy as np
    import torch

    results = {
        "array": lambda n: np.array([0.5, 1.0][:n], dtype=np.float32),
        "tensor": lambda n: torch.tensor([0.5, 1.0][:n], requires_grad=True),
        "scalars": lambda n: [np.float32(0.5), np.int64(1)][:n],
        "zero_d": lambda n: [torch.tensor(0.5), np.array(1.0)][:n],
        "with_none": lambda n: [np.float64(0.5), None][:n],
        "bools": lambda n: np.array([True, False][:n]),
        "py_bools": lambda n: [True, False][:n],
        "nothing": lambda n: None,
        "nan": lambda n: np.array([0.5, np.nan][:n]),
        "inf": lambda n: [torch.tensor(0.5), torch.tensor(float("inf"))][:n],
        "two_d": lambda n: np.ones((n, 1)),
    }
    module = types.ModuleType("my_arrays")
    for name, make in results.items():
        setattr(module, name, lambda completions, make=make, **kw: make(len(completions)))
    monkeypatch.setitem(sys.modules, "my_arrays", module)
    rows = _rows(["a", "b"])
    for name in ("array", "tensor", "scalars", "zero_d"):
        r = compute_rewards([Fn(name=f"my_arrays:{name}")], rows, ["x", "y"])
        assert r.total == [0.5, 1.0] and all(type(v) is float for v in r.per_function[f"my_arrays:{name}"]), name
    assert compute_rewards([Fn(name="my_arrays:with_none")], rows, ["x", "y"]).per_function == {
        "my_arrays:with_none": [0.5, None]}
    for name in ("bools", "py_bools"):
        with pytest.raises(RewardFunctionError, match=rf"'my_arrays:{name}' returned True \(a bool\) for prompt_id "
                                                      r"\d; return float\(True\) or another number \(TRL casts"):
            compute_rewards([Fn(name=f"my_arrays:{name}")], rows, ["x", "y"])
    with pytest.raises(RewardFunctionError, match=r"'my_arrays:nothing' returned None, not a list; return one float "
                                                  r"\(or None\) per completion, 2 here \(is a return statement"):
        compute_rewards([Fn(name="my_arrays:nothing")], rows, ["x", "y"])
    for name, shown in (("nan", "nan"), ("inf", r"tensor\(inf\)")):
        with pytest.raises(RewardFunctionError, match=rf"'my_arrays:{name}' returned {shown} for prompt_id \d; "
                                                      "return a finite float or None"):
            compute_rewards([Fn(name=f"my_arrays:{name}")], rows, ["x", "y"])
    with pytest.raises(RewardFunctionError, match="'my_arrays:two_d' returned ndarray values for 2 completions"):
        compute_rewards([Fn(name="my_arrays:two_d")], rows, ["x", "y"])


def test_rewards_whose_weighted_sum_is_beyond_the_limit_are_refused(monkeypatch):
    """Each of 6e14 and 6e14 is within +-1e15, their sum is not: the step's float32 statistics
    would overflow (3e38 squared already does) and an infinite reward turns the update's
    gradients to NaN, so the step fails naming the functions and their values."""
    from actions.tasks.rewards import check_reward_functions

    big = types.SimpleNamespace(g=lambda completions, **kw: [6e14] * len(completions),
                                h=lambda completions, **kw: [6e14] * len(completions))
    monkeypatch.setitem(sys.modules, "my_big", big)
    rows = _rows(["a", "b"])
    specs = [Fn(name="my_big:g"), Fn(name="my_big:h")]
    message = (r"reward.functions: the weighted sum of the rewards for prompt_id 0 is 1.2e\+15 \('my_big:g' 6e\+14 x "
               r"weight 1, 'my_big:h' 6e\+14 x weight 1\), beyond \+-1e\+15, where the step's float32 statistics "
               r"overflow")
    with pytest.raises(RewardFunctionError, match=message):
        compute_rewards(specs, rows, ["x", "y"])
    with pytest.raises(RewardFunctionError, match=message):  # at start-up, on the sample rows
        check_reward_functions(specs, rows)
    read = [r.model_copy(update={"line": 3 + i}) for i, r in enumerate(rows)]  # rows read from a file: named there
    with pytest.raises(RewardFunctionError, match=r"weighted sum of the rewards for data.train_path d.jsonl:3 "
                                                  r"\(prompt_id 0\) is 1.2e\+15"):
        check_reward_functions(specs, read, sources=[("data.train_path d.jsonl", read)])
    with pytest.raises(RewardFunctionError, match=r"is 1.2e\+15 \('my_big:g' 6e\+14 x weight 2\)"):
        compute_rewards([Fn(name="my_big:g", weight=2.0)], rows, ["x", "y"])
    assert compute_rewards([Fn(name="my_big:g")], rows, ["x", "y"]).total == [6e14, 6e14]
    with pytest.raises(RewardFunctionError, match=r"is -1.2e\+15 \('my_big:g' 6e\+14 x weight -2\)"):
        compute_rewards([Fn(name="my_big:g", weight=-2.0)], rows, ["x", "y"])  # a penalty beyond it too
    big.none = lambda completions, **kw: [None] * len(completions)
    with pytest.raises(RewardFunctionError, match=r"is 1.2e\+15 \('my_big:g' 6e\+14 x weight 1, 'my_big:h' 6e\+14 x "
                                                  r"weight 1\), beyond"):  # a None term is left out of the line
        compute_rewards([*specs, Fn(name="my_big:none")], rows, ["x", "y"])


@pytest.mark.parametrize("value, shown", [
    (1e300, "1e+300"), (3e38, "3e+38"), (-2e15, "-2000000000000000.0"),
    (10**400, "1000000000000000000000000000000000000000...(401 characters)")])
def test_a_reward_beyond_the_limit_is_refused_in_one_line(monkeypatch, value, shown):
    """A finite reward too large for the step's float32 statistics (or an int past float's
    range) fails the start-up check and a step in one line, not with an OverflowError or a run
    that trains on infinite rewards."""
    from actions.tasks.rewards import check_reward_functions

    monkeypatch.setitem(sys.modules, "my_huge", types.SimpleNamespace(g=lambda completions, **kw: [value] * len(
        completions)))
    rows = _rows(["a", "b"])
    message = re.escape(f"reward function 'my_huge:g' returned {shown} for prompt_id 0, beyond +-1e+15")
    with pytest.raises(RewardFunctionError, match=message):
        check_reward_functions([Fn(name="my_huge:g")], rows)
    with pytest.raises(RewardFunctionError, match=message):
        compute_rewards([Fn(name="my_huge:g")], rows, ["x", "y"])


def test_a_function_that_edits_its_inputs_changes_neither_the_next_function_s_nor_the_rows(monkeypatch):
    """Each function gets inputs of its own: one that appends a message to a chat prompt, edits
    a column's dict and pops a completion leaves the next function's inputs, and the rows (a
    warm action keeps them for later steps), as they were."""
    seen = []

    def vandal(prompts, completions, completion_ids, meta, **kw):
        prompts[0].append({"role": "user", "content": "INJECTED"})
        prompts[0][0]["content"] = "MUTATED"
        meta[0]["k"] = "changed"
        completion_ids[0].append(999)
        n = len(completions)
        completions.pop()
        return [1.0] * n

    def observer(prompts, completions, completion_ids, meta, **kw):
        seen.append((prompts[0], len(completions), completion_ids[0], meta[0]))
        return [0.0] * len(completions)

    monkeypatch.setitem(sys.modules, "my_edit", types.SimpleNamespace(vandal=vandal, observer=observer))
    rows = [PromptRow(prompt_id=i, prompt="p", answer="a", source_prompt=[{"role": "user", "content": f"say {i}"}],
                      columns={"meta": {"k": i}}) for i in range(2)]
    specs = [Fn(name="my_edit:vandal"), Fn(name="my_edit:observer")]
    for _ in range(2):  # a warm action's next step reads the same rows
        compute_rewards(specs, rows, ["x", "y"], completion_ids=[[1, 2], [3]])
    assert seen == [([{"role": "user", "content": "say 0"}], 2, [1, 2], {"k": 0})] * 2
    assert rows[0].source_prompt == [{"role": "user", "content": "say 0"}] and rows[0].columns["meta"] == {"k": 0}


def test_max_and_min_reward_attributes_must_be_finite_numbers_at_start_up(monkeypatch):
    from actions.tasks.rewards import check_reward_functions

    def scored(completions, **kw):
        return [1.0] * len(completions)

    module = types.ModuleType("my_bounds")
    module.f = scored
    monkeypatch.setitem(sys.modules, "my_bounds", module)
    rows = _rows(["a", "b"])
    for attr, value, shown in (("max_reward", "ten", "'ten' (str)"), ("min_reward", float("nan"), "nan (float)"),
                               ("max_reward", True, "True (bool)")):
        monkeypatch.setattr(scored, attr, value, raising=False)
        message = rf"^reward function 'my_bounds:f' has {attr} = {re.escape(shown)}; {attr} is the finite number "
        with pytest.raises(RewardFunctionError, match=message + rf".* set it to one \(e.g. f.{attr} = "):
            check_reward_functions([Fn(name="my_bounds:f")], rows)
        monkeypatch.delattr(scored, attr)
    scored.max_reward = 10  # an int is a number
    r = compute_rewards([Fn(name="my_bounds:f")], rows, ["x", "y"])
    assert r.best == [10.0, 10.0]


def test_a_reward_module_that_raises_at_import_is_told_apart_from_one_not_found(tmp_path, monkeypatch):
    from actions.tasks.rewards import load_reward

    (tmp_path / "needs_key.py").write_text("raise RuntimeError('needs OPENAI_API_KEY')\n")
    (tmp_path / "needs_dep.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardFunctionError, match=r"importing module 'needs_key' raised RuntimeError: needs "
                                                  r"OPENAI_API_KEY; fix the module"):
        load_reward("needs_key:f")
    with pytest.raises(RewardFunctionError, match=r"importing module 'needs_dep' raised ModuleNotFoundError: No module "
                                                  r"named 'no_such_dependency_xyz'; install what it imports"):
        load_reward("needs_dep:f")
    with pytest.raises(RewardFunctionError, match=r"module 'nowhere.rewards' cannot be imported .*on PYTHONPATH"):
        load_reward("nowhere.rewards:f")
    (tmp_path / "fine.py").write_text("def f(completions, **kw):\n    return [0.0] * len(completions)\n")
    with pytest.raises(RewardFunctionError, match=r"put it on PYTHONPATH and name it 'fine:f'"):
        load_reward("fine.py:f")


@pytest.mark.parametrize("name", ["m" * 5000 + ":f", "json:" + "f" * 5000, "zz_" + "a" * 5000])
def test_a_long_reward_name_is_quoted_short(name):
    """A reward function that does not load is named in at most about 200 characters of it."""
    from actions.tasks.rewards import load_reward

    with pytest.raises(RewardFunctionError) as info:
        load_reward(name)
    line = str(info.value)
    assert line.startswith("reward.functions name '") and "\n" not in line and len(line) < 1000, line


def test_a_reward_named_by_its_file_path_is_told_to_use_the_module_name():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"a reward is named by its module, not its file: put its folder "
                                              r"\(plugins\) on PYTHONPATH and use 'myrewards:score'"):
        Fn(name="plugins/myrewards.py:score")


def test_a_plug_in_that_fails_the_start_up_check_is_told_where_and_on_what(monkeypatch):
    """The start-up call gives the reference answers as completions ('' where a row has none):
    a function that fails on them is told so, not that a step failed."""
    from actions.tasks.rewards import check_reward_functions

    module = types.ModuleType("my_last_char")
    module.f = lambda completions, **kw: [1.0 if c[-1] == "." else 0.0 for c in completions]
    monkeypatch.setitem(sys.modules, "my_last_char", module)
    with pytest.raises(RewardFunctionError) as info:
        check_reward_functions([Fn(name="my_last_char:f")], _rows(["", ""]))
    message = str(info.value)
    assert message.startswith("reward check at start-up, before any step (each package.module:function is called "
                              "on up to 2 training rows, their reference answers as the completions, '' where a row "
                              "has none): reward function 'my_last_char:f' raised IndexError")
    assert "fails the step" not in message and message.endswith("fix the function")


def test_reward_functions_may_be_listed_by_name_alone_as_trl_reward_funcs():
    from flows.config import load_config

    listed = load_config(None, ["reward.functions=[gsm8k, 'pkg.mod:f']"]).reward.functions
    assert [(f.name, f.weight) for f in listed] == [("gsm8k", 1.0), ("pkg.mod:f", 1.0)]
    assert listed == load_config(None, ["reward.functions=[{name: gsm8k}, {name: 'pkg.mod:f'}]"]).reward.functions
    with pytest.raises(ValueError, match=r"^reward.functions names 'gsm8k' twice; give each function once"):
        load_config(None, ["reward.functions=[gsm8k, {name: gsm8k, weight: 2}]"])


def test_one_bare_name_is_a_list_of_it_and_other_entries_are_refused_with_the_forms():
    from flows.config import load_config

    assert [f.name for f in load_config(None, ["reward.functions=gsm8k"]).reward.functions] == ["gsm8k"]
    one = load_config(None, ["reward.functions={name: gsm8k, weight: 2}"]).reward.functions
    assert [(f.name, f.weight) for f in one] == [("gsm8k", 2.0)]
    with pytest.raises(ValueError, match=r"^reward.functions\[1\] = 3: each entry is a function's name or "
                                         r"\{name, weight\}"):
        load_config(None, ["reward.functions=[gsm8k, 3]"])
    with pytest.raises(ValueError, match=r"names 'format' twice, with two patterns; one format reward is allowed"):
        load_config(None, ["reward.functions=[{name: format, pattern: '^a'}, {name: format, pattern: 'b$'}]"])


def test_a_reward_model_s_scores_are_named_by_its_folder_as_trl_names_them():
    from actions.config.reward import RewardModelConfig
    from actions.contracts import RewardModelRef
    from actions.tasks.rewards.model_scoring import metric_name
    from flows.step.metrics import per_reward_metrics

    refs = [RewardModelRef(index=i, manifest_key="k", settings=RewardModelConfig(path=p))
            for i, p in enumerate(["/models/skywork-rm/", "other/skywork-rm", "/m/helpful", "/m/rm:v2", "/m/x/..",
                                   "../..", "a.s"])]
    assert [metric_name(r) for r in refs] == ["reward_model.0:skywork-rm", "reward_model.1:skywork-rm",
                                             "reward_model.2:helpful", "reward_model.3:rm:v2", "reward_model.4:m",
                                             "reward_model.5:model", "reward_model.6:a.s"]
    names = per_reward_metrics([{metric_name(r): [1.0] for r in refs}, {"pkg:s": [2.0], "other:s": [3.0]}])
    # short names where unique; a clash (plug-ins a:s and b:s shown as a.s and b.s beside a folder
    # named a.s) falls back to the whole name, then to it with its index: no scorer's metrics lost
    assert sorted(k[:-len("/mean")] for k in names if k.endswith("/mean")) == [
        "rewards/a.s", "rewards/helpful", "rewards/m", "rewards/model", "rewards/other.s", "rewards/pkg.s",
        "rewards/reward_model.0.skywork-rm", "rewards/reward_model.1.skywork-rm", "rewards/rm:v2"]
    clash = per_reward_metrics([{"a:s": [1.0], "b:s": [2.0], "reward_model.0:a.s": [3.0]}])
    assert {k: v for k, v in clash.items() if k.endswith("/mean")} == {
        "rewards/a.s_0/mean": 1.0, "rewards/b.s/mean": 2.0, "rewards/reward_model.0.a.s/mean": 3.0}
