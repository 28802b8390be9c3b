"""prefill action: compute each unique prefix's KV once and store it as a KV bundle.

The flow picks the prefix length L (planning/prefix.py: the largest L whose unique prefixes
fit the prefill capacity). This action tokenizes the step's prompts, cuts them at L, runs each
unique prefix through the policy exactly once, and publishes the KV tensors plus the logits
after each prefix. Generation actions load the bundle and compute only the prompt suffix.
The bundle is keyed by policy version: KV computed by other weights is never reused.
"""

from __future__ import annotations

from actions.contracts import PrefillRequest, PrefillResult
from actions.engines.factory import make_engine
from actions.engines.kv_bundle import publish_bundle
from actions.models.loading import encode_prompt, load_model, store_for
from actions.runtime.adapter import run_action
from actions.tasks.stored import load_dataset, rows_for


def run_prefill(req: PrefillRequest) -> PrefillResult:
    model, tokenizer, _ = load_model(req.model)
    rows = rows_for(load_dataset(req.model.store_uri, req.dataset_key), req.prompt_ids)
    prefixes = list(dict.fromkeys(encode_prompt(tokenizer, r)[: req.prefix_len] for r in rows))
    engine = make_engine("torch", model, tokenizer)
    states, computed = engine.prefill(prefixes)
    publish_bundle(store_for(req.model.store_uri), req.output_key, states, req.model.policy_version)
    return PrefillResult(bundle_key=req.output_key, num_unique_prefixes=len(states), tokens_computed=computed)


def main(args: dict) -> dict:
    return run_action(PrefillRequest, run_prefill, args)
