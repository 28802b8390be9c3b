"""The machine's cores, divided among the activations that run on it at the same time.

An action sets torch's intra-op threads per activation (``actions.common.loading``), to the
share its invoker hands it here: all the cores when it runs alone (training, evaluation), an
equal share when several run side by side (a generation fan-out). Shares are fixed at an
activation's start: one that starts while another runs keeps its smaller share to the end,
so the sum of the threads never exceeds the cores by more than the activations that started
alone and were joined later.

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

MKL_REPRODUCIBLE = "AUTO,STRICT"
"""``MKL_CBWR`` for action processes: MKL's GEMMs give the same bits for any thread count
(strict conditional numerical reproducibility, MKL 2019.3+) on this CPU's code path."""


def available_cores() -> int:
    """The cores this process may run on (its affinity mask; the CPU count where there is none)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class CoreShare:
    """Hands each starting activation ``max(1, num_cores // running)`` threads.

    Args:
        num_cores: cores to divide; 0 means ``available_cores()``.
    """

    def __init__(self, num_cores: int = 0) -> None:
        self.num_cores = num_cores or available_cores()
        self._running = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def share(self) -> Iterator[int]:
        """Count one activation as running while the block runs; yields its thread count."""
        with self._lock:
            self._running += 1
            threads = max(1, self.num_cores // self._running)
        try:
            yield threads
        finally:
            with self._lock:
                self._running -= 1
