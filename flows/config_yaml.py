"""YAML for configurations, with aliases bounded.

PyYAML's safe loader expands aliases by reference, so a few hundred bytes of nested anchors
("billion laughs") describe a structure of billions of nodes, which any later walk over it
(validation, an error message, a hash) then pays for. :func:`load_yaml` counts the nodes each
alias stands for and refuses a document whose aliases add more than ``MAX_ALIAS_NODES``
nodes in all, before anything is constructed. Ordinary use of anchors (a shared block
of settings reused a few times) stays far below the limit.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_ALIAS_NODES = 10_000
"""Nodes that aliases may add to a document, all aliases together."""


class AliasBomb(ValueError):
    """A YAML document whose aliases expand past ``MAX_ALIAS_NODES``."""


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
        yaml.YAMLError: the text is not YAML.
    """
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
