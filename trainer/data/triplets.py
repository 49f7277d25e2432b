"""Conditional ordinal triplets ``<i, j, k>_t`` given directly (SCORE's input).

File format: one triplet a line, ``aspect,i,j,k`` (comma or tab separated):
under ``aspect``, object ``j`` is more similar to ``i`` than to ``k``. Blank
lines and lines starting with ``#`` are ignored; a first line
``aspect,i,j,k`` is taken as a header. Ids are external strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.data._lines import Problems, iter_lines
from ordrec.trainer.data.types import DataError, _fingerprint

_SPLIT = re.compile(r"[,\t]")


@dataclass
class ConditionalTriplets:
    """Triplets as parallel int32 arrays into the ``aspects`` and ``objects`` id maps."""

    aspects: IdMap
    objects: IdMap
    aspect: np.ndarray
    i: np.ndarray
    j: np.ndarray
    k: np.ndarray
    source: str = ""
    skipped_lines: int = 0

    def __len__(self) -> int:
        return int(self.aspect.shape[0])

    def fingerprint(self) -> str:
        return _fingerprint(self.aspects, self.objects, self.aspect, self.i, self.j, self.k)

    def counts(self) -> np.ndarray:
        """Number of triplets per aspect."""
        return np.bincount(self.aspect, minlength=len(self.aspects))


def read_triplets(path: str, skip_bad_lines: bool = False) -> ConditionalTriplets:
    """Read an ``aspect,i,j,k`` file; raise :class:`DataError` naming the line
    of the first malformed row (or skip such rows and count them)."""
    aspects: dict[str, int] = {}
    objects: dict[str, int] = {}
    cols: list[list[int]] = [[], [], [], []]
    problems = Problems(str(path), skip_bad_lines)
    for number, line in iter_lines(path, "utf-8", problems):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        fields = [f.strip() for f in _SPLIT.split(text)]
        if number == 1 and [f.lower() for f in fields] == ["aspect", "i", "j", "k"]:
            continue
        problem = None
        if len(fields) != 4:
            problem = f"expected 4 fields aspect,i,j,k, found {len(fields)}"
        elif not all(fields):
            problem = "empty field"
        elif len({fields[1], fields[2], fields[3]}) != 3:
            problem = "i, j and k must be three different objects"
        if problem:
            problems.bad(number, problem)
            continue
        cols[0].append(aspects.setdefault(fields[0], len(aspects)))
        for c in (1, 2, 3):
            cols[c].append(objects.setdefault(fields[c], len(objects)))
    if not cols[0]:
        raise DataError(path, None, "no triplets")
    arrays = [np.asarray(c, dtype=np.int32) for c in cols]
    return ConditionalTriplets(
        IdMap(list(aspects)), IdMap(list(objects)), *arrays, source=str(path), skipped_lines=problems.skipped
    )


def write_triplets(path: str, data: ConditionalTriplets) -> None:
    """Write ``data`` in the format :func:`read_triplets` reads."""
    a, o = data.aspects.ids, data.objects.ids
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("aspect,i,j,k\n")
        for t, i, j, k in zip(data.aspect, data.i, data.j, data.k):
            fh.write(f"{a[t]},{o[i]},{o[j]},{o[k]}\n")
