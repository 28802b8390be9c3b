"""``rlhfless profile``: measure the configured engine's TPOT grid and write a profile JSON.

The measurement itself runs the model (``actions.engines.profiling`` for the torch engine,
``actions.engines.vllm_profiling`` for ``generation.engine: vllm``); this module is the CLI
adapter. It measures what the campaign's generate actions would run: the configured engine,
in ``model.dtype`` (unless ``--dtype`` says otherwise), with ``model.lora``'s adapter attached
(the seeded one: speed does not depend on its values). Point ``scaling.profile`` at the output
to plan with measured numbers. The file states what it was measured on (``identity``,
``profile_identity``), so a campaign of another model, dtype, device or engine warns.

vLLM is measured as the generate action starts it (``factory.load_engine``): the campaign's
weights in a scratch model folder, the engine's own defaults. The profile's name carries the
dtype the engine computes in, which can differ from ``model.dtype`` (vLLM's CPU backend always
computes in float32); a note on stderr says so. Without vLLM installed, or with a model its CPU
build cannot run, the command refuses as ``train`` does (``actions/engines/preflight.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from flows.planning.tpot import ProfileIdentity, TpotProfile

if TYPE_CHECKING:  # torch is imported only when a profile is measured (flows stay torch-free)
    import torch

    from flows.config import CampaignConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML campaign configuration (model section is used)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set algorithm.name=ppo (repeatable)")
    parser.add_argument("--batch-sizes", default="1,4,16,64,128", help="comma-separated batch sizes")
    parser.add_argument("--contexts", default="32,128", help="comma-separated context lengths (tokens)")
    parser.add_argument("--output", default="profile.json", help="where to write the profile JSON")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the config's "
                        "model.dtype; for auto, float32 on cpu and bfloat16 on cuda)")
    parser.add_argument("--model-config", default=None, metavar="CONFIG_JSON",
                        help="a Hugging Face config.json: profile a randomly initialised model of that "
                             "shape (e.g. a 7B model on a GPU) instead of the campaign's model; nothing "
                             "is downloaded")


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r} must be comma-separated integers, e.g. 1,4,16") from None
    if len(values) < 2 or values != sorted(set(values)) or values[0] < 1:
        raise ValueError(f"{flag} {text!r} needs at least two increasing positive values")
    return values


def run(args: argparse.Namespace) -> int:
    from actions.engines.preflight import check_engine
    from actions.models.device import parse_device
    from flows.config import load_config

    cfg = load_config(args.config, args.overrides)
    batches, contexts = _ints(args.batch_sizes, "--batch-sizes"), _ints(args.contexts, "--contexts")
    output = check_output(args.output)  # before the measurement, which takes seconds to minutes
    device = parse_device(args.device, source="--device")
    dtype = profile_dtype(args.dtype, cfg.model.dtype, device)
    check_engine(cfg, local_actions=True, device=device.type)  # it runs here: vLLM missing is train's refusal
    if args.model_config is None and cfg.model.path:  # train's checks of the folder, one line each
        from actions.models.weight_shapes import check_weight_shapes
        from actions.prepare import validate_model_dir

        validate_model_dir(cfg.model.path)
        check_weight_shapes(cfg.model.path, "model.path", "AutoModelForCausalLM")
    if args.model_config is None:  # model.lora's targets and rank, as train checks them
        from actions.models.lora_targets import check_targets

        check_targets(cfg.workload())
    # CPU: a small padded batch, as one action thread sees it; GPU: enough tokens to fill it.
    shape = (16, 512) if device.type == "cuda" else (16, 64)
    if cfg.generation.engine == "vllm":  # its identity states the dtype vLLM computes in, as the campaign's does
        grid, dtype = measure_vllm(cfg, args.model_config, device, dtype, batches, contexts, shape)
    else:
        from actions.engines.profiling import measure_grid

        model = build_profile_model(cfg, args.model_config, device, dtype)
        gen = cfg.generation  # measured with the campaign's decode settings, as its actions decode
        name = f"measured-torch-{device.type}-{str(dtype).removeprefix('torch.')}" + ("-lora" if cfg.model.lora else "")
        grid = measure_grid(model, model.config.vocab_size, batches, contexts, prefill_shape=shape, name=name,
                            kv_cache=gen.kv_cache, cuda_graphs=gen.cuda_graphs, compile_decode=gen.compile_decode,
                            fused_sampling=gen.fused_sampling)
    grid["identity"] = profile_identity(cfg, args.model_config, device, dtype).to_dict()
    profile = TpotProfile.from_dict(grid)  # validates the grid
    write_whole(output, json.dumps(profile.to_dict(), indent=2))
    print(args.output)
    return 0


def check_output(text: str) -> Path:
    """``--output`` as a path a file can be written at; ValueError naming the flag when it is a
    directory or its folder does not exist or cannot be written."""
    import os

    path = Path(text)
    if path.is_dir():
        raise ValueError(f"--output {text!r} is a directory; pass a file path, e.g. {str(path / 'profile.json')!r}")
    folder = path.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--output {text!r}: the folder {str(folder)!r} does not exist or cannot be written; "
                         "create it or pick another path")
    return path


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, renamed over it: a reader
    (or a campaign's ``scaling.profile``) sees the old file or the new one, never half of one."""
    import os

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # open() gives it the umask's mode, as before
    try:
        with open(tmp, "x") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def profile_dtype(flag: str | None, setting: str, device: torch.device) -> torch.dtype:
    """The dtype to measure in: ``--dtype`` (``flag``) when given, else what an action on
    ``device`` computes in for ``model.dtype`` (``setting``; ``action_dtype``: ``auto`` is
    ``RLHFLESS_DTYPE`` where set, else bfloat16 on CUDA, float32 on the CPU). ValueError naming
    the flag or field for an unknown name."""
    from actions.models.device import action_dtype, parse_dtype

    return parse_dtype(flag, source="--dtype") if flag is not None else action_dtype(setting, device)


def profile_identity(cfg: CampaignConfig, config_json: str | None, device: torch.device,
                     dtype: torch.dtype) -> ProfileIdentity:
    """What the profile is measured on, stated as the live ``profile`` action states a
    campaign's (``ProfileFacts``), so a campaign planning from the file can tell whether it was
    measured for its model: the digest of the model's ``config.json`` (``--model-config``'s,
    ``model.path``'s, or the tiny model's as ``prepare`` stores it), a readable name, the dtype,
    the device (``actions.profile.device_name``) and ``generation.engine``."""
    import hashlib

    from actions.profile import device_name
    from actions.store.profile_cache import model_label

    if config_json is not None:
        raw = Path(config_json).read_bytes()
    elif cfg.model.path:
        raw = (Path(cfg.model.path) / "config.json").read_bytes()
    else:
        raw = campaign_model(cfg)[0]["config.json"]  # the tiny model: milliseconds to build again
    return ProfileIdentity(model_label(json.loads(raw)), hashlib.sha256(raw).hexdigest(),
                           str(dtype).removeprefix("torch."), device_name(device), cfg.generation.engine)


def build_profile_model(cfg: CampaignConfig, config_json: str | None, device: torch.device,
                 dtype: torch.dtype) -> torch.nn.Module:
    """The model to profile, in eval mode on ``device`` in ``dtype``: a random one of
    ``config_json``'s shape, else the campaign's (``model.path`` or its tiny model); with
    ``model.lora``, the seeded adapter attached as a LoRA campaign's generate action attaches
    it to the backbone. On the CPU torch gets one thread, as one action of the local warm pool
    has.

    Raises:
        ValueError: an unreadable ``config_json`` or ``model.path``, or ``model.lora``'s
            target_modules matching no module of the model.
    """
    import torch

    from actions.models.modeling import instantiate, random_model_from_config

    if device.type == "cpu":
        torch.set_num_threads(1)  # one core per actor, as the local warm pool runs them
    if config_json is not None:
        model = random_model_from_config(config_json, device, dtype, source="--model-config")
    else:
        model, _ = instantiate(*campaign_model(cfg))
    model = model.to(device=device, dtype=dtype).eval()
    if cfg.model.lora is not None:
        from actions.models.lora import attach_adapter

        model = attach_adapter(model, cfg.model.lora, None)
    return model


def campaign_model(cfg: CampaignConfig) -> tuple[dict[str, bytes], dict[str, torch.Tensor]]:
    """(base files, fp32 tensors) of the campaign's model: ``model.path``, else its tiny model as
    ``prepare`` builds it (the task's characters in its vocabulary)."""
    from actions.models.modeling import base_files, build_tiny_model, read_model_dir
    from actions.tasks import get_task

    if cfg.model.path:
        return read_model_dir(cfg.model.path)
    m = cfg.model
    model, tokenizer = build_tiny_model(hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                                        intermediate_size=m.intermediate_size, max_positions=m.max_positions,
                                        seed=cfg.seed, extra_chars=get_task(cfg.data.task).extra_chars)
    return base_files(model, tokenizer), model.state_dict()


def measure_vllm(cfg: CampaignConfig, config_json: str | None, device: torch.device, dtype: torch.dtype,
                 batches: list[int], contexts: list[int], shape: tuple[int, int]) -> tuple[dict, torch.dtype]:
    """(the vLLM engine's grid (``vllm_profiling.measure_grid``, no push measured), the dtype
    the engine computes in) on the campaign's model, its weights stored in ``dtype`` and the
    engine started as the generate action starts it; shut down and its folder removed
    afterwards. The campaign's ``profile`` action names and keys its profile by that dtype too.

    Raises:
        ValueError: ``config_json`` given (vLLM loads a model folder), or ``device`` is not
            where the installed vLLM runs.
    """
    import shutil

    from transformers import AutoTokenizer

    from actions.engines.factory import make_engine, write_model_dir
    from actions.engines.preflight import vllm_backend
    from actions.engines.vllm_profiling import measure_grid

    if config_json is not None:
        raise ValueError(f"--model-config {config_json!r} builds a random torch model, but generation.engine 'vllm' "
                         "loads a model folder: set model.path to one and drop --model-config, or use "
                         "generation.engine=torch")
    if device.type != vllm_backend():
        raise ValueError(f"--device {str(device)!r}: the installed vLLM runs on {vllm_backend()}; "
                         f"pass --device {vllm_backend()}")
    files, tensors = campaign_model(cfg)
    model_dir = write_model_dir(files, {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()})
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
        engine = make_engine("vllm", None, tokenizer, model_dir=model_dir,
                             fused_sampling=cfg.generation.fused_sampling, **cfg.generation.vllm.llm_kwargs())
        try:
            computes = engine.llm.llm_engine.model_config.dtype
            named = str(computes).removeprefix("torch.")
            if computes != dtype:
                print(f"rlhfless profile: note: vLLM computes in {named} here (as the campaign's generate "
                      f"actions will), not {str(dtype).removeprefix('torch.')}", file=sys.stderr)
            return measure_grid(engine, engine.vocab_size, batches, contexts, prefill_shape=shape,
                                name=f"measured-vllm-{device.type}-{named}"), computes
        finally:
            engine.shutdown()
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
