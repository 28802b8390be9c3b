"""The static decode step through ``torch.compile`` (``generation.compile_decode``).

How the step compiles depends on the runtime's attention (``static_forward.ATTENTIONS``):

* ``sdpa``: the batch and the window symbolic. One compilation serves every batch bucket and
  window of a warm container, where static shapes compiled each (bucket, window) anew (tens
  of seconds apiece on a GPU); the compiler still specialises a batch of 1 and a window that
  spans the whole buffer, about three in all.
* ``flex``: the batch (and every buffer) fixed, the window symbolic -- the shapes inductor's
  split-KV decoding kernel needs (``static_forward``). The window reaches the compiler as the
  length of a slice of ``DecodeRuntime.spans`` (a tensor no step writes) marked dynamic; a
  window that spans the whole buffer specialises (flex attention's shape check pins it), so up
  to two compilations per batch bucket.

Compilations are keyed by batch bucket (flex), window specialisation, buffer size, sampler and
model shape, over the process's life and for every runtime (they share this code), so the
compiler's recompilation limit is raised to room for all a warm container meets. The step is
compiled as one graph (``fullgraph``): past that limit the call raises, where the compiler
would otherwise run the step eagerly without a word (for flex, its unfused reference, many
times slower on a GPU); the runtime turns the raise into one warning and eager ``sdpa`` steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from actions.engines.sampling import Sampler


class CompiledStep:
    """``DecodeRuntime._step`` through ``torch.compile`` (module docstring). Calling it runs one
    step of rows ``[0, b)``; a compiler failure raises. ``rt``: the ``static_decode.DecodeRuntime``
    it steps (not imported here: that module imports this one)."""

    def __init__(self, rt: Any, recompile_limit: int) -> None:
        from torch._dynamo import config as dynamo_config

        dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, recompile_limit)
        self.rt = rt
        self.flex = rt.forward.attention == "flex"
        if self.flex:
            self.fn = torch.compile(self._flex_step, dynamic=False, fullgraph=True)
        else:
            self.fn = torch.compile(rt._step, dynamic=True, fullgraph=True)

    def __call__(self, b: int, window: int, sampling: Sampler, dense: bool = False) -> None:
        if self.flex:
            from torch._dynamo import maybe_mark_dynamic

            span = self.rt.spans[:window]
            maybe_mark_dynamic(span, 0)
            return self.fn(b, span, sampling)
        return self.fn(b, window, sampling, dense)

    def _flex_step(self, b: int, span: torch.Tensor, sampling: Sampler) -> None:
        """``_step`` over a window of ``span``'s length: every shape fixed but that length."""
        self.rt._step(b, span.shape[0], sampling)
