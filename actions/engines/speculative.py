"""Speculative decoding in the torch engine, exact by construction.

Sampling is counter-based Gumbel-max (``sampling.py``): a sample's token at response position
t is ``argmax(filter(logits_t / T) + G(key, t))`` (``filter``: the top-k / top-p filtering, a
function of the logits too), a function of the logits and of who the sample is. So a draft
token can be checked exactly: feed ``[last token, d_1 .. d_k]`` to the target in one forward,
draw the target's own token at each of the k positions with the same noise, keep the longest
prefix of the draft that equals those draws and take the target's draw at the first
mismatch as the next token. Every token kept is the token plain decoding draws there, so the
outputs are those of plain decoding (up to the float round-off of a width-(k+1) forward
against width-1 ones, the same caveat as batching; the tests compare token for token). No
rejection sampling is involved.

Ragged acceptance. Rows keep different numbers of draft tokens. After a verification forward
the cache columns past the longest accepted prefix are cropped; a row that accepted fewer
keeps its rejected columns as masked holes (attention mask 0; positions are explicit, so a
hole shifts nothing). When holes exceed a quarter of the cache, each row's valid columns are
packed to the right with one gather and the all-padding columns on the left are dropped. A
model with sliding-window layers packs after every round that left holes: Hugging Face counts
the window in cache columns, a hole among them included (``kv_state.sliding_window``).

Per round, each row takes the draft that promises the most tokens by the online acceptance
of its kind (strategy and match quality), measured per draft position
(``AcceptanceTracker.survival``), and ``spec_select.choose_rows`` picks k from
those drafts and the timed cost of past rounds; k = 0 is a plain decode step (width 1). Cuts (``cut_after``) are checked after every round: a cut sample
carries exactly its accepted tokens and continues, later, from there.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from actions.engines.base import EngineStats, GenerationParams, RowEnds, SampleOut, SampleSpec
from actions.engines.drafters import HistoryDrafter, PromptLookupDrafter
from actions.engines.drafters.base import Drafter
from actions.engines.kv_state import sliding_window, stack_logits, stack_states
from actions.engines.sampling import Sampler, stream_key
from actions.engines.spec_select import (
    MIN_PLAIN_WEIGHT,
    MIN_WIDE_WEIGHT,
    AcceptanceTracker,
    Choice,
    ForwardCost,
    can_pay,
    choose_rows,
)
from actions.models.cache_name import with_cache
from actions.models.device import sync

PROBE_EVERY = 8
"""Rounds of plain decoding, after the estimates switched speculation off although drafts
were there, before the drafters are asked again and one speculative round re-measures
the most promising strategy (acceptance can rise as training sharpens the policy). In between
nothing is drafted, so a workload where speculation does not pay costs almost nothing extra.
Each probe after which the estimates still say no doubles the wait, up to ``PROBE_MAX``."""

PROBE_MAX = 64

_DRAW_ELEMENTS = 1 << 22
"""At most this many logits per verification draw (``_verify``): all of a round's columns at
once for a small vocabulary; a column or a few at a time for a large one, bounding the noise
tensors a draw allocates."""


@dataclass
class Speculation:
    """What one generate call may do speculatively (``generation.speculation`` and friends).

    ``history``: prompt_id -> earlier responses (token lists) for the ``history`` strategy;
    ``priors``: strategy -> acceptance rate measured earlier (e.g. by the previous step);
    ``fixed``: force one (strategy, k) every round (benchmark sweeps), bypassing the selector.
    """

    strategies: tuple[str, ...] = ("history", "prompt_lookup")
    max_draft_len: int = 8
    history: Mapping[int, Sequence[Sequence[int]]] = field(default_factory=dict)
    priors: Mapping[str, float] = field(default_factory=dict)
    fixed: tuple[str, int] | None = None


@dataclass
class SpecStats:
    """Per call: rounds by strategy, draft tokens proposed and accepted, forwards saved."""

    rounds: int = 0
    spec_rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    draft_len_sum: int = 0  # sum over speculative rounds of the longest draft verified (width - 1)
    rounds_by_strategy: dict[str, int] = field(default_factory=dict)
    accepted_by_strategy: dict[str, int] = field(default_factory=dict)
    proposed_by_strategy: dict[str, int] = field(default_factory=dict)
    rejections_by_strategy: dict[str, int] = field(default_factory=dict)  # rows with a rejected token
    verified_rows: int = 0  # row-rounds that checked a non-empty draft
    forwards_saved: int = 0  # plain decode steps for the same tokens, minus the forwards run
    # calls asked to speculate that decoded plainly: by the estimates (TorchEngine._skip_speculation)
    # or, where graphs run, by whole-call rates (spec_guard)
    plain_calls: int = 0
    seconds: float = 0.0  # measured time of every decode forward (with its sampling)
    spec_seconds: float = 0.0  # the part of ``seconds`` in speculative rounds (width > 1)
    plain_seconds_est: float = 0.0  # the cost model's time for the same rounds at width 1

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def make_drafters(spec: Speculation) -> dict[str, Drafter]:
    out: dict[str, Drafter] = {}
    for name in spec.strategies:
        if name == "history":
            if spec.history:
                out[name] = HistoryDrafter(spec.history)
        elif name == "prompt_lookup":
            out[name] = PromptLookupDrafter()
        else:
            raise ValueError(f"generation.draft_strategies: unknown strategy {name!r}; use history or prompt_lookup")
    return out


class _Batch:
    """The running rows' cache, padding mask and model positions (all on the device).

    ``holes`` counts the mask's zeros on the host, so a round decides on compaction without
    reading the device (a GPU would otherwise drain its queue for it every round); it is
    recounted, once, after rows leave."""

    def __init__(self, cache, mask: torch.Tensor, next_pos: torch.Tensor, windowed: bool = False) -> None:
        self.cache, self.mask, self.next_pos = cache, mask, next_pos
        self.holes: int | None = None
        self.windowed = windowed  # sliding-window layers: a round's holes are packed at once (module docstring)

    def select(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask, self.next_pos = self.mask[keep], self.next_pos[keep]
        self.holes = None

    def _map_kv(self, fn) -> None:
        for layer in self.cache.layers:
            layer.keys, layer.values = fn(layer.keys), fn(layer.values)

    def rollback(self, accepted: torch.Tensor, accepted_list: list[int], width: int) -> None:
        """Keep, per row, the first ``accepted[r] + 1`` of the last ``width`` columns
        (``accepted_list``: the same counts on the host)."""
        if self.holes is None:
            self.holes = int((self.mask == 0).sum())
        longest = max(accepted_list)
        drop = width - 1 - longest
        if drop > 0:
            self._map_kv(lambda t: t[:, :, :-drop])
            self.mask = self.mask[:, :-drop]
        length = self.mask.shape[1]
        new_holes = sum(longest - a for a in accepted_list)
        if new_holes:
            cols = torch.arange(length - (longest + 1), length, device=self.mask.device)  # the block's kept columns
            hole = cols[None, :] > (length - (longest + 1) + accepted)[:, None]
            self.mask[:, length - (longest + 1):] = self.mask[:, length - (longest + 1):].masked_fill(hole, 0)
            self.holes += new_holes
        too_many = new_holes > 0 if self.windowed else self.holes > self.mask.numel() // 4
        if too_many:
            self._compact()

    def _compact(self) -> None:
        """Pack each row's valid columns to the right; drop columns that are padding everywhere."""
        order = torch.argsort(self.mask, dim=1, stable=True)  # zeros first, valid columns in order
        self.mask = self.mask.gather(1, order)
        first = int((self.mask.sum(0) > 0).nonzero()[0]) if bool(self.mask.any()) else 0
        self.mask = self.mask[:, first:]
        self.holes = None
        idx = order[:, first:]

        def pack(t: torch.Tensor) -> torch.Tensor:
            i = idx[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
            return t.gather(2, i)

        self._map_kv(pack)



class _Selector:
    """Per-call state of the round decisions: estimates, probing and forced choices."""

    def __init__(self, spec: Speculation, tracker: AcceptanceTracker, cost: ForwardCost) -> None:
        self.spec, self.tracker, self.cost = spec, tracker, cost
        self.cooldown = 0  # rounds left without drafting (off by estimate)
        # the next choice with drafts is a probe; the first is one while a strategy has never
        # been measured, so a pessimistic prior cannot keep it off for good
        self.probe = not all(tracker.known(n) for n in spec.strategies if n != "history" or spec.history)
        self.wait = PROBE_EVERY  # the next cooldown's length

    def pick(self, proposals: Mapping[str, list[tuple[list[int], str]]], b: int
             ) -> tuple[Choice, list[list[int]], list[str | None]]:
        """The round's choice, each row's draft (cut to k) and the kind it came from.

        Each row takes the strategy whose draft promises the most tokens by its kind's
        acceptance rate (``sum alpha^i``), so rows in a run of repeats can copy while rows at
        the start of a response follow last epoch's answers; then k is chosen for the batch.
        """
        plain = ([[]] * b, [None] * b)
        if self.spec.fixed is not None:
            name, k = self.spec.fixed
            if name not in proposals or k <= 0:
                return Choice(None, 0, 0.0, 0.0), *plain
            return Choice(name, k, 0.0, 0.0), [d[:k] for d, _ in proposals[name]], [kd for _, kd in proposals[name]]
        if not any(d for props in proposals.values() for d, _ in props):
            return Choice(None, 0, 0.0, 0.0), *plain
        max_k = self.spec.max_draft_len
        # a strategy never measured wins its rows (optimism), so the probe measures it
        fresh = {n for n in proposals if not self.tracker.known(n)}
        rows, drafts, kinds, names = [], [], [], []
        scored: dict[tuple[str, str, int], tuple[float, list[float]]] = {}  # rows share a few kinds
        for r in range(b):
            best = (0.0, [], None, None, 0.0)  # score, draft, kind, strategy, survival
            for name, props in proposals.items():
                d, kind = props[r]
                if d:
                    key = (name, kind, min(len(d), max_k))
                    if key not in scored:
                        surv = self.tracker.survival(kind, key[2])
                        score, p = 0.0, 1.0
                        for q in surv:
                            p *= 1.0 if name in fresh else q
                            score += p
                        scored[key] = (score, surv)
                    score, surv = scored[key]
                    if score > best[0]:
                        best = (score, d, kind, name, surv)
            rows.append((len(best[1]), best[4]))
            drafts.append(best[1])
            kinds.append(best[2])
            names.append(best[3])
        seconds = self.cost.snapshot()
        k, rate, plain_rate = choose_rows(rows, seconds, max_k)
        if k == 0:
            if not self.probe and can_pay(self.tracker, list(proposals), b, seconds, max_k):
                # this round's drafts are of poor kinds (a response's first tokens match little
                # of the prompt), better ones pay: draft again next round
                return Choice(None, 0, rate, plain_rate), *plain
            if not self.probe:
                self.cooldown, self.probe = self.wait, True
                self.wait = min(2 * self.wait, PROBE_MAX)
                return Choice(None, 0, rate, plain_rate), *plain
            self.probe = False  # re-measure with the most promising drafts, cheaply
            k = min(4, max_k)
        else:
            self.probe, self.wait = False, PROBE_EVERY
            longest = min(max(len(d) for d in drafts), max_k)
            if k < longest and self.cost.wide_weight(1 + longest) < MIN_WIDE_WEIGHT:
                k = longest  # measure a wide round now and then: the fit's per-column cost (ForwardCost)
        used = [n for n in names if n]
        label = max(set(used), key=used.count) if used else None
        return Choice(label, k, rate, plain_rate), [d[:k] for d in drafts], kinds

    def propose(self, drafters: Mapping[str, Drafter], rows: list[int], room: list[int]
                ) -> dict[str, list[tuple[list[int], str]]]:
        """Every strategy's draft per row (at most ``max_draft_len`` and the row's room),
        (drafting is timed with the round it belongs to: ``ForwardCost``'s ``c3``)."""
        out: dict[str, list[tuple[list[int], str]]] = {}
        if self.cooldown > 0:
            self.cooldown -= 1
            return out
        if self.spec.fixed is None and self.cost.plain_weight < MIN_PLAIN_WEIGHT:
            return out  # a plain round: the baseline every choice is weighed against (ForwardCost)
        for name, d in drafters.items():
            if self.spec.fixed is not None and self.spec.fixed[0] != name:
                continue
            out[name] = [(d.propose(r, min(self.spec.max_draft_len, m)), d.kind(r)) for r, m in zip(rows, room)]
        return out


def decode_speculative(engine, samples: list[SampleSpec], states: list, params: GenerationParams, *,
                       sampling: Sampler, stats: EngineStats, spec: Speculation, tracker: AcceptanceTracker,
                       cost: ForwardCost) -> tuple[list[SampleOut], SpecStats]:
    """The decode loop of ``TorchEngine._decode`` with per-round speculation (module docstring).

    ``tracker`` and ``cost`` are updated in place (a warm engine keeps them across calls).
    Returns the samples, in input order, and the call's speculation statistics.
    """
    n, dev, model = len(samples), engine.device, engine.model
    cache, mask = stack_states(states)
    batch = _Batch(cache, mask, torch.tensor([st.length for st in states], dtype=torch.long, device=dev),
                   windowed=sliding_window(model) is not None)
    keys = torch.tensor([stream_key(params.seed, params.step, s.prompt_id, s.sample_index) for s in samples],
                        device=dev)
    gen: list[list[int]] = [list(s.generated) for s in samples]
    start_len = [len(g) for g in gen]
    logits = stack_logits(states)
    rows = list(range(n))
    ends = RowEnds(n, engine.eos_ids, params.max_new_tokens)
    drafters = make_drafters(spec)
    for d in drafters.values():
        for r, s in enumerate(samples):
            d.start(r, s.prompt_id, s.prompt_tokens, s.generated)
    selector = _Selector(spec, tracker, cost)
    sstats = SpecStats()

    known: dict[int, int] = {}  # row -> its next token, drawn already in a verification
    unsent: dict[int, list[int]] = {}  # row -> draft tokens it accepted, for the drafters with its next token
    # Rows that ended in a verification stay in the batch until the next round's drop: one
    # cache gather per round instead of two (each copies the whole cache)
    done: set[int] = set()
    while rows:
        t_round = time.perf_counter()
        toks = _next_tokens(rows, known, logits, keys, gen, sampling, dev, done)
        keep = [j for j, (row, t) in enumerate(zip(rows, toks)) if row not in done and not ends.take(row, t, gen[row])]
        done.clear()
        if not keep or ends.cut(params.cut_after):
            break
        if len(keep) < len(rows):
            keep_t = torch.tensor(keep, device=dev)
            batch.select(keep_t)
            keys, rows, toks = keys[keep_t], [rows[j] for j in keep], [toks[j] for j in keep]
        for row, t in zip(rows, toks):
            new = (*unsent.pop(row, ()), t)
            for d in drafters.values():
                d.extend(row, new)
        b = len(rows)
        proposals = selector.propose(drafters, rows, [params.max_new_tokens - len(gen[r]) for r in rows])
        choice, drafts, kinds = selector.pick(proposals, b)
        width = 1 + max(len(d) for d in drafts)
        # one tensor from one padded list: a copy per row costs ~10 us of host work each
        pad = [engine.pad_id] * width
        ids = torch.tensor([[t, *d, *pad[len(d) + 1:]] for t, d in zip(toks, drafts)], dtype=torch.long)
        pos_ids = batch.next_pos[:, None] + torch.arange(width, device=dev)[None, :]
        batch.mask = torch.cat([batch.mask, torch.ones((b, width), dtype=torch.long, device=dev)], dim=1)
        res = model(input_ids=ids.to(dev), attention_mask=batch.mask, position_ids=pos_ids,
                    use_cache=True, **with_cache(batch.cache))
        stats.decode_steps += 1
        stats.decode_token_slots += b
        sstats.rounds += 1
        sstats.plain_seconds_est += cost.seconds(b, 1)
        if width == 1:
            logits = res.logits[:, -1]
            batch.next_pos += 1
            sync(dev)
            _observe(cost, sstats, b, 1, t_round)
            continue
        accepted = _verify(res.logits, drafts, rows, keys, gen, known, sampling)
        finished = []
        record_outcomes(tracker, sstats, drafts, accepted, kinds)
        for j, (row, d) in enumerate(zip(rows, drafts)):
            a = accepted[j]
            kept = 0
            while kept < a and not ends.take(row, d[kept], gen[row]):
                kept += 1
            if kept < a or ends.reasons[row] is not None:
                finished.append(j)
                known.pop(row, None)
            elif a:
                unsent[row] = d[:a]
        _count_round(sstats, choice, drafts, accepted, kinds)
        acc_t = torch.tensor(accepted, dtype=torch.long, device=dev)
        logits = res.logits[torch.arange(b, device=dev), acc_t]
        batch.next_pos += acc_t + 1
        batch.rollback(acc_t, accepted, width)
        done.update(rows[j] for j in finished)
        _observe(cost, sstats, b, width, t_round)
        if ends.cut(params.cut_after):
            break
    plain_steps = max((len(gen[i]) - start_len[i] + (ends.reasons[i] == "stop") for i in range(n)), default=1) - 1
    sstats.forwards_saved = max(plain_steps - stats.decode_steps, 0)
    outs = [SampleOut(s.prompt_id, s.sample_index, gen[i], ends.reasons[i] or "cut", ends.stops[i])
            for i, s in enumerate(samples)]
    return outs, sstats


def record_outcomes(tracker: AcceptanceTracker, sstats: SpecStats, drafts: Sequence[Sequence[int]],
                    accepted: Sequence[int], kinds: Sequence[str | None]) -> None:
    """A verification round's outcomes: per (draft kind, drafted, accepted) into the acceptance
    tracker, by kind and by its strategy (the kind's first part), and the proposed and accepted
    token counters."""
    outcomes: dict[tuple[str, int, int], int] = {}  # (kind, drafted, accepted) -> rows
    for d, a, kind in zip(drafts, accepted, kinds):
        if d:
            outcomes[(kind, len(d), a)] = outcomes.get((kind, len(d), a), 0) + 1
            sstats.proposed += len(d)
            sstats.accepted += a
    for (kind, m, a), times in outcomes.items():
        tracker.record(kind, m, a, times)
        tracker.record(kind.split("/")[0], m, a, times)


def _observe(cost: ForwardCost, sstats: SpecStats, batch: int, width: int, t_round: float) -> None:
    """Charge the whole round (sampling, drafting, forward, verification, cache rollback) to
    a forward of this batch and width: the selector compares what rounds really cost."""
    elapsed = time.perf_counter() - t_round
    cost.observe(batch, width, elapsed)
    sstats.seconds += elapsed
    if width > 1:
        sstats.spec_seconds += elapsed


def _next_tokens(rows: list[int], known: dict[int, int], logits: torch.Tensor, keys: torch.Tensor,
                 gen: list[list[int]], sampling: Sampler, dev: torch.device, done: set[int]) -> list[int]:
    """Each running row's next token: drawn at its last verification mismatch, else sampled
    now from ``logits`` at its response position; -1 for the rows in ``done`` (ended)."""
    need = [j for j, r in enumerate(rows) if r not in known and r not in done]
    drawn: list[int] = []
    if need:
        idx = torch.tensor(need, device=dev)
        pos = torch.tensor([len(gen[rows[j]]) for j in need], dtype=torch.long, device=dev)
        drawn = sampling.draw(logits[idx] if len(need) < len(rows) else logits, keys[idx], pos).tolist()
    it = iter(drawn)
    return [known.pop(r) if r in known else -1 if r in done else next(it) for r in rows]


def _verify(logits: torch.Tensor, drafts: list[list[int]], rows: list[int], keys: torch.Tensor,
            gen: list[list[int]], known: dict[int, int], sampling: Sampler) -> list[int]:
    """Accepted draft length per row: the target's own draw (same noise as plain decoding) at
    each drafted position, compared with the draft. Each row's next token goes to ``known``:
    its draw at the first mismatch or, where the whole draft (perhaps empty) was accepted, its
    draw at the column after the draft, which the next round would otherwise draw in a call of
    its own. ``logits``: [b, width, V].

    A draw is a pure function of the logits, the row's key and the position, so the positions
    of several columns are drawn in one batched call: one draw and one host read-back per
    group of columns instead of per column (each costs a fixed ~0.2 ms on the CPU, and a device
    sync on a GPU). Columns are grouped so that one draw handles at most ``_DRAW_ELEMENTS``
    logits, and a group starts only with the rows that still match."""
    dev, vocab = logits.device, logits.shape[-1]
    accepted = [0] * len(rows)
    alive = list(range(len(rows)))
    col = 0
    while alive:
        span = max(1, _DRAW_ELEMENTS // (len(alive) * vocab))
        # a row's columns: its draft's, then the one after it (its next token if all are kept)
        cells = [(j, c) for j in alive for c in range(col, min(col + span, len(drafts[j]) + 1))]
        idx = torch.tensor([j for j, _ in cells], device=dev)
        cols = torch.tensor([c for _, c in cells], device=dev)
        pos = torch.tensor([len(gen[rows[j]]) + c for j, c in cells], dtype=torch.long, device=dev)
        drawn = iter(sampling.draw(logits[idx, cols], keys[idx], pos).tolist())
        nxt = []
        for j in alive:
            d = drafts[j]
            end = min(col + span, len(d) + 1)
            for c in range(col, end):
                t = next(drawn)
                if accepted[j] != c:  # an earlier column mismatched: this draw is not needed
                    continue
                if c < len(d) and t == d[c]:
                    accepted[j] += 1
                else:
                    known[rows[j]] = t
            if accepted[j] == end and end <= len(d):  # all matched so far, columns remain
                nxt.append(j)
        alive, col = nxt, col + span
    return accepted


def _count_round(sstats: SpecStats, choice: Choice, drafts: list[list[int]], accepted: list[int],
                 kinds: list[str | None]) -> None:
    """Round counters by the round's main strategy; token counters by each row's strategy.
    ``draft_len_sum`` grows by the longest draft verified (the round's width - 1), not by the
    chosen k: drafts shorter than k, and the probe rounds' k, verify fewer columns."""
    sstats.spec_rounds += 1
    sstats.draft_len_sum += max((len(d) for d in drafts), default=0)
    label = choice.strategy or "off"
    sstats.rounds_by_strategy[label] = sstats.rounds_by_strategy.get(label, 0) + 1
    for d, a, kind in zip(drafts, accepted, kinds):
        if not d:
            continue
        name = (kind or label).split("/")[0]
        sstats.proposed_by_strategy[name] = sstats.proposed_by_strategy.get(name, 0) + len(d)
        sstats.accepted_by_strategy[name] = sstats.accepted_by_strategy.get(name, 0) + a
        if a < len(d):
            sstats.rejections_by_strategy[name] = sstats.rejections_by_strategy.get(name, 0) + 1
        sstats.verified_rows += 1
