"""External string ids at the edges, dense int32 indices inside."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np


class IdMap:
    """A bijection between external string ids and row numbers ``0..n-1``.

    Row order is the order of ``ids``; it is the row order of every array in
    an artifact that is indexed by this id space.
    """

    __slots__ = ("_ids", "_index", "_max_bytes")

    def __init__(self, ids: Sequence[str]):
        self._ids = list(ids)
        self._index = {external: row for row, external in enumerate(self._ids)}
        self._max_bytes: int | None = None
        if len(self._index) != len(self._ids):
            dup = next(x for x, count in Counter(self._ids).items() if count > 1)
            raise ValueError(f"duplicate id {dup!r} in id map")

    @classmethod
    def from_values(cls, values: Iterable[str]) -> tuple[IdMap, np.ndarray]:
        """Map a column of external ids, numbering them in order of first appearance.

        Returns the map and the column as int32 row numbers.
        """
        index: dict[str, int] = {}
        rows = np.fromiter((index.setdefault(v, len(index)) for v in values), dtype=np.int64)
        ids = cls.__new__(cls)
        ids._ids = list(index)
        ids._index = index
        ids._max_bytes = None
        return ids, rows.astype(np.int32)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, external: str) -> bool:
        return external in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdMap) and self._ids == other._ids

    def __repr__(self) -> str:
        return f"IdMap(n={len(self._ids)})"

    @property
    def ids(self) -> list[str]:
        return self._ids

    @property
    def max_bytes(self) -> int:
        """Length in UTF-8 bytes of the longest id (bounds the size of a reply)."""
        if self._max_bytes is None:
            self._max_bytes = max((len(x.encode("utf-8")) for x in self._ids), default=0)
        return self._max_bytes

    def row(self, external: str) -> int:
        """Row number of ``external``, or -1 when it is unknown."""
        return self._index.get(external, -1)

    def rows(self, externals: Iterable[str]) -> np.ndarray:
        """Row numbers (int64, -1 for unknown ids)."""
        get = self._index.get
        return np.fromiter((get(x, -1) for x in externals), dtype=np.int64)

    def external(self, row: int) -> str:
        return self._ids[row]

    def externals(self, rows: Iterable[int]) -> list[str]:
        ids = self._ids
        return [ids[r] for r in rows]

    def subset(self, rows: np.ndarray) -> IdMap:
        """The map restricted to ``rows``, renumbered in that order."""
        return IdMap([self._ids[r] for r in rows])
