"""``rlhfless profile``: measure the configured engine's TPOT grid and write a profile JSON.

The measurement itself runs the model (``actions.engines.profiling``); this module is the CLI
adapter. Point ``scaling.profile`` at the output to plan with measured numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flows.planning.profile import TpotProfile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML campaign configuration (model section is used)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--batch-sizes", default="1,4,16,64,128", help="comma-separated batch sizes")
    parser.add_argument("--contexts", default="32,128", help="comma-separated context lengths (tokens)")
    parser.add_argument("--output", default="profile.json", help="where to write the profile JSON")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 "
                        "(default: float32 on cpu, bfloat16 on cuda)")
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
    from actions.common.config import load_config
    from actions.common.device import parse_device, parse_dtype
    from actions.engines.profiling import measure_grid

    cfg = load_config(args.config, args.overrides)
    batches, contexts = _ints(args.batch_sizes, "--batch-sizes"), _ints(args.contexts, "--contexts")
    device = parse_device(args.device, source="--device")
    dtype = parse_dtype(args.dtype or ("bfloat16" if device.type == "cuda" else "float32"), source="--dtype")
    model = _build_model(cfg, args.model_config, device, dtype)
    # CPU: a small padded batch, as one action thread sees it; GPU: enough tokens to fill it.
    shape = (16, 512) if device.type == "cuda" else (16, 64)
    grid = measure_grid(model, model.config.vocab_size, batches, contexts, prefill_shape=shape)
    profile = TpotProfile.from_dict(grid)  # validates the grid
    Path(args.output).write_text(json.dumps(profile.to_dict(), indent=2))
    print(args.output)
    return 0


def _build_model(cfg: object, config_json: str | None, device: object, dtype: object) -> object:
    """The model to profile, in eval mode on ``device`` in ``dtype``."""
    import torch

    from actions.common.modeling import build_tiny_model, instantiate, read_model_dir

    if device.type == "cpu":  # type: ignore[attr-defined]
        torch.set_num_threads(1)  # one core per actor, as the local warm pool runs them
    if config_json is not None:
        model = _random_model(config_json, device, dtype)
    elif cfg.model.path:  # type: ignore[attr-defined]
        model, _ = instantiate(*read_model_dir(cfg.model.path))  # type: ignore[attr-defined]
    else:
        m = cfg.model  # type: ignore[attr-defined]
        model, _ = build_tiny_model(hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                                    intermediate_size=m.intermediate_size, max_positions=m.max_positions, seed=0)
    return model.to(device=device, dtype=dtype).eval()


def _random_model(config_json: str, device: object, dtype: object) -> object:
    """A randomly initialised causal LM of the shape ``config_json`` describes, built directly
    on ``device`` (a 7B model never passes through host memory). Timing does not depend on
    the weights' values."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        data = json.loads(Path(config_json).read_text())
        config = AutoConfig.for_model(data.pop("model_type"), **data)
    except FileNotFoundError:
        raise ValueError(f"--model-config {config_json!r} does not exist; pass a Hugging Face config.json") from None
    except (json.JSONDecodeError, KeyError, ValueError) as exc:
        raise ValueError(f"--model-config {config_json!r} is not a Hugging Face config.json with a "
                         f"model_type ({exc}); fix the file") from None
    torch.manual_seed(0)
    with torch.device(device):  # type: ignore[arg-type]
        return AutoModelForCausalLM.from_config(config, dtype=dtype)
