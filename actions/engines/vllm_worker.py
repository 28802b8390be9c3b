"""Code that runs inside vLLM's worker: the token draw and the weight loader.

vLLM imports these by name (``logits_processors=[FQCN]``, ``worker_extension_cls=FQCN``), in
its engine-core process when multiprocessing is on. The module imports vLLM at the top, so
only ``vllm_engine.VllmEngine`` (after its own lazy import check) should reference it.

* ``CounterNoiseLogitsProcessor`` makes vLLM draw tokens exactly as the torch engine does:
  requests run with vLLM temperature 0 (greedy argmax), and this processor -- applied before
  the argmax because it is not argmax-invariant -- draws each sampling row's token with
  ``sampling.Sampler.draw`` (``argmax(filter(logits / T) + G(key, t))`` with the sample's
  stream key and response position ``t``; ``filter``: the request's top-k / top-p), fused
  where the engine says so (``generation.fused_sampling``), and leaves the row's logits at 0
  for that token and -inf for every other, so vLLM's argmax takes it. vLLM's own seeded
  generators are not used: their state cannot be advanced to position ``t``, so a cut sample
  could not resume its stream.
* ``WorkerExtension.load_safetensors(path)`` reads a safetensors file in the worker and
  feeds it to the model runner's in-place ``reload_weights`` (tensors do not survive
  ``collective_rpc`` arguments, a path the worker reads itself does);
  ``WorkerExtension.prepare_draws(vocab_size)`` compiles the fused draw at engine start;
  ``WorkerExtension.fused_modules()`` names the modules vLLM fuses (what a push must keep whole,
  ``vllm_push.py``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from safetensors.torch import load_file
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from actions.engines.sampling import Sampler, fused_draw

KEY_ARG = "rlhfless_key"  # SamplingParams.extra_args: the sample's stream key (int64)
OFFSET_ARG = "rlhfless_offset"  # tokens generated before this request (a continuation)
TEMPERATURE_ARG = "rlhfless_temperature"  # the real temperature; vLLM's own is 0
TOP_K_ARG = "rlhfless_top_k"  # top-k filter (None: off); vLLM's own is off
TOP_P_ARG = "rlhfless_top_p"  # top-p filter (None: off); vLLM's own is off
FUSED_ARG = "rlhfless_fused"  # draw through the compiled kernel (sampling.fused_for, decided by the engine)


class _Row(NamedTuple):
    key: int  # stream key
    offset: int  # tokens generated before this request
    temperature: float
    top_k: int | None
    top_p: float | None
    fused: bool
    output_tokens: list[int]  # vLLM's live output token list of the request


class CounterNoiseLogitsProcessor(LogitsProcessor):
    """Gumbel-max sampling with counter-based noise (see ``sampling.py``)."""

    def __init__(self, vllm_config: object, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _Row] = {}  # batch row -> its sampling state

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token greedy argmax picks, so it must run before it

    @staticmethod
    def _new_row(params: Any, _prompt: list[int] | None, output_tokens: list[int]) -> _Row | None:
        args = params.extra_args or {}
        if KEY_ARG not in args or args.get(TEMPERATURE_ARG, 0.0) <= 0.0:
            return None  # plain greedy: no noise, and the argmax survives any filter
        return _Row(int(args[KEY_ARG]), int(args.get(OFFSET_ARG, 0)), float(args[TEMPERATURE_ARG]),
                    args.get(TOP_K_ARG), args.get(TOP_P_ARG), bool(args.get(FUSED_ARG, False)), output_tokens)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, self._new_row)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        idx = sorted(i for i in self.rows if i < logits.shape[0])
        dev = logits.device
        state = [self.rows[i] for i in idx]
        keys = torch.tensor([r.key for r in state], dtype=torch.int64, device=dev)
        # ``output_tokens`` is vLLM's live list for the request: its length is the number of
        # tokens this request has sampled so far, i.e. the position of the one drawn now.
        pos = torch.tensor([r.offset + len(r.output_tokens) for r in state], dtype=torch.int64, device=dev)
        rows = torch.tensor(idx, device=dev)
        drawn = torch.empty(len(idx), dtype=torch.int64, device=dev)
        samplers = [Sampler(r.temperature, r.top_k, r.top_p, r.fused) for r in state]
        # one draw per distinct setting (usually one), on the rows' logits as the torch engine's
        # decode step sees them; the noise is built where the logits are, and only the row keys
        # and positions cross from the host
        for sampler in dict.fromkeys(samplers):
            sel = torch.tensor([j for j, s in enumerate(samplers) if s == sampler], device=dev)
            # every row of the batch (the usual case): draw from the logits as they are, no gather
            part = logits if len(sel) == logits.shape[0] else logits[rows[sel]]
            drawn[sel] = sampler.draw(part, keys[sel], pos[sel])
        logits[rows] = float("-inf")
        logits[rows, drawn] = 0.0  # vLLM's argmax then takes the drawn token
        return logits


class WorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); called via collective_rpc."""

    def prepare_draws(self, vocab_size: int) -> None:
        """Compile the fused draw over ``vocab_size`` entries on the model's device now, at
        engine start, rather than inside the first decode step that draws fused."""
        device = next(self.model_runner.model.parameters()).device  # type: ignore[attr-defined]
        fused_draw.prepare(vocab_size, device)

    def fused_modules(self) -> dict[str, list[str]]:
        """The model's fused modules: vLLM's module name -> the checkpoint modules loaded into
        it (``packed_modules_mapping``, e.g. ``qkv_proj``: ``q_proj``, ``k_proj``, ``v_proj``)."""
        packed = getattr(self.model_runner.model, "packed_modules_mapping", None) or {}  # type: ignore[attr-defined]
        return {name: list(members) for name, members in packed.items()}

    def load_safetensors(self, paths: list[str]) -> int:
        """Load every tensor of these safetensors files into the running model in one reload
        (a layer is repacked once all its tensors arrived); returns the tensor count."""
        tensors: dict[str, torch.Tensor] = {}
        for path in paths:
            tensors.update(load_file(path))
        # ``reload_weights`` (not ``model.load_weights``): on the CPU backend the linear layers
        # hold prepacked copies and an emptied ``weight`` after loading; the in-place reload
        # restores the checkpoint layout, loads, and reruns the packing.
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()),  # type: ignore[attr-defined]
                                         is_checkpoint_format=True)
        _repack_tied_heads(self.model_runner.model)  # type: ignore[attr-defined]
        return len(tensors)


def _repack_tied_heads(model: torch.nn.Module) -> None:
    """Rebuild the kernel of an LM head tied to the input embedding.

    The in-place reload processes a tied parameter for one owner only (vLLM's reload
    "Limitations" 2): the embedding gets the new weight, but on the CPU backend the head's
    prepacked GEMM still holds the old one. No-op on CUDA, where the head reads the weight.
    """
    heads = [m for m in model.modules() if isinstance(m, ParallelLMHead)]
    embeddings = {id(m.weight) for m in model.modules()
                  if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)}
    for head in heads:
        if id(head.weight) in embeddings:
            head.quant_method.process_weights_after_loading(head)
