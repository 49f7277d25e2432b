"""Full-catalogue top-N metrics: what a served list finds of a user's held-out liked items.

Shared by ``ordrec-train reproduce topn`` and the cron job's gate. A list is
a row of item rows (``-1`` pads a short one); the truth is each user's
held-out items rated at or above a threshold (on implicit data: every held-out interaction).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ordrec.trainer.data.types import Ratings
from ordrec.trainer.models.ranking import topn_recall


@dataclass(frozen=True)
class TopN:
    """Each user's relevant held-out items: ``users`` (sorted rows) and a CSR of item rows."""

    users: np.ndarray
    indptr: np.ndarray
    items: np.ndarray

    @classmethod
    def from_ratings(cls, test: Ratings, threshold: float) -> TopN:
        """Explicit ratings: the held-out ratings at or above ``threshold`` are relevant;
        implicit data (interactions): every held-out interaction, whatever its strength."""
        liked = np.asarray(test.rating, dtype=np.float64) >= threshold - 1e-9
        if test.implicit:
            liked = np.ones(len(test), dtype=bool)
        user, item = test.user[liked].astype(np.int64), test.item[liked].astype(np.int64)
        order = np.lexsort((item, user))
        user, item = user[order], item[order]
        users, counts = np.unique(user, return_counts=True)
        return cls(users, np.r_[0, np.cumsum(counts)], item)

    def relevant(self, k: int) -> np.ndarray:
        return self.items[self.indptr[k] : self.indptr[k + 1]]

    def only(self, users: np.ndarray) -> TopN:
        """The truth of the listed users alone."""
        keep = np.flatnonzero(np.isin(self.users, users))
        parts = [self.relevant(int(k)) for k in keep]
        counts = np.array([p.size for p in parts], dtype=np.int64)
        items = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return TopN(self.users[keep], np.r_[0, np.cumsum(counts)], items)

    def without(self, users: np.ndarray) -> TopN:
        return self.only(np.setdiff1d(self.users, users))


def topn_metrics(lists: np.ndarray, truth: TopN, train: Ratings) -> dict[str, float]:
    """recall@10, NDCG@10 (binary gain), recall@20 over ``truth.users`` (rows of ``lists``),
    catalogue coverage of the top 10s and their share of the 10 % most-rated items of ``train``."""
    discount = 1.0 / np.log2(np.arange(2, 12))
    recall10, recall20, ndcg10 = [], [], []
    for k in range(truth.users.size):
        relevant = truth.relevant(k)
        hit = np.isin(lists[k], relevant)
        recall10.append(topn_recall(lists[k], relevant, 10))
        recall20.append(topn_recall(lists[k], relevant, 20))
        ndcg10.append(float(hit[:10] @ discount[: hit[:10].size]) / discount[: min(10, relevant.size)].sum())
    top10 = lists[:, :10]
    top10 = top10[top10 >= 0]
    counts = np.bincount(train.item, minlength=train.n_items)
    head = np.argsort(-counts, kind="stable")[: max(1, train.n_items // 10)]
    return {
        "recall@10": float(np.mean(recall10)) if recall10 else float("nan"),
        "ndcg@10": float(np.mean(ndcg10)) if ndcg10 else float("nan"),
        "recall@20": float(np.mean(recall20)) if lists.shape[1] >= 20 and recall20 else float("nan"),
        "coverage@10": float(np.unique(top10).size / max(train.n_items, 1)),
        "popular_share@10": float(np.isin(top10, head).mean()) if top10.size else float("nan"),
    }
