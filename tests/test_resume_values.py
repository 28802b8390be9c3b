"""A refused resume names each differing setting with values the user can set back: a setting
the run's identity leaves out at its default is shown as that default (``algorithm.loss_agg``
'token_mean', not None, which the configuration refuses), and PPO's ``algorithm.kl_kind`` as the
user's estimator, not as the identity records it (``flows/campaign/resume_values.py``). Each
value quoted, given back with ``--set``, makes the resume go through."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import yaml

from flows.campaign.earlier_ids import as_recorded_then
from flows.campaign.state import CampaignRefused, check_resume
from flows.config import fingerprint_of, load_config


def _run(*overrides: str) -> SimpleNamespace:
    """A committed run as check_resume reads it, made with ``overrides``."""
    identity = as_recorded_then(load_config(None, list(overrides)).identity())
    return SimpleNamespace(run_id="r1", step=3, identity=identity, fingerprint=fingerprint_of(identity),
                           prepared=SimpleNamespace(data={}))


def _refused(run: SimpleNamespace, *overrides: str) -> dict[str, tuple[str, str]]:
    """key -> (the run's value, the value now), as the refusal quotes them (Python reprs)."""
    with pytest.raises(CampaignRefused) as info:
        check_resume(run, load_config(None, list(overrides)), resume=True)  # type: ignore[arg-type]
    shown = re.search(r"settings differ: (.*)\); set them back", str(info.value)).group(1)
    return {k: (a, b) for k, a, b in re.findall(r"([\w.\[\]]+): run (.*?), now (.*?)(?:; |$)", shown)}


def _set_back(values: dict[str, tuple[str, str]]) -> list[str]:
    """``--set KEY=VALUE`` of each run's value (a Python repr, as YAML reads it)."""
    def as_yaml(text: str) -> str:
        value = {"None": None, "True": True, "False": False}.get(text, text)
        return yaml.safe_dump(value.strip("'") if isinstance(value, str) else value).strip().removesuffix("...")
    return [f"{k}={as_yaml(run).strip()}" for k, (run, _) in values.items()]


@pytest.mark.parametrize("made, now, want", [
    ((), ("algorithm.loss_agg=seq_mean_token_mean",),
     {"algorithm.loss_agg": ("'token_mean'", "'seq_mean_token_mean'")}),
    ((), ("algorithm.std_scope=batch",), {"algorithm.std_scope": ("'group'", "'batch'")}),
    ((), ("algorithm.mask_truncated=true",), {"algorithm.mask_truncated": ("False", "True")}),
    (("algorithm.loss_agg=seq_mean_token_mean",), (),
     {"algorithm.loss_agg": ("'seq_mean_token_mean'", "'token_mean'")}),
    ((), ("generation.top_k=5",), {"generation.top_k": ("None", "5")}),
    (("algorithm.name=ppo",), ("algorithm.name=ppo", "algorithm.kl_kind=k2"), {"algorithm.kl_kind": ("'k1'", "'k2'")}),
    (("algorithm.name=ppo", "algorithm.kl_kind=k3"), ("algorithm.name=ppo",), {"algorithm.kl_kind": ("'k3'", "'k1'")}),
])
def test_a_refusal_quotes_values_that_set_back_resume(made, now, want):
    run = _run(*made)
    shown = _refused(run, *now)
    assert shown == want
    check_resume(run, load_config(None, [*now, *_set_back(shown)]), resume=True)  # type: ignore[arg-type]


def test_a_section_the_run_lacks_is_shown_key_by_key_with_its_defaults():
    from flows.campaign.resume_values import as_set

    run, now = {"generation": {}}, {"generation": {"vllm": {"max_model_len": 4096}}}
    assert as_set([("generation.vllm", None, {"max_model_len": 4096})], run, now) == [
        ("generation.vllm.max_model_len", None, 4096)]
    lora = {"r": 8, "alpha": 8.0}  # a section that is off by default is shown whole: it was off
    assert as_set([("model.lora", None, lora)], {"model": {}}, {"model": {"lora": lora}}) == [
        ("model.lora", None, lora)]
