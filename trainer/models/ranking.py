"""NDCG@k of scored test items, and precision, recall and F1 of top-N lists: the
ranking measures the protocols report and the estimators use for choices made on
validation data (DCR keeping its pairwise refinement, RTF choosing its dimension).
They sit with the models so that both layers share one implementation;
``ordrec.trainer.evaluation.metrics`` re-exports them."""

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


def topn_recall(found: np.ndarray, relevant: np.ndarray, k: int) -> float:
    """Relevant items among the first ``k`` found, over ``min(k, len(relevant))`` (full marks
    are reachable however few items are relevant)."""
    return float(np.isin(found[:k], relevant).sum()) / min(k, relevant.size)


def liked_threshold(ratings: np.ndarray) -> float:
    """The second-highest rating value present: held-out ratings at or above it are liked."""
    values = np.unique(np.asarray(ratings, dtype=np.float64))
    return float(values[-2] if values.size >= 2 else values[-1]) if values.size else float("nan")


#: Scores per batch of users in :func:`served_recall_values` (16M float32: 64 MB).
SCORE_BATCH = 1 << 24


def served_recall_values(index, test: Ratings, threshold: float, k: int = 10) -> np.ndarray:
    """Per user with a held-out rating at or above ``threshold``: :func:`topn_recall` of the
    ``k`` items ``index`` recommends among all the user did not train on (``index.seen``)."""
    liked = np.asarray(test.rating, dtype=np.float64) >= threshold - 1e-9
    users, items = test.user[liked].astype(np.int64), test.item[liked].astype(np.int64)
    order = np.argsort(users, kind="stable")
    users, items = users[order], items[order]
    rows, starts = np.unique(users, return_index=True)
    # Users in batches of about SCORE_BATCH scores: a batch's score matrix stays tens of MB
    # however many users are held out (480,000 x 17,770 at once would be 34 GB).
    step = max(1, SCORE_BATCH // max(int(test.n_items), 1))
    bounds = np.r_[starts, users.size]
    values = np.empty(rows.size, dtype=np.float64)
    for lo in range(0, rows.size, step):
        part = rows[lo : lo + step]
        # Each batch's lists are scored as they come: holding every user's list (two small
        # arrays and their objects, some 400 bytes a user) would cost 190 MB at 480,000 users.
        found = index.recommend_many(part, k, excludes=[index.seen(int(u)) for u in part])
        for row, (top, _) in enumerate(found, start=lo):
            values[row] = topn_recall(top, items[bounds[row] : bounds[row + 1]], k)
    return values


def _cumulative_hits(top_lists: list[np.ndarray], truth: list[np.ndarray], max_n: int):
    """Per list, its hits among the first N entries for N = 1..max_n, and its true-set size (at least 1)."""
    hits = np.zeros((len(top_lists), max_n))
    sizes = np.array([max(t.size, 1) for t in truth], dtype=np.float64)
    for k, (top, true) in enumerate(zip(top_lists, truth)):
        hit = np.isin(top[:max_n], true).astype(np.float64)
        hits[k, : hit.size] = hit
    return np.cumsum(hits, axis=1), sizes


def precision_recall(top_lists: list[np.ndarray], truth: list[np.ndarray], max_n: int = 10):
    """Mean precision and recall at N = 1..max_n over ranked lists and their true sets.

    A list shorter than N counts its missing slots as misses (precision
    divides by N).
    """
    cum, sizes = _cumulative_hits(top_lists, truth, max_n)
    ns = np.arange(1, max_n + 1)
    precision = (cum / ns).mean(axis=0)
    recall = (cum / sizes[:, None]).mean(axis=0)
    return precision, recall


def per_list_f1(top_lists: list[np.ndarray], truth: list[np.ndarray], max_n: int = 10) -> np.ndarray:
    """F1@N of every list on its own, shape (lists, max_n): ``2 hits / (N + |truth|)``.

    For paired comparisons of two methods on the same lists (standard errors
    over lists); the protocols report the F1 of the averaged precision and
    recall (:func:`precision_recall`, :func:`f1`).
    """
    cum, sizes = _cumulative_hits(top_lists, truth, max_n)
    return 2.0 * cum / (np.arange(1, max_n + 1)[None, :] + sizes[:, None])


def f1(precision, recall):
    """Harmonic mean of precision and recall, 0 where both are 0 (scalars or arrays)."""
    precision, recall = np.asarray(precision, dtype=np.float64), np.asarray(recall, dtype=np.float64)
    denom = precision + recall
    return np.where(denom > 0, 2 * precision * recall / np.where(denom > 0, denom, 1), 0.0)
