"""Choosing the invoker named by ``invoker.kind``."""

from __future__ import annotations

from pathlib import Path

from flows.config import CampaignConfig
from flows.invokers.base import Invoker


def pool_size(cfg: CampaignConfig) -> int:
    """Local pool: one worker per possible generation action plus one so scoring overlaps. The
    possible actions are ``scaling.n_max`` for a sweeping policy and N for ``fixed:N``, whose N is
    not bounded by ``n_max`` (a fixed allocation above it would otherwise queue on the pool)."""
    fixed = cfg.scaling.strategy.num_actors or 0
    return cfg.invoker.num_workers or max(cfg.scaling.n_max, fixed) + 1


def worker_log_dir(cfg: CampaignConfig) -> Path:
    """Where the local pool's worker logs go: ``invoker.log_dir``, else ``runs/<run_id>/logs``
    (the CLI sets ``invoker.log_dir`` to ``<--out>/logs``)."""
    return Path(cfg.invoker.log_dir) if cfg.invoker.log_dir else Path("runs") / cfg.resolved_run_id() / "logs"


def make_invoker(cfg: CampaignConfig, num_workers: int) -> Invoker:
    kind = cfg.invoker.kind
    if kind == "inprocess":
        from flows.invokers.inprocess import InProcessInvoker

        return InProcessInvoker(cfg.invoker.num_cores)
    if kind == "local":
        from flows.invokers.local_pool import LocalPoolInvoker

        return LocalPoolInvoker(num_workers, timeout_s=cfg.invoker.local_timeout_s(), log_dir=worker_log_dir(cfg),
                                max_body_bytes=int(cfg.invoker.max_request_mb * 1024 * 1024),
                                read_timeout_s=cfg.invoker.read_timeout_s, num_cores=cfg.invoker.num_cores)
    from flows.invokers.openwhisk import OpenWhiskInvoker

    return OpenWhiskInvoker.from_env(package=cfg.invoker.package, timeout_s=cfg.invoker.timeout_s)


def check_invoker(cfg: CampaignConfig) -> None:
    """Fail fast, before anything is written, when the configured invoker cannot work.

    OpenWhisk: the connection settings must parse and the controller must answer, with these
    credentials, for the ``evaluate`` and ``generate`` actions that every campaign runs (no
    retries, so a wrong host costs one connection attempt), and ``generate``'s ``gpus``
    annotation must agree with ``scaling.gpus_per_actor`` (:func:`check_gpus_annotation`).
    Local and in-process invokers need nothing.

    Raises:
        ValueError: one line naming the setting (WSK_APIHOST, WSK_AUTH, the package) and the fix.
    """
    if cfg.invoker.kind != "openwhisk":
        _check_local_engine(cfg)
        return
    from flows.invokers.openwhisk.api import OpenWhiskError, RetryPolicy
    from flows.invokers.openwhisk.client import OpenWhiskClient
    from flows.invokers.openwhisk.config import OpenWhiskConfig

    config = OpenWhiskConfig.resolve()
    prefix = f"{cfg.invoker.package}/" if cfg.invoker.package else ""
    with OpenWhiskClient(config, retry=RetryPolicy(max_attempts=1, connect_attempts=1, request_timeout_s=10.0)) as c:
        try:
            c.get_action(f"{prefix}evaluate")
            generate = c.get_action(f"{prefix}generate")
        except OpenWhiskError as exc:
            raise ValueError(str(exc)) from None
    check_gpus_annotation(f"{prefix}generate", generate, cfg.scaling.gpus_per_actor)
    check_train_ranks(generate, cfg.train.world_size)


def check_train_ranks(record: dict, world_size: int | None) -> None:
    """On a GPU cluster (the deployed action's ``gpus`` annotation above 0: its container holds
    that many, one per rank), ``train.world_size`` may not exceed them; billing and the GPU
    limit count the container's. A CPU cluster (``gpus: 0``) or an action without the
    annotation is not compared: there the action checks its ranks on the machine it runs on.

    Raises:
        ValueError: ``actions.rl.world_size.check_ranks_within_gpus``'s line.
    """
    from actions.rl.world_size import check_ranks_within_gpus

    gpus = _gpus_held(record)
    if gpus is not None:
        check_ranks_within_gpus(world_size, gpus, "on OpenWhisk (one GPU each)")


def _gpus_held(record: dict) -> int | None:
    """The GPUs one container of a deployed action holds (its ``gpus`` annotation), or None
    where it holds none (``gpus: 0``, a CPU-only cluster) or the annotation is absent."""
    from flows.invokers.openwhisk import annotations_of

    gpus = annotations_of(record).get("gpus")
    return gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 else None


def check_gpus_annotation(action: str, record: dict, gpus_per_actor: int) -> None:
    """Billing and the ``gpu-actions`` limit count ``scaling.gpus_per_actor`` GPUs per actor; a
    deployed generate action whose ``gpus`` annotation (what one container holds) says another
    number would bill and hold the wrong count, so the campaign refuses to start. An action
    without the annotation, or with ``gpus: 0`` (a CPU-only cluster), is not compared.

    Raises:
        ValueError: naming both numbers and the two ways to make them agree.
    """
    gpus = _gpus_held(record)
    if gpus is not None and gpus != gpus_per_actor:
        raise ValueError(f"scaling.gpus_per_actor={gpus_per_actor}, but the deployed action {action} holds {gpus} "
                         f"GPU(s) per container (its 'gpus' annotation): billing and the GPU limit would count "
                         f"{gpus_per_actor}; set scaling.gpus_per_actor: {gpus}, or deploy the action with "
                         f"gpus: {gpus_per_actor}")


def _check_local_engine(cfg: CampaignConfig) -> None:
    """Actions that run on this machine (local pool, in process) import the optional vLLM
    engine from this environment: a missing package is refused here, before anything is
    written, instead of failing the first generate action with a traceback. (On OpenWhisk the
    image carries it: runtime_images/gpu-vllm.)"""
    import importlib.util

    if cfg.generation.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("generation.engine 'vllm': vLLM is not installed in this environment; install it "
                         "(docs/vllm.md, 'Installing') or set generation.engine: torch")
