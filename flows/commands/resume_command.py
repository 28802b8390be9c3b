"""The ``rlhfless train`` command line that continues a run, from the one that ran it.

A stopped or failed ``train`` tells how to continue with a command the user can paste: the
same ``--config``, ``--set``, ``--steps``, ``--out`` and ``--summary`` as given (a store set on
the command line is the run's store: dropping it would start a new run in the default one),
the run id named, and ``--resume``. After a budget stop the limit that stopped the run is
asked again as ``KEY=N``, with the least N that lets the resume run a step: what the run has
spent plus the resume's estimate of its set-up, its next step and the evaluation after it,
the one its budget check makes before it starts (``flows/campaign/budget.py``).
"""

from __future__ import annotations

import argparse
import re
import shlex
from decimal import ROUND_CEILING, Decimal
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
    """After a budget stop, the command that continues the run, the budget to raise named with
    the least value that lets the resume run its next step (:func:`least_budget`)."""
    key = budget_key(reason)
    if key is None:
        return
    least = least_budget(cfg, key)
    if least is None:  # the run's record could not be read: the spend alone
        spent = spend.get("usd" if key == "budget.usd" else "billed_gpu_seconds")
        least = (f" above the {spent:.6g} spent so far plus the next step's cost"
                 if isinstance(spent, (int, float)) else "")
    print(f"to continue: {resume_command(args, cfg.resolved_run_id(), key)}  (N: {key}{least})")


def least_budget(cfg: CampaignConfig, key: str) -> str | None:
    """The words `` of at least X, the S spent so far plus about C for WHAT`` for budget ``key``:
    X (rounded up, :func:`rounded_up`) passes the check a resume makes before its set-up
    (``budget.resume_stop``) as far as ``key`` goes, and another ``budget.*`` the resume would
    stop at is named with its own least value. None when the run's committed record cannot be
    read (or holds no step to judge by)."""
    from actions.store import open_store
    from flows.campaign.budget import resume_budget
    from flows.campaign.resume_setup import observed_setup_s
    from flows.campaign.state import load_state

    try:
        store = open_store(cfg.store.uri)
        state = load_state(store, cfg.resolved_run_id())
        observed = observed_setup_s(store, state.run_id, state.step) if state is not None else None
    except Exception:  # the store may be what failed: the hint stands without the figure
        return None
    if state is None or not state.steps:
        return None
    spent, cost, what = resume_budget(cfg, state, key, observed)
    line = f" of at least {rounded_up(spent + cost)}, the {spent:.6g} spent so far plus about {cost:.3g} for {what}"
    for other in ("budget.usd", "budget.gpu_seconds"):
        limit = getattr(cfg.budget, other.removeprefix("budget."))
        other_spent, other_cost, _ = resume_budget(cfg, state, other, observed)
        if other != key and limit is not None and other_spent + other_cost > limit:
            line += f"; {other}={limit} would stop it too: raise it to at least {rounded_up(other_spent + other_cost)}"
    return line


def rounded_up(value: float) -> str:
    """``value`` rounded up to 4 significant digits, as plain decimals: a budget set to the
    figure printed is never below ``value``.

    >>> rounded_up(12.341), rounded_up(0.0012341), rounded_up(123456.0), rounded_up(0.01 + 0.00375)
    ('12.35', '0.001235', '123500', '0.01375')
    """
    if value <= 0:
        return "0"
    # from the shortest decimal that reads back as ``value``: a figure at or above it reads back
    # as ``value`` or above (0.01375 stays 0.01375, though the float lies a hair above it)
    shortest = Decimal(repr(value))
    return format(shortest.quantize(Decimal(1).scaleb(shortest.adjusted() - 3), rounding=ROUND_CEILING).normalize(),
                  "f")


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
