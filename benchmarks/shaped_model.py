"""A random-weight model of a real shape whose completions have a chosen mean length, for
benchmarks that time generation and training on it (``bench_vs_trl.py --model-config``).

A random model almost never draws its stop token out of 151,936, and where its stop row is
merely scaled, its chance to stop hangs on the context: prompts that end alike then stop all at
once or never. So the model is made context-free (``make_context_free``), the stop token's row
shifted by one amount calibrated along sampled paths after the benchmark's own prompts
(``stop_trace``, ``calibrate_stop_shift``), and the result checked by sampling in the dtype the
systems run (``sampled_lengths``). Lengths then come out geometric around the mean asked for,
varying within every group of samples of a prompt, as a trained model's do.
"""

from __future__ import annotations

import json
from pathlib import Path

PREFLIGHT_PROMPTS = 16
"""Of the calibration prompts, those sampled once more in the systems' dtype (``sampled_lengths``)."""


class WorkloadRefused(Exception):
    """The model cannot give the completion lengths asked for: the message says what it gives."""


def length_problem(mean: float, mean_length: float, shortest: int | None = None,
                   longest: int | None = None) -> str | None:
    """Why completions of these lengths are not the workload asked for (None: they are): a
    mean under a tenth of ``mean_length`` (a step that generates next to nothing), over twice it
    (every completion near the limit), or, where the extremes are known, no spread at all
    (GRPO's groups need lengths that vary)."""
    if mean < mean_length / 10:
        return f"they averaged {mean:g} tokens, under a tenth of the {mean_length:g} asked for"
    if mean > 2 * mean_length:
        return f"they averaged {mean:g} tokens, over twice the {mean_length:g} asked for"
    if shortest is not None and shortest == longest:
        return f"every one was {shortest} tokens long: no spread"
    return None


def write_shaped_model(work: Path, config_json: str, prompts: list[str], mean_length: float, max_new_tokens: int,
                       device: str) -> Path:
    """A model folder of the shape ``config_json`` describes, random weights, the built-in BPE
    tokenizer, made context-free (``make_context_free``) and its stop token's chance set so that
    the expected completion length after ``prompts`` is ``mean_length`` tokens
    (``calibrate_stop_shift``). Checks the lengths by sampling in the systems' dtype
    (``sampled_lengths``).

    Raises:
        WorkloadRefused: no shift gives that mean (``calibrate_stop_shift``), or the sample in the
            systems' dtype is not the workload asked for (``length_problem``).
    """
    from flows.commands.tiny_model_dir import write_tiny_model_dir

    cfg = json.loads(Path(config_json).read_text())
    info = write_tiny_model_dir(
        work / "model", cfg["model_type"], vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
        num_kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
        intermediate_size=cfg["intermediate_size"], max_positions=min(cfg["max_position_embeddings"], 4096),
        tie_word_embeddings=cfg.get("tie_word_embeddings", True), chat_template=False)
    eos = info.eos_token_ids[0]
    make_context_free(info.path)
    trace = stop_trace(info.path, eos, prompts, max_new_tokens, device)
    try:
        shift = calibrate_stop_shift(trace, mean_length)
    except ValueError as exc:
        raise WorkloadRefused(str(exc)) from None
    rows = expected_lengths(trace, shift)
    shift_stop_row(info.path, eos, shift)
    sampled = sampled_lengths(info.path, eos, prompts[:PREFLIGHT_PROMPTS], max_new_tokens, device)
    print(json.dumps({"model": config_json, "stop_token": eos, "stop_shift": round(shift, 4),
                      "expected_length": round(float(rows.mean()), 2),
                      "row_expected_length": [round(float(x), 1) for x in (rows.min(), rows.median(), rows.max())],
                      "sampled_length": sampled}), flush=True)
    problem = length_problem(sampled["mean"], mean_length, sampled["min"], sampled["max"])
    if problem:  # what both systems would run: refuse before minutes go by
        raise WorkloadRefused(f"completions sampled in {sampled['dtype']} are not the workload: {problem}, where the "
                              f"calibration (fp32) expects {float(rows.mean()):.1f} (sampled_length above says how)")
    return info.path


CONSTANT_DIM = 0
"""The residual-stream dimension ``make_context_free`` fills with a constant."""


def _output_rows(tensors: dict) -> str:
    """The name of the matrix whose rows are the output head's (the embedding where tied)."""
    return "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"


def make_context_free(model_dir: Path) -> None:
    """Give every token's embedding the same large value ``C`` in dimension ``CONSTANT_DIM``
    (16 times the norm of an embedding row), and scale that dimension of the final norm's weight
    so it reaches the output head as about ``1 / C``. Every layer's normalised input is then
    dominated by that one constant, so the random model's next-token distribution hardly
    depends on the context, and the stop token's chance can be set once for every position and
    prompt (``shift_stop_row``): completion lengths come out geometric, varying within a group
    as a trained model's do. A random model's stop chance otherwise depends on the last prompt
    token, which the benchmark's prompts all share: scaling the stop token's row made every
    completion stop at its first token or none. The shapes, and so every FLOP and byte the two
    systems spend, are the config's; the output head's other rows gain the same ``C / C = 1``
    logit each, which the softmax ignores (and which keeps bf16 logits small)."""
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    embed = tensors["model.embed_tokens.weight"]
    hidden = embed.shape[1]
    c = 16.0 * float(embed.float().norm(dim=1).mean())
    embed[:, CONSTANT_DIM] = c
    if "lm_head.weight" in tensors:  # untied: the output rows carry the same constant
        tensors["lm_head.weight"][:, CONSTANT_DIM] = c
    norm = tensors["model.norm.weight"]
    norm[CONSTANT_DIM] = 1.0 / (c * hidden ** 0.5)  # the normalised constant is about sqrt(hidden)
    save_file(tensors, str(path), metadata={"format": "pt"})


def sampled_lengths(model_dir: Path, eos: int, prompts: list[str], max_new_tokens: int, device: str,
                    seed: int = 0) -> dict:
    """One completion per prompt, sampled as the two systems will sample it: Hugging Face
    ``generate`` in the systems' dtype (bf16 on a GPU, fp32 on the CPU), temperature 1, the whole
    vocabulary, left-padded. Returns the completion lengths' mean, min and max (the stop token
    included), the share of rows whose first token is the stop token, and whether the first
    position's logits were all finite: a check of the workload before either system runs, in
    the arithmetic they run it in, where the calibration ran in fp32."""
    import torch

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model, ids, mask, pos = _load_with_prompts(model_dir, eos, prompts, device, dtype)
    width = ids.shape[1]
    torch.manual_seed(seed)
    with torch.no_grad():
        first = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1].float()
        out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos)[:, width:]
    lengths = [row.index(eos) + 1 if eos in row else len(row) for row in out.tolist()]
    stop_first = sum(row[0] == eos for row in out.tolist())
    finite = bool(torch.isfinite(first).all())
    del model, out, first
    _release(device)
    return {"dtype": str(dtype).removeprefix("torch."), "mean": round(sum(lengths) / len(lengths), 2),
            "min": min(lengths), "max": max(lengths),
            "stop_first": round(stop_first / len(lengths), 3), "first_logits_finite": finite}


def stop_trace(model_dir: Path, eos: int, prompts: list[str], max_new_tokens: int, device: str, seed: int = 0):
    """Sample ``max_new_tokens`` tokens after each prompt (fp32, temperature 1, the stop token
    masked) and record, per step and row, the stop token's logit, the output head's input in
    ``CONSTANT_DIM`` and the log-sum-exp of every other logit: a ``[3, steps, rows]`` float64
    tensor.

    Adding ``d`` to the stop token's row in ``CONSTANT_DIM`` adds ``d`` times that input to its
    logit and changes nothing else until it is drawn (it is not in the context before), so a
    row's chance to stop at step t is ``sigmoid(logit_t + d * input_t - lse_t)`` along the very
    path it takes while it does not stop: one masked sampling run prices every shift."""
    import torch

    from actions.models.cache_name import cache_of, with_cache

    model, ids, mask, pos = _load_with_prompts(model_dir, eos, prompts, device, torch.float32)
    gen = torch.Generator(device).manual_seed(seed)
    stop, slope, rest = [], [], []
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, output_hidden_states=True)
        for _ in range(max_new_tokens):
            logits = out.logits[:, -1].double()
            stop.append(logits[:, eos].clone())
            slope.append(out.hidden_states[-1][:, -1, CONSTANT_DIM].double())  # after the final norm
            logits[:, eos] = float("-inf")
            rest.append(torch.logsumexp(logits, -1))
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
            mask = torch.cat([mask, mask.new_ones(len(ids), 1)], 1)
            pos = pos[:, -1:] + 1
            out = model(input_ids=nxt, attention_mask=mask, position_ids=pos, **with_cache(cache_of(out)),
                        use_cache=True, output_hidden_states=True)
    trace = torch.stack([torch.stack(stop), torch.stack(slope), torch.stack(rest)]).cpu()
    del model, out
    _release(device)
    return trace


def _load_with_prompts(model_dir: Path, eos: int, prompts: list[str], device: str, dtype):
    """The folder's model on ``device`` in ``dtype``, and ``prompts`` tokenized without special
    tokens, left-padded (with the pad token, else the stop token: masked either way): the
    model, ids and attention mask ``[rows, width]``, and positions counted over real tokens
    only (as ``generate`` numbers left-padded rows)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    enc = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(map(len, enc))
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in enc], device=device)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc], device=device)
    return model, ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _release(device: str) -> None:
    """Hand the freed device memory back to the driver: the calibration runs in the benchmark's
    own process, which stays alive beside the two systems' processes that share the device."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def expected_lengths(trace, shift: float):
    """Each row's expected completion length in tokens (the stop token included, at most the
    trace's steps) with ``shift`` added to the stop row's ``CONSTANT_DIM``:
    ``sum_t P(no stop before t)``."""
    import torch

    p = torch.sigmoid(trace[0] + shift * trace[1] - trace[2])  # [steps, rows]
    alive = torch.cumprod(1 - p, 0)
    return 1 + alive[:-1].sum(0)


def calibrate_stop_shift(trace, mean_length: float) -> float:
    """The shift of the stop row whose expected completion length, averaged over the trace's
    rows, is ``mean_length``: bisection (the length falls as the shift grows, the output head's
    input in ``CONSTANT_DIM`` being positive everywhere). Raises ValueError when the length
    asked for lies outside (1, steps), or the trace shows the constant did not dominate."""
    steps = trace.shape[1]
    if not 1 < mean_length < steps:
        raise ValueError(f"--mean-length {mean_length:g}: must lie between 1 and the {steps} new tokens allowed")
    if float(trace[1].min()) <= 0:
        raise ValueError(f"the output head's input in dimension {CONSTANT_DIM} went as low as "
                         f"{float(trace[1].min()):.3g}: the constant did not dominate the model's hidden states, "
                         "so no one shift sets every position's stop chance")

    def mean_at(shift: float) -> float:
        return float(expected_lengths(trace, shift).mean())

    lo, hi = 0.0, 1.0
    if mean_at(lo) < mean_length:
        raise ValueError(f"completions already average {mean_at(lo):.1f} tokens before any shift, under the "
                         f"--mean-length {mean_length:g} asked for")
    while mean_at(hi) > mean_length:
        lo, hi = hi, hi * 2
        if hi > 2.0 ** 40:
            raise ValueError(f"no shift of the stop row gives a mean length of {mean_length:g} tokens")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_at(mid) > mean_length else (lo, mid)
    return (lo + hi) / 2


def shift_stop_row(model_dir: Path, eos: int, shift: float) -> None:
    """Add ``shift`` to the stop token's output row (the embedding where tied) in
    ``CONSTANT_DIM``, in the folder's ``model.safetensors``."""
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    tensors[_output_rows(tensors)][eos, CONSTANT_DIM] += shift
    save_file(tensors, str(path), metadata={"format": "pt"})
