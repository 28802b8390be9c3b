"""A phase's generation prediction redone with the lengths its samples really had: which part
of the planner's error is the length predictor's.

A phase's predicted time errs for two reasons: the predicted lengths were wrong (a first
epoch's references, a prompt whose responses changed), and the machine decodes at another speed
than the profile says. :func:`hindsight_generate_s` takes the first out: the prediction scaled
by how much longer or shorter the same assignment takes, on the same profile, cluster and
calibration, with each prompt at its group's observed longest sample (the quantity the lengths
predictor predicts, ``flows/planning/lengths.py``) than at its predicted length. A ratio, not a
new timing: the plan was timed by the planner's vectorised sweep (whose context buckets may land
one bucket low, ``DecodeEstimator.slice_timer``) and perhaps with a robust tail, and both stay
as they were, so only the lengths change. Every step records it
(``plan/hindsight_generate_s``); the report gives the predicted time's error against it (the
length predictor's part) beside the error against the measured time.

The calibration learns from it only where the lengths ran longer than predicted by more than a
steady bias (``calibration.LENGTH_MISS_ABSORBED``). Otherwise its decode scale compares the measured time
with the prediction itself, so a steady length bias is absorbed with the speed, which is what
the next plans need: on the default campaign (24 steps, all in the first epoch, whose learned
predictor gives each group its upper quartile on purpose, ``first_epoch.BASE_QUANTILE``: the
predicted group maxes ran about 1.4x the observed ones) the prediction redone at the observed
lengths was 0.65x the prediction (median; 0.53-0.94 from step 2 on). A scale learned against it, speed
alone, would have left every prediction about 1.5x long. Such a run was made: with the other
load of that machine the implied scale then ran into the cap ``calibration.SCALE_RANGE`` had (10) and
the median error went from +3.8% to -39%. What the absorbed bias costs is a few steps after it
changes (the calibration's window), when a new epoch's predictions come from the history.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flows.planning.loads import group_loads, make_env
from flows.planning.plan import ClusterSpec
from flows.planning.timeline import evaluate_candidate
from flows.planning.tpot import TpotProfile


@dataclass(frozen=True)
class PhaseModel:
    """What a phase's plan was timed with (``Planner.plan``), to time it again."""

    profile: TpotProfile
    """The profile at the decode scale the chosen fan-out was timed at."""
    cluster: ClusterSpec
    group_size: int
    prompt_lengths: Mapping[int, int]
    prefill_tokens: float
    """The prefill action's tokens (every prompt's where no prefill action ran)."""
    own_prefill_tokens: Mapping[int, int] | None = None
    """Per prompt, the suffix its generation action prefills itself (None: none)."""


def hindsight_generate_s(model: PhaseModel, assignments: Sequence[Sequence[int]], predicted: Mapping[int, float],
                         observed: Mapping[int, Sequence[int]], predicted_generate_s: float,
                         activation_s: float) -> float:
    """``predicted_generate_s`` (the phase's predicted time less the prefill's, ``a =
    activation_s`` of it each activation's fixed cost) as it would have been with every prompt
    at ``max(observed[p])`` tokens: ``a + (predicted_generate_s - a) * (h - a) / (p - a)``, with
    ``h`` and ``p`` the generation phase of ``assignments`` timed at the observed and at the
    ``predicted`` lengths. A prompt with no observed sample (none finished) stays at its
    prediction; a plan whose timing gives nothing to scale (``p <= a``) keeps its prediction."""
    base = _generate_s(model, assignments, predicted)
    if base <= activation_s:
        return predicted_generate_s
    lengths = {p: float(max(observed[p])) if observed.get(p) else float(predicted[p]) for p in predicted}
    ratio = (_generate_s(model, assignments, lengths) - activation_s) / (base - activation_s)
    return activation_s + (predicted_generate_s - activation_s) * ratio


def _generate_s(model: PhaseModel, assignments: Sequence[Sequence[int]], lengths: Mapping[int, float]) -> float:
    """The generation phase of ``assignments`` with these lengths, one group at a time."""
    groups = [tuple(a) for a in assignments if a]
    ids = [p for g in groups for p in g]
    own = None if model.own_prefill_tokens is None else {p: model.own_prefill_tokens.get(p, 0) for p in ids}
    env = make_env(ids, lengths, model.prompt_lengths, model.group_size, model.profile, model.cluster,
                   model.prefill_tokens, max(len(g) for g in groups), own)
    loads = group_loads(groups, lengths, model.prompt_lengths, env)
    time_s, _, _ = evaluate_candidate(loads.decode, loads.tokens, model.cluster, env.prefill_s)
    return time_s - env.prefill_s
