"""The prompts each step trains on (``flows/campaign/schedule.py``): resumable, so fixed forever."""

import random

import pytest

from flows.campaign.schedule import epoch_order, step_prompts


def _by_definition(prompt_ids, per_step, step, seed):
    """The module docstring read literally: the endless sequence of one seeded permutation per
    epoch, consumed ``per_step`` at a time, skipping a prompt the step already holds."""
    n, out, pos = len(prompt_ids), [], step * per_step
    while len(out) < per_step:
        e, i = divmod(pos, n)
        order = sorted(prompt_ids)
        random.Random(seed * 7_919 + e).shuffle(order)
        if order[i] not in out:
            out.append(order[i])
        pos += 1
    return (step * per_step) // n, out


@pytest.mark.parametrize("n,per_step", [(10, 3), (7, 7), (12, 5), (5, 1), (64, 16)])
def test_every_step_takes_the_prompts_the_definition_gives(n, per_step):
    ids = random.Random(n).sample(range(1000), n)  # ids need not be contiguous or sorted
    for step in range(3 * n):
        assert step_prompts(ids, per_step, step, seed=3) == _by_definition(ids, per_step, step, 3)


def test_the_sequence_is_pinned_so_existing_runs_resume_onto_the_same_prompts():
    assert epoch_order(range(8), 0, 0) == [4, 1, 5, 2, 0, 3, 7, 6]
    assert step_prompts(list(range(10)), 4, 2, seed=1) == (0, [2, 7, 4, 6])
    assert step_prompts(list(range(10)), 4, 3, seed=1) == (1, [9, 8, 0, 5])


def test_a_step_across_an_epoch_boundary_repeats_no_prompt():
    for step in range(40):
        epoch, ids = step_prompts(list(range(7)), 5, step, seed=0)
        assert len(set(ids)) == 5 and epoch == step * 5 // 7


def test_per_step_must_fit_the_dataset():
    with pytest.raises(ValueError, match="per_step=4 must be in 1..3"):
        step_prompts([1, 2, 3], 4, 0, seed=0)
