"""COE serving index: one Euclidean map of users and items.

Scores are negative Euclidean distances (higher is better on the wire).
``recommend`` asks the items KD-tree for the nearest items to the user instead
of scoring the whole catalogue; ``score_users`` / ``score_items`` /
``pair_scores`` compute the same distances densely for batch work and for
the trainer's evaluation, so reported accuracies come from this code.
"""

from __future__ import annotations

import numpy as np

from ordrec.service.indices.models.base import MapIndex, PointSet, Ranked, RecommenderIndex, check_finite
from ordrec.service.indices.models.capabilities import DISTANCE, ItemSimilarity
from ordrec.service.indices.rules import Eligible
from ordrec.service.storage.artifact import Artifact, ArtifactError


class COEIndex(RecommenderIndex, MapIndex):
    """Users and items on one map (space ""), entities "users" and "items"."""

    kind = "coe"
    folds_in = True
    rpcs = RecommenderIndex.rpcs | MapIndex.rpcs

    def __init__(self, artifact: Artifact):
        super().__init__(artifact)  # RecommenderIndex then MapIndex (cooperative MRO)
        user_coords = np.asarray(artifact.array("user_coords"), dtype=np.float64)
        item_coords = np.asarray(artifact.array("item_coords"), dtype=np.float64)
        if user_coords.ndim != 2 or item_coords.ndim != 2 or user_coords.shape[1] != item_coords.shape[1]:
            raise ArtifactError(f"{artifact.describe()}: user and item coordinates must share one dimension")
        check_finite("user_coords", user_coords)
        check_finite("item_coords", item_coords)
        self.maps[""] = {
            "users": PointSet(self.users, user_coords),
            "items": PointSet(self.items, item_coords),
        }
        self.user_coords = self.maps[""]["users"].coords
        self.item_coords = self.maps[""]["items"].coords
        # A map trained to put users near what they picked (rated-over-unrated triples) places a
        # new user from interactions without a rating too.
        unrated = artifact.hyperparameters.get("unrated_share", 0.0)
        self.folds_in_picks = isinstance(unrated, (int, float)) and unrated > 0

    @property
    def dim(self) -> int:
        return self.user_coords.shape[1]

    def item_similarity(self) -> ItemSimilarity:
        """The negative distance on the map."""
        return ItemSimilarity(self.item_coords, DISTANCE)

    # ------------------------------------------------------------ scoring
    def score_users(self, user_rows: np.ndarray) -> np.ndarray:
        """Negative distances from each user to every item, (len(user_rows), n_items) float32."""
        u = self.user_coords[np.asarray(user_rows, dtype=np.int64)]
        # |x - y|^2 = |x|^2 + |y|^2 - 2 x.y would lose precision near 0; in low D the direct form is cheap
        diff = u[:, None, :] - self.item_coords[None, :, :]
        return (-np.sqrt(np.einsum("uid,uid->ui", diff, diff))).astype(np.float32)

    def score_items(self, user_row: int, item_rows: np.ndarray) -> np.ndarray:
        """Negative distances from one user to the given items (float32)."""
        return self.score_vector(self.user_coords[user_row], item_rows)

    def score_vector(self, vector: np.ndarray, item_rows: np.ndarray | None = None) -> np.ndarray:
        """Negative distances from a point on the map to every item (or ``item_rows``), float32."""
        items = (
            self.item_coords if item_rows is None else self.item_coords[np.asarray(item_rows, dtype=np.int64)]
        )
        diff = items - vector
        return (-np.sqrt(np.einsum("id,id->i", diff, diff))).astype(np.float32)

    def fold_in(self, item_rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """A point on the fixed map for a user it has not seen: the centroid of their rated
        items weighted by how far above their own mean each rating is (the trainer compares
        ratings within a user, as z-scores); equal weights when all their ratings are equal.
        An interaction without a rating (NaN) weighs as much as the user's mean weight."""
        return _weighted_centroid(self.item_coords[np.asarray(item_rows, dtype=np.int64)], values)

    def fold_in_item(self, user_rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """A point on the fixed map for an item it has not seen: :meth:`fold_in`'s mirror, the
        centroid of the known users who rated it, weighted by how far above the mean of its
        ratings each one is (equal weights when they are all equal; a pick weighs the mean)."""
        return _weighted_centroid(self.user_coords[np.asarray(user_rows, dtype=np.int64)], values)

    def score_factors(self, vector: np.ndarray, item_points: np.ndarray) -> np.ndarray:
        """Negative distances from a point to items given by their points (fresh items)."""
        diff = np.asarray(item_points, dtype=np.float64) - vector
        return (-np.sqrt(np.einsum("id,id->i", diff, diff))).astype(np.float32)

    def user_vector(self, user_row: int) -> np.ndarray:
        """A trained user's point on the map."""
        return self.user_coords[int(user_row)]

    def pair_scores(self, user_rows: np.ndarray, item_rows: np.ndarray) -> np.ndarray:
        """Negative distance of each (user, item) pair, float64 (evaluation over all ratings)."""
        diff = self.user_coords[user_rows] - self.item_coords[item_rows]
        return -np.sqrt(np.einsum("nd,nd->n", diff, diff))

    # ---------------------------------------------------------- recommend
    def recommend(
        self,
        user_row: int,
        n: int,
        *,
        exclude: np.ndarray | None = None,
        candidates: np.ndarray | None = None,
        eligible: Eligible | None = None,
    ) -> Ranked:
        """The ``n`` items nearest the user on the map (:meth:`PointSet.nearest`).

        ``exclude`` (e.g. the user's seen items) is skipped; with
        ``candidates`` only those items are ranked (by distance).
        """
        return self.recommend_for(
            self.user_coords[user_row], n, exclude=exclude, candidates=candidates, eligible=eligible
        )

    def _search_vector(self, vector, n, exclude, candidates, eligible) -> Ranked | None:
        if candidates is not None or eligible is not None:
            return (
                None  # rules mask dense scores (service/indices/rules.py), which the map search has not got
            )
        return self.maps[""]["items"].nearest(vector, n, exclude)

    def recommend_many(self, user_rows, n, *, excludes, candidates=None, eligible=None) -> list[Ranked]:
        if candidates is not None or eligible is not None:
            return super().recommend_many(
                user_rows, n, excludes=excludes, candidates=candidates, eligible=eligible
            )
        return [self.recommend(int(u), n, exclude=ex) for u, ex in zip(user_rows, excludes)]

    def _shares_pass(self, eligible: Eligible | None) -> bool:
        return False  # the map search answers each user (as recommend does), not a dense pass

    # -------------------------------------------------------------- smoke
    def smoke(self) -> None:
        RecommenderIndex.smoke(self)
        MapIndex.smoke(self)
        # the map search must agree with the dense distances on one user
        n = min(5, len(self.items))
        if n and len(self.users):
            rows, scores = self.recommend(0, n)
            brute = np.sort(self.score_users(np.array([0]))[0])[::-1][:n]
            if not np.allclose(scores, brute, atol=1e-4):
                raise ArtifactError(
                    f"{self.artifact.describe()}: map search and brute-force distances disagree"
                )
        # cross-entity queries: items near a user, users near an item
        if len(self.users) and len(self.items):
            self.neighbors("", "users", 0, "items", 1)
            self.neighbors("", "items", 0, "users", 1)


def _weighted_centroid(points: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The centroid of ``points`` weighted by how far above their mean each value is (equal
    weights when all are equal); a NaN value (no rating) weighs the mean weight."""
    values = np.asarray(values, dtype=np.float64)
    rated = np.isfinite(values)
    weights = np.zeros_like(values)
    if rated.any():
        weights[rated] = np.maximum(values[rated] - values[rated].mean(), 0.0)
    if not weights.any():
        weights = np.ones_like(values)
    elif not rated.all():
        weights[~rated] = weights[rated].mean()
    return weights @ points / weights.sum()
