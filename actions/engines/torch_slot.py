"""The torch engine's generation slot: one warm model per base, new policy versions copied in.

A process keeps one model for generation per (store, base, device, dtype, LoRA settings and
backbone) -- the slot -- and the torch engines over it. A generate or evaluate request for
another policy version of the same base reads that version's tensors and copies them into
the slot model's own parameters in place (``actions/models/in_place.py``): the model object
and its parameters' storage stay, so the static decode runtime keeps its KV buffers and CUDA
graphs (``static_decode.runtime_for`` keys them by the parameters' addresses), the engines
keep their speculation estimates (``forward_cost``, ``acceptance``), and only one model of
the base sits in device memory, however many versions pass through.

* **LoRA.** The backbone is shared and frozen (``loading.load_backbone``); a version writes
  only the adapter tensors of the slot model. Version 0 (the seeded adapter, which no stored
  object holds) is built afresh when the slot holds another version.
* **Build.** The first request, another base or settings, or a version whose tensors do not
  match the slot model exactly (a missing, extra or reshaped tensor) builds a fresh model
  (``load_model(..., fresh=True)``) and replaces the slot's. A copy that fails midway drops
  the slot before the error propagates: a half-written model is never served.
* **Apart from the warm cache.** The slot holds its model outside ``actions/models/warm.py``:
  the score action's reference model, the prefill action's and the train action's private
  copies are keyed per version there, as before. One exception reads the slot: the score
  action takes the slot's model for the policy's log-probs when the slot holds exactly that
  version (``held_model``; where generate and score share a process), instead of building a
  second copy. Slot hits and loads count in the warm statistics.

Actions never overlap in one container; the lock serves a library caller's threads.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

import torch

from actions.contracts import ModelRef
from actions.engines.torch_engine import TorchEngine
from actions.models import warm
from actions.models.device import action_device, action_dtype
from actions.models.in_place import copy_version, mismatch, version_targets
from actions.models.loading import load_model, store_for
from actions.store.weights import load_tensors

log = logging.getLogger(__name__)

SlotEvent = Literal["hit", "push", "start"]
"""What a load did: nothing (the slot held the version), a copy in place, a fresh build."""


@dataclass(frozen=True)
class SlotLoad:
    """The slot's engine for a request, and what loading its version took (``seconds``)."""

    engine: TorchEngine
    tokenizer: Any
    event: SlotEvent
    seconds: float


class _TorchSlot:
    """The process's one generation model, what it is a model of, and its engines."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.key: tuple | None = None  # slot_key of the model
        self.policy: tuple[str, str | None] | None = None  # (policy key, expected weights_sha256)
        self.model: torch.nn.Module | None = None
        self.tokenizer: Any = None
        self.engines: dict[tuple[str, str, bool], TorchEngine] = {}  # per decode settings

    def clear(self) -> None:
        """Drop the model and its engines (and with them its decode runtime)."""
        self.key = self.policy = self.model = self.tokenizer = None
        self.engines = {}


_slot = _TorchSlot()


def slot_key(ref: ModelRef, device: torch.device, dtype: torch.dtype) -> tuple:
    """What one slot model can hold every version of: the store, the base, where and in what
    dtype it runs, and for LoRA the adapter's settings and the backbone it is attached to."""
    lora = (ref.lora.model_dump_json(), ref.backbone_key) if ref.lora is not None else None
    return ref.store_uri, ref.base_key, str(device), str(dtype), lora


def load_slot_engine(ref: ModelRef, *, kv_cache: str = "static", cuda_graphs: str = "auto",
                     compile_decode: bool = False, fused_sampling: str = "auto") -> SlotLoad:
    """The slot's torch engine holding ``ref``'s version, for these decode settings (module
    docstring); the engine is kept per settings and reused while the slot model is.

    Raises:
        ValueError: bad decode settings (``TorchEngine``) or weights that fit no model of the
            base (``build_model``).
        IntegrityError: the version's tensors do not have ``ref.weights_sha256``.
    """
    device = action_device()
    key = slot_key(ref, device, action_dtype(ref.dtype, device))
    policy = (ref.policy_key, ref.weights_sha256)
    with _slot.lock:
        t0 = time.perf_counter()
        if _slot.key == key and _slot.policy == policy:
            event: SlotEvent = "hit"
        elif _slot.key == key and _push(ref):
            event = "push"
        else:
            _slot.clear()  # free the old model before building the new one
            model, tokenizer, _ = load_model(ref, fresh=True)
            _slot.key, _slot.model, _slot.tokenizer = key, model, tokenizer
            event = "start"
        _slot.policy = policy
        seconds = time.perf_counter() - t0
        warm.note(event == "hit")
        settings = (kv_cache, cuda_graphs, compile_decode, fused_sampling)
        engine = _slot.engines.get(settings)
        if engine is None:
            engine = TorchEngine.for_model(_slot.model, _slot.tokenizer, kv_cache=kv_cache, cuda_graphs=cuda_graphs,
                                          compile_decode=compile_decode, fused_sampling=fused_sampling)
            _slot.engines[settings] = engine
        return SlotLoad(engine, _slot.tokenizer, event, seconds)


def held_model(ref: ModelRef) -> torch.nn.Module | None:
    """The slot's model where it holds exactly ``ref``'s version for this device and dtype,
    else None. For a read within one action (the score action's log-probs of the version that
    just generated, in the same process): the next generate request may overwrite it, so the
    caller keeps no reference past its action."""
    device = action_device()
    with _slot.lock:
        if _slot.key == slot_key(ref, device, action_dtype(ref.dtype, device)) and \
                _slot.policy == (ref.policy_key, ref.weights_sha256):
            return _slot.model
    return None


def _push(ref: ModelRef) -> bool:
    """Copy ``ref``'s version into the slot model in place; False (nothing written) where it
    cannot be: LoRA version 0, or tensors that do not match the model exactly."""
    if ref.lora is not None and ref.policy_key == ref.backbone_key:
        return False  # the seeded adapter: stored nowhere, built by attach_adapter
    tensors, _ = load_tensors(store_for(ref.store_uri), ref.policy_key, expected_sha256=ref.weights_sha256)
    targets = version_targets(_slot.model)
    why = mismatch(targets, tensors)
    if why is not None:
        log.warning("policy %s does not fit the warm generation model (%s); building it afresh", ref.policy_key, why)
        return False
    try:
        copy_version(targets, tensors)
    except BaseException:
        _slot.clear()  # part old version, part new: never served
        raise
    return True


def close_torch_slot() -> None:
    """Drop the slot model (tests, and a container that must free its device memory)."""
    with _slot.lock:
        _slot.clear()
