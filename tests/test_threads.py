"""Cores per activation: the share an invoker hands out, and numerics that do not depend on it.

The local pool gives each activation ``cores // running`` torch threads (``flows.invokers.cores``),
so one sample may be generated with 1 thread in a fan-out of three and with 2 threads alone,
and a training step may get a different count on a different machine. The bits must not
change with it: MKL in its strict reproducible mode (``MKL_CBWR``, set for every pool worker)
and the losses' all-element reductions done row by row (``actions.rl.masked``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import torch

from actions.rl.masked import masked_mean, masked_sum
from flows.invokers.cores import MKL_REPRODUCIBLE, CoreShare, available_cores
from flows.invokers.inprocess import InProcessInvoker

ROOT = Path(__file__).resolve().parents[1]


def test_core_share_gives_all_cores_alone_and_a_share_side_by_side():
    share = CoreShare(4)
    with share.share() as alone:
        assert alone == 4  # a training step running alone: the whole machine
        with share.share() as second:
            assert second == 2
            with share.share() as third, share.share() as fourth, share.share() as fifth:
                assert (third, fourth, fifth) == (1, 1, 1)  # never below one thread
    with share.share() as again:
        assert again == 4  # finished activations give their share back
    assert CoreShare(0).num_cores == available_cores() >= 1


def test_generation_leaves_the_control_plane_a_core():
    share = CoreShare(4)
    with share.share("generate") as alone:
        assert alone == 3  # Prefect's server and the campaign work while generation runs
        with share.share("generate") as second, share.share("train_step") as trainer:
            assert (second, trainer) == (1, 1)
    with share.share("train_step") as train:
        assert train == 4  # training runs while the control plane waits
    with CoreShare(1).share("generate") as only:
        assert only == 1  # never fewer than one thread


def test_core_share_counts_concurrent_activations_from_threads():
    share, seen, barrier = CoreShare(2), [], threading.Barrier(2)

    def run() -> None:
        with share.share() as n:
            barrier.wait()  # both are running at once before either leaves
            seen.append(n)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == [1, 2]  # the first started alone, the second beside it


def test_inprocess_invoker_hands_the_action_all_its_cores(monkeypatch):
    import actions.noop as noop

    seen = {}
    monkeypatch.setattr(noop, "main", lambda args: seen.update(args) or {"ok": True})
    inv = InProcessInvoker(num_cores=3)
    inv.invoke("noop", {"x": 1})
    assert seen["__threads"] == 3 and inv.calls == [("noop", {"x": 1})]  # the record stays the user's payload


def test_masked_reductions_give_the_same_bits_for_any_thread_count():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4096, generator=g)  # 262,144 elements: above ATen's parallel grain
    mask = torch.rand(64, 4096, generator=g) > 0.2
    before = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3, 4):
            torch.set_num_threads(n)
            results.append((masked_sum(x, mask), masked_mean(x, mask)))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(r[0], results[0][0]) and torch.equal(r[1], results[0][1]) for r in results)


def _probe(thread_counts: list[int]) -> list[str]:
    """Matrix products with a long inner dimension (100,003: a weight gradient summed over the
    tokens of a large batch), where MKL splits the sum among threads, at each thread count;
    the sha256 of the results. Without ``MKL_CBWR`` strict mode they differ at 3 threads."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(100_003, 37, generator=g)
    c = torch.randn(37, 100_003, generator=g)
    digests = []
    for n in thread_counts:
        torch.set_num_threads(n)
        h = hashlib.sha256()
        for out in (a.T @ a, c @ a, torch.nn.functional.linear(c, c)):
            h.update(out.numpy().tobytes())
        digests.append(h.hexdigest())
    return digests


def test_matrix_products_are_the_same_bits_with_1_to_4_threads_in_a_pool_worker_environment():
    # A fresh process: MKL reads MKL_CBWR once, at its first call, as a pool worker does.
    env = dict(os.environ, MKL_CBWR=MKL_REPRODUCIBLE, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    code = "import json, tests.test_threads as t; print(json.dumps(t._probe([1, 2, 3, 4])))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    digests = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(set(digests)) == 1, digests
