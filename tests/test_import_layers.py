"""The import structure of ``actions/`` and ``flows/``, read statically (``ast``, no imports
run, milliseconds): no import cycle, the layer rules below, and no source file above 500 lines.

Every ``import`` counts -- top level or inside a function (a lazy import still ties the two
modules together) -- except those under ``if TYPE_CHECKING:``, which never run. A layer rule
says that modules under one prefix import nothing under some others; to add one, append a
:class:`Rule` to :data:`RULES` (third-party packages are matched the same way: ``"torch"``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("actions", "flows")
MAX_LINES = 500


@dataclass(frozen=True)
class Rule:
    """Modules named ``importers`` (or under it) import no module named in ``forbidden`` (or under one)."""

    importers: str
    forbidden: tuple[str, ...]
    why: str


# actions/, bottom up: config < contracts < store < models < engines, rl, tasks < runtime < the
# actions themselves (one module per action, directly under actions/)
ACTION_MODULES = tuple(sorted(f"actions.{p.stem}" for p in (ROOT / "actions").glob("*.py")
                              if p.stem not in ("__init__", "contracts")))
_ACTION_TIERS = ("actions.engines", "actions.rl", "actions.tasks", "actions.runtime") + ACTION_MODULES

RULES = [
    Rule("actions.config", ("actions.contracts", "actions.store", "actions.models") + _ACTION_TIERS,
         "the workload's configuration is the bottom of actions/: plain pydantic sections"),
    Rule("actions.contracts", ("actions.store", "actions.models") + _ACTION_TIERS,
         "the wire messages are built from the configuration alone, so flows and actions share them"),
    Rule("actions.store", ("actions.models",) + _ACTION_TIERS,
         "the object store and what is kept in it sit below every model, engine and action that uses them"),
    Rule("actions.models", _ACTION_TIERS,
         "model loading sits below the engines, the RL math, the tasks and the runtime that use it"),
    *(Rule(package, ACTION_MODULES, "shared action code never imports an action")
      for package in ("actions.engines", "actions.rl", "actions.tasks", "actions.runtime")),
    Rule("actions", ("flows", "prefect"), "actions run in containers without the orchestrator"),
    # flows/: commands > campaign > step > invokers, simulate > planning
    Rule("flows.planning", ("flows.step", "flows.campaign", "flows.invokers", "flows.simulate", "flows.commands",
                            "flows.config"),
         "planning is pure and below everything that uses it: the live step, the campaign and the simulator"),
    Rule("flows.step", ("flows.campaign", "flows.commands", "flows.simulate"),
         "one step knows nothing of the campaign around it"),
    Rule("flows.invokers", ("flows.step", "flows.campaign", "flows.commands", "flows.simulate"),
         "how an action is called is below what calls it"),
    Rule("flows.simulate", ("flows.step", "flows.campaign", "flows.invokers", "flows.commands"),
         "the simulator drives the planning code alone"),
    Rule("flows.campaign", ("flows.commands",), "the CLI starts campaigns, not the other way round"),
]


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@cache
def project_modules() -> dict[str, Path]:
    """Every module of PACKAGES by dotted name (a package by its ``__init__``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST, type_checking: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, skipping the bodies of ``if TYPE_CHECKING:`` unless ``type_checking``."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))
    return found


@cache
def imports_of(module: str, type_checking: bool = False) -> frozenset[str]:
    """Dotted names ``module`` imports: a project module where the name is one (``from p
    import m`` gives ``p.m`` when ``m`` is a module, else ``p``), else as written;
    ``type_checking``: those under ``if TYPE_CHECKING:`` too."""
    modules = project_modules()
    path = modules[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path)), type_checking):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:  # relative: from .x import y
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        for alias in node.names:
            child = f"{base}.{alias.name}"
            names.add(child if child in modules else base)
    return frozenset(names)


def project_graph(type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports (``type_checking``: for type checking too)."""
    modules = project_modules()
    return {m: {n for n in imports_of(m, type_checking) if n in modules and n != m} for m in modules}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


# ----------------------------------------------------------------------------- the checks


def test_the_analysis_sees_imports() -> None:
    # guards against a checker that passes because it reads nothing
    assert len(project_modules()) > 100
    assert "actions.store.local" in imports_of("actions.store")
    assert "actions.store.s3" in imports_of("actions.store.uri")  # a lazy import counts
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle() -> None:
    found = cycles(project_graph())
    assert not found, "import cycles (break each by moving the shared part below both): " + \
        "; ".join(" <-> ".join(c) for c in found)


def test_no_import_cycle_even_for_type_checking() -> None:
    """A ``TYPE_CHECKING`` import never runs, but a circle through one still ties two layers
    together: the lower one names a type of the upper one. Move the type below both."""
    found = cycles(project_graph(type_checking=True))
    assert not found, "import cycles through TYPE_CHECKING imports: " + \
        "; ".join(" <-> ".join(c) for c in found)


def test_type_checking_imports_are_seen() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a.b\n")
    assert [n.names[0].name for n in _import_nodes(tree, type_checking=True) if isinstance(n, ast.Import)] == ["a.b"]
    assert not [n for n in _import_nodes(tree) if isinstance(n, ast.Import)]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.importers)
def test_layer_rule(rule: Rule) -> None:
    broken = sorted(
        f"{module} imports {name}"
        for module in project_modules() if _under(module, rule.importers)
        for name in imports_of(module) if any(_under(name, f) for f in rule.forbidden)
    )
    assert not broken, f"{rule.importers} must not import {', '.join(rule.forbidden)} ({rule.why}):\n" + \
        "\n".join(broken)


def non_test_sources() -> list[Path]:
    """Every Python file of the repository outside ``tests/`` (and outside hidden folders)."""
    return [p for p in sorted(ROOT.rglob("*.py"))
            if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
            and p.relative_to(ROOT).parts[0] not in ("tests", "runs", "build")]


def test_no_source_file_above_500_lines() -> None:
    sources = non_test_sources()
    assert any(p.relative_to(ROOT).parts[0] == "benchmarks" for p in sources)
    long = sorted(
        f"{path.relative_to(ROOT)}: {n} lines"
        for path in sources if (n := len(path.read_text().splitlines())) > MAX_LINES
    )
    assert not long, f"split these into cohesive modules under {MAX_LINES} lines:\n" + "\n".join(long)


MAX_FUNCTION_LINES = 60


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``name (lines)`` of every function or method in ``path`` longer than ``limit`` lines
    (decorators excluded, docstring included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{node.name} ({node.end_lineno - node.lineno + 1})" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


def test_no_function_in_flows_above_60_lines(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)  # 61 lines: the check can fail
    assert long_functions(probe) == [f"f ({MAX_FUNCTION_LINES + 1})"]
    found = [f"{path.relative_to(ROOT)}: {name}" for path in sorted((ROOT / "flows").rglob("*.py"))
             for name in long_functions(path)]
    assert not found, f"split these into functions of at most {MAX_FUNCTION_LINES} lines:\n" + "\n".join(found)
