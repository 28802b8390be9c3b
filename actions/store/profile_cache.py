"""The engine profile the live planner plans from: its wire messages and its cache in the store.

At campaign start the flow invokes the ``profile`` action on the pool (``actions/profile.py``),
so the decode speed is measured by the process kind that generates: the same engine, device,
dtype and torch threads. A measured profile is kept in the store under ``profiles/`` (outside
every run, so garbage collection never touches it and a later campaign on the same store
reuses it) at a key derived from everything that sets the speed (``ProfileFacts``): the
model's architecture (its ``config.json`` digest; weight values do not change the speed), the
dtype, the device (type and model name), the engine and, for the torch engine, its decode path
(``generation.kv_cache``, and whether steps replay CUDA graphs and run compiled), whether draws
are fused (``generation.fused_sampling``, both engines), the torch threads and the grid asked
for. Anything different is a different key, so a different dtype, decode path, draw or thread
count measures anew. The decode-path facts are what the settings do on the device, not how
they are spelled: ``cuda_graphs: auto`` and ``off`` on a CPU are one fact. (A profile cached
before a fact was part of the facts sits at a key no request names any more, so it is measured
anew.)

A cached object that is not what this module wrote (not JSON, other facts, a malformed grid)
is rejected with a one-line reason and measured again; the reason is returned to the flow,
which prints it. The flow validates the grid once more (``TpotProfile.from_dict``).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from actions.config.vllm import VllmConfig
from actions.contracts import ModelRef, vllm_settings

PROFILE_PREFIX = "profiles"
"""Store prefix of cached profiles (store-wide: shared by every run of the store)."""
CACHE_SCHEMA = "rlhfless.profile/1"


class ProfileRequest(BaseModel):
    """Measure (or reuse) the decode-speed profile of ``model`` on this action's device."""

    model_config = ConfigDict(extra="forbid")
    model: ModelRef
    engine: Literal["torch", "vllm"] = "torch"
    """The engine measured (``actions.engines.profiling``, ``actions.engines.vllm_profiling``)."""
    kv_cache: Literal["static", "dynamic"] = "static"
    """``generation.kv_cache``: the torch engine's decode path, measured (decode steps and the
    cost of dropping finished rows) as the campaign will run it. vLLM ignores it."""
    cuda_graphs: Literal["auto", "on", "off"] = "auto"
    """``generation.cuda_graphs`` (torch engine, static cache, on CUDA)."""
    compile_decode: bool = False
    """``generation.compile_decode`` (torch engine, static cache)."""
    fused_sampling: Literal["auto", "on", "off"] = "auto"
    """``generation.fused_sampling`` (both engines)."""
    vllm: VllmConfig = vllm_settings()
    """``generation.vllm``: the engine measured is the one the worker's generation then uses."""
    batch_sizes: list[int] = Field(min_length=2)
    contexts: list[int] = Field(min_length=2)
    prefill_shape: tuple[int, int] = (16, 64)
    """(rows, tokens) of the padded prefill forward timed for ``prefill_tokens_per_s``."""
    refresh: bool = False
    """Measure even when a valid cached profile exists (the flow asks after rejecting one)."""
    measure_grid: bool = True
    """False: report only the transfer facts (weights, KV, store throughput); the campaign
    plans from its own profile file (``scaling.profile``)."""
    threads: int | None = Field(None, ge=1)
    """Torch threads to measure with: the share one generation action gets at the widest
    fan-out (the local pool divides its cores among running activations). None: this
    activation's own share (an OpenWhisk container: ``RLHFLESS_THREADS``)."""
    probe_bytes: int = Field(256 * 2**20, ge=1)
    """Most weight bytes read to measure the store's read throughput."""


class ProfileFacts(BaseModel):
    """Everything the decode speed depends on; the cache key is their digest."""

    model_config = ConfigDict(extra="forbid")
    model_config_sha256: str
    dtype: str
    device: str
    """Device type and model name, e.g. ``cpu:AMD EPYC 7B13`` or ``cuda:NVIDIA H100 80GB HBM3``."""
    engine: str
    threads: int
    batch_sizes: list[int]
    contexts: list[int]
    prefill_shape: tuple[int, int]
    kv_cache: str | None = None
    """The torch engine's decode path (``static``, ``dynamic``); None for vLLM."""
    graphs: bool | None = None
    """Torch engine: decode steps replay CUDA graphs; None for vLLM."""
    compiled: bool | None = None
    """Torch engine: decode steps run through ``torch.compile``; None for vLLM."""
    fused: bool | None = None
    """Draws run as one compiled kernel (``sampling.fused_for``)."""
    lora: dict[str, Any] | None = None
    """``model.lora`` where generation runs the policy as adapters over the backbone (their
    matmuls add to every step); None: a full model."""

    def as_json(self) -> dict[str, Any]:
        """The facts as stored and hashed. A fact that does not apply (None) is left out, so
        the facts, and so the key, of an engine without it are what they were before it."""
        return self.model_dump(mode="json", exclude_none=True)

    def identity(self, model: str) -> dict[str, str]:
        """The ``identity`` object the profile carries (``flows/planning/tpot.py:
        ProfileIdentity``: the same keys), ``model`` its readable name (``model_label``)."""
        return {"model": model, "model_config_sha256": self.model_config_sha256, "dtype": self.dtype,
                "device": self.device, "engine": self.engine}

    def cache_key(self) -> str:
        digest = hashlib.sha256(json.dumps(self.as_json(), sort_keys=True).encode()).hexdigest()
        return f"{PROFILE_PREFIX}/{digest[:40]}.json"


class ProfileResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: dict[str, Any]
    """``TpotProfile.to_dict`` form."""
    profile_key: str
    source: Literal["measured", "cached", "skipped"]
    """``skipped``: ``measure_grid`` was False and ``profile`` is empty."""
    rejected: str | None = None
    """Why a cached profile at ``profile_key`` was not used (then ``source`` is measured)."""
    facts: ProfileFacts
    weight_bytes: int
    """Bytes of the policy's weights as published (the dtype they are stored in)."""
    kv_bytes_per_token: int
    """KV-cache bytes per token of context at the compute dtype (from the model config)."""
    store_read_bytes_per_s: float
    """Weight bytes per second this action read from the store (fetch and verification)."""
    measure_s: float
    """Seconds spent measuring (0 for a cached profile)."""


def model_label(config: dict[str, Any]) -> str:
    """A readable name of the model a ``config.json`` describes: its hub name where it keeps one,
    else its type and size.

    >>> model_label({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 64})
    'llama (hidden_size 32, num_hidden_layers 2, vocab_size 64)'
    """
    name = config.get("_name_or_path")
    if isinstance(name, str) and name:
        return name
    shape = ", ".join(f"{k} {config[k]}" for k in ("hidden_size", "num_hidden_layers", "vocab_size") if k in config)
    return f"{config.get('model_type', 'model')} ({shape})"


def check_cached(raw: bytes, facts: ProfileFacts, key: str) -> tuple[dict[str, Any] | None, str | None]:
    """(profile dict, None) when ``raw`` is a profile this module wrote for ``facts``, else
    (None, one-line reason naming the key and what is wrong)."""
    where = f"cached profile {key!r}"
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, f"{where} is not valid JSON ({exc}); measuring again"
    if not isinstance(data, dict) or data.get("schema") != CACHE_SCHEMA:
        return None, f"{where} is not a {CACHE_SCHEMA} object; measuring again"
    if data.get("facts") != facts.as_json():
        return None, f"{where} was measured for other facts than its key says; measuring again"
    reason = grid_problem(data.get("profile"))
    if reason:
        return None, f"{where}: {reason}; measuring again"
    return data["profile"], None


def grid_problem(profile: Any) -> str | None:
    """What is wrong with a profile dict's grid (None: usable)."""
    if not isinstance(profile, dict):
        return "no profile object"
    bs, cs, secs = profile.get("batch_sizes"), profile.get("contexts"), profile.get("seconds")
    if not (isinstance(bs, list) and isinstance(cs, list) and isinstance(secs, list)):
        return "batch_sizes, contexts and seconds must be lists"
    if len(secs) != len(bs) or any(not isinstance(r, list) or len(r) != len(cs) for r in secs):
        return "seconds is not a len(batch_sizes) x len(contexts) grid"
    values = [v for r in secs for v in r] + [profile.get("prefill_tokens_per_s")]
    if any(not _positive(v) for v in values):
        return "a time or the prefill rate is not a positive finite number"
    return None


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def cache_record(facts: ProfileFacts, profile: dict[str, Any]) -> dict[str, Any]:
    """The JSON object stored at ``facts.cache_key()``."""
    return {"schema": CACHE_SCHEMA, "facts": facts.as_json(), "profile": profile}
