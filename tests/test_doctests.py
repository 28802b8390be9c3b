"""Run the doctest examples of the tasks, the data mapping, the reward functions, the scaling
policies' registry, the phase clock, the decode-step timing, the leftovers garbage collection
removes, the redaction of secrets (URL passwords included) from messages, and the command
that continues a run (with the budget figure it asks for after a budget stop), a refused resume's
values as the user sets them, and the metrics table's blank for a metric a step lacks."""

import doctest
import importlib

import pytest

MODULES = ["actions.tasks.repeat", "actions.tasks.arith", "actions.tasks.fields", "actions.tasks.rewards.numeric",
           "actions.tasks.rewards.gsm8k", "actions.tasks.rewards.text", "actions.tasks.rewards.exact_match",
           "actions.tasks.rewards.format", "actions.tasks.rewards.symbolic", "flows.planning.registry",
           "flows.step.timing", "flows.step.metrics",
           "actions.engines.decode_timing", "actions.models.hub", "flows.planning.leftovers",
           "actions.store.credentials", "actions.store.endpoints", "actions.config.quoting",
           "flows.commands.resume_command", "flows.campaign.resume_values", "flows.campaign.artifacts"]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
