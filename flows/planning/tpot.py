"""Decode-speed profile: time per output token (TPOT) and prefill throughput (paper §3.5, §3.7).

The planner and the simulator need ``TPOT(batch, context)``: the wall time of one decode step
of an actor that holds ``batch`` live sequences whose mean context (prompt + tokens generated
so far) is ``context`` tokens. RLHFless profiles it with dummy batches at start-up [P §3.7];
here it is a small grid ``seconds[b][c]`` over ``batch_sizes`` x ``contexts``, read with
bilinear interpolation. Beyond the grid it extrapolates linearly in both axes (decode bytes
and attention flops grow linearly in batch and context, so clamping would under-estimate a
long-context or large-batch actor). Results are floored at the smallest grid value.

``roofline_profile`` builds such a grid without a GPU, from a roofline model of one decode
step on an actor of ``g`` GPUs (tensor parallel, weights and KV split evenly)::

    bytes(b, c) = W / g + b * c * kv_bytes_per_token / g          # weights + KV read per step
    flops(b, c) = (2 * P * b + 4 * layers * hidden * c * b) / g   # GEMMs + attention (QK^T, AV)
    TPOT(b, c)  = max(bytes / (hbm_bw * mem_eff), flops / (peak_bf16 * compute_eff))

with ``W = P * dtype_bytes`` and ``kv_bytes_per_token = 2 * layers * kv_heads * head_dim *
dtype_bytes``. Prefill is compute bound: ``prefill_tokens_per_s = g * peak * compute_eff /
(2 * P)`` (attention over prompts <= 1k tokens is a few percent and is left out).

KV memory bounds the batch. An actor holds ``capacity = (g * memory * util - W) /
kv_bytes_per_token`` tokens of KV (``util = 0.9``, vLLM's default ``gpu_memory_utilization``),
so at most ``k = floor(capacity / c)`` sequences of context ``c`` are resident at once. A batch
of ``b > k`` live sequences is served in resident batches of ``k``, and on average each
sequence gains one token every ``b / k`` steps: ``TPOT(b, c) = (b / k) * TPOT_roofline(k, c)``,
the throughput of waves of ``k`` under continuous batching (a partial wave shares its steps,
so there is no rounding up). This is what makes a large model on few GPUs (Llama2-70B on 2 x H100:
about 6 GB, 18k tokens of KV) slow at large batches, and scaling out pay (paper §4.7); for
Qwen2.5-7B on 2 x H100 (about 2.3M tokens) it binds only beyond the traces' batches.

Deviations / simplifications [I]: the paper uses profiled TPOT (and Vidur in simulation);
the roofline has no kernel-launch, sampling, scheduler or tensor-parallel all-reduce time,
so it is a lower bound of a real engine and gives a conservative (small) batch effect.
Efficiencies: ``mem_eff = 0.8`` (decode GEMV/paged attention typically reach 70-85% of HBM
bandwidth) and ``compute_eff = 0.6`` (decode GEMMs at batch 64-512).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from actions.config.quoting import quote

TpotFn = Callable[[int, float], float]


@dataclass(frozen=True)
class GpuSpec:
    """One GPU: HBM bandwidth (B/s), dense bf16 peak (FLOP/s), memory (B), efficiencies."""

    name: str
    hbm_bytes_per_s: float
    peak_flops: float
    memory_bytes: float
    mem_eff: float = 0.8
    compute_eff: float = 0.6


@dataclass(frozen=True)
class ModelSpec:
    """Dense decoder-only model shape; ``dtype_bytes`` applies to weights and KV cache."""

    name: str
    num_params: float
    num_layers: int
    hidden: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V, every layer, every KV head (GQA keeps this small).
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("H100-SXM", 3.35e12, 989e12, 80e9),
    "h200": GpuSpec("H200-SXM", 4.8e12, 989e12, 141e9),
    "a100": GpuSpec("A100-SXM-80G", 2.039e12, 312e12, 80e9),
    "l40s": GpuSpec("L40S", 0.864e12, 362e12, 48e9),
}

MODELS: dict[str, ModelSpec] = {
    "qwen2.5-3b": ModelSpec("Qwen2.5-3B", 3.09e9, 36, 2048, 2, 128),
    "qwen2.5-7b": ModelSpec("Qwen2.5-7B", 7.62e9, 28, 3584, 4, 128),
    "llama2-70b": ModelSpec("Llama2-70B", 68.98e9, 80, 8192, 8, 128),
}

CONTEXT_BUCKET = 16  # tokens per context bucket in bucket_row
MEMORY_UTILIZATION = 0.9  # share of GPU memory an engine takes for weights + KV (vLLM default)

_ROOFLINE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048)
_ROOFLINE_CONTEXTS = (0, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class ProfileIdentity:
    """What a profile was measured on (``rlhfless profile``, the live ``profile`` action) or
    modelled for (a roofline); the ``identity`` object of a profile JSON. A campaign planning
    from a ``scaling.profile`` file compares it with its own (``differences``) and warns where
    they differ. None: not known (a roofline has no config file, an older file states nothing)."""

    model: str = "an unnamed model"
    """A readable name (a hub name, or the architecture's type and size)."""
    model_config_sha256: str | None = None
    """sha256 of the model's ``config.json`` as the campaign stores it (the architecture)."""
    dtype: str | None = None
    device: str | None = None
    """Device type and model name, e.g. ``cpu:AMD EPYC 7B13``, or a GPU's name for a roofline."""
    engine: str | None = None
    """``torch``, ``vllm`` or ``roofline``."""

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Any) -> "ProfileIdentity":
        known = set(cls.__dataclass_fields__)
        if not isinstance(data, dict) or not all(k in known and isinstance(v, str) for k, v in data.items()):
            raise ValueError(f"profile.identity={_shown(data)}: must be an object of strings, keys among "
                             f"{', '.join(sorted(known))}")
        return cls(**data)

    def differences(self, other: "ProfileIdentity") -> list[str]:
        """Each fact both identities state and give differently, as ``fact mine (other: theirs)``;
        the readable names are not compared (the same model may go by several)."""
        out = []
        for name in ("model_config_sha256", "dtype", "device", "engine"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is not None and theirs is not None and mine != theirs:
                if name == "model_config_sha256":  # a digest: its start tells two apart
                    name, mine, theirs = "model config", mine[:12], theirs[:12]
                out.append(f"{name} {mine} (this campaign: {theirs})")
        return out


@dataclass(frozen=True)
class TpotProfile:
    """TPOT grid for one actor size. ``seconds[i][j]`` = TPOT at ``batch_sizes[i]``,
    ``contexts[j]``; both axes strictly increasing with at least two points (batches >= 1,
    contexts >= 0), every time finite and > 0; ValueError naming ``profile.<field>`` otherwise."""

    batch_sizes: tuple[int, ...]
    contexts: tuple[float, ...]
    seconds: tuple[tuple[float, ...], ...]
    prefill_tokens_per_s: float
    name: str = "custom"
    shrink_s: float = 0.0
    """Fixed seconds of a decode step at which rows finish and the engine drops them from its
    batch and KV cache (the torch engine copies the cache; paged KV, as in vLLM, and the
    roofline have no such cost: 0). See ``shrink``."""
    shrink_s_per_kv_token: float = 0.0
    """... plus this many seconds per cached token (rows before the drop x context)."""
    identity: ProfileIdentity | None = None
    """What the grid was measured on or modelled for; None where the file states nothing."""
    # per-batch interpolated rows, filled lazily by tpot_fn (planning speed, not state)
    _rows: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for axis, values in (("batch_sizes", self.batch_sizes), ("contexts", self.contexts)):
            if len(values) < 2 or any(b <= a for a, b in zip(values, values[1:])):
                raise ValueError(f"profile.{axis}={_shown(list(values))}: need >= 2 strictly "
                                 "increasing values")
        if self.batch_sizes[0] < 1 or not (0 <= self.contexts[0] and math.isfinite(self.contexts[-1])):
            raise ValueError(f"profile.batch_sizes={_shown(list(self.batch_sizes))}, contexts="
                             f"{_shown(list(self.contexts))}: batch sizes must be >= 1 and contexts finite, >= 0")
        if len(self.seconds) != len(self.batch_sizes) or any(
                len(row) != len(self.contexts) for row in self.seconds):
            raise ValueError("profile.seconds: must be a len(batch_sizes) x len(contexts) grid")
        for i, row in enumerate(self.seconds):  # NaN, 0 or < 0 would plan nonsense (or fail mid-simulation)
            for j, value in enumerate(row):
                if not (math.isfinite(value) and value > 0):
                    raise ValueError(f"profile.seconds[{i}][{j}]={value}: every decode-step time must be a "
                                     "finite number of seconds > 0")
        if not (math.isfinite(self.prefill_tokens_per_s) and self.prefill_tokens_per_s > 0):
            raise ValueError(f"profile.prefill_tokens_per_s={self.prefill_tokens_per_s}: "
                             "must be a finite number > 0")
        for name in ("shrink_s", "shrink_s_per_kv_token"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"profile.{name}={getattr(self, name)}: must be a finite number >= 0 seconds")

    def with_decode_speed(self, speedup: float, tag: str) -> "TpotProfile":
        """This profile with every decode-step time divided by ``speedup`` (> 1: faster) and
        ``/tag`` added to its name; prefill and row-drop costs stay. Itself when ``speedup`` is 1.
        Used for speculative decoding's measured speed-up and the live calibration's decode scale."""
        if abs(speedup - 1.0) < 1e-9:
            return self
        seconds = tuple(tuple(s / speedup for s in row) for row in self.seconds)
        return replace(self, seconds=seconds, name=f"{self.name}/{tag}")

    def shrink(self, batch: int, context: float) -> float:
        """Seconds to drop finished rows from a batch of ``batch`` rows at ``context`` tokens.

        The simulator adds it at every decode step where some rows finish and others go on;
        the planner's estimate leaves it out (it ranks candidate fan-outs, and the cost grows
        with the same batch x context as the decode steps do).
        """
        return self.shrink_s + self.shrink_s_per_kv_token * batch * context

    def _row(self, batch: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Values and per-cell slopes along context, interpolated at this batch size."""
        cached = self._rows.get(batch)
        if cached is not None:
            return cached
        bs = self.batch_sizes
        i = min(max(bisect_right(bs, batch) - 1, 0), len(bs) - 2)
        w = (batch - bs[i]) / (bs[i + 1] - bs[i])  # > 1 extrapolates linearly
        lo, hi = self.seconds[i], self.seconds[i + 1]
        vals = tuple(a + (b - a) * w for a, b in zip(lo, hi))
        cs = self.contexts
        slopes = tuple((vals[j + 1] - vals[j]) / (cs[j + 1] - cs[j]) for j in range(len(cs) - 1))
        self._rows[batch] = (vals, slopes)
        return vals, slopes

    def tpot(self, batch: int, context: float) -> float:
        """Seconds per decode step for ``batch`` live sequences at mean ``context`` tokens."""
        vals, slopes = self._row(batch)
        cs = self.contexts
        j = min(max(bisect_right(cs, context) - 1, 0), len(cs) - 2)
        return max(vals[j] + slopes[j] * (context - cs[j]), self._floor)

    @property
    def _floor(self) -> float:
        floor = self._rows.get("floor")
        if floor is None:  # results never go below the grid's smallest value
            floor = self._rows["floor"] = min(min(row) for row in self.seconds)
        return floor

    def tpot_fn(self) -> TpotFn:
        """A ``tpot(batch, context)`` closure with cached per-batch rows."""
        cs, last, floor, row = self.contexts, len(self.contexts) - 2, self._floor, self._row

        def fn(batch: int, context: float) -> float:
            vals, slopes = row(batch)
            j = bisect_right(cs, context) - 1
            j = 0 if j < 0 else (last if j > last else j)
            v = vals[j] + slopes[j] * (context - cs[j])
            return v if v > floor else floor
        return fn

    def bucket_row(self, batch: int, max_context: float) -> list[float]:
        """TPOT at ``batch`` for contexts bucketed by ``CONTEXT_BUCKET`` tokens.

        ``row[int(c) // CONTEXT_BUCKET]`` is TPOT at that bucket's centre (error at most half
        a bucket of context, ~1e-4 relative for real profiles). The planner's hot loop uses
        it because one list index is several times cheaper than a bilinear lookup; rows are
        cached per batch and grown on demand.
        """
        need = int(max_context) // CONTEXT_BUCKET + 2
        key = ("bucket", batch)
        row = self._rows.get(key)
        if row is None or len(row) < need:
            vals, slopes = self._row(batch)
            floor = self._floor
            row = [max(vals[j] + slopes[j] * dc, floor) for j, dc in self._bucket_cells(need)]
            self._rows[key] = row
        return row

    def _bucket_cells(self, need: int) -> list[tuple[int, float]]:
        """(grid cell, context offset in the cell) of each bucket centre; shared by all rows."""
        cells = self._rows.get("cells")
        if cells is None or len(cells) < need:
            cs, last = self.contexts, len(self.contexts) - 2
            size = max(need, 2 * len(cells or ()))  # grow geometrically
            cells = []
            for k in range(size):
                c = (k + 0.5) * CONTEXT_BUCKET
                j = min(max(bisect_right(cs, c) - 1, 0), last)
                cells.append((j, c - cs[j]))
            self._rows["cells"] = cells
        return cells[:need]

    def to_dict(self) -> dict:
        return {"name": self.name, "batch_sizes": list(self.batch_sizes),
                "contexts": list(self.contexts), "seconds": [list(r) for r in self.seconds],
                "prefill_tokens_per_s": self.prefill_tokens_per_s, "shrink_s": self.shrink_s,
                "shrink_s_per_kv_token": self.shrink_s_per_kv_token,
                **({"identity": self.identity.to_dict()} if self.identity is not None else {})}

    @classmethod
    def from_dict(cls, data: Any) -> "TpotProfile":
        """The profile ``to_dict`` wrote (``shrink_*``, ``name`` and ``identity`` may be absent,
        as in older files). ValueError naming the ``profile.<key>`` that is missing or malformed."""
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object with {', '.join(_REQUIRED)}, not {type(data).__name__}")
        missing = [key for key in _REQUIRED if key not in data]
        if missing:
            raise ValueError(f"profile.{missing[0]} is missing (a profile has {', '.join(_REQUIRED)})")
        seconds = data["seconds"]
        if not isinstance(seconds, list) or not all(isinstance(row, list) for row in seconds):
            raise ValueError(f"profile.seconds={_shown(seconds)}: must be a list of rows (lists) of seconds")
        return cls(batch_sizes=tuple(int(b) for b in _numbers(data, "batch_sizes", integers=True)),
                   contexts=tuple(_numbers(data, "contexts")),
                   seconds=tuple(tuple(_numbers({"seconds": row}, "seconds")) for row in seconds),
                   prefill_tokens_per_s=_number(data, "prefill_tokens_per_s"),
                   name=str(data.get("name", "custom")),
                   shrink_s=_number(data, "shrink_s", 0.0),  # absent in older profiles
                   shrink_s_per_kv_token=_number(data, "shrink_s_per_kv_token", 0.0),
                   identity=None if data.get("identity") is None else ProfileIdentity.from_dict(data["identity"]))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path, source: str = "profile") -> "TpotProfile":
        """The profile JSON at ``path`` (or the profile a store's cache entry under ``profiles/``
        holds beside its facts). ``source`` names where the path came from (a setting,
        ``scaling.profile``, or a flag, ``--profile``) in the one-line ValueError a file that
        cannot be read, is not JSON or is not a valid profile raises."""
        where = f"{source}={str(path)!r}"
        fix = "point it at a profile JSON written by `rlhfless profile`"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"{where} cannot be read ({exc.strerror or exc}); {fix}") from None
        except UnicodeDecodeError:
            raise ValueError(f"{where} is not UTF-8 text; {fix}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where} is not valid JSON (line {exc.lineno}: {exc.msg}); {fix}") from None
        except (ValueError, RecursionError):  # an integer of thousands of digits, nesting too deep
            raise ValueError(f"{where} holds a number too long or nesting too deep for a profile; {fix}") from None
        if isinstance(data, dict) and "batch_sizes" not in data and isinstance(data.get("profile"), dict):
            data = data["profile"]  # a campaign's cached measurement (the store's profiles/<key>.json)
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}; fix the file or measure one with `rlhfless profile`") from None


_REQUIRED = ("batch_sizes", "contexts", "seconds", "prefill_tokens_per_s")


def _shown(value: Any) -> str:
    """A value from a file, quoted short for an error line (never built whole: a long list)."""
    return quote(value, 80)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(data: dict, key: str, default: float | None = None) -> float:
    value = data.get(key, default)
    if not _is_number(value):
        raise ValueError(f"profile.{key}={_shown(value)}: must be a number")
    try:
        return float(value)
    except OverflowError:  # an integer beyond float range
        raise ValueError(f"profile.{key}={_shown(value)}: out of range") from None


def _numbers(data: dict, key: str, integers: bool = False) -> list[float]:
    """``data[key]`` as a list of numbers (integers where asked); ValueError naming the key."""
    values = data[key]
    kind = "integers" if integers else "numbers"
    if not isinstance(values, list) or not all(
            _is_number(v) and (not integers or isinstance(v, int) or v.is_integer()) for v in values):
        raise ValueError(f"profile.{key}={_shown(values)}: must be a list of {kind}")
    return [_number({key: v}, key) for v in values]


# A measured-shape estimate for the tiny default model on one CPU core per actor: a decode
# step costs a fixed ~4 ms of framework overhead plus ~0.06 ms per running sequence. Only a
# fallback: campaigns plan from the pool's measured profile (flows/campaign/live_profile.py).
CPU_TINY_PROFILE = TpotProfile(
    batch_sizes=(1, 256), contexts=(16.0, 512.0),
    seconds=((0.004, 0.0045), (0.004 + 255 * 6e-5, 0.0045 + 255 * 8e-5)),
    prefill_tokens_per_s=20_000.0, name="cpu-tiny-estimate",
)


def kv_capacity_tokens(gpu: GpuSpec, model: ModelSpec, gpus: int,
                       memory_utilization: float = MEMORY_UTILIZATION) -> float:
    """Tokens of KV one actor of ``gpus`` x ``gpu`` holds next to the model's weights.

    Raises:
        ValueError: the weights alone do not fit (names the sizes and the fix).
    """
    usable = gpus * gpu.memory_bytes * memory_utilization
    free = usable - model.weight_bytes
    if free <= 0:
        raise ValueError(f"{model.name} weights ({model.weight_bytes / 1e9:.0f} GB) do not fit {gpus} x "
                         f"{gpu.name} ({usable / 1e9:.0f} GB usable); raise gpus_per_actor")
    return free / model.kv_bytes_per_token


def roofline_tpot(gpu: GpuSpec, model: ModelSpec, gpus: int, batch: int, context: float,
                  capacity_tokens: float = float("inf")) -> float:
    """One decode step's time from the roofline formula in the module docstring; with
    ``capacity_tokens`` a batch whose KV does not fit runs as time-shared resident batches."""
    if context > 0 and batch * context > capacity_tokens:
        resident = max(1, int(capacity_tokens // context))
        return batch / resident * roofline_tpot(gpu, model, gpus, resident, context)
    bytes_moved = (model.weight_bytes + batch * context * model.kv_bytes_per_token) / gpus
    flops = (2 * model.num_params * batch + 4 * model.num_layers * model.hidden * context * batch)
    return max(bytes_moved / (gpu.hbm_bytes_per_s * gpu.mem_eff),
               flops / gpus / (gpu.peak_flops * gpu.compute_eff))


LEARNER_MFU = 0.4
"""Model FLOP utilisation assumed for the learner's scoring and training passes."""


def learner_tokens_per_s(gpu: GpuSpec, model: ModelSpec, gpus: int, mfu: float = LEARNER_MFU) -> float:
    """Rollout tokens per second the learner scores and trains on (prompt + response tokens).

    Per token: 6 x params FLOPs for training's forward and backward plus 2 x params for each
    of scoring's two forwards (old and reference policy) = 10 x params, at ``mfu`` of the
    ``gpus`` GPUs' dense peak. One epoch over the rollout, no critic (GRPO).
    """
    if not 0 < mfu <= 1 or gpus < 1:
        raise ValueError(f"learner mfu={mfu}, gpus={gpus}: need 0 < mfu <= 1 and gpus >= 1")
    return gpus * gpu.peak_flops * mfu / (10.0 * model.num_params)


def roofline_profile(gpu: GpuSpec, model: ModelSpec, gpus_per_actor: int,
                     batch_sizes: Sequence[int] = _ROOFLINE_BATCHES,
                     contexts: Sequence[float] = _ROOFLINE_CONTEXTS) -> TpotProfile:
    """Roofline TPOT grid for ``model`` on an actor of ``gpus_per_actor`` x ``gpu``."""
    if gpus_per_actor < 1:
        raise ValueError(f"gpus_per_actor={gpus_per_actor}: must be >= 1")
    capacity = kv_capacity_tokens(gpu, model, gpus_per_actor)
    seconds = tuple(tuple(roofline_tpot(gpu, model, gpus_per_actor, b, c, capacity) for c in contexts)
                    for b in batch_sizes)
    prefill = gpus_per_actor * gpu.peak_flops * gpu.compute_eff / (2 * model.num_params)
    dtype = {2: "bfloat16", 4: "float32"}.get(model.dtype_bytes)
    return TpotProfile(tuple(batch_sizes), tuple(float(c) for c in contexts), seconds, prefill,
                       name=f"roofline:{gpu.name}:{model.name}:tp{gpus_per_actor}",
                       identity=ProfileIdentity(model.name, dtype=dtype, device=gpu.name, engine="roofline"))


def parse_roofline_spec(spec: str, gpus_per_actor: int) -> TpotProfile:
    """``roofline:<gpu>:<model>`` (e.g. ``roofline:h100:qwen2.5-7b``) -> profile."""
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] != "roofline" or parts[1] not in GPUS or parts[2] not in MODELS:
        raise ValueError(f"profile={spec!r}: expected roofline:<gpu>:<model> with gpu in "
                         f"{sorted(GPUS)} and model in {sorted(MODELS)}, or a JSON file path")
    return roofline_profile(GPUS[parts[1]], MODELS[parts[2]], gpus_per_actor)
