"""Diversity: re-rank a candidate pool by maximal marginal relevance (MMR), optionally with at
most ``m`` items per value of one item attribute.

The pool is the model's own top ``POOL_FACTOR * n`` (best first). Step by step MMR picks the
pool item maximising ``(1 - lambda) * rel(i) - lambda * max_{s chosen} sim(i, s)``, where
``rel`` is the model score scaled to [0, 1] over the pool and ``sim`` the model's bounded item
similarity (``service/indices/similar.py``: level-weighted cosine for DCR, ``1 - d / d_max`` for COE).
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
    without them never capped)."""
    rows, scores = pool
    if not settings.active or rows.size == 0:
        return rows[:n], scores[:n]
    if settings.cap is None and settings.weight > 0 and not item_similarity(index).is_distance:
        vectors = item_similarity(index).rooted(item_vectors(index, rows, fresh))
        order = mmr_cosine(np.asarray(scores, np.float64), vectors, settings.weight, n)
        return rows[order], scores[order]
    similarity = (
        pairwise_similarity(index, rows, fresh) if settings.weight > 0 else np.zeros((rows.size, rows.size))
    )
    allowed = None
    if settings.cap is not None:
        allowed = _capped(index, rows, settings.cap, fresh_values)
    relevance = np.asarray(scores, np.float64)
    if allowed is None:
        order = mmr_compiled(relevance, similarity, settings.weight, n)
    else:
        order = np.asarray(mmr_order(relevance, similarity, settings.weight, n, allowed), dtype=np.int64)
    return rows[order], scores[order]


def _capped(
    index: RecommenderIndex, rows: np.ndarray, cap: AttributeCap, fresh_values: ItemAttributes | None
):
    """A veto: an item any of whose values already has ``cap.limit`` chosen items (fresh
    items, rows past the version's, by ``fresh_values`` when given)."""
    trained = rows < len(index.items)
    try:
        known = index.item_attributes.item_values(cap.attribute, rows[trained])
        if trained.all():
            values = known
        else:
            values = [()] * rows.size
            for position, found in zip(np.flatnonzero(trained).tolist(), known):
                values[position] = found
            if fresh_values is not None:
                positions = np.flatnonzero(~trained)
                fresh = fresh_values.item_values(cap.attribute, rows[positions] - len(index.items))
                for position, found in zip(positions.tolist(), fresh):
                    values[position] = found
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
