"""The reference the engines are checked against: one sample by plain uncached forwards.

No KV cache, no batching, no padding: each token is the shared sampling rule
(``actions.engines.sampling.sample_next``) applied to a full forward of prompt + tokens so far.
An engine that keeps the contract returns exactly these tokens.
"""

from __future__ import annotations

import torch

from actions.engines.base import SampleSpec
from actions.engines.sampling import sample_next, stream_key


def uncached_sample(model: torch.nn.Module, spec: SampleSpec, eos: int, max_new_tokens: int, *, seed: int,
                    step: int, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None) -> list[int]:
    """Response tokens (EOS excluded) of ``spec`` drawn with stream key (seed, step, prompt, sample),
    filtered by ``top_k`` / ``top_p`` (None: off)."""
    device = next(model.parameters()).device
    ids, out = list(spec.prompt_tokens), []
    key = torch.tensor([stream_key(seed, step, spec.prompt_id, spec.sample_index)], device=device)
    for t in range(max_new_tokens):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, -1]
        tok = int(sample_next(logits[None], key, torch.tensor([t], device=device), temperature, top_k, top_p)[0])
        if tok == eos:
            break
        ids.append(tok)
        out.append(tok)
    return out
