"""The checks a campaign's configuration passes before anything is written: the planner's
profile and scaling policy, its inputs, the generation engine, the learner's world size, the
experiment trackers and the invoker.

One list for both ways in. ``rlhfless train`` runs it before Prefect starts, so a refusal is
one line and exit code 2 (``flows/commands/cli.py``); the flow ``rlhf_campaign`` runs it again
before it takes the lease or sets anything up, so a deployment run (or any direct call) with
the same config fails with the same ``ValueError`` and an untouched store. Pydantic's
validation of ``CampaignConfig`` comes first in both; these are the checks that need the files,
the environment or the controller the config names.

Every check only reads. Their cost (default config: 10-30 ms, most of it reading the datasets;
OpenWhisk: one request to the controller; a tracker: importing its library, and one request to
an MLflow server) is not paid twice for one ``train``: the CLI marks
the config it checked (:func:`checked`) for the flow it starts in the same process.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flows.config import CampaignConfig

_CHECKED: dict[str, int] = {}  # config JSON -> open ``checked`` blocks
_LOCK = threading.Lock()


def check_campaign(cfg: CampaignConfig) -> None:
    """Refuse a configuration the campaign would fail on after writing the store; nothing when
    this exact configuration was checked for the block this call runs in (:func:`checked`).
    Imports neither Prefect nor torch.

    Raises:
        ValueError: one line naming the field, the value and the fix (``check_planning``,
            ``validate_inputs``, ``check_engine``, ``check_world_size``, ``check_trackers``,
            ``check_invoker``).
    """
    with _LOCK:
        if _CHECKED.get(cfg.model_dump_json()):
            return
    from actions.engines.preflight import check_engine
    from actions.prepare import validate_inputs

    check_planning(cfg)
    validate_inputs(cfg, steps=cfg.steps)
    local = cfg.invoker.kind != "openwhisk"  # an OpenWhisk action checks on the machine it runs on
    check_engine(cfg, local_actions=local)
    if local:
        from actions.rl.world_size import check_world_size

        check_world_size(cfg.train.world_size, cfg.scaling.gpus_per_actor)
    from flows.campaign.trackers import check_trackers
    from flows.invokers.factory import check_invoker

    check_trackers(cfg)
    check_invoker(cfg)


def check_planning(cfg: CampaignConfig) -> None:
    """The planner's inputs the campaign would otherwise first read after writing the store:
    ``scaling.profile`` loads as a profile (``TpotProfile.load``), and a ``scaling.policy``
    naming a plan function (``package.module:function``) imports, and that name is a function
    (``registry.check_scaling_policy``). Imports the user's module, as the planner would."""
    from flows.planning.registry import check_scaling_policy
    from flows.planning.tpot import TpotProfile

    if cfg.scaling.profile:
        TpotProfile.load(cfg.scaling.profile, "scaling.profile")
    check_scaling_policy(cfg.scaling.strategy)


@contextlib.contextmanager
def checked(cfg: CampaignConfig) -> Iterator[None]:
    """Inside the block, :func:`check_campaign` of a configuration equal to ``cfg`` (the flow's
    copy of it, validated again from its JSON) returns at once: the caller has just checked
    it. Only for the block, so a later campaign in the same process is checked again."""
    key = cfg.model_dump_json()
    with _LOCK:
        _CHECKED[key] = _CHECKED.get(key, 0) + 1
    try:
        yield
    finally:
        with _LOCK:
            _CHECKED[key] -= 1
            if not _CHECKED[key]:
                del _CHECKED[key]
