"""The answer of a user the model cannot personalise: an ordered chain of sources (trending,
then training popularity), each topping the list up to ``n`` with what the ones before it
could not give, every item flagged with the source it came from.

Every source honours the same exclusions, candidates and blocked items (hidden items and the
filter), and each is asked only for what is still missing, with the items already taken
excluded: ``n`` items come back whenever ``n`` are eligible, since the last source (training
popularity) ranks every item.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from ordrec.service.indices.rules import Eligible
from ordrec.service.live.trending import Trending, TrendingIndex, ranked_rows
from ordrec.v1 import recommender_pb2 as pb

# A source: asked for ``k`` items with rows ``exclude`` left out, answers (rows, scores), or
# None when it has nothing at all (no trending data, Redis down).
Source = Callable[[int, np.ndarray | None], tuple[np.ndarray, np.ndarray] | None]


class Sourced(NamedTuple):
    """A fallback list: item rows, their scores (each source's own: a trending item's decayed
    count, a popular item's training popularity), and ``spans``: the ``Fallback`` value of each
    source that gave items, with how many, in list order."""

    rows: np.ndarray
    scores: np.ndarray
    spans: tuple[tuple[int, int], ...]

    def first_source(self) -> int:
        """The list's flag for the user: its first item's source (popularity for an empty list)."""
        return self.spans[0][0] if self.spans else pb.FALLBACK_POPULAR_GLOBAL

    def source_of(self) -> dict[int, int]:
        """Row -> source, to flag items after re-ranking (diversity) has reordered them."""
        found: dict[int, int] = {}
        start = 0
        for flag, count in self.spans:
            found.update(dict.fromkeys(self.rows[start : start + count].tolist(), flag))
            start += count
        return found


_EMPTY = Sourced(np.zeros(0, np.int64), np.zeros(0, np.float32), ())


def topped_up(n: int, exclude: np.ndarray | None, sources: Sequence[tuple[int, Source]]) -> Sourced:
    """Up to ``n`` items from ``sources`` (``(flag, source)`` pairs, in order; a source asked for
    ``k`` gives at most ``k``): each adds what the list still lacks, never an item excluded or
    already on it."""
    rows: list[np.ndarray] = []
    scores: list[np.ndarray] = []
    spans: list[tuple[int, int]] = []
    missing, skipped = n, exclude
    for flag, source in sources:
        if missing <= 0:
            break
        found = source(missing, skipped)
        if found is None or not len(found[0]):
            continue
        rows.append(found[0])
        scores.append(found[1])
        spans.append((flag, len(found[0])))
        missing -= len(found[0])
        skipped = found[0] if skipped is None else np.concatenate([skipped, found[0]])
    if len(rows) == 1:  # the usual case: one source had enough
        return Sourced(rows[0], scores[0], tuple(spans))
    if not rows:
        return _EMPTY
    return Sourced(np.concatenate(rows), np.concatenate(scores), tuple(spans))


class ColdStart:
    """Unknown users' answers for one version and request: trending (read once per call, and
    only when some user needs it), topped up from the version's training popularity."""

    def __init__(
        self,
        trending: TrendingIndex | None,
        index,
        candidates: np.ndarray | None,
        eligible: Eligible | None,
    ):
        self.index, self.candidates, self.eligible = index, candidates, eligible
        self.trending_index = trending
        self._found: tuple[Trending, np.ndarray] | None = None
        self.sources: tuple[tuple[int, Source], ...] = (
            (pb.FALLBACK_TRENDING, self.trending),
            (pb.FALLBACK_POPULAR_GLOBAL, self.popular),
        )

    def answer(self, n: int, exclude: np.ndarray | None) -> Sourced:
        """The user's ``n`` items: trending first, then popularity."""
        return topped_up(n, exclude, self.sources)

    def trending(self, n: int, exclude: np.ndarray | None):
        """The first ``n`` eligible trending items the version knows; None when nothing trends."""
        if self.trending_index is None:
            return None
        if self._found is None:
            self._found = self.trending_index.current_rows(self.index.items)
        current, rows = self._found
        if not len(current):
            return None
        blocked = None if self.eligible is None else self.eligible.blocked
        return ranked_rows(current, rows, n, exclude, self.candidates, blocked)

    def popular(self, n: int, exclude: np.ndarray | None):
        """The ``n`` most popular eligible items of the version's training data."""
        return self.index.popular(n, exclude=exclude, candidates=self.candidates, eligible=self.eligible)
