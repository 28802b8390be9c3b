"""Scaling policies by name: ``scaling.policy`` is parsed here, once, into a strategy object.

A policy is a *registered strategy*: a factory under a name, taking the text after ``:`` (the
``N`` of ``fixed:N``; empty when there is none) and returning a :class:`ScalingStrategy`. The
built-ins (``cost_aware``, ``fixed``) register themselves in ``flows/planning/scaling.py``; a
user registers a plan function the same way (:func:`register_scaling_function`) or names it
as ``package.module:function``. Nothing outside this module reads the policy's text: the
planner asks the strategy for its plan (:meth:`ScalingStrategy.plan`), the cut threshold it
runs with (:meth:`ScalingStrategy.cut_threshold`) and whether its candidates are timed at the
speed measured at each fan-out (``times_fan_outs``).

A user function has the signature ``(prompt_ids, predicted, *, group_size, prompt_lengths,
policy, n_min, n_max, lam, assignment, profile, cluster, cut_threshold, prefill_tokens) ->
GenerationPlan``; its plan is validated (``GenerationPlan.validate``).

>>> import flows.planning.scaling  # the built-ins register themselves
>>> parse_scaling_policy("fixed:3").num_actors
3
>>> parse_scaling_policy("builtins:len").name
'builtins:len'

The simulator's ``static:N`` (a serverful allocation, ``flows/simulate/policies.py``) is refused
with the live ``fixed:N`` named, not imported as a module ``static``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from actions.config.quoting import clip, quote
from flows.planning.plan import ClusterSpec, GenerationPlan

FORMS = "cost_aware, fixed:N, a registered name or package.module:function"


class Settings(Protocol):
    """What a strategy reads of ``PlannerSettings`` (``flows/planning/settings.py``, which
    imports this module: the registry stays below it)."""

    n_min: int
    n_max: int
    lam: float
    assignment: str
    profile: Any
    cluster: ClusterSpec
    cut_threshold: float | None


class ScalingStrategy(Protocol):
    """How a phase's fan-out and prompt split are chosen (paper §3.5)."""

    name: str
    """The configured text (``scaling.policy``); recorded as ``GenerationPlan.policy``."""
    times_fan_outs: bool
    """Its candidates are timed per fan-out (``PlannerSettings.decode_scale_by_n`` applies)."""
    num_actors: int | None
    """A fixed fan-out, or None where the strategy chooses it."""

    def plan(self, prompt_ids: Sequence[int], predicted: Mapping[int, float], *, group_size: int,
             prompt_lengths: Mapping[int, int], settings: Settings,
             prefill_tokens: float | None) -> GenerationPlan: ...

    def cut_threshold(self, objective: str, cut_threshold: float | None) -> float | None:
        """The cut threshold a phase runs with, given ``generation.cut_threshold``."""
        ...


Factory = Callable[[str], ScalingStrategy]
_FACTORIES: dict[str, Factory] = {}


def register_scaling_policy(name: str) -> Callable[[Factory], Factory]:
    """Decorator: ``factory(arg) -> ScalingStrategy`` answers ``scaling.policy: name[:arg]``."""
    if not name or ":" in name:
        raise ValueError(f"scaling.policy name {quote(name)}: use a non-empty name without ':'")

    def add(factory: Factory) -> Factory:
        _FACTORIES[name] = factory
        return factory
    return add


def register_scaling_function(name: str, function: Callable[..., GenerationPlan]) -> None:
    """``scaling.policy: name`` plans with ``function`` (the user signature, module docstring)."""
    register_scaling_policy(name)(lambda arg: FunctionPolicy(name if not arg else f"{name}:{arg}", function))


def registered_policies() -> tuple[str, ...]:
    return tuple(sorted(_FACTORIES))


def parse_scaling_policy(text: str) -> ScalingStrategy:
    """The strategy ``text`` names; ValueError naming ``scaling.policy``, the value and the forms."""
    base, sep, arg = text.partition(":")
    if base not in _FACTORIES:  # the built-ins register when their module is imported, maybe not yet
        importlib.import_module("flows.planning.scaling")
    if base in _FACTORIES:
        return _FACTORIES[base](arg)
    if base.lower() == "static" and arg.isdigit():  # no function is named N: the simulator's policy
        raise ValueError(f"scaling.policy={quote(text)}: static:N is the simulator's serverful baseline "
                         f"(`rlhfless simulate`: N actors held for the whole phase); live, use 'fixed:{arg}' "
                         f"({arg} generation actions, each released when it finishes)")
    if sep and base and arg:
        return FunctionPolicy(text)
    raise ValueError(f"scaling.policy={quote(text)} is unknown; use {FORMS}")


@dataclass(frozen=True)
class FunctionPolicy:
    """A user's plan function: named ``package.module:function`` (imported on first use, or
    earlier by :func:`check_scaling_policy`) or registered under a name
    (:func:`register_scaling_function`)."""

    name: str
    function: Callable[..., GenerationPlan] | None = field(default=None, compare=False)
    times_fan_outs: bool = False
    num_actors: int | None = None

    def plan(self, prompt_ids: Sequence[int], predicted: Mapping[int, float], *, group_size: int,
             prompt_lengths: Mapping[int, int], settings: Settings,
             prefill_tokens: float | None) -> GenerationPlan:
        s = settings
        plan = self._load()(prompt_ids, predicted, group_size=group_size, prompt_lengths=prompt_lengths,
                            policy=self.name, n_min=s.n_min, n_max=s.n_max, lam=s.lam, assignment=s.assignment,
                            profile=s.profile, cluster=s.cluster, cut_threshold=s.cut_threshold,
                            prefill_tokens=prefill_tokens)
        if not isinstance(plan, GenerationPlan):
            raise ValueError(f"scaling.policy={quote(self.name)}: returned {type(plan).__name__}, "
                             "expected a GenerationPlan")
        try:
            plan.validate(list(prompt_ids))
        except (ValueError, TypeError) as exc:  # the user's function is at fault (TypeError: a flat assignment)
            raise ValueError(f"scaling.policy={quote(self.name)} returned an invalid plan: {exc}; "
                             "fix the function") from None
        return plan

    def cut_threshold(self, objective: str, cut_threshold: float | None) -> float | None:
        return cut_threshold

    def _load(self) -> Callable[..., Any]:
        """The plan function; ValueError naming ``scaling.policy`` where the module does not
        import (whatever its import raised: it is the user's code) or the name is no function."""
        if self.function is not None:
            return self.function
        module_name, _, func_name = self.name.partition(":")
        base = module_name.lower()
        hint = f" (did you mean {quote(f'{base}:{func_name}')}?)" if base in _FACTORIES else ""  # FIXED:3
        try:
            function = getattr(importlib.import_module(module_name), func_name)
        except Exception as exc:  # noqa: BLE001 - ImportError, AttributeError, or the module's own failure
            raise ValueError(f"scaling.policy={quote(self.name)}: cannot import ({type(exc).__name__}: {clip(exc)})"
                             f"{hint}; use {FORMS}") from None
        if not callable(function):
            raise ValueError(f"scaling.policy={quote(self.name)}: {clip(func_name)} is a {type(function).__name__}, "
                             f"not a function; name a plan function ({FORMS})")
        return function


def check_scaling_policy(strategy: ScalingStrategy) -> None:
    """Import a user's plan function now (a campaign's preflight), so a typo is refused before
    anything is written rather than when the first phase is planned; built-ins pass."""
    if isinstance(strategy, FunctionPolicy):
        strategy._load()
