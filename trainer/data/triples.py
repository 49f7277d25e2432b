"""Explicit ordinal triples for COE (Le & Lauw, SDM 2016, Section 2).

A triples file has one triple a line, fields separated by tabs or spaces,
``#`` starting a comment::

    A  <user>  <item_i>  <item_j>     user prefers item_i to item_j
    B  <user_u>  <user_v>  <item>     user_u likes item more than user_v does

Ids are external strings. Unlike triples derived from ratings, these are
given one by one, so memory is proportional to their number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.data._lines import Problems, iter_lines
from ordrec.trainer.data.types import DataError, _fingerprint, excerpt


@dataclass
class ExplicitTriples:
    """Parallel arrays: ``kind`` 0 (type A ``<u, i, j>``) or 1 (type B ``<u, v, i>``)."""

    users: IdMap
    items: IdMap
    kind: np.ndarray  # int64
    first: np.ndarray  # int64: u
    second: np.ndarray  # int64: i (A) or v (B)
    third: np.ndarray  # int64: j (A) or i (B)
    source: str = ""
    skipped_lines: int = 0

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    @property
    def n_users(self) -> int:
        return len(self.users)

    @property
    def n_items(self) -> int:
        return len(self.items)

    def user_item_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Distinct (user, item) pairs the triples mention: the users' "seen" items."""
        a = self.kind == 0
        b = ~a
        user = np.concatenate([self.first[a], self.first[a], self.first[b], self.second[b]])
        item = np.concatenate([self.second[a], self.third[a], self.third[b], self.third[b]])
        code = np.unique(user.astype(np.int64) * max(self.n_items, 1) + item)
        return (code // max(self.n_items, 1)).astype(np.int32), (code % max(self.n_items, 1)).astype(np.int32)

    def fingerprint(self) -> str:
        return _fingerprint(self.users, self.items, self.kind, self.first, self.second, self.third)


def read_triples(path: str, skip_bad_lines: bool = False) -> ExplicitTriples:
    """Read a triples file; a malformed line raises :class:`DataError` naming it (or is skipped)."""
    users: dict[str, int] = {}
    items: dict[str, int] = {}
    kind, first, second, third = [], [], [], []
    problems = Problems(str(path), skip_bad_lines)
    for line_no, line in iter_lines(path, "utf-8", problems):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        fields = text.split()
        problem = None
        if len(fields) != 4:
            problem = f"expected 4 fields (A|B and three ids), got {len(fields)}"
        elif fields[0] not in ("A", "B", "a", "b"):
            problem = f"first field must be A or B, got {excerpt(fields[0])}"
        elif fields[0] in ("A", "a") and fields[2] == fields[3]:
            problem = f"type-A triple compares item {excerpt(fields[2])} with itself"
        elif fields[0] in ("B", "b") and fields[1] == fields[2]:
            problem = f"type-B triple compares user {excerpt(fields[1])} with itself"
        if problem:
            problems.bad(line_no, problem)
            continue
        if fields[0] in ("A", "a"):
            kind.append(0)
            first.append(users.setdefault(fields[1], len(users)))
            second.append(items.setdefault(fields[2], len(items)))
            third.append(items.setdefault(fields[3], len(items)))
        else:
            kind.append(1)
            first.append(users.setdefault(fields[1], len(users)))
            second.append(users.setdefault(fields[2], len(users)))
            third.append(items.setdefault(fields[3], len(items)))
    if not kind:
        raise DataError(path, None, "no triples found")
    as_array = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
    return ExplicitTriples(
        IdMap(list(users)),
        IdMap(list(items)),
        as_array(kind),
        as_array(first),
        as_array(second),
        as_array(third),
        source=str(path),
        skipped_lines=problems.skipped,
    )
