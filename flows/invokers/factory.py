"""Choosing the invoker named by ``invoker.kind``."""

from __future__ import annotations

from actions.common.config import CampaignConfig
from flows.invokers.base import Invoker


def pool_size(cfg: CampaignConfig) -> int:
    """Local pool: one worker per possible generation action plus one so scoring overlaps."""
    return cfg.invoker.num_workers or cfg.scaling.n_max + 1


def make_invoker(cfg: CampaignConfig, num_workers: int) -> Invoker:
    kind = cfg.invoker.kind
    if kind == "inprocess":
        from flows.invokers.inprocess import InProcessInvoker

        return InProcessInvoker()
    if kind == "local":
        from flows.invokers.local_pool import LocalPoolInvoker

        return LocalPoolInvoker(num_workers, timeout_s=cfg.invoker.timeout_s)
    from flows.invokers.openwhisk import OpenWhiskInvoker

    return OpenWhiskInvoker.from_env(package=cfg.invoker.package)
