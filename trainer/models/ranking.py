"""NDCG@k of scored test items: the ranking measure the protocols report and the
estimators use for choices made on validation ratings (e.g. DCR keeping its pairwise
refinement). It sits with the models so that both layers share one implementation;
``ordrec.trainer.evaluation.metrics`` re-exports it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ordrec.trainer.data.types import Ratings

ScoreItems = Callable[[int, np.ndarray], np.ndarray]  # (user row, item rows) -> scores, higher is better


def ndcg(ratings_in_ranked_order: np.ndarray, k: int = 10) -> float:
    """NDCG@k of one ranked list with gains ``2**rating - 1``; NaN when no item has a gain."""
    gains = np.exp2(np.asarray(ratings_in_ranked_order, dtype=np.float64)) - 1.0
    discount = 1.0 / np.log2(np.arange(2, min(k, gains.size) + 2))
    idcg = float(np.sort(gains)[::-1][:k] @ discount)
    return float(gains[:k] @ discount) / idcg if idcg > 0 else float("nan")


def ndcg_values(score_items: ScoreItems, test: Ratings, k: int = 10) -> np.ndarray:
    """NDCG@k of every user of ``test`` with a positive ideal DCG, in user-row order.

    Each user's test items are ranked by ``score_items``; ties keep the items'
    row order (a stable sort), identical for every method.
    """
    order = np.lexsort((test.item, test.user))
    users, items, ratings = test.user[order], test.item[order], test.rating[order].astype(np.float64)
    bounds = np.r_[0, np.flatnonzero(np.diff(users)) + 1, users.size] if users.size else np.array([0])
    values = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        scores = np.asarray(score_items(int(users[lo]), items[lo:hi].astype(np.int64)), dtype=np.float64)
        value = ndcg(ratings[lo:hi][np.argsort(-scores, kind="stable")], k)
        if not np.isnan(value):
            values.append(value)
    return np.asarray(values, dtype=np.float64)
