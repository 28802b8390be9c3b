"""One JSON line per figure, printed as it is measured: a benchmark stopped at its time limit
(the GPU check's parts) keeps every figure it printed or wrote before."""

from __future__ import annotations

import json


def emit(record: dict, path: str | None) -> None:
    """Print ``record`` as one JSON line (flushed), and append it to ``path`` where given."""
    line = json.dumps(record)
    print(line, flush=True)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
