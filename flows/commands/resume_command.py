"""The ``rlhfless train`` command line that continues a run, from the one that ran it.

A stopped or failed ``train`` tells how to continue with a command the user can paste: the
same ``--config``, ``--set``, ``--steps``, ``--out`` and ``--summary`` as given (a store set on
the command line is the run's store: dropping it would start a new run in the default one),
the run id named, and ``--resume``. After a budget stop the limit that stopped the run is
asked again as ``KEY=N``, N to be chosen above what the run has spent.
"""

from __future__ import annotations

import argparse
import re
import shlex
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flows.config import CampaignConfig

_BUDGET_KEY = re.compile(r"^(budget\.(?:usd|gpu_seconds))=")
_PLACEHOLDER = "RLHFLESS-BUDGET-PLACEHOLDER"


def budget_key(stopped_reason: str | None) -> str | None:
    """The budget setting a ``stopped_reason`` names (``budget.gpu_seconds``), or None."""
    match = _BUDGET_KEY.match(stopped_reason or "")
    return match.group(1) if match else None


def resume_command(args: argparse.Namespace, run_id: str, raise_key: str | None = None) -> str:
    """``rlhfless train ... --run-id RUN --resume`` with the settings of ``args`` (``train``'s
    parsed arguments); with ``raise_key``, that setting as ``KEY=N`` in place of any given.

    >>> ns = argparse.Namespace(config=None, overrides=["store.uri=/s", "budget.gpu_seconds=36"], steps=10,
    ...                         out=None, summary=None)
    >>> resume_command(ns, "bud", "budget.gpu_seconds")
    'rlhfless train --set store.uri=/s --set budget.gpu_seconds=N --steps 10 --run-id bud --resume'
    """
    words = ["rlhfless", "train"]
    if args.config:
        words += ["--config", args.config]
    for item in args.overrides:
        if raise_key is None or item.partition("=")[0].strip() != raise_key:
            words += ["--set", item]
    if raise_key is not None:
        words += ["--set", _PLACEHOLDER]
    for flag, value in (("--steps", args.steps), ("--out", args.out), ("--summary", args.summary)):
        if value is not None:
            words += [flag, str(value)]
    words += ["--run-id", run_id, "--resume"]
    return shlex.join(words).replace(_PLACEHOLDER, f"{raise_key}=N")


def print_continue(args: argparse.Namespace, cfg: CampaignConfig, reason: str | None, spend: dict[str, Any]) -> None:
    """After a budget stop, the command that continues the run, the budget to raise named."""
    key = budget_key(reason)
    if key is None:
        return
    spent = spend.get("usd" if key == "budget.usd" else "billed_gpu_seconds")
    above = f" above the {spent:.6g} spent so far" if isinstance(spent, (int, float)) else ""
    print(f"to continue: {resume_command(args, cfg.resolved_run_id(), key)}  (N: {key}{above})")


def resume_hint(cfg: CampaignConfig, command: str) -> str:
    """How to continue a run that failed mid-campaign (``command``; "" when it has no
    committed step)."""
    from actions.store import open_store
    from flows.campaign.state import load_state

    try:
        state = load_state(open_store(cfg.store.uri), cfg.resolved_run_id())
    except Exception:  # the store may be what failed: the error line stands without the hint
        return ""
    if state is None:
        return ""
    return f"; once that is fixed, `{command}` continues the run from its last committed step ({state.step})"
