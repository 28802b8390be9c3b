"""The live planner's profile and fixed costs, corrected from the campaign's own steps.

The planner times a phase from the engine profile measured at campaign start (decode steps,
prefill rate) plus fixed costs: ``ClusterSpec.activation_s`` (an empty activation's measured
round trip) per activation and ``prefill_fixed_s`` for the prefill action. What it leaves out
shows up in every step's measurements:

* **Generation** runs at another speed than the profile says: the profile was measured on one
  worker at one moment, while a phase shares the machine's cores with the flow, the other
  actions and whatever else runs (on a loaded 2-core machine, 4x slower; on a quiet one about
  1.4x, which includes each action's store reads and writes). A *decode scale* multiplies the
  profile's decode-step times.
* **Prefill** is a fixed cost more than its compute: the prefill action reads the policy and
  writes the prefix-KV bundle (on the default campaign about 70 ms of a 90 ms prefill, whose
  compute the profile puts at 15 ms).

* **Fan-out** changes the speed too where actions share a machine's cores (the local pool):
  N generation actions decode on a share of them each and contend with each other, so one
  scale for every N is wrong both ways. ``Calibration.by_actors`` keeps a scale per fan-out N,
  learned from the steps that ran N generation actions (``actors/n``); the planner times each
  N's candidates with its own (``PlannerSettings.decode_scale_by_n``, set by
  ``flows/planning/planner.py``).

Each step records what it was planned with (the decode scale, the activation's and the
prefill's fixed costs) and what it measured: a ``PhaseObservation`` (``flows/planning/record.py``),
which the planner keeps (``flows/planning/planner.py``). A step with generation time ``G`` predicted
as ``g`` (``a`` of it the activation) and prefill time ``F`` predicted as ``f`` implies

    decode_scale'    = decode_scale * (G - a) / (g - a)
    prefill_fixed_s' = prefill_fixed_s + (F - f)

The decode scale absorbs the length predictor's error with the speed's, on purpose: a steady
bias (predictions of the upper quartile run long) is what the next plans need corrected too
(``flows/planning/hindsight.py``). Not a miss no steady predictor makes: with ``h`` the phase
timed at the lengths the samples really had (``PhaseObservation.hindsight_generate_s``),
``(G - a) / (g - a)`` is the speed ``(G - a) / (h - a)`` times the length miss
``(h - a) / (g - a)``, and a miss beyond ``LENGTH_MISS_ABSORBED`` counts as that much. A
campaign's first step, predicted before any length was observed, otherwise set the next
steps' scale from its length miss: 30.4, and the two steps after it were predicted at 25x and
13x their measured time (docs/results.md). Only lengths longer than predicted are held so:
there the phase is mostly decoding, and ``(G - a) / (h - a)`` is a speed. Where they ran far
shorter, the measured time is mostly what the profile does not time (the action's store reads
and writes, the first call's set-up), and dividing it by a small ``h`` would read that as a
decoding many times slower than it is.

A phase in which one generation action spent more than ``START_SHARE`` of the phase starting
its engine (a vLLM engine's 20-60 s start, the torch slot's model loaded: what no plan times,
``PhaseObservation.engine_start_s``) gives no decode-scale reading: read as decoding, a vLLM
start at a fan-out the campaign tried once made that fan-out 46x slower for the rest of the run
(``by_actors`` keeps a fan-out's readings however far back). Such a phase's time is what a
start costs, not what a decode step does. A start longer than the whole phase cannot have been
in it: a pre-warm made it before, and the worker reported it with its next result (on the
default campaign, the torch slot models' 4-5 s builds before the first steps' 0.2 s phases),
so that phase still gives its reading. Nor does a phase whose plan timed an engine start over
``START_SHARE`` of its prediction (``PhaseObservation.predicted_engine_start_s``, the vLLM
engine's, ``flows/planning/engine_starts.py``): a start priced and not made (an engine built
where the plan did not know of one) would read as a decoding many times faster than it is.

* **Engine starts** (``flows/planning/engine_starts.py``): ``Calibration.engine_start_s``, the
  median of the longest start of each of the last ``window`` phases that reported one, however
  far back (a pre-warm's start riding on the phase's first result counts: it is a start all
  the same); ``Calibration.max_fan_out``, the widest fan-out a phase ran, however far back.

:func:`calibrate` takes each one's median over the last ``window`` steps, so one cold or
disturbed step does not move it. Pure: no I/O, no clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from flows.planning.record import PhaseObservation
from flows.planning.tpot import TpotProfile

WINDOW = 8
"""Steps the medians are taken over."""
START_SHARE = 0.25
"""A phase one of whose actions spent more than this share of the phase's measured time
starting its engine (``PhaseObservation.engine_start_s``) gives no decode-scale reading."""
LENGTH_MISS_ABSORBED = 2.0
"""The most a step's lengths may have run longer than predicted (its phase timed at the
observed lengths, over its prediction) for the whole miss to be absorbed with the speed as the
length predictor's bias (module docstring); beyond it, this much is. A steady predictor's
miss stays inside: the learned first-epoch predictor's upper quartile ran 0.53-0.94
(``flows/planning/hindsight.py``). A first step predicted before any length was observed ran
21x (512 samples of up to 128 tokens, docs/results.md)."""
SCALE_RANGE = (0.02, 50.0)
"""A decode scale outside this is a measurement gone wrong (a stalled step), not a speed. Real
ones reach 20-25 on a 2-core machine running three campaigns at once (decode steps profiled in
a quiet moment, generation timed under the load); the old cap of 10 left every prediction of
such a run about half the measured time. One stalled step is the median's to leave out."""


@dataclass(frozen=True)
class Calibration:
    """The corrections a phase is planned with (identity: none)."""

    decode_scale: float = 1.0
    """Multiplies the profile's decode-step times."""
    prefill_fixed_s: float = 0.0
    """``ClusterSpec.prefill_fixed_s``, seconds."""
    by_actors: tuple[tuple[int, float], ...] = ()
    """(N, decode scale) learned from the steps that ran N generation actions; N not listed:
    ``decode_scale``."""
    engine_start_s: float | None = None
    """Seconds a generation action spends starting its engine (module docstring), whatever the
    engine (only the vLLM engine's plans read it); None: no phase reported a start."""
    max_fan_out: int = 0
    """The most generation actions one phase ran (0: no phase observed): on the vLLM engine, the
    workers known to hold an engine (``flows/planning/engine_starts.py``)."""

    def for_actors(self, n: int) -> "Calibration":
        """These corrections with the decode scale learned at fan-out ``n`` (if any)."""
        return replace(self, decode_scale=dict(self.by_actors).get(n, self.decode_scale))

    def profile(self, profile: TpotProfile) -> TpotProfile:
        """``profile`` with its decode-step times multiplied by ``decode_scale``."""
        return profile.with_decode_speed(1.0 / self.decode_scale, f"x{self.decode_scale:.2f}")


def calibrate(steps: Sequence[PhaseObservation], window: int = WINDOW) -> Calibration:
    """The corrections the last ``window`` steps imply (module docstring).

    ``steps``: each step's phase, planned and measured, oldest first. The prefill's fixed cost
    is the median over the last ``window`` steps that ran a prefill action, however old, and the
    engine start over the last ``window`` that reported one. No such step: no correction.
    """
    first = len(steps) - window
    implied = [(i, m.num_actors, s) for i, m in enumerate(steps)
               for s in [_implied_scale(m)] if s is not None]  # oldest first
    scales = [s for i, _, s in implied if i >= first]
    by_n: dict[int, list[float]] = {}
    for _, n, s in implied:
        if n > 0:
            by_n.setdefault(n, []).append(s)
    # the last ``window`` steps at each fan-out, however far back: a fan-out the planner stopped
    # choosing keeps the speed that made it stop
    by_actors = tuple(sorted((n, statistics.median(v[-window:])) for n, v in by_n.items()))
    # The last ``window`` steps that ran a prefill action, however far back: a campaign that
    # stopped running it (generation.prefill_action auto) keeps the cost that made it stop.
    ran = [m for m in steps if m.ran_prefill]
    prefills = [m.prefill_fixed_s + m.prefill_s - m.predicted_prefill_s for m in ran[-window:]]
    starts = [m.engine_start_s for m in steps if m.engine_start_s > 0][-window:]
    return Calibration(decode_scale=statistics.median(scales) if scales else 1.0,
                       prefill_fixed_s=max(0.0, statistics.median(prefills)) if prefills else 0.0,
                       by_actors=by_actors, engine_start_s=statistics.median(starts) if starts else None,
                       max_fan_out=max((m.num_actors for m in steps), default=0))


def calibration_memory(steps: Sequence[PhaseObservation], window: int = WINDOW) -> list[PhaseObservation]:
    """The steps :func:`calibrate` reads, oldest first: the last ``window``, the last ``window``
    giving a reading at each fan-out, the last ``window`` that ran a prefill action, the last
    ``window`` that reported an engine start and one at the widest fan-out, so that
    ``calibrate(calibration_memory(s)) == calibrate(s)`` and the memory a campaign commits with
    every step stays bounded (a few fan-outs times ``window``) however long it runs."""
    keep = set(range(max(0, len(steps) - window), len(steps)))
    by_n: dict[int, list[int]] = {}
    for i, m in enumerate(steps):
        if m.num_actors > 0 and _implied_scale(m) is not None:
            by_n.setdefault(m.num_actors, []).append(i)
    for indices in by_n.values():
        keep.update(indices[-window:])
    keep.update([i for i, m in enumerate(steps) if m.ran_prefill][-window:])
    keep.update([i for i, m in enumerate(steps) if m.engine_start_s > 0][-window:])
    widest = max((m.num_actors for m in steps), default=0)
    if not any(steps[i].num_actors == widest for i in keep):  # one is enough: calibrate reads their max
        keep.add(max(i for i, m in enumerate(steps) if m.num_actors == widest))
    return [steps[i] for i in sorted(keep)]


def _implied_scale(m: PhaseObservation) -> float | None:
    """The decode scale one step's generation time implies (module docstring); None where the
    step gives no reading."""
    a = m.activation_s
    predicted, measured = m.predicted_generate_s - a, m.generate_s - a
    # a start longer than the phase was a pre-warm's, before it (reported with the next result)
    if (not (predicted > 0 and measured > 0) or START_SHARE * measured < m.engine_start_s <= m.generate_s
            or START_SHARE * predicted < m.predicted_engine_start_s):
        return None
    ratio = measured / predicted
    hindsight = None if m.hindsight_generate_s is None else m.hindsight_generate_s - a
    if hindsight is not None and hindsight > LENGTH_MISS_ABSORBED * predicted:
        # measured / predicted = (measured / hindsight: the speed) * (hindsight / predicted: the
        # length miss), the miss held to what a steady predictor's bias may be (module docstring)
        ratio = measured / hindsight * LENGTH_MISS_ABSORBED
    return min(max(m.decode_scale * ratio, SCALE_RANGE[0]), SCALE_RANGE[1])
