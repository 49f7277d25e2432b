"""Reusable ranking and map metrics, one definition each.

The cron job's held-out gate (:mod:`ordrec.trainer.evaluation.holdout`) and
the papers' protocols (:mod:`ordrec.trainer.reproduce`) both measure with
these. Scorers and indices are passed in, so every figure comes from the code
that answers queries.
"""

from __future__ import annotations

import numpy as np

from ordrec.trainer.data.types import AttributeTable, Ratings

# One NDCG, one precision/recall/F1 for the protocols and the estimators' validation choices
# (re-exported here).
from ordrec.trainer.models.ranking import (  # noqa: F401
    ScoreItems,
    f1,
    ndcg,
    ndcg_values,
    precision_recall,
)
from ordrec.trainer.models.score import satisfied_triplets


# ------------------------------------------------------------------- ranking
def ndcg_at_k(score_items: ScoreItems, test: Ratings, k: int = 10) -> float:
    """Mean over users of NDCG@k over each user's test items (see :func:`ndcg_values`)."""
    return mean_or_nan(ndcg_values(score_items, test, k))


def mean_or_nan(values) -> float:
    """The mean, NaN for no values (a metric nobody could be measured on)."""
    return float(np.mean(values)) if len(values) else float("nan")


def list_metrics(lists: list[np.ndarray], truth: list[np.ndarray], max_n: int = 10) -> dict[str, float]:
    """``precision@N``, ``recall@N`` and ``f1@N`` for N = 1..max_n."""
    precision, recall = precision_recall(lists, truth, max_n)
    scores = f1(precision, recall)
    out: dict[str, float] = {}
    for n in range(1, max_n + 1):
        out[f"precision@{n}"] = float(precision[n - 1])
        out[f"recall@{n}"] = float(recall[n - 1])
        out[f"f1@{n}"] = float(scores[n - 1])
    return out


def order_agreement(distances_in_listed_order: np.ndarray) -> tuple[float, int]:
    """``(agreeing, pairs)``: pairs of a nearest-first list whose distances keep that order (ties one half)."""
    d = np.asarray(distances_in_listed_order, dtype=np.float64)
    diff = d[None, :] - d[:, None]
    upper = np.triu(np.ones_like(diff, dtype=bool), 1)
    return float(np.sum(diff[upper] > 0) + 0.5 * np.sum(diff[upper] == 0)), int(upper.sum())


# ----------------------------------------------------------------------- maps
def preservation(
    index, table: AttributeTable, observed: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per aspect of ``table`` (looked up by name in the map ``index``): the
    share of conditional triplets the map preserves (SCORE Eq. 10) over all
    triplets, and over the hidden ones (NaN when ``observed`` is None or
    nothing is hidden)."""
    n_asp = len(table.attributes)
    overall, hidden = np.full(n_asp, np.nan), np.full(n_asp, np.nan)
    for t, name in enumerate(table.attributes):
        coords = index.map_coordinates(name)
        sat, tot = satisfied_triplets(coords, table.codes[:, t])
        overall[t] = sat / tot if tot else np.nan
        if observed is not None:
            seen = np.where(observed[:, t], table.codes[:, t], -1)
            sat_o, tot_o = satisfied_triplets(coords, seen)
            if tot > tot_o:
                hidden[t] = (sat - sat_o) / (tot - tot_o)
    return overall, hidden
