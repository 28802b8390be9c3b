"""Runs committed before ``reward.models`` and ``model.lora`` were part of a run's identity are
found and resumed under the ids their settings derived then (``flows/campaign/earlier_ids.py``).
An end-to-end resume of such a run (committed by the revision of 2026-11-26) was checked by hand:
``train --resume`` names it, continues at step 2 and ends with its id."""

from __future__ import annotations

import pytest
from conftest import bare_state

from actions.store import LocalStore
from flows.campaign.earlier_ids import as_recorded_then, earlier_run_ids, resumed_run_id
from flows.campaign.state import CampaignRefused, check_resume
from flows.config import load_config


def test_the_default_settings_derive_the_ids_they_did_before_each_key():
    """The ids the default campaign had before both keys (till 2026-11-27 22:43) and between
    them (4 minutes); today's is not among them, and a named run has none."""
    cfg = load_config(None, [])
    assert cfg.resolved_run_id() == "repeat-grpo-7cd0a181803c"
    assert earlier_run_ids(cfg) == ["repeat-grpo-7a56ae721e20", "repeat-grpo-89e6cb5cc0e0"]
    assert earlier_run_ids(load_config(None, ["run_id=mine"])) == []


def _commit(store: LocalStore, run: str) -> None:
    store.put(f"runs/{run}/campaign/commits/step-000000.json", b"{}")


def test_a_resume_takes_the_earlier_id_only_where_the_store_holds_that_run_alone(tmp_path):
    cfg = load_config(None, [])
    store = LocalStore(tmp_path)
    assert resumed_run_id(cfg, store) is None  # nothing committed: start under today's id
    _commit(store, "repeat-grpo-7a56ae721e20")
    assert resumed_run_id(cfg, store) == "repeat-grpo-7a56ae721e20"
    assert resumed_run_id(load_config(None, ["algorithm.lr=0.001"]), store) is None  # other settings
    store.put("runs/repeat-grpo-7cd0a181803c/lease.json", b"{}")
    assert resumed_run_id(cfg, store) is None  # a run under today's id stopped before its first commit: that one
    _commit(store, "repeat-grpo-7cd0a181803c")
    assert resumed_run_id(cfg, store) is None  # today's id has a run: that one


def test_a_record_without_the_keys_compares_as_if_they_held_their_defaults():
    cfg = load_config(None, [])
    then = as_recorded_then(cfg.identity())
    assert "models" not in then["reward"] and "lora" not in then["model"]
    from flows.config import fingerprint_of

    old = bare_state("repeat-grpo-7a56ae721e20", step=1).model_copy(
        update={"identity": then, "fingerprint": fingerprint_of(then)})
    assert check_resume(old, cfg, True) == []
    with pytest.raises(CampaignRefused, match=r"settings differ: algorithm.lr"):
        check_resume(old, load_config(None, ["algorithm.lr=0.001"]), True)
    lora = load_config(None, ["model.lora={r: 4, alpha: 8}"])
    with pytest.raises(CampaignRefused, match="settings differ"):  # a key at another value is compared
        check_resume(old, lora, True)
    now = bare_state("r", step=1).model_copy(update={"identity": cfg.identity(), "fingerprint": cfg.fingerprint()})
    assert check_resume(now, cfg, True) == []
