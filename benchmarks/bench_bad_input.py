"""Cost of refusing hostile input: wall time and peak memory of ``rlhfless train`` on the
four inputs that once cost minutes or gigabytes (targets: exit 2 within 2 s, under 200 MB).

The cases (from ``tests/test_bad_input_battery.py``): a dataset row holding a 10 MiB prompt,
a 355-byte YAML alias bomb under a known key, ``weight: .nan`` in ``reward.functions`` and
``invoker.read_timeout_s: .inf``. Each runs ``--reps`` times as a subprocess; the wall time
is from spawn to exit, the peak RSS is the child's own (``VmHWM``), printed with the median
and worst of each and the ratio to the targets. The baseline, ``--help`` of the same CLI,
is measured beside them: the interpreter and import floor that any refusal pays.

    python benchmarks/bench_bad_input.py [--reps 3]
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

from test_bad_input_battery import CASES  # noqa: E402

NAMES = ("dataset 10 MiB prompt", "config YAML alias bomb", "config nan reward weight", "config infinite read timeout")
TARGET_S, TARGET_MB = 2.0, 200.0
# The child's own peak (VmHWM of its address space): the kernel's ru_maxrss would also count the
# parent's memory before exec.
SPAWN = ("import atexit, os, runpy, sys; out = sys.argv[1]; os.chdir(sys.argv[2]); "
         "atexit.register(lambda: open(out, 'w').write([l for l in open('/proc/self/status') "
         "if l.startswith('VmHWM')][0].split()[1])); sys.argv = ['rlhfless', *sys.argv[3:]]; "
         "runpy.run_module('flows.commands.cli', run_name='__main__')")


def _run(argv: list[str], cwd: Path) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MB, exit code) of one CLI run."""
    peak_file = cwd / "peak_kb"
    devnull = os.open(os.devnull, os.O_WRONLY)
    t0 = time.perf_counter()
    pid = os.posix_spawn(sys.executable, [sys.executable, "-c", SPAWN, str(peak_file), str(cwd), *argv],
                         {**os.environ, "PYTHONPATH": str(ROOT)},
                         file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)])
    _, status = os.waitpid(pid, 0)
    elapsed = time.perf_counter() - t0
    os.close(devnull)
    return elapsed, int(peak_file.read_text()) / 1024, os.waitstatus_to_exitcode(status)


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; targets: {TARGET_S} s, {TARGET_MB} MB")
    print(f"{'case':32s} {'exit':>4s} {'median s':>9s} {'max s':>7s} {'x target':>8s} {'peak MB':>8s} {'x target':>8s}")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        rows = [("baseline: train --help", ["train", "--help"], base)]
        for name in NAMES:
            case_dir = base / name.replace(" ", "_")
            case_dir.mkdir()
            case = CASES[name]
            if case.setup:
                case.setup(case_dir)
            rows.append((name, [a.format(tmp=case_dir, done=case_dir) for a in case.args], case_dir))
        for name, argv, cwd in rows:
            runs = [_run(argv, cwd) for _ in range(args.reps)]
            times, peaks = [r[0] for r in runs], [r[1] for r in runs]
            codes = sorted({r[2] for r in runs})
            print(f"{name:32s} {','.join(map(str, codes)):>4s} {statistics.median(times):9.2f} {max(times):7.2f} "
                  f"{max(times) / TARGET_S:8.2f} {max(peaks):8.1f} {max(peaks) / TARGET_MB:8.2f}")


if __name__ == "__main__":
    main()
