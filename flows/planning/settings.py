"""How the planner sizes a phase and splits its prompts: :class:`PlannerSettings`, one object
for the live planner and the simulator."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flows.planning.plan import ClusterSpec
from flows.planning.registry import ScalingStrategy
from flows.planning.robust import MeasuredError
from flows.planning.tpot import TpotProfile


@dataclass(frozen=True, kw_only=True)
class PlannerSettings:
    """How the planner sizes a phase and splits its prompts (``scaling.plan_generation``).

    One object for the live planner (from ``scaling.*`` and ``generation.*``, ``flows/step/phase.py``)
    and the simulator (from its ``ClusterModel`` and policy, ``flows/simulate/policies.py``).
    """

    policy: ScalingStrategy | str
    """The scaling strategy (``flows/planning/registry.py``), or its text, which the registry
    parses (``scaling.strategy_of``)."""
    n_min: int
    n_max: int
    """The candidate actor-count range (inclusive)."""
    lam: float
    """Weight of time in the ``paper`` objective (the paper's default, 0.7)."""
    assignment: str
    """'ranked' (paper), 'round_robin' (ablation baseline) or 'contiguous'."""
    profile: TpotProfile
    cluster: ClusterSpec
    """The time and cost model."""
    cut_threshold: float | None = None
    """``generation.cut_threshold``, validated and passed on to user policies (the built-in
    estimate assumes exact predictions, so nothing is cut)."""
    rank_slack: float | None = None
    """Ranked ``fixed:N`` plans: size the slices within this fraction of the balanced phase
    time; None: equal counts. Not passed to user policies."""
    objective: str = "value"
    value_of_time_usd_per_s: float | None = None
    time_slack: float = 0.05
    budget_actors: int = 3
    """How ``cost_aware`` picks among the candidates (``objective.py``);
    ``value_of_time_usd_per_s`` None: the price of the prefill (learner) GPUs;
    ``budget_actors``: the fixed allocation whose bill bounds the ``budget`` objective."""
    tail_error: MeasuredError | None = None
    """The length predictor's measured error (``robust.MeasuredError``), which scales the
    robust tail of ``cost_aware``'s ranked candidates; None: every actor may run to the step's
    longest prediction. Not passed to user policies."""
    decode_scale_by_n: tuple[tuple[int, float], ...] = ()
    """(N, factor): a candidate of N actors decodes ``factor`` times as long as ``profile``
    says; N not listed: 1. Where actors share a machine's cores (the local pool: a lone action
    has all of them, N actions a share each) the speed depends on N; the live hook passes the
    speeds it measured at each fan-out (``Calibration.by_actors``). Not passed to user policies."""
    own_prefill_tokens: Mapping[int, int] | None = None
    """Prompt id -> prompt tokens its generation action prefills itself before decoding (the
    suffix after the dedup prefix the prefill action computed, ``PrefillPlan.suffix_tokens``):
    added to that action's time at the profile's prefill rate. None: none is timed (the
    prefill action computed the prompts, or none runs and the actions' own prefill is part of
    their measured decode speed, ``ClusterSpec.prefill_action``). Not passed to user policies."""
