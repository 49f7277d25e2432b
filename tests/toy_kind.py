"""A toy sixth model kind, written the way a new kind is: an estimator, its
serving index and its protocol, registered by one call (``TOY``).

The model is a damped item mean: every user gets the items with the highest
``sum of ratings / (count + shrinkage)``. Its index declares an item similarity (the inner
product of each item's mean rating from each of ``VECTOR_DIM`` groups of users), so it gets
SimilarItems, explanations and diversity.
"""

from __future__ import annotations

import argparse

import numpy as np

from ordrec.service.indices.models.base import RecommenderIndex, check_finite
from ordrec.service.indices.models.capabilities import ItemSimilarity
from ordrec.service.indices.models.kinds import ModelKind
from ordrec.service.storage.artifact import Artifact, ArtifactError
from ordrec.trainer.data.readers import read_input
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.evaluation import holdout
from ordrec.trainer.evaluation.metrics import ndcg_at_k
from ordrec.trainer.models.base import Estimator as EstimatorBase
from ordrec.trainer.reproduce.report import Row, summarise

TOY = ModelKind(
    "toy",
    index="tests.toy_kind:Index",
    estimator="tests.toy_kind:Estimator",
    protocol="tests.toy_kind",
    summary="toy: NDCG@10 of damped item means on a held-out split",
)


# ---------------------------------------------------------------- estimator
class Estimator(EstimatorBase):
    kind = "toy"
    input_shape = "ratings"

    def __init__(self, *, shrinkage: float = 5.0, random_state: int = 0):
        self.shrinkage = shrinkage
        self.random_state = random_state

    def fit(self, data: Ratings) -> Estimator:
        counts = np.bincount(data.item, minlength=data.n_items).astype(np.float64)
        sums = np.bincount(data.item, weights=data.rating, minlength=data.n_items)
        self.item_score_ = (sums / (counts + self.shrinkage)).astype(np.float32)
        order = np.lexsort((data.item, data.user))
        self.seen_indptr_ = np.r_[0, np.cumsum(np.bincount(data.user, minlength=data.n_users))]
        self.seen_indices_ = data.item[order]
        self.popularity_ = counts.astype(np.float32)
        self.item_vectors_ = _group_means(data)
        self.users_, self.items_ = data.users, data.items
        return self

    def to_artifact(self) -> Artifact:
        return Artifact(
            kind=self.kind,
            ids={"users": self.users_, "items": self.items_},
            arrays={
                "item_score": self.item_score_,
                "seen_indptr": self.seen_indptr_.astype(np.int64),
                "seen_indices": self.seen_indices_.astype(np.int32),
                "item_popularity": self.popularity_,
                "item_vectors": self.item_vectors_,
            },
            hyperparameters=self.get_params(),
        )


# Users fall into this many groups (row modulo it): an item's vector is its mean rating per group.
VECTOR_DIM = 4


def _group_means(data: Ratings) -> np.ndarray:
    group = data.user % VECTOR_DIM
    sums = np.zeros((data.n_items, VECTOR_DIM))
    counts = np.zeros((data.n_items, VECTOR_DIM))
    np.add.at(sums, (data.item, group), data.rating)
    np.add.at(counts, (data.item, group), 1.0)
    return (sums / np.maximum(counts, 1.0)).astype(np.float32)


# -------------------------------------------------------------------- index
class Index(RecommenderIndex):
    kind = "toy"

    def __init__(self, artifact: Artifact):
        super().__init__(artifact)
        self.item_score = np.asarray(artifact.array("item_score"), dtype=np.float32)
        if self.item_score.shape != (len(self.items),):
            raise ArtifactError(f"{artifact.describe()}: item_score does not match the items")
        check_finite("item_score", self.item_score)
        self.item_vectors = np.ascontiguousarray(artifact.array("item_vectors"), dtype=np.float32)
        check_finite("item_vectors", self.item_vectors)

    def item_similarity(self) -> ItemSimilarity:
        return ItemSimilarity(self.item_vectors)

    def score_users(self, user_rows: np.ndarray) -> np.ndarray:
        return np.broadcast_to(self.item_score, (len(user_rows), self.item_score.size)).copy()

    def score_items(self, user_row: int, item_rows: np.ndarray) -> np.ndarray:
        return self.item_score[item_rows]


# ----------------------------------------------------------------- protocol
DEFAULT_RUNS = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shrinkage", type=float, default=5.0)


def run(args: argparse.Namespace) -> list[Row]:
    data = read_input("ratings", args.data, args.format, skip_bad_lines=args.skip_bad_lines)
    values = []
    for run_index in range(args.runs):
        train, test = holdout.split(data, 0.2, args.seed + run_index)
        index = Index.from_artifact(Estimator(shrinkage=args.shrinkage).fit(train).to_artifact())
        values.append(ndcg_at_k(index.score_items, test))  # the split keeps the id maps: rows agree
    return [summarise("toy", "data", {"shrinkage": args.shrinkage}, "ndcg@10", values)]
