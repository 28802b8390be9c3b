"""Packing prompt + response pairs into one batch and reading per-token log-probs.

Layout: prompts are left-padded to a common width P and responses right-padded to T, so every
response token t sits in column ``P + t`` for all rows and its log-prob comes from the logits
at column ``P + t - 1``. A finished response ("stop") includes its EOS token: stopping is an
action the policy must learn. Position ids skip the padding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.utils.checkpoint

from actions.rl.head import head_logits, tempered


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [B, P + T]
    attention_mask: torch.Tensor  # [B, P + T]
    position_ids: torch.Tensor  # [B, P + T]
    response_mask: torch.Tensor  # [B, T] float, 1 on real response tokens
    prompt_width: int  # P

    @property
    def response_width(self) -> int:
        return self.response_mask.shape[1]

    def to(self, device: torch.device) -> PackedBatch:
        """The batch on ``device`` (packing happens on the host; models may live elsewhere)."""
        return PackedBatch(self.input_ids.to(device), self.attention_mask.to(device), self.position_ids.to(device),
                           self.response_mask.to(device), self.prompt_width)

    def select(self, idx: torch.Tensor) -> PackedBatch:
        return PackedBatch(self.input_ids[idx], self.attention_mask[idx], self.position_ids[idx],
                           self.response_mask[idx], self.prompt_width)


def pack(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int, *,
         prompt_width: int | None = None, response_width: int | None = None) -> PackedBatch:
    """Pack B (prompt, response) token lists; responses must be non-empty.

    By default P and T are the longest prompt and response of this batch. Fixed widths make
    every row's shape independent of its batch mates, and so its log-probs bit for bit: CPU and
    GPU kernels round a row differently for other padded widths (see ``per_row_widths``).

    Raises:
        ValueError: a prompt or response is longer than the fixed width asked for.
    """
    B = len(prompts)
    P = prompt_width or max(len(p) for p in prompts)
    T = response_width or max(1, max(len(r) for r in responses))
    if any(len(p) > P for p in prompts) or any(len(r) > T for r in responses):
        raise ValueError(f"prompt_width={P}/response_width={T} is shorter than a row "
                         f"({max(len(p) for p in prompts)}/{max(len(r) for r in responses)} tokens); "
                         "leave them unset, or take them from bucket_widths of the row's own lengths")
    ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + T), dtype=torch.long)
    rmask = torch.zeros((B, T), dtype=torch.float32)
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[b, P - len(p):P] = torch.tensor(list(p), dtype=torch.long)
        attn[b, P - len(p):P] = 1
        if r:
            ids[b, P:P + len(r)] = torch.tensor(list(r), dtype=torch.long)
            attn[b, P:P + len(r)] = 1
            rmask[b, :len(r)] = 1.0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return PackedBatch(ids, attn, pos, rmask, P)


LOGIT_CHUNK_ELEMENTS = 1 << 25
"""Most full-vocabulary logits (tokens x V) that exist at once in ``response_logprobs``: 128 MiB
in fp32, about 220 tokens at Qwen's V = 151,936 and every token of a tiny model's batch."""


def response_hidden(model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    """The decoder's last hidden states at the positions that predict each response token:
    ``[B, T, H]``. Runs the transformer without its output head (``model.<base_model_prefix>``),
    so no ``[B, P + T, V]`` logits are ever made."""
    decoder = getattr(model, model.base_model_prefix)
    out = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    P, T = batch.prompt_width, batch.response_width
    return out.last_hidden_state[:, P - 1:P + T - 1]


def _chunk_stats(model: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                 with_entropy: bool, temperature: float) -> torch.Tensor:
    """Per token of one chunk: log-prob of the target, and (no gradient) the entropy: ``[n, 2]``.

    ``log p(y) = logit_y - logsumexp(logits)``; ``H = logsumexp - sum softmax * logits``, over
    the logits of ``head.head_logits`` (the family's own head, divided by the temperature).
    """
    logits = head_logits(model, hidden, temperature)
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return torch.stack([logp, torch.zeros_like(logp)], dim=-1)
    with torch.no_grad():  # a metric: its graph would keep another copy of the logits
        entropy = lse.detach() - (torch.softmax(logits.detach(), dim=-1) * logits.detach()).sum(-1)
    return torch.stack([logp, entropy], dim=-1)


MIN_CHUNK_TOKENS = 16
"""Fewest tokens in a chunk of ``response_logprobs``: CPU matrix products of fewer than about
12 rows take other kernels (gemv, short-row tails) whose sums round differently, and a
token's log-prob must not depend on the chunk it falls in. ``tests/test_logprob_chunks.py``
checks the invariance."""


def chunk_bounds(num_tokens: int, step: int) -> list[tuple[int, int]]:
    """[start, stop) token ranges of ``max(step, MIN_CHUNK_TOKENS)`` tokens; a shorter tail
    joins the range before it."""
    step = max(step, MIN_CHUNK_TOKENS)
    starts = list(range(0, num_tokens, step))
    if len(starts) > 1 and num_tokens - starts[-1] < MIN_CHUNK_TOKENS:
        starts.pop()
    return [(s, e) for s, e in zip(starts, starts[1:] + [num_tokens])]


def response_logprobs(model: torch.nn.Module, batch: PackedBatch, *, with_entropy: bool = False,
                      chunk_elements: int = LOGIT_CHUNK_ELEMENTS, temperature: float = 1.0):
    """Per-token log-prob of the response under ``model``: [B, T] (0 on padding).

    With ``with_entropy`` also returns the per-token entropy [B, T] (a detached metric).
    ``temperature``: the generation temperature the responses were sampled at; the log-probs
    (and entropies) are of ``softmax(logits / temperature)`` (``head.py``: no top-k/top-p).

    Memory: the transformer runs once; the output head, the log-softmax and the entropy run
    over chunks of at most ``chunk_elements // V`` tokens, so no ``[B, T, V]`` tensor exists.
    With gradients enabled each chunk is checkpointed (its logits are recomputed in the
    backward pass), so a training step holds one chunk's logits at a time as well. A token's
    values do not depend on the chunk it falls in (every op is per token, and ``chunk_bounds``
    makes no chunk short enough to change the kernels).
    """
    hidden = response_hidden(model, batch)
    B, T, H = hidden.shape
    flat, targets = hidden.reshape(B * T, H), batch.input_ids[:, batch.prompt_width:].reshape(B * T)
    vocab = model.get_output_embeddings().weight.shape[0]
    checkpointed = torch.is_grad_enabled() and flat.requires_grad
    parts = []
    for start, stop in chunk_bounds(B * T, chunk_elements // vocab):
        args = (model, flat[start:stop], targets[start:stop], with_entropy, temperature)
        if checkpointed:
            parts.append(torch.utils.checkpoint.checkpoint(_chunk_stats, *args, use_reentrant=False))
        else:
            parts.append(_chunk_stats(*args))
    stats = torch.cat(parts).view(B, T, 2) * batch.response_mask[..., None]
    return (stats[..., 0], stats[..., 1]) if with_entropy else stats[..., 0]


def response_logprobs_full(model: torch.nn.Module, batch: PackedBatch, *, with_entropy: bool = False,
                           temperature: float = 1.0):
    """The naive reference of ``response_logprobs``: the model's full ``[B, P + T, V]`` logits
    from its own ``forward``, an fp32 ``[B, T, V]`` log-softmax and entropy over it. For tests
    and the memory benchmark."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    P, T = batch.prompt_width, batch.response_width
    logits = tempered(out.logits[:, P - 1:P + T - 1].float(), temperature)
    targets = batch.input_ids[:, batch.prompt_width:]
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * batch.response_mask
    if not with_entropy:
        return logp
    entropy = -(logp_all.exp() * logp_all).sum(-1) * batch.response_mask
    return logp, entropy


WIDTH_BUCKET = 16
"""Tokens a scored row's prompt and response widths are rounded up to (``per_row_widths``)."""

CUDA_ROW_BLOCK = 8
"""Rows of every scoring call on a CUDA device (``per_row_widths``)."""


def bucket_widths(prompt_len: int, response_len: int, bucket: int = WIDTH_BUCKET) -> tuple[int, int]:
    """(P, T) a row is padded to when scored: its own lengths rounded up to ``bucket``."""
    if bucket < 1:
        raise ValueError(f"bucket={bucket}: must be >= 1 token")
    return (bucket * max(1, math.ceil(prompt_len / bucket)), bucket * max(1, math.ceil(response_len / bucket)))


def per_row_widths(fns: Sequence[Callable[[PackedBatch], torch.Tensor]], prompts: Sequence[Sequence[int]],
                   responses: Sequence[Sequence[int]], pad_id: int, *, device: torch.device | None = None,
                   bucket: int = WIDTH_BUCKET, row_block: int | None = None,
                   each_call: Callable[[list[int]], AbstractContextManager] | None = None,
                   ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Evaluate per-token functions of B rows, each row padded to widths of its own.

    Rows are grouped by ``bucket_widths`` of their own lengths and each group is packed to
    exactly those widths, so a row is computed in the same shape whichever rows share its call.
    Kernels round a row differently for other padded widths (the softmax over keys, for one,
    sums over the padded width), so padding to the batch's longest row would make a sample's
    log-probs depend on how generation was split into shards. A fixed step-wide width would
    remove that too, but pads a shard of short responses to the longest one of the step.

    The number of rows can matter on a GPU as well: cuBLAS picks its kernel, and with it the
    order of a dot product's additions, by the matrix shapes, so a row's log-probs may change
    with the number of rows in its group. On CUDA every call therefore takes exactly
    ``CUDA_ROW_BLOCK`` rows, a group's last block topped up with copies of its first row (their
    outputs are dropped). CPU kernels compute a row the same way whatever the row count (the
    fan-out test checks weights bit for bit), so there a group is one call.

    Args:
        fns: each maps a packed group to a ``[b, T_group]`` tensor (log-probs, values), or
            ``[b, T_group, k]``; with gradients enabled the results carry them.
        prompts, responses: B token lists; responses must be non-empty.
        device: where the groups are packed to (the models' device); results come back there.
        row_block: rows per call, topped up as above; default ``CUDA_ROW_BLOCK`` on CUDA, else
            a whole group per call.
        each_call: given a call's rows (indices into ``prompts``, the top-up copies left out),
            a context the call's functions run in (the learner's seeded LoRA dropout masks,
            ``dropout.seeded_masks``); none by default.
    Returns:
        (one ``[B, T(, k)]`` float tensor per fn, zero past each row's group width; the ``[B, T]``
        response mask), ``T`` = the widest group's response width, rows in input order.
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        groups.setdefault(bucket_widths(len(p), len(r), bucket), []).append(i)
    width = max(t for _, t in groups)
    outs: list[torch.Tensor | None] = [None for _ in fns]
    mask = torch.zeros((len(prompts), width), device=device)
    if row_block is None and device is not None and torch.device(device).type == "cuda":
        row_block = CUDA_ROW_BLOCK
    for (pw, tw), group in sorted(groups.items()):
        block = row_block or len(group)
        for start in range(0, len(group), block):
            rows = group[start:start + block]
            padded = rows + [rows[0]] * (block - len(rows))
            packed = pack([prompts[i] for i in padded], [responses[i] for i in padded], pad_id,
                          prompt_width=pw, response_width=tw)
            packed = packed.to(device) if device is not None else packed
            index = torch.tensor(rows, device=device)
            mask[index, :tw] = packed.response_mask[:len(rows)]
            with each_call(rows) if each_call is not None else nullcontext():
                values = [fn(packed)[:len(rows)].float() for fn in fns]
            for k, value in enumerate(values):
                if outs[k] is None:  # [B, T] or [B, T, ...] as the function returns
                    outs[k] = torch.zeros((len(prompts), width, *value.shape[2:]), device=device)
                outs[k][index, :tw] = value  # index_put: differentiable when value needs grad
    return outs, mask  # type: ignore[return-value]
