"""Warnings for a campaign that runs but cannot learn: pure checks over the committed steps'
metrics, printed on the progress output as they first hold and listed in ``summary.json``.

* ``zero_reward_std``: every group had one reward (``reward/frac_uniform_groups`` = 1.0, so every
  GRPO advantage is 0, whatever ``algorithm.std_scope``; a step recorded without it is read by
  ``frac_reward_zero_std``) for ``ZERO_STD_STEPS`` steps in a row, or for every step of a campaign
  shorter than that. GRPO only (``GROUP_RELATIVE``): PPO's advantages come from its critic's
  baseline and the per-token KL reward, not from a group's spread, so one reward per group
  (always so with ``group_size: 1``) leaves it something to learn; a PPO update that changes
  nothing still raises ``zero_grad_norm``.
* ``zero_grad_norm``: a step's gradient norm was 0 (the update changed nothing). Where every
  completion was cut at the length limit (``response_length/clip_ratio`` = 1.0) and
  ``algorithm.mask_truncated`` is on, its line names those two settings: the loss counted no token.
* ``nonfinite_update``: a step's ``grad_norm`` or a ``loss/*`` was NaN or infinite, or it
  skipped optimizer steps for it (``train/skipped_nonfinite``, ``actions/rl/update.py``): the
  update diverged (on OpenWhisk such values travel as the strings ``"NaN"``/``"Infinity"`` and
  are read back as floats, ``actions/runtime/server.py: encode_reply``). Its line names the
  counter that is not 0: the policy's, or, where only PPO's critic diverged (``loss/value``,
  ``train/critic_skipped_nonfinite``), the critic's, whose value loss the rewards' scale drives.
* ``no_reward``: no reward function or model applied to any completion of a step (every reward
  None, ``frac_reward_none`` = 1.0).
* ``truncated``: at least ``TRUNCATED_SHARE`` of the completions were cut at
  ``generation.max_new_tokens`` (``response_length/clip_ratio``) for ``TRUNCATED_STEPS`` steps in
  a row, or every step of a shorter campaign: the rewards then judge unfinished answers, and a
  limit too short for the task leaves a run that rewards nothing (a 256-token default that cut
  97-99% of completions is a known way to learn nothing).
* ``reward_model_truncated``: a reward model (``reward.models[i]``) cut at least
  ``TRUNCATED_SHARE`` of the (prompt, completion) pairs it scored to its ``max_length``
  (``reward_fn/reward_model/<i>/truncated_frac``), for ``TRUNCATED_STEPS`` steps in a row or
  every step of a shorter campaign: it keeps their last tokens, so it scored answers without
  the beginning of their prompts (a question's statement, a system prompt).

Each kind is reported once, after the step at which it first holds, with its first step (a
run's first, for a kind that must hold steps in a row) and the number of steps it held.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

SKIPPED_STEPS = ("train/skipped_nonfinite", "train/critic_skipped_nonfinite")
"""The learner's counts of optimizer steps skipped for a non-finite gradient (``actions/rl/update.py``):
the policy's, then PPO's critic's."""
CRITIC_LOSS = "loss/value"
"""PPO's critic loss: the one ``loss/*`` of the critic's update, not the policy's."""
ZERO_STD_STEPS = 3
"""Consecutive steps of all-zero reward spread before ``zero_reward_std`` is raised."""
TRUNCATED_SHARE = 0.5
"""Share of a step's completions cut at ``generation.max_new_tokens`` from which ``truncated`` counts the step."""
TRUNCATED_STEPS = 3
"""Consecutive steps with ``TRUNCATED_SHARE`` or more cut before ``truncated`` is raised."""
CLIP_RATIO = "response_length/clip_ratio"
"""A step's share of completions that stopped at the length limit (``actions/rl/batch.py``)."""
UNIFORM_GROUPS = ("reward/frac_uniform_groups", "frac_reward_zero_std")
"""A step's share of groups whose rewards were all equal (``actions/rl/batch.py``), then the figure
that held it before it was recorded (TRL's, which is it with ``algorithm.std_scope: group``)."""
REWARD_MODEL_CUT = re.compile(r"^reward_fn/reward_model/(\d+)/truncated_frac$")
"""A reward model's share of the step's pairs cut to its ``max_length`` (``flows/step/metrics.py``)."""
GROUP_RELATIVE = ("grpo",)
"""Algorithms (``algorithm.name``) whose advantage is a reward's spread within its group: the
ones ``zero_reward_std`` applies to."""

_MASK_FIX = "; or set algorithm.mask_truncated: true to leave them out of the loss"
"""``truncated``'s last fix, which a run that has the setting is not given."""

_FIX = {
    "zero_reward_std": "every completion of a prompt earned the same reward, so there is nothing to learn from; "
                       "check the reward functions on real completions, raise algorithm.group_size, "
                       "generation.temperature or generation.max_new_tokens",
    "zero_grad_norm": f"the update changed nothing; check the rewards' spread ({UNIFORM_GROUPS[0]}) and algorithm.lr",
    "nonfinite_update": "the update diverged (grad_norm or a loss NaN or infinite); its optimizer steps were skipped "
                        "(train/skipped_nonfinite), so the policy did not learn from them: lower algorithm.lr or "
                        "algorithm.max_grad_norm and check the rewards for extreme values",
    "no_reward": "no reward function applied to any completion (each returned None); check that the functions "
                 "read the dataset's columns and the completions' format",
    "truncated": f"at least {TRUNCATED_SHARE:.0%} of the completions were cut at generation.max_new_tokens "
                 f"({CLIP_RATIO}), so the rewards judge unfinished answers; raise generation.max_new_tokens, "
                 "check that the model ends its answers with its EOS token" + _MASK_FIX,
    "reward_model_truncated": f"reward model(s) {{models}} cut at least {TRUNCATED_SHARE:.0%} of the (prompt, "
                              "completion) pairs they scored to their max_length "
                              "(reward_fn/reward_model/<i>/truncated_frac), keeping the last tokens, so they scored "
                              "answers without the beginning of their prompts; raise reward.models[i].max_length "
                              "(up to what the model takes) or shorten the prompts (data.max_prompt_tokens)",
}


_ALL_MASKED_FIX = (f"every completion was cut at generation.max_new_tokens ({CLIP_RATIO} 1.0) and "
                   "algorithm.mask_truncated: true leaves each of them out of the loss, so no token was learned "
                   "from; raise generation.max_new_tokens (or check that the model ends its answers with its EOS "
                   "token), or set algorithm.mask_truncated: false")
"""``zero_grad_norm``'s fix where ``mask_truncated`` masked every completion of the step."""

_CRITIC_FIX = ("the critic's update diverged (loss/value NaN or infinite); its optimizer steps were skipped "
               "(train/critic_skipped_nonfinite), so its value baseline did not learn from them (the policy's steps "
               "were taken): check the rewards' scale, which the critic regresses (rewards of extreme size overflow "
               "its value loss; keep them moderate, e.g. within +-1e6), or lower algorithm.critic_lr")
"""``nonfinite_update``'s fix where only PPO's critic diverged."""


def _window(kind: str, total: int) -> int:
    """The steps in a row ``kind`` must hold at to be raised (1: at any one step)."""
    windows = {"truncated": TRUNCATED_STEPS, "reward_model_truncated": TRUNCATED_STEPS,
               "zero_reward_std": ZERO_STD_STEPS}
    return min(windows.get(kind, 1), total)


def _holds(kind: str, steps: Sequence[Mapping[str, Any]], i: int, total: int, algorithm: str) -> bool:
    """Does ``kind`` hold after step ``i + 1`` (``steps[:i + 1]`` committed, ``total`` planned)
    of a run of ``algorithm``?"""
    m = steps[i]
    if kind == "zero_grad_norm":
        return "grad_norm" in m and m["grad_norm"] == 0.0
    if kind == "nonfinite_update":
        return any(_diverged(m))
    if kind == "no_reward":
        return m.get("frac_reward_none", 0.0) >= 1.0
    if kind == "truncated":
        return _in_a_row(steps, i, _window(kind, total), lambda s: s.get(CLIP_RATIO, 0.0) >= TRUNCATED_SHARE)
    if kind == "reward_model_truncated":
        return _in_a_row(steps, i, _window(kind, total), lambda s: bool(_cut_models(s)))
    if algorithm not in GROUP_RELATIVE:
        return False
    return _in_a_row(steps, i, _window(kind, total), lambda s: _uniform_groups(s) >= 1.0)


def _uniform_groups(m: Mapping[str, Any]) -> float:
    """The share of groups of one reward at the step of metrics ``m`` (``UNIFORM_GROUPS``; 0.0 unrecorded)."""
    return next((float(m[k]) for k in UNIFORM_GROUPS if k in m), 0.0)


def _in_a_row(steps: Sequence[Mapping[str, Any]], i: int, window: int,
              holds: Callable[[Mapping[str, Any]], bool]) -> bool:
    """Whether ``holds`` is true of each of the ``window`` steps ending at step ``i + 1``."""
    recent = steps[max(0, i + 1 - window):i + 1]
    return len(recent) == window and all(holds(s) for s in recent)


def _cut_models(m: Mapping[str, Any]) -> list[int]:
    """The reward models (``reward.models`` indices) that cut ``TRUNCATED_SHARE`` or more of the
    pairs at the step of metrics ``m``."""
    return sorted(int(found[1]) for k, v in m.items()
                  if (found := REWARD_MODEL_CUT.match(k)) and isinstance(v, (int, float)) and v >= TRUNCATED_SHARE)


def _diverged(m: Mapping[str, Any]) -> tuple[bool, bool]:
    """(did the policy's update diverge, did the critic's) at the step of metrics ``m``."""
    def nonfinite(k: str) -> bool:
        return isinstance(m.get(k), float) and not math.isfinite(m[k])

    policy = any(nonfinite(k) for k in m if k == "grad_norm" or (k.startswith("loss") and k != CRITIC_LOSS))
    return (policy or m.get(SKIPPED_STEPS[0], 0.0) > 0,
            nonfinite(CRITIC_LOSS) or m.get(SKIPPED_STEPS[1], 0.0) > 0)


def _message(kind: str, recent: Sequence[Mapping[str, Any]], mask_truncated: bool = False) -> str:
    """The fix ``kind``'s line gives where it is raised, ``recent`` the metrics of the steps in
    the window that raised it (the last: that step's): the critic's wording of
    ``nonfinite_update`` where only the critic diverged, naming the counter that is not 0;
    ``truncated``'s without the setting a run with ``mask_truncated`` has already;
    ``zero_grad_norm``'s naming the length limit and ``mask_truncated`` where that masked every
    completion of the step;
    ``reward_model_truncated``'s naming each model that cut in the window."""
    if kind == "truncated" and mask_truncated:
        return _FIX[kind].replace(_MASK_FIX, " (algorithm.mask_truncated leaves them out of the loss already)")
    if kind == "zero_grad_norm" and mask_truncated and recent[-1].get(CLIP_RATIO, 0.0) >= 1.0:
        return _ALL_MASKED_FIX
    if kind == "reward_model_truncated":
        return _FIX[kind].format(models=", ".join(map(str, sorted({i for m in recent for i in _cut_models(m)}))))
    if kind != "nonfinite_update":
        return _FIX[kind]
    policy, critic = _diverged(recent[-1])
    if not policy:
        return _CRITIC_FIX
    return _FIX[kind] + ("; the critic's steps were skipped too (train/critic_skipped_nonfinite)" if critic else "")


@dataclass
class LearningWarning:
    kind: str
    step: int
    """The step (1-based) at which it first held: for a kind that must hold some steps in a row
    (``truncated``, ``reward_model_truncated``, ``zero_reward_std``), the first of those steps."""
    steps: int
    """How many steps it held at (such a kind's: in the runs long enough to raise it)."""
    message: str
    """The progress line, printed after the step that raised it (``raised``)."""
    raised: int = 0
    """The step after which it was raised: ``step`` plus its run's length less one."""


def find_warnings(steps: Sequence[Mapping[str, Any]], total: int, algorithm: str = "grpo",
                  mask_truncated: bool = False) -> list[LearningWarning]:
    """One warning per kind that held over ``steps`` (``total`` planned) of a run of
    ``algorithm`` (``algorithm.name``; ``mask_truncated``: its ``algorithm.mask_truncated``), in
    the order they first held."""
    found: dict[str, LearningWarning] = {}
    for i in range(len(steps)):
        for kind in _FIX:
            if not _holds(kind, steps, i, total, algorithm):
                continue
            # a run that just became long enough brings its earlier steps, which counted for none
            window = _window(kind, total)
            new = window if i == 0 or not _holds(kind, steps, i - 1, total, algorithm) else 1
            if kind in found:
                found[kind].steps += new
            else:
                found[kind] = LearningWarning(kind, i + 2 - window, window,
                                              f"warning: step {i + 1}: {kind}: "
                                              f"{_message(kind, steps[i + 1 - window:i + 1], mask_truncated)}",
                                              raised=i + 1)
    return sorted(found.values(), key=lambda w: (w.step, w.kind))


def learning_warnings(steps: Sequence[Mapping[str, Any]], total: int, algorithm: str = "grpo",
                      mask_truncated: bool = False) -> list[dict[str, Any]]:
    """``find_warnings`` as JSON for ``summary.json``: ``kind``, ``step``, ``steps``, ``message``."""
    return [{k: v for k, v in asdict(w).items() if k != "raised"}
            for w in find_warnings(steps, total, algorithm, mask_truncated)]


def new_warning_lines(steps: Sequence[Mapping[str, Any]], total: int, algorithm: str = "grpo",
                      mask_truncated: bool = False) -> list[str]:
    """The warnings that first hold at the last step: what the progress output prints after it."""
    return [w.message for w in find_warnings(steps, total, algorithm, mask_truncated) if w.raised == len(steps)]
