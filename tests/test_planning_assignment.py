"""Prompt assignment (paper §3.3)."""

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


def test_striped_deals_the_ranking_round_robin():
    ranking = [7, 3, 9, 1, 4, 8, 2]  # longest first
    assert assign_round_robin(ranking, 3) == ((7, 1, 2), (3, 4), (9, 8))
    assert assign_round_robin(ranking, 10) == tuple((p,) for p in ranking)  # capped: no empty actor


def test_contiguous_uses_given_order():
    assert assign_contiguous(IDS, 3) == ((10, 11, 12), (13, 14), (15, 16))


def test_bad_input():
    with pytest.raises(ValueError, match="prompt_ids"):
        assign_ranked([], PRED, 2)
    with pytest.raises(ValueError, match="num_actors"):
        assign_contiguous(IDS, 0)
    with pytest.raises(ValueError, match="duplicates"):
        assign_round_robin([1, 1], 1)


def test_score_batches_pack_rollouts_heaviest_first_into_the_lightest():
    from flows.planning.score_batches import pack_score_batches

    # a ranked step: uneven slices and a continuation; four activations at most
    weights = {"gen-0": 400.0, "gen-1": 900.0, "gen-2": 1000.0, "gen-3": 150.0, "cont-0": 300.0}
    groups = pack_score_batches(weights, 4)
    assert groups == [["gen-0"], ["gen-1"], ["gen-2"], ["gen-3", "cont-0"]]
    assert sorted(k for g in groups for k in g) == sorted(weights)  # every rollout exactly once
    # equal shards (round-robin) stay one activation each; fewer rollouts than bins: one each
    assert pack_score_batches({f"gen-{i}": 10.0 for i in range(4)}, 4) == [[f"gen-{i}"] for i in range(4)]
    assert pack_score_batches({"a": 1.0, "b": 5.0}, 8) == [["a"], ["b"]]
    # one bin takes everything, in submission order; the largest load is the LPT bound
    assert pack_score_batches(weights, 1) == [list(weights)]
    two = pack_score_batches(weights, 2)
    assert max(sum(weights[k] for k in g) for g in two) <= sum(weights.values()) / 2 + max(weights.values())
    assert pack_score_batches({}, 3) == []
    with pytest.raises(ValueError, match="bins=0"):
        pack_score_batches(weights, 0)
