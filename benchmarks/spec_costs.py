"""Measured round costs for the hindsight ceiling of ``bench_speculation.py`` (``spec_ceiling``).

Three tables, each ``(batch, width) -> seconds``, built on this machine for the benchmark's
model, thread count and context:

* ``cost_table``: one cached forward, timed alone (the model's own work);
* ``round_table``: that plus the host work of a plain decode round at the same batch (drawing
  the next tokens, dropping finished rows, bookkeeping), fitted to the engine's own timing of
  its plain rounds. A speculative round is charged the same host work whatever its width, so
  drafting and verification are free: the optimistic ceiling;
* ``speculative_overhead``: what a speculative round of the engine as it is costs beyond that
  (drafting, column-by-column verification draws, cache rollback), fitted to rounds of fixed
  (strategy, k) runs: added to the round table it gives the ceiling of a perfect selector in
  today's engine;
* ``free_width_table`` (from ``round_table``): the engine's own plain rounds, fitted in the
  batch, at every width alike. It prices no eager forward, so it holds on whatever runtime
  the engine decodes with (CUDA graphs, a compiled step), where the first two tables do not:
  the eager forward they start from costs several graphed rounds there. No verification of
  any width costs less than a plain round at the same batch on the same runtime (it reads the
  same weights and does more), so its ceiling (``free_width_ceiling``) bounds every engine,
  selector and verification kernel on that runtime with these drafts.

The engine times every round it runs and reports it to its ``ForwardCost``; a ``_RoundLog``
put in its place for a few untimed runs keeps those timings (and is then put back, so the
warm estimates the measured runs used are untouched).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import spec_ceiling
import torch

from actions.engines.base import GenerationParams
from actions.engines.spec_select import ForwardCost
from actions.engines.speculative import Speculation, make_drafters
from actions.models.cache_name import with_cache
from actions.models.device import sync

Table = dict[tuple[int, int], float]


def cost_table(model: torch.nn.Module, context: int, max_k: int, repeats: int = 7,
               batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64)) -> Table:
    """Seconds of one cached forward (median of ``repeats``) at each batch and width 1 .. max_k + 1,
    after ``context`` cached tokens, with an attention mask and explicit positions as the
    engine passes them."""
    from transformers import DynamicCache

    device, vocab = next(model.parameters()).device, model.config.vocab_size
    out = {}
    with torch.no_grad():
        for b in batches:
            cache = DynamicCache()
            model(input_ids=torch.randint(3, vocab, (b, context), device=device), **with_cache(cache), use_cache=True)
            for w in range(1, max_k + 2):
                new = torch.randint(3, vocab, (b, w), device=device)
                pos = torch.arange(context, context + w, device=device).expand(b, w)
                mask = torch.ones((b, context + w), dtype=torch.long, device=device)
                mask[1::2, 0] = 0  # left padding, as prompts of different lengths have: no mask-free fast path
                times = []
                for _ in range(repeats + 1):  # the first is a warm-up
                    sync(device)
                    t0 = time.perf_counter()
                    model(input_ids=new, attention_mask=mask, **with_cache(cache), position_ids=pos, use_cache=True)
                    sync(device)
                    times.append(time.perf_counter() - t0)
                    for layer in cache.layers:  # back to ``context`` columns, as the engine's rollback
                        layer.keys, layer.values = layer.keys[:, :, :context], layer.values[:, :, :context]
                out[(b, w)] = sorted(times[1:])[repeats // 2]
    return out


@dataclass
class _RoundLog(ForwardCost):
    """A ``ForwardCost`` that also keeps every (batch, width, seconds) the engine observes."""

    rounds: list[tuple[int, int, float]] = field(default_factory=list)

    def observe(self, batch: int, width: int, seconds: float) -> None:
        self.rounds.append((batch, width, seconds))
        super().observe(batch, width, seconds)


def _logged_rounds(engine, run: Callable[[], None]) -> list[tuple[int, int, float]]:
    warm, log = engine.forward_cost, _RoundLog()
    engine.forward_cost = log
    try:
        run()
    finally:
        engine.forward_cost = warm
    return log.rounds


def _fit(features: Sequence[Sequence[float]], targets: Sequence[float]) -> list[float]:
    """Least-squares coefficients of ``targets ~ features @ c``."""
    c = np.linalg.lstsq(np.asarray(features, dtype=float), np.asarray(targets, dtype=float), rcond=None)[0]
    return [float(x) for x in c]


def free_width_table(rounds: Sequence[tuple[int, float]], keys: Sequence[tuple[int, int]]) -> Table:
    """``p0 + p1 * b`` at every key (batch, width), fitted to plain rounds ``(b, seconds)`` as the
    engine timed them; a round time is never below the fastest round observed (a fit's
    intercept can go negative where the rounds span few batches)."""
    if len({b for b, _ in rounds}) < 2:  # one batch: no slope to fit
        s = float(np.median([t for _, t in rounds]))
        return {key: s for key in keys}
    p0, p1 = _fit([(1.0, b) for b, _ in rounds], [t for _, t in rounds])
    floor = min(t for _, t in rounds)
    return {(b, w): max(p0 + p1 * b, floor) for b, w in keys}


def round_table(engine, batches, step0: int, forwards: Table, new_tokens: int, repeats: int = 3
                ) -> tuple[Table, float, list[list[list[int]]], Table]:
    """Plain runs of the workload's calls, ``repeats`` times, timed round by round.

    Returns:
        ``forwards`` plus a plain round's host work ``h0 + h1 * b`` (fitted to the plain rounds
        less their forwards); the seconds of the calls outside their decode rounds (prefill,
        stacking the rows' caches: the median over repeats); per call, per row, the plain
        run's final sequence with the stop token that ended it; and ``free_width_table`` of
        the same rounds at the keys of ``forwards``.
    """
    seqs: list[list[list[int]]] = []
    calls: list[float] = []

    def run() -> None:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for i, specs in enumerate(batches):
                params = GenerationParams(seed=0, step=step0 + i, max_new_tokens=new_tokens, temperature=1.0)
                outs, _ = engine.generate(specs, params)
                seqs.append([o.tokens + ([o.stop_token] if o.stop_token is not None else []) for o in outs])
            calls.append(time.perf_counter() - t0)

    logged = _logged_rounds(engine, run)
    rounds = [(b, s) for b, w, s in logged if w == 1]
    per_repeat = len(rounds) // repeats  # the same calls each time: the same rounds
    rest = sorted(c - sum(s for _, s in rounds[i * per_repeat:(i + 1) * per_repeat]) for i, c in enumerate(calls))
    h0, h1 = _fit([(1.0, b) for b, _ in rounds], [s - spec_ceiling.seconds(forwards, b, 1) for b, s in rounds])
    table = {(b, w): f + max(h0 + h1 * b, 0.0) for (b, w), f in forwards.items()}
    return table, rest[repeats // 2], seqs[:len(batches)], free_width_table(rounds, list(forwards))


def speculative_overhead(engine, batches, step0: int, spec: Speculation, table: Table, new_tokens: int,
                         ks: tuple[int, ...] = (1, 2, 4, 8)) -> Table:
    """Seconds a speculative round of the engine costs beyond ``table``, fitted as
    ``x0 + x1 * b + x2 * b * (w - 1)`` to the rounds of one fixed-(strategy, k) run per strategy
    of ``spec`` (that has drafts) and k in ``ks``; width 1 costs nothing extra."""
    names = list(make_drafters(spec))

    def run() -> None:
        for name in names:
            for k in ks:
                fixed = Speculation(strategies=spec.strategies, history=spec.history, fixed=(name, k))
                for i, specs in enumerate(batches):
                    params = GenerationParams(seed=0, step=step0 + i, max_new_tokens=new_tokens, temperature=1.0)
                    engine.generate(specs, params, speculation=fixed)

    rounds = [(b, w, s) for b, w, s in _logged_rounds(engine, run) if w > 1]
    if not rounds:
        return {key: 0.0 for key in table}
    c = _fit([(1.0, b, b * (w - 1)) for b, w, _ in rounds],
             [s - spec_ceiling.seconds(table, b, w) for b, w, s in rounds])
    return {(b, w): 0.0 if w == 1 else max(c[0] + c[1] * b + c[2] * b * (w - 1), 0.0) for b, w in table}


def ceiling(batches, spec: Speculation, table: Table, extra: Table, rest_s: float, seqs, new_tokens: int,
            free: Table | None = None) -> dict:
    """The hindsight ceilings of one workload (``spec_ceiling``): every allowed strategy's drafts
    replayed along the plain run's sequences ``seqs``, rounds charged by ``table`` (optimistic:
    ``ceiling``, ``hindsight_schedule``), by ``table`` plus ``extra`` (today's engine with a
    perfect selector: ``engine_ceiling``, ``engine_hindsight``) and, given ``free``
    (``free_width_table``), by the engine's plain rounds at every width (``free_width_ceiling``:
    the bound of any engine on this runtime), as speed-ups of the whole calls, whose work
    outside the decode rounds (``rest_s``, ``round_table``) stays."""
    with_extra = {key: t + extra[key] for key, t in table.items()}
    plain = bound = greedy = bound_x = greedy_x = plain_f = bound_f = 0.0
    for specs, call_seqs in zip(batches, seqs):
        rows = [(s.prompt_id, s.prompt_tokens, q) for s, q in zip(specs, call_seqs)]
        acc = spec_ceiling.replay_acceptance(list(make_drafters(spec).values()), rows, new_tokens, spec.max_draft_len)
        lengths = [len(q) for q in call_seqs]
        plain += spec_ceiling.plain_seconds(table, lengths)
        bound += spec_ceiling.bound_seconds(table, lengths, acc, spec.max_draft_len)
        greedy += spec_ceiling.greedy_seconds(table, lengths, acc, spec.max_draft_len)
        bound_x += spec_ceiling.bound_seconds(with_extra, lengths, acc, spec.max_draft_len)
        greedy_x += spec_ceiling.greedy_seconds(with_extra, lengths, acc, spec.max_draft_len)
        if free is not None:
            plain_f += spec_ceiling.plain_seconds(free, lengths)
            bound_f += spec_ceiling.bound_seconds(free, lengths, acc, spec.max_draft_len)

    def speedup(seconds: float, plain_s: float = plain) -> float:
        return round(spec_ceiling.call_speedup(rest_s + plain_s, plain_s, seconds), 3)

    out = {"plain_rounds_s": round(plain, 4), "rest_s": round(rest_s, 4), "ceiling": speedup(bound),
           "hindsight_schedule": speedup(greedy), "engine_ceiling": speedup(bound_x),
           "engine_hindsight": speedup(greedy_x)}
    if free is not None:
        out.update(free_width_plain_rounds_s=round(plain_f, 4), free_width_ceiling=speedup(bound_f, plain_f))
    return out
