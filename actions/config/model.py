"""The model section of the workload: the policy's weights (a local Hugging Face folder or
the tiny default), its dtype and, optionally, LoRA adapters (``model.lora``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from actions.config.quoting import quote
from actions.config.section import HomePath
from actions.config.section import Section as _Section


class LoraConfig(_Section):
    """LoRA adapters (PEFT) over a frozen backbone: what ``model.lora`` sets. The backbone is
    the policy at version 0 (after warm-up), stored once; each policy version is the adapter
    alone (``docs/scale.md``)."""

    r: int = 16
    """Rank of each adapter (>= 1)."""
    alpha: float = Field(32.0, gt=0)
    """Scale numerator: an adapter adds ``(alpha / r) * B @ A`` to its layer's weight."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input while training."""
    target_modules: Literal["all-linear"] | list[str] = "all-linear"
    """Module names the adapters wrap (a name matches a module whose path ends with it, e.g.
    ``q_proj``), or ``all-linear``: every linear layer except the output head."""
    bias: Literal["none", "all", "lora_only"] = "none"
    """Which biases train with the adapter (PEFT's ``bias``); anything but ``none`` changes the
    backbone, so it needs ``algorithm.kl_coef: 0`` (the reference is the backbone)."""

    @field_validator("r", mode="before")
    @classmethod
    def _refuse_bool_r(cls, v: Any) -> Any:
        if isinstance(v, bool):  # an int to pydantic: `r: true` would be a rank-1 adapter
            raise ValueError(f"model.lora.r={v} is not a rank; set an integer >= 1 (e.g. 8 or 16)")
        return v

    @field_validator("r")
    @classmethod
    def _check_r(cls, v: int) -> int:
        # after conversion, so that 0.0, "0" and "-3" are refused as 0 and -3 are
        if v <= 0:
            raise ValueError(f"model.lora.r={v} is not a rank; set an integer >= 1 (e.g. 8 or 16), or remove "
                             "model.lora for full fine-tuning")
        return v

    @field_validator("target_modules", mode="before")
    @classmethod
    def _check_target_kind(cls, v: Any) -> Any:
        # before the union's own check, whose complaint names its members' types, not the fix
        if v == "all-linear" or (isinstance(v, (list, tuple)) and all(isinstance(t, str) for t in v)):
            return v
        raise ValueError(f"model.lora.target_modules={quote(v)} is neither all-linear nor a list of module names; "
                         "set all-linear, or list the names (e.g. [q_proj, v_proj])")

    @field_validator("target_modules")
    @classmethod
    def _check_targets(cls, v: Any) -> Any:
        if isinstance(v, list) and not [t for t in v if t.strip()]:
            raise ValueError("model.lora.target_modules=[] names no module; list module names (e.g. [q_proj, v_proj]) "
                             "or use all-linear")
        return v


class ModelConfig(_Section):
    path: HomePath | None = None
    """Local Hugging Face model directory (``~`` expands); None builds the tiny default from the fields below."""
    hidden_size: int = Field(96, ge=8)
    """The tiny default model (``path`` unset; with a folder, this and the four below are not
    used, but stay part of the run's identity): width of its residual stream."""
    num_layers: int = Field(2, ge=1)
    """The tiny default model: transformer layers."""
    num_heads: int = Field(4, ge=1)
    """The tiny default model: attention heads (``hidden_size / num_heads`` must be a whole, even number)."""
    intermediate_size: int = Field(256, ge=8)
    """The tiny default model: width of its MLP."""
    max_positions: int = Field(256, ge=16)
    """The tiny default model: longest sequence (prompt + response, tokens) it can hold."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """What actions compute in: ``auto`` is bfloat16 on CUDA and float32 on the CPU (or
    ``RLHFLESS_DTYPE`` where the action's environment sets it). Training in bfloat16/float16
    keeps fp32 master weights in the optimizer state and publishes weights in this dtype. Reward
    models (``reward.models``) score in ``auto``'s dtype (or ``RLHFLESS_DTYPE``), whatever this says."""
    gradient_checkpointing: bool = False
    """Recompute the transformer's activations in the backward pass (less memory, ~30% more
    training compute); the weights come out the same."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of every weight; None (absent): full fine-tuning."""

    @model_validator(mode="after")
    def _check_tiny_heads(self) -> ModelConfig:
        """The tiny default's heads split its width evenly into an even head dimension (rotary
        embeddings rotate pairs): refused here, not by transformers inside the prepare action."""
        if self.path is None and (self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2):
            step = 2 * self.num_heads
            below, above = self.hidden_size // step * step, (self.hidden_size // step + 1) * step
            sizes = " or ".join(str(h) for h in (below, above) if h >= 8)
            raise ValueError(f"model.hidden_size={self.hidden_size} with model.num_heads={self.num_heads} gives a head "
                             f"dimension of {self.hidden_size / self.num_heads:g}; it must be a whole, even number "
                             f"(the tiny model's rotary embeddings rotate pairs): use model.hidden_size={sizes}, or "
                             "other model.num_heads")
        return self
