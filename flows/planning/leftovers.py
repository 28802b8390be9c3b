"""What garbage collection removes beside a run's old versions, and when (pure planning).

The retention plan (``retention.py``) deletes only blobs that a garbage manifest lists. Three
kinds of leftover escape it, and ``flows/campaign/collect.py`` removes them once they are older
than a grace period:

* **temporary files** of writes killed part-way (the local store's ``.tmp-*`` beside a key,
  as large as the blob being written). S3 has none: a PUT is atomic, and the parts of a
  multipart upload killed part-way are aborted by the bucket's lifecycle rule
  (``infra/minio/lifecycle.json``, docs/storage.md section 6). Removed by every collection.
* **orphan blobs**: uploaded by a publish that died before its manifest was written, so no
  manifest ever listed them. Removed by ``rlhfless gc`` only.
* **orphan draft objects** of the collected run (``runs/<run>/drafts/<step>.json``) that its
  committed ``draft_index`` does not point to: a crash between a commit and the deletion of
  the drafts it replaced, or before the commit of a step that wrote its own. Removed by
  ``rlhfless gc`` only, under the run's lease, with the orphan blobs' grace period.

The grace periods, and why:

* :data:`TEMP_GRACE_S`, one hour. A live write modifies its temporary file with every chunk and
  renames it moments after the last (one fsync), so one untouched for an hour belongs to a dead
  writer. The lease TTL (60 s by default) would be too short a yardstick: it is about the
  process holding one run's lease, while a temporary file may belong to any writer of the
  store (an action, another run), and an fsync of a large blob on a slow disk can take longer.
* :data:`ORPHAN_GRACE_S`, one day. A publish uploads its blobs first and its manifest last, so
  until the manifest appears its blobs look exactly like orphans. The sweep therefore deletes
  only blobs last modified more than the grace period ago, which is safe under these
  assumptions: no publish takes that long from its first blob to its manifest (one artifact is
  seconds to minutes), and the store's clock and this host's agree to well within it. A blob a
  writer finds already present is not uploaded again, so it keeps its old time: the local store
  refreshes the time on such a write and re-checks it atomically with the delete, so this case
  is covered there; on S3 a conditional PUT answered 412 leaves the time as it was, and an
  orphan whose exact bytes another run re-publishes at the moment of the sweep is deleted
  under it (its reader then fails naming the missing blob). ``rlhfless gc --orphan-grace-hours``
  shortens the period for an operator who knows that nothing writes the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

TEMP_GRACE_S = 3600.0
ORPHAN_GRACE_S = 24 * 3600.0


def plan_orphans(blobs: Mapping[str, tuple[float, int]], referenced: Iterable[str], now: float,
                 grace_s: float) -> list[str]:
    """The orphan blobs to delete: those no manifest lists and last modified more than
    ``grace_s`` seconds before ``now``. The same rule picks a run's orphan draft objects, keyed
    by their store keys (``flows/campaign/collect.py: sweep_orphan_drafts``).

    Args:
        blobs: sha256 digest -> (modification time in epoch seconds, size in bytes), every blob
            of the store.
        referenced: the digests that the store's manifests list (every manifest, of every run).
        now: the time the plan is made, epoch seconds.
        grace_s: how old an unlisted blob must be (see the module docstring).

    Returns:
        The digests, sorted.

    Example (now 100 000 s, a grace of one day: only the old unlisted blob goes)::

        >>> blobs = {"aa": (0.0, 5), "bb": (0.0, 7), "cc": (99_000.0, 9)}
        >>> plan_orphans(blobs, referenced={"bb"}, now=100_000.0, grace_s=86_400.0)
        ['aa']
    """
    listed = set(referenced)
    return sorted(d for d, (mtime, _) in blobs.items() if d not in listed and now - mtime > grace_s)
