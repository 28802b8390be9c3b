"""The completion text the rewards read: decoded without the tokenizer's special tokens, as TRL's
GRPOTrainer decodes it (``batch_decode(..., skip_special_tokens=True)``), so a special token the
model emits mid-answer does not reach the reward functions (tiny char model, CPU, seconds)."""

from __future__ import annotations

import importlib
import json

from actions.contracts import ModelRef
from actions.models.loading import completion_text, encode
from actions.models.modeling import build_char_tokenizer


def test_special_tokens_are_left_out_of_the_text():
    tok = build_char_tokenizer()  # <pad> 0, <eos> 1, <unk> 2
    ids = [*encode(tok, "ab"), tok.unk_token_id, *encode(tok, "c"), tok.pad_token_id]
    assert tok.decode(ids) == "ab<unk>c<pad>"
    assert completion_text(tok, ids) == "abc"


def test_score_action_rewards_the_text_without_a_special_token_mid_answer(tmp_path):
    from actions.store import put_json
    from actions.tasks.stored import load_dataset
    from tests.conftest import prepare_tiny

    cfg, store, p = prepare_tiny(tmp_path / "store", "runs/s")
    tok = build_char_tokenizer()
    row = min(load_dataset(store.uri, p.train_key).values(), key=lambda r: r.prompt_id)
    answer = list(encode(tok, row.answer))
    # the right answer with <unk> emitted after its first character, and the right answer as it is
    tokens = [answer[:1] + [tok.unk_token_id] + answer[1:], answer]
    put_json(store, "runs/s/roll.json", {"samples": [
        {"prompt_id": row.prompt_id, "sample_index": i, "tokens": t, "finish_reason": "stop"}
        for i, t in enumerate(tokens)]})
    ref = ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=p.init_key, policy_version=0)
    payload = {"policy": ref.model_dump(), "reference_key": p.init_key, "dataset_key": p.train_key,
               "rollout_keys": ["runs/s/roll.json"], "rewards": [{"name": "repeat"}],
               "algorithm": cfg.algorithm.model_dump(), "output_key": "runs/s/scored/manifest.json"}
    out = importlib.import_module("actions.score").main(json.loads(json.dumps(payload)))
    assert "error" not in out, out
    assert out["reward_sum"] == 2.0  # both earn the repeat reward: the <unk> is not part of the text
