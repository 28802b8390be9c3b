"""``--help`` texts: each benchmark's description is a whole sentence, and ``profile``'s
``--set`` is explained as ``train``'s is."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from flows.commands.cli import build_parser

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("bench_*.py"))


def _description(path: Path) -> str:
    """The ``description=`` a benchmark's ``ArgumentParser`` is built with, evaluated as the
    script does (its docstring as ``__doc__``), from the source: no script is imported."""
    tree = ast.parse(path.read_text(), str(path))
    found = [kw.value for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr == "ArgumentParser"
             for kw in node.keywords if kw.arg == "description"]
    assert len(found) == 1, f"{path.name}: {len(found)} ArgumentParser descriptions"
    code = compile(ast.Expression(found[0]), str(path), "eval")
    return eval(code, {"__builtins__": {}}, {"__doc__": ast.get_docstring(tree, clean=False)})


def test_benchmarks_are_found():
    assert len(BENCHMARKS) >= 20


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_a_benchmarks_description_ends_a_sentence(path: Path):
    """A description taken from the docstring is its whole first paragraph: one cut at the
    first line ends mid-sentence in ``--help``."""
    text = _description(path).rstrip()
    assert text.endswith((".", ")", ":")), f"{path.name}: --help description ends mid-sentence: {text[-60:]!r}"
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
    if text.split()[:3] == doc.split()[:3]:  # built from the docstring: all of its first paragraph
        assert text.split() == doc.split("\n\n")[0].split(), path.name


def _set_help(command: str) -> str | None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[command]
    return next(a.help for a in parser._actions if "--set" in a.option_strings)


def test_profile_explains_set_as_train_does():
    assert _set_help("train")
    assert _set_help("profile") == _set_help("train")
