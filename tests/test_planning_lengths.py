"""Length history and prediction (paper §3.2)."""

import json

import pytest

from flows.planning.lengths import LengthHistory, ewma, predict_lengths, rank_correlation


def test_record_keeps_group_max_and_replaces_a_replayed_epoch():
    h = LengthHistory()
    h.record(7, 0, [10, 40, 20])
    h.record(7, 0, [15, 30])  # the same epoch replayed: replaces, never counts twice
    h.record(7, 1, [50])
    assert h.observations[7] == [(0, 30.0), (1, 50.0)]


def test_a_kept_history_predicts_as_the_whole_one_within_its_window():
    whole, kept = LengthHistory(), LengthHistory()
    for epoch in range(30):
        whole.record(7, epoch, [10 + 3 * epoch, 5], reference_length=12)
        kept.record(7, epoch, [10 + 3 * epoch, 5], reference_length=12, keep=4)
    assert [e for e, _ in kept.observations[7]] == [26, 27, 28, 29]
    for window in (1, 4):
        assert predict_lengths(kept, [7], {7: 12}, window=window) == predict_lengths(whole, [7], {7: 12}, window=window)
    assert kept.reference_scale() == whole.reference_scale()


def test_json_round_trip():
    h = LengthHistory()
    h.record(3, 1, [5])
    h.record(3, 0, [9])
    h.record(11, 0, [1, 2])
    again = LengthHistory.from_dict(json.loads(json.dumps(h.to_dict())))
    assert again == h
    assert again.observations[3] == [(0, 9.0), (1, 5.0)]


def test_window_one_is_last_value_and_fallback_is_reference():
    h = LengthHistory()
    for epoch, length in enumerate([100, 200, 400]):
        h.record(1, epoch, [length])
    pred = predict_lengths(h, [1, 2], reference_lengths={1: 5, 2: 77}, window=1)
    assert pred == {1: 400.0, 2: 77.0}


def test_ewma_window_weights():
    # window 2: alpha = 2/3, weights newest 2/3, older 2/9 -> (2/3*400 + 2/9*200) / (8/9) = 350
    assert ewma([200.0, 400.0]) == pytest.approx(350.0)
    h = LengthHistory()
    for epoch, length in enumerate([100, 200, 400]):
        h.record(1, epoch, [length])
    assert predict_lengths(h, [1], {}, window=2)[1] == pytest.approx(350.0)
    # a window longer than the history uses what there is
    assert predict_lengths(h, [1], {}, window=10)[1] == pytest.approx(ewma([100, 200, 400]))


def test_missing_reference_and_bad_window_raise_with_field():
    with pytest.raises(ValueError, match="reference_lengths"):
        predict_lengths(LengthHistory(), [1], {})
    with pytest.raises(ValueError, match="lengths.window"):
        predict_lengths(LengthHistory(), [1], {1: 3}, window=0)


def test_rank_correlation():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # ties get average ranks: predicted ranks [1.5, 1.5, 3], actual [1, 2, 3]
    # -> Pearson of the ranks = 0.8660...
    assert rank_correlation([5, 5, 9], [1, 2, 3]) == pytest.approx(3 ** 0.5 / 2)
    # a three-way tie: average ranks [3, 3, 3, 5, 1] (the lowest rank of a tie, 2, would give +0.104)
    assert rank_correlation([5, 5, 5, 9, 1], [1, 2, 3, 4, 5]) == pytest.approx(-(20 ** -0.5))
    assert rank_correlation([1, 1, 1], [1, 2, 3]) == 0.0  # constant: undefined -> 0
    with pytest.raises(ValueError):
        rank_correlation([1, 2], [1])


def test_no_prediction_exceeds_the_generation_cap():
    """A reference longer than max_new_tokens (scaled or not) is predicted at the cap: no
    response runs longer."""
    assert predict_lengths(LengthHistory(), [1, 2], {1: 5000, 2: 40}, max_length=100) == {1: 100.0, 2: 40.0}
    assert predict_lengths(LengthHistory(), [1], {1: 5000}) == {1: 5000.0}  # no cap given: none applied


def test_unseen_prompts_scale_their_reference_by_what_seen_prompts_ran():
    h = LengthHistory()
    assert h.reference_scale() == 1.0  # nothing observed: the reference as it is
    h.record(1, 0, [20, 30], reference_length=10)
    h.record(2, 0, [50], reference_length=20)
    h.record(3, 0, [999])  # no reference: not part of the scale
    assert h.reference_scale() == pytest.approx(80 / 30)
    pred = predict_lengths(h, [1, 4, 5], reference_lengths={4: 6, 5: 12})
    assert pred == pytest.approx({1: 30.0, 4: 16.0, 5: 32.0})  # seen: history; unseen: ref x 8/3
    # the scale travels with the history; a history saved without references has none
    again = LengthHistory.from_dict(json.loads(json.dumps(h.to_dict())))
    assert again == h and again.reference_scale() == h.reference_scale()
    old = LengthHistory.from_dict({"observations": {"1": [[0, 30.0]]}})
    assert old.reference_scale() == 1.0 and old.observations[1] == [(0, 30.0)]
