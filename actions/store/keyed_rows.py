"""A read-only mapping over ``_rows`` whose values its subclass builds when asked for.

The stored tables indexed by id hold each row in the compact form they were read in and build
it on access: a stored dataset in an action (``actions/tasks/stored.py``), the token table in
the flow (``flows/step/token_table.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class KeyedRows(Mapping[K, V]):
    """Membership, order and size are those of ``_rows`` (set by the subclass's ``__init__``);
    the subclass's ``__getitem__`` builds a row from its entry."""

    _rows: dict[K, Any]

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def __iter__(self) -> Iterator[K]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)
