"""Activation recomputation for the learner (``model.gradient_checkpointing``)."""

from __future__ import annotations

import torch


def enable_checkpointing(model: torch.nn.Module, on: bool = True) -> None:
    """Recompute the transformer's activations in the backward pass, with the non-reentrant
    torch checkpoint (inputs need no ``requires_grad``; FSDP2 supports it)."""
    if not on:
        return
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
