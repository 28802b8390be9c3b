"""A crash that loses the newest commit record (a local disk that had not flushed it, a store
restored from a backup taken between two commits) leaves a run that resumes from the commit
before it: garbage collection keeps the previous commit whole (flows/planning/retention.py),
and the resumed run ends with the weights of an uninterrupted one."""

from __future__ import annotations

import pytest

from actions.store import LocalStore, commit_key
from flows.campaign.run import run_campaign
from flows.campaign.state import load_state, pointer_key

try:
    from conftest import LEARNING, assert_learned
except ImportError:  # tests/ imported as a package
    from tests.conftest import LEARNING, assert_learned


@pytest.mark.slow
def test_a_run_whose_newest_commit_record_is_lost_resumes_from_the_one_before(tiny_config, prefect_harness,
                                                                            clean_summary) -> None:
    cfg = tiny_config("invoker.kind=inprocess", "run_id=lost", "store.keep_last=1", *LEARNING)
    first = run_campaign(cfg, progress=lambda m: None)
    assert first["steps_completed"] == 2 and first["gc"]["collections"] >= 2
    store = LocalStore(cfg.store.uri)
    store.delete(commit_key(pointer_key("lost"), 2))  # latest.json still names step 2: a stale hint
    assert load_state(store, "lost").step == 1
    resumed = run_campaign(cfg, resume=True, progress=lambda m: None)
    assert resumed["steps_completed"] == 2
    assert_learned(clean_summary)
    assert resumed["weights_sha256"] == first["weights_sha256"] == clean_summary["weights_sha256"]
