"""Store lifecycle: the retention plan (pure), the collection on both backends (shared and
foreign blobs survive, a crash part-way is finished by the next run), and campaigns whose store
stays bounded and whose weights do not depend on collection."""

from __future__ import annotations

import json
import os
import time

import pytest

from actions.store import (
    BLOB_PREFIX,
    LocalStore,
    ObjectStore,
    blob_key,
    put_artifact,
    put_blob,
    read_manifest,
    sha256_hex,
)
from flows.campaign.collect import collect_garbage
from flows.campaign.state import CampaignState, commit_state, load_state
from flows.planning.retention import Retention, VersionKeys, plan_collection

# ----------------------------------------------------------------------------- the plan (pure)


def _v(c: int) -> VersionKeys:
    d = f"runs/r/steps/{c - 1:06d}/train"
    return VersionKeys(c, (f"{d}/policy/manifest.json",), (f"{d}/optimizer/manifest.json",),
                       ("runs/r/policy/v000000/manifest.json",))


def _step_keys(d: int) -> list[str]:
    p = f"runs/r/steps/{d:06d}"
    return [f"{p}/train/policy/manifest.json", f"{p}/train/optimizer/manifest.json", f"{p}/rollouts/gen-0.json"]


def test_window_keeps_newest_versions_and_the_optimizers_a_resume_starts_from() -> None:
    # after commit 5 with K=3: versions 3, 4, 5 kept; dirs 0..1 garbage; dir 2 (version 3) loses
    # its optimizer; dir 3 (version 4, the previous commit) and dir 4 (version 5) whole; dir 5
    # (in flight) untouched
    keys = [k for d in range(6) for k in _step_keys(d)] + ["runs/r/policy/v000000/manifest.json",
                                                          "runs/other/steps/000000/rollouts/gen-0.json"]
    plan = plan_collection("runs/r", 5, {c: _v(c) for c in (3, 4, 5)}, keys, Retention(keep_last=3))
    expected = [k for d in range(2) for k in _step_keys(d)] + ["runs/r/steps/000002/train/optimizer/manifest.json"]
    assert plan.delete == tuple(sorted(expected))
    assert plan.versions == (0, 3, 4, 5)


def test_the_previous_commit_is_kept_whole_whatever_keep_last() -> None:
    """A lost newest commit record leaves a run that resumes from the one before: K=1 keeps it."""
    keys = [k for d in range(6) for k in _step_keys(d)]
    plan = plan_collection("runs/r", 5, {c: _v(c) for c in (4, 5)}, keys, Retention(keep_last=1))
    assert set(keys) - set(plan.delete) == {*_step_keys(3), *_step_keys(4), *_step_keys(5)}
    assert plan.versions == (0, 4, 5)


def test_checkpoints_keep_weights_and_optimizer_but_not_rollouts() -> None:
    keys = [k for d in range(6) for k in _step_keys(d)]
    plan = plan_collection("runs/r", 6, {c: _v(c) for c in (2, 4, 6)}, keys, Retention(keep_last=1, checkpoint_every=2))
    kept = set(keys) - set(plan.delete)
    # versions 2 and 4 (dirs 1, 3): weights + optimizer; versions 5 (the previous) and 6 (dirs 4, 5): everything
    assert kept == {*_step_keys(1)[:2], *_step_keys(3)[:2], *_step_keys(4), *_step_keys(5)}
    assert plan.versions == (0, 2, 4, 5, 6)


def test_keep_all_deletes_nothing_and_keys_named_by_a_commit_survive_anywhere() -> None:
    keys = [k for d in range(4) for k in _step_keys(d)]
    assert plan_collection("runs/r", 4, {4: _v(4)}, keys, Retention(keep_last=None)).delete == ()
    # a critic published in step 0 and named by the newest commit stays though its dir is old
    v = VersionKeys(4, ("runs/r/steps/000003/train/policy/manifest.json", "runs/r/steps/000000/critic/manifest.json"), ())
    plan = plan_collection("runs/r", 4, {4: v}, keys + ["runs/r/steps/000000/critic/manifest.json"], Retention(1))
    assert "runs/r/steps/000000/critic/manifest.json" not in plan.delete


# ----------------------------------------------------------------------------- the collection


def _publish(store: ObjectStore, key: str, blobs: dict[str, bytes]) -> None:
    put_artifact(store, key, blobs)


def _fake_run(store: ObjectStore, run: str, steps: int, *, shared: bytes,
              retention: dict | None = None) -> CampaignState:
    """Commits 0..steps whose policies each hold one blob of their own plus ``shared``, made with
    the store settings ``retention`` (None: a record from before commits kept them)."""
    ref = f"runs/{run}/policy/v000000/manifest.json"
    _publish(store, ref, {"w": b"reference", "s": shared})
    inputs = {f"{name}_key": f"runs/{run}/{name}/manifest.json" for name in ("base", "init", "train", "eval", "tokens")}
    state = CampaignState(run_id=run, fingerprint="f", identity={}, policy_key=ref, reference_key=ref,
                          prepared={**inputs, "model": {}}, retention=retention)
    commit_state(store, state)
    for _ in range(steps):
        state = _commit_next(store, state, shared=shared)
    return state


def _commit_next(store: ObjectStore, state: CampaignState, *, shared: bytes) -> CampaignState:
    """Publish and commit the step after ``state``'s (as a training step would)."""
    run, c = state.run_id, state.step + 1
    d = f"runs/{run}/steps/{c - 1:06d}"
    _publish(store, f"{d}/train/policy/manifest.json", {"w": f"{run}-policy-{c}".encode(), "s": shared})
    _publish(store, f"{d}/train/optimizer/manifest.json", {"m": f"{run}-adam-{c}".encode()})
    store.put(f"{d}/rollouts/gen-0.json", b"[]")
    state = state.model_copy(update={"step": c, "policy_version": c, "policy_key": f"{d}/train/policy/manifest.json",
                                     "optimizer_key": f"{d}/train/optimizer/manifest.json"})
    commit_state(store, state)
    return state


def _blob_exists(store: ObjectStore, data: bytes) -> bool:
    return store.exists(blob_key(sha256_hex(data)))


def test_collection_deletes_old_versions_only(backend_store) -> None:
    store = backend_store
    latest = _fake_run(store, "r", 5, shared=b"shared-with-every-version")
    _fake_run(store, "other", 1, shared=b"r-policy-1")  # another run references r's version-1 bytes
    report = collect_garbage(store, latest, Retention(keep_last=2))
    assert report.versions_kept == [0, 4, 5]
    assert not any(store.list(f"runs/r/steps/{d:06d}/") for d in range(3))
    assert store.list("runs/r/steps/000003/") == ["runs/r/steps/000003/rollouts/gen-0.json",  # the previous commit
                                                  "runs/r/steps/000003/train/optimizer/manifest.json",
                                                  "runs/r/steps/000003/train/policy/manifest.json"]
    for data, alive in ((b"r-policy-1", True), (b"r-policy-2", False), (b"r-adam-3", False), (b"r-adam-4", True),
                        (b"r-policy-4", True), (b"r-adam-5", True), (b"shared-with-every-version", True),
                        (b"reference", True)):
        assert _blob_exists(store, data) is alive, data
    # deleted blobs: policy 2, 3; adam 1..3; version 1's own policy blob is the other run's
    assert report.deleted_blobs == 5 and report.freed_bytes == 2 * len(b"r-policy-2") + 3 * len(b"r-adam-1")
    again = collect_garbage(store, latest, Retention(keep_last=2))
    assert (again.deleted_objects, again.deleted_blobs) == (0, 0)
    assert load_state(store, "r").step == 5  # commit records are never collected


def test_committed_checkpoints_outlive_a_collection_with_other_settings(backend_store) -> None:
    """A version committed as a checkpoint (``store.checkpoint_every`` then) stays through a
    later ``rlhfless gc`` or resume whose settings name no checkpoints: weights and optimizer state."""
    store = backend_store
    latest = _fake_run(store, "r", 5, shared=b"s")
    assert collect_garbage(store, latest, Retention(keep_last=1), dry_run=True).versions_kept == [0, 4, 5]
    pinned = latest.model_copy(update={"checkpoints": [2]})  # as mark_checkpoint(2) left it at commit 2
    report = collect_garbage(store, pinned, Retention(keep_last=1))
    assert report.versions_kept == [0, 2, 4, 5]
    assert store.list("runs/r/steps/000001/") == ["runs/r/steps/000001/train/optimizer/manifest.json",
                                                  "runs/r/steps/000001/train/policy/manifest.json"]
    assert _blob_exists(store, b"r-policy-2") and _blob_exists(store, b"r-adam-2")
    state = CampaignState.model_validate(latest.model_dump())
    for step in range(1, 5):
        state.step = step
        state.mark_checkpoint(2)
    assert state.checkpoints == [2, 4]


def test_versions_gc_keeps_by_checkpoint_every_outlive_later_collections(tmp_path, capsys) -> None:
    """``rlhfless gc --checkpoint-every 4`` keeps v4 for good: the collection after the next
    training commit (default settings: keep_last 2, no checkpoints) keeps it too."""
    from flows.commands.cli import main

    root = tmp_path / "store"
    store = LocalStore(root)
    latest = _fake_run(store, "r", 6, shared=b"s")
    assert main(["gc", "--store", str(root), "--keep-last", "2", "--checkpoint-every", "4", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["versions_kept"] == [0, 4, 5, 6]
    assert not store.exists("runs/r/pins.json")  # a dry run writes nothing
    assert main(["gc", "--store", str(root), "--keep-last", "2", "--checkpoint-every", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["versions_kept"] == [0, 4, 5, 6]
    latest = _commit_next(store, latest, shared=b"s")  # a resume with the default store settings
    report = collect_garbage(store, latest, Retention(keep_last=2))
    assert report.versions_kept == [0, 4, 6, 7]
    assert store.list("runs/r/steps/000003/") == ["runs/r/steps/000003/train/optimizer/manifest.json",
                                                  "runs/r/steps/000003/train/policy/manifest.json"]
    assert _blob_exists(store, b"r-policy-4") and _blob_exists(store, b"r-adam-4")
    assert not _blob_exists(store, b"r-policy-5")
    # a later gc pinning more merges them; one with no checkpoints of its own keeps them all
    assert main(["gc", "--store", str(root), "--keep-last", "2", "--checkpoint-every", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["versions_kept"] == [0, 4, 6, 7]  # v3 was gone: neither kept nor pinned
    assert json.loads(store.get("runs/r/pins.json"))["versions"] == [4, 6]
    assert main(["gc", "--store", str(root), "--keep-last", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["versions_kept"] == [0, 4, 6, 7]


def test_pins_on_both_backends_and_a_damaged_pins_object_stops_the_collection(backend_store) -> None:
    from actions.store import IntegrityError

    store = backend_store
    latest = _fake_run(store, "r", 5, shared=b"s")
    assert collect_garbage(store, latest, Retention(1, 2), pin=True).versions_kept == [0, 2, 4, 5]
    latest = _commit_next(store, latest, shared=b"s")
    assert collect_garbage(store, latest, Retention(1)).versions_kept == [0, 2, 4, 5, 6]
    assert _blob_exists(store, b"r-policy-2") and _blob_exists(store, b"r-adam-4")
    store.put("runs/r/pins.json", b'{"versions": "4"}')
    before = store.list("")
    with pytest.raises(IntegrityError, match=r"runs/r/pins\.json is not a rlhfless\.pins/v1 record.*restore it"):
        collect_garbage(store, _commit_next(store, latest, shared=b"s"), Retention(1))
    assert set(before) <= set(store.list(""))
    # a campaign that keeps every version (keep_last null) deletes none: it has no pins to read
    kept = collect_garbage(store, load_state(store, "r"), Retention(None))
    assert kept.deleted_objects == 0 and set(before) <= set(store.list(""))


def test_gc_says_which_retention_it_applies(tmp_path, capsys) -> None:
    """A record from before commits kept the run's store settings: without flags or --config, gc
    applies the default configuration's, and says so."""
    from flows.commands.cli import main

    root = tmp_path / "store"
    _fake_run(LocalStore(root), "r", 3, shared=b"s")
    assert main(["gc", "--store", str(root), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "gc: would apply keep_last 2 (store.keep_last of the default configuration), checkpoint_every 0 " \
           "(store.checkpoint_every of the default configuration)" in err
    assert json.loads(out)["retention"] == {
        "keep_last": 2, "keep_last_from": "store.keep_last of the default configuration", "checkpoint_every": 0,
        "checkpoint_every_from": "store.checkpoint_every of the default configuration"}
    (tmp_path / "c.yaml").write_text("store:\n  checkpoint_every: 2\n")
    assert main(["gc", "--store", str(root), "--keep-last", "1", "--config", str(tmp_path / "c.yaml")]) == 0
    out, err = capsys.readouterr()
    config = tmp_path / "c.yaml"
    assert f"applied keep_last 1 (--keep-last), checkpoint_every 2 (store.checkpoint_every of --config {config})" in err
    assert json.loads(out)["versions_kept"] == [0, 2, 3]


def test_a_bare_gc_applies_the_retention_the_run_was_trained_with(tmp_path, capsys) -> None:
    """A run trained with keep_last 4 keeps its 4 versions through a bare `rlhfless gc` (not the
    default's 2); one trained with keep_last null makes it refuse; flags and --config still win."""
    from flows.commands.cli import main

    root = tmp_path / "store"
    _fake_run(LocalStore(root), "r", 5, shared=b"s", retention={"keep_last": 4, "checkpoint_every": 0})
    assert main(["gc", "--store", str(root), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "would apply keep_last 4 (store.keep_last of the run's last commit), checkpoint_every 0 " \
           "(store.checkpoint_every of the run's last commit)" in err
    assert json.loads(out)["versions_kept"] == [0, 2, 3, 4, 5]  # 0: the reference
    assert main(["gc", "--store", str(root), "--dry-run", "--keep-last", "1"]) == 0
    assert json.loads(capsys.readouterr()[0])["versions_kept"] == [0, 4, 5]  # the previous commit stays whole
    (tmp_path / "c.yaml").write_text("store:\n  keep_last: 3\n")
    assert main(["gc", "--store", str(root), "--dry-run", "--config", str(tmp_path / "c.yaml")]) == 0
    assert json.loads(capsys.readouterr()[0])["versions_kept"] == [0, 3, 4, 5]
    root = tmp_path / "keeps-all"
    _fake_run(LocalStore(root), "r", 5, shared=b"s", retention={"keep_last": None, "checkpoint_every": 0})
    before = sorted(LocalStore(root).list(""))
    assert main(["gc", "--store", str(root)]) != 0
    assert "store.keep_last is null in the run's last commit (every version is kept); pass --keep-last N" \
        in capsys.readouterr()[1]
    assert sorted(LocalStore(root).list("")) == before


def test_a_campaign_commit_records_its_retention(tmp_path) -> None:
    from flows.campaign.run import _retention_of
    from flows.config import CampaignConfig

    cfg = CampaignConfig.model_validate({"store": {"keep_last": 7, "checkpoint_every": 3}})
    assert _retention_of(cfg) == {"keep_last": 7, "checkpoint_every": 3}


class _CrashAfter:
    """A store whose delete() raises after ``n`` blob deletions (a process dying mid-collection)."""

    def __init__(self, inner: ObjectStore, n: int) -> None:
        self.inner, self.n, self.uri, self.max_concurrency = inner, n, inner.uri, 1

    def delete(self, key: str) -> None:
        if key.startswith(BLOB_PREFIX):
            if self.n == 0:
                raise KeyboardInterrupt("killed")
            self.n -= 1
        self.inner.delete(key)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_a_collection_cut_short_is_finished_by_the_next(tmp_path) -> None:
    store = LocalStore(tmp_path / "s")
    latest = _fake_run(store, "r", 4, shared=b"s")
    with pytest.raises(KeyboardInterrupt):
        collect_garbage(_CrashAfter(store, 2), latest, Retention(keep_last=1))
    # the garbage manifests are still there, so the next collection finds their blobs again
    assert store.exists("runs/r/steps/000000/train/policy/manifest.json")
    before = store.list_stats(BLOB_PREFIX + "/")
    # versions 1 and 2 list 4 blobs of their own, 2 of which the first collection deleted
    assert collect_garbage(store, latest, Retention(keep_last=1), dry_run=True).deleted_blobs == 2
    report = collect_garbage(store, latest, Retention(keep_last=1))
    live = [k for k in store.list("runs/") if k.endswith("manifest.json")]
    referenced = {blob_key(e["sha256"]) for k in live for e in read_manifest(store, k)["files"].values()}
    assert set(store.list(BLOB_PREFIX)) == referenced  # nothing missing, nothing orphaned
    # the report counts what this collection removed, not the blobs the first one had deleted
    gone = set(before) - set(store.list(BLOB_PREFIX))
    assert report.deleted_blobs == len(gone) == 2 and report.freed_bytes == sum(before[k][1] for k in gone)
    assert [d for d, dirs, files in os.walk(tmp_path / "s") if not dirs and not files] == [], \
        "a collection leaves no empty directory behind"


# ----------------------------------------------------------------------------- leftovers

_KILLED_PUBLISH = """
import os, stat, sys, time
from actions.store import LocalStore, put_artifact
fsyncs, fsync = [], os.fsync
def slow_fsync(fd):  # the third file's bytes are written, not yet renamed into place: killed here
    if stat.S_ISREG(os.fstat(fd).st_mode):
        fsyncs.append(fd)
        if len(fsyncs) == 3:
            print("writing", flush=True)
            time.sleep(60)
    fsync(fd)
os.fsync = slow_fsync
store = LocalStore(sys.argv[1], max_concurrency=1)
put_artifact(store, "runs/r/steps/000009/train/policy/manifest.json", {f"f{i}": os.urandom(1 << 20) for i in range(4)})
"""

DAY = 24 * 3600


def _kill_a_publish(root) -> None:
    """A process SIGKILLed while publishing a 4-file artifact: 2 blobs written, the third in
    its temporary file, no manifest."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_PUBLISH, str(root)], stdout=subprocess.PIPE, env=env,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def _temporaries(root) -> list:
    from pathlib import Path

    return sorted(p for p in Path(root).rglob(".tmp-*"))


def _age(paths, seconds: float) -> None:
    import os
    import time

    for p in paths:
        os.utime(p, (time.time() - seconds, time.time() - seconds))


def test_a_killed_writes_leftovers_go_once_old(tmp_path, capsys) -> None:
    """What a publish SIGKILLed part-way leaves: a temporary file (removed by the collection
    after every commit once an hour old) and blobs no manifest lists (removed by ``rlhfless gc``
    once a day old); neither while young, since a writer may still be at work."""
    from flows.commands.cli import main

    root = tmp_path / "store"
    store = LocalStore(root)
    latest = _fake_run(store, "r", 3, shared=b"s")
    before = set(store.list(BLOB_PREFIX))
    _kill_a_publish(root)
    [tmp] = _temporaries(root)
    orphans = set(store.list(BLOB_PREFIX)) - before
    assert len(orphans) == 2 and tmp.stat().st_size == 1 << 20
    report = collect_garbage(store, latest, Retention(keep_last=2))
    assert report.deleted_temporaries == 0 and tmp.exists()  # young: its writer may be alive
    _age([tmp, *(root / k for k in orphans)], 2 * DAY)
    report = collect_garbage(store, latest, Retention(keep_last=2))  # as after a commit
    assert (report.deleted_temporaries, report.temporary_bytes, report.orphan_blobs) == (1, 1 << 20, 0)
    assert _temporaries(root) == [] and orphans <= set(store.list(BLOB_PREFIX))
    assert main(["gc", "--store", str(root), "--keep-last", "2", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["orphan_blobs"] == 2 and orphans <= set(store.list(BLOB_PREFIX))
    assert main(["gc", "--store", str(root), "--keep-last", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["orphan_blobs"], report["orphan_bytes"]) == (2, 2 << 20)
    _assert_store_consistent(store)


def test_orphans_are_swept_on_both_backends_and_listed_blobs_never(backend_store) -> None:
    store = backend_store
    latest = _fake_run(store, "r", 3, shared=b"s")
    _fake_run(store, "other", 1, shared=b"t")
    orphan, _ = put_blob(store, b"uploaded, then its publish died")
    assert collect_garbage(store, latest, Retention(keep_last=2)).orphan_blobs == 0  # not after a commit
    assert collect_garbage(store, latest, Retention(keep_last=2), orphan_grace_s=3600).orphan_blobs == 0  # young
    assert store.exists(blob_key(orphan))
    dry = collect_garbage(store, latest, Retention(keep_last=2), orphan_grace_s=0, dry_run=True)
    assert (dry.orphan_blobs, dry.orphan_bytes) == (1, len(b"uploaded, then its publish died"))
    assert store.exists(blob_key(orphan))
    time.sleep(1.1)  # S3's LastModified has whole seconds
    report = collect_garbage(store, latest, Retention(keep_last=2), orphan_grace_s=0)
    assert report.orphan_blobs == 1 and not store.exists(blob_key(orphan))
    _assert_store_consistent(store)  # every blob of both runs' manifests is still there


def test_orphan_drafts_go_with_gc_once_old_and_referenced_ones_never(backend_store) -> None:
    """A crash between a commit and the deletion of the drafts it replaced leaves draft objects
    the committed ``draft_index`` does not point to; ``rlhfless gc`` deletes them once older
    than the grace period, never a referenced one, nor those of another run."""
    from flows.campaign.drafts import drafts_key

    store = backend_store
    latest = _fake_run(store, "r", 3, shared=b"s").model_copy(update={"step": 4, "draft_index": {"0": 1, "1": 2}})
    commit_state(store, latest)
    for run, step in (("r", 1), ("r", 2), ("r", 0), ("r", 77), ("other", 0)):
        store.put(drafts_key(f"runs/{run}", step), b'{"step": 0, "responses": {}}')
    assert collect_garbage(store, latest, Retention(keep_last=2)).orphan_drafts == 0  # not after a commit
    assert collect_garbage(store, latest, Retention(keep_last=2), orphan_grace_s=3600).orphan_drafts == 0  # young
    dry = collect_garbage(store, latest, Retention(keep_last=2), orphan_grace_s=0, dry_run=True)
    assert (dry.orphan_drafts, dry.orphan_draft_bytes) == (2, 2 * len(b'{"step": 0, "responses": {}}'))
    time.sleep(1.1)  # S3's LastModified has whole seconds
    report = collect_garbage(store, load_state(store, "r"), Retention(keep_last=2), orphan_grace_s=0)
    assert report.orphan_drafts == 2
    assert store.list("runs/r/drafts/") == [drafts_key("runs/r", 1), drafts_key("runs/r", 2)]
    assert store.list("runs/other/drafts/") == [drafts_key("runs/other", 0)]


@pytest.mark.s3
def test_folder_markers_in_the_bucket_are_left_alone_by_collections(s3_store) -> None:
    """Consoles, rclone and s3fs create empty "folder" objects whose keys end in '/': no store
    key can name them, so listings leave them out and collections neither fail on them nor
    delete them."""
    store = s3_store
    latest = _fake_run(store, "r", 5, shared=b"shared")
    orphan, _ = put_blob(store, b"uploaded, then its publish died")
    markers = [f"{store.prefix}/", f"{store.prefix}/runs/r/steps/000000/", f"{store.prefix}/{BLOB_PREFIX}/ab/"]
    for marker in markers:
        store._client.put_object(Bucket=store.bucket, Key=marker, Body=b"")
    assert not [k for k in store.list("") if not k or k.endswith("/")]
    assert not [k for k in store.list_stats(BLOB_PREFIX + "/") if k.endswith("/")]
    time.sleep(1.1)  # S3's LastModified has whole seconds
    report = collect_garbage(store, latest, Retention(keep_last=2), orphan_grace_s=0)
    assert report.versions_kept == [0, 4, 5] and report.orphan_blobs == 1 and not store.exists(blob_key(orphan))
    assert not store.list("runs/r/steps/000000/")
    for marker in markers:  # still there: not ours to delete
        store._client.head_object(Bucket=store.bucket, Key=marker)
    _assert_store_consistent(store)


class _WriterDuringSweep:
    """A store on which another writer publishes ``data`` (found present: not uploaded again)
    right after the sweep has listed the blobs, before it deletes the old ones."""

    def __init__(self, inner: LocalStore, data: bytes) -> None:
        self.inner, self.data, self.uri = inner, data, inner.uri

    def list_stats(self, prefix: str):
        listing = self.inner.list_stats(prefix)
        assert put_blob(self.inner, self.data) == (sha256_hex(self.data), False)
        return listing

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_the_sweep_spares_an_old_orphan_a_writer_is_about_to_list(tmp_path) -> None:
    """A blob left by a dead publish, days old, whose bytes a new publish finds present (so it
    does not upload them): the local store makes it young again, before or during the sweep."""
    store = LocalStore(tmp_path / "store")
    latest = _fake_run(store, "r", 2, shared=b"s")
    data = b"the same bytes, published again"
    digest, _ = put_blob(store, data)
    _age([tmp_path / "store" / blob_key(digest)], 2 * DAY)
    assert put_blob(store, data) == (digest, False)  # a writer before the sweep
    assert collect_garbage(store, latest, Retention(keep_last=2), orphan_grace_s=DAY).orphan_blobs == 0
    _age([tmp_path / "store" / blob_key(digest)], 2 * DAY)
    sweep = collect_garbage(_WriterDuringSweep(store, data), latest, Retention(keep_last=2), orphan_grace_s=DAY)
    assert sweep.orphan_blobs == 0 and store.exists(blob_key(digest))
    put_artifact(store, "runs/r/steps/000005/train/policy/manifest.json", {"w": data})  # that writer's manifest
    assert _temporaries(tmp_path / "store") == []
    _assert_store_consistent(store)


def test_status_and_gc_find_a_run_whose_latest_hint_was_never_written(tmp_path, capsys) -> None:
    """A crash between commit record 0 and ``latest.json``: the run exists (its record does)."""
    from flows.commands.cli import main

    root = tmp_path / "store"
    store = LocalStore(root)
    _fake_run(store, "r", 0, shared=b"s")
    store.delete("runs/r/campaign/latest.json")
    assert main(["status", "--store", str(root)]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "r"
    assert main(["gc", "--store", str(root), "--keep-last", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "r"


def test_gc_refuses_a_negative_orphan_grace(tmp_path, capsys) -> None:
    from flows.commands.cli import main

    assert main(["gc", "r", "--store", str(tmp_path), "--orphan-grace-hours", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--orphan-grace-hours -1.0" in err and "0 or more" in err


def test_retention_doctest() -> None:
    import doctest

    import flows.planning.retention

    result = doctest.testmod(flows.planning.retention)
    assert result.attempted > 0 and result.failed == 0


# ----------------------------------------------------------------------------- campaigns


def _policy_versions(store: ObjectStore, run: str) -> list[str]:
    return [k for k in store.list(f"runs/{run}/") if k.endswith("manifest.json")
            and ("/train/policy/" in k or "/policy/v" in k)]


def _assert_store_consistent(store: ObjectStore) -> None:
    """Every blob a manifest lists exists, and every blob is listed by some manifest."""
    live = [k for k in store.list("runs/") if k.endswith("manifest.json")]
    referenced = {blob_key(e["sha256"]) for k in live for e in read_manifest(store, k)["files"].values()}
    assert set(store.list(BLOB_PREFIX)) == referenced


def _growth(cfg, store: ObjectStore, run: str, steps: int, every: int) -> None:
    """After a campaign with keep_last=2: the reference plus the last two policy versions,
    plus one per checkpoint; optimizer state only for the newest two (a resume starts from
    either) and the checkpoints."""
    from flows.campaign.run import run_campaign

    summary = run_campaign(cfg, progress=lambda m: None)
    assert summary["steps_completed"] == steps and summary["gc"]["deleted_blobs"] > 0
    checkpoints = [v for v in range(every, steps - 1, every)]  # those outside the window
    expected = {f"runs/{run}/policy/v000000/manifest.json"} | {
        f"runs/{run}/steps/{v - 1:06d}/train/policy/manifest.json" for v in (*checkpoints, steps - 1, steps)}
    assert set(_policy_versions(store, run)) == expected
    optimizers = [k for k in store.list(f"runs/{run}/") if "/train/optimizer/" in k]
    assert len(optimizers) == len(checkpoints) + 2
    _assert_store_consistent(store)


def test_store_stays_bounded_over_a_campaign(tiny_config, prefect_harness) -> None:
    """A shortened equivalent of the 24-step default campaign (docs/storage.md records that one)."""
    cfg = tiny_config("invoker.kind=inprocess", "run_id=grow", "steps=6", "store.keep_last=2",
                      "store.checkpoint_every=4")
    _growth(cfg, LocalStore(cfg.store.uri), "grow", 6, 4)


@pytest.mark.slow
def test_store_growth_of_the_default_24_step_campaign(tmp_path, prefect_harness) -> None:
    from flows.config import load_config

    cfg = load_config(None, [f"store.uri={tmp_path / 'store'}", "run_id=grow24", "store.keep_last=2",
                             "store.checkpoint_every=8", f"invoker.log_dir={tmp_path / 'logs'}"])  # not ./runs
    _growth(cfg, LocalStore(cfg.store.uri), "grow24", 24, 8)


def test_another_run_s_damaged_manifest_stops_gc_but_not_a_campaign_s_collection(tmp_path) -> None:
    from actions.store import LocalStore, StoreError
    from flows.campaign.collect import Collector, UnreadableManifest

    store = LocalStore(tmp_path / "store")
    latest = _fake_run(store, "r", 4, shared=b"s")
    other = _fake_run(store, "other", 1, shared=b"t")
    store.put(other.policy_key, b'{"truncated')  # someone else's run, damaged
    with pytest.raises(UnreadableManifest, match=rf"manifest {other.policy_key} cannot be read") as caught:
        collect_garbage(store, latest, Retention(keep_last=1))
    assert isinstance(caught.value, StoreError)  # `rlhfless gc`: one line, exit 2
    warnings: list[str] = []
    collect = Collector(store, Retention(keep_last=1), lease=None, warn=warnings.append)
    collect(latest)
    collect(latest)  # it deletes nothing, warns once and the campaign trains on
    assert len(warnings) == 1 and "collects nothing until then and trains on" in warnings[0]
    assert collect.totals["skipped"] == 2 and collect.totals["deleted_blobs"] == 0
    assert _blob_exists(store, b"r-policy-1")


def test_a_campaign_s_collections_read_a_manifest_again_only_when_it_changed(backend_store) -> None:
    """After its first collection, a campaign's collection reads only the manifests that are new
    or were rewritten since (their listing tag changed), on both backends; a rewritten manifest
    of another run that now lists a blob of a garbage version keeps that blob."""
    from flows.campaign.collect import Collector

    store = backend_store
    latest = _fake_run(store, "r", 4, shared=b"s")
    other = _fake_run(store, "other", 1, shared=b"t")
    manifests = [k for k in store.list("runs/") if k.endswith("manifest.json")]
    collect = Collector(store, Retention(keep_last=1), lease=None)
    collect(latest)
    assert collect.known.reads == len(manifests)
    latest = _commit_next(store, latest, shared=b"s")  # a policy and an optimizer manifest more
    collect(latest)
    assert collect.known.reads == len(manifests) + 2
    assert not _blob_exists(store, b"r-policy-3") and _blob_exists(store, b"r-policy-4")  # 4: the previous commit
    latest = _commit_next(store, latest, shared=b"s")
    _publish(store, other.policy_key, {"w": b"r-policy-4", "s": b"t"})  # now shares version 4's bytes
    collect(latest)
    assert collect.known.reads == len(manifests) + 2 + 3  # two new, one rewritten
    assert not store.list("runs/r/steps/000003/") and _blob_exists(store, b"r-policy-4")
    assert not _blob_exists(store, b"r-adam-4")
    live = [k for k in store.list("runs/") if k.endswith("manifest.json")]
    assert all(_blob_exists(store, data) for data in (b"s", b"t", b"reference", b"r-policy-5", b"r-policy-6"))
    assert {blob_key(e["sha256"]) for k in live for e in read_manifest(store, k)["files"].values()} <= set(
        store.list(BLOB_PREFIX))  # every blob a manifest lists (the other run's first policy blob: an orphan now)


class _Untagged:
    """A store whose listing gives ``key`` no tag (an S3-compatible server that lists no ETag)."""

    def __init__(self, inner: ObjectStore, key: str) -> None:
        self.inner, self.key, self.uri = inner, key, inner.uri

    def list_tags(self, prefix: str):
        return {k: None if k == self.key else t for k, t in self.inner.list_tags(prefix).items()}

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_a_manifest_the_listing_gives_no_tag_is_read_by_every_collection(backend_store) -> None:
    """Untagged is not unlisted: another run's kept manifest without a tag still marks the blob
    it shares with a garbage version, at every collection (it is never kept from one to the next)."""
    from flows.campaign.collect import Collector

    latest = _fake_run(backend_store, "r", 4, shared=b"s")
    other = _fake_run(backend_store, "other", 1, shared=b"r-policy-2")  # r's version 2's bytes
    store = _Untagged(backend_store, other.policy_key)
    collect = Collector(store, Retention(keep_last=1), lease=None)
    collect(latest)
    assert _blob_exists(store, b"r-policy-2") and not _blob_exists(store, b"r-policy-1")
    first = collect.known.reads
    latest = _commit_next(backend_store, latest, shared=b"s")
    collect(latest)
    assert collect.known.reads == first + 2 + 1  # the two new manifests and the untagged one again
    assert _blob_exists(store, b"r-policy-2")
