"""In-memory data shapes the readers produce and the models consume.

Every shape keeps external ids in :class:`~service.storage.idmap.IdMap` objects and
the observations as parallel int32 index arrays, so memory is proportional to
the number of observations (Netflix-sized inputs fit as compact arrays).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field, replace

import numpy as np

from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.scale import on_scale, scale_problem, scale_text


class DataError(ValueError):
    """Bad input data; the message names the file, the line and what was wrong.

    Files without lines (Parquet) name the 1-based ``row`` instead: ``file: row N: ...``.
    """

    def __init__(self, path: str, line: int | None, message: str, *, row: int | None = None):
        self.path, self.line, self.row, self.reason = str(path), line, row, message
        where = f"{path}:{line}" if line is not None else str(path)
        if line is None and row is not None:
            where += f": row {row}"
        super().__init__(f"{where}: {message}")


#: Characters of input a message quotes at most (binary junk must not flood a log).
EXCERPT_CHARS = 80


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` quoted for a message: ``repr`` escapes, at most about ``limit`` characters.

    A longer text is cut and followed by ``...`` and its full length, so a
    megabyte of binary input shows as one short, printable, unambiguous line.
    """
    quoted = repr(text)
    if len(quoted) <= limit:
        return quoted
    keep = limit
    while keep > 0 and len(repr(text[:keep])) > limit:
        keep -= 1
    return f"{text[:keep]!r}... ({len(text)} characters)"


_SCALE_RE = re.compile(r"^\s*([^.:\s][^:]*?)\s*\.\.\s*([^:]+?)\s*(?::\s*(.+?)\s*)?$")


@dataclass(frozen=True)
class RatingScale:
    """The ratings a data set may hold: ``low, low + step, ..., high``.

    Written ``LOW..HIGH[:STEP]`` (step 1 when left out): ``1..5`` is
    MovieLens 100K/1M, ``0.5..5:0.5`` MovieLens 10M.
    """

    low: float
    high: float
    step: float = 1.0

    def __post_init__(self):
        numbers = (self.low, self.high, self.step)
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in numbers):
            raise ValueError(f"rating scale bounds and step must be finite numbers, got {numbers}")
        if self.step <= 0:
            raise ValueError(f"rating scale step must be positive, got {self.step:g}")
        if self.high < self.low:
            raise ValueError(f"rating scale {self.low:g}..{self.high:g} is empty (high below low)")
        if not on_scale(self.high, self.low, self.high, self.step):
            raise ValueError(f"rating scale {self}: {self.high:g} is not low plus a whole number of steps")

    @classmethod
    def parse(cls, text: str) -> RatingScale:
        """``"1..5"``, ``"0.5..5:0.5"`` -> :class:`RatingScale`; a clear ValueError otherwise."""
        match = _SCALE_RE.match(text)
        if not match:
            raise ValueError(
                f"rating scale {excerpt(text)} is not LOW..HIGH or LOW..HIGH:STEP (e.g. 1..5 or 0.5..5:0.5)"
            )
        try:
            low, high, step = (float(x) for x in (match[1], match[2], match[3] or "1"))
        except ValueError:
            raise ValueError(f"rating scale {excerpt(text)}: LOW, HIGH and STEP must be numbers") from None
        return cls(low, high, step)

    def __str__(self) -> str:
        return scale_text(self.low, self.high, self.step)

    def problem(self, value: float) -> str | None:
        """Why ``value`` is not on the scale, or None when it is."""
        return scale_problem(value, self.low, self.high, self.step)

    def as_attribute(self) -> dict[str, float]:
        """The form a model's ``attributes[SCALE_ATTRIBUTE]`` stores (read by the service)."""
        return {"low": self.low, "high": self.high, "step": self.step}


def _fingerprint(*parts) -> str:
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, IdMap):
            digest.update(part.joined_utf8())
        else:
            # The array's own buffer, not a bytes copy of it (4 bytes per rating per column).
            digest.update(np.ascontiguousarray(part).data)
        digest.update(b"\0")
    return digest.hexdigest()


def _compact(column: np.ndarray, ids: IdMap) -> tuple[np.ndarray, IdMap]:
    """Renumber ``column`` so only the ids it uses remain, in their old order."""
    used = np.unique(column)
    remap = np.full(len(ids), -1, dtype=np.int32)
    remap[used] = np.arange(used.size, dtype=np.int32)
    return remap[column], ids.subset(used)


#: What a ratings table records: judgements on a scale, or interactions (clicks, plays, purchases).
FEEDBACK = ("explicit", "implicit")


@dataclass
class Ratings:
    """(user, item, value) observations: explicit ratings, or implicit interactions.

    ``feedback="implicit"``: one row per (user, item) that interacted, ``rating``
    its strength (``strength`` names what: a column summed over repeats, or
    ``"rows"``, the number of times the pair occurs). ``time``: the optional
    int64 timestamp of each row (for interactions, the latest of the pair).
    """

    users: IdMap
    items: IdMap
    user: np.ndarray  # int32 rows into users
    item: np.ndarray  # int32 rows into items
    rating: np.ndarray  # float32
    source: str = ""
    skipped_lines: int = 0
    time: np.ndarray | None = None  # int64, one per row, when the data has timestamps
    feedback: str = "explicit"
    strength: str = ""  # implicit only: what ``rating`` holds
    levels: str = ""  # implicit data fitted as levels: the mapping, "scheme:count" (LevelMapping)

    def __post_init__(self):
        if self.feedback not in FEEDBACK:
            raise ValueError(f"feedback must be one of {FEEDBACK}, got {self.feedback!r}")

    @property
    def implicit(self) -> bool:
        return self.feedback == "implicit"

    def __len__(self) -> int:
        return int(self.user.shape[0])

    @property
    def n_users(self) -> int:
        return len(self.users)

    @property
    def n_items(self) -> int:
        return len(self.items)

    def subset(self, mask_or_rows: np.ndarray) -> Ratings:
        """The selected observations, keeping the same id maps."""
        return replace(
            self,
            user=self.user[mask_or_rows],
            item=self.item[mask_or_rows],
            rating=self.rating[mask_or_rows],
            time=None if self.time is None else self.time[mask_or_rows],
            skipped_lines=0,
        )

    def compact(self) -> Ratings:
        """Drop users and items with no observation left, renumbering the rest."""
        user, users = _compact(self.user, self.users)
        item, items = _compact(self.item, self.items)
        return replace(self, users=users, items=items, user=user, item=item, skipped_lines=0)

    def fingerprint(self) -> str:
        """The sha256 of the ids and columns. Explicit ratings hash what they always did (their
        timestamps do not change a fit); implicit data adds its marker and its timestamps."""
        columns = [self.users, self.items, self.user, self.item, self.rating]
        if self.implicit:
            levels = f":{self.levels}" if self.levels else ""
            marker = np.frombuffer(f"implicit:{self.strength}{levels}".encode(), dtype=np.uint8)
            columns += [marker] + ([] if self.time is None else [self.time])
        return _fingerprint(*columns)


@dataclass
class TagAssignments:
    """Tag assignments: (user, item, tag) triples; a post is a (user, item) pair."""

    users: IdMap
    items: IdMap
    tags: IdMap
    user: np.ndarray
    item: np.ndarray
    tag: np.ndarray
    source: str = ""
    skipped_lines: int = 0
    # Optional display names of tags (e.g. Last.fm tags.dat), by tag row.
    tag_names: list[str] | None = None

    def __len__(self) -> int:
        return int(self.user.shape[0])

    def subset(self, mask_or_rows: np.ndarray) -> TagAssignments:
        return TagAssignments(
            self.users,
            self.items,
            self.tags,
            self.user[mask_or_rows],
            self.item[mask_or_rows],
            self.tag[mask_or_rows],
            self.source,
            tag_names=self.tag_names,
        )

    def compact(self) -> TagAssignments:
        user, users = _compact(self.user, self.users)
        item, items = _compact(self.item, self.items)
        used_tags = np.unique(self.tag)
        tag, tags = _compact(self.tag, self.tags)
        names = None if self.tag_names is None else [self.tag_names[t] for t in used_tags]
        return TagAssignments(users, items, tags, user, item, tag, self.source, tag_names=names)

    def fingerprint(self) -> str:
        return _fingerprint(self.users, self.items, self.tags, self.user, self.item, self.tag)


@dataclass
class AttributeTable:
    """Objects described by categorical attributes (UCI Zoo style).

    ``codes[o, a]`` is the value of attribute ``a`` for object ``o`` as an
    index into ``values[a]``; -1 marks a missing value.
    """

    objects: IdMap
    attributes: list[str]
    codes: np.ndarray  # int32, (n_objects, n_attributes)
    values: list[list[str]]
    source: str = ""
    skipped_lines: int = 0
    # Optional display names of the objects (e.g. the Zoo animal name).
    labels: list[str] | None = None

    def fingerprint(self) -> str:
        return _fingerprint(self.objects, self.codes)

    def attribute_index(self, name: str) -> int:
        try:
            return self.attributes.index(name)
        except ValueError:
            # A longer excerpt than usual: the list of names is what the caller needs to see.
            have = excerpt(", ".join(self.attributes), limit=4 * EXCERPT_CHARS)
            raise KeyError(f"no attribute {excerpt(name)}; have {have}") from None


@dataclass
class NeighborLists:
    """A directed graph of ranked neighbour lists: rank 1 is the nearest."""

    vertices: IdMap
    source: np.ndarray  # int32
    neighbor: np.ndarray  # int32
    rank: np.ndarray  # int32, >= 1
    path: str = ""
    skipped_lines: int = 0
    # Optional class labels per vertex (e.g. digits), for evaluation only.
    labels: np.ndarray | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return int(self.source.shape[0])

    def fingerprint(self) -> str:
        return _fingerprint(self.vertices, self.source, self.neighbor, self.rank)
