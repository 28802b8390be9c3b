"""A resume with ``model.lora`` switched on, off or changed is refused with the values that
differ shown whole (not cut mid-word) and how to keep the trained weights: export the run,
then a new run from the folder (``flows/campaign/state.py: check_resume``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from flows.campaign.earlier_ids import as_recorded_then
from flows.campaign.state import CampaignRefused, check_resume, shown_value
from flows.config import fingerprint_of, load_config


def _run(*overrides: str) -> SimpleNamespace:
    """A committed run as check_resume reads it, made with ``overrides``."""
    identity = as_recorded_then(load_config(None, list(overrides)).identity())
    return SimpleNamespace(run_id="r1", step=3, identity=identity, fingerprint=fingerprint_of(identity),
                           prepared=SimpleNamespace(data={}))


def _refusal(run: SimpleNamespace, *overrides: str) -> str:
    with pytest.raises(CampaignRefused) as info:
        check_resume(run, load_config(None, list(overrides)), resume=True)  # type: ignore[arg-type]
    return str(info.value)


def test_switching_lora_on_shows_the_whole_section_and_how_to_keep_the_weights():
    message = _refusal(_run(), "model.lora.r=8", "model.lora.alpha=8")
    assert ("model.lora: run None, now {'r': 8, 'alpha': 8.0, 'dropout': 0.0, 'target_modules': 'all-linear', "
            "'bias': 'none'}") in message, message
    assert "rlhfless export r1 --out DIR, " in message and "--merge-lora" not in message
    assert "new run with model.path: DIR" in message


def test_switching_lora_off_asks_for_the_adapter_merged_into_the_export():
    message = _refusal(_run("model.lora.r=8"))
    assert "model.lora: run {'r': 8, 'alpha': 32.0, 'dropout': 0.0, 'target_modules': 'all-linear', " in message
    assert "rlhfless export r1 --out DIR --merge-lora" in message and "model.path: DIR" in message


def test_a_changed_lora_setting_names_the_sub_key():
    message = _refusal(_run("model.lora.alpha=8"), "model.lora.alpha=16")
    assert "model.lora.alpha: run 8.0, now 16.0" in message and "--merge-lora" in message


def test_other_changes_get_no_export_hint():
    message = _refusal(_run(), "algorithm.lr=0.1")
    assert "settings differ: algorithm.lr" in message and "rlhfless export" not in message


def test_a_long_section_is_cut_between_entries_and_a_long_path_in_the_middle():
    section = {f"key_{i}": f"value_{i}" for i in range(30)}
    text = shown_value(section)
    assert text.endswith(" more}") and len(text) < 120
    kept = text[1:text.index(", ...")].split(", ")
    assert all(section[k.split(": ")[0].strip("'")] == v.strip("'") for k, v in (e.split(": ") for e in kept))
    path = "/data/" + "x" * 100 + "/model"
    assert shown_value(path).endswith("x/model'") and "..." in shown_value(path)
