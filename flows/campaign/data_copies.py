"""A resumed run's datasets: the copies ``prepare`` stored at its start, not the files.

``prepare`` stores the rows it read from ``data.train_path`` and ``data.eval_path``
(``runs/<run>/data/``), and records each local path's digest in the run's data summary
(``Prepared.data["sources"]``, ``actions/tasks/source_digest.py``). Every step reads the
copy, so editing the file between runs changes nothing the run trains on. A resume compares
the paths by what they hold, as ``reward_copies`` does for reward models:

* the same spelling whose files no longer hold the digest (edited, rows added): one warning
  line says that the run keeps training on the copy it stored, and how to train on the file
  as it is now (a new run);
* another spelling (relative for absolute, the file moved) is the same data when its files
  hold the digest, and a different setting otherwise, which ``check_resume`` refuses naming
  the setting;
* a path that names nothing now, or a run stored before digests were recorded, has nothing to
  compare: the run continues on its copy, as before.
"""

from __future__ import annotations

from typing import Any

from actions.tasks.source_digest import source_digest

SETTINGS = ("train_path", "eval_path")
"""The ``data`` settings whose files ``prepare`` stores."""


def reconcile_data_paths(run_id: str, identity: dict[str, Any], recorded: dict[str, Any], sources: dict[str, Any]
                         ) -> tuple[dict[str, Any], list[str]]:
    """(``identity`` with each data path that names the run's stored data under another
    spelling put back as ``recorded`` spells it (a copy where one is; ``identity`` is not
    changed), warning lines for files that changed since the copy was stored). ``sources``:
    the run's ``Prepared.data["sources"]`` (setting -> path and sha256)."""
    warnings = []
    for key in SETTINGS:
        setting = f"data.{key}"
        stored = sources.get(setting) if isinstance(sources, dict) else None
        old, new = (recorded.get("data") or {}).get(key), identity["data"].get(key)
        if not isinstance(stored, dict) or not old or not new:
            continue
        held = source_digest(new)
        if held is None:
            continue
        if new == old and held != stored.get("sha256"):
            warnings.append(f"warning: {setting} {old!r} holds other data than the copy run {run_id!r} stored at its "
                            "start; the run keeps training on that copy (start a new run, another run_id, to train on "
                            "the file as it is now)")
        elif new != old and held == stored.get("sha256"):
            identity = {**identity, "data": {**identity["data"], key: old}}
    return identity, warnings
