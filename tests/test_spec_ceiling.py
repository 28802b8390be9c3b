"""The hindsight ceiling of speculative decoding (benchmarks/spec_ceiling.py) on hand-made cases."""

from __future__ import annotations

import pytest

from actions.engines.drafters import PromptLookupDrafter
from benchmarks.spec_ceiling import (bound_seconds, call_speedup, greedy_seconds, plain_seconds,
                                     replay_acceptance, seconds)

BATCHES = (1, 2, 4, 8)


def table(fn, max_w: int = 9) -> dict[tuple[int, int], float]:
    return {(b, w): fn(b, w) for b in BATCHES for w in range(1, max_w + 1)}


def test_every_draft_accepted_and_free_width_gives_k_plus_1():
    # n = 9: 8 plain rounds; at k = 3 every round gives 4 tokens: 1 -> 5 -> 9, 2 rounds
    t = table(lambda b, w: 1e-3 * b)
    lengths = [9] * 4
    acc = [[9 - q for q in range(1, 9)]] * 4  # the draft after x_q is right to the end: n - q tokens
    plain = plain_seconds(t, lengths)
    assert plain == pytest.approx(8 * 4e-3)
    assert plain / bound_seconds(t, lengths, acc, max_k=3) == pytest.approx(4.0)
    assert plain / greedy_seconds(t, lengths, acc, max_k=3) == pytest.approx(4.0)


def test_nothing_accepted_gives_1_even_where_width_is_free():
    lengths, acc = [5, 3, 1], [[0] * 4, [0] * 2, []]
    for fn in (lambda b, w: 2e-3 + 1e-4 * b * w, lambda b, w: 2e-3 + 1e-4 * b):
        t = table(fn)
        plain = plain_seconds(t, lengths)
        # rounds 1, 2 with rows 1 and 2, rounds 3, 4 with row 1 alone
        assert plain == pytest.approx(2 * fn(2, 1) + 2 * fn(1, 1))
        assert plain / bound_seconds(t, lengths, acc, max_k=8) == pytest.approx(1.0)
        assert plain / greedy_seconds(t, lengths, acc, max_k=8) == pytest.approx(1.0)


def test_the_bound_is_below_the_hindsight_schedule_when_width_costs():
    # a compute-bound table: each extra column costs half a row; drafts right 0-3 tokens
    t = table(lambda b, w: 1e-3 + 1e-4 * b * (1 + 0.5 * (w - 1)))
    lengths = [12, 7, 10, 4]
    acc = [[(3 * q) % 4 for q in range(1, n)] for n in lengths]
    acc = [[min(a, n - q) for q, a in enumerate(row, start=1)] for row, n in zip(acc, lengths)]
    plain = plain_seconds(t, lengths)
    bound, greedy = bound_seconds(t, lengths, acc, 8), greedy_seconds(t, lengths, acc, 8)
    assert bound <= greedy + 1e-12 and greedy < plain
    # an exactly affine table: the bound's alpha is the table's fixed part, so the bound is
    # the real optimum's neighbour, above the no-fixed-part relaxation
    assert bound > bound_seconds({k: v - 1e-3 for k, v in t.items()}, lengths, acc, 8)


def test_replay_gives_the_accepted_prefix_of_each_draft_along_the_true_sequence():
    # prompt [5, 6], response 7 7 7 7 7: after the first 7 nothing matches (its n-gram has no
    # continuation yet); from the second on, the copy of the run is right to the end
    acc = replay_acceptance([PromptLookupDrafter()], [(0, [5, 6], [7, 7, 7, 7, 7])], max_new_tokens=8, max_k=8)
    assert acc == [[0, 3, 2, 1]]
    # max_k = 2 caps every draft at 2 tokens
    assert replay_acceptance([PromptLookupDrafter()], [(0, [5, 6], [7] * 5)], 8, max_k=2) == [[0, 2, 2, 1]]


def test_table_lookup_interpolates_in_the_batch_and_call_speedup_keeps_the_rest():
    t = {(1, 1): 1.0, (4, 1): 4.0}
    assert seconds(t, 2, 1) == pytest.approx(2.0) and seconds(t, 9, 1) == 4.0
    # a 10 s call with 6 s of forwards, which become 2 s: 10 / 6
    assert call_speedup(10.0, 6.0, 2.0) == pytest.approx(10 / 6)


@pytest.fixture
def spec_costs(monkeypatch):
    """``benchmarks/spec_costs.py``, which imports its siblings as a script does."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import spec_costs

    return spec_costs


def test_the_free_width_table_is_the_plain_rounds_fit_at_every_width(spec_costs):
    keys = [(b, w) for b in (4, 8, 64) for w in (1, 5, 9)]
    rounds = [(b, 2e-3 + 1e-5 * b) for b in (4, 8, 30, 64) for _ in range(3)]
    t = spec_costs.free_width_table(rounds, keys)
    for b, w in keys:
        assert t[(b, w)] == pytest.approx(2e-3 + 1e-5 * b)
    # rounds of one batch: their median everywhere
    assert set(spec_costs.free_width_table([(64, 3e-3), (64, 1e-3), (64, 2e-3)], keys).values()) == {2e-3}
    # a fit whose intercept goes negative never prices a round below the fastest one observed
    steep = spec_costs.free_width_table([(32, 1e-3), (64, 3e-3)], keys)
    assert steep[(4, 1)] == steep[(8, 9)] == 1e-3 and steep[(64, 5)] == pytest.approx(3e-3)


def test_the_free_width_ceiling_is_above_the_ceiling_of_any_table_with_the_same_plain_rounds(spec_costs):
    from actions.engines.base import SampleSpec
    from actions.engines.speculative import Speculation

    # prompts that the responses quote, so prompt lookup's drafts are right part of the time
    prompts = [(5, 6, 7, 8), (9, 9, 4), (3, 1, 4, 1, 5)]
    seqs = [[[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 2], [9, 9, 9, 9, 4, 9, 9, 1], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9]]]
    batches = [[SampleSpec(prompt_id=i, sample_index=0, prompt_tokens=p) for i, p in enumerate(prompts)]]
    spec = Speculation(strategies=("prompt_lookup",))
    keys = [(b, w) for b in (1, 2, 4) for w in range(1, spec.max_draft_len + 2)]
    free = spec_costs.free_width_table([(b, 1e-3 + 2e-4 * b) for b in (1, 2, 4)], keys)
    widening = {(b, w): free[(b, w)] * (1 + 0.3 * (w - 1)) for b, w in keys}
    zero = {key: 0.0 for key in keys}
    out = spec_costs.ceiling(batches, spec, widening, zero, 0.01, seqs, 16, free)
    assert 1.0 < out["ceiling"] < out["free_width_ceiling"] <= spec.max_draft_len + 1
    assert out["free_width_plain_rounds_s"] == pytest.approx(out["plain_rounds_s"])
    # where every width costs a plain round both tables agree
    same = spec_costs.ceiling(batches, spec, free, zero, 0.01, seqs, 16, free)
    assert same["ceiling"] == same["free_width_ceiling"]
    assert "free_width_ceiling" not in spec_costs.ceiling(batches, spec, free, zero, 0.01, seqs, 16)
