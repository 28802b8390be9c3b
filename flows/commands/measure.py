"""``rlhfless profile``: measure the configured engine's TPOT grid and write a profile JSON.

The measurement itself runs the model (``actions.engines.profiling``); this module is the CLI
adapter. Point ``scaling.profile`` at the output to plan with measured numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from flows.planning.tpot import TpotProfile

if TYPE_CHECKING:  # torch is imported only when a profile is measured (flows stay torch-free)
    import torch

    from flows.config import CampaignConfig


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
    from actions.engines.profiling import measure_grid
    from actions.models.device import parse_device, parse_dtype
    from flows.config import load_config

    cfg = load_config(args.config, args.overrides)
    batches, contexts = _ints(args.batch_sizes, "--batch-sizes"), _ints(args.contexts, "--contexts")
    device = parse_device(args.device, source="--device")
    dtype = parse_dtype(args.dtype or ("bfloat16" if device.type == "cuda" else "float32"), source="--dtype")
    model = build_profile_model(cfg, args.model_config, device, dtype)
    # CPU: a small padded batch, as one action thread sees it; GPU: enough tokens to fill it.
    shape = (16, 512) if device.type == "cuda" else (16, 64)
    gen = cfg.generation  # measured with the campaign's decode settings, as its actions decode
    grid = measure_grid(model, model.config.vocab_size, batches, contexts, prefill_shape=shape,
                        kv_cache=gen.kv_cache, cuda_graphs=gen.cuda_graphs, compile_decode=gen.compile_decode,
                        fused_sampling=gen.fused_sampling)
    profile = TpotProfile.from_dict(grid)  # validates the grid
    Path(args.output).write_text(json.dumps(profile.to_dict(), indent=2))
    print(args.output)
    return 0


def build_profile_model(cfg: CampaignConfig, config_json: str | None, device: torch.device,
                 dtype: torch.dtype) -> torch.nn.Module:
    """The model to profile, in eval mode on ``device`` in ``dtype``: a random one of
    ``config_json``'s shape, else the campaign's (``model.path`` or its tiny model). On the CPU
    torch gets one thread, as one action of the local warm pool has."""
    import torch

    from actions.models.modeling import build_tiny_model, instantiate, random_model_from_config, read_model_dir

    if device.type == "cpu":
        torch.set_num_threads(1)  # one core per actor, as the local warm pool runs them
    if config_json is not None:
        model = random_model_from_config(config_json, device, dtype, source="--model-config")
    elif cfg.model.path:
        model, _ = instantiate(*read_model_dir(cfg.model.path))
    else:
        m = cfg.model
        model, _ = build_tiny_model(hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                                    intermediate_size=m.intermediate_size, max_positions=m.max_positions, seed=0)
    return model.to(device=device, dtype=dtype).eval()
