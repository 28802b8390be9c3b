"""How fast a second ``rlhfless train`` on a held run is refused (target: exit 2 within 5 s).

Writes a lease held by a live process of another host into a fresh local store and into a
SeaweedFS store (started here), then runs ``rlhfless train --run-id held`` as a subprocess
``--reps`` times per store and reports the wall time from spawn to exit (median and max), the
exit code, the load average, and the error line. Everything a real refusal costs is inside:
interpreter start, imports, config and input validation, opening the store (S3: boto3 client
and one check request) and reading the lease.

With ``--while-training``, the holder is a real campaign instead: ``rlhfless train`` of a
tiny configuration on the local pool (with its own temporary Prefect server unless
``PREFECT_API_URL`` is set), and the refusals are timed while it runs, on the same cores.

Usage::

    python benchmarks/bench_lease.py --reps 5
    python benchmarks/bench_lease.py --reps 5 --while-training
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from actions.store import ObjectStore, open_store  # noqa: E402
from flows.campaign.lease import LeaseRecord, lease_key  # noqa: E402


def _hold(store: ObjectStore) -> None:
    now = time.time()
    store.put(lease_key("held"), LeaseRecord(run_id="held", host="elsewhere", pid=4242, token="0" * 32, since=now,
                                             renewed=now, expires=now + 3600).encode())


def _measure(uri: str, env: dict[str, str], reps: int) -> tuple[list[float], set[int], str]:
    times, codes, line = [], set(), ""
    for _ in range(reps):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "flows.commands.cli", "train", "--set", f"store.uri={uri}",
                               "--run-id", "held"], env=env, capture_output=True, text=True, cwd=ROOT)
        times.append(time.perf_counter() - t0)
        codes.add(proc.returncode)
        line = proc.stderr.strip()
    return times, codes, line


def _while_training(tmp: str, env: dict[str, str], reps: int) -> None:
    """Time refusals while a real campaign holds the run (its lease file exists and it trains)."""
    from conftest import TINY_OVERRIDES

    store = str(Path(tmp) / "store")
    args = [a for o in (*TINY_OVERRIDES, f"store.uri={store}", "steps=50", "invoker.num_workers=2") for a in ("--set", o)]
    first = subprocess.Popen([sys.executable, "-m", "flows.commands.cli", "train", *args, "--run-id", "held",
                              "--out", str(Path(tmp) / "out")], env=env, cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in first.stdout:  # wait for the first step's progress line: the campaign runs
            if "step 1/50" in line:
                break
        else:
            raise SystemExit(f"the first train exited with {first.wait()} before its first step")
        times, codes, line = _measure(store, env, reps)
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; a campaign runs; {reps} refusals")
        print(f"local exit {sorted(codes)}  median {statistics.median(times):.2f} s  max {max(times):.2f} s"
              "  (target <= 5 s)")
        print(f"line: {line}")
    finally:
        first.terminate()
        first.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--while-training", action="store_true", help="the holder is a running campaign")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if args.while_training:
        with tempfile.TemporaryDirectory() as tmp:
            _while_training(tmp, env, args.reps)
        return
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        local = str(Path(tmp) / "store")
        _hold(open_store(local))
        rows.append(("local", *_measure(local, env, args.reps)))
        from s3server import SeaweedS3Server, find_weed

        if find_weed() is not None:
            with SeaweedS3Server(Path(tmp) / "weed") as server:
                uri = server.uri("bench")
                s3_env = {**env, **server.env()}
                from actions.store.s3 import S3Store

                _hold(S3Store.from_uri(uri, env=server.env()))
                rows.append(("s3", *_measure(uri, s3_env, args.reps)))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {args.reps} refusals per store")
    for name, times, codes, line in rows:
        print(f"{name:5s} exit {sorted(codes)}  median {statistics.median(times):.2f} s  max {max(times):.2f} s"
              f"  (target < 5 s)")
    print(f"line: {rows[-1][3]}")


if __name__ == "__main__":
    main()
