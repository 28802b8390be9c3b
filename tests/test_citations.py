"""Every repository file a source file cites (in a comment or a docstring: ``flows/step/flow.py``,
``docs/storage.md``) exists. A path prefixed by another repository (``apache/openwhisk:docs/...``)
is that repository's and is not checked."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITED = re.compile(r"(?<![\w/.:-])((?:flows|actions|tests|benchmarks|docs|infra|runtime_images)/[\w/.-]*\w"
                   r"\.(?:py|md|yaml|yml|json|toml|txt))")


def missing_citations(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: cited`` for every cited path under ``root`` that does not exist."""
    return [f"{path.relative_to(root)}:{number}: {m.group(1)}"
            for number, line in enumerate(path.read_text().splitlines(), start=1)
            for m in CITED.finditer(line) if not (root / m.group(1)).exists()]


def test_the_check_can_fail(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('"""See ``flows/gc.py`` and apache/openwhisk:docs/actions-new.md."""\n')
    assert missing_citations(probe, tmp_path) == ["probe.py:1: flows/gc.py"]


def test_sources_cite_files_that_exist() -> None:
    sources = [p for d in ("flows", "actions", "benchmarks") for p in sorted((ROOT / d).rglob("*.py"))]
    assert sum(len(CITED.findall(p.read_text())) for p in sources) > 50  # the check reads the citations
    found = [c for p in sources for c in missing_citations(p)]
    assert not found, "citations of files that are not in the repository:\n" + "\n".join(found)
