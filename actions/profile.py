"""profile action: the decode-speed profile of the campaign's model on this worker's device.

Run once at campaign start on the same pool as ``generate``, so the process kind, device, dtype
and torch threads are the ones that will generate. Reuses the store's cached profile for the
same facts (``actions/store/profile_cache.py``); otherwise loads the policy as ``generate``
does and measures the engine over the requested grid (torch: ``actions/engines/profiling.py``,
on the decode path the campaign runs, ``kv_cache``;
vLLM: ``actions/engines/vllm_profiling.py``, on the process's warm engine, with the time a new
version takes to reach it; the engine starts first, whatever the cache holds, as the dtype it
computes in, not ``model.dtype``'s, keys and names the profile and counts the KV bytes), then
caches the result if its grid is usable (``grid_problem``; one that is not is returned
uncached, and the flow measures again). Either way it reports what the
planner's locality check needs (``transfer_facts``): the weight bytes a warm actor reads per new
policy version, the KV bytes per token and the store's measured read throughput.
"""

from __future__ import annotations

import copy
import hashlib
import json
import platform
import time
from typing import Any

import torch

from actions.contracts import ModelRef
from actions.engines.preflight import attention_shape
from actions.engines.sampling import fused_for
from actions.engines.torch_engine import decode_path
from actions.models.device import action_device, action_dtype
from actions.models.loading import configure_threads, load_base, load_model, store_for
from actions.runtime.adapter import run_action
from actions.store import ObjectNotFound, ObjectStore, get_artifact, put_json, read_manifest
from actions.store.profile_cache import (
    ProfileFacts,
    ProfileRequest,
    ProfileResult,
    cache_record,
    check_cached,
    grid_problem,
    model_label,
)


def device_name(device: torch.device) -> str:
    """``type:model`` of the device, so a cache shared by several machines keeps them apart."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        model = ""
    return f"cpu:{model or platform.processor() or platform.machine()}"


def kv_bytes_per_token(config: dict, dtype: torch.dtype) -> int:
    """K and V of every layer and KV head at ``dtype`` (the engine's cache), for a config.json's
    contents. Its names are read as transformers reads them (GPT-2's ``n_head``, ``n_embd`` and
    ``n_layer`` through its config class's ``attribute_map``; a multimodal config's text part)."""
    from transformers import AutoConfig

    data = dict(config)
    shape = attention_shape(AutoConfig.for_model(data.pop("model_type"), **data).get_text_config(decoder=True))
    if shape is None:
        raise ValueError(f"config.json of the stored base does not give the attention shape: {sorted(config)}")
    layers, kv_heads, head_dim = shape
    return 2 * layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8


def read_throughput(store: ObjectStore, manifest_key: str, cap_bytes: int) -> tuple[int, float]:
    """(weight bytes as published, bytes/s of reading them back) over the largest files up to
    ``cap_bytes`` (at least one), fetched and sha256-verified as an action loading weights does."""
    files = read_manifest(store, manifest_key)["files"]
    total = sum(entry["size"] for entry in files.values())
    names, taken = [], 0
    for name in sorted(files, key=lambda n: -files[n]["size"]):
        if names and taken + files[name]["size"] > cap_bytes:
            break
        names.append(name)
        taken += files[name]["size"]
    t0 = time.perf_counter()
    get_artifact(store, manifest_key, names)
    return total, taken / max(time.perf_counter() - t0, 1e-6)


def adapter_bytes(ref: ModelRef, dtype: torch.dtype) -> int:
    """Bytes one version of ``ref``'s LoRA policy publishes, as its manifest lists them: the
    adapter's tensors (and the biases ``model.lora.bias`` trains) in ``dtype``, one safetensors
    blob each (``actions/store/weights.py``). Computed from the base's config, ``model.lora``
    (r, the target modules' shapes) and ``dtype`` on torch's meta device (shapes only, nothing
    allocated but one adapter tensor's bytes at a time), so version 0, whose adapter is built
    rather than stored, counts what every later version publishes."""
    from transformers import AutoModelForCausalLM

    from actions.models.loading import load_base_parts
    from actions.models.lora import adapter_tensors, attach_adapter
    from actions.store.weights import tensor_blob_parts

    assert ref.lora is not None, ref
    config = copy.deepcopy(load_base_parts(ref.store_uri, ref.base_key).config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=False)
        model = attach_adapter(model, ref.lora, None)
    total = 0
    for name, t in adapter_tensors(model).items():
        # PEFT casts a new adapter to its layer's dtype on a real device only: on the meta device
        # it stays fp32, so the dtype a built model gives its floating tensors is set here
        stored = torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device="cpu")
        header, data = tensor_blob_parts(name, stored)  # the header names the tensor, its dtype and shape
        total += len(header) + data.nbytes
    return total


def transfer_facts(store: ObjectStore, ref: ModelRef, dtype: torch.dtype, probe_bytes: int) -> tuple[int, float]:
    """(weight bytes a warm actor reads per new policy version, store read bytes/s) for the
    planner, the same at every version of a run. A full model: the version's weights, read
    back to time them. LoRA: the adapter's bytes (``adapter_bytes``; a warm actor holds the
    backbone), with the throughput probed on the backbone's blobs, which are large enough to
    time the store's bandwidth at every version (an adapter's few KB would time its latency,
    and version 0's policy is the backbone itself)."""
    if ref.lora is None:
        return read_throughput(store, ref.policy_key, probe_bytes)
    assert ref.backbone_key is not None, ref
    _, read_bps = read_throughput(store, ref.backbone_key, probe_bytes)
    return adapter_bytes(ref, dtype), read_bps


def decode_facts(req: ProfileRequest, device: torch.device, vocab: int) -> dict:
    """What the request's decode settings do on ``device`` (``ProfileFacts``): the torch
    engine's cache, graphs and compilation, and either engine's fused draws."""
    fused = fused_for(req.fused_sampling, vocab)
    if req.engine != "torch":
        return {"fused": fused}
    graphs, compiled = decode_path(req.kv_cache == "static", device, req.cuda_graphs, req.compile_decode)
    return {"kv_cache": req.kv_cache, "graphs": graphs, "compiled": compiled, "fused": fused}


def run_profile(req: ProfileRequest) -> ProfileResult:
    if req.threads is not None:
        configure_threads(req.threads)
    ref = req.model
    device = action_device()
    dtype = action_dtype(ref.dtype, device)  # the policy's, as its versions are published
    # vLLM computes (and caches KV) in a dtype of its own choosing, which can differ from
    # model.dtype's (its CPU backend runs float32): the engine, which generate uses too, says
    engine = _vllm_engine(req) if req.engine == "vllm" else None
    computes = dtype if engine is None else engine.dtype
    store = store_for(ref.store_uri)
    base_config = load_base(ref.store_uri, ref.base_key)["config.json"]
    config = json.loads(base_config)
    facts = ProfileFacts(model_config_sha256=hashlib.sha256(base_config).hexdigest(),
                         dtype=str(computes).removeprefix("torch."), device=device_name(device), engine=req.engine,
                         threads=torch.get_num_threads(), batch_sizes=req.batch_sizes, contexts=req.contexts,
                         prefill_shape=req.prefill_shape, **decode_facts(req, device, int(config["vocab_size"])),
                         lora=ref.lora.model_dump(mode="json") if ref.lora is not None else None)
    key = facts.cache_key()
    weight_bytes, read_bps = transfer_facts(store, ref, dtype, req.probe_bytes)
    common = dict(profile_key=key, facts=facts, weight_bytes=weight_bytes,
                  kv_bytes_per_token=kv_bytes_per_token(config, computes), store_read_bytes_per_s=read_bps)
    rejected = None
    if not req.measure_grid:
        return ProfileResult(profile={}, source="skipped", measure_s=0.0, **common)
    if not req.refresh:
        try:
            profile, rejected = check_cached(store.get(key), facts, key)
        except ObjectNotFound:
            profile = None
        if profile is not None:
            return ProfileResult(profile=profile, source="cached", measure_s=0.0, **common)
    t0 = time.perf_counter()
    name = f"measured-{req.engine}-{facts.device}-{facts.dtype}-{facts.threads}t"
    if engine is not None:
        profile = _measure_vllm(req, engine, int(config["vocab_size"]), name)
    else:
        from actions.engines.profiling import measure_grid  # torch engine: imported only to measure

        # a private copy: the static decode buffers the grid's largest batch and context make
        # (gigabytes for a 7B model on a GPU) leave with it when the action returns, rather
        # than staying in the warm cache beside the generation slot's model
        model, _, _ = load_model(ref, fresh=True)
        profile = measure_grid(model, model.config.vocab_size, req.batch_sizes, req.contexts,
                               prefill_shape=req.prefill_shape, name=name, kv_cache=req.kv_cache,
                               cuda_graphs=req.cuda_graphs, compile_decode=req.compile_decode,
                               fused_sampling=req.fused_sampling)
    profile = {**profile, "identity": facts.identity(model_label(config))}  # what it was measured on
    if grid_problem(profile) is None:  # never cache a grid check_cached would refuse: the flow measures again
        put_json(store, key, cache_record(facts, profile))
    return ProfileResult(profile=profile, source="measured", rejected=rejected,
                         measure_s=time.perf_counter() - t0, **common)


def _vllm_engine(req: ProfileRequest) -> Any:
    """The process's vLLM engine holding the request's policy: the one this worker's generate
    and evaluate activations will use (started here where none runs)."""
    from actions.engines.factory import load_engine

    return load_engine("vllm", req.model, fused_sampling=req.fused_sampling, vllm=req.vllm)[0]


def _measure_vllm(req: ProfileRequest, engine: Any, vocab: int, name: str) -> dict:
    """The vLLM engine's grid and push time (``actions/engines/vllm_profiling.py``) on
    ``engine`` (``_vllm_engine``)."""
    from actions.engines.vllm_profiling import measure_grid
    from actions.store.weights import load_tensors

    ref = req.model
    tensors, _ = load_tensors(store_for(ref.store_uri), ref.policy_key, expected_sha256=ref.weights_sha256)
    return measure_grid(engine, vocab, req.batch_sizes, req.contexts, prefill_shape=req.prefill_shape, name=name,
                        push=(tensors, ref.policy_version))


def main(args: dict) -> dict:
    return run_action(ProfileRequest, run_profile, args)
