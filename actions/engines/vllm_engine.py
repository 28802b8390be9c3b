"""The vLLM generation engine: the ``GenerationEngine`` contract on top of ``vllm.LLM``.

How the contract maps onto vLLM (0.32, V1 engine):

* **One request per sample** (``n=1``), not one ``n=group_size`` request per prompt: every
  sample needs its own stream key, and a cut sample must resume on its own. The n requests of
  a prompt share its prefill through automatic prefix caching (APC), so ``n=1`` costs no
  extra prompt compute. vLLM's ``n > 1`` would also forbid temperature 0.
* **Same sampling as the torch engine.** Requests run with vLLM temperature 0 (argmax) and
  ``vllm_worker.CounterNoiseLogitsProcessor`` draws each token before the argmax with the torch
  engine's ``sampling.Sampler`` (counter-based Gumbel noise, key = ``stream_key(seed, step,
  prompt_id, sample_index)``, position = response position; fused into one compiled kernel
  where ``generation.fused_sampling`` says so, decided from the model's vocabulary, sent with
  each request, and compiled before the first fused step: ``use_fused_sampling``). A sample's
  tokens are therefore a function of its identity and its logits only, which gives
  determinism, fan-out invariance and exact cut-then-continue reproduction, and equal logits
  give the torch engine's tokens. Top-k / top-p filtering runs in the same processor
  (``sampling.filter_logits``), not in vLLM's sampler, which sees temperature 0 and would skip
  its own filters. vLLM's
  per-request ``seed`` is *not* used: its generator cannot be advanced to position ``t``, so
  a continuation could not resume the stream.
  Float caveat: batched kernels can round a logit differently when the batch differs, which
  could flip a near-tie; on the CPU backend the contract tests see identical tokens.
* **Dedup is APC.** Prefix caching is always on; identical prompt blocks are computed once,
  including between requests scheduled in the same step. ``dedup=False`` sets
  ``skip_reading_prefix_cache`` per request. ``prefill_tokens`` = prompt tokens minus
  ``num_cached_tokens``. APC works on whole KV blocks (CPU: 128 tokens by default, any
  multiple of 32 via ``block_size``), so shorter shared prefixes get no hits. KV bundles
  from the prefill action (``prefixes``) are ignored: vLLM has no API to import KV.
* **Cut.** With ``cut_after = m`` the call drives ``LLMEngine.step()`` itself, stops after the
  step in which the m-th sample finished, aborts the rest and returns them as "cut" with the
  tokens received so far. The engine core runs in-process by default
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): every request is queued before the first step and
  each ``step()`` is one scheduler step, so where the cut falls is deterministic.
* **New policy versions** go into the running engine: ``load_policy`` writes or names a
  safetensors file, each worker reads it and reloads in place (``collective_rpc``), then the
  prefix cache is reset because cached KV belongs to the old weights.

vLLM is imported lazily: this module imports without it; building a ``VllmEngine`` without
it raises ``ImportError`` naming the install route.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from actions.config.vllm import CPU_KV_CACHE_BYTES
from actions.engines.base import EngineStats, GenerationParams, SampleOut, SampleSpec
from actions.engines.preflight import INSTALL_HINT, vllm_available  # noqa: F401 (vllm_available: re-exported)
from actions.engines.sampling import Sampler, check_fused_sampling, fused_for, stream_key
from actions.engines.vllm_push import check_push, checkpoint_shapes

_PROCESSOR = "actions.engines.vllm_worker:CounterNoiseLogitsProcessor"
_EXTENSION = "actions.engines.vllm_worker.WorkerExtension"


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return vllm


_MEMORY_WORDS = ("available memory", "memory utilization", "memory for kv", "kv cache", "out of memory",
                 "gpu_memory_utilization", "kv-cache-memory-bytes")
"""Lower-case words of vLLM 0.32's refusals to start for memory (its CPU worker's node checks, the
KV cache's one-sequence check, CUDA's out of memory)."""
_MEMORY_KEYS = ("kv_cache_memory_bytes", "gpu_memory_utilization", "max_model_len")


def _short_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception it was raised from is vLLM refusing to start for memory."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (MemoryError, torch.OutOfMemoryError)) or any(
                w in str(seen).lower() for w in _MEMORY_WORDS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _memory_advice(exc: BaseException, llm_kwargs: Mapping[str, Any], cpu: bool) -> str:
    """One line for an engine that did not start for memory: vLLM's words (which name its own
    flags) and the ``generation.vllm`` keys that change what it reserves."""
    given = [f"{k}={llm_kwargs[k]}" for k in _MEMORY_KEYS if k in llm_kwargs]
    if cpu and not {"kv_cache_memory_bytes", "gpu_memory_utilization"} & llm_kwargs.keys():
        given.append(f"KV cache the CPU default of {CPU_KV_CACHE_BYTES} bytes")
    if cpu and os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        given.append(f"VLLM_CPU_KVCACHE_SPACE={os.environ['VLLM_CPU_KVCACHE_SPACE']} GiB over both memory keys")
    memory = "the CPU memory node" if cpu else "the GPU"
    return (f"the vLLM engine did not start for memory (generation.vllm: {', '.join(given) or 'the defaults'}): "
            f"{' '.join(str(exc).split())} -- set generation.vllm.kv_cache_memory_bytes to KV cache bytes {memory} "
            "has free (it takes precedence over gpu_memory_utilization); or raise "
            "generation.vllm.gpu_memory_utilization where the KV cache got too little (the engine process's own "
            f"memory comes out of that share of {memory}), lower it where {memory} has less free; or lower "
            "generation.vllm.max_model_len (the KV cache must hold one sequence of it)")


class VllmEngine:
    """A running ``vllm.LLM`` on a local model directory, plus the policy version it holds.

    Args:
        model_dir: Hugging Face model directory (``config.json`` + ``*.safetensors``); no
            tokenizer is needed (prompts are token ids).
        eos_id: the end-of-sequence id, or every such id; each ends a sample and is never part
            of ``tokens``.
        policy_version: the version whose weights ``model_dir`` holds.
        in_process: run vLLM's engine core in this process (deterministic cut points).
        fused_sampling: ``auto``, ``on`` or ``off``: how the noise processor draws until
            ``use_fused_sampling`` says otherwise.
        **llm_kwargs: passed to ``vllm.LLM`` over the defaults below (e.g. ``block_size``,
            ``max_model_len``, ``kv_cache_memory_bytes``, ``gpu_memory_utilization``, ``dtype``,
            ``enable_sleep_mode`` on CUDA; ``generation.vllm`` sets the memory and context ones).
            On the CPU backend the KV cache is ``CPU_KV_CACHE_BYTES`` unless one of the two
            memory arguments is given.

    Raises:
        ValueError: vLLM refused to start for memory; the message keeps vLLM's and names the
            ``generation.vllm`` keys to change (vLLM's own names its flags).
    """

    def __init__(self, model_dir: str | os.PathLike[str], *, eos_id: int | Sequence[int], policy_version: int = 0,
                 in_process: bool = True, fused_sampling: str = "auto", **llm_kwargs: Any) -> None:
        check_fused_sampling(fused_sampling)  # an unknown setting fails here, before vLLM starts
        vllm = _import_vllm()
        if in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        cpu = not torch.cuda.is_available()
        kwargs: dict[str, Any] = dict(
            model=str(model_dir), skip_tokenizer_init=True, enable_prefix_caching=True, seed=0,
            logits_processors=[_PROCESSOR], worker_extension_cls=_EXTENSION,
        )
        if cpu:
            kwargs.update(
                # fp32 like the torch engine (vLLM's CPU default turns fp32 checkpoints into bf16).
                dtype="float32",
                # Eager: torch.compile costs more start-up time than a small model ever saves.
                enforce_eager=True,
            )
            if not {"kv_cache_memory_bytes", "gpu_memory_utilization"} & llm_kwargs.keys():
                # an explicit size: vLLM's own fails for a second engine in one process
                kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        kwargs.update(llm_kwargs)
        try:
            self.llm = vllm.LLM(**kwargs)
        except Exception as exc:
            if not _short_of_memory(exc):
                raise
            raise ValueError(_memory_advice(exc, llm_kwargs, cpu)) from exc
        self.dtype: torch.dtype = self.llm.llm_engine.model_config.dtype  # what it computes and caches KV in
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        self.max_model_len: int = self.llm.llm_engine.model_config.max_model_len  # prompt + response, tokens
        # what a push must match (vllm_push.check_push): the checkpoint the engine started from
        self._checkpoint = checkpoint_shapes(sorted(Path(model_dir).glob("*.safetensors")))
        self._fused: dict[str, list[str]] = self.llm.collective_rpc("fused_modules")[0]
        self._tied_head = bool(getattr(self.llm.llm_engine.model_config.hf_config, "tie_word_embeddings", False))
        self.fused_sampling = False
        self.use_fused_sampling(fused_sampling)
        self.eos_ids = (eos_id,) if isinstance(eos_id, int) else tuple(eos_id)
        self.eos_id = self.eos_ids[0]
        self.policy_version = policy_version
        self._scratch = Path(tempfile.mkdtemp(prefix="rlhfless-vllm-weights-"))
        self._remove_scratch = weakref.finalize(self, shutil.rmtree, self._scratch, True)  # also at exit
        self._lock = threading.Lock()  # vllm.LLM is not thread-safe; the warm pool may share it
        self._num_calls = 0

    # ------------------------------------------------------------------ generate
    def generate(
        self,
        samples: list[SampleSpec],
        params: GenerationParams,
        *,
        prefixes: Mapping[tuple[int, ...], Any] | None = None,
        speculation: Any = None,
        ignore_eos: bool = False,
    ) -> tuple[list[SampleOut], EngineStats]:
        """See ``base.GenerationEngine.generate``; ``prefixes`` and ``speculation`` are ignored
        (module docstring): vLLM's own speculative decoding is set when the engine is built.
        ``params.top_k`` / ``params.top_p`` go to the noise processor, not to vLLM's sampler (which
        runs greedy). ``ignore_eos``: every sample runs to ``max_new_tokens`` (the profiler's
        fixed-length runs)."""
        with self._lock:
            return self._generate(samples, params, Sampler(params.temperature, params.top_k, params.top_p), ignore_eos)

    def _generate(self, samples: list[SampleSpec], params: GenerationParams, sampling: Sampler,
                  ignore_eos: bool = False) -> tuple[list[SampleOut], EngineStats]:
        from vllm.inputs import TokensPrompt

        self._check_fits(samples, params.max_new_tokens)
        results: list[SampleOut | None] = [None] * len(samples)
        index: dict[str, int] = {}  # request id -> sample position
        self._num_calls += 1
        try:
            for i, s in enumerate(samples):
                budget = params.max_new_tokens - len(s.generated)
                if budget <= 0:  # a continuation that already has every token it may have
                    results[i] = SampleOut(s.prompt_id, s.sample_index, list(s.generated), "length")
                    continue
                rid = f"c{self._num_calls}-{i}"
                request = self._params(s, params, budget, sampling, streaming=params.cut_after is not None,
                                       ignore_eos=ignore_eos)
                self.llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=list(s.prompt_tokens + s.generated)),
                                                request)
                index[rid] = i
        except BaseException:
            # Requests queued before the refused one would otherwise run in the next call, whose
            # outputs they would join under request ids it does not know.
            if index:
                self.llm.llm_engine.abort_request(list(index))
            raise
        received, cached, num_steps = self._drive(samples, results, index, params.cut_after)
        for i, s in enumerate(samples):
            if results[i] is None:
                results[i] = SampleOut(s.prompt_id, s.sample_index, list(s.generated) + received[i], "cut")
        stats = EngineStats(
            prefill_tokens=sum(len(samples[i].prompt_tokens) + len(samples[i].generated) - cached[i]
                               for i in index.values()),
            decode_steps=max(num_steps - 1, 0),
            decode_token_slots=sum(max(len(received[i]) - 1, 0) for i in index.values()),
        )
        return results, stats  # type: ignore[return-value]

    def _check_fits(self, samples: list[SampleSpec], max_new_tokens: int) -> None:
        """Refuse, before any request is queued, a sample whose prompt plus ``max_new_tokens``
        does not fit ``max_model_len`` (tokens): vLLM refuses a prompt that fills it, and ends a
        response that reaches it as "length", a shorter sample than the torch engine draws.

        Raises:
            ValueError: the first such sample, its lengths, the engine's context and the fix.
        """
        for s in samples:
            need = len(s.prompt_tokens) + max_new_tokens
            if len(s.generated) < max_new_tokens and need > self.max_model_len:
                raise ValueError(
                    f"prompt {s.prompt_id} has {len(s.prompt_tokens)} tokens; with max_new_tokens={max_new_tokens} "
                    f"a sample needs {need} tokens, above the vLLM engine's max_model_len of {self.max_model_len}; "
                    "shorten the prompt (data.max_prompt_tokens) or lower generation.max_new_tokens, or raise "
                    "generation.vllm.max_model_len (at most the model's context)")

    def _drive(self, samples: list[SampleSpec], results: list[SampleOut | None], index: dict[str, int],
               cut_after: int | None) -> tuple[list[list[int]], list[int], int]:
        """Step the engine until every request finished, or the step in which the
        ``cut_after``-th sample finished; abort what is left. Fills ``results`` for finished
        samples; returns (token ids received per sample, EOS included; cached prompt tokens per
        sample; steps run)."""
        engine = self.llm.llm_engine
        received: list[list[int]] = [[] for _ in samples]
        cached = [0] * len(samples)
        num_done, num_steps = len(samples) - len(index), 0
        try:
            while engine.has_unfinished_requests():
                num_steps += 1
                for out in engine.step():
                    i = index[out.request_id]
                    received[i] = list(out.outputs[0].token_ids)
                    cached[i] = out.num_cached_tokens or 0
                    if out.finished:
                        results[i] = self._finished(samples[i], received[i], out.outputs[0].finish_reason)
                        num_done += 1
                if cut_after is not None and num_done >= cut_after:
                    break
        finally:  # also on an exception: leave no request of this call in the engine
            pending = [rid for rid, i in index.items() if results[i] is None]
            if pending:
                engine.abort_request(pending)
        return received, cached, num_steps

    def _params(self, s: SampleSpec, params: GenerationParams, budget: int, sampling: Sampler,
                streaming: bool, ignore_eos: bool = False) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from actions.engines.vllm_worker import (
            FUSED_ARG,
            KEY_ARG,
            OFFSET_ARG,
            TEMPERATURE_ARG,
            TOP_K_ARG,
            TOP_P_ARG,
        )

        return SamplingParams(
            n=1, temperature=0.0, max_tokens=budget, detokenize=False,
            # vLLM stops at a stop token id whatever ignore_eos says: a run to the budget passes none.
            stop_token_ids=[] if ignore_eos else list(self.eos_ids), ignore_eos=ignore_eos,
            skip_reading_prefix_cache=not params.dedup,
            # A cut needs every sample's tokens so far; otherwise only final outputs are sent.
            output_kind=RequestOutputKind.CUMULATIVE if streaming else RequestOutputKind.FINAL_ONLY,
            extra_args={KEY_ARG: stream_key(params.seed, params.step, s.prompt_id, s.sample_index),
                        OFFSET_ARG: len(s.generated), TEMPERATURE_ARG: float(sampling.temperature),
                        TOP_K_ARG: sampling.top_k, TOP_P_ARG: sampling.top_p, FUSED_ARG: self.fused_sampling},
        )

    def _finished(self, s: SampleSpec, token_ids: list[int], reason: str | None) -> SampleOut:
        stop = None
        if reason == "stop" and token_ids and token_ids[-1] in self.eos_ids:
            stop, token_ids = token_ids[-1], token_ids[:-1]
        # "length" is max_tokens: _check_fits keeps every sample clear of max_model_len.
        finish = "stop" if reason == "stop" else "length"
        return SampleOut(s.prompt_id, s.sample_index, list(s.generated) + token_ids, finish,
                         stop if finish == "stop" else None)

    def use_fused_sampling(self, setting: str) -> None:
        """Draw as ``generation.fused_sampling`` ``setting`` says (``sampling.fused_for`` over the
        model's vocabulary) from the next call on; where that is fused, the workers compile the
        draw now (once per process), not in the first decode step. The tokens are the same
        either way, so one running engine serves calls of any setting."""
        fused = fused_for(setting, self.vocab_size)
        if fused and not self.fused_sampling:
            self.llm.collective_rpc("prepare_draws", args=(self.vocab_size,))
        self.fused_sampling = fused

    # ------------------------------------------------------------------ weights and memory
    def load_policy(self, weights: str | os.PathLike[str] | Mapping[str, torch.Tensor], version: int) -> int:
        """Push a policy version into the running engine and drop the prefix cache.

        Args:
            weights: a safetensors file, a directory of ``*.safetensors`` (HF checkpoint names),
                or a state dict (written to a scratch file the workers read: tensors do not
                survive ``collective_rpc`` arguments).
            version: the policy version these weights are.
        Returns:
            the number of tensors each worker loaded.
        Raises:
            ValueError: tensors that do not fit the model (``vllm_push.check_push``), before
                anything reaches the engine, which keeps the version it held.
        """
        with self._lock:
            tmp: Path | None = None
            if isinstance(weights, Mapping):
                from safetensors.torch import save_file

                check_push({k: tuple(v.shape) for k, v in weights.items()}, self._checkpoint, self._fused,
                           self._tied_head)
                tmp = self._scratch / f"v{version:06d}.safetensors"
                # clone(): save_file refuses tensors that share storage (tied embeddings).
                save_file({k: v.detach().cpu().contiguous().clone() for k, v in weights.items()}, str(tmp))
                paths = [str(tmp)]
            elif Path(weights).is_dir():
                paths = sorted(str(p) for p in Path(weights).glob("*.safetensors"))
                if not paths:
                    raise ValueError(f"weights directory {str(weights)!r} has no *.safetensors files")
            else:
                paths = [str(weights)]
            if tmp is None:
                check_push(checkpoint_shapes(paths), self._checkpoint, self._fused, self._tied_head)
            try:
                counts = self.llm.collective_rpc("load_safetensors", args=(paths,))
            finally:
                if tmp is not None:
                    tmp.unlink(missing_ok=True)
            self.llm.reset_prefix_cache()
            self.policy_version = version
            return int(counts[0])

    def sleep(self, level: int = 1) -> None:
        """Release weights (level 1: offload; 2: discard) and KV cache; CUDA needs the engine
        built with ``enable_sleep_mode=True``. On CPU it returns but saves nothing."""
        self.llm.sleep(level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.llm.wake_up(tags)

    def shutdown(self) -> None:
        """Stop the engine core and remove scratch files; the object is unusable afterwards."""
        self.llm.llm_engine.engine_core.shutdown()
        self._remove_scratch()
