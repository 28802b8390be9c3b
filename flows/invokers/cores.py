"""The machine's cores, divided among the activations that run on it at the same time.

An action sets torch's intra-op threads per activation (``actions.models.loading``), to the
share its invoker hands it here: all the cores when it runs alone (training, evaluation), an
equal share when several run side by side (a generation fan-out). Shares are fixed at an
activation's start: one that starts while another runs keeps its smaller share to the end,
so the sum of the threads never exceeds the cores by more than the activations that started
alone and were joined later.

Generation leaves one core to the control plane (``CONTROL_PLANE_ACTIONS``): Prefect's server
and the campaign run on the same cores and do their per-step work while the generation phase
runs (the task runs' reports, the previous step's artifacts, the next step's flow run). A
decode loop is hundreds of small parallel regions per token, and its OpenMP team waits at
every one whose thread has lost its core: at 16 prompts x 4 x 32 tokens on the tiny Qwen2
with two cores, one generate took 0.21-0.25 s at two threads and 0.12 s at one; alone, 0.10 s
at one thread and 0.10-0.13 s at two. Training keeps every core: the control plane waits
while it runs, and at 32 x 8 x 128 it took 1.03 s at two threads against 1.59 s at one.

Numerics do not depend on the share where a thread count would change them: pool workers run
MKL in its strict reproducible mode (``MKL_CBWR``), whose matrix products give the same bits
for any thread count, and the losses' all-element reductions go row by row
(``actions.rl.masked``). Generation and scoring reduce within rows (softmax, norms, small inner
dimensions), which no thread count splits. Measured: a generate, score and train round trip at
32 x 8 x 128 on a Qwen2-shaped model gives the same samples, log-probs and weights with 1, 2, 3
and 4 threads (tests/test_threads.py tests the pieces). Not pinned: ATen's column sums over
very many rows (a bias gradient) may split the summed dimension at 7 or more threads.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

MKL_REPRODUCIBLE = "AUTO,STRICT"
"""``MKL_CBWR`` for action processes: MKL's GEMMs give the same bits for any thread count
(strict conditional numerical reproducibility, MKL 2019.3+) on this CPU's code path."""


def available_cores() -> int:
    """The cores this process may run on (its affinity mask; the CPU count where there is none)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def pool_cores(cfg: Any) -> int:
    """Cores the local pool's activations share (``invoker.num_cores``, 0: this process's)."""
    return cfg.invoker.num_cores or available_cores()


CONTROL_PLANE_ACTIONS = frozenset({"generate"})
"""Actions that run while the control plane works, and leave it one core (module docstring)."""


def activation_threads(num_cores: int, running: int, action: str | None = None) -> int:
    """Threads of an activation of ``action`` that starts with ``running`` activations running
    (itself included): an equal share of the cores, less the control plane's core for
    ``CONTROL_PLANE_ACTIONS`` on a machine with more than one; never fewer than one."""
    cores = num_cores - 1 if action in CONTROL_PLANE_ACTIONS and num_cores > 1 else num_cores
    return max(1, cores // max(1, running))


class CoreShare:
    """Hands each starting activation ``activation_threads(num_cores, running, action)`` threads.

    Args:
        num_cores: cores to divide; 0 means ``available_cores()``.
    """

    def __init__(self, num_cores: int = 0) -> None:
        self.num_cores = num_cores or available_cores()
        self._running = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def share(self, action: str | None = None) -> Iterator[int]:
        """Count one activation of ``action`` as running while the block runs; yields its thread count."""
        with self._lock:
            self._running += 1
            threads = activation_threads(self.num_cores, self._running, action)
        try:
            yield threads
        finally:
            with self._lock:
                self._running -= 1
