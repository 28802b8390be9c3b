"""What actions load from the store, cached while the container stays warm.

Models are keyed by (store uri, base key, policy key): a policy version never changes once
its manifest exists, so a hit is always valid. The train action takes a private copy
(``fresh=True``) because it mutates weights. The base's parsed parts (config, tokenizer,
generation settings) are cached apart, per base key: every policy version of a campaign
shares them, so a new version costs only its tensors and the model's construction, and an
action that needs no weights (scoring without a forward) reads the tokenizer alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import Any

import torch

from actions.contracts import ModelRef
from actions.models import warm
from actions.models.device import action_device, action_dtype
from actions.models.modeling import BaseParts, build_model, read_base
from actions.models.special_tokens import SpecialTokens
from actions.store import ObjectStore, get_artifact, open_store
from actions.store.weights import StoredTensors, load_tensors


def configure_threads(num_threads: int | None = None) -> int:
    """Set torch's intra-op threads for the activation about to run; returns the count.

    ``num_threads`` is the activation's share of the machine, chosen by the invoker that
    knows what else runs beside it (``flows.invokers.cores``): all the cores when it runs
    alone (training), a share when generation actions run side by side. None (an OpenWhisk
    container, which gets no share from its invoker): ``RLHFLESS_THREADS``, else 1, because
    a container's CPU quota is rarely visible as its affinity mask. Setting the count per
    activation is cheap (no pool restart): torch resizes its OpenMP team on the next op.
    """
    n = num_threads if num_threads is not None else int(os.environ.get("RLHFLESS_THREADS", "1"))
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def store_for(uri: str) -> ObjectStore:
    return warm.get_or_build(("store", uri), lambda: open_store(uri))[0]


TensorReader = Callable[[ObjectStore, str, "str | None"], dict[str, torch.Tensor]]
"""``read(store, manifest_key, expected_sha256)``: a published tensor set, verified (the
ranks of a sharded step read one together, each blob fetched by one rank: ``state_scatter``)."""


def read_tensors(store: ObjectStore, manifest_key: str, expected_sha256: str | None = None) -> dict[str, torch.Tensor]:
    """The default :data:`TensorReader`: every tensor fetched by this process (``load_tensors``)."""
    return load_tensors(store, manifest_key, expected_sha256=expected_sha256)[0]


def counting_reader(fetched: list[int]) -> TensorReader:
    """A :data:`TensorReader` like :func:`read_tensors` (the whole set, fetched ahead in
    parallel) that appends the blob bytes each read fetched to ``fetched``."""
    def read(store: ObjectStore, manifest_key: str, expected_sha256: str | None = None) -> dict[str, torch.Tensor]:
        state = StoredTensors(store, manifest_key, expected_sha256=expected_sha256)
        tensors = dict(state.stream())
        fetched.append(state.bytes_fetched)
        return tensors

    return read


def load_base(store_uri: str, base_key: str) -> dict[str, bytes]:
    return warm.get_or_build(("base", store_uri, base_key), lambda: get_artifact(store_for(store_uri), base_key)[0])[0]


def load_base_parts(store_uri: str, base_key: str) -> BaseParts:
    """The base's config, tokenizer and generation settings, parsed once per warm container."""
    return warm.get_or_build(("base_parts", store_uri, base_key), lambda: read_base(load_base(store_uri, base_key)))[0]


def load_tokenizer(ref: ModelRef) -> tuple[object, SpecialTokens]:
    """(tokenizer, special tokens) of ``ref``'s base, as ``load_model`` and ``special_tokens``
    would give them, without reading or building any weights."""
    base = load_base_parts(ref.store_uri, ref.base_key)
    return base.tokenizer, base.special_tokens()


def load_backbone(ref: ModelRef, device: torch.device, dtype: torch.dtype,
                  read: TensorReader = read_tensors) -> dict[str, torch.Tensor]:
    """A LoRA run's frozen backbone on ``device`` in ``dtype``, read once per warm container and
    shared by every version built from it (each in aligned storage of its own, see build_model)."""
    def build() -> dict[str, torch.Tensor]:
        tensors = read(store_for(ref.store_uri), ref.backbone_key, None)
        return {k: v.to(device=device, dtype=dtype, copy=True) if v.is_floating_point() else v.to(device, copy=True)
                for k, v in tensors.items()}

    return warm.get_or_build(("backbone", ref.store_uri, ref.backbone_key, str(device), str(dtype)), build)[0]


def _build_lora(ref: ModelRef, device: torch.device, dtype: torch.dtype, read: TensorReader) -> torch.nn.Module:
    """The backbone (shared, warm) with the version's adapter: only the adapter is read."""
    from actions.models.lora import attach_adapter

    assert ref.lora is not None and ref.backbone_key is not None, ref
    adapter = None
    if ref.policy_key != ref.backbone_key:  # version 0 is the backbone with the seeded adapter
        adapter = read(store_for(ref.store_uri), ref.policy_key, ref.weights_sha256)
    model = build_model(load_base_parts(ref.store_uri, ref.base_key), load_backbone(ref, device, dtype, read),
                        share=True, dtype=dtype)
    return attach_adapter(model.to(device), ref.lora, adapter)


def load_model(ref: ModelRef, *, fresh: bool = False,
               read: TensorReader = read_tensors) -> tuple[torch.nn.Module, object, bool]:
    """(model, tokenizer, warm_hit) for a policy version, on ``RLHFLESS_DEVICE`` in
    ``ref.dtype`` (``auto``: bf16 on CUDA, fp32 on the CPU; see ``device.py``). With
    ``ref.lora``: the shared backbone plus the version's adapter (``lora.py``); ``fresh``
    then means a private adapter, the backbone being frozen. ``read`` fetches the weights
    (a sharded step's ranks pass one that reads each blob once among them)."""
    device = action_device()
    dtype = action_dtype(ref.dtype, device)

    def build():
        if ref.lora is not None:
            return _build_lora(ref, device, dtype, read), load_base_parts(ref.store_uri, ref.base_key).tokenizer
        tensors = read(store_for(ref.store_uri), ref.policy_key, ref.weights_sha256)
        base = load_base_parts(ref.store_uri, ref.base_key)
        return build_model(base, tensors, dtype=dtype).to(device), base.tokenizer

    if fresh:
        model, tokenizer = build()
        return model, tokenizer, False
    key = ("model", ref.store_uri, ref.base_key, ref.policy_key, ref.weights_sha256, str(device), str(dtype),
           ref.lora and ref.lora.model_dump_json())
    (model, tokenizer), hit = warm.get_or_build(key, build, supersedes=partial(_older_version, key))
    return model, tokenizer, hit


def _older_version(key: tuple, other: Hashable) -> bool:
    """Whether ``other`` is another policy version of ``key``'s run (same store and base) that a
    new version replaces: a run's actions ask for one policy version at a time (a step scores
    with the version that sampled, the evaluation after it with the next), so a warm worker that
    kept each would hold two stale full models until the LRU limit (a 7B in bf16: 15 GB each).
    The reference (loaded without a fingerprint, ``score._reference_logprobs``) is kept."""
    return (isinstance(other, tuple) and other[:1] == ("model",) and other[1:3] == key[1:3]
            and other[4] is not None and key[4] is not None)


def encode(tokenizer: object, text: str, *, special_tokens: bool = False) -> tuple[int, ...]:
    """``text``'s token ids; with the tokenizer's special tokens (e.g. its BOS) only where asked."""
    return tuple(tokenizer(text, add_special_tokens=special_tokens)["input_ids"])  # type: ignore[operator]


def encode_prompt(tokenizer: object, row: Any) -> tuple[int, ...]:
    """A dataset row's (``PromptRow``) prompt ids as the policy reads them, in every action: its
    formatted text, with the tokenizer's special tokens where the row asks for them (a string
    prompt under ``data.chat_template: messages``, as TRL encodes it; ``actions/tasks/chat.py``)."""
    return encode(tokenizer, row.prompt, special_tokens=row.add_special_tokens)


def completion_text(tokenizer: object, tokens: Sequence[int]) -> str:
    """A completion's text as the reward functions and reward models read it: its tokens decoded
    without the tokenizer's special tokens (a ``<|im_start|>`` or ``<unk>`` the model emitted
    mid-answer is dropped), as TRL's GRPOTrainer decodes completions (``skip_special_tokens``)."""
    return tokenizer.decode(list(tokens), skip_special_tokens=True)  # type: ignore[attr-defined]
