"""One train step on ``train.world_size`` FSDP2 ranks (``train_step.py`` runs it through
``ranks.run_on_ranks``); the store format is the one-rank format.

The ranks read the policy version from the store together, each blob fetched by one rank and
broadcast (``state_scatter.read_whole``; the critic and a LoRA run's backbone and adapter too),
so every rank builds the whole model while the store serves it once; each rank shards it
(``fsdp.shard``: fp32 shards of every trainable parameter, one unit made fp32 at a time), then
the ranks read the optimizer state once for all (``state_scatter``: each stored tensor fetched
by one rank, which sends every rank its shard): the fp32 master copy of a bf16/fp16 run (the stored ``p{i}.master``) is
copied into the parameter's shard, the AdamW moments become the optimizer's shards. So a rank
holds the whole model in its own dtype while it shards it, never the whole optimizer state,
and the store serves the optimizer state once per step, not once per rank. It runs the update with the work
shared out (``sharded_update``), and gathers whole tensors back; rank 0 publishes them exactly
as one rank would: the weights in each tensor's own dtype, AdamW's moments and step under the
same ``p{index}`` names, the masters of a low-precision run. So a run trained on two ranks
resumes on one, and the other way round. LoRA: only the adapter trains, so only the adapter is sharded;
every rank holds the frozen backbone whole.

The ranks are fresh processes, so nothing stays warm between steps (``train_step.py`` keeps the
trained model for the next step on one rank only); none hits a warm cache that another misses,
which would leave the others waiting in a read's collectives.

Besides the learning metrics, a sharded step reports rank 0's split of its seconds as a
one-rank step does (``train/load_s``, ``train/update_s``, ``train/publish_policy_s``,
``train/publish_optimizer_s``), plus ``train/gather_s`` (gathering the whole tensors to
publish, on every rank), ``train/spawn_s`` (starting the ranks' processes, before any of those:
``ranks.spawn_seconds`` of the last rank to join; rank 0's ``train/load_s`` may hold the part
of it by which rank 0 was up first, waiting for the others at the first read), and
``train/state_read_bytes``: the blob bytes of the weights and optimizer states that all ranks
together fetched from the store, each set once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from actions.contracts import TrainStepRequest, TrainStepResult
from actions.models.loading import configure_threads, load_model, store_for
from actions.models.lora import adapter_tensors
from actions.models.special_tokens import special_tokens
from actions.rl.batch import gather_batch, rollout_metrics
from actions.rl.critic_store import load_critic
from actions.rl.dropout import disable_dropout
from actions.rl.fsdp import all_max, all_sum, as_shard, full, make_mesh, shard
from actions.rl.optimizer import MASTER, MASTER_NAME, TrainOptimizer, check_precision
from actions.rl.ranks import spawn_seconds
from actions.rl.recompute import enable_checkpointing
from actions.rl.sharded_update import LogprobRoot, run_sharded_updates
from actions.rl.state_scatter import read_whole, scattered
from actions.store.optim_state import load_optimizer_tensors, optimizer_tensors
from actions.store.safe_paths import shown
from actions.store.weights import StoredTensors, publish_tensors


def rank_device(rank: int) -> torch.device:
    """This rank's device: ``cuda:<rank>`` where the actions use CUDA, else the CPU."""
    from actions.models.device import action_device

    device = action_device()
    if device.type == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return device


def _trainable(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def _stored_state(store, key: str | None, dtypes: list[torch.dtype],
                  numbered: Callable[[Mapping], Mapping] = lambda state: state) -> Mapping | None:
    """The optimizer state at ``key`` (None: none yet), opened but not read, in the learner's
    parameter numbering (``numbered``: the critic's renumbering, which renames without
    reading); refused at once where it was written at another precision than ``dtypes``, the
    trainable parameters' (``optimizer.check_precision``: the names alone tell)."""
    if not key:
        return None
    state = numbered(StoredTensors(store, key))
    check_precision(state, dtypes, key)
    return state


_LAID_OUT = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", MASTER}  # the stored fields shaped as their parameter


def _param_index(key: str, count: int) -> int | None:
    """``i`` for a stored ``p{i}.<field shaped as its parameter>`` with ``i < count``, else None."""
    index, _, field = key[1:].partition(".")
    ok = key.startswith("p") and index.isdigit() and field in _LAID_OUT and int(index) < count
    return int(index) if ok else None


def _check_masters(state: Mapping, params: list, dtypes: list[torch.dtype], where: str) -> None:
    """Refuse a stored master that belongs to no low-precision parameter (names alone tell, so
    every rank refuses the same set before any tensor is read)."""
    for key in state:
        if key.endswith(f".{MASTER}"):
            match = MASTER_NAME.match(key)
            index = int(match.group(1)) if match else len(params)
            if index >= len(params) or dtypes[index] == torch.float32:
                raise ValueError(f"optimizer state {where!r}: tensor {shown(key)} is not the fp32 master copy of one "
                                 f"of the {len(params)} low-precision parameters; re-publish the optimizer state")


def _sharded_optimizer(module: torch.nn.Module, lr: float, state: StoredTensors | None, dtypes: list[torch.dtype],
                       where: str, *, rank: int, world: int, device: torch.device) -> TrainOptimizer:
    """AdamW over ``module``'s sharded fp32 parameters, with the stored state read once for all
    ranks (``state_scatter.scattered``: each tensor fetched by one rank, each rank sent only its
    shard): each fp32 master goes into its parameter's shard, each moment becomes the
    optimizer's shard (``load_optimizer_tensors`` then checks every name). ``dtypes``: the
    trainable parameters' dtypes before sharding (a master belongs to a low-precision one)."""
    opt = TrainOptimizer(module, lr)
    if not state:
        return opt
    params = opt.params
    _check_masters(state, params, dtypes, where)

    def layout(key: str) -> torch.Tensor | None:
        index = _param_index(key, len(params))
        return None if index is None else params[index]

    def misshapen(key: str) -> str:  # the one-rank loader's words (``TrainOptimizer.load_state``)
        if key.endswith(f".{MASTER}"):
            return (f"optimizer state {where!r}: tensor {shown(key)} is not the fp32 master copy of one of the "
                    f"{len(params)} low-precision parameters; re-publish the optimizer state")
        return f"optimizer state {where!r}: tensor {shown(key)} does not have its parameter's shape; re-publish it"

    laid = {}
    for key, value in scattered(state, layout, rank=rank, world=world, device=device, where=where,
                                misshapen=misshapen):
        param = layout(key)
        if key.endswith(f".{MASTER}"):
            with torch.no_grad():
                (param.to_local() if isinstance(param, DTensor) else param).copy_(value)
        else:
            laid[key] = as_shard(value, param) if isinstance(param, DTensor) else value
        del value
    load_optimizer_tensors(opt.opt, laid, where=where)
    return opt


def _gathered(tensors: dict[str, torch.Tensor], dtypes: dict[str, torch.dtype], keep: bool) -> dict[str, torch.Tensor]:
    """Whole tensors on the CPU, each in the dtype it was published in (a collective: every rank
    gathers every tensor, in the same order). ``keep``: this rank publishes them; the others
    drop each whole tensor as soon as it is gathered, so host memory holds one copy of the
    state on the node, not one per rank (a 7B model's weights and optimizer state are 106 GB)."""
    out = {}
    for name, t in tensors.items():
        whole = full(t.detach())
        if keep:
            out[name] = whole.to("cpu", dtypes.get(name, whole.dtype)) if whole.is_floating_point() else whole.cpu()
    return out


def _optimizer_tensors(opt: TrainOptimizer, low_precision: bool, keep: bool) -> dict[str, torch.Tensor]:
    """The one-rank ``TrainOptimizer.state_tensors`` of this sharded optimizer (a collective;
    ``keep`` as for :func:`_gathered`)."""
    out = _gathered(optimizer_tensors(opt.opt), {}, keep)
    if low_precision:
        out.update(_gathered({f"p{i}.{MASTER}": p for i, p in enumerate(opt.params)}, {}, keep))
    return out


def _dtypes(tensors_fn: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.dtype]:
    return {k: v.dtype for k, v in tensors_fn().items()}


def _read_once(store, key: str, expected_sha256: str | None, *, rank: int, world: int, device: torch.device,
               fetched: list[int]) -> dict[str, torch.Tensor]:
    """A weight set (the policy, its backbone or adapter, the critic) whole on every rank, with
    each blob fetched by one rank only (``state_scatter.read_whole``): a loading.TensorReader.
    The bytes this rank fetched are appended to ``fetched``."""
    state = StoredTensors(store, key, expected_sha256=expected_sha256)
    out = read_whole(state, rank=rank, world=world, device=device, what="weights")
    fetched.append(state.bytes_fetched)
    return out


def train_on_rank(rank: int, world: int, request: dict, threads: int) -> dict | None:
    """Rank ``rank``'s part of one train step; rank 0 publishes and returns the result."""
    req = TrainStepRequest.model_validate(request)
    configure_threads(threads)
    device = rank_device(rank)
    torch.manual_seed(req.seed * 100_003 + req.step)
    t_start = time.perf_counter()
    store = store_for(req.policy.store_uri)
    algo = req.algorithm
    fetched: list[int] = []  # blob bytes this rank fetched: weights, then optimizer states
    read = partial(_read_once, rank=rank, world=world, device=device, fetched=fetched)
    policy, tokenizer, _ = load_model(req.policy, fresh=True, read=read)
    policy_dtypes = _dtypes(lambda: adapter_tensors(policy))
    trainable_dtypes = [p.dtype for p in _trainable(policy)]
    low_precision = any(d != torch.float32 for d in trainable_dtypes)
    state = _stored_state(store, req.optimizer_key, trainable_dtypes)
    policy.train()
    disable_dropout(policy)  # log-probs without random masks, as scored (dropout.py)
    enable_checkpointing(policy, req.gradient_checkpointing)
    mesh = make_mesh(device)
    compute_dtype = next(iter(policy_dtypes.values()))
    root = shard(LogprobRoot(policy), mesh, compute_dtype)
    on_rank = {"rank": rank, "world": world, "device": device}
    opt = _sharded_optimizer(policy, algo.lr, state, trainable_dtypes, req.optimizer_key or "", **on_rank)
    fetched.append(state.bytes_fetched if state else 0)
    critic = critic_opt = None
    if algo.name == "ppo":
        critic = load_critic(req.policy.store_uri, req.policy.base_key, req.critic_key, fresh=True,
                             dtype_setting=req.policy.dtype, read=read)
        critic_dtypes = _dtypes(critic.tensors)
        critic_trainable = [p.dtype for p in _trainable(critic)]
        critic_low = any(d != torch.float32 for d in critic_trainable)
        cstate = _stored_state(store, req.critic_optimizer_key, critic_trainable, critic.stored_optimizer_state)
        critic.train()
        disable_dropout(critic)
        enable_checkpointing(critic.lm, req.gradient_checkpointing)
        shard(critic, mesh, compute_dtype)
        critic_opt = _sharded_optimizer(critic, algo.critic_lr, cstate, critic_trainable,
                                        req.critic_optimizer_key or "", **on_rank)
        fetched.append(cstate.bytes_fetched if cstate else 0)
    batch = gather_batch(store, req.scored_keys, algo, special_tokens(policy, tokenizer).pad_id,
                         temperature=req.temperature, max_new_tokens=req.max_new_tokens).to(device)
    metrics = rollout_metrics(batch, algo)
    metrics["train/reused_state"] = 0.0
    if critic is not None:  # the ranks are fresh processes: nothing kept warm (as one rank reports it)
        metrics["train/reused_critic_state"] = 0.0
    metrics["train/world_size"] = float(world)
    metrics.update(all_sum({"train/state_read_bytes": float(sum(fetched))}, device))
    metrics.update(all_max({"train/spawn_s": spawn_seconds()}, device))  # the step waited for the last rank
    t_loaded = time.perf_counter()
    metrics.update(run_sharded_updates(root, opt, batch, algo, critic, critic_opt, seed=req.seed, step=req.step,
                                       rank=rank, world=world))
    if device.type == "cuda":  # the optimizer's last kernels may still run: time them as the update's
        torch.cuda.synchronize(device)
    t_updated = time.perf_counter()
    publishes = rank == 0
    weights = _gathered(adapter_tensors(policy), policy_dtypes, publishes)
    opt_tensors = _optimizer_tensors(opt, low_precision, publishes)
    if critic is not None:
        critic_tensors = _gathered(critic.tensors(), critic_dtypes, publishes)
        critic_opt_tensors = _optimizer_tensors(critic_opt, critic_low, publishes)
    dist.barrier()
    if rank != 0:
        return None
    version = req.policy.policy_version + 1
    t_gathered = time.perf_counter()
    pub = publish_tensors(store, f"{req.output_prefix}/policy/manifest.json", weights,
                          {"version": version, "step": req.step})
    t_policy = time.perf_counter()
    opt_pub = publish_tensors(store, f"{req.output_prefix}/optimizer/manifest.json", opt_tensors,
                              scalars_in_meta=True)
    # rank 0's split, as a one-rank step reports it (train_step.py), plus the gathers of the
    # whole tensors before publishing (every rank takes part)
    metrics.update({"train/load_s": t_loaded - t_start, "train/update_s": t_updated - t_loaded,
                    "train/gather_s": t_gathered - t_updated, "train/publish_policy_s": t_policy - t_gathered,
                    "train/publish_optimizer_s": time.perf_counter() - t_policy})
    out = TrainStepResult(policy_key=pub.manifest_key, policy_version=version, weights_sha256=pub.weights_sha256,
                          optimizer_key=opt_pub.manifest_key,
                          bytes_uploaded=pub.stats.bytes_uploaded + opt_pub.stats.bytes_uploaded, metrics=metrics)
    if critic is not None:
        c = publish_tensors(store, f"{req.output_prefix}/critic/manifest.json", critic_tensors)
        co = publish_tensors(store, f"{req.output_prefix}/critic_optimizer/manifest.json", critic_opt_tensors,
                             scalars_in_meta=True)
        out.critic_key, out.critic_optimizer_key = c.manifest_key, co.manifest_key
    return out.model_dump(mode="json")
