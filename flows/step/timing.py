"""Wall time per phase of a step, each phase timed by one context manager.

>>> clock = PhaseClock()
>>> with clock.phase("prefill"):
...     pass
>>> list(clock.timing())
['prefill', 'step']
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class PhaseClock:
    """Seconds of each phase timed with :meth:`phase`, in the order they ran, and of the whole
    step since the clock was made."""

    def __init__(self) -> None:
        self.started = time.time()
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            self.seconds[name] = time.time() - start

    def timing(self) -> dict[str, float]:
        """Every phase's seconds and ``step``: the seconds since the clock was made."""
        return {**self.seconds, "step": time.time() - self.started}
