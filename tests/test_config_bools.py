"""A boolean is never taken for a number: YAML reads ``true``, ``yes`` and ``on`` as True,
which pydantic would take for 1 (``generation.temperature: false`` would decode greedily,
``steps: yes`` run one step). Every int or float setting of every section refuses it, in one
line naming the dotted key, the value and the fix; settings that take a boolean keep taking it."""

from __future__ import annotations

import re
import typing

import pytest
from pydantic import BaseModel

from actions.config.section import _numeric_kind
from flows.config import CampaignConfig, load_config


@pytest.mark.parametrize(("override", "needles"), [
    ("steps=yes", ("steps=True is not a number", "set an integer, e.g. steps: 24")),
    ("eval_every=on", ("eval_every=True", "e.g. eval_every: 4")),
    ("algorithm.lr=true", ("algorithm.lr=True", "set a number, e.g. algorithm.lr: 0.0006")),
    ("generation.temperature=false", ("generation.temperature=False", "e.g. generation.temperature: 1.0")),
    ("algorithm.group_size=true", ("algorithm.group_size=True", "e.g. algorithm.group_size: 8")),
    ("algorithm.batch_size=true", ("algorithm.batch_size=True", "e.g. algorithm.batch_size: 128")),
    ("seed=no", ("seed=False", "e.g. seed: 0")),
    ("price_per_gpu_second=off", ("price_per_gpu_second=False", "set a number")),
    ("scaling.n_max=true", ("scaling.n_max=True", "set an integer, e.g. scaling.n_max: 4")),
    ("budget.usd=true", ("budget.usd=True", "set a number, or null")),
    ("generation.top_k=true", ("generation.top_k=True", "set an integer, or null")),
    ("generation.vllm.max_model_len=true", ("generation.vllm.max_model_len=True", "or null")),
    ("store.keep_last=true", ("store.keep_last=True", "e.g. store.keep_last: 2")),
    ("reward.functions=[{name: repeat, weight: true}]", ("reward.functions[0].weight=True", "set a number")),
    ("reward.models=[{path: m, max_length: true}]", ("reward.models[0].max_length=True", "set an integer, or auto")),
    ("model.lora.r=true", ("model.lora.r=True", "integer >= 1")),  # its own, sharper line
])
def test_a_boolean_for_a_number_is_one_line_naming_the_key(override: str, needles: tuple[str, ...]) -> None:
    with pytest.raises(ValueError) as info:
        load_config(None, [override])
    line = str(info.value)
    assert "\n" not in line and all(n in line for n in needles), line


@pytest.mark.parametrize("override", [
    "generation.score_while_generating=true", "generation.compile_decode=false", "generation.cuda_graphs=on",
    "generation.speculation=off", "data.chat_template=false", "scaling.prewarm=no", "algorithm.scale_by_std=yes",
    "observability.tensorboard=true", "model.gradient_checkpointing=on",
    "reward.models=[{path: m, chat_template: true}]",
])
def test_settings_that_take_a_boolean_still_do(override: str) -> None:
    load_config(None, [override])


def _section_in(annotation: object, key: str) -> tuple[type[BaseModel], str] | None:
    """The section ``annotation`` holds (itself, optional, or a list's entry) and its key's prefix."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, f"{key}."
    for arg in typing.get_args(annotation):
        found = _section_in(arg, f"{key}.0" if typing.get_origin(annotation) is list else key)
        if found:
            return found
    return None


def _number_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, type[BaseModel], str]]:
    """(dotted key, section, field) of every int or float field under ``model``; a list's entry is ``.0``."""
    found = []
    for name, spec in model.model_fields.items():
        if sub := _section_in(spec.annotation, f"{prefix}{name}"):
            found += _number_fields(*sub)
        elif _numeric_kind(spec.annotation):
            found.append((f"{prefix}{name}", model, name))
    return found


def test_every_number_field_of_every_section_refuses_a_boolean() -> None:
    fields = _number_fields(CampaignConfig)
    keys = {key for key, _, _ in fields}
    assert {"steps", "algorithm.lr", "generation.temperature", "scaling.lam", "model.lora.alpha",
            "generation.vllm.gpu_memory_utilization", "faults.seed", "reward.functions.0.weight",
            "reward.models.0.max_length"} <= keys
    for key, section, name in fields:
        with pytest.raises(ValueError, match=rf"\b{name}=True\b"):
            section.model_validate({name: True})
        if key != "model.lora.r" and ".0." not in key:  # its own, sharper line; list entries: the table
            with pytest.raises(ValueError, match=rf"^{re.escape(key)}=True is not a number"):
                load_config(None, [f"{key}=true"])


def test_which_annotations_count_as_numbers() -> None:
    from typing import Annotated, Literal

    assert _numeric_kind(int) == "an integer" and _numeric_kind(float | None) == "a number"
    assert _numeric_kind(Literal["auto"] | Annotated[int, "x"] | None) == "an integer"
    assert _numeric_kind(float | Literal["auto"]) == "a number"
    for taking_bools in (bool, bool | None, Literal["auto"] | bool, int | bool, int | str, Literal[True, 3] | int):
        assert _numeric_kind(taking_bools) is None
