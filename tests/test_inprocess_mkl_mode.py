"""The in-process invoker runs actions with MKL in the mode of a pool worker (``MKL_CBWR``).

MKL's default mode rounds a matrix-vector product such as PPO's value head (hidden x 1)
differently from its strict reproducible mode, which every pool worker runs in: a PPO campaign
ended at other weights in process than on the local pool (step 1's ``loss/value`` differed in
the 8th digit, then step 2's values, advantages and policy).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from flows.invokers.cores import MKL_REPRODUCIBLE

ROOT = Path(__file__).resolve().parents[1]

VALUE_HEAD = ("import hashlib, torch; g = torch.Generator().manual_seed(0); torch.set_num_threads(2); "
              "h = torch.randn(500, 64, generator=g); w = torch.randn(1, 64, generator=g); "
              "print(os.environ.get('MKL_CBWR'), hashlib.sha256((h @ w.T).numpy().tobytes()).hexdigest())")
"""A value head's forward (500 tokens x 64 hidden -> 1), and the MKL mode the process asked for."""


def _run(code: str, **env: str) -> list[str]:
    """``code`` in a fresh process (MKL reads its mode at its first call); its last line's words."""
    base = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    base["PYTHONPATH"] = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    out = subprocess.run([sys.executable, "-c", f"import os; {code}"], cwd=ROOT, env={**base, **env},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1].split()


def test_in_process_actions_compute_the_value_head_as_a_pool_worker_does():
    pool = _run(VALUE_HEAD, MKL_CBWR=MKL_REPRODUCIBLE)  # a pool worker's environment (local_pool._spawn)
    inprocess = _run("from flows.invokers.inprocess import InProcessInvoker; InProcessInvoker(2); " + VALUE_HEAD)
    assert inprocess == pool == [MKL_REPRODUCIBLE, pool[1]]


def test_a_mode_the_user_chose_is_kept():
    chosen = _run("from flows.invokers.inprocess import InProcessInvoker; InProcessInvoker(1); " + VALUE_HEAD,
                  MKL_CBWR="COMPATIBLE")
    assert chosen[0] == "COMPATIBLE"
