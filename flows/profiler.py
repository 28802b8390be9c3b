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
    from actions.common.modeling import build_tiny_model, instantiate, read_model_dir
    from actions.engines.profiling import measure_grid
    import torch

    cfg = load_config(args.config, args.overrides)
    batches, contexts = _ints(args.batch_sizes, "--batch-sizes"), _ints(args.contexts, "--contexts")
    torch.set_num_threads(1)  # one core per actor, as the local warm pool runs them
    if cfg.model.path:
        model, _ = instantiate(*read_model_dir(cfg.model.path))
    else:
        m = cfg.model
        model, _ = build_tiny_model(hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                                    intermediate_size=m.intermediate_size, max_positions=m.max_positions, seed=0)
    model.eval()
    grid = measure_grid(model, model.config.vocab_size, batches, contexts)
    profile = TpotProfile.from_dict(grid)  # validates the grid
    Path(args.output).write_text(json.dumps(profile.to_dict(), indent=2))
    print(args.output)
    return 0
