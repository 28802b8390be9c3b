"""A refused resume's differing settings, as the user sets them.

A run's identity (``CampaignConfig.identity``) is a fingerprint's input, not the configuration:
it leaves out settings at their defaults (``algorithm.loss_agg``, ``generation.top_k``,
``reward.models[i].label``...) and records PPO's ``algorithm.kl_kind`` as runs from before its
estimators did (``k3`` for k1, ``ppo-k2`` for k2). A refusal that quoted those values would ask
for ``--set algorithm.loss_agg=null``, which the configuration refuses. :func:`as_set` turns each
differing setting back into what ``--set KEY=VALUE`` takes: a key an identity lacks is its
default, PPO's estimator its own name.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined, to_jsonable_python

from actions.config.section import section_of
from flows.config import CampaignConfig

_MISSING = object()
_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def as_set(differing: list[tuple[str, Any, Any]], run: dict[str, Any], now: dict[str, Any]
           ) -> list[tuple[str, Any, Any]]:
    """(dotted key, the run's value, the value now) of each of ``differing`` (``differing_values``
    of the identities ``run`` and ``now``), the values as the configuration takes them. A section
    one identity lacks and the other holds in part (``generation.vllm``) is shown key by key; one
    whose default is None (``model.lora``: off) whole.

    >>> as_set([("algorithm.loss_agg", None, "seq_mean_token_mean")], {"algorithm": {"name": "grpo"}},
    ...        {"algorithm": {"name": "grpo", "loss_agg": "seq_mean_token_mean"}})
    [('algorithm.loss_agg', 'token_mean', 'seq_mean_token_mean')]
    >>> as_set([("algorithm.kl_kind", "k3", "ppo-k2")], {"algorithm": {"name": "ppo", "kl_kind": "k3"}},
    ...        {"algorithm": {"name": "ppo", "kl_kind": "ppo-k2"}})
    [('algorithm.kl_kind', 'k1', 'k2')]
    """
    out = []
    for key, _, _ in differing:
        a, b = _at(run, key), _at(now, key)
        if (a is _MISSING) != (b is _MISSING) and isinstance(a if b is _MISSING else b, dict) \
                and isinstance(default_of(key), dict):  # a section with defaults, not one that is off (model.lora)
            present = a if b is _MISSING else b
            keys = [f"{key}.{k}" for k in present]
        else:
            keys = [key]
        entries = [(k, _value(run, k), _value(now, k)) for k in keys]
        out += [e for e in entries if e[1] != e[2]] or [(key, _value(run, key), _value(now, key))]
    return out


def _value(identity: dict[str, Any], key: str) -> Any:
    value = _at(identity, key)
    if value is _MISSING:
        value = default_of(key)
    algorithm = identity.get("algorithm")
    if key == "algorithm.kl_kind" and isinstance(algorithm, dict) and algorithm.get("name") == "ppo" \
            and isinstance(value, str):
        value = "k1" if value == "k3" else value.removeprefix("ppo-")  # as CampaignConfig.identity records them
    return value


def _parts(key: str) -> list[str | int]:
    return [name if name else int(index) for name, index in _PART.findall(key)]


def _at(identity: Any, key: str) -> Any:
    """The value at dotted ``key`` (``reward.models[0].label``) of ``identity``; ``_MISSING`` if absent."""
    value = identity
    for part in _parts(key):
        if isinstance(part, int) and isinstance(value, list) and part < len(value):
            value = value[part]
        elif isinstance(part, str) and isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return _MISSING
    return value


def default_of(key: str) -> Any:
    """The declared default of the setting at dotted ``key`` (JSON values, a section as a dict);
    None where ``key`` names no setting with a default.

    >>> default_of("algorithm.std_scope"), default_of("reward.models[0].label"), default_of("model.lora")
    ('group', None, None)
    """
    model: type[BaseModel] | None = CampaignConfig
    default: Any = None
    for part in _parts(key):
        if isinstance(part, int):
            continue  # an entry of a list of sections: the entry's own fields follow
        info = model.model_fields.get(part) if model is not None else None
        if info is None:
            return None
        default = (info.default_factory() if info.default_factory is not None  # type: ignore[call-arg]
                   else None if info.default is PydanticUndefined else info.default)
        model = section_of(info.annotation)[0]
    return to_jsonable_python(default)
