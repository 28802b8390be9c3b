"""The generation drain (flows/planning/drain.py): the continuation window and score decisions."""

from __future__ import annotations

from flows.planning.drain import ContinuationWindow, GenerationDrain, ReturnedShard, SubmitContinuation, SubmitScore


def test_window_opens_with_the_first_item_and_closes_on_time_or_when_nothing_can_join():
    w: ContinuationWindow[str] = ContinuationWindow(0.5)
    assert w.wait_s(3.0) is None and not w.due(3.0, cuttable_pending=False)  # nothing gathered
    w.add(["a"], 1.0)
    w.add(["b"], 1.2)  # joins; the window still closes 0.5 s after "a"
    assert w.closes_at == 1.5 and abs(w.wait_s(1.2) - 0.3) < 1e-12
    assert not w.due(1.4, cuttable_pending=True)
    assert w.due(1.5, cuttable_pending=True)  # on time
    assert w.due(1.2, cuttable_pending=False)  # nothing more can join: at once
    assert w.take() == ["a", "b"] and w.wait_s(2.0) is None and w.closes_at == float("inf")
    w.add([], 2.0)  # an empty add does not open it
    assert w.closes_at == float("inf")


def test_cut_samples_within_the_window_share_one_continuation_before_the_score():
    # gen-0 and gen-1 can be cut, gen-2 runs to the end
    d = GenerationDrain([3, 3, None], window_s=1.0, overlap_scoring=True, score_bins=3)
    assert d.on_return(ReturnedShard("gen-0", "r0", "p0", 12.0), 0.0) == [SubmitScore("gen-0", ("r0",))]
    assert d.wait_s(0.25) == 0.75  # gen-1 may still be cut: wait for it within the window
    # gen-1 returns cut inside the window and was the last cuttable action: submit now,
    # the continuation first, then gen-1's score
    assert d.on_return(ReturnedShard("gen-1", "r1", "p1", 5.0), 0.5) == [
        SubmitContinuation("cont-0", ("p0", "p1")), SubmitScore("gen-1", ("r1",))]
    assert d.pending == {"gen-2", "cont-0"} and not d.finished
    assert d.on_return(ReturnedShard("gen-2", "r2", None, 0.0), 0.6) == []  # nothing finished: no score
    assert d.on_return(ReturnedShard("cont-0", "rc", None, 4.0), 0.9) == [SubmitScore("cont-0", ("rc",))]
    assert d.finished and d.num_continuations == 1 and d.final_scores() == []
    assert d.continued_from == {"cont-0": ("gen-0", "gen-1")}  # the chains timing_s/work follows


def test_a_window_that_times_out_submits_on_the_empty_return():
    d = GenerationDrain([3, 3], window_s=0.2, overlap_scoring=True, score_bins=2)
    d.on_return(ReturnedShard("gen-0", "r0", "p0", 1.0), 0.0)
    assert d.on_return(None, 0.1) == []  # woke early: still open
    assert d.on_return(None, 0.2) == [SubmitContinuation("cont-0", ("p0",))]
    assert d.pending == {"gen-1", "cont-0"}


def test_scores_held_to_the_end_are_packed_in_submission_order():
    d = GenerationDrain([2, None, None], window_s=5.0, overlap_scoring=False, score_bins=2)
    assert d.on_return(ReturnedShard("gen-2", "r2", None, 3.0), 0.0) == []
    assert d.on_return(ReturnedShard("gen-0", "r0", "p0", 4.0), 0.1) == [SubmitContinuation("cont-0", ("p0",))]
    d.on_return(ReturnedShard("cont-0", "rc", None, 2.0), 0.2)
    d.on_return(ReturnedShard("gen-1", "r1", None, 4.0), 0.3)
    assert d.finished
    # work in submission order gen-0 4, gen-1 4, gen-2 3, cont-0 2 into 2 bins (longest first,
    # lightest bin, ties to the lower bin): {gen-0, gen-2} = 7, {gen-1, cont-0} = 6
    assert d.final_scores() == [SubmitScore("gen-0", ("r0", "r2")), SubmitScore("gen-1", ("r1", "rc"))]
