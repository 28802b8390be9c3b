"""Pure tests of the speculation selector, its estimates, the drafters and the planner side."""

from __future__ import annotations

import pytest

from actions.engines.drafters import HistoryDrafter, PromptLookupDrafter
from actions.engines.spec_select import AcceptanceTracker, ForwardCost, choose_rows
from flows.planning.speculation import acceptance_rates, decode_speedup, speculative_profile, step_spec_metrics
from flows.planning.tpot import TpotProfile


def flat(batch: int, width: int) -> float:  # a memory-bound forward: width is free
    return 0.01


def linear(batch: int, width: int) -> float:  # a compute-bound forward: cost per token
    return 0.001 * batch * width


def test_expected_tokens_are_the_geometric_sum_per_row():
    # rows with drafts of 3 and 0 tokens at alpha 0.5, k 2: (1 + .5 + .25) + 1 tokens per 10 ms
    k, rate, plain = choose_rows([(3, 0.5), (0, 0.0)], flat, max_k=2)
    assert k == 2 and rate == pytest.approx(275.0) and plain == pytest.approx(200.0)


def test_flat_cost_and_good_acceptance_choose_the_longest_draft():
    k, rate, plain = choose_rows([(8, 0.9)] * 2, flat, max_k=8)
    assert k == 8 and rate > plain


def test_compute_bound_forward_turns_speculation_off():
    # width 1+k costs (1+k)x; even alpha 0.9 gives fewer than 1+k tokens per forward
    assert choose_rows([(8, 0.9)] * 2, linear, max_k=8)[0] == 0


def test_low_acceptance_turns_speculation_off_and_no_drafts_means_off():
    assert choose_rows([(4, 0.01)] * 2, lambda b, w: 0.01 * (1 + 0.2 * (w - 1)), max_k=8)[0] == 0
    assert choose_rows([(0, 0.0)] * 2, flat, max_k=8)[0] == 0


def test_k_is_bounded_by_drafts_and_max_k_and_interior_when_width_costs():
    assert choose_rows([(2, 0.8)] * 2, flat, max_k=4)[0] == 2
    assert choose_rows([(8, 0.8)] * 2, flat, max_k=4)[0] == 4
    # cost grows with width: the optimum is an interior k (sum of 0.6^i saturates)
    assert 1 <= choose_rows([(8, 0.6)], lambda b, w: 0.01 * (1 + 0.1 * (w - 1)), max_k=8)[0] < 8


def test_acceptance_tracker_uses_prior_then_data():
    t = AcceptanceTracker(prior_rate=0.5, prior_weight=2.0, priors={"history": 0.8})
    assert t.rate("history") == pytest.approx(0.8)
    assert t.rate("prompt_lookup") == pytest.approx(0.5)
    for _ in range(10):
        t.record("prompt_lookup", 4, 0)  # 10 rejections, nothing accepted
    assert t.rate("prompt_lookup") == pytest.approx(1.0 / 12)


def test_forward_cost_fits_observed_forwards():
    cost = ForwardCost()
    for _ in range(10):  # enough rounds to outweigh the prior
        for b in (16, 32, 64):
            for w in (1, 3, 5, 9):
                cost.observe(b, w, 0.003 + 2e-4 * b + 5e-5 * b * (w - 1))
    # the prior on the width term (robustness to one slow round) leaves a small bias
    assert cost.seconds(32, 1) == pytest.approx(0.003 + 2e-4 * 32, rel=0.1)
    assert cost.seconds(32, 5) == pytest.approx(0.003 + 2e-4 * 32 + 5e-5 * 128, rel=0.1)


def test_forward_cost_learns_a_speculative_rounds_fixed_overhead():
    """GPU-like rounds: the forward is flat in batch and width, and a speculative round costs
    a fixed 12 ms more (drafting, verification, rollback). The fit must charge that to every
    speculative round, short drafts included, so a draft accepted 10% of the time is not taken."""
    cost = ForwardCost()
    for _ in range(10):
        for w in (1, 2, 5, 9):
            cost.observe(64, w, 0.016 + (0.012 if w > 1 else 0.0))
    assert cost.seconds(64, 1) == pytest.approx(0.016, rel=0.1)
    assert cost.seconds(64, 2) == pytest.approx(0.028, rel=0.1)
    assert cost.seconds(64, 9) == pytest.approx(0.028, rel=0.1)
    assert choose_rows([(4, 0.1)] * 64, cost.snapshot(), max_k=8)[0] == 0
    # the same rounds with acceptance 0.66 pay: 1 + .66 + .44 + .29 + .19 tokens per 28 ms > 1 per 16 ms
    assert choose_rows([(4, 0.66)] * 64, cost.snapshot(), max_k=8)[0] >= 3


def test_prompt_lookup_copies_what_followed_the_last_match():
    d = PromptLookupDrafter(max_n=3)
    d.start(0, 7, [5, 6, 7, 8, 9], [5, 6])
    assert d.propose(0, 3) == [7, 8, 9]
    d.extend(0, [7, 1])  # "... 7 1": no earlier "7 1"; "1" unseen
    assert d.propose(0, 3) == []


def test_history_aligns_with_the_start_and_stops_at_the_end_of_a_response():
    d = HistoryDrafter({3: [[10, 11, 12, 2]]})
    d.start(0, 3, [1, 1], [])
    assert d.propose(0, 8) == [10, 11, 12, 2]
    d.extend(0, [10, 11])
    assert d.propose(0, 1) == [12]
    d.start(1, 4, [1], [])  # no history for prompt 4
    assert d.propose(1, 4) == []


def test_step_metrics_and_rates_from_reports():
    reports = [{"rounds": 10, "spec_rounds": 5, "proposed": 20, "accepted": 10, "draft_len_sum": 20,
                "verified_rows": 8, "forwards_saved": 6, "seconds": 0.1, "plain_seconds_est": 0.08,
                "rounds_by_strategy": {"history": 5}, "accepted_by_strategy": {"history": 10},
                "rejections_by_strategy": {"history": 5}}, None]
    m = step_spec_metrics(reports)
    assert m["spec/accept_rate"] == 0.5 and m["spec/mean_accepted"] == 1.25 and m["spec/draft_len"] == 4.0
    assert m["spec/strategy/history"] == 0.5 and m["spec/strategy/off"] == 0.5
    # (10 + 6) / 10 forwards x 0.08 / 0.1 s
    assert m["spec/decode_speedup"] == pytest.approx(1.28)
    assert acceptance_rates(reports, {"prompt_lookup": 0.2}) == {"prompt_lookup": 0.2, "history": 10 / 15}
    assert step_spec_metrics([None]) == {} and decode_speedup([]) == 1.0


def test_speculative_profile_divides_decode_time_only():
    p = TpotProfile(batch_sizes=(1, 8), contexts=(16.0, 64.0), seconds=((0.01, 0.02), (0.03, 0.04)),
                    prefill_tokens_per_s=1000.0, shrink_s=0.5)
    q = speculative_profile(p, 2.0)
    assert q.seconds == ((0.005, 0.01), (0.015, 0.02)) and q.shrink_s == 0.5
    assert q.prefill_tokens_per_s == 1000.0 and speculative_profile(p, 1.0) is p


def test_choose_rows_weighs_each_row_by_its_own_rate():
    from actions.engines.spec_select import choose_rows

    # one sure row (alpha 1, 8 tokens) and one hopeless row: k = 8 pays on a flat forward
    k, rate, plain = choose_rows([(8, 1.0), (8, 0.0)], flat, max_k=8)
    assert k == 8 and rate == pytest.approx((2 + 8) / 0.01) and plain == pytest.approx(200.0)
    assert choose_rows([(4, 0.0), (0, 0.0)], flat, max_k=8)[0] == 0
    assert choose_rows([], flat, max_k=8) == (0, 0.0, 0.0)


def test_survival_per_position_values_drafts_that_are_right_or_wrong_together():
    """Half the drafts of a kind are right to their end (a copy inside a run of repeats), half
    wrong at their first token. The geometric rate (about 0.8 per token, from 4 of every 5 tokens
    proposed being kept) overstates the first token and understates the rest; per position the
    first is a coin toss and every later one certain, which is what the selector should weigh."""
    t = AcceptanceTracker(prior_weight=2.0)
    for _ in range(50):
        t.record("prompt_lookup/n3", 8, 8)
        t.record("prompt_lookup/n3", 8, 0)
    assert t.rate("prompt_lookup/n3") == pytest.approx(400 / 450, rel=0.01)
    surv = t.survival("prompt_lookup/n3", 8)
    assert surv[0] == pytest.approx(0.5, abs=0.02)
    assert all(s > 0.97 for s in surv[1:])
    # a geometric kind keeps a flat profile at its rate
    g = AcceptanceTracker(prior_weight=2.0)
    for a in [0] * 8 + [1] * 4 + [2] * 2 + [3, 4]:  # each token kept with probability 1/2
        for _ in range(10):
            g.record("history", 4, a)
    assert g.survival("history", 4) == pytest.approx([0.5] * 4, abs=0.01)
    # choose_rows takes survival vectors as it takes rates: the same k for equal acceptance
    flat = lambda b, w: 0.01 * (1.0 + 0.1 * (w - 1))  # noqa: E731
    assert choose_rows([(4, 0.7)] * 8, flat, max_k=4) == choose_rows([(4, [0.7] * 4)] * 8, flat, max_k=4)


def _tracker_with_poor_and_good_kinds() -> AcceptanceTracker:
    """A response's first token matches one prompt letter (n1: nothing kept); inside a run of
    repeats a 3-gram match is right to its end (n3: all kept)."""
    t = AcceptanceTracker()
    for kind, kept in (("prompt_lookup/n1", 0), ("prompt_lookup/n3", 4)):
        for _ in range(50):
            t.record(kind, 4, kept)
            t.record("prompt_lookup", 4, kept)
    return t


def test_can_pay_weighs_each_strategys_best_kind_against_a_rounds_cost():
    from actions.engines.spec_select import can_pay

    t = _tracker_with_poor_and_good_kinds()
    assert t.best_survival("prompt_lookup", 4) == t.survival("prompt_lookup/n3", 4)
    assert all(s > 0.95 for s in t.best_survival("prompt_lookup", 4))
    cheap = lambda b, w: 0.01 * (1 + 0.1 * (w - 1))  # noqa: E731
    assert can_pay(t, ["prompt_lookup"], 8, cheap, 4)
    # a speculative round's fixed overhead of 10 plain rounds (a launch-bound GPU): no draft repays it
    assert not can_pay(t, ["prompt_lookup"], 8, lambda b, w: 0.01 if w == 1 else 0.1, 4)
    assert not can_pay(t, [], 8, cheap, 4)


class _Cost:
    def __init__(self, seconds) -> None:
        self.snapshot = lambda: seconds


def test_a_round_of_poor_drafts_keeps_drafting_while_better_kinds_pay_and_a_losing_round_cost_stops_it():
    from actions.engines.speculative import PROBE_EVERY, Speculation, _Selector

    t = _tracker_with_poor_and_good_kinds()
    spec = Speculation(strategies=("prompt_lookup",))
    poor = {"prompt_lookup": [([1, 1, 1, 1], "prompt_lookup/n1")] * 4}
    good = {"prompt_lookup": [([1, 1, 1, 1], "prompt_lookup/n3")] * 4}
    sel = _Selector(spec, t, _Cost(lambda b, w: 0.01 * (1 + 0.1 * (w - 1))))
    choice, drafts, _ = sel.pick(poor, 4)
    # this round is plain, and the next one drafts again (no cooldown)
    assert choice.k == 0 and drafts == [[]] * 4 and sel.cooldown == 0
    choice, drafts, _ = sel.pick(good, 4)
    assert choice.k == 4 and drafts == [[1, 1, 1, 1]] * 4
    # where a speculative round's cost beats every kind, drafting stops for PROBE_EVERY rounds
    sel = _Selector(spec, t, _Cost(lambda b, w: 0.01 if w == 1 else 0.1))
    assert sel.pick(good, 4)[0].k == 0 and sel.cooldown == PROBE_EVERY


def test_prompt_lookup_kind_tells_a_quote_of_the_prompt_from_a_repeat_of_the_response():
    """A response's first token matches a prompt letter (a quote, ``p``); inside a run of
    repeats the match is the response's own previous letter (``r``). Their acceptance differs
    by far, so they are separate kinds."""
    d = PromptLookupDrafter()
    d.start(0, 1, [5, 6, 7], [])
    d.extend(0, [5])
    assert d.propose(0, 2) == [6, 7] and d.kind(0) == "prompt_lookup/n1p"
    d.extend(0, [5])
    assert d.propose(0, 3) == [5, 5, 5] and d.kind(0) == "prompt_lookup/n1r"
    d.start(1, 1, [5, 6, 7], [9])
    assert d.propose(1, 2) == [] and d.kind(1) == "prompt_lookup/n0"


def test_history_kind_says_how_far_the_old_responses_agree_on_the_next_token():
    d = HistoryDrafter({1: [[1, 2, 9], [1, 2, 9], [1, 3, 9]], 2: [[1], [2], [3]]})
    d.start(0, 1, [7], [])
    assert d.propose(0, 3) == [1, 2, 9] and d.kind(0) == "history/patha"  # all three begin with 1
    d.extend(0, [1])
    assert d.propose(0, 2) == [2, 9] and d.kind(0) == "history/pathm"  # two of three go on with 2
    d.start(1, 2, [7], [])
    assert d.propose(1, 1) == [1] and d.kind(1) == "history/paths"  # a three-way split


def test_forward_cost_separates_a_speculative_rounds_per_row_overhead_from_its_width():
    """CPU-like rounds: a speculative round costs 1 ms plus 20 us per row beyond its forward
    (drafting, bookkeeping), and each draft column 10.5 us per row. Rounds of widths 4-7 at
    several batches, plain rounds and a few of width 9: the fit must price the widest round
    at batch 64 within 5%, not charge the per-row overhead to every column (which priced it
    ~30% dearer and kept drafts short)."""
    def true(b: int, w: int) -> float:
        return 8e-4 + 4.5e-5 * b + ((1e-3 + 2e-5 * b + 1.05e-5 * b * (w - 1)) if w > 1 else 0.0)

    cost = ForwardCost()
    for call in range(20):
        cost.observe(64, 1, true(64, 1))
        for b, w in ((64, 5), (48, 6), (20, 6), (4, 7), (64, 4), (45, 5), (20, 6), (3, 7)):
            cost.observe(b, w, true(b, w))
        if call % 3 == 0:
            cost.observe(64, 9, true(64, 9))
    for w in (1, 2, 5, 9):
        assert cost.seconds(64, w) == pytest.approx(true(64, w), rel=0.05)
    assert cost.wide_weight(9) > 1.0 and cost.wide_weight(10) == 0.0


def test_a_speculative_round_widens_to_its_longest_draft_while_no_wide_round_was_timed():
    """Rounds at the width the fit favours cannot identify what a draft column costs; now and
    then (``MIN_WIDE_WEIGHT``) a speculative round takes every row's whole draft instead."""
    from actions.engines.speculative import Speculation, _Selector

    t = AcceptanceTracker(priors={"prompt_lookup": 0.6}, prior_weight=1e6)  # 0.6 per token
    spec = Speculation(strategies=("prompt_lookup",))
    drafts = {"prompt_lookup": [([1] * 8, "prompt_lookup/n3r")] * 4}

    class Cost(_Cost):
        def __init__(self, wide: float) -> None:
            super().__init__(lambda b, w: 0.01 * (1 + 0.1 * (w - 1)))  # the best k is interior
            self.wide_weight = lambda width: wide

    k_fit = _Selector(spec, t, Cost(5.0)).pick(drafts, 4)[0].k
    assert 1 <= k_fit < 8
    choice, out, _ = _Selector(spec, t, Cost(0.0)).pick(drafts, 4)
    assert choice.k == 8 and out == [[1] * 8] * 4


def test_ngram_index_appended_at_once_equals_token_by_token():
    import random

    from actions.engines.drafters.base import NgramIndex

    rng = random.Random(0)
    for min_n, max_n in ((1, 3), (1, 4), (2, 3)):
        tokens = [rng.randrange(4) for _ in range(60)]
        whole, single = NgramIndex(min_n, max_n), NgramIndex(min_n, max_n)
        whole.append(tokens[:1])
        whole.append(tokens[1:40])  # a bulk append after a short one, and after a bulk one
        whole.append(tokens[40:])
        for t in tokens:
            single.append([t])
        assert whole._where == single._where
        for end in range(1, 61):
            query = tokens[max(0, end - max_n):end]
            assert whole.lookup(query) == single.lookup(query) and whole.last_n == single.last_n


@pytest.mark.parametrize("alphabet", [(0, 1, 2), (0, 1, 256, 65536, 1 << 24, 1 << 30)],
                         ids=["small", "byte-aligned"])
def test_prompt_lookup_drafts_what_an_ngram_index_of_prompt_and_response_drafts(alphabet):
    """The packed backwards search proposes exactly what the dictionary of every n-gram with
    a known continuation (latest occurrence wins, longest n first) proposes, with the same
    kinds. Ids whose bytes line up across token boundaries (0 after 256, ...) make matches
    that straddle two tokens, which must be skipped."""
    import random

    from actions.engines.drafters.base import NgramIndex, overlap_copy

    rng = random.Random(3)
    for trial in range(40):
        min_n, max_n = rng.choice(((1, 3), (1, 4), (2, 3)))
        prompt = [rng.choice(alphabet) for _ in range(rng.randrange(0, 12))]
        response = [rng.choice(alphabet) for _ in range(rng.randrange(0, 4))]
        if not prompt and not response:
            continue
        d = PromptLookupDrafter(min_n=min_n, max_n=max_n)
        d.start(trial, 9, prompt, response)
        index = NgramIndex(min_n, max_n)
        index.append(prompt)
        index.append(response)
        for _ in range(25):
            k = rng.randrange(0, 6)
            pos = index.lookup(index.tokens[-max_n:])
            want = [] if pos is None or k <= 0 else overlap_copy(index.tokens, pos, k)
            kind = "n0" if pos is None else f"n{index.last_n}{'r' if pos >= len(prompt) else 'p'}"
            assert d.propose(trial, k) == want
            assert d.kind(trial) == f"prompt_lookup/{kind}"
            new = [rng.choice(alphabet) for _ in range(rng.randrange(1, 10))]
            d.extend(trial, new)
            index.append(new)
