"""What moving work between actors costs: one model, used by the planner and the simulator.

Every charge the planner's estimate and the simulator's replay both need is defined here once
(start-ups and transfers of planned actors are in ``timeline.actor_start``, also shared):

- ``migration_s``: a cut sample (prompt + generated tokens) moves to another actor either as
  token ids that the destination re-prefills (``reprefill``: the destination stalls for the
  re-prefill at its prefill rate) or as KV blocks shipped over the transfer path the prefill KV
  uses (``kv``: the sample joins after the transfer; the destination does not stall);
- ``continuation_start_s``: the start-up of a continuation actor: none in a container released
  earlier in the phase (warm, this step's weights), the weight transfer in a spare pre-warmed
  one, a cold start plus the weight transfer otherwise.

The planner calls these through the module (``charges.migration_s``), as the simulator does,
so a change here moves both (tests/test_planning_charges.py).
"""

from __future__ import annotations

from typing import NamedTuple

from flows.planning.tpot import TpotProfile

MIGRATIONS = ("reprefill", "kv")


class Migration(NamedTuple):
    stall_s: float  # seconds the destination stops decoding (re-prefill)
    delay_s: float  # seconds until the moved samples can decode at the destination


def migration_s(tokens: float, migration: str, profile: TpotProfile,
                kv_s_per_token: float) -> Migration:
    """Cost of moving samples holding ``tokens`` of context (prompt + generated) in total."""
    if migration == "reprefill":
        stall = tokens / profile.prefill_tokens_per_s
        return Migration(stall, stall)
    if migration == "kv":
        return Migration(0.0, tokens * kv_s_per_token)
    raise ValueError(f"migration={migration!r}: use one of {MIGRATIONS}")


def continuation_start_s(*, released_warm: bool, spare_warm: bool, cold_start_s: float,
                         weight_transfer_s: float) -> float:
    """Seconds from a continuation actor's invocation until it can take samples."""
    if released_warm:
        return 0.0
    if spare_warm:
        return weight_transfer_s
    return cold_start_s + weight_transfer_s
