"""The checks a campaign's configuration passes before anything is written: the planner's
profile and scaling policy, its inputs, the generation engine, the learner's world size, the
experiment trackers, the store's and the worker logs' directories, the invoker and the GPU
limit's size.

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
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flows.config import CampaignConfig

_CHECKED: dict[str, int] = {}  # config JSON -> open ``checked`` blocks
_LOCK = threading.Lock()


def check_campaign(cfg: CampaignConfig, *, resumed: bool = False) -> None:
    """Refuse a configuration the campaign would fail on after writing the store; nothing when
    this exact configuration was checked for the block this call runs in (:func:`checked`).
    Imports neither Prefect (but to read a named GPU limit, :func:`check_gpu_limit`) nor torch
    (but for a new run's reward models, ``validate_inputs``).
    ``resumed``: the store holds a committed step of the run, so its inputs are stored already
    (the reward models' folders are not read: ``flows/campaign/reward_copies.py``).

    Raises:
        ValueError: one line naming the field, the value and the fix (``check_planning``,
            ``validate_inputs``, ``check_engine``, ``check_world_size`` (on OpenWhisk in
            ``check_invoker``: ``check_train_ranks``), ``check_trackers``, :func:`check_store_directory`,
            :func:`check_directory` of ``invoker.log_dir``, ``check_invoker``, :func:`check_gpu_limit`).
    """
    with _LOCK:
        if _CHECKED.get(cfg.model_dump_json()):
            return
    from actions.engines.preflight import check_engine
    from actions.prepare import validate_inputs

    check_planning(cfg)
    validate_inputs(cfg, steps=cfg.steps, resumed=resumed)
    local = cfg.invoker.kind != "openwhisk"  # an OpenWhisk action checks on the machine it runs on
    check_engine(cfg, local_actions=local)
    if local:  # on OpenWhisk check_invoker compares the ranks with the deployed action's GPUs
        from actions.rl.world_size import check_world_size

        check_world_size(cfg.train.world_size, cfg.scaling.gpus_per_actor, num_cores=cfg.invoker.num_cores)
    from flows.campaign.trackers import check_trackers
    from flows.invokers.factory import check_invoker, worker_log_dir

    check_trackers(cfg)
    check_store_directory(cfg.store.uri)
    if cfg.invoker.kind != "inprocess":  # the local pool's worker logs; on OpenWhisk, prepare's child
        check_directory(worker_log_dir(cfg), "invoker.log_dir")
    check_invoker(cfg)
    check_gpu_limit(cfg)


def check_gpu_limit(cfg: CampaignConfig) -> None:
    """Refuse ``scaling.gpus_per_actor`` above the size of the Prefect GPU limit
    ``invoker.gpu_concurrency_limit`` names: every GPU action asks for that many slots, and the
    server refuses a request beyond the limit (422) at the first one, after set-up wrote the
    store. One request to the Prefect API, only where a limit is named; a limit the server does
    not know, a disabled one or a server that does not answer is the campaign's to skip
    (``flows/step/invoke.py: gpu_slots``), not refused here.

    Raises:
        ValueError: naming both settings, the limit's size and the fix.
    """
    name = cfg.invoker.gpu_concurrency_limit
    if name is None:
        return
    try:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            limit = client.read_global_concurrency_limit_by_name(name)
    except Exception:  # unknown name, no server: gpu_slots warns and runs without the limit
        return
    if limit.active and limit.limit < cfg.scaling.gpus_per_actor:
        raise ValueError(f"scaling.gpus_per_actor={cfg.scaling.gpus_per_actor} is above the {limit.limit} slots of "
                         f"the Prefect GPU limit invoker.gpu_concurrency_limit={name!r}, which every GPU action asks "
                         f"that many of; raise the limit (prefect gcl update {name} --limit "
                         f"{cfg.scaling.gpus_per_actor}) or lower scaling.gpus_per_actor")


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


PSEUDO_FILESYSTEMS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore",
                                "bpf", "configfs", "efivarfs", "fusectl", "binfmt_misc", "nsfs"})
"""Kernel filesystems no directory can be made in, whatever the permissions say (root's
``access(W_OK)`` on ``/proc`` is true, yet ``mkdir /proc/x`` fails)."""


def check_store_directory(uri: str) -> None:
    """Refuse a local store (``store.uri`` a directory path) the campaign could not write:
    :func:`check_directory` of its directory. An S3 store's bucket is checked when it is opened.

    Raises:
        ValueError: naming ``store.uri``, the path and the fix.
    """
    from actions.store.uri import local_path

    path = local_path(uri)
    if path is not None:
        check_directory(Path(path).expanduser(), "store.uri")


def check_directory(path: Path, setting: str, file: Path | None = None) -> None:
    """Refuse, in one line naming ``setting``, a directory the campaign could not write its
    files into: ``path`` is a file, an existing directory this process cannot write to, or a
    missing one that could not be made (``mkdir -p``), because its nearest existing ancestor is
    a file, is not writable (permissions, a read-only mount), or lies on a kernel
    pseudo-filesystem (``PSEUDO_FILESYSTEMS``: ``/proc``, ``/sys``). Creates nothing. ``file``:
    the setting names this file and ``path`` is its folder (``--summary``); the line quotes
    the file as given and asks for a file path.

    Raises:
        ValueError: naming ``setting``, ``path`` (or ``file`` and its folder) and the fix.
    """
    shown = f"{setting} {str(path)!r}" if file is None else f"{setting} {str(file)!r}: its folder {str(path)!r}"
    wanted = "a directory path" if file is None else "a file path in a directory"
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{shown} is a file, not a directory; pass {wanted}")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{shown} is a directory this process cannot write to; "
                             f"pass {'one it can' if file is None else 'a file path in one it can'}")
        return
    ancestor = path.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        why = "is a file, not a directory"
    elif not os.access(ancestor, os.W_OK | os.X_OK):
        why = "is not writable by this process"
    elif kind := _pseudo_fs(ancestor):
        why = f"is on the kernel's {kind} filesystem, which holds no files"
    else:
        return
    where = "a directory path that exists" if file is None else "a file path whose folder exists"
    raise ValueError(f"{shown} cannot be created: {str(ancestor)!r} {why}; pass {where} or can be created")


def _pseudo_fs(path: Path) -> str | None:
    """The type of the filesystem mounted at ``path`` or above it, if one of
    ``PSEUDO_FILESYSTEMS`` (Linux's mount table; None elsewhere)."""
    try:
        table = Path("/proc/self/mounts").read_text()
    except OSError:
        return None
    real, found = os.path.realpath(path), ("", "")
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        # the table escapes a space, tab, newline or backslash in a mount point as \ooo
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(found[0]):  # the deepest; a later mount on it hides earlier ones
            found = (mount, fields[2])
    return found[1] if found[1] in PSEUDO_FILESYSTEMS else None


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
