"""Commit records stay bounded however long a campaign runs: the per-step metrics and the
evaluations are sealed into create-once history segments, and a state reads back whole."""

from __future__ import annotations

import json

import pytest

from actions.store import CommitConflict, IntegrityError, LocalStore, ObjectStore, commit_key, commit_pointer
from flows.campaign.history import SEGMENT, segment_key
from flows.campaign.state import CampaignState, EvalRecord, commit_state, load_state, load_state_at, pointer_key

try:
    from conftest import bare_state
except ImportError:  # tests/ imported as a package
    from tests.conftest import bare_state

RUN = "hist"


def _state(**update) -> CampaignState:
    return bare_state(RUN, **update)


def _metrics(step: int) -> dict:
    return {"step": float(step), "reward_mean": step / 7, "plan": {"num_actors": 1 + step % 3}}


def _eval(step: int) -> EvalRecord:
    return EvalRecord(step=step, policy_version=step, accuracy=step / 1000, reward_mean=0.5, mean_length=3.0 + step,
                      num_prompts=4, reward_metrics={"format": 0.25})


def _grow(store: ObjectStore, steps: int, eval_every: int = 2) -> CampaignState:
    """Commit steps 0..``steps`` as the campaign does: one metrics entry a step, an evaluation
    every ``eval_every`` steps, each new state a deep copy of the last."""
    state = _state()
    commit_state(store, state)
    for s in range(1, steps + 1):
        state = state.model_copy(deep=True)
        state.step, state.policy_version = s, s
        state.steps.append(_metrics(s - 1))
        if s % eval_every == 0:
            state.evals.append(_eval(s))
        commit_state(store, state)
    return state


def _record(store: ObjectStore, step: int) -> dict:
    return json.loads(store.get(commit_key(pointer_key(RUN), step)))["state"]


def test_records_stay_bounded_and_states_read_back_whole(backend_store) -> None:
    store = backend_store
    final = _grow(store, 2 * SEGMENT + 30)
    for step in (SEGMENT - 1, SEGMENT, SEGMENT + 1, 2 * SEGMENT + 30):
        # sealed: whole segments of the entries the record before held (step - 1 of them)
        record = _record(store, step)
        assert record["sealed"]["steps"] == (step - 1) // SEGMENT * SEGMENT
        assert len(record["steps"]) == step - record["sealed"]["steps"] <= SEGMENT, step
    assert len(_record(store, 2 * SEGMENT + 30)["evals"]) == (SEGMENT + 15) % SEGMENT
    loaded = load_state(store, RUN)
    assert loaded is not None and loaded.model_dump() == final.model_dump()
    assert [m["step"] for m in loaded.steps] == [float(s) for s in range(2 * SEGMENT + 30)]
    # an older commit reads back as it was committed
    middle = load_state_at(store, RUN, SEGMENT + 1)
    assert middle is not None and len(middle.steps) == SEGMENT + 1 and len(middle.evals) == (SEGMENT + 1) // 2


def test_a_resumed_state_keeps_sealing_where_it_stopped(tmp_path) -> None:
    store = LocalStore(tmp_path / "store")
    _grow(store, SEGMENT + 5)
    resumed = load_state(store, RUN)
    assert resumed is not None and resumed.sealed == {"steps": SEGMENT, "evals": 0}
    for s in range(SEGMENT + 6, 2 * SEGMENT + 1):
        resumed = resumed.model_copy(deep=True)
        resumed.step = s
        resumed.steps.append(_metrics(s - 1))
        commit_state(store, resumed)
    assert len(_record(store, 2 * SEGMENT)["steps"]) == SEGMENT and resumed.sealed["steps"] == SEGMENT
    assert load_state(store, RUN).model_dump() == resumed.model_dump()


def test_records_from_before_sealing_load_and_their_next_commit_seals_them(tmp_path) -> None:
    store = LocalStore(tmp_path / "store")
    old = _state(step=SEGMENT + 3, steps=[_metrics(s) for s in range(SEGMENT + 3)])
    data = old.model_dump(mode="json")
    data.pop("sealed")

    for s in range(SEGMENT + 4):  # commits must be consecutive
        commit_pointer(store, pointer_key(RUN), {"step": s, "state": {**data, "step": s}})
    loaded = load_state(store, RUN)
    assert loaded is not None and len(loaded.steps) == SEGMENT + 3 and loaded.sealed == {}
    loaded.step += 1
    loaded.steps.append(_metrics(SEGMENT + 3))
    commit_state(store, loaded)
    assert len(_record(store, SEGMENT + 4)["steps"]) == 4  # the entries the old record held are sealed
    assert load_state(store, RUN).steps == loaded.steps


def test_a_step_replayed_with_other_timings_after_a_crash_commits(tmp_path, monkeypatch) -> None:
    """Only entries an earlier record holds are sealed: a crash between a step's segments and its
    record replays the step, whose measured times differ, and the replay still commits."""
    import flows.campaign.state as state_module

    store = LocalStore(tmp_path / "store")
    for crash_at in (SEGMENT, SEGMENT + 1):
        state = _grow(store, crash_at - 1) if crash_at == SEGMENT else load_state(store, RUN)
        attempt = state.model_copy(deep=True)
        attempt.step += 1
        attempt.steps.append(_metrics(crash_at - 1) | {"timing_s/step": 12.34})
        with monkeypatch.context() as m:
            m.setattr(state_module, "commit_pointer", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
            with pytest.raises(KeyboardInterrupt):
                commit_state(store, attempt)  # dies after sealing, before its record
        resumed = load_state(store, RUN)
        assert resumed is not None and resumed.step == crash_at - 1
        replay = resumed.model_copy(deep=True)
        replay.step += 1
        replay.steps.append(_metrics(crash_at - 1) | {"timing_s/step": 12.91})
        commit_state(store, replay)
        assert load_state(store, RUN).steps[-1]["timing_s/step"] == 12.91
    assert store.exists(segment_key(RUN, "steps", 0))  # sealed by the commit after the 100th entry's


def test_a_segment_rewritten_with_other_entries_is_refused(tmp_path) -> None:
    store = LocalStore(tmp_path / "store")
    _grow(store, SEGMENT + 1)
    other = load_state(store, RUN)
    other.step += 1
    other.steps.append(_metrics(SEGMENT + 1))
    other.sealed = {}  # a second writer, unaware of the segment
    other.steps[3] = {**other.steps[3], "reward_mean": -1.0}
    with pytest.raises(CommitConflict, match=r"history segment .*steps-000000\.json already holds other steps"):
        commit_state(store, other)


def test_collection_reads_no_history(tmp_path) -> None:
    """Garbage collection needs the keys of the commits it keeps, never their history."""
    from flows.campaign.collect import plan_for
    from flows.planning.retention import Retention

    class Counting(LocalStore):
        history_reads = 0

        def get(self, key: str) -> bytes:
            Counting.history_reads += "/history/" in key
            return super().get(key)

    store = Counting(tmp_path / "store")
    latest = _grow(store, 2 * SEGMENT + 2)
    Counting.history_reads = 0  # the commits read their segments back
    plan_for(store, latest, Retention(keep_last=2, checkpoint_every=10))
    assert Counting.history_reads == 0


def test_a_missing_or_tampered_segment_is_named(tmp_path) -> None:
    store = LocalStore(tmp_path / "store")
    _grow(store, SEGMENT + 1)
    key = segment_key(RUN, "steps", 0)
    good = store.get(key)
    segment = json.loads(good)
    segment["items"] = segment["items"][:-1]
    store.put(key, json.dumps(segment).encode())
    with pytest.raises(IntegrityError, match=r"steps-000000\.json is not a rlhfless\.history/v1 segment"):
        load_state(store, RUN)
    store.delete(key)
    with pytest.raises(IntegrityError, match=r"steps-000000\.json is missing"):
        load_state(store, RUN)
    store.put(key, good)
    record = json.loads(store.get(commit_key(pointer_key(RUN), SEGMENT + 1)))
    record["state"]["sealed"]["steps"] = 7
    store.put(commit_key(pointer_key(RUN), SEGMENT + 1), json.dumps(record).encode())
    with pytest.raises(IntegrityError, match=r"steps-000000\.json is not a .* segment of steps entries from 0 within "
                                             r"the 7 sealed"):
        load_state(store, RUN)


def test_a_record_that_lost_its_sealed_steps_is_refused(tmp_path) -> None:
    """A revision from before sealing reads a sealed record's tail as the whole history; a record
    it then commits lacks the sealed steps: refused by name, not read as a shorter run."""
    store = LocalStore(tmp_path / "store")
    _grow(store, SEGMENT + 5)
    data = _record(store, SEGMENT + 5)
    data.pop("sealed")  # as the older revision writes it: its tail and no count
    commit_pointer(store, pointer_key(RUN), {"step": SEGMENT + 6, "state": {**data, "step": SEGMENT + 6}})
    with pytest.raises(IntegrityError, match=rf"entry 0 of its step metrics is step {SEGMENT}'s.*Resume runs with"):
        load_state(store, RUN)


def test_a_commit_dumps_only_the_entries_after_the_sealed_ones(tmp_path, monkeypatch) -> None:
    """What a commit serialises stays bounded however long the run: the sealed history is
    never dumped again (it cost 0.26 s a commit at 10,000 steps)."""
    store = LocalStore(tmp_path / "s")
    state = _grow(store, 3 * SEGMENT + 5)
    dumped: list[int] = []
    dump = CampaignState.model_dump

    def counting(self, **kwargs):
        out = dump(self, **kwargs)
        dumped.append(len(out.get("steps", [])))
        return out

    monkeypatch.setattr(CampaignState, "model_dump", counting)
    state = state.model_copy(deep=True)
    state.step += 1
    state.steps.append(_metrics(state.step - 1))
    commit_state(store, state)
    assert dumped and max(dumped) <= SEGMENT < len(state.steps)
    monkeypatch.undo()
    assert load_state(store, RUN).steps == state.steps  # read back whole


def test_a_run_sealed_in_segments_of_100_reads_back_and_goes_on_in_segments_of_20(tmp_path, monkeypatch) -> None:
    """Runs sealed before SEGMENT became 20 resume: each segment says where the next starts."""
    from flows.campaign import history

    store = LocalStore(tmp_path / "store")
    monkeypatch.setattr(history, "SEGMENT", history.LEGACY_SEGMENT)
    _grow(store, 230)
    monkeypatch.undo()
    old = load_state(store, RUN)
    assert old is not None and old.sealed["steps"] == 200 and len(old.steps) == 230
    for s in range(231, 260):
        old = old.model_copy(deep=True)
        old.step, old.policy_version = s, s
        old.steps.append(_metrics(s - 1))
        commit_state(store, old)
    assert old.sealed["steps"] == 240 and store.exists(segment_key(RUN, "steps", 220))
    loaded = load_state(store, RUN)
    assert [m["step"] for m in loaded.steps] == [float(s) for s in range(259)]


def test_a_legacy_run_that_lost_its_newest_record_replays_onto_its_segment_of_100(tmp_path, monkeypatch) -> None:
    """Its previous record holds 100 unsealed entries that a segment of 100 already seals: the
    replay finds the same entries there, as a replay of its own segment would."""
    from flows.campaign import history

    store = LocalStore(tmp_path / "store")
    monkeypatch.setattr(history, "SEGMENT", history.LEGACY_SEGMENT)
    _grow(store, 301)  # record 301 sealed entries 200..299 into a segment of 100
    monkeypatch.undo()
    store.delete(commit_key(pointer_key(RUN), 301))  # lost (a disk that had not flushed it)
    resumed = load_state(store, RUN)
    assert resumed is not None and resumed.step == 300 and resumed.sealed["steps"] == 200
    replay = resumed.model_copy(deep=True)
    replay.step, replay.policy_version = 301, 301
    replay.steps.append(_metrics(300))
    commit_state(store, replay)
    assert replay.sealed["steps"] == 300
    assert [m["step"] for m in load_state(store, RUN).steps] == [float(s) for s in range(301)]
