"""The torch engine and the actions on a CUDA device (marker ``gpu``; skipped without CUDA).

The same contract as on the CPU: cached decoding equals plain uncached forwards, and dedup,
cut-and-continue and splitting a batch across calls change the cost, never the tokens. The
CPU and the GPU compute the same logits up to float round-off; the actions run end to end
with ``RLHFLESS_DEVICE=cuda`` and publish host tensors. Run with ``make test-gpu``.
"""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from reference_sampler import uncached_sample

from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.torch_engine import TorchEngine
from actions.models.loading import encode
from actions.models.modeling import build_tiny_model
from actions.tasks.repeat import make_rows

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SEED, STEP, NEW = 11, 3, 12


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny_model(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                                  max_positions=256, seed=0)
    rows = make_rows(4, max_count=6, seed=1)
    specs = [SampleSpec(r.prompt_id, i, encode(tok, r.prompt)) for r in rows for i in range(4)]
    return model.eval(), tok, specs


def _by_id(outs):
    return {(o.prompt_id, o.sample_index): (o.tokens, o.finish_reason) for o in outs}


def _qwen2_gqa_on_cuda():
    """(model, tokenizer): a Qwen2 shape with grouped KV heads (4 query, 2 KV), fp32, on CUDA."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from actions.models.modeling import build_char_tokenizer

    tok = build_char_tokenizer("")
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval().to("cuda"), tok


def _engine(model, tok):
    return TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)


def test_cuda_engine_matches_uncached_reference(tiny):
    model, tok, specs = tiny
    gpu = model.to("cuda")
    params = GenerationParams(seed=SEED, step=STEP, max_new_tokens=NEW, temperature=1.0)
    outs, _ = _engine(gpu, tok).generate(specs, params)
    for o, s in zip(outs, specs):
        assert o.tokens == uncached_sample(gpu, s, tok.eos_token_id, NEW, seed=SEED, step=STEP), s
    model.to("cpu")


def test_cuda_dedup_split_and_cut_reproduce_the_plain_run(tiny):
    model, tok, specs = tiny
    engine = _engine(model.to("cuda"), tok)
    kw = {"seed": SEED, "step": STEP, "max_new_tokens": NEW, "temperature": 1.0}
    plain = _by_id(engine.generate(specs, GenerationParams(dedup=False, **kw))[0])
    deduped, stats = engine.generate(specs, GenerationParams(dedup=True, **kw))
    assert _by_id(deduped) == plain
    assert stats.prefill_tokens * 4 == sum(len(s.prompt_tokens) for s in specs)  # n = 4 share a prompt
    split = {}
    for part in (specs[:5], specs[5:11], specs[11:]):  # uneven fan-out
        split.update(_by_id(engine.generate(part, GenerationParams(**kw))[0]))
    assert split == plain
    # Cut right after the earliest finishing step (a stop at decode step len(tokens), a length
    # stop at NEW - 1), so the samples still running then are cut and continued.
    ends = [len(t) if r == "stop" else NEW - 1 for t, r in plain.values()]
    first_done = sum(e == min(ends) for e in ends)
    assert first_done < len(specs), "every sample ends in the same step; nothing to cut"
    first, _ = engine.generate(specs, GenerationParams(cut_after=first_done, **kw))
    cut = [o for o in first if o.finish_reason == "cut"]
    assert len(cut) == len(specs) - first_done
    resumed = [SampleSpec(o.prompt_id, o.sample_index, s.prompt_tokens, tuple(o.tokens))
               for o, s in zip(first, specs) if o.finish_reason == "cut"]
    rest, _ = engine.generate(resumed, GenerationParams(**kw))
    merged = {**_by_id(o for o in first if o.finish_reason != "cut"), **_by_id(rest)}
    assert merged == plain
    model.to("cpu")


def test_cuda_and_cpu_compute_the_same_logits(tiny):
    model, tok, specs = tiny
    states_cpu, _ = _engine(model.to("cpu"), tok).prefill([s.prompt_tokens for s in specs[::4]])
    states_gpu, _ = _engine(model.to("cuda"), tok).prefill([s.prompt_tokens for s in specs[::4]])
    for a, b in zip(states_cpu, states_gpu):
        torch.testing.assert_close(b.last_logits.cpu(), a.last_logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b.kv[0][0].cpu(), a.kv[0][0], atol=1e-4, rtol=1e-4)
    model.to("cpu")


def test_cuda_scoring_does_not_depend_on_batch_mates(tiny):
    """A row's log-probs on CUDA are the same bits whichever rows share its width group."""
    from functools import partial

    from actions.rl.sequences import CUDA_ROW_BLOCK, per_row_widths, response_logprobs

    model, tok, _ = tiny
    gpu = model.to("cuda")
    gen = torch.Generator().manual_seed(5)
    n = 2 * CUDA_ROW_BLOCK + 3  # one width group over three blocks, the last one topped up
    prompts = [torch.randint(3, 30, (int(torch.randint(17, 33, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(n)]
    responses = [torch.randint(3, 30, (int(torch.randint(33, 49, (1,), generator=gen)),), generator=gen).tolist()
                 for _ in range(n)]
    logp = partial(response_logprobs, gpu)
    cuda = torch.device("cuda")
    with torch.no_grad():
        (everyone,), _ = per_row_widths([logp], prompts, responses, tok.pad_token_id, device=cuda)
        (few,), _ = per_row_widths([logp], prompts[3:6], responses[3:6], tok.pad_token_id, device=cuda)
        (alone,), _ = per_row_widths([logp], prompts[-1:], responses[-1:], tok.pad_token_id, device=cuda)
    assert torch.equal(everyone[3:6], few) and torch.equal(everyone[-1:], alone)
    model.to("cpu")


def test_bf16_engine_generates_on_cuda(tiny):
    model, tok, specs = tiny
    half = build_tiny_model(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                            max_positions=256, seed=0)[0].to("cuda", torch.bfloat16).eval()
    params = GenerationParams(seed=SEED, step=STEP, max_new_tokens=NEW, temperature=1.0)
    outs, _ = _engine(half, tok).generate(specs, params)
    assert [(o.prompt_id, o.sample_index) for o in outs] == [(s.prompt_id, s.sample_index) for s in specs]
    assert all(len(o.tokens) <= NEW and o.finish_reason in ("stop", "length") for o in outs)


def _call(name, payload):
    result = importlib.import_module(f"actions.{name}").main(json.loads(json.dumps(payload)))
    assert "error" not in result, result
    return result


def test_actions_round_trip_on_cuda(tmp_path, monkeypatch):
    """generate -> score -> train_step with RLHFLESS_DEVICE=cuda: the same rollouts as on the
    CPU up to round-off, and a train step that moves every parameter and stores host tensors."""
    from actions.contracts import ModelRef
    from actions.engines.torch_slot import close_torch_slot
    from actions.models import warm
    from actions.prepare import prepare
    from actions.store import LocalStore
    from actions.store.weights import load_tensors, publish_tensors
    from flows.config import load_config
    from tests.conftest import TINY_OVERRIDES

    cfg = load_config(None, [*TINY_OVERRIDES, f"store.uri={tmp_path}"])
    store = LocalStore(tmp_path)
    p = prepare(cfg, store, "runs/g")
    # fp32 explicitly (model.dtype auto is bf16 on CUDA): the rollouts are compared with the CPU's.
    ref = ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=p.init_key, policy_version=0, dtype="float32")
    gen_payload = {"model": ref.model_dump(), "dataset_key": p.train_key, "run_seed": 0, "step": 0,
                   "shard": "gen-0", "prompt_ids": [0, 1, 2, 3], "group_size": 4, "max_new_tokens": 8,
                   "temperature": 1.0}
    cpu = _call("generate", {**gen_payload, "output_key": "runs/g/roll-cpu.json"})
    monkeypatch.setenv("RLHFLESS_DEVICE", "cuda")
    gen = _call("generate", {**gen_payload, "output_key": "runs/g/roll.json"})
    same = sum(a == b for a, b in zip(cpu["samples"], gen["samples"]))
    assert same >= 0.9 * len(gen["samples"]), f"only {same}/{len(gen['samples'])} samples agree with the CPU"
    score = _call("score", {"policy": ref.model_dump(), "reference_key": p.init_key, "dataset_key": p.train_key,
                            "rollout_keys": [gen["rollout_key"]], "rewards": [{"name": "repeat"}],
                            "algorithm": cfg.algorithm.model_dump(), "output_key": "runs/g/scored/manifest.json"})
    tensors, meta = load_tensors(store, score["scored_key"])
    assert all(t.device.type == "cpu" for t in tensors.values())
    tensors["rewards"] = torch.tensor([1.0, 0.0] * 8)  # mixed rewards: every parameter gets a gradient
    publish_tensors(store, "runs/g/scored2/manifest.json", tensors, meta)
    train = _call("train_step", {"policy": ref.model_dump(), "optimizer_key": None,
                                 "scored_keys": ["runs/g/scored2/manifest.json"],
                                 "algorithm": cfg.algorithm.model_dump(), "seed": 0, "step": 0,
                                 "output_prefix": "runs/g/train"})
    before, _ = load_tensors(store, p.init_key)
    after, _ = load_tensors(store, train["policy_key"])
    assert [k for k in before if torch.equal(before[k], after[k])] == []
    # the same inputs train the same weights, bit for bit (fan-out invariance needs it)
    again = _call("train_step", {"policy": ref.model_dump(), "optimizer_key": None,
                                 "scored_keys": ["runs/g/scored2/manifest.json"],
                                 "algorithm": cfg.algorithm.model_dump(), "seed": 0, "step": 0,
                                 "output_prefix": "runs/g/train-again"})
    after2, _ = load_tensors(store, again["policy_key"])
    assert [k for k in after if not torch.equal(after[k], after2[k])] == []
    assert all(torch.isfinite(torch.tensor(v)) for v in train["metrics"].values())
    warm.clear()  # leave no CUDA models in the process-wide warm cache
    close_torch_slot()  # nor in the generation slot


def test_warmup_trains_on_cuda_in_bf16_and_publishes_what_generate_loads(tmp_path, monkeypatch):
    """RLHFLESS_DEVICE=cuda with model.dtype auto: the warm-up's steps run on the GPU in
    bfloat16, and policy v0 is stored (host tensors) in bfloat16, exactly what the other
    actions load."""
    import actions.warmup as warmup
    from actions.contracts import ModelRef, WarmupRequest
    from actions.models import warm
    from actions.models.loading import load_model
    from actions.prepare import prepare
    from actions.store import LocalStore
    from actions.store.weights import load_tensors
    from flows.config import load_config
    from tests.conftest import TINY_OVERRIDES

    cfg = load_config(None, [*TINY_OVERRIDES, f"store.uri={tmp_path}"])
    store = LocalStore(tmp_path)
    p = prepare(cfg, store, "runs/w")
    seen = []
    forward = warmup.response_logprobs

    def spy(model, packed):
        param = next(model.parameters())
        seen.append((param.device.type, param.dtype, packed.input_ids.device.type))
        return forward(model, packed)

    monkeypatch.setattr(warmup, "response_logprobs", spy)
    monkeypatch.setenv("RLHFLESS_DEVICE", "cuda")
    req = WarmupRequest(store_uri=store.uri, base_key=p.base_key, init_key=p.init_key, dataset_key=p.train_key,
                        output_key="runs/w/policy/v000000/manifest.json", warmup=cfg.warmup, task="repeat", seed=0,
                        gradient_checkpointing=True)
    res = warmup.run_warmup(req)
    assert seen == [("cuda", torch.bfloat16, "cuda")] * cfg.warmup.steps
    stored, _ = load_tensors(store, res.policy_key)
    assert {(t.device.type, t.dtype) for t in stored.values()} == {("cpu", torch.bfloat16)}
    model, _, _ = load_model(ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=res.policy_key,
                                      policy_version=0, weights_sha256=res.weights_sha256))
    loaded = model.state_dict()
    assert [n for n, t in stored.items() if not torch.equal(loaded[n].cpu(), t)] == []
    warm.clear()  # leave no CUDA models in the process-wide warm cache


def test_cuda_graph_path_equals_eager_static_and_dynamic_paths_fp32(tiny):
    """fp32 on CUDA: graph replay runs the eager static step's kernels, so the tokens are equal;
    the dynamic path agrees too. A warm second call replays without capturing."""
    from actions.engines.static_decode import runtime_for

    model, tok, specs = tiny
    gpu = model.to("cuda")
    kw = {"seed": SEED, "step": STEP, "max_new_tokens": NEW, "temperature": 1.0}

    def run(**opts):
        engine = TorchEngine(gpu, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, **opts)
        outs, stats = engine.generate(specs, GenerationParams(**kw))
        return _by_id(outs), stats

    graphs, gstats = run(cuda_graphs="on")
    assert gstats.kv_cache == "static+graphs", gstats
    assert runtime_for(gpu).captures > 0
    assert runtime_for(gpu).graph_error is None
    assert run(cuda_graphs="off")[0] == graphs
    assert run(kv_cache="dynamic", cuda_graphs="off")[0] == graphs
    again, astats = run(cuda_graphs="on")
    assert again == graphs and astats.graph_captures == 0  # warm: replayed, not captured
    model.to("cpu")


def test_cuda_graphs_with_grouped_heads_and_shrinking_buckets_fp32():
    """A Qwen2-shaped model with grouped KV heads; rows finish at different steps, so the
    batch shrinks through several graph buckets (idle rows, compaction)."""
    model, tok = _qwen2_gqa_on_cuda()
    rows = make_rows(8, max_count=9, seed=5)
    specs = [SampleSpec(r.prompt_id, i, encode(tok, r.prompt)) for r in rows for i in range(5)]  # 40 rows
    kw = {"seed": SEED, "step": STEP, "max_new_tokens": 24, "temperature": 1.0}
    outs = {}
    for opts in ({"cuda_graphs": "on"}, {"cuda_graphs": "off"}, {"kv_cache": "dynamic"}):
        engine = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, **opts)
        outs[str(opts)] = _by_id(engine.generate(specs, GenerationParams(**kw))[0])
    first = next(iter(outs.values()))
    assert all(o == first for o in outs.values())
    lengths = {len(t) for t, _ in first.values()}
    assert len(lengths) > 3, "rows all ended together; no bucket was left"


def test_speculative_rounds_on_cuda_graphs_equal_plain_decoding_fp32():
    """fp32 on CUDA: verification rounds replayed as graphs (every column drawn in the round)
    keep exactly plain decoding's tokens, with right, ragged and wrong history drafts; a warm
    second call replays the captured rounds."""
    from actions.engines.speculative import Speculation

    model, tok = _qwen2_gqa_on_cuda()
    rows = make_rows(6, max_count=9, seed=5)
    specs = [SampleSpec(r.prompt_id, i, encode(tok, r.prompt)) for r in rows for i in range(4)]  # 24 rows
    kw = {"seed": SEED, "step": STEP, "max_new_tokens": 24, "temperature": 1.0}
    engine = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, cuda_graphs="on")
    plain = _by_id(engine.generate(specs, GenerationParams(**kw))[0])
    other = _by_id(engine.generate(specs, GenerationParams(**{**kw, "step": STEP + 1}))[0])
    right = {}
    for (pid, _), (toks, _) in sorted(plain.items()):
        right.setdefault(pid, []).append(toks[:6] if pid % 2 else toks)  # odd prompts run out: ragged
    wrong = {}
    for (pid, _), (toks, _) in sorted(other.items()):
        wrong.setdefault(pid, []).append(toks)
    for hist, k in ((right, 6), (wrong, 4), (right, 3)):
        spec = Speculation(history=hist, fixed=("history", k))
        outs, stats = engine.generate(specs, GenerationParams(**kw), speculation=spec)
        assert _by_id(outs) == plain, k
        assert stats.kv_cache == "static+graphs" and stats.spec["spec_rounds"] > 0, stats
    assert engine.call_rates is not None  # a pipelined plain loop: whole calls are compared (spec_guard)
    again, astats = engine.generate(specs, GenerationParams(**kw), speculation=Speculation(history=right,
                                                                                             fixed=("history", 6)))
    assert _by_id(again) == plain and astats.graph_captures == 0  # warm: every round replayed


def test_compiled_step_on_cuda_graphs_compiles_a_few_times_and_keeps_the_tokens_fp32():
    """``compile_decode`` on CUDA: the step compiled with the batch and the window symbolic and
    replayed as CUDA graphs, over calls whose rows shrink through several buckets and one that
    crosses into a second window. A few compilations in all (static shapes made one per bucket
    and window), and in fp32 at least 90% of rows draw the eager graph path's tokens (fused
    kernels may round differently). Slow: ``gpu_check.sh`` runs it in part ``compiled``."""
    import torch._dynamo.utils

    from actions.engines.static_decode import runtime_for

    model, tok = _qwen2_gqa_on_cuda()
    eager = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, cuda_graphs="on")
    compiled = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, cuda_graphs="on",
                           compile_decode=True)
    frames = torch._dynamo.utils.counters["stats"]
    before = frames["unique_graphs"]
    for n, group, new in ((8, 5, 24), (3, 3, 300)):  # 40 rows, then 9 rows past 256 columns
        rows = make_rows(n, max_count=9, seed=5)
        specs = [SampleSpec(r.prompt_id, i, encode(tok, r.prompt)) for r in rows for i in range(group)]
        params = GenerationParams(seed=SEED, step=STEP, max_new_tokens=new, temperature=1.0)
        want = _by_id(eager.generate(specs, params)[0])
        got, stats = compiled.generate(specs, params)
        got = _by_id(got)
        assert sum(got[k] == want[k] for k in want) >= 0.9 * len(want), new
        assert stats.kv_cache == "static+graphs"
    rt = runtime_for(model, compiled=True)
    assert rt.compiled and rt.graph_error is None and rt.kv.cols >= 512
    assert frames["unique_graphs"] - before <= 4, frames["unique_graphs"] - before


def test_compiled_step_with_flex_attention_keeps_the_tokens_fp32(monkeypatch, fresh_compiles):
    """``flex`` decode attention (flex attention's Triton kernel over the written key/value
    blocks) in the compiled step on CUDA graphs: it compiles per batch bucket with the window
    symbolic, inductor lowers every flex call to its split-KV decoding kernel (its own
    ``_use_flex_decoding`` says so, the caches off so that it is asked), the step replays
    without falling back, and in fp32 at least 90% of rows draw the tokens of the eager graph
    path on ``sdpa`` (another order of additions may flip a near-tie), over shrinking buckets
    and across a window, warm calls included. Uncompiled flex is refused on CUDA. Slow:
    ``gpu_check.sh`` runs it in part ``compiled``."""
    from torch._inductor.kernel.flex import flex_attention as flex_lowering

    from actions.engines.static_decode import runtime_for

    decoding: list[bool] = []
    choose = flex_lowering._use_flex_decoding

    def recorded(*args, **kwargs) -> bool:
        decoding.append(choose(*args, **kwargs))
        return decoding[-1]

    monkeypatch.setattr(flex_lowering, "_use_flex_decoding", recorded)  # asked: compiled afresh (fresh_compiles)
    model, tok = _qwen2_gqa_on_cuda()
    with pytest.raises(ValueError, match="runs fused only in the compiled step"):
        TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, decode_attention="flex")
    calls = []
    for n, group, new in ((8, 5, 24), (3, 3, 300), (8, 5, 24)):  # the last call warm: replayed
        rows = make_rows(n, max_count=9, seed=5)
        specs = [SampleSpec(r.prompt_id, i, encode(tok, r.prompt)) for r in rows for i in range(group)]
        calls.append((specs, GenerationParams(seed=SEED, step=STEP, max_new_tokens=new, temperature=1.0)))
    eager = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, cuda_graphs="on")
    wants = [_by_id(eager.generate(specs, params)[0]) for specs, params in calls]
    # after the eager calls, so that one runtime (buffers, graphs) serves every flex call
    flex = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, cuda_graphs="on",
                       compile_decode=True, decode_attention="flex")
    for (specs, params), want in zip(calls, wants):
        got, stats = flex.generate(specs, params)
        got = _by_id(got)
        assert sum(got[k] == want[k] for k in want) >= 0.9 * len(want), params.max_new_tokens
        assert stats.kv_cache == "static+graphs"
    assert stats.graph_captures == 0  # the warm call replayed what the first captured
    rt = runtime_for(model, compiled=True, attention="flex")
    assert rt.compiled and rt.graph_error is None and rt.kv.cols >= 512
    assert decoding and all(decoding), decoding  # inductor's choice, per flex call it lowered
