"""The ``trainer_state`` a reward function receives: the fields of TRL's that this loop knows.

TRL passes its ``transformers.TrainerState``. Here a small frozen object with the same
attribute names stands in (building the real one would import the training stack into the
CLI's input check). Filled:

* ``global_step``: RL steps completed before the one being scored (0 in the first step; the
  evaluation after step k sees k), as TRL's counter reads while it scores a batch.
* ``epoch``: passes over the training prompts, as a float (``step x prompts per step /
  training prompts``), TRL's fractional epoch.
* ``max_steps``: the campaign's ``steps``.
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


def make_trainer_state(*, step: int, epoch: float, max_steps: int) -> RewardTrainerState:
    """The state passed as ``trainer_state`` while step ``step`` (0-based) is scored."""
    return RewardTrainerState(global_step=step, epoch=float(epoch), max_steps=max_steps)
