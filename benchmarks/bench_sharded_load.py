"""Peak memory and store reads per rank of loading a bf16 train step's state onto FSDP2 ranks:
the sharded learner's loading against loading everything whole on every rank, side by side.

What a rank of ``train.world_size: N`` does before its update (``actions/rl/sharded_train.py``):
shard the policy (fp32 shards, ``fsdp.shard``) and put the stored optimizer state into the shards
(the fp32 master copy of every bf16 weight, AdamW's two moments). Two methods, each on fresh
ranks (gloo, the CPU):

* ``streamed`` -- the action's code: the state opened lazily (``weights.StoredTensors``), each
  unit made fp32 just before it is sharded, each stored tensor fetched by one rank only and
  scattered, every rank receiving its shard (``state_scatter.scattered``; each rank's own
  tensors fetched ahead within ``--budget`` bytes, ``StoredTensors.stream``);
* ``whole`` -- the baseline, the learner's code before streaming, reproduced line for line:
  every optimizer tensor read at once (``load_tensors``), each master copied whole into its
  parameter, the whole model made fp32, then sharded, each moment moved whole and cut.

The model is a bf16 shape from ``--model-config`` (random weights, the same on every rank, built
before the measurement starts: both methods hold it whole while they shard it); the state is
synthetic (a master near each weight, random moments), published once to a local store. The
figure is the highest rank's peak resident set from the moment the model is built (the peak is
reset then, Linux ``clear_refs``), above its resident set at that moment, with glibc's mmap
threshold fixed so that freed tensors leave the resident set. Per parameter,
the state is 12 bytes (master 4, moments 8); a rank keeps 12 / N of it. Beside it, the blob bytes
each rank fetched from the store (every blob whole: each is verified by its sha256). Before
the model is built, apart from those figures: the bytes and seconds of reading the policy's bf16
weights whole onto every rank, by every rank (``whole``) or each blob by one rank and broadcast
(``streamed``, ``state_scatter.read_whole``).

    .venv/bin/python benchmarks/bench_sharded_load.py --model-config benchmarks/configs/qwen2-100m.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KEY = "optimizer/manifest.json"
POLICY = "policy/manifest.json"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _reset_peak() -> None:
    """Start the peak resident set (``VmHWM``) afresh (Linux): building the model allocates
    more than it keeps, and that transient is not what the loading costs."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _model(config: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(**json.loads(Path(config).read_text()))
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)


def publish_state(store_dir: str, config: str) -> tuple[int, int]:
    """A bf16 run's policy weights and AdamW state for the model of ``config``: (parameters,
    bytes of the state's blobs)."""
    import torch

    from actions.store import LocalStore
    from actions.store.weights import publish_tensors

    model = _model(config)
    g = torch.Generator().manual_seed(1)
    state = {}
    for i, p in enumerate(q for q in model.parameters() if q.requires_grad):
        state[f"p{i}.master"] = p.detach().float() + 1e-4 * torch.randn(p.shape, generator=g)
        state[f"p{i}.exp_avg"] = 1e-3 * torch.randn(p.shape, generator=g)
        state[f"p{i}.exp_avg_sq"] = 1e-6 * torch.rand(p.shape, generator=g)
        state[f"p{i}.step"] = torch.tensor(1.0)
    pub = publish_tensors(LocalStore(store_dir), KEY, state, scalars_in_meta=True)
    publish_tensors(LocalStore(store_dir), POLICY, {k: v.detach() for k, v in model.state_dict().items()})
    return sum(p.numel() for p in model.parameters()), pub.stats.bytes_uploaded


def _whole(model, store, mesh, lr: float):
    """The baseline, the learner's loading before streaming, line for line: every optimizer
    tensor read at once, the masters copied whole into the parameters (the rest of the state
    kept), the whole model made fp32 and sharded, each moment moved whole and cut
    (``distribute_tensor``)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor, distribute_tensor

    from actions.rl.fsdp import layer_classes
    from actions.rl.optimizer import TrainOptimizer
    from actions.rl.sharded_update import LogprobRoot
    from actions.store.optim_state import load_optimizer_tensors
    from actions.store.weights import load_tensors

    def load_masters(module, state):
        params = [p for p in module.parameters() if p.requires_grad]
        rest = {}
        for key, value in state.items():
            if not key.endswith(".master"):
                rest[key] = value
                continue
            index = int(key[1:].partition(".")[0])
            params[index].data = value.to(params[index].device, torch.float32).clone()
        return rest

    def shard(root):
        for p in root.parameters():
            if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32:
                p.data = p.data.float()
        frozen = {p for p in root.parameters() if not p.requires_grad}
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        classes = layer_classes(root)
        for m in root.modules():
            if classes and isinstance(m, classes) and any(p.requires_grad for p in m.parameters()):
                fully_shard(m, mesh=mesh, mp_policy=policy, ignored_params=frozen)
        fully_shard(root, mesh=mesh, mp_policy=policy, ignored_params=frozen)

    def like(whole, param):
        if isinstance(param, DTensor):
            return distribute_tensor(whole.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
        return whole.to(param.device)

    state = load_tensors(store, KEY)[0]
    state = load_masters(model, state)
    shard(LogprobRoot(model))
    opt = TrainOptimizer(model, lr)
    laid = {}
    for key, value in state.items():
        index, _, field = key[1:].partition(".")
        if field != "step" and index.isdigit() and int(index) < len(opt.params):
            value = like(value, opt.params[int(index)])
        laid[key] = value
    load_optimizer_tensors(opt.opt, laid, where=KEY)
    return opt


def _streamed(model, store, mesh, lr: float, rank: int, world: int):
    """The action's loading (``sharded_train``)."""
    import torch

    from actions.rl.fsdp import shard
    from actions.rl.sharded_train import _sharded_optimizer, _stored_state
    from actions.rl.sharded_update import LogprobRoot

    dtypes = [p.dtype for p in model.parameters() if p.requires_grad]
    state = _stored_state(store, KEY, dtypes)
    shard(LogprobRoot(model), mesh, torch.bfloat16)
    return _sharded_optimizer(model, lr, state, dtypes, KEY, rank=rank, world=world, device=torch.device("cpu"))


def _read_policy(store, method: str, rank: int, world: int) -> tuple[int, float]:
    """(bytes fetched, seconds) of reading the policy weights whole onto this rank: every rank
    reads every blob (``whole``), or each blob is fetched by one rank and broadcast (the action's
    ``sharded_train._read_once``). Timed apart from the state's loading, whose figures it leaves
    as they were."""
    import torch
    import torch.distributed as dist

    from actions.rl.sharded_train import _read_once
    from actions.store.weights import load_tensors

    fetched = []
    get_buffer = store.get_buffer
    store.get_buffer = lambda key, size=None: fetched.append(size) or get_buffer(key, size=size)
    dist.barrier()
    t0 = time.perf_counter()
    if method == "whole":
        tensors = load_tensors(store, POLICY)[0]
    else:
        tensors = _read_once(store, POLICY, None, rank=rank, world=world, device=torch.device("cpu"), fetched=[])
    dist.barrier()  # the slowest rank's time is the step's
    seconds = time.perf_counter() - t0
    del tensors
    store.get_buffer = get_buffer
    return sum(fetched), seconds


def load_on_rank(rank: int, world: int, opts: dict) -> dict:
    """One rank's load by ``opts["method"]``; rank 0 returns every rank's figures."""
    import torch
    import torch.distributed as dist

    from actions.rl.fsdp import make_mesh
    from actions.store import LocalStore, weights

    torch.set_num_threads(1)
    weights.STREAM_BYTES = opts["budget"]
    policy_bytes, policy_s = _read_policy(LocalStore(opts["store"]), opts["method"], rank, world)
    model = _model(opts["config"])
    base = _rss_bytes()
    _reset_peak()
    t0 = time.perf_counter()
    mesh = make_mesh(torch.device("cpu"))
    store, fetched = LocalStore(opts["store"]), []
    get_buffer = store.get_buffer
    store.get_buffer = lambda key, size=None: fetched.append(size) or get_buffer(key, size=size)
    if opts["method"] == "whole":
        opt = _whole(model, store, mesh, 1e-5)
    else:
        opt = _streamed(model, store, mesh, 1e-5, rank, world)
    seconds = time.perf_counter() - t0
    held = sum(t.to_local().numel() * 4 for p in opt.params for t in (p, opt.opt.state[p]["exp_avg"],
                                                                      opt.opt.state[p]["exp_avg_sq"]))
    peak = _peak_bytes()
    mine = {"rank": rank, "peak_above_model_bytes": peak - base, "kept_bytes": held, "seconds": seconds,
            "store_read_bytes": sum(fetched), "policy_read_bytes": policy_bytes, "policy_read_s": policy_s}
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    return {"method": opts["method"], "ranks": every}


def main() -> None:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--model-config", default=str(ROOT / "benchmarks/configs/qwen2-100m.json"))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--budget", type=int, default=64 << 20, help="bytes StoredTensors.stream fetches ahead")
    p.add_argument("--methods", nargs="+", default=["whole", "streamed"], choices=["whole", "streamed"])
    args = p.parse_args()
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")  # inherited by the ranks: freed pages leave
    import bench_sharded_load as this  # by name, so the ranks can import the rank function

    from actions.rl.ranks import run_on_ranks

    with tempfile.TemporaryDirectory(prefix="bench-sharded-load-") as store:
        params, nbytes = publish_state(store, args.model_config)
        print(f"{params / 1e6:.1f} M parameters (bf16); optimizer state {nbytes / 2**30:.3f} GiB in the store; "
              f"{args.ranks} ranks; stream budget {args.budget / 2**20:.0f} MiB", flush=True)
        peaks = {}
        for method in args.methods:
            out = run_on_ranks(this.load_on_rank, args.ranks,
                               ({"method": method, "config": args.model_config, "store": store,
                                 "budget": args.budget},))
            top = max(out["ranks"], key=lambda r: r["peak_above_model_bytes"])
            peaks[method] = top["peak_above_model_bytes"]
            print(f"{method:9s} peak per rank above the built model {top['peak_above_model_bytes'] / 2**30:6.3f} GiB "
                  f"({top['peak_above_model_bytes'] / params:5.1f} B/param); kept {top['kept_bytes'] / 2**30:.3f} GiB "
                  f"of shards; {top['seconds']:.1f} s; read from the store per rank "
                  f"{', '.join('%.3f' % (r['store_read_bytes'] / 2**30) for r in out['ranks'])} GiB", flush=True)
            print(f"{'':9s} policy weights read per rank "
                  f"{', '.join('%.3f' % (r['policy_read_bytes'] / 2**30) for r in out['ranks'])} GiB in "
                  f"{max(r['policy_read_s'] for r in out['ranks']):.1f} s", flush=True)
            print(json.dumps({"bench": "sharded_load", "params": params, "state_bytes": nbytes, **out}), flush=True)
        if len(peaks) == 2 and peaks["streamed"] > 0:
            print(f"whole / streamed: {peaks['whole'] / peaks['streamed']:.2f}x the peak per rank")


if __name__ == "__main__":
    main()
