"""Run the doctest examples of the reward functions."""

import doctest

import actions.tasks.repeat


def test_reward_function_doctests():
    result = doctest.testmod(actions.tasks.repeat)
    assert result.attempted > 0 and result.failed == 0
