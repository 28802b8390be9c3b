"""What the planner learns from speculative decoding (pure).

The generation actions report their speculation counters (``speculative.SpecStats``). This
module turns a step's reports into metrics, keeps the per-strategy acceptance rates the next
step's actions start from, and the measured decode speed-up the planner's time estimates use:

    speedup = (plain decode steps / decode steps run) x (model's plain seconds / measured seconds)

The first factor is the forwards saved; the second charges the verification forwards for
being wider (the engine's own cost model gives the width-1 time of the same rounds). A TPOT
profile divided by the speed-up (``speculative_profile``) makes the scaling hook's per-actor
times, and so its fan-out, reflect the engine that will actually run: without it the planner
would size fan-out for decode times speculation no longer has. Lengths and their ranking are
untouched (speculation changes speed, not responses).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flows.planning.tpot import TpotProfile

SPEEDUP_SMOOTHING = 0.5
"""Weight of the newest step in the campaign's running speed-up (EWMA)."""


def _sum_dicts(reports: list[Mapping[str, Any]], key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in reports:
        for k, v in (r.get(key) or {}).items():
            out[k] = out.get(k, 0.0) + float(v)
    return out


def step_spec_metrics(reports: Iterable[Mapping[str, Any] | None]) -> dict[str, float]:
    """Per-step ``spec/*`` metrics from the generate results' ``spec`` fields (None: plain).

    ``spec/accept_rate``: accepted / proposed draft tokens; ``spec/mean_accepted``: accepted
    tokens per row verification; ``spec/draft_len``: mean draft width verified per speculative
    round (its longest draft, the forward's width - 1);
    ``spec/strategy/<name>``: share of decode rounds per strategy (``off``: plain rounds);
    ``spec/forwards_saved``: decode forwards plain decoding would have run, minus those run;
    ``spec/decode_speedup``: the module docstring's speed-up (1.0 without speculation).
    """
    rs = [r for r in reports if r]
    if not rs:
        return {}
    total = lambda k: float(sum(r.get(k, 0) for r in rs))  # noqa: E731
    rounds, spec_rounds = total("rounds"), total("spec_rounds")
    proposed, accepted = total("proposed"), total("accepted")
    by_strategy = _sum_dicts(rs, "rounds_by_strategy")
    m = {
        "spec/accept_rate": accepted / proposed if proposed else 0.0,
        "spec/mean_accepted": accepted / total("verified_rows") if total("verified_rows") else 0.0,
        "spec/draft_len": total("draft_len_sum") / spec_rounds if spec_rounds else 0.0,
        "spec/forwards_saved": total("forwards_saved"),
        "spec/decode_speedup": decode_speedup(rs),
        "spec/strategy/off": (rounds - spec_rounds) / rounds if rounds else 1.0,
    }
    for name, n in by_strategy.items():
        m[f"spec/strategy/{name}"] = n / rounds if rounds else 0.0
    return m


def decode_speedup(reports: list[Mapping[str, Any]]) -> float:
    """The measured decode speed-up of these reports (module docstring); 1.0 without data."""
    steps = sum(r.get("rounds", 0) for r in reports)
    saved = sum(r.get("forwards_saved", 0) for r in reports)
    seconds = sum(r.get("seconds", 0.0) for r in reports)
    plain = sum(r.get("plain_seconds_est", 0.0) for r in reports)
    if steps <= 0 or seconds <= 0 or plain <= 0:
        return 1.0
    return max((steps + saved) / steps * plain / seconds, 1e-3)


def acceptance_rates(reports: Iterable[Mapping[str, Any] | None], old: Mapping[str, float]) -> dict[str, float]:
    """Per strategy, the geometric acceptance rate accepted / (accepted + rejections) of this
    step's reports; strategies the step did not use keep their ``old`` rate."""
    rs = [r for r in reports if r]
    acc, rej = _sum_dicts(rs, "accepted_by_strategy"), _sum_dicts(rs, "rejections_by_strategy")
    out = dict(old)
    for name in acc:
        if name != "off" and acc[name] + rej.get(name, 0.0) > 0:
            out[name] = acc[name] / (acc[name] + rej.get(name, 0.0))
    return out


def running_speedup(old: float, measured: float | None) -> float:
    """EWMA of the campaign's decode speed-up (``measured`` None: the step did not speculate)."""
    if measured is None:
        return old
    return (1 - SPEEDUP_SMOOTHING) * old + SPEEDUP_SMOOTHING * measured


def speculative_profile(profile: TpotProfile, speedup: float) -> TpotProfile:
    """``profile`` with every decode-step time divided by ``speedup`` (>= 1 speeds it up);
    prefill and row-drop costs stay (speculation does not change them)."""
    return profile.with_decode_speed(speedup, f"spec{speedup:.2f}")
