"""Why an item was recommended: the items of the user's own history that explain it.

For each recommended item ``i`` and each history item ``h`` (the user's training items, or
the items recorded for a folded-in user), a weight ``w(i, h)``:

- **DCR / Pairwise DCR**: ``w = max(0, sim(i, h))`` with ``sim`` the level-weighted inner
  product of the item factors (``service/indices/similar.py``): how much of ``i``'s score a user
  made of ``h`` alone would give it. A user's factors are fitted to lean toward the items
  they rated, so the history items most similar to ``i`` are those its score comes from.
- **COE**: ``w = 1 / (d(i, h) + EPS)``, the inverse distance on the map: the user sits among
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
from ordrec.service.indices.models.coe import COEIndex
from ordrec.service.indices.models.dcr import DCRIndex

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


def _weights(
    index: RecommenderIndex, item_rows: np.ndarray, history: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(similarity, weight) of each (recommended, history) pair, shape ``(n, m)``."""
    if isinstance(index, DCRIndex):
        factors = index.item_factors
        sim = (factors[item_rows] * index.level_scale) @ factors[history].T
        return sim, np.maximum(sim, 0.0)
    if isinstance(index, COEIndex):
        diff = index.item_coords[item_rows][:, None, :] - index.item_coords[history][None, :, :]
        distance = np.sqrt(np.einsum("nmd,nmd->nm", diff, diff))
        return -distance, 1.0 / (distance + EPS)
    return np.zeros((item_rows.size, history.size)), np.zeros((item_rows.size, history.size))


@njit(cache=True)
def _best_reasons(weight, item_rows, history, k):
    """Per row of ``weight``: the positions of its ``k`` largest positive weights (largest first,
    the earlier position among equals; -1 pads) and the row's total, the recommended item's own
    history entry left out of both. One pass: sorting every row costs more than the products."""
    n, m = weight.shape
    best = np.full((n, k), -1, np.int64)
    totals = np.zeros(n)
    for i in range(n):
        for j in range(m):
            w = weight[i, j]
            if w <= 0 or history[j] == item_rows[i]:
                continue
            totals[i] += w
            pos = k
            while pos > 0 and (best[i, pos - 1] < 0 or w > weight[i, best[i, pos - 1]]):
                pos -= 1
            if pos < k:
                for q in range(k - 1, pos, -1):
                    best[i, q] = best[i, q - 1]
                best[i, pos] = j
    return best, totals


def explain(
    index: RecommenderIndex, item_rows: np.ndarray, history: np.ndarray, k: int
) -> list[list[Reason]]:
    """Up to ``k`` reasons for each of ``item_rows``, largest share first (module docstring)."""
    item_rows = np.asarray(item_rows, dtype=np.int64)
    history = np.asarray(history, dtype=np.int64)
    if history.size > 1 and not (history[1:] > history[:-1]).all():
        history = np.unique(history)  # training items arrive sorted and distinct
    if k <= 0 or item_rows.size == 0 or history.size == 0:
        return [[] for _ in range(item_rows.size)]
    sim, weight = _weights(index, item_rows, history)
    best, totals = _best_reasons(np.ascontiguousarray(weight, dtype=np.float64), item_rows, history, k)
    reasons = []
    for i, positions in enumerate(best.tolist()):
        total = totals[i]
        reasons.append(
            [
                Reason(int(history[j]), float(weight[i, j] / total), float(sim[i, j]))
                for j in positions
                if j >= 0
            ]
        )
    return reasons


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel before the first request."""
    _best_reasons(np.ones((1, 2)), np.zeros(1, np.int64), np.arange(2, dtype=np.int64), 1)


def explain_count(value: int) -> int:
    """A request's ``explain``: 0 (none) up to :data:`MAX_EXPLAIN`."""
    if not 0 <= value <= MAX_EXPLAIN:
        raise InvalidArgument(f"explain must be between 0 and {MAX_EXPLAIN}, got {value}")
    return value
