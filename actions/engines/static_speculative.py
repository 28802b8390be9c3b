"""Speculative decoding over the engine-owned static KV cache, graph-replayed on a GPU.

The rounds are those of ``speculative.py`` (the same drafters, selector, acceptance tracker
and cost model, and the same exactness: every kept token is the token plain decoding draws
there); the cache and the forward are those of ``static_decode.py``. A round is either a
plain step (``DecodeRuntime.run``, width 1) or a verification of width ``w = 1 + k``
(``DecodeRuntime.verify``): every running row feeds its last token and its draft (padded to
``k``) into one forward that writes columns ``col .. col + w - 1`` of the static cache.

Ragged acceptance. Rows keep different numbers of draft tokens. After a round the next one
writes after the longest kept run (``DecodeRuntime.advance``); a row that kept fewer leaves
masked holes, and positions are explicit, so a hole shifts nothing. When holes pass a quarter
of the used columns, or a round would not fit the buffers, ``StaticKV.pack`` moves each row's
valid columns together.

Where the draws happen. On a GPU a verification round draws every column of every row inside
the round (one wide draw; no host decision inside), so the round is one CUDA graph per
(batch bucket, w, window, sampler), and the host reads the draws back once, then compares
them with the drafts. On the CPU the forward's logits come back and ``speculative._verify``
draws only the columns that can still be kept (a draw over a real vocabulary costs there).
Both draw each cell as a pure function of (logits, stream key, position), so they agree.

Exactness. On the CPU in fp32 the tokens equal plain decoding's, dynamic and static
(``tests/test_static_speculative.py``), up to the float round-off of a width-w forward against
width-1 ones (the caveat ``speculative.py`` states).
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from actions.engines.base import EngineStats, GenerationParams, RowEnds, SampleOut, SampleSpec
from actions.engines.kv_state import PrefixState, stack_logits
from actions.engines.sampling import Sampler, stream_key
from actions.engines.spec_select import AcceptanceTracker, ForwardCost
from actions.engines.speculative import (
    SpecStats,
    Speculation,
    _count_round,
    _observe,
    _Selector,
    _verify,
    make_drafters,
    record_outcomes,
)
from actions.engines.static_decode import (
    DecodeRuntime,
    _put,
    bucket_for,
    compact_rows,
    runtime_for,
    smallest_bucket,
    window_step,
)
from actions.engines.static_kv import round_up

__all__ = ["decode_static_speculative"]

HOLE_SHARE = 4
"""Pack the cache when more than 1/HOLE_SHARE of the running rows' used columns are holes."""

WIDTH_BUCKETS = (2, 3, 5, 9, 17)
"""Verification widths a CUDA graph is captured for: a round of width w runs at the smallest
bucket that holds it (its extra columns are padding, their draws unused), so a bucket and
window need at most this many verification graphs rather than one per draft length."""


def graph_width(w: int) -> int:
    """The bucketed width a graphed verification of width ``w`` runs at (``w`` above the largest)."""
    return smallest_bucket(WIDTH_BUCKETS, w)


def decode_static_speculative(engine, samples: list[SampleSpec], states: list[PrefixState], params: GenerationParams,
                              *, sampling: Sampler, stats: EngineStats, spec: Speculation, tracker: AcceptanceTracker,
                              cost: ForwardCost, graphs: bool, padded: bool | None = None, compiled: bool = False,
                              attention: str = "sdpa") -> tuple[list[SampleOut], SpecStats]:
    """``TorchEngine``'s speculative decode loop on the static cache (module docstring).

    ``graphs``, ``padded``, ``compiled``, ``attention``: as for ``static_decode.decode_static``
    (verification rounds attend by ``sdpa`` whatever ``attention`` says, ``DecodeRuntime.verify_logits``).
    ``tracker`` and ``cost`` are updated in place. Returns the samples, in input order, and the
    call's speculation statistics (``speculative.SpecStats``)."""
    padded = graphs if padded is None else padded
    rt = runtime_for(engine.model, compiled, attention)
    with rt.lock:
        loop = _Loop(rt, engine, samples, states, params, sampling, spec, tracker, cost, padded)
        outs, sstats = loop.run(stats, graphs)
    return outs, sstats


def _draws_in_round(device: torch.device) -> bool:
    """Whether verification rounds draw every column inside the round (on a GPU, where the
    round is one graph) rather than only the columns the host still needs (on the CPU)."""
    return device.type == "cuda"


class _Loop:
    """One call's rounds: slots (batch row -> sample), the host's column, holes and counters."""

    def __init__(self, rt: DecodeRuntime, engine, samples: list[SampleSpec], states: list[PrefixState],
                 params: GenerationParams, sampling: Sampler, spec: Speculation, tracker: AcceptanceTracker,
                 cost: ForwardCost, padded: bool) -> None:
        self.rt, self.engine, self.samples, self.params = rt, engine, samples, params
        self.sampling, self.spec, self.tracker, self.cost, self.padded = sampling, spec, tracker, cost, padded
        n = len(samples)
        width = max(s.length for s in states)
        remaining = max(params.max_new_tokens - len(s.generated) for s in samples)
        rows = bucket_for(n) if padded else n
        # a verification may write up to max_draft_len columns past a row's last kept token
        self.kv = rt.ensure(rows, width + max(remaining, 1) + spec.max_draft_len)
        rt.ensure_verify(graph_width(spec.max_draft_len + 1))
        self.kv.load(states, rows)
        st = rt.state
        self.gen: list[list[int]] = [list(s.generated) for s in samples]
        _put(st.keys, [stream_key(params.seed, params.step, s.prompt_id, s.sample_index) for s in samples], rows)
        _put(st.rpos, [len(g) for g in self.gen], rows)
        _put(st.pos, [s.length for s in states], rows)
        st.col.fill_(width)
        st.tok[:rows].zero_()
        st.tok[:n] = sampling.draw(stack_logits(states), st.keys[:n], st.rpos[:n])
        self.slots: list[int | None] = [*range(n), *([None] * (rows - n))]
        self.b, self.col = rows, width
        self.holes = [0] * rows  # per batch row: masked columns left by its rejected drafts
        self.ends = RowEnds(n, engine.eos_ids, params.max_new_tokens)
        self.drafters = make_drafters(spec)
        for d in self.drafters.values():
            for i, s in enumerate(samples):
                d.start(i, s.prompt_id, s.prompt_tokens, s.generated)
        self.selector = _Selector(spec, tracker, cost)
        self.sstats = SpecStats()
        self.draw_in_round = _draws_in_round(rt.device)
        self.window_step = window_step(rt)

    def run(self, stats: EngineStats, graphs: bool) -> tuple[list[SampleOut], SpecStats]:
        rt, params, gen, ends, sstats = self.rt, self.params, self.gen, self.ends, self.sstats
        captures0, capture_s0 = rt.captures, rt.capture_s
        start_len = [len(g) for g in gen]
        first = rt.state.tok[: len(self.samples)].tolist()
        new = {i: [t] for i, t in enumerate(first)}  # sample -> tokens drawn for it, not yet taken
        while True:
            if not self._take(new) or ends.cut(params.cut_after):
                break
            t_round, capture_s = time.perf_counter(), rt.capture_s
            live = [j for j, i in enumerate(self.slots) if i is not None]
            rows = [self.slots[j] for j in live]
            proposals = self.selector.propose(self.drafters, rows, [params.max_new_tokens - len(gen[i]) for i in rows])
            choice, drafts, kinds = self.selector.pick(proposals, len(rows))
            k = self._room(max(len(d) for d in drafts))
            if k < choice.k:
                choice, drafts = replace(choice, k=k), [d[:k] for d in drafts]
            stats.decode_steps += 1
            stats.decode_token_slots += len(rows)
            sstats.rounds += 1
            sstats.plain_seconds_est += self.cost.seconds(len(rows), 1)
            if k == 0:
                window = min(round_up(self.col + 1, self.window_step), self.kv.cols)
                rt.run(self.b, window, self.sampling, graphs)
                self.col += 1
                toks = rt.state.tok[: self.b].tolist()  # the round's one device->host read
                new = {i: [toks[j]] for j, i in zip(live, rows)}
                _observe(self.cost, sstats, len(rows), 1, t_round + rt.capture_s - capture_s)
                continue
            new = self._verify_round(live, rows, drafts, kinds, graphs)
            _count_round(sstats, choice, drafts, [len(new[i]) - 1 for i in rows], kinds)
            # the round's 1 + k, not the width bucket it ran at (graph_width): what the selector
            # pays the next time it chooses that k; graph captures (once per warm container
            # and shape) are not a cost of the round
            _observe(self.cost, sstats, len(rows), 1 + k, t_round + rt.capture_s - capture_s)
        plain_steps = max((len(gen[i]) - start_len[i] + (ends.reasons[i] == "stop") for i in range(len(gen))),
                          default=1) - 1
        sstats.forwards_saved = max(plain_steps - stats.decode_steps, 0)
        stats.graph_captures += rt.captures - captures0
        stats.graph_capture_s += rt.capture_s - capture_s0
        stats.kv_cache = "static+graphs" if graphs and rt.graph_error is None else "static"
        outs = [SampleOut(s.prompt_id, s.sample_index, gen[i], ends.reasons[i] or "cut", ends.stops[i])
                for i, s in enumerate(self.samples)]
        return outs, sstats

    def _take(self, new: dict[int, list[int]]) -> bool:
        """Apply each running sample's new tokens in order (a row that ends drops the rest),
        hand the kept ones to the drafters, and release finished rows' slots (compacting into a
        smaller bucket where one fits). False when no row runs on."""
        keep, drafters = [], list(self.drafters.values())
        for j, i in enumerate(self.slots):
            if i is None:
                continue
            toks = new.get(i, ())
            if not self.ends.take_all(i, toks, self.gen[i]):
                keep.append(j)
                for d in drafters:
                    d.extend(i, toks)
        if not keep:
            return False
        running = sum(i is not None for i in self.slots)
        target = bucket_for(len(keep)) if self.padded else len(keep)
        if target < self.b:
            compact_rows(self.rt, keep, target, self.col)
            self.slots = [*(self.slots[j] for j in keep), *([None] * (target - len(keep)))]
            self.holes = [*(self.holes[j] for j in keep), *([0] * (target - len(keep)))]
            self.b = target
        elif len(keep) < running:
            kept = set(keep)
            for j, i in enumerate(self.slots):
                if i is not None and j not in kept:
                    # an idle row from now on: one valid column, so that it never sets the width
                    # a pack needs (a finished row that accepted fast holds more columns than any
                    # running row may, and a pack sized by it could not free a column)
                    self.kv.mask[j] = False
                    self.kv.mask[j, 0] = True
                    self.holes[j] = 0
            self.slots = [i if j in kept else None for j, i in enumerate(self.slots)]
        return True

    def _room(self, k: int) -> int:
        """The draft length a round can take: packs the cache first where holes pass their
        share or the round would not fit; never more than fits after packing."""
        live = sum(i is not None for i in self.slots)
        if self.col + k + 1 > self.kv.cols or sum(self.holes) * HOLE_SHARE > live * self.col:
            self.col = self.kv.pack(self.b, self.col)
            self.rt.state.col.fill_(self.col)
            self.holes = [0] * self.b
        return max(0, min(k, self.kv.cols - self.col - 1))

    def _verify_round(self, live: list[int], rows: list[int], drafts: list[list[int]], kinds: list[str | None],
                      graphs: bool) -> dict[int, list[int]]:
        """One verification round of width ``1 + k`` (where the round draws on the device: the
        ``WIDTH_BUCKETS`` width that holds it): each running row's new tokens (its kept draft
        tokens, then its next token); the tracker and the counters see every outcome."""
        rt, gen = self.rt, self.gen
        w = 1 + max(len(d) for d in drafts)
        bucketed = graph_width(w)
        if self.draw_in_round and self.col + bucketed <= self.kv.cols and bucketed <= rt.spec_ids.shape[1]:
            w = bucketed  # fewer graphs to capture; the padding columns' draws are never compared
        pad = self.engine.pad_id
        ids = [[pad] * w for _ in range(self.b)]
        for j, i, d in zip(live, rows, drafts):
            ids[j][: 1 + len(d)] = [gen[i][-1], *d]  # a running row's last token is its input
        rt.spec_ids[: self.b, :w].copy_(torch.tensor(ids, dtype=torch.long))
        window = min(round_up(self.col + w, self.window_step), self.kv.cols)
        if self.draw_in_round:
            rt.verify(self.b, w, window, self.sampling, graphs)
            drawn = rt.spec_drawn[: self.b, :w].tolist()  # the round's one device->host read
            accepted, nxt = [], []
            for j, d in zip(live, drafts):
                a = 0
                while a < len(d) and drawn[j][a] == d[a]:
                    a += 1
                accepted.append(a)
                nxt.append(drawn[j][a])
        else:
            logits = rt.verify_logits(self.b, w, window)
            idx = torch.tensor(live, device=rt.device)
            known: dict[int, int] = {}
            accepted = _verify(logits[idx], drafts, rows, rt.state.keys[idx], gen, known, self.sampling)
            nxt = [known[i] for i in rows]
        acc_slots, nxt_slots = [0] * self.b, [0] * self.b
        for j, a, t in zip(live, accepted, nxt):
            acc_slots[j], nxt_slots[j] = a, t
        self.col = rt.advance(acc_slots, nxt_slots, w, self.col)
        longest = max(accepted)
        for j, a in zip(live, accepted):
            self.holes[j] += longest - a
        record_outcomes(self.tracker, self.sstats, drafts, accepted, kinds)
        return {i: [*d[:a], t] for i, d, a, t in zip(rows, drafts, accepted, nxt)}
