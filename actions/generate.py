"""generate action: sample ``group_size`` responses per prompt for one shard of the step.

A shard is either fresh prompts (``prompt_ids`` x ``group_size`` samples) or continuations of
cut samples (``partial_keys``). The action starts from the KV bundle when one is given,
deduplicates the rest of the prompt prefill inside the shard (``engine: vllm`` ignores the
bundle and deduplicates through vLLM's prefix cache), and stops early when
``cut_after`` samples have finished: the unfinished ones are written as partial samples for a
continuation action, and the activation returns so its billed time ends.

Output (``output_key``): JSON ``{"samples": [{prompt_id, sample_index, tokens,
finish_reason, stop_token}], "policy_version"}`` for finished samples (``stop_token``: the EOS
id a stopped sample emitted); cut samples go to
``output_key + ".partial"``.
"""

from __future__ import annotations

from actions.contracts import DecodeSettings, GenerateRequest, GenerateResult, PartialSample, SampleStat
from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.factory import load_engine, take_engine_events
from actions.engines.kv_bundle import load_bundle
from actions.engines.speculative import Speculation
from actions.models.device import action_device
from actions.models.loading import encode_prompt, store_for
from actions.runtime.adapter import run_action
from actions.store import get_json, put_json
from actions.store.drafts import read_drafts
from actions.tasks.stored import load_dataset, rows_for


def _specs(req: GenerateRequest, tokenizer: object) -> list[SampleSpec]:
    store = store_for(req.model.store_uri)
    dataset = load_dataset(req.model.store_uri, req.dataset_key)
    encoded: dict[int, tuple[int, ...]] = {}  # a group's samples share their prompt's tokens

    def prompt_tokens(prompt_id: int) -> tuple[int, ...]:
        if prompt_id not in encoded:
            encoded[prompt_id] = encode_prompt(tokenizer, dataset[prompt_id])
        return encoded[prompt_id]

    specs = [
        SampleSpec(row.prompt_id, i, prompt_tokens(row.prompt_id))
        for row in rows_for(dataset, req.prompt_ids)
        for i in range(req.group_size)
    ]
    for key in req.partial_keys:
        for p in (PartialSample.model_validate(x) for x in get_json(store, key)):
            specs.append(SampleSpec(p.prompt_id, p.sample_index, prompt_tokens(p.prompt_id), tuple(p.tokens)))
    return specs


def _speculation(req: GenerateRequest, store: object) -> Speculation | None:
    """What the engine may draft with; None for plain decoding (``speculation: off``, vLLM)."""
    if req.speculation == "off" or req.engine != "torch":
        return None
    history: dict[int, list[list[int]]] = {}
    if "history" in req.draft_strategies:
        wanted = set(req.prompt_ids) | {p.prompt_id for k in req.partial_keys
                                        for p in (PartialSample.model_validate(x) for x in get_json(store, k))}
        history = read_drafts(store, req.draft_keys, wanted)
    return Speculation(strategies=tuple(req.draft_strategies), max_draft_len=req.max_draft_len, history=history,
                       priors=dict(req.spec_priors))


def run_generate(req: GenerateRequest) -> GenerateResult:
    engine, tokenizer, _ = load_engine(req.engine, req.model, **DecodeSettings.of(req).engine_options())
    store = store_for(req.model.store_uri)
    specs = _specs(req, tokenizer)
    # vLLM cannot import KV tensors; its prefix cache deduplicates the prompts instead.
    use_bundle = req.kv_bundle_key is not None and req.engine == "torch"
    prefixes = (load_bundle(store, req.kv_bundle_key, req.model.policy_version, device=action_device())
                if use_bundle else None)  # on the model's device (load_model), copied there once
    params = GenerationParams(seed=req.run_seed, step=req.step, max_new_tokens=req.max_new_tokens,
                              temperature=req.temperature, dedup=req.dedup_prefill, cut_after=req.cut_after,
                              top_k=req.top_k, top_p=req.top_p)
    outs, stats = engine.generate(specs, params, prefixes=prefixes, speculation=_speculation(req, store))
    done = [o for o in outs if o.finish_reason != "cut"]
    cut = [o for o in outs if o.finish_reason == "cut"]
    put_json(store, req.output_key, {
        "policy_version": req.model.policy_version,
        "samples": [{"prompt_id": o.prompt_id, "sample_index": o.sample_index, "tokens": o.tokens,
                     "finish_reason": o.finish_reason}
                    | ({"stop_token": o.stop_token} if o.stop_token is not None else {}) for o in done],
    })
    partial_key = None
    if cut:
        partial_key = req.output_key + ".partial"
        put_json(store, partial_key, [PartialSample(prompt_id=o.prompt_id, sample_index=o.sample_index,
                                                    tokens=o.tokens).model_dump() for o in cut])
    return GenerateResult(
        shard=req.shard, kind="continuation" if req.partial_keys else "first",
        rollout_key=req.output_key,
        samples=[SampleStat(prompt_id=o.prompt_id, sample_index=o.sample_index, length=len(o.tokens),
                            finish_reason=o.finish_reason) for o in outs],
        partial_key=partial_key,
        num_cut=len(cut),
        prefill_tokens=stats.prefill_tokens,
        prefill_tokens_naive=sum(len(s.prompt_tokens) + len(s.generated) for s in specs),
        decode_steps=stats.decode_steps,
        kv_bundle_used=prefixes is not None,
        spec=stats.spec,
        engine_events=take_engine_events(),
        kv_cache=stats.kv_cache,
        graph_captures=stats.graph_captures,
        graph_capture_s=stats.graph_capture_s,
    )


def main(args: dict) -> dict:
    return run_action(GenerateRequest, run_generate, args)
