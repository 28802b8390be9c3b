"""YAML for configurations and manifests, with aliases bounded and keys unique.

PyYAML's safe loader expands aliases by reference, so a few hundred bytes of nested anchors
("billion laughs") describe a structure of billions of nodes, which any later walk over it
(validation, an error message, a hash) then pays for. :func:`load_yaml` counts the nodes each
alias stands for and refuses a document whose aliases add more than ``MAX_ALIAS_NODES``
nodes in all, before anything is constructed. Ordinary use of anchors (a shared block
of settings reused a few times) stays far below the limit.

It also refuses a mapping that states one key twice, which the safe loader takes silently
(the last wins: a second ``algorithm:`` section drops the first one's settings without a
word). A key that overrides one brought in by a merge (``<<: *defaults``) is not a repeat.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_ALIAS_NODES = 10_000
"""Nodes that aliases may add to a document, all aliases together."""


class AliasBomb(ValueError):
    """A YAML document whose aliases expand past ``MAX_ALIAS_NODES``."""


class DuplicateKey(yaml.constructor.ConstructorError):
    """A mapping that states one key twice; ``problem`` says which and where, and the fix."""


class _BoundedLoader(yaml.SafeLoader):
    """A safe loader that charges every alias the size of the node it repeats."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            if anchor in self.anchors:
                self._alias_nodes += _size(self.anchors[anchor], self._sizes)
                if self._alias_nodes > MAX_ALIAS_NODES:
                    raise AliasBomb(f"its aliases expand to over {MAX_ALIAS_NODES} values (alias *{anchor[:40]})")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Node, deep: bool = False) -> dict:
        if isinstance(node, MappingNode):  # before the merge keys are flattened into the mapping
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # an unhashable key: the constructor refuses it with its own error
                    continue
                if first is not key_node:
                    raise DuplicateKey("while constructing a mapping", node.start_mark,
                                       f"the key {str(key)[:60]!r} is stated twice, first at line "
                                       f"{first.start_mark.line + 1}; keep one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _size(node: Node, memo: dict[int, int]) -> int:
    """Nodes under ``node``, itself included; a node being counted (a recursive alias) counts
    as the limit, so a cycle is refused."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = MAX_ALIAS_NODES + 1  # in progress: reaching it again is a cycle
    total = 1
    if isinstance(node, SequenceNode):
        total += sum(_size(child, memo) for child in node.value)
    elif isinstance(node, MappingNode):
        total += sum(_size(k, memo) + _size(v, memo) for k, v in node.value)
    memo[key] = total
    return total


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` with aliases bounded.

    Raises:
        AliasBomb: the aliases expand past the limit.
        DuplicateKey: a mapping states a key twice (a ``yaml.YAMLError``).
        yaml.YAMLError: the text is not YAML.
    """
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def yaml_problem(exc: yaml.YAMLError) -> str:
    """Where a YAML error is, what it is and the fix, to follow "not valid YAML" in a message:
    ``" at line 3, column 5: mapping values are not allowed here; fix the syntax"`` (what the
    error holds of it; a duplicate key's problem states its own fix)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [""])[0]
    fix = "" if isinstance(exc, DuplicateKey) else "; fix the syntax"
    return (f"{where}: {problem}" if problem else where) + fix
