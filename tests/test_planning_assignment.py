"""Prompt assignment (PAPER §3.3)."""

import pytest

from flows.planning.assignment import assign_contiguous, assign_ranked, assign_round_robin

PRED = {10: 50.0, 11: 400.0, 12: 90.0, 13: 400.0, 14: 10.0, 15: 300.0, 16: 70.0}
IDS = list(PRED)


def _flat(assignment):
    return [p for actor in assignment for p in actor]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 20])
def test_every_prompt_exactly_once_and_no_empty_actor(n):
    for out in (assign_ranked(IDS, PRED, n), assign_round_robin(IDS, n),
                assign_contiguous(IDS, n)):
        assert sorted(_flat(out)) == sorted(IDS)
        assert len(out) == min(n, len(IDS))
        assert all(out)
        sizes = [len(a) for a in out]
        assert max(sizes) - min(sizes) <= 1


def test_ranked_is_longest_first_contiguous_with_id_tiebreak():
    out = assign_ranked(IDS, PRED, 3)
    # sorted: 11 (400), 13 (400, tie -> larger id later), 15, 12, 16, 10, 14; sizes 3, 2, 2
    assert out == ((11, 13, 15), (12, 16), (10, 14))
    ranked = _flat(out)
    assert [PRED[p] for p in ranked] == sorted(PRED.values(), reverse=True)


def test_round_robin_baseline_uses_given_order():
    assert assign_round_robin(IDS, 3) == ((10, 13, 16), (11, 14), (12, 15))


def test_contiguous_uses_given_order():
    assert assign_contiguous(IDS, 3) == ((10, 11, 12), (13, 14), (15, 16))


def test_bad_input():
    with pytest.raises(ValueError, match="prompt_ids"):
        assign_ranked([], PRED, 2)
    with pytest.raises(ValueError, match="num_actors"):
        assign_contiguous(IDS, 0)
    with pytest.raises(ValueError, match="duplicates"):
        assign_round_robin([1, 1], 1)
