"""docs/architecture.md names only modules that exist (it describes the tree as it is)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"

PATH = re.compile(r"\b((?:actions|flows|tests|docs|infra|benchmarks)/[\w/.-]*[\w/])")
SECTION_ENTRY = re.compile(r"^(\s*)([\w<>]+/)(?:\s|$)")  # a folder line of the layout block
BLOCK_FILE = re.compile(r"\b(\w+\.py)\b")


def named_paths(text: str) -> set[str]:
    """Every path the page names: ``a/b.py`` anywhere, plus the file names listed under a
    folder in the layout block (``step/ ... flow.py``), joined to that folder."""
    paths = {m.rstrip("/") for m in PATH.findall(text)}
    block = text.split("```")[1] if "```" in text else ""
    stack: list[tuple[int, str]] = []
    folder = ""
    for line in block.splitlines():
        entry = SECTION_ENTRY.match(line)
        if entry and not entry.group(2).startswith("<"):
            indent = len(entry.group(1))
            stack = [(i, f) for i, f in stack if i < indent] + [(indent, entry.group(2))]
            folder = "".join(f for _, f in stack)
        if folder:
            paths |= {folder + name for name in BLOCK_FILE.findall(line.split("/", 1)[-1] if entry else line)}
    return paths


def test_every_module_named_in_the_architecture_page_exists():
    text = DOC.read_text()
    named = named_paths(text)
    assert len(named) > 40  # the page names the tree; a parser that finds nothing proves nothing
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_check_catches_a_stale_name():
    assert "flows/step/gone.py" in named_paths("see `flows/step/gone.py`")
    layout = "```\nflows/\n  step/   flow.py, gone.py\n```\n"
    assert {"flows/step/flow.py", "flows/step/gone.py"} <= named_paths(layout)
