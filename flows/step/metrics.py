"""A step's record: its action results and accounting as a typed ``StepRecord``
(``flows/planning/record.py``) for the planner, and as the metric names of the output (the
committed metrics, the summary, the artifacts, TensorBoard), which are made here and nowhere
else. :class:`StepFigures` reads a committed step back for the progress line, the artifacts,
the summary and report.md, so those name no metric themselves."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actions.contracts import EngineEvents, EvaluateResult
from flows.invokers.base import Activation
from flows.planning.lengths import rank_correlation
from flows.planning.planner import PhasePlan
from flows.planning.record import PhaseObservation, StepRecord
from flows.planning.speculation import step_spec_metrics

if TYPE_CHECKING:
    from flows.step.flow import StepOutcome


# Names the campaign's outputs read back (the progress line, the artifacts, the summary,
# report.md, the budget). The cost, actor and plan names are made by step_metrics below; the
# reward and response-length names arrive with the train action's metrics.
TIMING = "timing_s/"
REWARD_MEAN = "reward/mean"
RESPONSE_LENGTH_MEAN = "response_length/mean"
RESPONSE_LENGTH_MAX = "response_length/max"
ACTORS_N = "actors/n"
ACTORS_MIGRATED = "actors/migrated"
BILLED = "cost/billed_gpu_seconds"
USEFUL = "cost/gpu_seconds"
USD = "cost/usd"
FAILED_BILLED = "cost/failed_billed_gpu_seconds"
PREDICTED_GENERATE = "plan/predicted_generate_s"
HINDSIGHT_GENERATE = "plan/hindsight_generate_s"
"""The generation phase's prediction redone at the lengths observed (``flows/planning/hindsight.py``):
the prediction's error against it is the length predictor's part."""
REWARD_LOGGED = "reward_fn/"
"""Prefix of what the reward functions passed to ``log_metric`` (``reward_fn/<name>``)."""


def timing_key(phase: str) -> str:
    """The metric name of a phase's seconds: ``timing_s/<phase>``."""
    return TIMING + phase


@dataclass(frozen=True, kw_only=True)
class StepFigures:
    """What the outputs show of one committed step, read from its metrics (a ``StepRecord``'s
    ``metrics``, or a committed step of the campaign state) by the names above: the one
    place they are read back."""

    step: int
    """The step's index, 0-based (its metrics' ``step``); outputs show steps committed, ``step + 1``."""
    reward_mean: float
    response_length_mean: float
    response_length_max: float
    """nan: not recorded."""
    num_actors: int
    migrated: int
    """Samples cut and continued elsewhere."""
    billed_gpu_seconds: float
    useful_gpu_seconds: float
    usd: float
    """nan: not recorded."""
    timing_s: Mapping[str, float]
    """Phase -> seconds (plan, prefill, generate, score, train, commit, step, overhead, ...)."""
    predicted_generate_s: float
    """The planner's estimate of the generation actions' phase (nan: not recorded)."""

    @classmethod
    def of(cls, metrics: Mapping[str, Any]) -> StepFigures:
        m = metrics
        return cls(step=int(m["step"]), reward_mean=m[REWARD_MEAN], response_length_mean=m[RESPONSE_LENGTH_MEAN],
                   response_length_max=m.get(RESPONSE_LENGTH_MAX, math.nan), num_actors=int(m[ACTORS_N]),
                   migrated=int(m[ACTORS_MIGRATED]), billed_gpu_seconds=m[BILLED], useful_gpu_seconds=m[USEFUL],
                   usd=m.get(USD, math.nan), timing_s={k[len(TIMING):]: v for k, v in m.items() if k.startswith(TIMING)},
                   predicted_generate_s=m.get(PREDICTED_GENERATE, math.nan))


def fraction(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 and math.isfinite(denominator) else 0.0


BILLING = {
    "local": ("action-seconds", "the wall time of every activation on the local worker processes (init included), "
              "summed: processor time held by actions, not money; scaling.gpus_per_actor multiplies it"),
    "inprocess": ("action-seconds", "the wall time of every action call in this process, summed: not money"),
    "openwhisk": ("GPU-seconds", "each activation's OpenWhisk duration (run plus a cold start's init) times "
                  "scaling.gpus_per_actor, summed: what a serverless GPU platform charges for"),
}


def billing(invoker_kind: str) -> dict[str, str]:
    """The unit and meaning of ``billed_gpu_seconds`` on an invoker (for the CLI and report.md).

    >>> billing("local")["unit"], billing("openwhisk")["unit"]
    ('action-seconds', 'GPU-seconds')
    """
    unit, meaning = BILLING[invoker_kind]
    return {"unit": unit, "meaning": meaning}


def cost_metrics(records: Sequence[Activation], failed: Sequence[Activation], *, gpus_per_actor: int,
                 price: float) -> dict[str, float]:
    """A step's ``cost/*`` metrics from its successful activations (``records``) and the
    attempts that failed and were retried (``failed``), in the unit of ``billing``.

    Billed counts both, as a platform charges for a crashed or killed activation; useful (busy)
    time counts only the successful ones. Each activation counts ``gpus_per_actor`` times its
    seconds, but one whose action holds no GPU (``Activation.gpus`` 0: on OpenWhisk an action
    annotated ``gpus: 0``, the CPU image's ``init_critic`` and ``noop`` probes) counts 0. ``cost/failed_billed_gpu_seconds`` is the failed
    attempts' share of billed, so ``cost/idle_fraction`` = (billed - useful) / billed splits
    into failures and idle time in live containers. ``cost/generate_billed_actor_s``: the
    generation actions' billed seconds, failed attempts included, not times ``gpus_per_actor``.

    >>> from flows.invokers.base import Activation
    >>> ok = Activation("generate", "a", {}, 0.0, 0.0, 1.0, 0.75)  # billed 1.0, busy 0.75
    >>> killed = Activation("generate", "b", {}, 0.0, 0.0, 2.0, 0.0)  # killed after 2 s
    >>> m = cost_metrics([ok], [killed], gpus_per_actor=2, price=0.5)
    >>> m["cost/billed_gpu_seconds"], m["cost/gpu_seconds"], m["cost/failed_billed_gpu_seconds"], m["cost/usd"]
    (6.0, 1.5, 4.0, 3.0)
    >>> m["cost/generate_billed_actor_s"], m["cost/failed_attempts"], m["cost/idle_fraction"]
    (3.0, 1.0, 0.75)
    >>> probe = Activation("noop", "c", {}, 0.0, 0.0, 300.0, 300.0, gpus=0)  # on the CPU image
    >>> cost_metrics([ok, probe], [], gpus_per_actor=2, price=0.5)["cost/billed_gpu_seconds"]
    2.0
    """
    def held(r: Activation) -> int:  # an action that holds no GPU (OpenWhisk's gpus: 0) bills none
        return gpus_per_actor if r.gpus > 0 else 0

    billed_ok = sum(r.billed_s * held(r) for r in records)
    billed_failed = sum(r.billed_s * held(r) for r in failed)
    billed, useful = billed_ok + billed_failed, sum(r.busy_s * held(r) for r in records)
    return {
        USEFUL: useful,
        BILLED: billed,
        USD: billed * price,
        FAILED_BILLED: billed_failed,
        "cost/failed_attempts": float(len(failed)),
        "cost/idle_fraction": fraction(billed - useful, billed),
        # generation actions alone (continuations included): what ranked assignment with early
        # release and cut-and-migrate reduce
        "cost/generate_billed_actor_s": sum(r.billed_s for r in [*records, *failed] if r.action == "generate"),
    }


def step_metrics(out: StepOutcome, phase: PhasePlan, price: float, gpus_per_actor: int,
                 timing_plan: float) -> dict[str, float]:
    """The step's metrics, but ``timing_s/commit`` (the campaign adds it: ``flows/campaign/run.py``)
    and ``timing_s/period`` and ``timing_s/overhead`` (measured around the step)."""
    records = out.records
    gens = out.generate
    primary = [g for g in gens if g.kind == "first"]  # not continuations
    samples = [s for g in gens for s in g.samples if s.finish_reason != "cut"]
    tokens = sum(s.length for s in samples)
    observed: dict[int, int] = {}
    for s in samples:
        observed[s.prompt_id] = max(observed.get(s.prompt_id, 0), s.length)
    ids = sorted(observed)
    timing = dict(out.timing, plan=timing_plan)
    timing["step"] = timing["step"] + timing_plan
    gen_records = [r for r in records if r.action == "generate"]
    prefill_naive = sum(g.prefill_tokens_naive for g in primary)
    prefill_done = sum(g.prefill_tokens for g in primary)
    if out.prefill is not None:
        prefill_done += out.prefill.tokens_computed
    m = {
        **{timing_key(k): float(v) for k, v in timing.items()},
        **cost_metrics(records, out.failed, gpus_per_actor=gpus_per_actor, price=price),
        ACTORS_N: float(phase.plan.num_actors),
        "actors/cut": float(sum(1 for g in primary if g.num_cut)),
        ACTORS_MIGRATED: float(sum(g.num_cut for g in gens)),
        "actors/continuations": float(out.num_continuations),
        "actors/cold_starts": float(sum(1 for r in gen_records if r.cold)),
        "perf/throughput": fraction(tokens, timing["generate"]),
        # the plan's phase (prefill + generation actions) and its two parts; measured:
        # timing_s/prefill and timing_s/generate
        "plan/predicted_time_s": phase.plan.predicted_time_s,
        "plan/predicted_prefill_s": phase.predicted_prefill_s,
        PREDICTED_GENERATE: phase.plan.predicted_time_s - phase.predicted_prefill_s,
        "plan/planning_ms": phase.plan.planning_ms,
        "plan/activation_s": phase.activation_s,
        "plan/prefill_fixed_s": phase.calibration.prefill_fixed_s,
        "plan/decode_scale": phase.calibration.decode_scale,
        "plan/engine_start_s": phase.engine_start_s,  # the vLLM engine start timed past the built engines
        "lengths/rank_correlation": rank_correlation([phase.predicted[p] for p in ids], [observed[p] for p in ids])
        if len(ids) > 1 else 0.0,
        "prefill/unique_prefixes": float(phase.prefill.num_unique_prefixes if phase.prefill else 0),
        "prefill/tokens_saved": float(max(0, prefill_naive - prefill_done)),
        # CUDA graphs the generation actions captured this step (re-capture cost; 0 when warm)
        "engine/graph_captures": float(sum(g.graph_captures for g in gens)),
        "engine/graph_capture_s": sum(g.graph_capture_s for g in gens),
        # the step's work: activations' busy time on the critical path (with the time their
        # failed attempts held) plus the flow's own planning and bookkeeping; the campaign
        # measures the step's period around it and records ``timing_s/overhead`` = period -
        # work (flows/campaign/overhead.py)
        timing_key("work"): _critical_busy(records, out.continued_from, out.failed) + timing_plan,
    }
    for part in (engine_metrics([g.engine_events for g in gens]), step_spec_metrics(g.spec for g in gens),
                 reward_function_metrics([s.reward_metrics for s in out.score]),
                 per_reward_metrics([s.reward_values for s in out.score]), out.train.metrics):
        m.update({k: float(v) for k, v in part.items()})
    return m


def reward_function_metrics(logged: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, float]:
    """The step's ``log_metric`` values, one mean per name over every call of every score
    action (TRL averages a name's values over its logging step), as ``reward_fn/<name>``.

    >>> reward_function_metrics([{"hits": [1.0, 0.0]}, {"hits": [0.5], "len": [3.0]}])
    {'reward_fn/hits': 0.5, 'reward_fn/len': 3.0}
    """
    values: dict[str, list[float]] = {}
    for shard in logged:
        for name, vs in shard.items():
            values.setdefault(name, []).extend(vs)
    return {REWARD_LOGGED + name: sum(vs) / len(vs) for name, vs in sorted(values.items()) if vs}


def per_reward_metrics(scored: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, float]:
    """Each reward function's (and reward model's) unweighted scores over the step, as TRL's
    GRPOTrainer logs them: ``rewards/<name>/mean`` and ``rewards/<name>/std`` (the sample std,
    TRL's ``nanstd``; 0 for a single score), over the rows it scored. ``<name>``: the function's
    own name (``pkg.mod:accuracy`` -> ``accuracy``, as TRL names it by ``__name__``), the whole
    name (``pkg.mod.accuracy``) where two configured ones share it. A function that scored no row
    this step has no entry.

    >>> per_reward_metrics([{"pkg.mod:length": [1.0, 3.0]}, {"pkg.mod:length": [5.0]}])
    {'rewards/length/mean': 3.0, 'rewards/length/std': 2.0}
    >>> per_reward_metrics([{"format": [0.5], "a:s": [1.0], "b:s": []}])
    {'rewards/a.s/mean': 1.0, 'rewards/a.s/std': 0.0, 'rewards/format/mean': 0.5, 'rewards/format/std': 0.0}
    """
    values: dict[str, list[float]] = {}
    for shard in scored:
        for name, vs in shard.items():
            values.setdefault(name, []).extend(vs)
    shown = _shown_names(sorted(values))
    out: dict[str, float] = {}
    for name, vs in sorted(values.items()):
        if not vs:
            continue
        mean = sum(vs) / len(vs)
        std = math.sqrt(sum((v - mean) ** 2 for v in vs) / (len(vs) - 1)) if len(vs) > 1 else 0.0
        out[f"rewards/{shown[name]}/mean"], out[f"rewards/{shown[name]}/std"] = mean, std
    return out


def _shown_names(names: Sequence[str]) -> dict[str, str]:
    """Each reward's name in the metrics, distinct from all others: its short name (after the
    first ``:``; a reward model's folder may hold one); where that clashes, its whole name with
    ``:`` as ``.`` (a character every tracker takes); where that still clashes, that with its
    index in ``names`` appended.

    >>> _shown_names(["a:s", "b:s", "reward_model.0:a.s"])
    {'a:s': 'a.s_0', 'b:s': 'b.s', 'reward_model.0:a.s': 'reward_model.0.a.s'}
    """
    forms = {name: (name.split(":", 1)[-1], name.replace(":", "."), f"{name.replace(':', '.')}_{i}")
             for i, name in enumerate(names)}
    level = dict.fromkeys(names, 0)
    while True:
        shown = {name: forms[name][level[name]] for name in names}
        taken = list(shown.values())
        clashing = [name for name in names if taken.count(shown[name]) > 1]
        if not clashing:
            return shown
        for name in clashing:  # the last form holds the name's own index: it never clashes twice
            level[name] = min(level[name] + 1, 2)


def engine_metrics(events: Sequence[EngineEvents]) -> dict[str, float]:
    """The step's generation-engine work, as its generate results reported it (a worker's
    pre-warm is reported by its next activation): engine starts (vLLM engines, torch slot
    models built) and their seconds (``start_s_max``: one action's most, which the calibration
    reads), and the seconds spent pushing new versions into running engines or the torch slot's
    model (``EngineEvents``)."""
    return {"engine/starts": float(sum(e.starts for e in events)),
            "engine/start_s": sum(e.start_s for e in events),
            "engine/start_s_max": max((e.start_s for e in events), default=0.0),
            "engine/weight_pushes": float(sum(e.pushes for e in events)),
            "engine/weight_push_s": sum(e.push_s for e in events)}


def engine_totals(steps: Sequence[dict[str, Any]], evals: Sequence[EvaluateResult]) -> dict[str, float]:
    """The campaign's engine starts and weight pushes: every step's, plus the evaluations'
    (set-up and periodic ones, which are outside the steps)."""
    names = {"starts": "engine/starts", "start_s": "engine/start_s", "weight_pushes": "engine/weight_pushes",
             "weight_push_s": "engine/weight_push_s"}
    totals = {k: float(sum(s.get(m, 0.0) for s in steps)) for k, m in names.items()}
    for e in evals:
        ev = e.engine_events
        for k, v in (("starts", ev.starts), ("start_s", ev.start_s), ("weight_pushes", ev.pushes),
                     ("weight_push_s", ev.push_s)):
            totals[k] += v
    return totals


def finished_lengths(out: StepOutcome) -> dict[int, tuple[int, ...]]:
    """Prompt id -> the lengths of its finished samples (a cut one is finished by its continuation)."""
    lengths: dict[int, list[int]] = {}
    for g in out.generate:
        for s in g.samples:
            if s.finish_reason != "cut":
                lengths.setdefault(s.prompt_id, []).append(s.length)
    return {p: tuple(v) for p, v in lengths.items()}


def step_record(out: StepOutcome, phase: PhasePlan, *, step: int, epoch: int, metrics: dict[str, float]) -> StepRecord:
    """The typed record of one step, with its output ``metrics`` (:func:`step_metrics`).
    Its ``billed_s`` counts the failed attempts too (what the platform charged per action)."""
    billed: dict[str, float] = {}
    for r in [*out.records, *out.failed]:
        billed[r.action] = billed.get(r.action, 0.0) + r.billed_s
    observed = PhaseObservation(
        num_actors=phase.plan.num_actors, generate_s=float(out.timing["generate"]),
        prefill_s=float(out.timing["prefill"]), ran_prefill=bool(phase.prefill and phase.prefill.num_unique_prefixes),
        predicted_generate_s=phase.plan.predicted_time_s - phase.predicted_prefill_s,
        predicted_prefill_s=phase.predicted_prefill_s, activation_s=phase.activation_s,
        decode_scale=phase.calibration.decode_scale, prefill_fixed_s=phase.calibration.prefill_fixed_s,
        engine_start_s=metrics.get("engine/start_s_max", 0.0), predicted_engine_start_s=phase.engine_start_s)
    return StepRecord(step=step, epoch=epoch, lengths=finished_lengths(out), phase=observed,
                      timing_s={k[len(TIMING):]: v for k, v in metrics.items() if k.startswith(TIMING)},
                      billed_s=billed, call_offsets=dict(out.call_offsets), spec=tuple(g.spec for g in out.generate),
                      prewarm_s=_prewarm_seconds(out.prewarm), metrics=metrics)


def _prewarm_seconds(report: dict[str, float]) -> float | None:
    """``PhasePrewarmer.report``'s duration; None where the pre-warm did not fire."""
    took = report.get("prewarm/duration_s", -1.0)
    return took if took >= 0 else None


PHASES = {"generate": (PREDICTED_GENERATE, timing_key("generate")),
          "prefill": ("plan/predicted_prefill_s", timing_key("prefill")),  # steps that ran one
          "phase": ("plan/predicted_time_s", None),
          "lengths": (PREDICTED_GENERATE, HINDSIGHT_GENERATE)}
"""Predicted and measured metric of each part the planner times (``phase``: both parts;
``lengths``: the generation prediction against itself at the lengths observed, the length
predictor's part of its error)."""


def planner_fidelity(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """How the planner's predicted times compare with the measured ones, per part (``PHASES``):
    relative error ``(predicted - measured) / measured`` per step, its median (signed: below
    zero the planner is optimistic), and the median and 90th percentile of its magnitude. The
    headline is ``generate``, the generation actions' phase the fan-out decides."""
    out: dict[str, Any] = {}
    for part, (pred_key, meas_key) in PHASES.items():
        errors = []
        for s in steps:
            if pred_key not in s or (meas_key is not None and meas_key not in s):
                continue  # steps of an older revision
            if part == "prefill" and s.get("prefill/unique_prefixes") == 0.0:
                continue  # no prefill action ran: its few ms of flow time are no prefill
            measured = s[meas_key] if meas_key else s[timing_key("prefill")] + s[timing_key("generate")]
            errors.append(fraction(s[pred_key] - measured, measured))
        out[part] = _error_stats(errors)
    return out


def _error_stats(errors: list[float]) -> dict[str, Any]:
    if not errors:
        return {"steps": 0, "median_relative_error": None, "median_abs_relative_error": None,
                "p90_abs_relative_error": None}
    magnitudes = sorted(abs(e) for e in errors)
    return {"steps": len(errors), "median_relative_error": statistics.median(errors),
            "median_abs_relative_error": statistics.median(magnitudes),
            "p90_abs_relative_error": magnitudes[min(len(magnitudes) - 1, math.ceil(0.9 * len(magnitudes)) - 1)]}


def _critical_busy(records: Sequence[Activation], continued_from: Mapping[str, Sequence[str]],
                   failed: Sequence[Activation] = ()) -> float:
    """Busy seconds on the critical path: prefill, the longest generate chain, the last score,
    and train (a lower bound of the step's unavoidable compute).

    A generate chain is an action and the continuation that finished its cut samples, which
    starts only once they returned: the continuation's busy time plus the longest chain among
    its sources (``continued_from``: continuation shard -> source shards, by
    ``Activation.shard``). Other actions count their busiest activation.

    An activation's time includes the wall time its shard's ``failed`` attempts held (a
    stalled, killed or crashed attempt before the retry that succeeded: same action and shard).
    That time went to the phase, which waited for it, so it is work of the phase, and the
    step's overhead (period - work) does not count it a second time.

    >>> from flows.invokers.base import Activation
    >>> def a(action, shard, busy):
    ...     return Activation(action, shard, {}, 0.0, 0.0, busy, busy, shard=shard)
    >>> runs = [a("prefill", "prefill", 0.2), a("generate", "gen-0", 1.0), a("generate", "gen-1", 0.8),
    ...         a("generate", "cont-0", 0.6), a("score", "score-gen-0", 0.3), a("train_step", "train", 0.5)]
    >>> round(_critical_busy(runs, {"cont-0": ("gen-0",)}), 6)  # 0.2 + (1.0 + 0.6) + 0.3 + 0.5
    2.6
    >>> stalled = Activation("train_step", "x", {}, 0.0, 0.0, 15.0, 0.0, shard="train")  # held 15 s, no reply
    >>> lost = Activation("generate", "y", {}, 0.0, 0.0, 0.9, 0.0, shard="gen-1")  # its retry: 0.8 s
    >>> round(_critical_busy(runs, {"cont-0": ("gen-0",)}, [stalled, lost]), 6)  # 0.2 + 1.7 + 0.3 + 15.5
    17.7
    """
    held: dict[tuple[str, str], float] = {}
    for f in failed:  # wall time held, as billed less a cold start's init (busy_s leaves init out too)
        held[(f.action, f.shard)] = held.get((f.action, f.shard), 0.0) + f.billed_s - f.init_s

    def own(r: Activation) -> float:
        return r.busy_s + held.get((r.action, r.shard), 0.0)

    busy = {r.shard: own(r) for r in records if r.action == "generate" and r.shard}

    def chain(shard: str, mine: float) -> float:
        return mine + max((chain(s, busy[s]) for s in continued_from.get(shard, ()) if s in busy), default=0.0)

    by_action: dict[str, list[float]] = {}
    for r in records:
        by_action.setdefault(r.action, []).append(chain(r.shard, own(r)) if r.action == "generate" else own(r))
    return sum(max(v) for v in by_action.values())
