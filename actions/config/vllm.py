"""``generation.vllm``: the vLLM engine's context and memory (``generation.engine: vllm``).

The keys are ``vllm.LLM``'s own arguments, passed as they are to every engine the campaign's
actions start (``actions/engines/vllm_engine.py``); None leaves the engine's default. The
preflight (``actions/engines/preflight.py``) refuses a ``max_model_len`` above the model's
context and, where the KV cache's size is known before the engine starts, one that cannot
hold a single sequence of ``max_model_len`` tokens; the prompt-length limit of the datasets
counts ``max_model_len`` as the context (``actions/tasks/input_limits.py``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from actions.config.section import Section

CPU_KV_CACHE_BYTES = 1 << 30
"""The KV cache of an engine on the CPU backend where neither memory key is set: vLLM's own
sizing (a share of the NUMA node less this process's memory) fails for a second engine in one
process, and costs a warm-up pass."""


class VllmConfig(Section):
    max_model_len: int | None = Field(None, ge=2)
    """Longest sequence the engine holds, prompt plus response, in tokens. None: the model's
    context (``max_position_embeddings``). At most the model's context; a prompt longer than it
    less ``generation.max_new_tokens`` is one ``data.max_prompt_tokens`` refuses (or truncates,
    or skips). Lower it where the KV cache cannot hold one sequence of the model's full context."""
    kv_cache_memory_bytes: int | None = Field(None, ge=1)
    """Bytes of KV cache each engine reserves; it takes precedence over
    ``gpu_memory_utilization``. None: on the CPU backend ``CPU_KV_CACHE_BYTES`` (1 GiB) unless
    ``gpu_memory_utilization`` is set; on CUDA, what ``gpu_memory_utilization`` leaves after the
    weights and activations."""
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """Share of the device's memory one engine may take, weights, activations and KV cache
    together (on the CPU backend, of the NUMA node's memory). None: vLLM's default, 0.9. Every
    engine takes its own share: where several local-pool workers start engines on one GPU
    (engine affinity keeps them to the generation fan-out), and the learner trains on it too,
    their shares must add up to less than 1 (docs/vllm.md, "Memory and context")."""

    def llm_kwargs(self) -> dict[str, Any]:
        """``vllm.LLM`` keyword arguments: the keys that are set."""
        return self.model_dump(exclude_none=True)
