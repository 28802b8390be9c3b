"""Trace replay: plan and simulate every step of a length trace under each policy (paper §4.7).

Trace format (JSONL, UTF-8, one line per prompt per step): ``epoch, step, prompt_id,
prompt_len, answer_len, response_lens`` (one length per sample), and optionally
``max_new_tokens``: the generation cap the trace was made with (the same on every line that
has it). Every value is a JSON integer (not a boolean): ids, epochs and steps >= 0, a prompt of
at least one token, token counts up to ``MAX_TOKENS``, and a group of at least one token
(``response_lens`` not all 0). Lines come in (epoch, step) order, as a campaign writes them:
a line of an earlier step after a later one is refused (the planner predicts each step from
the epochs before it, so a reversed trace would predict from the future), and steps run in
that order; a step's prompts keep their file order (the "given order" of contiguous /
round-robin assignment).

Per step: predictions come from a ``LengthHistory`` of earlier epochs (the reference answer
length where a prompt has none, i.e. in epoch 0, or a fit learned from the prompts seen so far:
``ClusterModel.first_epoch``), or equal the true group max for ``oracle``;
predictions are capped at the generation cap (``max_new_tokens``, as in the live planner: the
trace's own, else given; never read off the trace's lengths, which would tell the planner of
every step the longest response of all the steps after it); the
planner runs (its wall time is recorded), told how far the policy's own predictions missed on its
last ``ClusterModel.tail_error_steps`` steps (``robust.MeasuredError``; none before the first
step, all zero for ``oracle``); the phase is simulated with the true lengths
(plus the learner's scoring and training where ``ClusterModel.learner_tokens_per_s`` is set);
beside each policy's GPU-s (its actors') go the learner's (``StepRecord.learner_gpu_seconds``);
then the planner observes the step's lengths (the same for every policy, since the trace
fixes what was generated). Planning and observing is the live campaign's
``flows/planning/planner.py: Planner``, one per policy.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Mapping

from actions.config.quoting import quote
from flows.planning.lengths import LengthHistory, predict_lengths, rank_correlation
from flows.planning.plan import GenerationPlan
from flows.planning.planner import PhaseInputs
from flows.planning.prewarm import warm_actor_count
from flows.planning.record import StepRecord as ObservedStep
from flows.planning.robust import MeasuredError
from flows.simulate.cluster import PhaseResult, Sample, simulate_phase
from flows.simulate.policies import (
    ClusterModel,
    Policy,
    build_actors,
    held_actors,
    learner_node_gpu_seconds,
    make_plan,
    parse_policy,
    sim_config,
)

_FIELDS = ("epoch", "step", "prompt_id", "prompt_len", "answer_len")
MAX_TOKENS = 2**20
"""Largest token count (prompt, answer, response or generation cap) a trace line may state:
1,048,576, beyond any RL rollout's prompt or response; a larger one is an error in the trace
(the planner's per-context tables grow with it). Ids, epochs and steps are bounded by 2**31."""
_MAX_ID = 2**31


@dataclass(frozen=True)
class PromptRow:
    prompt_id: int
    prompt_len: int
    answer_len: int
    response_lens: tuple[int, ...]


@dataclass(frozen=True)
class TraceStep:
    epoch: int
    step: int
    prompts: tuple[PromptRow, ...]
    max_new_tokens: int | None = None
    """The generation cap the trace states (its ``max_new_tokens`` field); None: it states none."""


def _count(value: object) -> bool:
    """A JSON integer (not a boolean, which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_line(text: str, where: str) -> tuple[int, int, PromptRow, int | None]:
    """One trace line; ValueError starting with ``where`` (path:line) naming the field, the
    value and the range it must be in (``response_lens`` also: not every sample 0 tokens)."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc.msg}); write one JSON object per line") from None
    except (ValueError, RecursionError):  # an integer of thousands of digits, nesting too deep
        raise ValueError(f"{where}: a number too long or nesting too deep; write one flat JSON object "
                         "of token counts per line") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object")
    for name in (*_FIELDS, "response_lens"):
        kind = list if name == "response_lens" else int
        if not isinstance(row.get(name), kind) or isinstance(row.get(name), bool):
            raise ValueError(f"{where}: field {name!r} missing or not {kind.__name__}")
    for name, low, high in (("epoch", 0, _MAX_ID), ("step", 0, _MAX_ID), ("prompt_id", 0, _MAX_ID),
                            ("prompt_len", 1, MAX_TOKENS), ("answer_len", 0, MAX_TOKENS)):
        if not low <= row[name] <= high:
            raise ValueError(f"{where}: {name}={_short(row[name])}: must be an integer in [{low}, {high}]")
    lens = row["response_lens"]
    if not lens or not all(_count(x) and 0 <= x <= MAX_TOKENS for x in lens):
        raise ValueError(f"{where}: response_lens={_short(lens)}: must be a non-empty list of integers in "
                         f"[0, {MAX_TOKENS}] (tokens per sample)")
    if not any(lens):  # no decode work: a step of such groups is a 0 s phase its ratios divide by
        raise ValueError(f"{where}: response_lens={_short(lens)}: every sample 0 tokens, a group that "
                         "generated nothing; give each sample's generated tokens, or drop the line")
    cap = row.get("max_new_tokens")
    if cap is not None and not (_count(cap) and 1 <= cap <= MAX_TOKENS):
        raise ValueError(f"{where}: max_new_tokens={_short(cap)}: must be an integer in [1, {MAX_TOKENS}] "
                         "(the generation cap)")
    return row["epoch"], row["step"], PromptRow(row["prompt_id"], row["prompt_len"],
                                                row["answer_len"], tuple(lens)), cap


def _short(value: object) -> str:
    """A trace value quoted short for an error line (a 400-digit integer is not echoed whole,
    and says how long it is)."""
    if _count(value) and abs(value) >= 10**30:
        return f"{str(value)[:12]}... ({len(str(value))} digits)"
    return quote(value, 60)


def read_trace(path: str | Path) -> list[TraceStep]:
    """Steps of a JSONL trace (UTF-8), each carrying the trace's generation cap where it states
    one; ValueError with the path and line number on a malformed line (``_parse_line``: JSON,
    field types and ranges), a second, different cap, a prompt twice in one step or a line of
    an earlier (epoch, step) after a later one (module docstring)."""
    steps: dict[tuple[int, int], list[PromptRow]] = {}
    cap: int | None = None
    latest: tuple[int, int] | None = None
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{number}: not UTF-8 text (byte {exc.start} of the line); save the "
                                 "trace as UTF-8 JSONL") from None
            if not text.strip():
                continue
            epoch, step, row, line_cap = _parse_line(text, f"{path}:{number}")
            if line_cap is not None and cap not in (None, line_cap):
                raise ValueError(f"{path}:{number}: max_new_tokens={line_cap}, but an earlier line says {cap}")
            cap = line_cap if line_cap is not None else cap
            if latest is not None and (epoch, step) < latest:
                raise ValueError(f"{path}:{number}: epoch {epoch}, step {step} comes after epoch {latest[0]}, "
                                 f"step {latest[1]}; steps replay in file order, each predicted from the "
                                 "epochs before it: sort the trace by epoch, step")
            latest = (epoch, step)
            rows = steps.setdefault((epoch, step), [])
            if any(r.prompt_id == row.prompt_id for r in rows):
                raise ValueError(f"{path}:{number}: prompt {row.prompt_id} twice in step {step}")
            rows.append(row)
    if not steps:
        raise ValueError(f"{path}: no trace lines; write one JSON object per line ({', '.join(_FIELDS)}, "
                         "response_lens), as benchmarks/make_traces.py does")
    return [TraceStep(e, s, tuple(rows), cap) for (e, s), rows in steps.items()]


@dataclass
class StepRecord:
    """One replayed step. ``time_s``/``gpu_seconds``: the step as modelled (the generation
    phase, plus the learner's phases where the model has a learner rate; so is ``idle_fraction``,
    a serverful policy's actors held idle through the learner's phases), ``gpu_seconds`` being
    the policy's actors' alone; ``learner_gpu_seconds``: the learner's GPUs x ``time_s``, less
    what the policy's actors billed on them (counted once, in ``gpu_seconds``); ``gen_*``: the
    generation phase alone; ``predicted_*``: what the planner estimated for that phase;
    ``n_actors``: the actors the policy held (``policies.held_actors``: static:N's N, idle ones
    included)."""

    step: int
    n_actors: int
    time_s: float
    gpu_seconds: float
    idle_fraction: float
    planning_ms: float
    rank_corr: float
    num_cut: int
    num_migrated: int
    gen_time_s: float = 0.0
    gen_gpu_seconds: float = 0.0
    predicted_time_s: float = 0.0
    predicted_gpu_seconds: float = 0.0
    gen_idle_fraction: float = 0.0
    learner_gpu_seconds: float = 0.0

    @property
    def time_error(self) -> float:
        """(predicted - replayed) / replayed generation-phase time."""
        return (self.predicted_time_s - self.gen_time_s) / self.gen_time_s if self.gen_time_s else 0.0


@dataclass
class PolicyRun:
    name: str
    steps: list[StepRecord] = field(default_factory=list)
    planned: list[int] = field(default_factory=list)
    plans: list[GenerationPlan] = field(default_factory=list)
    """The plan of every step, in order."""

    def summary(self) -> dict:
        """Totals of the modelled steps (``total_*``; ``actor_gpu_seconds``: the policy's
        actors, the text table's ``actor_gpu_s``, also under its older name
        ``total_gpu_seconds``; ``total_gpu_seconds_with_learner``: with the learner's GPUs held
        through every step, the table's ``total_gpu_s``, ``StepRecord``) and of their
        generation phases alone (``generation``);
        ``fidelity``: the planner's predicted against the replayed phase time, as absolute
        relative errors over the steps (median and 90th percentile)."""
        ms = [s.planning_ms for s in self.steps]
        errors = sorted(abs(s.time_error) for s in self.steps)
        actors = sum(s.gpu_seconds for s in self.steps)
        return {"total_time_s": sum(s.time_s for s in self.steps),
                "actor_gpu_seconds": actors,
                "total_gpu_seconds": actors,  # the older name of actor_gpu_seconds, kept for readers of it
                "total_gpu_seconds_with_learner": sum(s.gpu_seconds + s.learner_gpu_seconds for s in self.steps),
                "generation": {"time_s": sum(s.gen_time_s for s in self.steps),
                               "gpu_seconds": sum(s.gen_gpu_seconds for s in self.steps),
                               "mean_idle_fraction": statistics.fmean(s.gen_idle_fraction for s in self.steps)},
                "fidelity": {"median_abs_error": statistics.median(errors),
                             "p90_abs_error": _quantile(errors, 0.9)},
                "mean_idle_fraction": statistics.fmean(s.idle_fraction for s in self.steps),
                "planning_ms_p50": statistics.median(ms), "planning_ms_max": max(ms),
                "steps": [{"step": s.step, "n_actors": s.n_actors, "time_s": s.time_s,
                           "gpu_seconds": s.gpu_seconds, "gen_time_s": s.gen_time_s,
                           "predicted_time_s": s.predicted_time_s} for s in self.steps]}


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of sorted values (the smallest value with at least q of them at
    or below it)."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def _samples(step: TraceStep) -> dict[int, list[Sample]]:
    out, sid = {}, 0
    for row in step.prompts:
        out[row.prompt_id] = []
        for length in row.response_lens:
            out[row.prompt_id].append(Sample(sid, row.prompt_id, row.prompt_len, length))
            sid += 1
    return out


def run_step(policy: Policy, step: TraceStep, predicted: dict[int, float], model: ClusterModel,
             warm_pool: int = 0) -> tuple[PhaseResult, float, int, list[Sample]]:
    """Plan and simulate one step: (result, planning ms, planned N, samples); see
    ``replay_step`` for the generation phase and the plan as well.

    ``warm_pool``: actors kept warm from the previous step; those beyond this step's N are
    spares a continuation actor can use without a cold start.
    """
    result, _, plan, done = replay_step(policy, step, predicted, model, warm_pool)
    return result, plan.planning_ms, plan.num_actors, done


def replay_step(policy: Policy, step: TraceStep, predicted: dict[int, float], model: ClusterModel,
                warm_pool: int = 0, tail_error: MeasuredError | None = None
                ) -> tuple[PhaseResult, PhaseResult, GenerationPlan, list[Sample]]:
    """(the step's result, its generation phase's result, the plan, the samples) of one step
    planned with ``predicted`` by the policy's settings alone (no planner memory);
    ``tail_error``: the predictor's measured error the planner is given."""
    ids = [r.prompt_id for r in step.prompts]
    prompt_lengths = {r.prompt_id: r.prompt_len for r in step.prompts}
    group_size = max(len(r.response_lens) for r in step.prompts)
    plan = make_plan(policy, ids, predicted, prompt_lengths, group_size, model, tail_error)
    return execute_step(policy, step, plan, predicted, model, warm_pool)


def execute_step(policy: Policy, step: TraceStep, plan: GenerationPlan, predicted: Mapping[int, float],
                 model: ClusterModel, warm_pool: int = 0
                 ) -> tuple[PhaseResult, PhaseResult, GenerationPlan, list[Sample]]:
    """Simulate ``plan`` (made with ``predicted``) on the step's true lengths: as ``replay_step``.
    The step's result carries the learner's GPU-s (``PhaseResult.learner_gpu_seconds``: its
    GPUs x the step's time, less the GPU-s the policy billed on them); the phase's does not."""
    prompt_lengths = {r.prompt_id: r.prompt_len for r in step.prompts}
    samples = _samples(step)
    specs, extra = build_actors(policy, plan, samples, prompt_lengths, model, predicted)
    spare = max(0, warm_pool - plan.num_actors)
    gen, done = simulate_phase(specs, sim_config(policy, model, spare), extra_gpu_seconds=extra)
    learn = held = 0.0
    if model.learner_tokens_per_s:  # the rest of the step (see ClusterModel.learner_tokens_per_s)
        tokens = sum(r.prompt_len * len(r.response_lens) + sum(r.response_lens) for r in step.prompts)
        learn = tokens / model.learner_tokens_per_s
        # standalone static:N: its actors' own GPUs, held idle while the learner works
        held = held_actors(policy, plan) * model.gpus_per_actor * learn if policy.serverful else 0.0
    # what a policy bills on the learner node is within the learner's hold where that covers the
    # node: counted once, in the policy's GPU-s; a smaller learner leaves it on top (an upper bound)
    shared = (learner_node_gpu_seconds(policy, plan, specs, gen.release_s, prompt_lengths, model)
              if model.num_learner_gpus >= model.gpus_per_node else 0.0)
    time_s = gen.time_s + learn
    result = replace(gen, time_s=time_s, gpu_seconds=gen.gpu_seconds + held,
                     learner_gpu_seconds=model.num_learner_gpus * time_s - shared)
    return result, gen, plan, done


def replay(steps: list[TraceStep], policy_names: list[str], model: ClusterModel,
           window: int = 1, max_new_tokens: int | None = None) -> dict[str, PolicyRun]:
    """Run every policy over every step; see the module docstring.

    Each policy plans with its own :class:`~flows.planning.planner.Planner` (the live
    campaign's object, ``ClusterModel.planner``): it predicts from the lengths it observed
    (prompts without history by ``model.first_epoch`` from reference and prompt length, the
    live hook's features) and gives the strategy its own predictions' measured error.

    ``max_new_tokens``: the generation cap the trace was made with; predictions are capped at
    it, as the live planner caps them. Default: the cap the trace states; ValueError where it
    states none (``generation_cap``), or where ``policy_names`` names a policy twice (the
    runs are keyed by name).
    """
    if len(set(policy_names)) < len(policy_names):  # runs are keyed by name: one would swallow the other
        twice = next(n for i, n in enumerate(policy_names) if n in policy_names[:i])
        raise ValueError(f"policy {twice!r} given twice; name each policy once")
    policies = [parse_policy(name) for name in policy_names]
    runs = {p.name: PolicyRun(p.name) for p in policies}
    cap = generation_cap(steps, max_new_tokens)
    group_size = max(len(r.response_lens) for s in steps for r in s.prompts)
    planners = {p.name: model.planner(p, group_size=group_size, max_length=cap, window=window) for p in policies}
    for step in steps:
        truth = {r.prompt_id: float(max(r.response_lens)) for r in step.prompts}
        observed = ObservedStep(step=step.step, epoch=step.epoch,
                              lengths={r.prompt_id: r.response_lens for r in step.prompts})
        corr = None
        for policy in policies:
            run, planner = runs[policy.name], planners[policy.name]
            phase = planner.plan(phase_inputs(step, truth if policy.oracle else None))
            if corr is None and not policy.oracle:  # every policy's predictor is the same
                corr = rank_correlation([phase.predicted[r.prompt_id] for r in step.prompts],
                                        [truth[r.prompt_id] for r in step.prompts])
            pool = warm_actor_count(run.planned, default=0)
            result, gen, plan, _ = execute_step(policy, step, phase.plan, phase.predicted, model, pool)
            planner.observe(observed)
            run.planned.append(plan.num_actors)
            run.steps.append(StepRecord(step.step, held_actors(policy, plan), result.time_s, result.gpu_seconds,
                                        result.idle_fraction, plan.planning_ms, 1.0 if policy.oracle else corr,
                                        result.num_cut, result.num_migrated, gen.time_s, gen.gpu_seconds,
                                        plan.predicted_time_s, plan.predicted_gpu_seconds, gen.idle_fraction,
                                        result.learner_gpu_seconds))
            run.plans.append(phase.plan)
    return runs


def phase_inputs(step: TraceStep, known: dict[int, float] | None = None) -> PhaseInputs:
    """The planner's inputs for a trace step (``known``: the oracle's true lengths)."""
    return PhaseInputs(prompt_ids=tuple(r.prompt_id for r in step.prompts), epoch=step.epoch,
                       prompt_lengths={r.prompt_id: r.prompt_len for r in step.prompts},
                       reference_lengths={r.prompt_id: r.answer_len for r in step.prompts},
                       known_lengths=known, group_size=max(len(r.response_lens) for r in step.prompts))


def generation_cap(steps: list[TraceStep], max_new_tokens: int | None = None) -> float:
    """The generation cap (tokens): ``max_new_tokens``, else the one the trace states.

    Raises:
        ValueError: neither gives one, they differ, or a response runs past the cap. The
            trace's longest response is no substitute: it is known only once every step has
            run, and would cap each step's predictions (and censor the first epoch's fit) with
            what later steps generate.
    """
    stated = {s.max_new_tokens for s in steps} - {None}
    if max_new_tokens is not None and stated and stated != {max_new_tokens}:
        raise ValueError(f"--max-new-tokens {max_new_tokens}, but the trace states {sorted(stated)}; drop the flag "
                         "(the trace's cap is used) or pass the cap the trace was made with")
    cap = max_new_tokens if max_new_tokens is not None else max(stated, default=None)
    if cap is None:
        raise ValueError("the trace states no generation cap (a max_new_tokens field): give the one it "
                         "was made with (rlhfless simulate --max-new-tokens N)")
    if not 1 <= cap <= MAX_TOKENS:
        raise ValueError(f"max_new_tokens={cap}: must be in [1, {MAX_TOKENS}] (tokens)")
    longest = max(x for s in steps for r in s.prompts for x in r.response_lens)
    if longest > cap:
        raise ValueError(f"max_new_tokens={cap}: the trace has a {longest}-token response; give the cap "
                         "it was made with")
    return float(cap)


def measured_error(pairs: list[tuple[list[float], list[float]]], num_steps: int, cap: float,
                   quantile: float) -> MeasuredError | None:
    """The predictor's error over the last ``num_steps`` of ``pairs`` (per step: predicted and
    observed group max lengths); None with no step measured or ``num_steps`` 0."""
    recent = pairs[-num_steps:] if num_steps > 0 else []
    if not recent:
        return None
    return MeasuredError.of([p for pred, _ in recent for p in pred], [o for _, obs in recent for o in obs],
                            cap, quantile)


def step_predictions(steps: list[TraceStep], model: ClusterModel, window: int = 1,
                     max_new_tokens: int | None = None
                     ) -> Iterator[tuple[TraceStep, dict[int, float], dict[int, float]]]:
    """(step, predicted, truth) per step, in order: the lengths a planner predicts before the
    step (prompt id -> tokens; ``replay`` explains the predictor and the cap) and the true group
    max lengths. The step's lengths join the history when the next step is asked for."""
    history = LengthHistory()
    cap = generation_cap(steps, max_new_tokens)
    for step in steps:
        ids = [r.prompt_id for r in step.prompts]
        refs = {r.prompt_id: r.answer_len for r in step.prompts}
        prompt_lens = {r.prompt_id: r.prompt_len for r in step.prompts}
        predicted = predict_lengths(history, ids, refs, window, max_length=cap,
                                    first_epoch=model.first_epoch, prompt_lengths=prompt_lens)
        yield step, predicted, {r.prompt_id: float(max(r.response_lens)) for r in step.prompts}
        for row in step.prompts:
            history.record(row.prompt_id, step.epoch, row.response_lens, row.answer_len, row.prompt_len)
