"""External string ids at the edges, dense int32 indices inside."""

from __future__ import annotations

import re
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

#: From this many ids on, a map is packed (:class:`PackedIdMap`): the server's loaded id
#: spaces and the trainer's read ones, where a dict of Python strings would cost about
#: 130 bytes an id (1.3 GB at 10^7 users).
PACKED_MIN_IDS = 100_000

# Ids are written one a line into artifacts, so no id may hold a line break or any other
# control character (C0, DEL, C1, and the Unicode line and paragraph separators that
# str.splitlines also splits on). The readers refuse them; so does the server in ids it stores.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a character no id may hold."""
    return _CONTROL.search(text) is not None


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
        if not isinstance(other, IdMap):
            return False
        if type(self) is type(other) is IdMap:
            return self._ids == other._ids
        return len(self) == len(other) and list(self.ids) == list(other.ids)

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

    def utf8_lines(self) -> tuple[bytes, np.ndarray]:
        """The ids as UTF-8, one a line, and the ``n + 1`` line starts (int64): id ``r`` is
        ``buffer[starts[r]:starts[r + 1] - 1]``. For writing replies without a string per id."""
        encoded = [external.encode("utf-8") for external in self._ids]
        ends = np.cumsum(np.fromiter((len(e) + 1 for e in encoded), np.int64, len(encoded)))
        return b"".join(e + b"\n" for e in encoded), np.concatenate([[0], ends]).astype(np.int64)

    def joined_utf8(self) -> bytes | memoryview:
        """The ids joined by line breaks, UTF-8 (what a fingerprint of the id space hashes)."""
        return "\n".join(self._ids).encode("utf-8")

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

    def extended(self, more: Sequence[str]) -> IdMap:
        """The map with ``more`` (distinct ids it lacks, none holding a control character) as
        rows ``n..``; packed from :data:`PACKED_MIN_IDS` ids on, as a read's map would be."""
        blob, _ = self.utf8_lines()
        return id_map_from_lines(blob + "".join(f"{x}\n" for x in more).encode("utf-8"), distinct=True)


class PackedIds(Sequence[str]):
    """Ids kept as one UTF-8 buffer and line starts: a few bytes per id instead of a Python
    string and a dict entry each (about 120 bytes), which at a million items is most of a
    server process's own memory."""

    __slots__ = ("_blob", "_starts", "_n")

    def __init__(self, blob: bytes, starts: np.ndarray):
        self._blob = blob
        # n + 1 line starts: id r is blob[starts[r]:starts[r + 1] - 1]. An array.array, whose
        # items index back as Python ints, several times faster than numpy scalars.
        self._starts = array("q", starts.astype(np.int64).tobytes())
        self._n = len(starts) - 1

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [self[r] for r in range(*row.indices(self._n))]
        if row < 0:
            row += self._n
        if not 0 <= row < self._n:
            raise IndexError(row)
        starts = self._starts
        return self._blob[starts[row] : starts[row + 1] - 1].decode("utf-8")

    def __iter__(self):
        return iter(self._blob.decode("utf-8").split("\n")[: self._n])

    def __eq__(self, other: object) -> bool:
        """Equal to a list (or tuple) of the same ids, as the plain map's ``ids`` list is."""
        if not isinstance(other, (list, tuple, PackedIds)):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def utf8_lines(self) -> tuple[bytes, np.ndarray]:
        """The buffer and the ``n + 1`` line starts as :meth:`IdMap.utf8_lines` gives them (no copy)."""
        return self._blob, np.frombuffer(self._starts, dtype=np.int64)

    def lengths(self) -> np.ndarray:
        """Length in UTF-8 bytes of every id."""
        return np.diff(np.frombuffer(self._starts, dtype=np.int64)) - 1


class PackedIdMap(IdMap):
    """The same bijection as :class:`IdMap`, for the large id spaces the server loads.

    Built from the id file's bytes (one id per line). Lookups go through a sorted
    array of the ids' string hashes (salted per process, like any ``hash``), each
    hit checked against the id itself, so a collision can never map a wrong row.
    """

    __slots__ = ("_hashes", "_order")

    def __init__(self, text: bytes, *, distinct: bool = False):
        """``distinct``: the ids are known distinct and valid UTF-8 (an interner's, a subset's),
        so nothing is checked and the lookup index waits for the first lookup; else (a file's
        ids) a duplicate or invalid UTF-8 is a ValueError here."""
        if text and not text.endswith(b"\n"):
            raise ValueError("the id list must end with a line break")
        ends = np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == 10).astype(np.int64)
        packed = PackedIds(text, np.concatenate([[0], ends + 1]))
        self._ids = packed  # type: ignore[assignment]
        self._index = None  # type: ignore[assignment]
        self._max_bytes = int(packed.lengths().max()) if len(packed) else 0
        self._hashes: array | None = None
        self._order: array | None = None
        if not distinct:  # ids from a file: refused at load when two are equal
            self._lookup_index()
            self._refuse_duplicates()

    @property
    def indexed(self) -> bool:
        """Whether the lookup index is built (a map of distinct ids builds it when first asked)."""
        return self._hashes is not None

    def _lookup_index(self) -> tuple[array, array]:
        """The sorted hashes and their rows, built at the first lookup when the ids were
        known distinct (the trainer's maps: 16 bytes an id it never needs while fitting)."""
        if self._hashes is None or self._order is None:
            hashes = np.fromiter(map(hash, self._ids), np.int64, len(self._ids))
            order = np.argsort(hashes, kind="stable")
            # array.array: bisect probes it from C; numpy views of it serve the batch lookups
            self._hashes = array("q", hashes[order].tobytes())
            self._order = array("q", order.tobytes())
        return self._hashes, self._order

    def _refuse_duplicates(self) -> None:
        hashes, order = self._lookup_index()
        equal = np.frombuffer(hashes, dtype=np.int64)
        for i in np.flatnonzero(equal[1:] == equal[:-1]).tolist():
            a, b = self._ids[order[i]], self._ids[order[i + 1]]
            if a == b:
                raise ValueError(f"duplicate id {a!r} in id map")

    def __contains__(self, external: str) -> bool:
        return self.row(external) >= 0

    def utf8_lines(self) -> tuple[bytes, np.ndarray]:
        return self._ids.utf8_lines()  # type: ignore[attr-defined]

    def joined_utf8(self) -> bytes | memoryview:
        blob, _ = self.utf8_lines()
        return memoryview(blob)[: max(len(blob) - 1, 0)]  # no copy: the text less its last break

    def row(self, external: str) -> int:
        hashes, order = self._lookup_index()
        ids = self._ids
        key = hash(external)
        at = bisect_left(hashes, key)
        while at < len(hashes) and hashes[at] == key:
            if ids[order[at]] == external:
                return order[at]
            at += 1
        return -1

    def rows(self, externals: Iterable[str]) -> np.ndarray:
        externals = list(externals)
        out = np.full(len(externals), -1, dtype=np.int64)
        if not len(self) or not externals:
            return out
        if len(externals) == 1:  # the usual request (one user): a bisect, not the array machinery
            out[0] = self.row(externals[0])
            return out
        sorted_hashes, order = self._lookup_index()
        hashes = np.frombuffer(sorted_hashes, dtype=np.int64)
        keys = np.fromiter(map(hash, externals), np.int64, len(externals))
        at = np.minimum(np.searchsorted(hashes, keys), len(hashes) - 1)
        found = np.frombuffer(order, dtype=np.int64)[at]
        ids = self._ids
        for i in np.flatnonzero(hashes[at] == keys).tolist():
            row = int(found[i])
            # the first of an equal-hash run is almost always the one; else walk the run
            out[i] = row if ids[row] == externals[i] else self.row(externals[i])
        return out

    def subset(self, rows: np.ndarray) -> IdMap:
        blob, starts = self._ids.utf8_lines()  # type: ignore[attr-defined]
        return id_map_from_lines(_gather_lines(blob, starts, np.asarray(rows, dtype=np.int64)), distinct=True)


def _gather_lines(blob: bytes, starts: np.ndarray, rows: np.ndarray, chunk: int = 1 << 16) -> bytes:
    """Lines ``rows`` of ``blob`` (line ``r`` is ``blob[starts[r]:starts[r + 1]]``), in that order;
    by chunks of rows, so the byte indices never cost 8 bytes per byte of the whole map."""
    source = np.frombuffer(blob, dtype=np.uint8)
    parts = []
    for lo in range(0, rows.size, chunk):
        part = rows[lo : lo + chunk]
        begin, length = starts[part], starts[part + 1] - starts[part]
        ends = np.cumsum(length)
        # each output byte's source: its line's start plus its offset within the line
        offset = np.arange(ends[-1], dtype=np.int64) - np.repeat(ends - length, length)
        parts.append(source[np.repeat(begin, length) + offset].tobytes())
    return b"".join(parts)


def id_map_from_lines(text: bytes, *, distinct: bool = False) -> IdMap:
    """The map of the UTF-8 ids in ``text``, one a line: packed from :data:`PACKED_MIN_IDS` ids
    on, a plain :class:`IdMap` below. ``distinct``: as :class:`PackedIdMap` takes it."""
    if text.count(b"\n") >= PACKED_MIN_IDS:
        return PackedIdMap(text, distinct=distinct)
    return IdMap(text.decode("utf-8").split("\n")[:-1])


def numbered_ids(n: int) -> IdMap:
    """The ids ``"0"`` to ``str(n - 1)`` in order (generated data's users and items), packed as a
    read file's would be; written by blocks, never as n strings at once."""
    block = 1 << 20
    text = b"".join(
        ("\n".join(map(str, range(lo, min(lo + block, n)))) + "\n").encode("ascii")
        for lo in range(0, n, block)
    )
    return id_map_from_lines(text, distinct=True)
