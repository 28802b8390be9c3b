"""Cut-and-migrate bookkeeping (paper §3.4)."""

import pytest

from flows.planning.migrate import PartialSample, choose_destinations, cut_point, plan_continuations, should_cut
from flows.planning.registry import parse_scaling_policy


def test_cut_point():
    assert cut_point(10, 0.7) == 7
    assert cut_point(25, 0.28) == 7  # 0.28 * 25 is 7.000000000000001 in floating point
    assert cut_point(16, 0.7) == 12  # ceil(11.2)
    assert cut_point(4, 1.0) == 4
    assert cut_point(1, 0.3) == 1
    with pytest.raises(ValueError, match="cut_threshold"):
        cut_point(4, 0.0)


def test_should_cut_never_at_tau_one_or_single_sample():
    assert not any(should_cut(8, k, 1.0) for k in range(9))
    assert not any(should_cut(1, k, 0.5) for k in range(2))
    assert [should_cut(10, k, 0.7) for k in (6, 7, 9, 10)] == [False, True, True, False]


def test_choose_destinations_all_or_nothing():
    assert choose_destinations(3, {1: 2, 2: 5}) == {2: 3}
    assert choose_destinations(6, {1: 2, 2: 5}) == {2: 5, 1: 1}
    assert choose_destinations(8, {1: 2, 2: 5}) is None
    assert choose_destinations(3, {1: 2, 2: 5}, prefer=[1, 2]) == {1: 2, 2: 1}
    assert choose_destinations(0, {}) == {}


def test_plan_continuations_batches_by_window_and_size():
    partials = [PartialSample(0, 1, 0.0, 50), PartialSample(1, 2, 0.4, 80),
                PartialSample(2, 3, 0.9, 10), PartialSample(2, 4, 5.0, 30),
                PartialSample(3, 5, 5.1, 40)]
    out = plan_continuations(partials, window_s=1.0, max_batch=2)
    assert [c.sample_ids for c in out] == [(1, 2), (3,), (4, 5)]
    assert [c.start_s for c in out] == [0.4, 0.9, 5.1]
    assert out[0].predicted_tokens == 80
    with pytest.raises(ValueError, match="max_batch"):
        plan_continuations(partials, window_s=1.0, max_batch=0)


def test_an_actor_is_cut_only_while_another_is_predicted_to_still_decode():
    from flows.planning.migrate import plan_cut_points
    from flows.planning.tpot import TpotProfile

    flat = TpotProfile(batch_sizes=(1, 64), contexts=(16.0, 512.0), seconds=((0.01, 0.01), (0.01, 0.01)),
                       prefill_tokens_per_s=1e4)
    # ranked: actor 0 holds the long groups and reaches its cut point (7 of 10 done at 100
    # tokens) after actor 1 ended (40 tokens): its tail would only move, so it runs to the end
    long, short = [100.0] * 7 + [200.0] * 3, [20.0] * 7 + [40.0] * 3
    assert plan_cut_points([long, short], [16, 16], 0.7, flat) == [None, 7]
    # similar loads: each reaches its cut point while the other still decodes
    assert plan_cut_points([short, short], [16, 16], 0.7, flat) == [7, 7]
    # a lone actor, single samples and tau 1 / None never cut
    assert plan_cut_points([long], [16], 0.7, flat) == [None]
    assert plan_cut_points([[50.0], long], [16, 16], 0.7, flat) == [None, None]
    assert plan_cut_points([short, short], [16, 16], 1.0, flat) == [None, None]
    assert plan_cut_points([short, short], [16, 16], None, flat) == [None, None]
    # a late start counts: actor 1 starts decoding after actor 0 has ended
    assert plan_cut_points([short, short], [16, 16], 0.7, flat, ready_s=[0.0, 5.0]) == [7, None]
    # a tie counts as still decoding: actor 0 reaches its cut point (10 tokens) as actor 1 ends
    assert plan_cut_points([[10.0] * 7 + [20.0] * 3, [10.0] * 2], [16, 16], 0.7, flat)[0] == 7


def test_the_budget_objective_does_not_cut():
    cost_aware, fixed = parse_scaling_policy("cost_aware"), parse_scaling_policy("fixed:3")
    assert cost_aware.cut_threshold("budget", 0.7) is None
    assert cost_aware.cut_threshold("value", 0.7) == 0.7
    assert fixed.cut_threshold("budget", 0.7) == 0.7  # a fixed plan cuts as configured
    assert cost_aware.cut_threshold("paper", None) is None
