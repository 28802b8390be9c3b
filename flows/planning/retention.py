"""Which of a run's objects a garbage collection keeps and which it deletes (pure planning).

A run's layout (``flows/step/payloads.py``, ``flows/campaign/run.py``)::

    runs/<run>/steps/<d:06d>/...    written while step d runs; commit d+1 names its outputs
    runs/<run>/...                  everything else: set-up, reference, evaluations, commits

Commit ``c`` (``flows/campaign/state.py``) names the manifests of policy version ``c``: its weights
(policy, critic) and what resuming from it needs (optimizer and critic-optimizer state), plus
the set-up artifacts every commit shares. After commit ``S``, with ``keep_last = K`` and
``checkpoint_every = E``:

* the window ``S-K+1 .. S`` keeps its versions' weights and its step directories whole, except
  the optimizer state of versions other than ``S`` and ``S-1``;
* commit ``S-1`` is kept whole (weights and optimizer state) whatever ``K``: a crash that loses
  the newest commit record (a local disk that had not flushed it, a restore from a backup
  taken between two commits) leaves a run that resumes from ``S-1``;
* checkpoints (``c % E == 0``, and every version committed as a checkpoint under an earlier
  setting or pinned by an earlier ``rlhfless gc``: a later ``rlhfless gc`` or resume with other
  settings never drops them) keep weights and optimizer state, not their rollouts;
* step directories ``d >= S`` belong to the step in flight (or a crashed attempt at it) and
  are never touched; nothing outside ``steps/`` is ever deleted;
* every other object under ``steps/`` is garbage.

Blobs are decided by the executor (``flows/campaign/collect.py``): a blob goes only if a garbage manifest
lists it and no kept manifest anywhere in the store does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_STEP_DIR = re.compile(r"^steps/(\d{6})/")


@dataclass(frozen=True)
class Retention:
    """``keep_last``: versions kept (None: all, no collection); ``checkpoint_every``: every
    version that is a multiple of it is kept for good (0: none); ``pinned``: versions kept for
    good whatever ``checkpoint_every`` says now (the run's checkpoints, as committed:
    ``CampaignState.checkpoints``, and as ``rlhfless gc`` pinned them: ``flows/campaign/pins.py``)."""

    keep_last: int | None
    checkpoint_every: int = 0
    pinned: frozenset[int] = frozenset()

    def window(self, latest: int) -> range:
        """Commits in the keep window after commit ``latest``."""
        if self.keep_last is None:
            return range(0, latest + 1)
        return range(max(0, latest - self.keep_last + 1), latest + 1)

    def checkpoints(self, latest: int) -> list[int]:
        """The checkpoints among commits ``0 .. latest``, ascending."""
        every = range(self.checkpoint_every, latest + 1, self.checkpoint_every) if self.checkpoint_every > 0 else ()
        return sorted(set(every) | {c for c in self.pinned if 0 <= c <= latest})


@dataclass(frozen=True)
class VersionKeys:
    """The manifests commit ``step`` names: ``weights`` (policy, critic), ``resume``
    (optimizer states) and ``shared`` (reference, set-up: the same in every commit)."""

    step: int
    weights: tuple[str, ...]
    resume: tuple[str, ...]
    shared: tuple[str, ...] = ()


@dataclass(frozen=True)
class GcPlan:
    """``keep``: the manifests kept because a kept commit names them; ``delete``: run keys
    (manifests and plain objects) that are garbage, sorted; ``versions``: kept version numbers."""

    keep: frozenset[str]
    delete: tuple[str, ...]
    versions: tuple[int, ...]

    @property
    def delete_manifests(self) -> tuple[str, ...]:
        return tuple(k for k in self.delete if k.endswith("manifest.json"))


def resumable(latest: int) -> set[int]:
    """Commits a resume may start from: the newest and the one before it."""
    return {c for c in (latest, latest - 1) if c >= 0}


def needed_commits(latest: int, retention: Retention) -> list[int]:
    """Commits whose records the planner needs: the window, the checkpoints and the previous commit."""
    return sorted(set(retention.window(latest)) | set(retention.checkpoints(latest)) | resumable(latest))


def _held(run_prefix: str, keys: list[str], versions: Mapping[int, VersionKeys], candidates: set[int]) -> set[int]:
    """The versions among ``candidates`` the store still holds (0, the initial one, always): an
    earlier collection may have deleted one a retention now names. Held: its weights' manifests
    are listed, or, without its commit record, its step directory is."""
    listed, base = set(keys), run_prefix.rstrip("/") + "/"
    dirs = {int(m.group(1)) + 1 for k in keys if k.startswith(base) and (m := _STEP_DIR.match(k[len(base):]))}
    return {0} | {c for c in candidates
                  if (listed.issuperset(versions[c].weights) if c in versions and versions[c].weights else c in dirs)}


def plan_collection(run_prefix: str, latest: int, versions: Mapping[int, VersionKeys], keys: Iterable[str],
                    retention: Retention) -> GcPlan:
    """Decide which of a run's ``keys`` are garbage after commit ``latest``.

    Args:
        run_prefix: ``runs/<run>``; keys outside it are ignored.
        latest: the newest committed step.
        versions: the commits of :func:`needed_commits` (a missing one keeps nothing extra).
        keys: every key under ``run_prefix`` (a listing).
        retention: the policy.

    Returns:
        The plan; with ``keep_last=None`` nothing is deleted.

    Example (K=1, no checkpoints: after commit 3, commit 2 (step directory 000001) is kept for a
    resume and commit 1's step directory 000000 is garbage)::

        >>> v = {3: VersionKeys(3, ("runs/r/steps/000002/train/policy/manifest.json",),
        ...                     ("runs/r/steps/000002/train/optimizer/manifest.json",))}
        >>> keys = ["runs/r/steps/000000/train/policy/manifest.json", "runs/r/steps/000000/rollouts/gen-0.json",
        ...         "runs/r/steps/000001/train/policy/manifest.json", "runs/r/init/manifest.json"]
        >>> plan_collection("runs/r", 3, v, keys, Retention(keep_last=1)).delete
        ('runs/r/steps/000000/rollouts/gen-0.json', 'runs/r/steps/000000/train/policy/manifest.json')
    """
    keys = list(keys)
    recent = resumable(latest)
    window, checkpoints = set(retention.window(latest)) | recent, set(retention.checkpoints(latest))
    keep: set[str] = set()
    dropped: set[str] = set()  # optimizer state of window versions a resume does not start from
    for c, v in versions.items():
        keep.update(v.shared)
        if c in window or c in checkpoints:
            keep.update(v.weights)
        if c in recent or c in checkpoints:
            keep.update(v.resume)
        elif c in window:
            dropped.update(v.resume)
    dropped -= keep
    held = _held(run_prefix, keys, versions, window | checkpoints)
    versions_kept = tuple(sorted((window | checkpoints | {0}) & held & set(range(latest + 1))))
    if retention.keep_last is None:
        return GcPlan(frozenset(keep), (), versions_kept)
    delete = []
    base = run_prefix.rstrip("/") + "/"
    for key in keys:
        if not key.startswith(base):
            continue
        m = _STEP_DIR.match(key[len(base):])
        if m is None or key in keep:
            continue
        commit = int(m.group(1)) + 1  # step directory d produces commit d+1
        if commit > latest:
            continue  # the step in flight
        if commit in window and key not in dropped:
            continue
        delete.append(key)
    return GcPlan(frozenset(keep), tuple(sorted(delete)), versions_kept)
