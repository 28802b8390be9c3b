"""Garbage collection of a run's old versions (the executor; the plan is
``flows/planning/retention.py``).

After a commit, and on demand (``rlhfless gc``), under the run's lease:

1. list the store's ``runs/`` keys and read the commits the retention policy keeps (with the
   run's committed checkpoints and the versions ``rlhfless gc`` pinned, ``pins.py``);
2. plan which of the run's objects are garbage;
3. read every manifest: the garbage ones give the candidate blobs, every other manifest in the
   store (this run's kept ones and all of other runs') marks the blobs still referenced; one
   listing of the blobs leaves out the candidates the store no longer holds. A campaign's
   collections read a manifest again only when its listing tag changed (``ManifestTables``);
4. ``rlhfless gc`` only: record the checkpoints its ``checkpoint_every`` keeps as pinned;
5. delete the candidates nothing marks, then the garbage manifests, then the other garbage;
6. remove the temporary files of killed writes older than an hour (local store);
7. ``rlhfless gc`` only (``orphan_grace_s``): delete the orphan blobs, those no manifest in the
   store lists, last modified more than a day ago (a publish that died before its manifest),
   and the run's orphan draft objects, those its committed ``draft_index`` does not point to,
   as old (a crash between a commit and the deletion of the drafts it stopped pointing to).

Step 6 and the orphan blobs are store-wide, not this run's: their rules and grace periods, and the
assumptions that keep a writer in flight safe, are in ``flows/planning/leftovers.py``. The orphan
sweep runs on demand rather than after every commit: it lists every blob of the store and reads
every manifest, each time, to find what only a crash leaves; and although its grace period
protects a publish in flight, the one case it cannot on S3 (an old orphan whose bytes another
run re-publishes at that moment) is best kept to a moment an operator picks.

Blobs go before the manifests that list them, so a crash part-way leaves garbage manifests that
the next collection reads again (the blobs already deleted left out), never an unlisted
blob that nobody would find. Nothing the newest commit or a resume from it needs is ever a
candidate. Blobs are shared by content across the whole store; a blob is kept while any manifest
of any run lists it. Not covered: another run of the same store publishing, at that very moment,
a blob whose bytes equal a garbage one (it skips the upload because the blob exists, and this
collection deletes it before that run's manifest appears); its reader then fails with a
missing-blob error naming the key. Keep runs that could produce identical weights (same config
and seed) in different stores, or collect with ``rlhfless gc`` while they are stopped. AdamW's
step counts, the same in every run at one step, are kept in the optimizer manifest's meta
(``publish_tensors(scalars_in_meta=True)``); other tensors equal across runs of other seeds
(an all-zero reward vector, the moments of a parameter without gradient) still can be shared.

Fault injection for tests: ``RLHFLESS_FAULT_GC_KILL_AFTER=N`` SIGKILLs this process after its
N-th blob deletion.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from actions.store import (
    BLOB_PREFIX,
    IntegrityError,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    blob_key,
    map_bounded,
    read_manifest,
    transfer_threads,
)
from flows.campaign.drafts import drafts_key
from flows.campaign.pins import read_pins, record_pins
from flows.campaign.progress_line import print_line
from flows.campaign.state import CampaignState, load_state_at
from flows.planning.leftovers import TEMP_GRACE_S, plan_orphans
from flows.planning.retention import GcPlan, Retention, VersionKeys, needed_commits, plan_collection

KILL_ENV = "RLHFLESS_FAULT_GC_KILL_AFTER"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class GcReport:
    """What one collection did. ``deleted_blobs`` / ``freed_bytes`` count the blobs this
    collection deleted and their sizes as the store lists them (not those a collection cut short
    deleted before it); ``seconds`` is wall time; ``deleted_temporaries`` / ``temporary_bytes`` the
    killed writes' temporary files removed, ``orphan_blobs`` / ``orphan_bytes`` the orphan
    blobs deleted and ``orphan_drafts`` / ``orphan_draft_bytes`` the run's orphan draft objects
    (both ``rlhfless gc`` only). With ``dry_run``, what would be."""

    run_id: str
    versions_kept: list[int]
    deleted_objects: int
    deleted_blobs: int
    freed_bytes: int
    seconds: float
    deleted_temporaries: int = 0
    temporary_bytes: int = 0
    orphan_blobs: int = 0
    orphan_bytes: int = 0
    orphan_drafts: int = 0
    orphan_draft_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def version_keys(state: CampaignState) -> VersionKeys:
    """The manifests one commit names (see ``flows/planning/retention.py``)."""
    shared = [state.reference_key, *state.prepared.object_keys().values()]
    return VersionKeys(
        step=state.step,
        weights=tuple(k for k in (state.policy_key, state.critic_key) if k),
        resume=tuple(k for k in (state.optimizer_key, state.critic_optimizer_key) if k),
        shared=tuple(shared),
    )


def plan_for(store: ObjectStore, latest: CampaignState, retention: Retention) -> tuple[GcPlan, list[str]]:
    """The plan for the run of ``latest`` and the listing of ``runs/`` it was made from."""
    plan, listing, _ = _plan(store, latest, retention)
    return plan, listing


def _plan(store: ObjectStore, latest: CampaignState,
          retention: Retention) -> tuple[GcPlan, list[str], dict[int, VersionKeys]]:
    """:func:`plan_for`, and the keys of the commits it read (those of ``needed_commits`` that exist)."""
    versions = {latest.step: version_keys(latest)}
    for step in needed_commits(latest.step, retention):
        if step not in versions:
            state = load_state_at(store, latest.run_id, step, history=False)  # its keys only
            if state is not None:
                versions[step] = version_keys(state)
    list_tags = getattr(store, "list_tags", None)
    listing = _Listing(list_tags("runs/")) if list_tags is not None else _Listing.untagged(store.list("runs/"))
    plan = plan_collection(f"runs/{latest.run_id}", latest.step, versions, listing, retention)
    return plan, listing, versions


class _Listing(list):
    """The sorted keys of one listing of ``runs/``, with the tag of each key where the backend
    tags them (``list_tags``)."""

    def __init__(self, tags: dict[str, str | None]) -> None:
        super().__init__(sorted(tags))
        self.tags = tags

    @classmethod
    def untagged(cls, keys: list[str]) -> _Listing:
        listing = cls({})
        listing.extend(keys)
        return listing


class ManifestTables:
    """What a campaign's collections read of the store's manifests, kept from one to the next:
    each manifest's blob table (sha256 -> size) with the tag its key had in the listing it was
    read after. A collection reads a manifest again only when it is new or its tag changed
    (``list_tags``: S3 ETag; local store: inode, time and size), so the commits of a long
    campaign in a store that holds many runs do not each read every manifest of the store
    (200 finished runs, 2,000 manifests: 1.54 s a commit on S3 on loopback, 0.0064 s once
    kept; ``benchmarks/bench_gc.py``). Kept: the tables of the manifests a collection keeps (a
    garbage one is deleted by the collection that reads it). An untagged manifest, and every
    one of a backend without tags, is read by every collection, as ``rlhfless gc`` (one
    collection) reads them all."""

    def __init__(self) -> None:
        self._tables: dict[str, tuple[str, dict[str, int]]] = {}
        self.reads = 0  # manifests read from the store, all collections together

    def tables(self, store: ObjectStore, manifests: list[str], garbage: set[str],
               tags: dict[str, str | None]) -> list[dict[str, int]]:
        """The blob table of each of ``manifests``, in order (``_file_table``)."""
        def known(k: str) -> dict[str, int] | None:
            entry = self._tables.get(k)
            return entry[1] if entry is not None and tags.get(k) is not None and entry[0] == tags[k] else None

        todo = [k for k in manifests if known(k) is None]
        read = dict(zip(todo, map_bounded(lambda k: _file_table(store, k, garbage=k in garbage), todo,
                                          transfer_threads(store, len(todo)))))
        self.reads += len(todo)
        out = [read[k] if k in read else known(k) for k in manifests]
        # an empty table may be a manifest deleted since the listing: read again, not kept
        self._tables = {k: (tag, t) for k, t in zip(manifests, out)
                        if (tag := tags.get(k)) is not None and k not in garbage and t}
        return out


class UnreadableManifest(StoreError):
    """A manifest a collection must read is damaged: it deletes nothing (``rlhfless gc`` stops on
    it; a campaign's collection after a commit warns once and trains on, ``Collector``)."""


def _file_table(store: ObjectStore, key: str, *, garbage: bool) -> dict[str, int]:
    """sha256 -> size of the blobs a manifest lists. A garbage manifest that cannot be read
    lists nothing (its blobs stay: safe); a kept one that cannot be read stops the collection,
    since what it references is unknown."""
    try:
        files = read_manifest(store, key)["files"]
        return {e["sha256"]: int(e.get("size", 0)) for e in files.values()}
    except ObjectNotFound:
        return {}  # deleted since the listing (e.g. by a collection of its own run)
    except (IntegrityError, KeyError, TypeError, ValueError, AttributeError) as exc:
        if garbage:
            return {}
        raise UnreadableManifest(f"garbage collection stopped: manifest {key} cannot be read ({exc}), so the "
                                 "blobs it references are unknown; repair or delete it, then run `rlhfless gc` "
                                 "again") from None



def collect_garbage(store: ObjectStore, latest: CampaignState, retention: Retention, *,
                    lease: Any = None, dry_run: bool = False, orphan_grace_s: float | None = None,
                    temporaries: bool = True, pin: bool = False, known: ManifestTables | None = None) -> GcReport:
    """Delete what ``retention`` does not keep of ``latest``'s run, then the store's stale
    temporary files (see the module docstring).

    Args:
        store: the run's store.
        latest: the run's newest committed state.
        retention: the policy; ``keep_last=None`` deletes none of the run's versions. The run's
            committed checkpoints (``latest.checkpoints``) and the versions ``rlhfless gc``
            pinned (``flows/campaign/pins.py``) are kept whatever it says.
        lease: the run's :class:`flows.campaign.lease.RunLease`; checked before anything is written.
        dry_run: plan and count only; nothing is written.
        orphan_grace_s: also delete the orphan blobs, and the run's orphan draft objects
            (:func:`sweep_orphan_drafts`), last modified more than this many seconds ago
            (``flows/planning/leftovers.py``: it must be long against a publish); None: none.
        temporaries: also remove the store's stale temporary files (a walk of the whole store),
            and count only the garbage blobs the store still holds (a listing of its blobs): a
            collection cut short may have deleted some (``_garbage_blobs``).
        pin: before deleting, record the checkpoints ``retention.checkpoint_every`` names, among
            the versions whose weights the store holds, as pinned for good (``rlhfless gc``, under
            the lease), so that later collections with other settings keep them too.
        known: the manifests' tables earlier collections of this campaign read (``Collector``);
            None: every manifest is read.
    """
    t0 = time.time()
    every = replace(retention, pinned=frozenset()).checkpoints(latest.step) if pin else []
    # keep_last None deletes no version: a damaged pins file cannot make it delete a pinned one
    pinned = frozenset(latest.checkpoints) | (read_pins(store, latest.run_id) if retention.keep_last is not None
                                              else frozenset())
    retention = replace(retention, pinned=retention.pinned | pinned)
    plan, listing, versions = _plan(store, latest, retention)
    garbage = set(plan.delete)
    blobs, freed = (_garbage_blobs(store, listing, garbage, check_held=temporaries, known=known)
                    if garbage else ([], 0))
    if not dry_run:
        if lease is not None:
            lease.check()
        if every:  # before anything is deleted: a collection cut short has pinned them already
            held = set(listing)
            record_pins(store, latest.run_id, [v for v in every if v in versions and held >= set(versions[v].weights)])
        _delete_all(store, [blob_key(d) for d in blobs], count_for_fault=True)
        _delete_all(store, list(plan.delete_manifests))
        _delete_all(store, [k for k in plan.delete if not k.endswith("manifest.json")])
    remove = getattr(store, "remove_stale_temporaries", None) if temporaries else None  # S3 leaves none
    swept = remove(t0 - TEMP_GRACE_S, dry_run=dry_run) if remove is not None else (0, 0)
    orphans = drafts = (0, 0)
    if orphan_grace_s is not None:
        orphans = sweep_orphans(store, t0, orphan_grace_s, dry_run=dry_run)
        drafts = sweep_orphan_drafts(store, latest, t0, orphan_grace_s, dry_run=dry_run)
    return GcReport(latest.run_id, list(plan.versions), len(plan.delete), len(blobs), freed, time.time() - t0,
                    *swept, *orphans, *drafts)


def gc_retention(keep_last: int | None, checkpoint_every: int | None, store_settings: Any,
                 config: str | None, recorded: dict[str, int | None] | None = None
                 ) -> tuple[Retention, dict[str, Any]]:
    """``rlhfless gc``'s policy: each of ``keep_last`` / ``checkpoint_every`` from its flag where
    given, else from ``store_settings`` when ``config`` (the file ``--config`` names) is given,
    else from ``recorded``, the settings the run's last commit was made with
    (``CampaignState.retention``), else from ``store_settings`` of the default configuration (a
    record from before the store kept them). A run trained with ``keep_last: 10`` is thus never
    cut to the default's 2 by a bare ``rlhfless gc``. Returns it and what it applies and whence,
    for the report.

    Raises:
        ValueError: the ``keep_last`` it would apply is None (a collection that keeps everything).
    """
    if config is None and recorded is not None:
        source, settings = recorded, "the run's last commit"
    else:
        source = {name: getattr(store_settings, name) for name in ("keep_last", "checkpoint_every")}
        settings = f"--config {config}" if config else "the default configuration"
    applied: dict[str, Any] = {}
    for name, flag, value in (("keep_last", "--keep-last", keep_last),
                              ("checkpoint_every", "--checkpoint-every", checkpoint_every)):
        applied[name] = value if value is not None else source[name]
        applied[f"{name}_from"] = flag if value is not None else f"store.{name} of {settings}"
    if applied["keep_last"] is None:
        raise ValueError(f"gc: store.keep_last is null in {settings} (every version is kept); pass --keep-last N")
    return Retention(applied["keep_last"], applied["checkpoint_every"]), applied


def _garbage_blobs(store: ObjectStore, listing: _Listing, garbage: set[str], *, check_held: bool,
                   known: ManifestTables | None = None) -> tuple[list[str], int]:
    """(the digests of the blobs that garbage manifests list, no other manifest of the store
    does, and the store holds, sorted; their bytes). A blob a collection cut short already
    deleted is listed by its garbage manifest still: left out, so a report counts what its own
    collection deletes. Only ``check_held`` collections list the store's blobs to tell (a
    session's first and every ``rlhfless gc``, which also sweep temporaries): after a session's
    first collection, every later one of that session follows collections that finished, so
    each candidate is held, and a listing of every blob of the store after each commit would
    only slow the step down. ``known``: the tables earlier collections read (:class:`ManifestTables`)."""
    manifests = [k for k in listing if k.endswith("manifest.json")]
    tables = (known or ManifestTables()).tables(store, manifests, garbage, listing.tags)
    marked: set[str] = set()
    candidates: dict[str, int] = {}
    for key, table in zip(manifests, tables):
        if key in garbage:
            candidates.update(table)
        else:
            marked.update(table)
    unmarked = set(candidates) - marked
    if not check_held:
        return sorted(unmarked), sum(candidates[d] for d in unmarked)
    held = _held_blobs(store) if unmarked else {}
    blobs = sorted(unmarked & set(held))
    return blobs, sum(held[d] if held[d] is not None else candidates[d] for d in blobs)


def _held_blobs(store: ObjectStore) -> dict[str, int | None]:
    """digest -> size of the blobs the store holds (one listing; None: a backend without
    ``list_stats`` tells no sizes, and the manifests' are taken)."""
    list_stats = getattr(store, "list_stats", None)
    prefix = BLOB_PREFIX + "/"
    listed: dict[str, int | None] = ({k: size for k, (_, size) in list_stats(prefix).items()}
                                     if list_stats is not None else dict.fromkeys(store.list(prefix)))
    return {d: size for k, size in listed.items() if blob_key(d := k.rsplit("/", 1)[-1]) == k}


def sweep_orphans(store: ObjectStore, now: float, grace_s: float, *, dry_run: bool = False) -> tuple[int, int]:
    """Delete the blobs that no manifest anywhere in the store lists and that were last
    modified more than ``grace_s`` seconds before ``now`` (``flows/planning/leftovers.py``).

    Safe for a publish in flight, of this run or another, as long as it takes less than
    ``grace_s`` from its first blob to its manifest: its new blobs are younger than that. A
    blob it found present is old: the local store refreshes its time and re-checks it when
    deleting (``delete_if_older``); S3 cannot (see the planning module). A manifest that
    cannot be read stops the sweep, since what it lists is unknown.

    Returns:
        (blobs deleted, their bytes); with ``dry_run`` those that would be. A backend that
        cannot tell ages (no ``list_stats``) is not swept: (0, 0).
    """
    list_stats = getattr(store, "list_stats", None)
    if list_stats is None:
        return 0, 0
    listing = list_stats("")  # one listing: the blobs with their ages, and every manifest
    # only keys a blob of ours has (blobs/sha256/<2 hex>/<64 hex>): nothing else is touched
    blobs = {d: v for k, v in listing.items() if _DIGEST.match(d := k.rsplit("/", 1)[-1]) and blob_key(d) == k}
    manifests = [k for k in listing if k.endswith("manifest.json") and not k.startswith(BLOB_PREFIX + "/")]
    tables = map_bounded(lambda k: _file_table(store, k, garbage=False), manifests,
                         transfer_threads(store, len(manifests)))
    orphans = plan_orphans(blobs, set().union(*tables), now, grace_s)
    if dry_run:
        return len(orphans), sum(blobs[d][1] for d in orphans)
    delete_if_older = getattr(store, "delete_if_older", None)

    def delete(digest: str) -> bool:
        if delete_if_older is not None:
            return bool(delete_if_older(blob_key(digest), now - grace_s))
        store.delete(blob_key(digest))
        return True

    deleted = [d for d, gone in zip(orphans, map_bounded(delete, orphans, transfer_threads(store, len(orphans))))
               if gone]
    return len(deleted), sum(blobs[d][1] for d in deleted)


def sweep_orphan_drafts(store: ObjectStore, latest: CampaignState, now: float, grace_s: float, *,
                        dry_run: bool = False) -> tuple[int, int]:
    """Delete the run's draft objects (``runs/<run>/drafts/<step>.json``,
    ``flows/campaign/drafts.py``) that ``latest.draft_index`` does not point to and that were
    last modified more than ``grace_s`` seconds before ``now``.

    The campaign deletes the drafts a commit stops pointing to right after that commit; a crash
    in between leaves them for good (a resume starts from the new index, and nothing lists
    ``drafts/`` again), and so does a step that wrote its drafts and died before its commit
    (its replay rewrites the same object, so deleting it is safe too). Called under the run's
    lease, so no campaign of the run writes drafts meanwhile; the grace period is the orphan
    blobs' all the same, the one rule for what a crash leaves.

    Returns:
        (objects deleted, their bytes); with ``dry_run`` those that would be. A backend that
        cannot tell ages (no ``list_stats``) is not swept: (0, 0).
    """
    list_stats = getattr(store, "list_stats", None)
    if list_stats is None:
        return 0, 0
    prefix = f"runs/{latest.run_id}"
    listing = {k: v for k, v in list_stats(f"{prefix}/drafts/").items() if k.endswith(".json")}
    referenced = {drafts_key(prefix, s) for s in latest.draft_index.values()}
    stale = plan_orphans(listing, referenced, now, grace_s)
    if not dry_run:
        _delete_all(store, stale)
    return len(stale), sum(listing[k][1] for k in stale)


_KILL_LOCK = threading.Lock()
_deleted_blobs = 0


def _delete_all(store: ObjectStore, keys: list[str], *, count_for_fault: bool = False) -> None:
    kill_after = int(os.environ.get(KILL_ENV, "0") or 0) if count_for_fault else 0

    def delete(key: str) -> None:
        global _deleted_blobs
        assert key.startswith(BLOB_PREFIX) or not count_for_fault, key
        store.delete(key)
        if kill_after:
            with _KILL_LOCK:
                _deleted_blobs += 1
                if _deleted_blobs >= kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)

    map_bounded(delete, keys, transfer_threads(store, len(keys)))


class Collector:
    """A campaign's collections, one after each commit (never before it), and their totals for
    the summary's ``gc``."""

    def __init__(self, store: ObjectStore, retention: Retention, lease: Any,
                 warn: Callable[[str], None] = print_line) -> None:
        self.store, self.retention, self.lease, self.warn = store, retention, lease, warn
        self.known = ManifestTables()
        self.totals: dict[str, Any] = {"collections": 0, "deleted_objects": 0, "deleted_blobs": 0,
                                       "freed_bytes": 0, "deleted_temporaries": 0, "temporary_bytes": 0,
                                       "seconds": 0.0, "skipped": 0}

    def __call__(self, state: CampaignState) -> None:
        # the stale temporaries walk the whole store: once per campaign (an hour's grace makes
        # a sweep each step pointless), and in every ``rlhfless gc``
        try:
            report = collect_garbage(self.store, state, self.retention, lease=self.lease,
                                     temporaries=self.totals["collections"] == 0, known=self.known)
        except UnreadableManifest as exc:  # often another run's: deleting nothing is safe, stopping is not needed
            if not self.totals["skipped"]:
                self.warn(f"warning: {exc}; this campaign collects nothing until then and trains on")
            self.totals["skipped"] += 1
            return
        self.totals["collections"] += 1
        for k in ("deleted_objects", "deleted_blobs", "freed_bytes", "deleted_temporaries", "temporary_bytes",
                  "seconds"):
            self.totals[k] += getattr(report, k)
