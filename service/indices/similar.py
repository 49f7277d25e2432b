"""Item-to-item similarity in each recommender's own geometry (SimilarItems, explanations,
diversity).

Each index declares its similarity (``item_similarity``, ``service/indices/models/capabilities.py``):

- **an inner product** (DCR / Pairwise DCR): ``sim(i, j) = sum_t c_t V_i^t . V_j^t``, the level-weighted inner
  product of the concatenated item factors. It is the score (less the constant) item ``j``
  gets from a user whose factors equal item ``i``'s, so it is the same maximum-inner-product
  search Recommend runs and goes through the version's approximate item index where it has
  one (``service/indices/ann.py``). A basket's similarity is the mean over its items, which is the
  inner product with the mean of their query vectors (one search).
- **a distance** (COE): ``sim(i, j) = -|x_i - x_j|``, the negative distance on the map; a basket's is the
  negative mean distance to its items (scored exactly: maps are small).

Pairwise similarities for diversity are bounded versions of the same: the cosine under the
level-weighted inner product (DCR), ``1 - d / d_max`` over the pool (COE).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ordrec.service.errors import FailedPrecondition
from ordrec.service.indices.models.base import Ranked, RecommenderIndex
from ordrec.service.indices.models.capabilities import ItemSimilarity
from ordrec.service.indices.rules import Eligible
from ordrec.service.indices.topk import affine_scores, top_k

# Most items in one SimilarItems basket (a cart or a session): COE scores each against the map.
MAX_BASKET = 1000


def item_similarity(index: RecommenderIndex) -> ItemSimilarity:
    """The similarity the index declares; FailedPrecondition when it declares none."""
    found = index.item_similarity()
    if found is None:
        raise FailedPrecondition(f"a {index.kind} model has no item similarity")
    return found


def similarities(
    index: RecommenderIndex,
    query_rows: np.ndarray,
    item_rows: np.ndarray | None = None,
    fresh: np.ndarray | None = None,
) -> np.ndarray:
    """Mean similarity of every trained item (or ``item_rows``) to the items ``query_rows``,
    float32; rows past the version's items are fresh items (``fresh``, :func:`item_vectors`)."""
    similarity = item_similarity(index)
    query_rows = np.asarray(query_rows, dtype=np.int64)
    if not similarity.is_distance:
        query = _inner_query(index, query_rows, fresh)
        if item_rows is None:
            return affine_scores(similarity.vectors, query)
        return (item_vectors(index, item_rows, fresh) @ query).astype(np.float32)
    items = similarity.vectors if item_rows is None else item_vectors(index, item_rows, fresh)
    total = np.zeros(items.shape[0], dtype=np.float64)
    for point in item_vectors(index, query_rows, fresh):
        diff = items - point
        total += np.sqrt(np.einsum("id,id->i", diff, diff))
    return (-total / max(1, query_rows.size)).astype(np.float32)


def _inner_query(
    index: RecommenderIndex, query_rows: np.ndarray, fresh: np.ndarray | None = None
) -> np.ndarray:
    """The weighted mean of the query items' vectors: a pseudo-user whose scores are the sims."""
    factors = item_vectors(index, query_rows, fresh).astype(np.float64).mean(axis=0)
    return np.ascontiguousarray(item_similarity(index).weighted(factors), dtype=np.float32)


def similar_items(
    index: RecommenderIndex,
    query_rows: np.ndarray,
    n: int,
    *,
    exclude: np.ndarray | None = None,
    eligible: Eligible | None = None,
    fresh: np.ndarray | None = None,
) -> Ranked:
    """The ``n`` trained items most similar to the basket ``query_rows`` (never one of them, an
    ``exclude`` row or an ineligible one), best first; through DCR's item index when it has one.
    Query rows past the version's items are fresh items with factors ``fresh`` (the fresh
    candidates are ``service/live/fresh.py``'s ``fresh_similar``)."""
    similarity = item_similarity(index)
    query_rows = np.unique(np.asarray(query_rows, dtype=np.int64))
    trained = query_rows[query_rows < len(index.items)]
    skip = trained if exclude is None else np.unique(np.concatenate([trained, exclude]))
    ann = similarity.search
    if ann is not None and not similarity.is_distance and (eligible is None or not eligible.sparse):
        found = ann.search(_inner_query(index, query_rows, fresh), n, skip, eligible)
        if found is not None:
            return found
    if eligible is not None and eligible.sparse:
        rows = eligible.rows
        scores = similarities(index, query_rows, rows, fresh)
        scores[np.isin(rows, skip)] = -np.inf
        order, values = top_k(scores, n)
        return rows[order], values
    scores = similarities(index, query_rows, fresh=fresh)
    return top_k(scores, n, skip, None if eligible is None else eligible.blocked)


def item_vectors(index: RecommenderIndex, rows: np.ndarray, fresh: np.ndarray | None = None) -> np.ndarray:
    """The item vectors (DCR's factors, COE's map points) of ``rows``; rows past the version's
    items are fresh items, row ``len(items) + j`` being ``fresh[j]`` (``service/live/fresh.py``)."""
    trained = item_similarity(index).vectors
    rows = np.asarray(rows, dtype=np.int64)
    if fresh is None or rows.size == 0 or rows.max() < trained.shape[0]:
        return trained[rows]
    base = trained.shape[0]
    out = np.empty((rows.size, trained.shape[1]), dtype=trained.dtype)
    old = rows < base
    out[old] = trained[rows[old]]
    out[~old] = fresh[rows[~old] - base]
    return out


def pairwise_similarity(
    index: RecommenderIndex, rows: np.ndarray, fresh: np.ndarray | None = None
) -> np.ndarray:
    """Bounded similarities among ``rows`` (1 on the diagonal): the level-weighted cosine (DCR),
    ``1 - d / d_max`` over these rows (COE); ``fresh`` as in :func:`item_vectors`."""
    vectors = item_vectors(index, rows, fresh)
    if not item_similarity(index).is_distance:
        x = item_similarity(index).rooted(vectors)
        x /= np.maximum(np.sqrt(np.einsum("ij,ij->i", x, x)), 1e-12)[:, None]
        return (x @ x.T).astype(np.float64)
    d = pairwise_distances(np.asarray(vectors, dtype=np.float64))
    top = d.max() if d.size else 0.0
    return 1.0 - d / top if top > 0 else np.ones_like(d)


@njit(cache=True, fastmath=True)
def inner_product(a, b):
    """``a . b`` of two non-empty vectors, summed in their precision (float32 for DCR's factors,
    as BLAS sums them; fastmath lets the sum vectorise): the compiled explanation and
    diversity kernels' product."""
    total = a[0] - a[0]
    for d in range(a.size):
        total += a[d] * b[d]
    return total


@njit(cache=True, fastmath=True)
def _distances(points):
    """The symmetric matrix of Euclidean distances between ``points``' rows, float64."""
    size, dim = points.shape
    out = np.zeros((size, size))
    for i in range(size):
        for j in range(i + 1, size):
            total = 0.0
            for d in range(dim):
                diff = points[i, d] - points[j, d]
                total += diff * diff
            out[i, j] = out[j, i] = np.sqrt(total)
    return out


def pairwise_distances(points: np.ndarray) -> np.ndarray:
    """Distances between the rows of ``points`` (map points), in one compiled pass: the
    broadcast difference array costs 20 times more at 64 dimensions."""
    return _distances(np.ascontiguousarray(points, dtype=np.float64))


def intra_list_diversity(index: RecommenderIndex, rows: np.ndarray) -> float:
    """Mean dissimilarity over the pairs of a list, 0 below two items: ``1 - cosine`` under the
    level-weighted inner product (DCR), the distance on the map (COE)."""
    similarity = item_similarity(index)
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size < 2:
        return 0.0
    upper = np.triu_indices(rows.size, k=1)
    if not similarity.is_distance:
        return float(np.mean(1.0 - pairwise_similarity(index, rows)[upper]))
    return float(np.mean(pairwise_distances(similarity.vectors[rows])[upper]))
