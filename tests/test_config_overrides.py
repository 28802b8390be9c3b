"""``--set`` overrides (``flows/config_overrides.py``): dotted keys, a list entry by its index,
and one line naming the key and the fix where an override cannot apply."""

from __future__ import annotations

import pytest

from flows.config import load_config

RM = "reward.models=[{path: /m/a, weight: 0.5}, {path: /m/b}]"


@pytest.mark.parametrize("key", ["reward.models[1].weight", "reward.models.1.weight"])
def test_an_entry_of_a_list_setting_is_edited_by_its_index(key: str) -> None:
    cfg = load_config(None, [RM, f"{key}=-2", "reward.models[0].label=POSITIVE"])
    assert [(m.path, m.weight, m.label) for m in cfg.reward.models] == [("/m/a", 0.5, "POSITIVE"), ("/m/b", -2.0, None)]


@pytest.mark.parametrize("overrides, message", [
    (["reward.models[0].weight=0"], "--set 'reward.models[0].weight=0': reward.models has 0 entries in what was given "
                                    "before it, so [0] is not one; give the list whole first, e.g. --set "
                                    "'reward.models=[{...}]', or edit it in the --config file"),
    ([RM, "reward.models[2].weight=1"], "reward.models has 2 entries in what was given before it, so [2] is not one"),
    ([RM, "reward.models.weight=1"], "--set 'reward.models.weight=1': reward.models is a list; name an entry, "
                                     "reward.models[0].weight"),
    (["algorithm.lr.x=1"], None),  # a section made where a value goes: the validator names the setting
    (["steps=3", "steps.x=1"], "--set 'steps.x=1': 'steps' is a value, not a section"),
    (["reward.models[x].weight=1"], "has a malformed key segment 'models[x]'; use dotted.key=value, with "
                                    "[i] for an entry of a list (reward.models[0].weight=0.5)"),
    (["algorithm..lr=1"], "--set 'algorithm..lr=1' has an empty key segment; use dotted.key=value"),
])
def test_an_override_that_cannot_apply_is_one_line_naming_the_key_and_the_fix(overrides, message) -> None:
    with pytest.raises(ValueError) as info:
        load_config(None, overrides)
    text = str(info.value)
    assert "\n" not in text
    assert message is None and "algorithm.lr" in text or message in text, text


@pytest.mark.parametrize("value, paths", [
    ("/m/a", [("/m/a", 1.0)]),
    ("{path: /m/a, weight: 2}", [("/m/a", 2.0)]),
    ("[/m/a, {path: /m/b, weight: 0.5}]", [("/m/a", 1.0), ("/m/b", 0.5)]),
])
def test_reward_models_take_a_path_or_one_entry_alone_as_functions_take_a_name(value: str, paths) -> None:
    cfg = load_config(None, [f"reward.models={value}"])
    assert [(m.path, m.weight) for m in cfg.reward.models] == paths
    with pytest.raises(ValueError, match=r"^reward.models\[1\] = 3: each entry is a model folder's path or "
                                         r"\{path, weight, ...\}"):
        load_config(None, ["reward.models=[/m/a, 3]"])
