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


@pytest.mark.parametrize("written, override, expected", [
    ("reward.functions=[gsm8k, exact_match]", "reward.functions[1].weight=2", [("gsm8k", 1.0), ("exact_match", 2.0)]),
    ("reward.functions=gsm8k", "reward.functions[0].weight=0.5", [("gsm8k", 0.5)]),
    ("reward.functions={name: gsm8k}", "reward.functions.0.weight=3", [("gsm8k", 3.0)]),
    ("reward.models=[/m/a, /m/b]", "reward.models[0].weight=-1", [("/m/a", -1.0), ("/m/b", 1.0)]),
    ("reward.models=/m/a", "reward.models[0].label=POSITIVE", [("/m/a", 1.0)]),
])
def test_a_key_below_a_short_entry_applies_to_the_mapping_it_stands_for(written, override, expected) -> None:
    """``functions: [gsm8k]`` (TRL's ``reward_funcs``), one name alone, a bare model path: each
    entry is ``{name: ...}`` / ``{path: ...}``, so ``[0].weight`` edits it rather than failing
    with "is a value, not a section"."""
    cfg = load_config(None, [written, override])
    entries = cfg.reward.functions if written.startswith("reward.functions") else cfg.reward.models
    assert [(getattr(e, "name", None) or e.path, e.weight) for e in entries] == expected
    if "label" in override:
        assert cfg.reward.models[0].label == "POSITIVE"


def test_a_short_entry_read_from_the_config_file_is_edited_too(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("reward:\n  functions: [gsm8k]\n  models: /m/a\n")
    cfg = load_config(str(path), ["reward.functions[0].weight=2", "reward.models[0].weight=0.5"])
    assert (cfg.reward.functions[0].name, cfg.reward.functions[0].weight) == ("gsm8k", 2.0)
    assert (cfg.reward.models[0].path, cfg.reward.models[0].weight) == ("/m/a", 0.5)


@pytest.mark.parametrize("overrides, fix", [
    (["generation.draft_strategies[0]=history"], "--set 'generation.draft_strategies=[history, prompt_lookup]'"),
    (["generation.draft_strategies=[history]", "generation.draft_strategies[1]=x"],
     "--set 'generation.draft_strategies=[history, prompt_lookup]'"),
    (["faults.actions[1]=score"], "--set 'faults.actions=[generate, score]'"),
    (["reward.functions[0].weight=2"], "--set 'reward.functions=[{...}]'"),  # a list of mappings
])
def test_a_missing_entry_s_fix_gives_the_list_in_the_form_its_entries_take(overrides, fix) -> None:
    with pytest.raises(ValueError) as info:
        load_config(None, overrides)
    assert fix in str(info.value), str(info.value)


def test_without_a_schema_the_entries_given_tell_the_form() -> None:
    from flows.config_overrides import apply_override

    with pytest.raises(ValueError, match=r"e.g. --set 'x.names=\[a, b\]'"):
        apply_override({"x": {"names": ["a", "b"]}}, "x.names[2]=c")
    with pytest.raises(ValueError, match=r"e.g. --set 'x.names=\[\{\.\.\.\}\]'"):
        apply_override({"x": {"names": []}}, "x.names[0]=c")


@pytest.mark.parametrize("overrides, message", [
    (["reward.functions=[{name: gsm8k, wieght: 2}]"],
     "unknown config key 'reward.functions[0].wieght': not a setting of reward.functions[0]; check the spelling"),
    (["reward.models=[/m/a, {path: /m/b, wieght: 2}]"], "unknown config key 'reward.models[1].wieght'"),
    (["generation.draft_strategies=[history, histor]"], "config generation.draft_strategies[1] = 'histor': input"),
    (["reward.functions=[{name: gsm8k, weight: .nan}]"], "config reward.functions[0].weight = nan: "),
])
def test_an_entry_of_a_list_is_named_by_its_index_in_brackets(overrides, message) -> None:
    """As ``--set`` names an entry (``reward.functions[0].weight``), not pydantic's ``functions.0``."""
    with pytest.raises(ValueError) as info:
        load_config(None, overrides)
    assert message in str(info.value), str(info.value)


@pytest.mark.parametrize(("override", "hint"), [
    ("train.steps=2", "; 'steps' is a setting elsewhere: steps or warmup.steps"),
    ("generation.lr=1e-5", "; 'lr' is a setting elsewhere: algorithm.lr or warmup.lr"),
    ("algorithm.weight=1", "; 'weight' is a setting elsewhere: reward.functions[i].weight or reward.models[i].weight"),
])
def test_a_key_in_the_wrong_section_names_where_it_is_a_setting(override: str, hint: str) -> None:
    with pytest.raises(ValueError) as err:
        load_config(None, [override])
    assert str(err.value).endswith(hint)


def test_a_key_that_is_a_setting_nowhere_gets_no_hint() -> None:
    with pytest.raises(ValueError) as err:
        load_config(None, ["algorithm.wieght=1"])
    assert str(err.value).endswith("check the spelling (see README, Configuration)")
