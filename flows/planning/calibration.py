"""The live planner's fixed costs, learned from the campaign's own steps.

The planner times a phase as compute (the measured decode and prefill profile) plus fixed
costs (``ClusterSpec.activation_s`` per activation, ``prefill_fixed_s`` for the prefill
action). At campaign start ``activation_s`` is an empty activation's round trip; a real one
also parses its request, reads its inputs from the store, writes its outputs and returns
them through the flow's task, and the prefill action loads the policy and writes the KV
bundle. None of that is in the profile, so the plan was optimistic by a fixed amount per phase
(on the default campaign, about 70 ms of a 90 ms prefill and 40 ms of a 140 ms generation).

Each step records what it planned with and what it measured. Taking the whole residual of a
phase as fixed cost, a step implies

    activation_s'    = activation_s + (measured generate - predicted generate)
    prefill_fixed_s' = prefill_fixed_s + (measured prefill - predicted prefill) - (A - activation_s)

where ``A`` is the learned ``activation_s`` (the prefill's prediction holds it too).
:func:`learn_fixed_costs` takes medians over the last ``window`` steps, so one cold or
disturbed step does not move them, and never goes below the measured round trip. Pure: no
I/O, no clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

WINDOW = 8
"""Steps the median is taken over."""


@dataclass(frozen=True)
class FixedCosts:
    """Seconds; see ``ClusterSpec.activation_s`` and ``ClusterSpec.prefill_fixed_s``."""

    activation_s: float
    prefill_fixed_s: float = 0.0


def learn_fixed_costs(steps: Sequence[Mapping[str, float]], measured_activation_s: float,
                      window: int = WINDOW) -> FixedCosts:
    """The fixed costs the last ``window`` steps imply (module docstring).

    ``steps``: per-step metrics, oldest first; a step counts when it has ``plan/activation_s``
    and the predicted and measured generation times (prefill: when a prefill action ran,
    ``prefill/unique_prefixes`` > 0). ``measured_activation_s``: the empty activation's round
    trip, the floor and the value without steps.
    """
    used = [m for m in steps[-window:] if "plan/activation_s" in m and "plan/predicted_generate_s" in m]
    # generation: the whole residual is per-activation fixed cost
    acts = [m["plan/activation_s"] + m["timing_s/generate"] - m["plan/predicted_generate_s"] for m in used]
    activation = max(measured_activation_s, statistics.median(acts)) if acts else measured_activation_s
    # prefill: its prediction already moves with activation_s; the rest is its own fixed cost
    prefills = [m.get("plan/prefill_fixed_s", 0.0) + m["timing_s/prefill"] - m["plan/predicted_prefill_s"]
                - (activation - m["plan/activation_s"]) for m in used if m.get("prefill/unique_prefixes", 0.0) > 0]
    prefill = max(0.0, statistics.median(prefills)) if prefills else 0.0
    return FixedCosts(activation_s=activation, prefill_fixed_s=prefill)
