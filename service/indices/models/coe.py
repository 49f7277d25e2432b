"""COE serving index: one Euclidean map of users and items.

Scores are negative Euclidean distances (higher is better on the wire).
``recommend`` asks the items KD-tree for the nearest items to the user instead
of scoring the whole catalogue; ``score_users`` / ``score_items`` /
``pair_scores`` compute the same distances densely for batch work and for
the trainer's evaluation, so reported accuracies come from this code.
"""

from __future__ import annotations

import functools

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
        """A point on the fixed map for an item it has not seen, from known users' ratings of
        it, each read against the rater's own ratings (:meth:`relative_ratings`). Raters who
        rated it above their own mean pull it toward them, and it moves away from the average
        user as far as they stand apart from it (:func:`_apart_from_population`): a taste
        group's item goes where that group's own items are, not to the middle of the map where
        what everyone likes sits. Raters below their own mean push it out to at least their
        distance to the items they rated alike (:func:`_keep_away`), as the trainer's
        within-user triples want; with no rater above their mean it starts across the map from
        them (:func:`_reflected`). Versions that kept no ratings read each rating against the
        item's mean."""
        rows = np.asarray(user_rows, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if np.isfinite(self.mean_rating):
            relative = self.relative_ratings(rows, values) - self.mean_rating
        else:
            relative = values - np.nanmean(values) if np.isfinite(values).any() else values
        points, weights = self.user_coords[rows], _rater_weights(relative)
        liked = weights > 0
        below = weights < 0
        anchor = (
            _apart_from_population(points[liked], weights[liked], self.mean_user_point)
            if liked.any()
            else _reflected(points[below], -weights[below], self.mean_item_point)
        )
        if not below.any():
            return anchor
        floors = self._farthest_alike(rows[below], values[below])
        return _keep_away(anchor, points[below], floors, anchor_weight=int(liked.sum()))

    def place_like_items(self, item_rows: np.ndarray) -> np.ndarray:
        """The items' centroid moved away from the middle of the map by as much as it stands
        apart from it (:func:`_apart_from_population`): a plain centroid of many points lies
        nearer the middle than they do, where it would be near every user."""
        points = self.item_coords[np.asarray(item_rows, dtype=np.int64)]
        return _apart_from_population(points, np.ones(len(points)), self.mean_item_point)

    @functools.cached_property
    def mean_user_point(self) -> np.ndarray:
        """The centroid of the trained users' points."""
        return self.user_coords.mean(axis=0)

    @functools.cached_property
    def mean_item_point(self) -> np.ndarray:
        """The centroid of the trained items' points (an item only disliked starts across it
        from its raters)."""
        return self.item_coords.mean(axis=0)

    def _farthest_alike(self, user_rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Each user's distance to the farthest of their training items rated nearest their
        value (distances on a map of many dimensions differ little: the mean would sit among
        the items they are recommended)."""
        owner, items = self.rated_alike(user_rows, values)
        distance = np.linalg.norm(self.item_coords[items] - self.user_coords[user_rows][owner], axis=1)
        farthest = np.zeros(len(user_rows))
        np.maximum.at(farthest, owner, distance)
        return farthest

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


KEEP_AWAY_STEPS = 500  # at most; they stop once a step moves the point less than KEEP_AWAY_TOLERANCE
KEEP_AWAY_TOLERANCE = 1e-5  # map units


def _rater_weights(relative: np.ndarray) -> np.ndarray:
    """Each rater's signed weight, their rating minus their own mean; a pick (NaN) weighs the
    mean weight of the positive ones (1 when there are none)."""
    weights = np.where(np.isfinite(relative), relative, 0.0)
    positive = weights[weights > 0]
    weights[~np.isfinite(relative)] = positive.mean() if positive.size else 1.0
    return weights


def _apart_from_population(points: np.ndarray, weights: np.ndarray, population: np.ndarray) -> np.ndarray:
    """The minimum of ``sum_k weights[k] |x - points[k]|^2 - (W / 2) |x - population|^2`` (``W``
    the weights' sum): the raters' weighted centroid ``c`` moved on by ``c - population``,
    pulled to its raters and pushed from the average user with half their weight."""
    centroid = weights @ points / weights.sum()
    return 2.0 * centroid - population


def _reflected(points: np.ndarray, weights: np.ndarray, middle: np.ndarray) -> np.ndarray:
    """The points' weighted centroid reflected through ``middle``: across the map from them."""
    return 2.0 * middle - weights @ points / weights.sum()


def _keep_away(anchor: np.ndarray, points: np.ndarray, floors: np.ndarray, anchor_weight: int) -> np.ndarray:
    """A point near ``anchor`` (weighing ``anchor_weight`` points) at least ``floors[k]`` from
    ``points[k]``: majorisation steps in which each too-near point pushes the answer out to its
    floor along the line from it."""
    x = anchor
    for _ in range(KEEP_AWAY_STEPS):
        away = x - points
        distance = np.maximum(np.linalg.norm(away, axis=1), 1e-9)
        reach = np.maximum(distance, floors)
        pushed = points + (reach / distance)[:, None] * away
        x, before = (pushed.sum(axis=0) + anchor_weight * anchor) / (len(points) + anchor_weight), x
        if np.linalg.norm(x - before) < KEEP_AWAY_TOLERANCE:
            break
    return x
