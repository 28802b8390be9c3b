"""The campaign's budget (``budget.usd``, ``budget.gpu_seconds``): whether the next step may
run, judged from the committed spend and the last step's cost. Pure: reads a state and a
config, imports neither Prefect nor torch (``train --resume`` judges a run with it before
starting either: ``flows/campaign/finished.py``)."""

from __future__ import annotations

from flows.campaign.state import CampaignState
from flows.config import CampaignConfig
from flows.step.metrics import BILLED


def evaluates(state: CampaignState) -> bool:
    """False where the data has no eval set (``data.eval_path`` unset, no ``eval_fraction``)."""
    return state.prepared.data.get("evaluation") != "none"


def evaluation_due(cfg: CampaignConfig, state: CampaignState, stop: str | None = None) -> bool:
    """Whether ``state``'s policy is evaluated before its step is committed: where the run
    evaluates, every ``eval_every`` steps, after the last step, and after the step a budget
    ``stop`` ends the run with."""
    periodic = bool(cfg.eval_every) and state.step % cfg.eval_every == 0
    return evaluates(state) and (periodic or state.step == cfg.steps or stop is not None)


def budget_stop(cfg: CampaignConfig, state: CampaignState, *, before_evaluation: bool = False,
                setup_s: float = 0.0) -> str | None:
    """Why the next step may not run, or None: it may, or ``state`` is the campaign's last step
    anyway (``steps``), which stops no run early. ``before_evaluation``: ``state``'s step has
    just run and is not evaluated yet (``_loop`` judges it so); a committed state has had the
    evaluations it gets.

    A ``budget.*`` stops the run when the spend so far (steps, evaluations and set-up: every
    activation, ``CampaignState.spend``) plus the estimate of what is still to come before the
    next step's commit would exceed it. The estimate is the last step's billed time plus, where
    the run evaluates, the last evaluation's for each evaluation to come: the one ``eval_every``
    asks of ``state``'s step, ``before_evaluation``, and the one after the next step, due then
    (``eval_every``, the last step) or made whenever the budget stops the run there; reserving it
    keeps that final evaluation within the budget too; in USD, that time at this run's
    ``price_per_gpu_second`` (a resume may change it). The first step has no cost to judge it
    by: it always runs. ``setup_s``: the billed seconds of a set-up still to pay before the
    next step (a resume's: :func:`resume_setup_estimate`)."""
    if not state.steps or state.step >= cfg.steps:
        return None
    b = cfg.budget
    next_billed, what = next_cost(cfg, state, before_evaluation=before_evaluation, setup_s=setup_s)
    next_usd = next_billed * cfg.price_per_gpu_second
    if b.usd is not None and state.spend["usd"] + next_usd > b.usd:
        return (f"budget.usd={b.usd} would be exceeded by {what} (spent {state.spend['usd']:.6f}, "
                f"next about {next_usd:.6f})")
    if b.gpu_seconds is not None and state.spend["billed_gpu_seconds"] + next_billed > b.gpu_seconds:
        return (f"budget.gpu_seconds={b.gpu_seconds} would be exceeded by {what} "
                f"(spent {state.spend['billed_gpu_seconds']:.1f}, next about {next_billed:.1f})")
    return None


def next_cost(cfg: CampaignConfig, state: CampaignState, *, before_evaluation: bool = False,
              setup_s: float = 0.0) -> tuple[float, str]:
    """The billed seconds :func:`budget_stop` expects before the next step's commit (its
    docstring says what it counts), and what they pay for, in words. ``state`` has a step."""
    last = state.steps[-1]
    ev = state.evals[-1] if evaluates(state) and state.evals else None
    owed = before_evaluation and ev is not None and evaluation_due(cfg, state)  # this step's, still to make
    evals = 0 if ev is None else 2 if owed else 1
    what = ("this step's evaluation, the next step and the evaluation after it" if owed else
            "the next step and the evaluation after it" if evals else "the next step")
    if setup_s:
        what = f"the resume's set-up, {what}"
    return setup_s + last[BILLED] + evals * (ev.billed_gpu_seconds if ev is not None else 0.0), what


def resume_budget(cfg: CampaignConfig, state: CampaignState, key: str,
                  observed_s: float | None = None) -> tuple[float, float, str]:
    """What budget ``key`` (``budget.usd`` or ``budget.gpu_seconds``) must allow for a resume
    from committed ``state`` to run its next step: (the spend so far, the estimate of what
    :func:`resume_stop` counts before that step's commit, what the estimate pays for), in the
    key's unit (USD at ``price_per_gpu_second``, or billed GPU-seconds). A ``key`` of at least
    their sum passes :func:`resume_stop` as far as that key goes. ``state`` has a step."""
    billed, what = next_cost(cfg, state, setup_s=resume_setup_estimate(state, observed_s))
    if key == "budget.usd":
        return state.spend["usd"], billed * cfg.price_per_gpu_second, what
    return state.spend["billed_gpu_seconds"], billed, what


def resume_setup_estimate(state: CampaignState, observed_s: float | None = None) -> float:
    """The billed seconds a resume's set-up (its profile, read from the store's cache, and its
    round-trip probes) will cost, before it is paid: ``CampaignState.resume_setup_s``, as the
    last set-up recorded it (``setup.add_setup_spend``; 0 in a record from before it was kept),
    or ``observed_s``, what a resume from this same commit paid (``resume_setup.py``), if more."""
    return max(state.resume_setup_s or 0.0, observed_s or 0.0)


def resume_stop(cfg: CampaignConfig, state: CampaignState, observed_s: float | None = None) -> str | None:
    """Why a resume from committed ``state`` runs no step, or None: the budget cannot pay its
    set-up (:func:`resume_setup_estimate`) and the next step (``budget_stop``). Judged before
    the set-up is paid: a resume that stops invokes nothing and commits nothing."""
    return budget_stop(cfg, state, setup_s=resume_setup_estimate(state, observed_s))


def runs_a_step(cfg: CampaignConfig, state: CampaignState) -> bool:
    """Whether the campaign runs another step from ``state``: ``steps`` not reached, and no budget stops it."""
    return state.step < cfg.steps and budget_stop(cfg, state) is None


