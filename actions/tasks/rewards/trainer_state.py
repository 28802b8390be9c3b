"""The ``trainer_state`` a reward function receives: the fields of TRL's that this loop knows.

TRL passes its ``transformers.TrainerState``. Here a small frozen object with the same
attribute names stands in (building the real one would import the training stack into the
CLI's input check). Filled:

* ``global_step``: the policy's optimizer steps completed before the batch being scored, as
  TRL's counter reads while it scores one: RL steps done x ``algorithm.optimizer_steps_per_step``
  (``epochs x num_minibatches``, TRL's ``num_iterations x steps_per_generation /
  gradient_accumulation_steps``); 0 in the first step, and the evaluation after RL step k sees
  k x that.
* ``epoch``: passes over the training prompts, as a float (``step x prompts per step /
  training prompts``), TRL's fractional epoch.
* ``max_steps``: the campaign's ``steps`` x the same factor, TRL's ``max_steps`` (optimizer
  steps), so ``global_step / max_steps`` is the share of training done, as in TRL. The start-up
  check of the plug-ins (``rewards.check_reward_functions``) passes the campaign's too.
* ``is_world_process_zero`` / ``is_local_process_zero``: True (one scoring process per shard).

Everything else of TRL's state (``log_history``, ``best_metric``, ``total_flos`` ...) is absent:
a function that reads it fails with an AttributeError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RewardTrainerState:
    global_step: int
    epoch: float
    max_steps: int
    is_world_process_zero: bool = True
    is_local_process_zero: bool = True


def make_trainer_state(*, step: int, epoch: float, max_steps: int, optimizer_steps_per_step: int
                       ) -> RewardTrainerState:
    """The state passed as ``trainer_state`` while RL step ``step`` (0-based) of ``max_steps``
    is scored, counted in TRL's optimizer steps (``optimizer_steps_per_step`` per RL step).

    >>> state = make_trainer_state(step=2, epoch=0.5, max_steps=3, optimizer_steps_per_step=2)
    >>> state.global_step, state.epoch, state.max_steps
    (4, 0.5, 6)
    """
    return RewardTrainerState(global_step=step * optimizer_steps_per_step, epoch=float(epoch),
                              max_steps=max_steps * optimizer_steps_per_step)
