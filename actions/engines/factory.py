"""Choosing and caching the generation engine (``generation.engine: torch | vllm``).

``make_engine`` builds an engine from what is already loaded. ``load_engine`` is what the
generate and evaluate actions call: it returns a ready engine for a policy version, cached
while the container stays warm:

* torch: one model per process and base (the generation slot, ``torch_slot.py``) and its
  engines; a new policy version of the same base is copied into that model's parameters in
  place, so its decode runtime (static KV buffers, CUDA graphs) and the engines' speculation
  estimates survive the version change. Another base, or tensors that do not fit the model,
  build a fresh one.
* vllm: starting an engine costs seconds to minutes, so one engine per process is kept per
  (store, base model, ``generation.vllm`` settings) and a new policy version is pushed into it
  with ``load_policy`` (which also resets its prefix cache). A different base model or setting
  shuts the old engine down first: each engine reserves its own KV-cache memory. A push that
  fails inside the engine shuts it down too (its layers may be half-loaded). A miss is always correct, just slower.
  Generate and evaluate share this one engine, and a pre-warm (``actions/runtime/server.py``)
  builds it or pushes the coming version into it.

Every engine start (a vLLM engine, or a torch slot model built) and weight push is timed and
counted (``take_engine_events``): the next generate or evaluate result of the process reports
them (``EngineEvents``), so the step's metrics show what keeping the engine warm saved or
failed to save.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from actions.config.vllm import VllmConfig
from actions.contracts import EngineEvents, ModelRef
from actions.engines.base import GenerationEngine
from actions.engines.torch_engine import TorchEngine
from actions.engines.torch_slot import load_slot_engine
from actions.models.loading import load_base, store_for
from actions.models.special_tokens import special_tokens_of_dir
from actions.store.safe_paths import write_beneath
from actions.store.weights import load_tensors

EngineKind = Literal["torch", "vllm"]


def make_engine(kind: str, model: torch.nn.Module | None, tokenizer: Any, *,
                model_dir: str | Path | None = None, kv_cache: str = "static", cuda_graphs: str = "auto",
                compile_decode: bool = False, fused_sampling: str = "auto", **vllm_kwargs: Any) -> GenerationEngine:
    """An engine of ``kind`` over a loaded model (torch) or a model directory (vllm).
    ``kv_cache``, ``cuda_graphs``, ``compile_decode``: the torch engine's decode path
    (``TorchEngine``); ``fused_sampling``: how either engine draws its tokens.

    Raises:
        ValueError: unknown kind, or a missing ``model``/``model_dir`` for it.
        ImportError: kind "vllm" without vLLM installed (the message says how to install it).
    """
    if kind == "torch":
        if model is None:
            raise ValueError("generation.engine 'torch' needs a loaded model; got None")
        return TorchEngine.for_model(model, tokenizer, kv_cache=kv_cache, cuda_graphs=cuda_graphs,
                                     compile_decode=compile_decode, fused_sampling=fused_sampling)
    if kind == "vllm":
        if model_dir is None:
            raise ValueError("generation.engine 'vllm' needs model_dir (config.json + *.safetensors); got None")
        from actions.engines.vllm_engine import VllmEngine

        return VllmEngine(model_dir, eos_id=special_tokens_of_dir(model_dir, tokenizer).eos_ids,
                          fused_sampling=fused_sampling, **vllm_kwargs)
    raise ValueError(f"generation.engine {kind!r} is not supported; use 'torch' or 'vllm'")


class _VllmSlot:
    """The process's one vLLM engine, the base model it serves and the policy it holds."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.base: tuple[str, str, tuple] | None = None  # (store, base model, engine options)
        self.policy: tuple[str, str | None] | None = None  # (policy key, expected weights_sha256)
        self.engine: Any = None
        self.tokenizer: Any = None
        self.model_dir: Path | None = None

    def close(self) -> None:
        """Shut the engine down and forget it; the slot is empty afterwards even if that raised."""
        try:
            if self.engine is not None:
                self.engine.shutdown()
        finally:
            if self.model_dir is not None:
                shutil.rmtree(self.model_dir, ignore_errors=True)
            self.__init__()  # type: ignore[misc]


_vllm = _VllmSlot()
_events_lock = threading.Lock()
_events = {"starts": 0, "start_s": 0.0, "pushes": 0, "push_s": 0.0}


def _record(kind: str, seconds: float) -> None:
    """Count one ``start`` or ``push`` that took ``seconds``."""
    with _events_lock:
        _events["starts" if kind == "start" else "pushes"] += 1
        _events[f"{kind}_s"] += seconds


def take_engine_events() -> EngineEvents:
    """The engine starts and weight pushes of this process since the previous call."""
    with _events_lock:
        events = EngineEvents(**_events)
        _events.update(starts=0, start_s=0.0, pushes=0, push_s=0.0)
    return events


def vllm_engine_policy() -> str | None:
    """The policy key the process's vLLM engine holds; None when no engine is built."""
    with _vllm.lock:
        return _vllm.policy[0] if _vllm.engine is not None and _vllm.policy else None


def load_engine(kind: str, ref: ModelRef, *, kv_cache: str = "static", cuda_graphs: str = "auto",
                compile_decode: bool = False, fused_sampling: str = "auto",
                vllm: VllmConfig | Mapping[str, Any] | None = None) -> tuple[GenerationEngine, Any, bool]:
    """(engine, tokenizer, warm_hit) for a policy version; hit = nothing had to be loaded.
    ``kv_cache``, ``cuda_graphs``, ``compile_decode``: the torch engine's decode path (vLLM
    ignores them); ``fused_sampling``: how either engine draws (the process's one vLLM engine
    takes each call's setting: it changes how tokens are computed, never which); ``vllm``: the
    vLLM engine's context and memory (``generation.vllm``; other settings start another
    engine, the torch engine ignores them)."""
    if kind == "torch":
        got = load_slot_engine(ref, kv_cache=kv_cache, cuda_graphs=cuda_graphs, compile_decode=compile_decode,
                               fused_sampling=fused_sampling)
        if got.event != "hit":
            _record(got.event, got.seconds)
        return got.engine, got.tokenizer, got.event == "hit"
    if kind != "vllm":
        raise ValueError(f"generation.engine {kind!r} is not supported; use 'torch' or 'vllm'")
    with _vllm.lock:
        hit = _hold_vllm(ref, fused_sampling, VllmConfig.model_validate(vllm or {}).llm_kwargs())
        _vllm.engine.use_fused_sampling(fused_sampling)  # a pre-warm or another call may have set another
        return _vllm.engine, _vllm.tokenizer, hit


def _hold_vllm(ref: ModelRef, fused_sampling: str, options: dict[str, Any]) -> bool:
    """Make the process's vLLM engine hold ``ref``'s version: nothing to do (True, a hit), the
    version pushed into the running engine, or an engine started for another base or other
    ``options`` (``vllm.LLM`` arguments) (False). A push that raises closes the engine first.
    The caller holds ``_vllm.lock``."""
    base = (ref.store_uri, ref.base_key, tuple(sorted(options.items())))
    if _vllm.base == base and _vllm.policy == (ref.policy_key, ref.weights_sha256):
        return True
    t0 = time.perf_counter()
    tensors, _ = load_tensors(store_for(ref.store_uri), ref.policy_key, expected_sha256=ref.weights_sha256)
    if _vllm.base == base:
        try:
            _vllm.engine.load_policy(tensors, ref.policy_version)
        except BaseException:
            # A push that failed inside the engine may have left layers half-loaded: the next
            # call starts a fresh engine rather than generate with (or fail on) them.
            _vllm.close()
            raise
        _record("push", time.perf_counter() - t0)
    else:
        _vllm.close()
        _vllm.model_dir = write_model_dir(load_base(ref.store_uri, ref.base_key), tensors)
        from transformers import AutoTokenizer

        _vllm.tokenizer = AutoTokenizer.from_pretrained(_vllm.model_dir, trust_remote_code=False)
        _vllm.engine = make_engine("vllm", None, _vllm.tokenizer, model_dir=_vllm.model_dir,
                                   fused_sampling=fused_sampling, policy_version=ref.policy_version, **options)
        _vllm.base = base
        _record("start", time.perf_counter() - t0)
        print(f"[rlhfless] vllm engine started in {time.perf_counter() - t0:.2f} s "
              f"(policy v{ref.policy_version})", flush=True)
    _vllm.policy = (ref.policy_key, ref.weights_sha256)
    return False


def write_model_dir(files: Mapping[str, bytes], tensors: Mapping[str, torch.Tensor]) -> Path:
    """A scratch Hugging Face model directory: base files plus ``model.safetensors``."""
    from safetensors.torch import save_file

    root = Path(tempfile.mkdtemp(prefix="rlhfless-vllm-model-"))
    atexit.register(shutil.rmtree, root, True)  # a warm container exits without close_vllm()
    for name, data in files.items():  # names from a manifest: never a path outside root
        write_beneath(root, name, data, where="base model")
    # clone(): save_file refuses tensors that share storage (tied embeddings).
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, str(root / "model.safetensors"))
    return root


def close_vllm() -> None:
    """Shut the cached vLLM engine down (tests, and a container about to be reused)."""
    with _vllm.lock:
        _vllm.close()
