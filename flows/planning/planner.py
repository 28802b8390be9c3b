"""The planner: one object per campaign that plans each generation phase and learns from each
step (paper §3.3-3.7).

``plan(inputs) -> PhasePlan`` predicts every prompt's response length from the length history,
picks the dedup prefix and whether a prefill action pays, corrects the engine profile (the
measured speculation speed-up, the calibration learned from past steps), prices the vLLM
engine's starts beyond the engines built (``flows/planning/engine_starts.py``), gives the scaling
strategy the predictor's measured error for its robust tail, and asks it for the fan-out and
the prompt -> action assignment (``scaling.plan_generation``); then the cut points
(``migrate.plan_cut_points_of``, at the strategy's cut threshold) and the pre-warm time
(``prewarm.prewarm_offset``).

``observe(record)`` folds one step's :class:`~flows.planning.record.StepRecord` into the
planner's memory, :class:`PlannerState`: the length history, the predictor's recent errors,
the phases as planned and measured (the calibration's data), the speculation rates and
speed-up and the actions' call offsets. That state is all the planner remembers, and the
campaign commits it with every step (``flows/campaign/state.py``), so a resumed campaign plans
exactly as an uninterrupted one. The simulator drives the same object
(``flows/simulate/replay.py``), with the rules of its cluster model.

Pure: no I/O, no clock (``planning_ms`` is wall time, recorded, never decided on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from flows.planning.calibration import Calibration, calibrate, calibration_memory
from flows.planning.engine_starts import EngineStarts
from flows.planning.hindsight import PhaseModel, hindsight_generate_s
from flows.planning.lengths import LengthHistory, predict_lengths
from flows.planning.migrate import plan_cut_points_of
from flows.planning.plan import ClusterSpec, GenerationPlan
from flows.planning.prefix import PrefillPlan, plan_prefill, prefill_action_pays
from flows.planning.prewarm import prewarm_lead, prewarm_offset
from flows.planning.record import PhaseObservation, StepRecord
from flows.planning.robust import MeasuredError
from flows.planning.scaling import plan_generation, strategy_of
from flows.planning.settings import PlannerSettings
from flows.planning.speculation import acceptance_rates, decode_speedup, running_speedup, speculative_profile
from flows.planning.timeline import prefill_seconds
from flows.planning.tpot import TpotProfile

CALL_HISTORY = 8
"""Steps of call history kept for pre-warming (the earliest offset over them is used)."""
EPOCHS_KEPT = 8
"""Epochs of each prompt's length history kept (or ``lengths.window``, if more): predictions
read the last ``window``; a resume with a longer window than both starts from these."""


@dataclass(frozen=True)
class PhasePlan:
    """The plan of one generation phase, which the step flow executes exactly."""

    plan: GenerationPlan
    prefill: PrefillPlan | None
    predicted: dict[int, float]
    cut_after: tuple[int | None, ...]  # per actor: samples finished before it is cut (None: never)
    prewarm_offset_s: float | None = None
    """Seconds after the step starts to pre-warm the generation actions (None: no history)."""
    predicted_prefill_s: float = 0.0
    """The planner's prefill time P (``timeline.prefill_seconds``): ``plan.predicted_time_s``
    minus this is its prediction of the generation actions' phase."""
    calibration: Calibration = Calibration()
    """The corrections the plan was timed with (recorded per step, learned from them)."""
    activation_s: float = 0.0
    """The per-activation fixed cost the plan was timed with."""
    engine_start_s: float = 0.0
    """The engine start the plan timed on its actions beyond the workers holding an engine
    (``flows/planning/engine_starts.py``); 0: it timed none."""


@dataclass(frozen=True, kw_only=True)
class PhaseInputs:
    """What one phase is planned for."""

    prompt_ids: tuple[int, ...]
    """The step's prompts, in the given order (each carries ``group_size`` samples)."""
    epoch: int
    prompt_lengths: Mapping[int, int]
    reference_lengths: Mapping[int, float]
    """Prompt id -> reference answer length (tokens), the first epoch's predictor."""
    prompts: Mapping[int, Sequence[int]] | None = None
    """Prompt id -> token ids, for the dedup prefill plan (None: no prefill plan)."""
    known_lengths: Mapping[int, float] | None = None
    """Lengths to plan with instead of predictions (the simulator's oracle)."""
    group_size: int | None = None
    """Samples per prompt where a step has its own (a trace's); None: the rules'."""


@dataclass(frozen=True, kw_only=True)
class PlannerRules:
    """The validated configuration the planner runs with (built once per campaign:
    ``flows/step/phase.py`` from ``scaling.*`` and ``generation.*``; the simulator's
    ``ClusterModel.planner``)."""

    settings: PlannerSettings
    """The strategy, candidate range, objective, the engine profile before corrections and the
    cluster before calibration."""
    group_size: int
    length_window: int
    max_length: float | None
    """The generation cap (tokens): predictions and measured errors are capped at it."""
    first_epoch: str
    cut_threshold: float | None
    """``generation.cut_threshold``; the strategy decides what a phase runs with."""
    prefill_capacity: int | None = None
    """``generation.prefill_capacity`` with ``dedup_prefill``; None: no prefill plan."""
    prefill_action: str = "never"
    """``generation.prefill_action``: auto, always or never."""
    full_prefill_action: bool = False
    """True: where there is no dedup prefill plan, a prefill action still computes every
    prompt in full and ships its KV (the simulator's model of the paper's prefill actor,
    ``flows/simulate/policies.py``). False (the live flow, ``flows/step/flow.py``): no prefill
    plan, no prefill action, so no prefill time is planned and no prefix KV travels."""
    speculative: bool = False
    """Decode times are divided by the measured speculation speed-up."""
    calibrated: bool = False
    """Profile and prefill corrected from the measured steps (measured inputs only)."""
    prewarm_buffer_s: float | None = None
    """``scaling.prewarm_buffer_s`` with ``scaling.prewarm``; None: no pre-warm."""
    prewarm_floor_s: float = 0.0
    """The least a generation pre-warm takes on the invoker (s): its lead before one is measured."""
    tail_error_steps: int = 0
    """Steps of measured prediction error given to the strategy's robust tail; 0: none."""
    tail_quantile: float = 0.5
    engine_starts: EngineStarts | None = None
    """How an action beyond the workers holding a vLLM engine pays its start, from what the
    calibration learned (``flows/planning/engine_starts.py``); None: no start is priced (the
    torch engine, the in-process invoker, the simulator), the cluster as configured."""


class PlannerState(BaseModel):
    """Everything the planner has learned, committed with each step (JSON-exact floats)."""

    length_history: dict[str, Any] = {}
    """``LengthHistory.to_dict``: per prompt its group max per epoch, reference and prompt length."""
    errors: list[tuple[list[float], list[float]]] = []
    """Per recent step: the group max lengths predicted and observed, in prompt order."""
    phases: list[PhaseObservation] = []
    """The measured phases the calibration reads (``calibration_memory``: the recent ones, at
    most a few fan-outs times its window), as planned and measured, oldest first."""
    call_history: dict[str, list[float]] = {}
    """Action -> its earliest submission offset in each of the last ``CALL_HISTORY`` steps."""
    prewarm_s: list[float | None] = []
    """Seconds the generation pre-warm took in each of the last ``CALL_HISTORY`` steps (None: the
    step fired none); ``prewarm.prewarm_lead`` of them is how much earlier the next one fires."""
    spec_rates: dict[str, float] = {}
    """Drafting strategy -> acceptance rate measured by the latest step that used it."""
    spec_speedup: float = 1.0
    """Running measured decode speed-up of speculation (``flows/planning/speculation.py``)."""


class Planner:
    """Plans phases and observes steps; see the module docstring."""

    def __init__(self, rules: PlannerRules, state: PlannerState | None = None) -> None:
        self.rules = rules
        self.strategy = strategy_of(rules.settings)
        self._memory = (state or PlannerState()).model_copy(deep=True)
        self._history = LengthHistory.from_dict(self._memory.length_history)
        # the last phase planned: its inputs, its plan and what it was timed with
        self._last: tuple[PhaseInputs, PhasePlan, PhaseModel] | None = None
        # the widest fan-out observed by this planner, that is since this process started: the
        # local pool's engines (EngineStarts.outlives_process) are its, not the campaign's
        self._widest_here = 0

    @property
    def state(self) -> PlannerState:
        """A copy of everything the planner remembers: a planner built from it plans as this one
        does (the history's sums run in prompt order, ``LengthHistory.reference_scale``)."""
        return self._memory.model_copy(update={"length_history": self._history.to_dict()}, deep=True)

    def plan(self, inputs: PhaseInputs, calibration: Calibration | None = None) -> PhasePlan:
        """The plan of one generation phase (module docstring); ``calibration``: the
        corrections to plan with (default: those the observed phases imply, where the rules
        calibrate, with the engines built since this planner started where they do not outlive
        the process: ``EngineStarts.outlives_process``)."""
        r, ids = self.rules, list(inputs.prompt_ids)
        group_size = inputs.group_size or r.group_size
        predicted = dict(inputs.known_lengths) if inputs.known_lengths is not None else predict_lengths(
            self._history, ids, dict(inputs.reference_lengths), window=r.length_window, max_length=r.max_length,
            first_epoch=r.first_epoch, prompt_lengths=dict(inputs.prompt_lengths))
        # a calibration given is the caller's, its engines built (max_fan_out) included
        widest_here = None if calibration is not None else self._widest_here
        if calibration is None:
            calibration = calibrate(self._memory.phases) if r.calibrated else Calibration()
        base = r.settings.profile
        if r.speculative:
            base = speculative_profile(base, self._memory.spec_speedup)
        profile = calibration.profile(base) if r.calibrated or calibration != Calibration() else base
        cluster = replace(r.settings.cluster, prefill_fixed_s=calibration.prefill_fixed_s)
        if r.engine_starts is not None:
            cluster = r.engine_starts.cluster(cluster, calibration, widest_here)
        prefill, cluster = self._prefill(inputs, group_size, profile, cluster)
        # the prefill action computes the unique prefixes; each generation action then the
        # suffixes of its own prompts, so the suffixes are timed on the actions, split as they are
        prefill_tokens = prefill.prefix_tokens if prefill else sum(inputs.prompt_lengths[p] for p in ids)
        own = {p: prefill.suffix_tokens(inputs.prompt_lengths[p]) for p in ids} if prefill else None
        settings = replace(r.settings, policy=self.strategy, profile=profile, cluster=cluster,
                           tail_error=self.tail_error(), own_prefill_tokens=own)
        per_fanout = bool(calibration.by_actors) and self.strategy.times_fan_outs
        if per_fanout:  # each fan-out timed at the speed measured at it, relative to the profile's scale
            settings = replace(settings, decode_scale_by_n=tuple(
                (n, scale / calibration.decode_scale) for n, scale in calibration.by_actors))
        plan = plan_generation(ids, predicted, group_size=group_size, prompt_lengths=inputs.prompt_lengths,
                               settings=settings, prefill_tokens=prefill_tokens)
        if per_fanout:  # the plan was timed at its fan-out's speed: so are its cut points and its record
            calibration = calibration.for_actors(plan.num_actors)
            profile = calibration.profile(base)
        cut_after = tuple(plan_cut_points_of(
            plan.assignments, predicted, {p: group_size for p in ids}, inputs.prompt_lengths,
            self.strategy.cut_threshold(r.settings.objective, r.cut_threshold), profile))
        offset = None
        if r.prewarm_buffer_s is not None:
            offset = prewarm_offset(self._memory.call_history.get("generate", []), r.prewarm_buffer_s,
                                    lead_s=prewarm_lead(self._memory.prewarm_s, r.prewarm_floor_s))
        phase = PhasePlan(plan, prefill, predicted, cut_after, offset,
                          predicted_prefill_s=prefill_seconds(prefill_tokens, profile, cluster),
                          calibration=calibration, activation_s=cluster.activation_s,
                          engine_start_s=r.engine_starts.priced_s(plan.num_actors, cluster) if r.engine_starts else 0.0)
        self._last = (inputs, phase, PhaseModel(profile, cluster, group_size, inputs.prompt_lengths,
                                                float(prefill_tokens), own))
        return phase

    def _prefill(self, inputs: PhaseInputs, group_size: int, profile: TpotProfile,
                 cluster: ClusterSpec) -> tuple[PrefillPlan | None, ClusterSpec]:
        """The dedup prefill plan, and the cluster without a prefill action where there is no
        plan (``PlannerRules.full_prefill_action`` aside) or it does not pay
        (``generation.prefill_action``; ``auto`` asks ``prefix.prefill_action_pays`` with the
        profile's prefill rate and the action's measured fixed costs)."""
        r = self.rules
        no_action = replace(cluster, prefill_action=False, kv_bytes_per_token=0.0)
        if r.prefill_capacity is None or inputs.prompts is None:
            # the flow runs a prefill action only for a plan: timing one here would pick too
            # few actors (a phantom prefill time and KV transfer on every remote actor)
            return None, cluster if r.full_prefill_action else no_action
        prompts = {p: inputs.prompts[p] for p in inputs.prompt_ids}
        prefill = plan_prefill(prompts, group_size, r.prefill_capacity)
        if r.prefill_action == "auto":
            runs = prefill_action_pays(prefill, sum(inputs.prompt_lengths[p] for p in inputs.prompt_ids),
                                       1.0 / profile.prefill_tokens_per_s,
                                       cluster.activation_s + cluster.prefill_fixed_s)
        else:
            runs = r.prefill_action == "always" and prefill.prefix_len is not None
        return (prefill, cluster) if runs else (None, no_action)

    def tail_error(self) -> MeasuredError | None:
        """The predictor's error over the last ``tail_error_steps`` observed steps (None: none)."""
        r = self.rules
        recent = self._memory.errors[-r.tail_error_steps:] if r.tail_error_steps > 0 else []
        if not recent:
            return None
        return MeasuredError.of([p for pred, _ in recent for p in pred], [o for _, obs in recent for o in obs],
                                r.max_length, r.tail_quantile)

    def hindsight_generate_s(self, record: StepRecord) -> float | None:
        """The last planned phase's generation prediction redone at the lengths ``record``
        observed (``flows/planning/hindsight.py``): against its measured time, the speed error
        alone. None where the record measured no phase. Call before :meth:`observe`."""
        if self._last is None or record.phase is None:
            return None
        _, phase, model = self._last
        return hindsight_generate_s(model, phase.plan.assignments, phase.predicted, record.lengths,
                                    record.phase.predicted_generate_s, record.phase.activation_s)

    def observe(self, record: StepRecord) -> PhaseObservation | None:
        """Learn from the step just run (after :meth:`plan` of its phase). Returns its phase as
        the calibration keeps it, the hindsight prediction filled in (None: no phase measured)."""
        if self._last is None:
            raise ValueError("Planner.observe: no phase was planned; call plan() first")
        inputs, phase, _ = self._last
        s = self._memory
        seen = [p for p in inputs.prompt_ids if record.lengths.get(p)]
        for p in seen:
            self._history.record(p, inputs.epoch, record.lengths[p], inputs.reference_lengths[p],
                                 inputs.prompt_lengths[p], keep=max(self.rules.length_window, EPOCHS_KEPT))
        if seen and self.rules.tail_error_steps > 0:
            s.errors = [*s.errors, ([float(phase.predicted[p]) for p in seen],
                                    [float(max(record.lengths[p])) for p in seen])][-self.rules.tail_error_steps:]
        observed = record.phase
        if observed is not None:
            if observed.hindsight_generate_s is None:  # the calibration tells length errors from speed by it
                observed = replace(observed, hindsight_generate_s=self.hindsight_generate_s(record))
            s.phases = calibration_memory([*s.phases, observed])  # bounded: what calibrate reads
            self._widest_here = max(self._widest_here, observed.num_actors)
        for action, offset in record.call_offsets.items():
            s.call_history[action] = [*s.call_history.get(action, []), offset][-CALL_HISTORY:]
        s.prewarm_s = [*s.prewarm_s, record.prewarm_s][-CALL_HISTORY:]
        if any(record.spec):
            s.spec_rates = acceptance_rates(record.spec, s.spec_rates)
            s.spec_speedup = running_speedup(s.spec_speedup, decode_speedup([x for x in record.spec if x]))
        self._last = None
        return observed
