"""What a step tells the planner, the summary, the report and TensorBoard: :class:`StepRecord`.

The step produces one record (``flows/step/metrics.py: step_record``); the planner learns from
its typed fields (``Planner.observe``), and the output -- the committed metrics, the summary,
the artifacts and the scalars -- reads ``metrics``, whose names are made in one place
(``flows/step/metrics.py``). Pure data: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class PhaseObservation:
    """One generation phase as planned and as measured: what the calibration learns from
    (``flows/planning/calibration.py``). Seconds throughout."""

    num_actors: int
    """Generation actions the plan ran (its fan-out)."""
    generate_s: float
    """Measured: the generation actions' phase, wall time (a failed attempt and its retry's
    back-off are in it, as they delayed the phase)."""
    prefill_s: float
    """Measured: the prefill phase (a few ms of flow time where no prefill action ran)."""
    ran_prefill: bool
    """A prefill action ran (the plan had unique prefixes)."""
    predicted_generate_s: float
    predicted_prefill_s: float
    activation_s: float
    """The per-activation fixed cost the plan was timed with."""
    decode_scale: float
    prefill_fixed_s: float
    """The calibration the plan was timed with."""
    hindsight_generate_s: float | None = None
    """``predicted_generate_s`` redone at the lengths the samples really had
    (``flows/planning/hindsight.py``): the speed error alone against ``generate_s``. None where
    it is not known (a record of an earlier revision without it)."""
    engine_start_s: float = 0.0
    """Measured: the longest engine start one of the phase's generation actions reported (a
    vLLM engine built, the torch slot's model loaded), which the plan did not time; a start a
    pre-warm made before the phase rides on the worker's next result and is counted here too."""
    predicted_engine_start_s: float = 0.0
    """The engine start the plan timed on its actions beyond the workers holding an engine
    (``PhasePlan.engine_start_s``, ``flows/planning/engine_starts.py``); 0: it timed none."""

    @classmethod
    def from_metrics(cls, m: Mapping[str, float]) -> PhaseObservation | None:
        """From a step's committed metrics (records of earlier revisions); None where the step
        did not record what it was planned with."""
        if "plan/decode_scale" not in m:
            return None
        return cls(num_actors=int(m.get("actors/n", 0)), generate_s=m["timing_s/generate"],
                   prefill_s=m["timing_s/prefill"], ran_prefill=m.get("prefill/unique_prefixes", 0.0) > 0,
                   predicted_generate_s=m["plan/predicted_generate_s"],
                   predicted_prefill_s=m["plan/predicted_prefill_s"], activation_s=m.get("plan/activation_s", 0.0),
                   decode_scale=m["plan/decode_scale"], prefill_fixed_s=m.get("plan/prefill_fixed_s", 0.0),
                   hindsight_generate_s=m.get("plan/hindsight_generate_s"),
                   engine_start_s=m.get("engine/start_s_max", 0.0),
                   predicted_engine_start_s=m.get("plan/engine_start_s", 0.0))


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One step as it ran."""

    step: int
    epoch: int
    lengths: Mapping[int, tuple[int, ...]]
    """Prompt id -> the lengths (tokens) of its finished samples (a cut sample counts where
    its continuation finished it)."""
    phase: PhaseObservation | None = None
    """The generation phase, planned and measured (None: not measured, as in the simulator)."""
    timing_s: Mapping[str, float] = field(default_factory=dict)
    """Seconds per phase: plan, prefill, generate, score, train, commit, step."""
    billed_s: Mapping[str, float] = field(default_factory=dict)
    """Action -> billed seconds of its activations, failed and retried attempts included
    (what the platform charged; the planner reads none of it)."""
    call_offsets: Mapping[str, float] = field(default_factory=dict)
    """Action -> its earliest submission, seconds from the step's start (the next pre-warm)."""
    prewarm_s: float | None = None
    """Seconds the generation phase's pre-warm took, fired to its containers loaded (None: it
    did not fire); the next pre-warm fires that much earlier."""
    spec: tuple[Mapping[str, Any] | None, ...] = ()
    """Each generation action's speculation report (None: it did not speculate)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """The step's metrics by output name (``flows/step/metrics.py``)."""
