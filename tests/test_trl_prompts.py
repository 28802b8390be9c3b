"""``data.chat_template: messages`` formats prompts as TRL's GRPOTrainer does: chat-message
prompts through the chat template, string prompts never, encoded with the tokenizer's special
tokens (its BOS), as ``processing_class(text=prompts)`` encodes them. ``auto`` keeps templating
string prompts too (CPU, no model)."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from actions.models.loading import encode_prompt
from actions.prepare import token_table
from actions.tasks.build import build_datasets
from actions.tasks.chat import format_rows, uses_template
from actions.tasks.dataset import PromptRow, rows_to_jsonl
from actions.tasks.prompt_length import limit_prompt_length
from flows.config import load_config

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")


def _tokenizer() -> PreTrainedTokenizerFast:
    """Words; ``<s>`` put first by the post-processor (as Llama's tokenizers do); a ChatML-like template."""
    words = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system", "hello", "world", "brief"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="</s>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    core.decoder = decoders.WordPiece()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>",
                                  additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = TEMPLATE
    return tok


def _rows() -> list[PromptRow]:
    return [PromptRow(prompt_id=0, prompt="hello world", answer="a", source_prompt="hello world"),
            PromptRow(prompt_id=1, prompt="", answer="b", source_prompt=[{"role": "user", "content": "hello"}])]


def test_messages_mode_templates_chat_prompts_only_and_encodes_strings_with_bos():
    tok = _tokenizer()
    out = format_rows(_rows(), tok, use_template=uses_template(tok, "messages", "m"), system_prompt=None, source="f",
                      strings_as_text=True)
    assert out[0].prompt == "hello world" and out[0].add_special_tokens
    assert out[1].prompt == "<|im_start|>user hello<|im_end|> <|im_start|>assistant " and not out[1].add_special_tokens
    # TRL: processing_class(text=prompts) for strings (BOS added); the template's own text for messages
    assert list(encode_prompt(tok, out[0])) == tok(text=["hello world"])["input_ids"][0] == [0, 7, 8]
    assert list(encode_prompt(tok, out[1])) == tok(out[1].prompt, add_special_tokens=False)["input_ids"]
    assert token_table(out, lambda t: tok(t, add_special_tokens=False)["input_ids"], 4,
                       encode_row=lambda r: encode_prompt(tok, r))["0"]["prompt"] == [0, 7, 8]
    # the default, auto, templates the string prompt too and adds no BOS (unchanged)
    auto = format_rows(_rows(), tok, use_template=uses_template(tok, "auto", "m"), system_prompt=None, source="f")
    assert auto[0].prompt == "<|im_start|>user hello world<|im_end|> <|im_start|>assistant "
    assert not any(r.add_special_tokens for r in auto)


def test_messages_mode_is_a_setting_and_stored_rows_keep_the_flag(tmp_path):
    assert load_config(None, ["data.chat_template=messages"]).data.chat_template == "messages"
    with pytest.raises(ValueError, match="data.chat_template 'trl' is not a mode; use auto, messages, true or false"):
        load_config(None, ["data.chat_template=trl"])
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": "x"}) + "\n" for p in ["hello", "world", "hello world",
                                                                                        "world hello"]))
    cfg = load_config(None, [f"data.train_path={data}", "data.chat_template=messages", "algorithm.batch_size=8",
                             "algorithm.group_size=4", "reward.functions=[{name: format}]", "data.max_prompt_tokens=2",
                             "data.long_prompts=skip"])
    built = build_datasets(cfg, _tokenizer, model_name="m")
    # one word and the BOS fit in 2 tokens; two words and the BOS do not
    assert [r.prompt for r in built.train] == ["hello", "world"] and all(r.add_special_tokens for r in built.train)
    assert built.summary["train"]["skipped"] == 2 and built.summary["train"]["longest_prompt_tokens"] == 2
    assert '"add_special_tokens": true' in rows_to_jsonl(format_rows(_rows()[:1], None, use_template=False,
                                                                    system_prompt=None, source="f",
                                                                    strings_as_text=True)).decode()
    assert b"add_special_tokens" not in rows_to_jsonl(_rows())  # other rows are stored as before


def test_prompt_length_counts_the_special_tokens_a_row_is_encoded_with():
    rows = format_rows([PromptRow(prompt_id=0, prompt="x" * 5, answer="a")], None, use_template=False,
                       system_prompt=None, source="f", strings_as_text=True)
    enc, dec = (lambda t: list(t)), (lambda ids: "".join(ids))  # one token per character
    kept, stats = limit_prompt_length(rows, encode=enc, decode=dec, max_tokens=5, policy="truncate_left", source="f",
                                      num_special=1)
    assert kept[0].prompt == "xxxx" and stats.truncated == 1 and stats.longest_prompt_tokens == 5
    with pytest.raises(ValueError, match="has 6 prompt tokens, above data.max_prompt_tokens=5"):
        limit_prompt_length(rows, encode=enc, decode=dec, max_tokens=5, policy="error", source="f", num_special=1)


def test_system_prompt_goes_first_unless_the_row_has_its_own_and_a_template_refusing_it_names_it():
    tok = _tokenizer()
    own = PromptRow(prompt_id=2, prompt="", answer="c",
                    source_prompt=[{"role": "system", "content": "world"}, {"role": "user", "content": "hello"}])
    out = format_rows([_rows()[0], own], tok, use_template=True, system_prompt="brief", source="f")
    assert out[0].prompt.startswith("<|im_start|>system brief<|im_end|> <|im_start|>user hello world")
    assert out[1].prompt.startswith("<|im_start|>system world<|im_end|> <|im_start|>user hello")  # its own stays
    tok.chat_template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
                         + TEMPLATE)
    with pytest.raises(ValueError, match=r"^f: row 1 \(prompt_id 0\): the tokenizer's chat template fails on its "
                                         r"messages \(TemplateError: no system role\); data.system_prompt was put "
                                         r"first as a system message, which this template may not take: unset "
                                         r"data.system_prompt, change the messages, or use a model"):
        format_rows(_rows()[:1], tok, use_template=True, system_prompt="brief", source="f")
    with pytest.raises(ValueError, match=r"fails on its messages \(TemplateError: no system role\); change the "
                                         r"messages, or use a model"):  # the row's own system message
        format_rows([own], tok, use_template=True, system_prompt=None, source="f")


def test_system_prompt_is_not_added_before_a_developer_turn_the_row_starts_with():
    """``developer`` is the system turn of OpenAI's newer models: the row's own, kept alone."""
    tok = _tokenizer()
    dev = PromptRow(prompt_id=3, prompt="", answer="c",
                    source_prompt=[{"role": "developer", "content": "world"}, {"role": "user", "content": "hello"}])
    later = PromptRow(prompt_id=4, prompt="", answer="c",  # a developer turn after the user's is no system turn
                      source_prompt=[{"role": "user", "content": "hello"}, {"role": "developer", "content": "world"}])
    out = format_rows([dev, later], tok, use_template=True, system_prompt="brief", source="f")
    assert out[0].prompt == "<|im_start|>developer world<|im_end|> <|im_start|>user hello<|im_end|> " \
                            "<|im_start|>assistant "
    assert out[1].prompt.startswith("<|im_start|>system brief<|im_end|> <|im_start|>user hello")


def _chat_file(tmp_path, ending: int, total: int = 20, name: str = "chat.jsonl"):
    """``total`` chat rows under ``messages``, the first ``ending`` of them ending with the assistant's reply."""
    rows = [{"messages": [{"role": "user", "content": f"hello {i}"}]
             + ([{"role": "assistant", "content": "world"}] if i < ending else []), "answer": "world"}
            for i in range(total)]
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _built(*settings: str):
    return build_datasets(load_config(None, ["data.prompt_key=messages", "algorithm.batch_size=8",
                                             "algorithm.group_size=4", *settings]), _tokenizer, model_name="m")


def test_chat_prompts_that_end_with_the_assistant_reply_are_warned_of_once(tmp_path):
    path = _chat_file(tmp_path, ending=19)
    built = _built(f"data.train_path={path}")
    assert built.warnings == [
        f"warning: data.train_path {path}: 19 of its 20 prompts (95%) end with an assistant message "
        "(data.prompt_key 'messages'); the chat template closes that turn and opens a new one, so the policy is "
        "prompted with the reply already written, as in an SFT dataset's conversations: drop the final assistant "
        "message from each prompt, and put its text in the answer column (data.answer_key) where a reward reads a "
        "reference (README, Data: prompt_key)"]
    assert built.summary["warnings"] == built.warnings  # summary.json keeps it
    held = _built(f"data.train_path={path}", "data.eval_fraction=0.1")  # the held-out rows: the same file, once
    assert len(held.warnings) == 1 and held.warnings[0].startswith(f"warning: data.train_path {path}: ")
    eval_path = _chat_file(tmp_path, ending=20, total=4, name="eval.jsonl")
    both = _built(f"data.train_path={path}", f"data.eval_path={eval_path}")
    assert both.warnings[1].startswith(f"warning: data.eval_path {eval_path}: 4 of its 4 prompts (100%) end with")
    quiet = _built(f"data.train_path={_chat_file(tmp_path, ending=17, name='few.jsonl')}")  # 85%: multi-turn
    assert quiet.warnings == [] and "warnings" not in quiet.summary
