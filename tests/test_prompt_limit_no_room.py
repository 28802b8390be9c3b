"""The refusal of a ``data.max_prompt_tokens`` that does not fit the context names a fix that
works: a smaller prompt limit where one fits, otherwise a shorter response or a longer context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.config import load_config


def _limit(*overrides: str) -> int | None:
    from actions.tasks.input_limits import prompt_token_limit

    return prompt_token_limit(load_config(None, list(overrides)).workload())


@pytest.mark.parametrize("new", [512, 600])
def test_responses_that_fill_the_context_are_not_fixed_by_a_smaller_prompt_limit(tmp_path: Path, new: int):
    """A model folder of 512 positions (``rlhfless tiny-model``'s default) with responses of the
    whole context or more: no prompt limit fits, so the message says so and names the fixes that
    do, with the context the configured sample needs."""
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    with pytest.raises(ValueError) as info:
        _limit(f"model.path={tmp_path}", "data.max_prompt_tokens=768", f"generation.max_new_tokens={new}")
    message = str(info.value)
    assert message.startswith(f"data.max_prompt_tokens=768 plus generation.max_new_tokens={new} is {768 + new} "
                              "tokens, above the model's context of 512 (config.json of model.path ")
    assert "no smaller data.max_prompt_tokens fits" in message
    assert "lower data.max_prompt_tokens to" not in message and "a smaller value" not in message
    assert message.endswith(f"lower generation.max_new_tokens below 512, or point model.path at a model with a "
                            f"context of {768 + new} tokens or more (`rlhfless tiny-model --out DIR "
                            f"--max-positions {768 + new}` writes a tiny one)")


def test_without_a_model_folder_the_fix_raises_the_key_that_sets_the_context():
    """The built-in tiny model's context is ``model.max_positions``, the vLLM engine's can be
    ``generation.vllm.max_model_len``: the message raises that key to what the sample needs."""
    with pytest.raises(ValueError, match=r"above the model's context of 256 \(model.max_positions\); generation."
                                         r"max_new_tokens alone leaves no room for a prompt there, so no smaller "
                                         r"data.max_prompt_tokens fits: lower generation.max_new_tokens below 256, "
                                         r"or raise model.max_positions to 600 or more$"):
        _limit("data.max_prompt_tokens=300", "generation.max_new_tokens=300")
    with pytest.raises(ValueError, match=r"above generation.vllm.max_model_len=100; .* lower "
                                         r"generation.max_new_tokens below 100, or raise "
                                         r"generation.vllm.max_model_len to 228 or more$"):
        _limit("generation.engine=vllm", "generation.vllm.max_model_len=100", "data.train_path=x.jsonl",
               "data.max_prompt_tokens=128", "generation.max_new_tokens=100")


def test_where_a_smaller_prompt_limit_fits_the_message_still_names_it():
    """Responses shorter than the context: the largest prompt limit that fits is the fix."""
    with pytest.raises(ValueError, match=r"is 600 tokens, above the model's context of 512 \(model.max_positions\); "
                                         r"lower data.max_prompt_tokens to at most 212, or lower "
                                         r"generation.max_new_tokens$"):
        _limit("model.max_positions=512", "data.max_prompt_tokens=300", "generation.max_new_tokens=300")
