"""The output head as a model family's own ``forward`` applies it, and the sampling temperature.

``sequences.response_logprobs`` runs the decoder and the output head apart (the head in
chunks), so whatever a family's ``ForCausalLM.forward`` does between the last hidden states
and the logits it returns must be done here too: otherwise the learner's log-probs are of
another distribution than the one the engines sample from (they sample from the model's own
``forward``). As in transformers 5.x:

* ``final_logit_softcapping`` set (Gemma 2/3, VaultGemma, nanochat, ...): ``cap * tanh(logits / cap)``
  (Gemma 3n, loaded whole: its text config's, as its ``forward`` reads it);
* Cohere, Cohere 2 (MoE): ``logits * logit_scale``;
* the Granite family: ``logits / logits_scaling``;
* HyperCLOVA X: ``logits * logits_scaling``;
* MiniCPM3: ``hidden / logits_scaling`` before the head;
* Falcon-H1: ``logits * lm_head_multiplier``;
* MPT: its config may carry ``logit_scale``, which transformers' MPT does not apply.

Each runs in the head's own dtype, as the family's ``forward`` does (in fp32 that is the
same bits; in bf16 it is what the sampler saw), and the result is cast to fp32. Any other
family whose config sets one of :data:`SCALE_FIELDS` to a value other than 1 is refused
(:func:`check_head`): its transform is unknown here, and silently leaving it out would train
on wrong log-probs.

Temperature (``generation.temperature``): the sampler draws from ``softmax(logits / T)``
(``actions/engines/sampling.py``), so the learner's log-probs -- the old policy's, the
reference's and the trained ones -- are of that distribution too, as TRL's GRPO and verl
compute them (both divide the policy's and the reference's logits by the temperature). They
are of the full tempered distribution: top-k/top-p filters (``generation.top_k``/``top_p``)
are not applied, as in TRL and verl. ``T == 1`` divides nothing (the fp32 bits of the usual
run stay as they were); ``T == 0`` (greedy decoding, no distribution to match) is read as 1.
"""

from __future__ import annotations

import torch

DIVIDE_BY_LOGITS_SCALING = frozenset({"granite", "granite_swa", "granitemoe", "granitemoe_swa", "granitemoehybrid",
                                      "granitemoeshared"})
MULTIPLY_BY_LOGITS_SCALING = frozenset({"hyperclovax"})
HIDDEN_DIVIDED_BY_LOGITS_SCALING = frozenset({"minicpm3"})
MULTIPLY_BY_LOGIT_SCALE = frozenset({"cohere", "cohere2", "cohere2_moe"})
MULTIPLY_BY_LM_HEAD_MULTIPLIER = frozenset({"falcon_h1"})
SOFTCAP_IN_TEXT_CONFIG = frozenset({"gemma3n"})
"""Composite models whose ``forward`` soft-caps with their text config's ``final_logit_softcapping``."""
IGNORED_SCALE = frozenset({"mpt"})
"""Families whose config carries a scale field their transformers ``forward`` does not apply."""

KNOWN = (DIVIDE_BY_LOGITS_SCALING | MULTIPLY_BY_LOGITS_SCALING | HIDDEN_DIVIDED_BY_LOGITS_SCALING
         | MULTIPLY_BY_LOGIT_SCALE | MULTIPLY_BY_LM_HEAD_MULTIPLIER | IGNORED_SCALE)
SCALE_FIELDS = ("logits_scaling", "logit_scale", "lm_head_multiplier", "output_multiplier")
"""Config fields that scale the logits in some family's ``forward``."""


def _number(config: object, name: str) -> float | None:
    value = getattr(config, name, None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def check_head(config: object) -> None:
    """Refuse a family whose output head this module does not reproduce.

    Raises:
        ValueError: the config sets a logit scale (one of :data:`SCALE_FIELDS`) other than 1
            and its ``model_type`` is none of the families listed in this module's docstring.
    """
    family = getattr(config, "model_type", None)
    if family in KNOWN:
        return
    for name in SCALE_FIELDS:
        value = _number(config, name)
        if value is not None and value != 1:
            raise ValueError(f"model config {name}={value} (model_type {family!r}): the learner does not know how "
                             f"{family!r}'s forward applies {name} to its logits, so its log-probs would be wrong; "
                             "use a model family listed in actions/rl/head.py, or add this one there")


def head_logits(model: torch.nn.Module, hidden: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The fp32 logits of ``hidden`` [n, H] as ``model``'s own forward computes them (see the
    module docstring), divided by ``temperature`` unless it is 1 or 0."""
    config = model.config
    family = getattr(config, "model_type", None)
    check_head(config)
    if family in HIDDEN_DIVIDED_BY_LOGITS_SCALING:
        hidden = hidden / config.logits_scaling
    logits = model.get_output_embeddings()(hidden)
    if family in DIVIDE_BY_LOGITS_SCALING:
        logits = logits / config.logits_scaling
    elif family in MULTIPLY_BY_LOGITS_SCALING:
        logits = logits * config.logits_scaling
    elif family in MULTIPLY_BY_LOGIT_SCALE:
        logits = logits * config.logit_scale
    elif family in MULTIPLY_BY_LM_HEAD_MULTIPLIER:
        logits = logits * config.lm_head_multiplier
    cap = getattr(config.get_text_config() if family in SOFTCAP_IN_TEXT_CONFIG else config,
                  "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return tempered(logits.float(), temperature)


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature``, or ``logits`` itself at 1 (the usual run's bits stay as they
    were) and at 0 (greedy decoding: no distribution to match, read as 1)."""
    return logits if temperature in (0.0, 1.0) else logits / temperature
