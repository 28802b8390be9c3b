"""evaluate action: greedy decoding on the held-out set, scored by the campaign's rewards.

A completion is correct when its reward functions' weighted sum reaches the best its row allows
(``rewards.is_best``): with one binary reward, when it earns 1.0. ``accuracy`` is the fraction of
correct completions, ``reward_mean`` the mean reward. Reward models add to ``reward_mean`` but
define no best and play no part in ``accuracy``, so with reward models alone ``accuracy`` is 0
and ``reward_mean`` is the figure to watch.
Completions are scored, and recorded, as text without the tokenizer's special tokens
(``loading.completion_text``), as in training. Reward functions see ``trainer_state.global_step``
= the optimizer steps done, ``epoch`` 0.0.
"""

from __future__ import annotations

from actions.contracts import DecodeSettings, EvaluateRequest, EvaluateResult
from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.factory import load_engine, take_engine_events
from actions.models.loading import completion_text, encode_prompt, store_for
from actions.runtime.adapter import run_action
from actions.store import put_json
from actions.tasks.rewards import is_best
from actions.tasks.rewards.model_scoring import score_completions
from actions.tasks.stored import load_dataset


def run_evaluate(req: EvaluateRequest) -> EvaluateResult:
    engine, tokenizer, _ = load_engine(req.engine, req.model, **DecodeSettings.of(req).engine_options())
    rows = sorted(load_dataset(req.model.store_uri, req.dataset_key).values(), key=lambda r: r.prompt_id)
    specs = [SampleSpec(r.prompt_id, 0, encode_prompt(tokenizer, r)) for r in rows]
    greedy = GenerationParams(seed=0, step=0, max_new_tokens=req.max_new_tokens, temperature=0.0)
    outs, _ = engine.generate(specs, greedy)
    texts = [completion_text(tokenizer, o.tokens) for o in outs]
    ids = [list(o.tokens) + ([o.stop_token] if o.finish_reason == "stop" and o.stop_token is not None else [])
           for o in outs]
    rewards = score_completions(req, rows, texts, ids, req.model.store_uri)
    correct = is_best(rewards)
    put_json(store_for(req.model.store_uri), req.output_key,
             {"policy_version": req.model.policy_version,
              "items": [{"prompt_id": r.prompt_id, "completion": t, "correct": c}
                        for r, t, c in zip(rows, texts, correct)]})
    # as training's figures: a length counts the stop token, the mean reward only the rows some
    # reward applied to (actions/rl/batch.py, TRL's)
    scored = [t for t, applied in zip(rewards.total, rewards.applicable) if applied]
    return EvaluateResult(accuracy=sum(correct) / len(rows), mean_length=sum(map(len, ids)) / len(rows),
                          num_prompts=len(rows), reward_mean=sum(scored) / len(scored) if scored else 0.0,
                          reward_metrics={k: sum(v) / len(v) for k, v in rewards.metrics.items() if v},
                          engine_events=take_engine_events())


def main(args: dict) -> dict:
    return run_action(EvaluateRequest, run_evaluate, args)
