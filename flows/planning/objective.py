"""Which candidate plan to run: the planner's objective over predicted (time, cost) pairs.

Every objective first drops infeasible candidates and every candidate another one beats on
both predicted time and cost (``pareto_mask``), so no objective can return a dominated plan.
Among what is left (the frontier):

- ``budget`` (the simulator's default): the fastest plan whose bill stays within what a fixed allocation of
  ``budget_actors`` decode actors (default 3, the paper's static fan-out) held for the whole
  phase would bill (``robust.held_budget``). In operator terms: "never pay more for a phase
  than the fixed allocation you would otherwise reserve; spend what early release saves on
  speed". With no candidate within the budget, the cheapest. The allocation is reserved, not
  pre-warmed: its bill has no ``prewarm_idle_s``, a candidate's has its remote actors'. Without
  that wait a striped plan of that many actors is a candidate within the budget, so the plan is
  never estimated slower than the allocation either; with it, the plans within may be fewer
  actors and slower (those on the learner node's GPUs alone wait for nothing).
- ``value`` (the live default): minimise ``cost_usd + value_of_time_usd_per_s * time_s``. The knob is
  the operator's price of one second of phase time, in dollars. An extra actor is added only
  when the seconds it saves are worth more than the GPU-seconds it bills. With
  ``price_per_gpu_second = 1`` costs are GPU-seconds, and a value of ``V`` reads "a second of
  generation is worth V GPU-seconds": e.g. the learner's 8 GPUs that wait for the phase make
  ``V = 8``. ``V = 0`` is the cheapest plan; a large ``V`` the fastest.
- ``slack``: the cheapest plan whose time is within ``(1 + time_slack)`` of the fastest.
- ``paper``: the paper's min-max normalised ``lam * T~ + (1 - lam) * C~`` (paper §3.5). Its
  ranges depend on which candidates exist, so it prices a second differently from step to
  step: with ``lam = 0.7`` a plan 2% faster at twice the cost wins whenever 2% is the whole
  time range. Kept for the paper's comparison.

Ties go to the lower cost, then the lower time, then the earlier candidate (smaller N).

Only ``budget`` leaves cut-and-migrate off (``scaling.CostAware.cut_threshold``): a cut moves an
actor's longest samples into another actor's batch, saving GPU-s at the cost of the phase's
tail, a trade the other objectives price and the budget one has already bounded.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from flows.planning.plan import Candidate

OBJECTIVES = ("budget", "value", "slack", "paper")

KNOB_OBJECTIVE = {"value_of_time_usd_per_s": "value", "time_slack": "slack", "budget_actors": "budget",
                  "lam": "paper"}
"""Each objective's knob (a ``scaling`` field) and the objective that reads it."""


def knobs_off_default(scaling: Any) -> set[str]:
    """The knobs (``KNOB_OBJECTIVE``) the pydantic section ``scaling`` holds at a value other
    than its default: what the user chose. A configuration written back whole by ``rlhfless
    config`` sets every knob, most at their defaults, and those are no choice to warn of."""
    fields = type(scaling).model_fields
    return {k for k in KNOB_OBJECTIVE if k in fields and getattr(scaling, k) != fields[k].default}


def unread_knob_warnings(objective: str, given: Iterable[str], names: Mapping[str, str] | None = None) -> list[str]:
    """One warning line per knob in ``given`` (the knobs the user chose, :func:`knobs_off_default`)
    that ``objective`` does not read: another objective's. ``names``: how
    the user wrote each knob and ``objective`` (default ``scaling.<field>``; the simulator's flags).

    >>> for line in unread_knob_warnings("budget", {"time_slack", "budget_actors"}):
    ...     print(line)
    warning: scaling.time_slack is the 'slack' objective's knob; scaling.objective is 'budget', which ignores it
    """
    names = names or {}
    objective_name = names.get("objective", "scaling.objective")
    return [f"warning: {names.get(knob, f'scaling.{knob}')} is the {owner!r} objective's knob; {objective_name} "
            f"is {objective!r}, which ignores it"
            for knob, owner in KNOB_OBJECTIVE.items() if knob in given and owner != objective]


def pareto_mask(cands: Sequence[Candidate]) -> list[bool]:
    """True for feasible candidates no other feasible candidate dominates (no worse in time
    and cost, better in one). O(n log n): sort by (time, cost), sweep the best cost so far."""
    order = sorted((i for i, c in enumerate(cands) if c.feasible),
                   key=lambda i: (cands[i].time_s, cands[i].cost_usd))
    keep = [False] * len(cands)
    best_cost, best_time = float("inf"), None
    for i in order:
        c = cands[i]
        if c.cost_usd < best_cost:
            keep[i], best_cost, best_time = True, c.cost_usd, c.time_s
        elif c.cost_usd == best_cost and c.time_s == best_time:
            keep[i] = True  # an exact duplicate is not beaten
    return keep


def check_objective(objective: str, lam: float, value_of_time_usd_per_s: float | None,
                    time_slack: float, budget_actors: int = 3) -> None:
    """ValueError naming the setting when an objective's knob is out of range."""
    if objective not in OBJECTIVES:
        raise ValueError(f"scaling.objective={objective!r}: use one of {OBJECTIVES}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"scaling.lam={lam}: must be in [0, 1] (1 = fastest, 0 = cheapest)")
    if budget_actors < 1:
        raise ValueError(f"scaling.budget_actors={budget_actors}: must be >= 1 (the fixed "
                         "allocation whose held bill bounds the budget objective)")
    if value_of_time_usd_per_s is not None and not 0.0 <= value_of_time_usd_per_s < float("inf"):
        raise ValueError(f"scaling.value_of_time_usd_per_s={value_of_time_usd_per_s}: must be a "
                         "finite number >= 0 (dollars one second of phase time is worth)")
    if not 0.0 <= time_slack <= 10.0:
        raise ValueError(f"scaling.time_slack={time_slack}: must be in [0, 10] (a fraction of "
                         "the fastest candidate's time)")


def _scores(cands: Sequence[Candidate], keep: Sequence[bool], objective: str, lam: float,
            value_of_time: float, time_slack: float,
            budget_usd: float | None = None) -> list[float | None]:
    live = [c for c, k in zip(cands, keep) if k]
    if objective == "budget":  # the fastest within the budget; none within: the cheapest
        within = [k and budget_usd is not None and c.cost_usd <= budget_usd * (1 + 1e-12)
                  for c, k in zip(cands, keep)]
        if not any(within):
            cheapest = min(c.cost_usd for c in live)
            within = [k and c.cost_usd == cheapest for c, k in zip(cands, keep)]
        return [c.time_s if w else None for c, w in zip(cands, within)]
    if objective == "value":
        return [c.cost_usd + value_of_time * c.time_s if k else None for c, k in zip(cands, keep)]
    if objective == "slack":
        limit = min(c.time_s for c in live) * (1.0 + time_slack) * (1 + 1e-12)
        return [c.cost_usd if k and c.time_s <= limit else None for c, k in zip(cands, keep)]
    feasible = [c for c in cands if c.feasible]  # paper: ranges over every feasible candidate
    t_lo, t_hi = min(c.time_s for c in feasible), max(c.time_s for c in feasible)
    c_lo, c_hi = min(c.cost_usd for c in feasible), max(c.cost_usd for c in feasible)
    return [lam * _normalise(c.time_s, t_lo, t_hi) + (1 - lam) * _normalise(c.cost_usd, c_lo, c_hi)
            if k else None for c, k in zip(cands, keep)]


def _normalise(value: float, lo: float, hi: float) -> float:
    return 0.0 if hi - lo <= 1e-12 * max(abs(hi), 1.0) else (value - lo) / (hi - lo)


def choose(cands: Sequence[Candidate], objective: str = "value", *, lam: float = 0.7,
           value_of_time_usd_per_s: float = 0.0,
           time_slack: float = 0.0,
           budget_usd: float | None = None) -> tuple[int | None, list[float | None]]:
    """Index of the chosen candidate (None when none is feasible) and every candidate's score
    (None where it is infeasible, dominated or, for ``slack``, too slow, for ``budget``, over
    ``budget_usd``; a ``budget`` score is the predicted time)."""
    check_objective(objective, lam, value_of_time_usd_per_s, time_slack)
    keep = pareto_mask(cands)
    if not any(keep):
        return None, [None] * len(cands)
    scores = _scores(cands, keep, objective, lam, value_of_time_usd_per_s, time_slack, budget_usd)
    best_score = min(s for s in scores if s is not None)
    tol = 1e-12 * max(abs(best_score), 1.0)  # float noise is a tie, broken by cost, time, order
    best = min((i for i, s in enumerate(scores) if s is not None and s <= best_score + tol),
               key=lambda i: (cands[i].cost_usd, cands[i].time_s, i))
    return best, scores
