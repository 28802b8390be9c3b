"""Pre-warming from call history (paper §3.7)."""

import pytest

from flows.planning.prewarm import plan_prewarm, prewarm_lead, prewarm_offset, warm_actor_count


def test_offset_is_min_minus_buffer_and_lead_or_none_where_it_could_not_be_ready():
    assert prewarm_offset([12.0, 9.5, 30.0], buffer_s=2.0) == pytest.approx(7.5)
    assert prewarm_offset([1.0], buffer_s=2.0) is None  # it could not be ready before the call
    assert prewarm_offset([12.0, 9.5], buffer_s=2.0, lead_s=3.0) == pytest.approx(4.5)  # as long as it takes
    assert prewarm_offset([12.0, 9.5], buffer_s=2.0, lead_s=8.0) is None
    assert prewarm_offset([], buffer_s=2.0) is None
    with pytest.raises(ValueError, match="buffer_s"):
        prewarm_offset([1.0], buffer_s=-1)


def test_lead_is_the_longest_recent_pre_warm_and_at_least_the_floor():
    assert prewarm_lead([], floor_s=0.5) == 0.5  # none measured: the least one takes
    assert prewarm_lead([0.7, None, 2.0, 0.9], floor_s=0.5) == 2.0
    assert prewarm_lead([0.1, None], floor_s=0.5) == 0.5
    assert prewarm_lead([None, None]) == 0.0


def test_plan_per_kind():
    history = {"generate": [[3.0, 4.0], [2.5]], "score": [[20.0], [18.0]], "train": []}
    assert plan_prewarm(history, buffer_s=1.0) == {"generate": 1.5, "score": 17.0}


def test_warm_actor_count():
    assert warm_actor_count([3, 8, 5]) == 5  # last step
    assert warm_actor_count([3, 8, 5], window=2) == 8  # max of recent
    assert warm_actor_count([], default=2) == 2
    with pytest.raises(ValueError, match="window"):
        warm_actor_count([1], window=0)
