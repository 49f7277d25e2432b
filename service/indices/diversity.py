"""Diversity: re-rank a candidate pool by maximal marginal relevance (MMR), optionally with at
most ``m`` items per value of one item attribute.

The pool is the model's own top ``POOL_FACTOR * n`` (best first). Step by step MMR picks the
pool item maximising ``(1 - lambda) * rel(i) - lambda * max_{s chosen} sim(i, s)``, where
``rel`` is the model score scaled to [0, 1] over the pool and ``sim`` a bounded item similarity:

- when the version publishes categorical item attributes (genres, categories, brands), the
  Jaccard similarity of two items' values over all of them: what a user sees as "the same
  kind of item". A pair where either item has no value (not in the attributes file, a fresh
  item the newer file does not describe) takes the model's similarity instead;
- otherwise the model's bounded item similarity (``service/indices/similar.py``: level-weighted
  cosine for DCR, ``1 - d / d_max`` for COE).

``lambda = 0`` keeps the model's ranking exactly; ``lambda = 1`` ignores relevance after the
first item. Scores on the wire stay the model's own, so a diversified list is not sorted by them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from ordrec.service.errors import InvalidArgument
from ordrec.service.indices.models.base import Ranked, RecommenderIndex
from ordrec.service.indices.rules import FilterError, ItemAttributes
from ordrec.service.indices.similar import (
    inner_product,
    item_similarity,
    item_vectors,
    pairwise_distances,
    pairwise_similarity,
)

# How many times n items the model ranks for the re-ranking to choose from.
POOL_FACTOR = 5
# Longest attribute name a request may cap (names are short column names).
MAX_ATTRIBUTE_CHARS = 200


@dataclass(frozen=True)
class AttributeCap:
    """At most ``limit`` results per value of item attribute ``attribute``."""

    attribute: str
    limit: int


@dataclass(frozen=True)
class Diversify:
    """A request's diversity settings: MMR weight and the optional per-attribute cap."""

    weight: float = 0.0
    cap: AttributeCap | None = None

    @property
    def active(self) -> bool:
        return self.weight > 0 or self.cap is not None

    def pool_size(self, n: int) -> int:
        return POOL_FACTOR * n if self.active else n


def mmr_order(
    relevance: np.ndarray, similarity: np.ndarray, weight: float, n: int, allowed=None
) -> list[int]:
    """Pool positions in MMR order (at most ``n``); ``allowed(position, chosen)`` may veto one."""
    size = relevance.size
    low, high = (float(relevance.min()), float(relevance.max())) if size else (0.0, 0.0)
    rel = (relevance - low) / (high - low) if high > low else np.zeros(size)
    penalty = np.zeros(size)
    open_ = np.ones(size, dtype=bool)
    chosen: list[int] = []
    while len(chosen) < n and open_.any():
        value = np.where(open_, (1.0 - weight) * rel - weight * penalty, -np.inf)
        pick = int(np.argmax(value))  # the first of equals: the model's order breaks ties
        open_[pick] = False
        if allowed is not None and not allowed(pick, chosen):
            continue
        penalty = similarity[pick] if not chosen else np.maximum(penalty, similarity[pick])
        chosen.append(pick)
    return chosen


@njit(cache=True)
def _mmr_kernel(relevance, similarity, x, weight, n):
    """:func:`mmr_order` without a veto, compiled (the same picks, ties to the earlier position).
    The similarity is ``similarity`` or, when ``x`` has rows, the cosine of its rows computed
    only between each pick and the open items (``n x pool`` products, not the whole matrix),
    summed in ``x``'s precision (float32 for DCR: vectorised, as BLAS sums them)."""
    size = relevance.size
    cosine = x.shape[0] > 0
    norms = np.ones(size)
    if cosine:
        for j in range(size):
            norms[j] = max(np.sqrt(np.float64(inner_product(x[j], x[j]))), 1e-12)
    low, high = relevance.min(), relevance.max()
    span = high - low
    penalty = np.zeros(size)
    taken = np.zeros(size, np.bool_)
    order = np.empty(min(n, size), np.int64)
    for step in range(order.size):
        best, best_value = -1, -np.inf
        for j in range(size):
            if taken[j]:
                continue
            rel = (relevance[j] - low) / span if span > 0 else 0.0
            value = (1.0 - weight) * rel - weight * penalty[j]
            if best < 0 or value > best_value:
                best, best_value = j, value
        taken[best] = True
        order[step] = best
        if step + 1 == order.size:
            break  # the last pick's similarities would choose nothing
        for j in range(size):
            if taken[j]:
                continue
            if cosine:
                sim = inner_product(x[best], x[j]) / (norms[best] * norms[j])
            else:
                sim = similarity[best, j]
            if step == 0 or sim > penalty[j]:
                penalty[j] = sim
    return order


def mmr_cosine(relevance: np.ndarray, vectors: np.ndarray, weight: float, n: int) -> np.ndarray:
    """:func:`mmr_compiled` over the cosine similarities of ``vectors``' rows, without forming
    their matrix (DCR's uncapped path: the level-weighted cosine, ``service/indices/similar.py``)."""
    return _mmr_kernel(
        np.asarray(relevance, np.float64), np.zeros((0, 0)), np.ascontiguousarray(vectors), float(weight), n
    )


def mmr_compiled(relevance: np.ndarray, similarity: np.ndarray, weight: float, n: int) -> np.ndarray:
    """:func:`mmr_order` without a veto, as a numba kernel (the path of every uncapped request)."""
    return _mmr_kernel(
        np.asarray(relevance, np.float64),
        np.ascontiguousarray(similarity, dtype=np.float64),
        np.zeros((0, 0)),
        float(weight),
        n,
    )


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel before the first request."""
    mmr_compiled(np.ones(2), np.eye(2), 0.5, 1)
    mmr_cosine(np.ones(2), np.eye(2, dtype=np.float32), 0.5, 1)  # DCR's factors are float32
    pairwise_distances(np.eye(2))  # COE's similarity over the pool
    jaccard_similarity(2, np.array([0, 1]), np.array([0, 0]))  # the item attributes' similarity


def rerank(
    index: RecommenderIndex,
    pool: Ranked,
    n: int,
    settings: Diversify,
    fresh: np.ndarray | None = None,
    fresh_values: ItemAttributes | None = None,
) -> Ranked:
    """The ``n`` items of ``pool`` that ``settings`` choose, in their order; fewer when the
    cap leaves fewer. ``FilterError`` when the capped attribute does not exist. Rows past the
    version's items are fresh items (factors ``fresh``, attribute values ``fresh_values``:
    without them never capped, and compared by the model's similarity)."""
    rows, scores = pool
    if not settings.active or rows.size == 0:
        return rows[:n], scores[:n]
    by_attributes = attribute_similarity(index, rows, fresh, fresh_values) if settings.weight > 0 else None
    latent_cosine = settings.cap is None and settings.weight > 0 and not item_similarity(index).is_distance
    if by_attributes is None and latent_cosine:
        vectors = item_similarity(index).rooted(item_vectors(index, rows, fresh))
        order = mmr_cosine(np.asarray(scores, np.float64), vectors, settings.weight, n)
        return rows[order], scores[order]
    similarity = by_attributes
    if similarity is None and settings.weight > 0:
        similarity = pairwise_similarity(index, rows, fresh)
    if similarity is None:  # a cap alone: relevance order, vetoed
        similarity = np.zeros((rows.size, rows.size))
    allowed = None
    if settings.cap is not None:
        allowed = _capped(index, rows, settings.cap, fresh_values)
    relevance = np.asarray(scores, np.float64)
    if allowed is None:
        order = mmr_compiled(relevance, similarity, settings.weight, n)
    else:
        order = np.asarray(mmr_order(relevance, similarity, settings.weight, n, allowed), dtype=np.int64)
    return rows[order], scores[order]


def attribute_similarity(
    index: RecommenderIndex,
    rows: np.ndarray,
    fresh: np.ndarray | None = None,
    fresh_values: ItemAttributes | None = None,
) -> np.ndarray | None:
    """The Jaccard similarity of the rows' categorical values (every categorical attribute of
    the version), the model's own similarity for a pair with an undescribed item; None when the
    version has no categorical attribute (fresh rows as in :func:`rerank`)."""
    entries = categorical_entries(index, rows, fresh_values)
    if entries is None:
        return None
    similarity, described = jaccard_similarity(rows.size, *entries)
    if not described.all():  # undescribed items: the model's similarity for their pairs
        bare = ~(described[:, None] & described[None, :])
        similarity[bare] = pairwise_similarity(index, rows, fresh)[bare]
    return similarity


def categorical_entries(
    index: RecommenderIndex, rows: np.ndarray, fresh_values: ItemAttributes | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Every categorical value of the rows as (position in ``rows``, code in the version's
    ``categorical_pairs``; a fresh item's value the version lacks gets a code past them); None
    when the version has no categorical value (fresh rows as in :func:`rerank`)."""
    attributes = index.item_attributes
    if not attributes.categorical_pairs:
        return None
    trained = rows < len(index.items)
    if trained.all():
        return attributes.categorical_entries(rows)
    positions, codes = attributes.categorical_entries(rows[trained])
    positions = np.flatnonzero(trained)[positions]
    if fresh_values is None:
        return positions, codes
    fresh_positions, fresh_codes = fresh_values.categorical_entries(rows[~trained] - len(index.items))
    code_of, pairs = attributes.categorical_code, fresh_values.categorical_pairs
    mapped = [code_of.get(pairs[c], len(code_of) + c) for c in fresh_codes.tolist()]
    return (
        np.concatenate([positions, np.flatnonzero(~trained)[fresh_positions]]),
        np.concatenate([codes, np.asarray(mapped, dtype=np.int64)]),
    )


def jaccard_similarity(size: int, positions: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``|a & b| / |a | b|`` between every two of ``size`` items whose values are the entries
    (item position, value code), float64 (1 on a described item's diagonal), and which items
    have a value (one without is similar to nothing)."""
    positions = np.asarray(positions, dtype=np.int64)
    counts = np.bincount(positions, minlength=size)
    return _jaccard_kernel(positions, np.asarray(codes, dtype=np.int64), counts), counts > 0


@njit(cache=True)
def _jaccard_kernel(positions, codes, counts):
    """:func:`jaccard_similarity`'s matrix: each item's codes sorted, then every pair merged
    (a list has a few values per item; no matrix over the whole vocabulary)."""
    size = counts.size
    order = np.argsort(positions * (codes.max() + 1 if codes.size else 1) + codes)
    sorted_codes = codes[order]
    starts = np.zeros(size + 1, np.int64)
    starts[1:] = np.cumsum(counts)
    out = np.zeros((size, size))
    for i in range(size):
        if counts[i] == 0:
            continue
        out[i, i] = 1.0
        for j in range(i + 1, size):
            a, b, shared = starts[i], starts[j], 0
            while a < starts[i + 1] and b < starts[j + 1]:
                if sorted_codes[a] == sorted_codes[b]:
                    shared += 1
                    a += 1
                    b += 1
                elif sorted_codes[a] < sorted_codes[b]:
                    a += 1
                else:
                    b += 1
            union = counts[i] + counts[j] - shared
            out[i, j] = out[j, i] = shared / union
    return out


def intra_list_attribute_diversity(index: RecommenderIndex, rows: np.ndarray, name: str = "genre") -> float:
    """What a user sees of a list's variety: the mean ``1 - Jaccard`` of attribute ``name``'s
    values over the pairs of items that have some (0 below two such items); FilterError
    when the version has no such attribute."""
    values = index.item_attributes.item_values(name, np.asarray(rows, dtype=np.int64))
    code_of: dict = {}
    codes = [code_of.setdefault(value, len(code_of)) for item in values for value in item]
    positions = np.repeat(np.arange(len(values)), [len(item) for item in values])
    similarity, described = jaccard_similarity(len(values), positions, np.asarray(codes, dtype=np.int64))
    kept = similarity[np.ix_(described, described)]
    if kept.shape[0] < 2:
        return 0.0
    return float(np.mean(1.0 - kept[np.triu_indices(kept.shape[0], k=1)]))


def pool_values(
    index: RecommenderIndex, rows: np.ndarray, name: str, fresh_values: ItemAttributes | None
) -> list[tuple[str | float, ...]]:
    """Each row's values of attribute ``name``; rows past the version's items are fresh items,
    valued by ``fresh_values`` (none without it). FilterError when the version lacks ``name``."""
    trained = rows < len(index.items)
    known = index.item_attributes.item_values(name, rows[trained])
    if trained.all():
        return known
    values: list[tuple[str | float, ...]] = [()] * rows.size
    for position, found in zip(np.flatnonzero(trained).tolist(), known):
        values[position] = found
    if fresh_values is not None:
        positions = np.flatnonzero(~trained)
        fresh = fresh_values.item_values(name, rows[positions] - len(index.items))
        for position, found in zip(positions.tolist(), fresh):
            values[position] = found
    return values


def _capped(
    index: RecommenderIndex, rows: np.ndarray, cap: AttributeCap, fresh_values: ItemAttributes | None
):
    """A veto: an item any of whose values already has ``cap.limit`` chosen items (fresh
    items, rows past the version's, by ``fresh_values`` when given)."""
    try:
        values = pool_values(index, rows, cap.attribute, fresh_values)
    except FilterError as exc:
        raise FilterError(f"max_per_attribute: {exc}") from None
    counts: dict[str | float, int] = {}

    def allowed(position: int, chosen: list[int]) -> bool:
        mine = values[position]
        if any(counts.get(v, 0) >= cap.limit for v in mine):
            return False
        for v in mine:
            counts[v] = counts.get(v, 0) + 1
        return True

    return allowed


def settings_from_request(diversity: float, cap_attribute: str, cap_limit: int, has_cap: bool) -> Diversify:
    """Checked diversity settings of a request (``diversity``, ``max_per_attribute``)."""
    if not (np.isfinite(diversity) and 0.0 <= diversity <= 1.0):
        raise InvalidArgument(f"diversity must be between 0 and 1, got {diversity}")
    cap = None
    if has_cap:
        if not cap_attribute:
            raise InvalidArgument("max_per_attribute.attribute is empty")
        if len(cap_attribute) > MAX_ATTRIBUTE_CHARS:
            raise InvalidArgument(
                f"max_per_attribute.attribute is {len(cap_attribute)} characters long;"
                f" the limit is {MAX_ATTRIBUTE_CHARS}"
            )
        if cap_limit < 1:
            raise InvalidArgument(f"max_per_attribute.max must be at least 1, got {cap_limit}")
        cap = AttributeCap(cap_attribute, cap_limit)
    return Diversify(float(diversity), cap)
