"""evaluate action: greedy decoding on the held-out set, scored by the campaign's rewards.

A completion is correct when its reward reaches the best its row allows (``rewards.is_best``):
with one binary reward, when it earns 1.0. ``accuracy`` is the fraction of correct completions,
``reward_mean`` the mean reward.
"""

from __future__ import annotations

from actions.common.adapter import run_action
from actions.common.contracts import EvaluateRequest, EvaluateResult
from actions.common.loading import encode, store_for
from actions.common.store import put_json
from actions.engines.base import SampleSpec
from actions.engines.factory import load_engine
from actions.tasks.rewards import compute_rewards, is_best
from actions.tasks.stored import load_dataset


def run_evaluate(req: EvaluateRequest) -> EvaluateResult:
    engine, tokenizer, _ = load_engine(req.engine, req.model, kv_cache=req.kv_cache, cuda_graphs=req.cuda_graphs,
                                       compile_decode=req.compile_decode)
    rows = sorted(load_dataset(req.model.store_uri, req.dataset_key).values(), key=lambda r: r.prompt_id)
    specs = [SampleSpec(r.prompt_id, 0, encode(tokenizer, r.prompt)) for r in rows]
    outs, _ = engine.generate(specs, seed=0, step=0, max_new_tokens=req.max_new_tokens, temperature=0.0)
    texts = [tokenizer.decode(o.tokens) for o in outs]
    rewards = compute_rewards(req.rewards, rows, texts)
    correct = is_best(rewards)
    put_json(store_for(req.model.store_uri), req.output_key,
             {"policy_version": req.model.policy_version,
              "items": [{"prompt_id": r.prompt_id, "completion": t, "correct": c}
                        for r, t, c in zip(rows, texts, correct)]})
    return EvaluateResult(accuracy=sum(correct) / len(rows), mean_length=sum(len(o.tokens) for o in outs) / len(rows),
                          num_prompts=len(rows), reward_mean=sum(rewards.total) / len(rows))


def main(args: dict) -> dict:
    return run_action(EvaluateRequest, run_evaluate, args)
