"""The repository stands alone: no code or doc cites a file that is not in it.

Design notes kept beside a checkout are not part of it, so a citation of one (an upper-case
document name with a section, or a numbered principle such as ``(P7)``) is a dead reference
for every reader of the repository. The paper the design follows is cited as "paper §N"
(the README names it).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Built from parts so this file does not match itself.
_DOCS = "|".join(["PAP" + "ER", "ECOSY" + "STEM", "ARCHI" + "TECTURE", "STY" + "LE", "ANCH" + "ORS", "GPU-" + "NOTES"])
PATTERNS = {
    "an outside design document": re.compile(rf"\b(?:{_DOCS})(?:\.md)?\b(?:\s*(?:§|invariant|[A-D]\.\d|P\d|\d\.\d))?"),
    "a numbered design principle": re.compile(r"\((?:STY" + r"LE )?P\d{1,2}\b"),
    "a path into the design notes": re.compile(r"shared/(?:des" + r"ign|spe" + r"cs)/"),
}
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".json", ""}


def _tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    files = [REPO / name for name in out.splitlines()]
    return [f for f in files if f.is_file() and (f.suffix in SUFFIXES or f.name in {"Makefile", "Dockerfile"})]


def test_no_citation_of_a_file_outside_the_repository():
    found = []
    for path in _tracked_text_files():
        if path.name == Path(__file__).name or path.stat().st_size > 2_000_000:
            continue
        text = path.read_text(errors="replace")
        for what, pattern in PATTERNS.items():
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(REPO)}:{line}: {what}: {match.group(0)!r}")
    assert not found, "rephrase these to stand alone or point at a file in the repository:\n" + "\n".join(found)


def test_the_pattern_catches_what_it_is_for():
    samples = ["see PAP" + "ER §3.5", "(STY" + "LE P7)", "ECOSY" + "STEM §0.7", "ARCHI" + "TECTURE invariant 3",
               "(P12)", "../shared/des" + "ign/x.md"]
    for sample in samples:
        assert any(p.search(sample) for p in PATTERNS.values()), sample
    assert not any(p.search("the paper §3.5 and docs/architecture.md") for p in PATTERNS.values())
