"""LoRA adapters over a frozen, shared backbone, through PEFT (``model.lora``).

A LoRA policy is two parts: the backbone (policy version 0, after warm-up; also the KL
reference) and an adapter per version. The adapter is all a version stores and all a warm
action reads: the backbone's tensors are loaded once per container (``loading.py``) and every
version's model *shares* them (``build_model(..., share=True)``), holding only its own adapter
weights besides.

Choices, each measured in ``benchmarks/bench_lora.py`` and written down in docs/scale.md:

* The adapters stay unmerged in every action. Merging would need a private copy of every
  targeted weight per version (the shared backbone must stay intact for the other versions and
  for the reference), i.e. a full model per version, which is what LoRA is here to avoid; the
  unmerged forward costs a few small matmuls per layer instead.
* The reference log-probs are the same model with the adapter disabled
  (:func:`adapter_disabled`): no second copy of the weights.
* The adapter's initialisation is seeded (:data:`INIT_SEED`), so version 0 is the same
  adapter in every action that builds it (its B is zero: version 0 computes the backbone).
* Adapter weights are in the backbone's dtype, like every weight of a full fine-tuning run:
  under bf16 the optimizer keeps their fp32 master copies in its state
  (``actions/rl/optimizer.py``) and the version publishes the bf16 adapter, half the bytes.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # only its fields are read: a benchmark may pass any object that has them
    from actions.config.workload import LoraConfig

INIT_SEED = 0x10_4A
"""Seed of every adapter's initialisation (A random, B zero)."""


def wrap(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """``model`` as a PEFT ``PeftModel`` with ``cfg``'s LoRA layers injected (in place), e.g.
    for ``save_pretrained`` in PEFT's own adapter format."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    peft_cfg = PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets,
                              bias=cfg.bias, task_type="CAUSAL_LM")
    with warnings.catch_warnings():
        # peft reads transformers' `is_gradient_checkpointing`, which transformers 5.24 deprecates
        # for `is_activation_checkpointing`: a FutureWarning in every LoRA action's log that no
        # setting here can act on. Only that message is ignored, and only while PEFT wraps.
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        # and that an adapter on a layer tied to another (the input embedding and the output head)
        # "can lead to complications, for example when merging": the adapter acts on the layer it
        # names alone, in training as in the export, whose merge unties the two first
        # (``actions/models/export.py``), so the merged model computes what was trained
        warnings.filterwarnings("ignore", message=r"Model (has|with) `tie_word_embeddings=True`", category=UserWarning)
        return get_peft_model(model, peft_cfg, autocast_adapter_dtype=False)


def merge_adapter(model: torch.nn.Module) -> torch.nn.Module:
    """The model with every LoRA layer's update added into its base weight (``W + (alpha / r)
    B A``, in the weight's dtype) and the layer replaced by that base layer: an ordinary
    transformers model again, in place.

    A base weight that another module shares (an output head tied to the input embedding)
    gets a copy of its own first, and the config says the embeddings are no longer tied: the
    trained policy changed that one layer, not both."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    owners: dict[int, int] = {}  # weight address -> modules holding it directly
    for m in model.modules():
        w = m._parameters.get("weight")
        if w is not None:
            owners[w.data_ptr()] = owners.get(w.data_ptr(), 0) + 1
    untied = False
    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            base = module.get_base_layer()
            if owners.get(base.weight.data_ptr(), 0) > 1:
                base.weight = torch.nn.Parameter(base.weight.detach().clone(), requires_grad=False)
                untied = True
            module.merge()
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, base)
    if untied and getattr(model, "config", None) is not None:
        model.config.tie_word_embeddings = False
    return model


def attach_adapter(model: torch.nn.Module, cfg: LoraConfig,
                   adapter: dict[str, torch.Tensor] | None) -> torch.nn.Module:
    """Inject LoRA layers (PEFT) into ``model`` (already holding the backbone) and load
    ``adapter`` (as :func:`adapter_tensors` returns it); None keeps the seeded initialisation.

    Returns the same transformers model, its targeted layers now LoRA layers: the engines and
    the log-prob code see an ordinary causal LM. Only the adapter (and, with ``cfg.bias``
    other than none, the biases) requires grad; a trainable bias gets storage of its own first,
    the backbone's tensors being shared.

    Raises:
        ValueError: ``cfg.target_modules`` matches no module of the model (PEFT's message), or
            ``adapter`` does not hold exactly the adapter's tensors.
    """
    return attach_peft(model, cfg, adapter).get_base_model()


def attach_peft(model: torch.nn.Module, cfg: LoraConfig, adapter: dict[str, torch.Tensor] | None) -> torch.nn.Module:
    """:func:`attach_adapter`, returning the PEFT wrapper (``save_pretrained`` writes PEFT's
    adapter format); its ``get_base_model()`` is the model :func:`attach_adapter` returns, in
    the train or eval mode ``model`` was in (PEFT's new layers, LoRA dropout among them, would
    otherwise start in train mode and make an eval model's forward random)."""
    training = model.training
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED)
        peft_model = wrap(model, cfg)
    inner = peft_model.get_base_model()
    inner.train(training)
    for name, p in inner.named_parameters():
        if p.requires_grad and "lora_" not in name:
            p.data = p.data.clone()
    if adapter is not None:
        expected = set(adapter_tensors(inner))
        if set(adapter) != expected:
            raise ValueError(f"adapter tensors do not fit model.lora: {len(adapter)} stored, {len(expected)} expected "
                             f"(e.g. {sorted(set(adapter) ^ expected)[:2]}); resume with the model.lora the run had")
        with torch.no_grad():
            inner.load_state_dict(adapter, strict=False)
    return peft_model


def _tuner_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def is_lora(model: torch.nn.Module) -> bool:
    """True for a model :func:`attach_adapter` built."""
    return any(hasattr(m, "lora_A") for m in model.modules())


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a policy version stores: a LoRA model's trainable tensors (the adapter, and the
    biases ``model.lora.bias`` trains), every tensor of any other model but a tied output head
    (``modeling.stored_state``)."""
    if not is_lora(model):
        from actions.models.modeling import stored_state

        return stored_state(model)
    return {name: p.detach() for name, p in model.named_parameters() if "lora_" in name or p.requires_grad}


@contextmanager
def adapter_disabled(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The backbone alone, for the reference log-probs: the same module with its LoRA layers
    switched off inside the block, so no second copy of the weights exists (an action runs one
    activation at a time, so nothing else sees the switch)."""
    layers = _tuner_layers(model)
    grads = {id(p): p.requires_grad for m in layers for p in m.parameters()}
    for m in layers:
        m.enable_adapters(False)
    try:
        yield model
    finally:
        for m in layers:
            m.enable_adapters(True)
        for m in layers:  # enable_adapters also sets requires_grad: put back what was there
            for p in m.parameters():
                p.requires_grad_(grads[id(p)])
