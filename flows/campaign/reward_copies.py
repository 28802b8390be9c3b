"""A resumed run's reward models: the copies ``prepare`` stored at its start, not their folders.

``prepare`` copies each ``reward.models[i]`` folder into the store (``runs/<run>/reward_models/
<i>/``), and every score and evaluation of the run reads that copy. ``CampaignConfig.identity``
keeps each path as typed, and existing runs' fingerprints (and run ids) depend on that, so a
resume compares the paths by what they hold instead:

* the same spelling is the same model, whether or not the folder is still there; where it is
  and its files are no longer the copy's, one warning line says that the run keeps scoring
  with the copy it stored at its start;
* another spelling (relative for absolute, a trailing slash, the folder moved) is the same
  model when the folder it names holds the copy's files (names, sizes and sha256), and a
  different setting otherwise, which ``check_resume`` refuses naming ``reward.models[i].path``.

A resumed run does not check the folders again either (``validate_inputs(resumed=True)``):
the copies were checked when they were stored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actions.config.reward import reward_model_key
from actions.store import IntegrityError, ObjectNotFound, ObjectStore, read_manifest
from actions.tasks.rewards.model_files import folder_names
from actions.tasks.source_digest import file_sha256

if TYPE_CHECKING:
    from flows.config import CampaignConfig


def reconcile_reward_paths(run_id: str, recorded: dict[str, Any], cfg: CampaignConfig, store: ObjectStore
                           ) -> tuple[dict[str, Any], list[str]]:
    """(``cfg``'s identity with each ``reward.models[i].path`` that names the stored copy of run
    ``run_id`` under another spelling put back as the run spelled it in ``recorded``, its
    committed identity; warning lines for folders that changed since the copy was stored).
    Reads the folders' files only where a path names one (sha256 of each, once per process
    while the file is unchanged: about 3 s per GiB on one CPU core, so a resume of a run with a
    14 GB reward model spends some 40 s here; names and sizes alone would miss the common
    change, weights trained again in the same folder, which keep both)."""
    identity = cfg.identity()
    was = (recorded.get("reward") or {}).get("models") or []
    now = identity["reward"]["models"]
    warnings = []
    for i, (old, new) in enumerate(zip(was, now)):
        if {**old, "path": None} != {**new, "path": None}:
            continue  # another of its settings differs: check_resume refuses that as it is
        held = _holds_copy(new["path"], store, reward_model_key(f"runs/{run_id}", i))
        if new["path"] != old["path"] and held:
            new["path"] = old["path"]
        elif new["path"] == old["path"] and held is False:
            warnings.append(f"warning: reward.models[{i}].path {old['path']!r} holds other files than the copy run "
                            f"{run_id!r} stored at its start; the run keeps scoring with that copy (start "
                            "a new run, another run_id, to score with the folder as it is now)")
    return identity, warnings


def described(key: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    """``key`` of ``differing_values``, with both paths where it is ``reward.models[i].path``:
    the spelling the run was made with, and the folder that does not hold its copy."""
    match = re.fullmatch(r"reward\.models\[(\d+)\]\.path", key)
    if match is None:
        return key
    i = int(match.group(1))
    return (f"{key} {old['reward']['models'][i]['path']!r}, now {new['reward']['models'][i]['path']!r}, which does "
            "not hold the model the run stored")


def _holds_copy(path: str, store: ObjectStore, manifest_key: str) -> bool | None:
    """Does the folder ``path`` hold the files of the stored copy at ``manifest_key``? None when
    there is nothing to compare: no such folder, or no stored copy."""
    root = Path(path)
    if not root.is_dir():
        return None
    try:
        table = read_manifest(store, manifest_key)["files"]
    except (ObjectNotFound, IntegrityError):
        return None
    try:
        names = folder_names(path)
        if names != sorted(table):
            return False
        stats = [(root / n).stat() for n in names]
        if any(s.st_size != table[n]["size"] for n, s in zip(names, stats)):
            return False
        return all(file_sha256(os.path.realpath(root / n), s.st_size, s.st_mtime_ns) == table[n]["sha256"]
                   for n, s in zip(names, stats))
    except OSError:  # a folder this process cannot read: nothing to compare, as for none
        return None
