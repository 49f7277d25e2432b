"""In-memory data shapes the readers produce and the models consume.

Every shape keeps external ids in :class:`~service.idmap.IdMap` objects and
the observations as parallel int32 index arrays, so memory is proportional to
the number of observations (Netflix-sized inputs fit as compact arrays).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ordrec.service.idmap import IdMap


class DataError(ValueError):
    """Bad input data; the message names the file, the line and what was wrong."""

    def __init__(self, path: str, line: int | None, message: str):
        self.path, self.line, self.reason = str(path), line, message
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")


def _fingerprint(*parts) -> str:
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, IdMap):
            digest.update("\n".join(part.ids).encode("utf-8"))
        else:
            digest.update(np.ascontiguousarray(part).tobytes())
        digest.update(b"\0")
    return digest.hexdigest()


def _compact(column: np.ndarray, ids: IdMap) -> tuple[np.ndarray, IdMap]:
    """Renumber ``column`` so only the ids it uses remain, in their old order."""
    used = np.unique(column)
    remap = np.full(len(ids), -1, dtype=np.int32)
    remap[used] = np.arange(used.size, dtype=np.int32)
    return remap[column], ids.subset(used)


@dataclass
class Ratings:
    """Explicit ratings: (user, item, rating) triples."""

    users: IdMap
    items: IdMap
    user: np.ndarray  # int32 rows into users
    item: np.ndarray  # int32 rows into items
    rating: np.ndarray  # float32
    source: str = ""
    skipped_lines: int = 0

    def __len__(self) -> int:
        return int(self.user.shape[0])

    @property
    def n_users(self) -> int:
        return len(self.users)

    @property
    def n_items(self) -> int:
        return len(self.items)

    def subset(self, mask_or_rows: np.ndarray) -> "Ratings":
        """The selected observations, keeping the same id maps."""
        return Ratings(
            self.users, self.items, self.user[mask_or_rows], self.item[mask_or_rows],
            self.rating[mask_or_rows], self.source,
        )

    def compact(self) -> "Ratings":
        """Drop users and items with no observation left, renumbering the rest."""
        user, users = _compact(self.user, self.users)
        item, items = _compact(self.item, self.items)
        return Ratings(users, items, user, item, self.rating, self.source)

    def fingerprint(self) -> str:
        return _fingerprint(self.users, self.items, self.user, self.item, self.rating)


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

    def subset(self, mask_or_rows: np.ndarray) -> "TagAssignments":
        return TagAssignments(
            self.users, self.items, self.tags, self.user[mask_or_rows], self.item[mask_or_rows],
            self.tag[mask_or_rows], self.source, tag_names=self.tag_names,
        )

    def compact(self) -> "TagAssignments":
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
            raise KeyError(f"no attribute {name!r}; have {', '.join(self.attributes)}") from None


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
