"""Why an item was recommended: the items of the user's own history that explain it.

The history is the items the user liked (:func:`liked_history`: rated at or above their own
mean, or interactions without a rating), of their training items or of the items recorded for
a folded-in user. For each recommended item ``i`` and each history item ``h``, a weight ``w(i, h)``:

The weight follows the similarity the index declares (``item_similarity``,
``service/indices/models/capabilities.py``):

- **an inner product** (DCR / Pairwise DCR): ``w = max(0, sim(i, h))`` with ``sim`` the level-weighted inner
  product of the item factors (``service/indices/similar.py``): how much of ``i``'s score a user
  made of ``h`` alone would give it. A user's factors are fitted to lean toward the items
  they rated, so the history items most similar to ``i`` are those its score comes from.
- **a distance** (COE): ``w = 1 / (d(i, h) + EPS)``, the inverse distance on the map: the user sits among
  their rated items, and an item near one of them is recommended because of it.

An item's **share** is ``w(i, h) / sum_h' w(i, h')`` over the whole history (the recommended
item itself left out), so the shares of the named items add up to at most 1; items with no
positive weight are never named.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from ordrec.service.errors import InvalidArgument
from ordrec.service.indices.models.base import RecommenderIndex
from ordrec.service.indices.models.capabilities import ItemSimilarity
from ordrec.service.indices.similar import inner_product, item_vectors

# Keeps COE's inverse distance finite for a history item on the recommended item's spot.
EPS = 1e-6
# Most history items a request may ask for per recommended item.
MAX_EXPLAIN = 20


@dataclass(frozen=True)
class Reason:
    """One history item explaining a recommendation: its row, share and similarity."""

    row: int
    share: float
    similarity: float


@dataclass(frozen=True)
class Explained:
    """Reasons of several recommended items as arrays, ``(n, k)`` each: history rows (-1 pads
    the items with fewer than ``k``), shares and similarities; what the servicer puts on the
    wire without building an object per reason."""

    rows: np.ndarray
    shares: np.ndarray
    similarities: np.ndarray

    def reasons(self) -> list[list[Reason]]:
        return [
            [Reason(r, s, m) for r, s, m in zip(rows, shares, sims) if r >= 0]
            for rows, shares, sims in zip(
                self.rows.tolist(), self.shares.tolist(), self.similarities.tolist()
            )
        ]


@njit(cache=True, fastmath=True)
def _distance(a, b):
    total = 0.0
    for d in range(a.size):
        diff = a[d] - b[d]
        total += diff * diff
    return np.sqrt(total)


@njit(cache=True)
def _similarities(query, trained, history, distance):
    """``(n, m)`` similarity of each query row to each history item's row of ``trained``: the
    inner product (DCR, the query already level-weighted) or the negative distance (COE).
    History rows outer, so each is read once (no gathered copy)."""
    n = query.shape[0]
    sim = np.empty((n, history.size))
    for j in range(history.size):
        row = trained[history[j]]
        for i in range(n):
            sim[i, j] = -_distance(query[i], row) if distance else inner_product(query[i], row)
    return sim


@njit(cache=True)
def _best_reasons(sim, item_rows, history, k, distance, eps):
    """Per row of ``sim``: the history rows of its ``k`` largest positive weights (largest
    first, the earlier history item among equals; -1 pads), their shares of the row's total
    and their similarities, the recommended item's own history entry left out. The weight is
    ``max(0, sim)`` (inner product) or ``1 / (distance + eps)``. One pass: sorting every row
    costs more than the products."""
    n, m = sim.shape
    best = np.full((n, k), -1, np.int64)
    weights = np.zeros((n, k))
    shares = np.zeros((n, k))
    sims = np.zeros((n, k))
    for i in range(n):
        total = 0.0
        for j in range(m):
            s = sim[i, j]
            w = 1.0 / (eps - s) if distance else max(s, 0.0)
            if w <= 0 or history[j] == item_rows[i]:
                continue
            total += w
            pos = k
            while pos > 0 and (best[i, pos - 1] < 0 or w > weights[i, pos - 1]):
                pos -= 1
            if pos < k:
                for q in range(k - 1, pos, -1):
                    best[i, q], weights[i, q], sims[i, q] = best[i, q - 1], weights[i, q - 1], sims[i, q - 1]
                best[i, pos], weights[i, pos], sims[i, pos] = history[j], w, s
        for q in range(k):
            if best[i, q] >= 0:
                shares[i, q] = weights[i, q] / total
    return best, shares, sims


def _query(
    index: RecommenderIndex, similarity: ItemSimilarity, item_rows: np.ndarray, fresh: np.ndarray | None
) -> np.ndarray:
    """The recommended items' rows the history is compared with: weighted vectors (an inner
    product, so the plain one is ``sim``) or map points (a distance)."""
    vectors = item_vectors(index, item_rows, fresh)
    return np.ascontiguousarray(vectors if similarity.is_distance else similarity.weighted(vectors))


def explained(
    index: RecommenderIndex,
    item_rows: np.ndarray,
    history: np.ndarray,
    k: int,
    fresh: np.ndarray | None = None,
) -> Explained:
    """Up to ``k`` reasons for each of ``item_rows``, largest share first (module docstring),
    as arrays; rows past the version's items are fresh items (``similar.item_vectors``)."""
    item_rows = np.asarray(item_rows, dtype=np.int64)
    history = np.asarray(history, dtype=np.int64)
    if history.size > 1 and not (history[1:] > history[:-1]).all():
        history = np.unique(history)  # training items arrive sorted and distinct
    similarity = index.item_similarity()
    if k <= 0 or item_rows.size == 0 or history.size == 0 or similarity is None:
        none = np.full((item_rows.size, max(k, 0)), -1, np.int64)
        return Explained(none, np.zeros(none.shape), np.zeros(none.shape))
    distance = similarity.is_distance
    query = _query(index, similarity, item_rows, fresh)
    sim = _similarities(query, similarity.vectors, history, distance)
    rows, shares, sims = _best_reasons(sim, item_rows, history, k, distance, EPS)
    return Explained(rows, shares, sims)


def liked_history(rows: np.ndarray, ratings: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The history items that may explain a recommendation, with their ratings: those the user
    rated at or above their own mean rating, and those without a rating (NaN: an interaction
    with no value, where every one counts as interest); every item when ``ratings`` is None
    (a version that kept none). A disliked item is never a reason to recommend another."""
    if ratings is None:
        return rows, None
    ratings = np.asarray(ratings, dtype=np.float64)
    rated = np.isfinite(ratings)
    if not rated.any():
        return rows, ratings
    # The highest always counts: rounding in the mean must not drop a user's equal ratings.
    keep = ~rated | (ratings >= ratings[rated].mean()) | (ratings == ratings[rated].max())
    return rows[keep], ratings[keep]


def explain(
    index: RecommenderIndex,
    item_rows: np.ndarray,
    history: np.ndarray,
    k: int,
    fresh: np.ndarray | None = None,
) -> list[list[Reason]]:
    """:func:`explained` as one list of :class:`Reason` per recommended item."""
    return explained(index, item_rows, history, k, fresh).reasons()


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels before the first request, for DCR's
    float32 factors and COE's float64 points."""
    history = np.arange(2, dtype=np.int64)
    for dtype, distance in ((np.float32, False), (np.float64, True)):
        sim = _similarities(np.ones((1, 2), dtype), np.ones((2, 2), dtype), history, distance)
        _best_reasons(sim, np.zeros(1, np.int64), history, 1, distance, EPS)


def explain_count(value: int) -> int:
    """A request's ``explain``: 0 (none) up to :data:`MAX_EXPLAIN`."""
    if not 0 <= value <= MAX_EXPLAIN:
        raise InvalidArgument(f"explain must be between 0 and {MAX_EXPLAIN}, got {value}")
    return value
