"""KNNSCAL serving: the embedding of a ranked neighbour graph as a map.

Artifact (kind "knnscal"):

- id space ``objects``: the graph's vertices;
- ``coordinates`` (n, dim) float64: the fitted configuration X;
- ``rank_disparity`` (q + 1,) float64, optional: the typical fitted disparity
  (median over sources) of a neighbour at rank r = 1..q (index 0 unused,
  index q is the non-edge rank), in map units. ``place`` needs it;
- ``labels`` (n,) int64, optional: class labels, for plots and evaluation.

``Neighbors`` and ``Coordinates`` come from :class:`MapIndex` (space "",
entity "objects"; scores are negative distances). ``Place`` positions a new
vertex from its ranked neighbour list with a few majorization steps for that
point alone, everything else fixed (:func:`place_point`); the trainer's
``Estimator.place`` calls the same function.
"""

from __future__ import annotations

import numpy as np

from ordrec.service.indices.models.base import MapIndex, PointSet, check_finite
from ordrec.service.storage.artifact import Artifact, ArtifactError

DEFAULT_PLACE_STEPS = 30


def place_point(
    coords: np.ndarray,
    neighbor_rows: np.ndarray,
    rank_disparity: np.ndarray,
    steps: int = DEFAULT_PLACE_STEPS,
) -> np.ndarray:
    """Coordinates of a new vertex whose neighbours, nearest first, are ``neighbor_rows``.

    The new vertex x gets the disparity ``rank_disparity[r]`` to its rank-r
    neighbour and its stress sum_r 1/2 (delta_r - ||x - X_r||)^2 is lowered by
    the single-point majorization step (Guttman transform for one point)::

        x <- (1/m) sum_r [ X_r + delta_r / d_r (x - X_r) ]

    which never increases that stress (the same step as the trainer's
    Gauss-Seidel sweep). The start is the 1/r-weighted mean of the neighbours.
    Work is O(m * steps) for m neighbours.
    """
    rows = np.asarray(neighbor_rows, dtype=np.int64)
    if rows.ndim != 1 or rows.size == 0:
        raise ValueError("a placement needs at least one ranked neighbour")
    if rows.min() < 0 or rows.max() >= coords.shape[0]:
        raise ValueError("neighbour row out of range")
    if np.unique(rows).size != rows.size:
        raise ValueError("a neighbour appears twice in the ranked list")
    P = np.asarray(coords[rows], dtype=np.float64)  # (m, dim)
    ranks = np.arange(1, rows.size + 1)
    q = rank_disparity.shape[0] - 1
    delta = np.asarray(rank_disparity, dtype=np.float64)[np.minimum(ranks, q)]
    weights = 1.0 / ranks
    x = weights @ P / weights.sum()
    for _ in range(int(steps)):
        diff = x[None, :] - P
        d = np.sqrt(np.einsum("ij,ij->i", diff, diff))
        ratio = np.divide(delta, d, out=np.zeros_like(d), where=d > 1e-12)
        x = (P + ratio[:, None] * diff).mean(axis=0)
    return x


def placement_stress(
    coords: np.ndarray, neighbor_rows: np.ndarray, rank_disparity: np.ndarray, x: np.ndarray
) -> float:
    """The stress that :func:`place_point` lowers, for a candidate position ``x``."""
    rows = np.asarray(neighbor_rows, dtype=np.int64)
    q = rank_disparity.shape[0] - 1
    delta = np.asarray(rank_disparity, dtype=np.float64)[np.minimum(np.arange(1, rows.size + 1), q)]
    d = np.linalg.norm(coords[rows] - x[None, :], axis=1)
    return float(0.5 * np.sum((delta - d) ** 2))


class KNNSCALIndex(MapIndex):
    """One map, space "", entity "objects"; adds ``place``."""

    kind = "knnscal"
    rpcs = MapIndex.rpcs | frozenset({"Place"})
    default_entity = "objects"

    def __init__(self, artifact: Artifact):
        super().__init__(artifact)
        objects = artifact.idmap("objects")
        coords = np.asarray(artifact.array("coordinates"), dtype=np.float64)
        self.maps[""] = {"objects": PointSet(objects, coords)}
        self.rank_disparity = None
        if "rank_disparity" in artifact.arrays:
            table = np.asarray(artifact.arrays["rank_disparity"], dtype=np.float64)
            if table.ndim != 1 or table.shape[0] < 2:
                raise ArtifactError(f"{artifact.describe()}: rank_disparity must be a vector of q + 1 values")
            check_finite("rank_disparity", table)
            self.rank_disparity = table
        self.labels = None
        if "labels" in artifact.arrays:
            labels = np.asarray(artifact.arrays["labels"])
            if labels.shape != (len(objects),):
                raise ArtifactError(f"{artifact.describe()}: labels do not match the objects")
            self.labels = labels

    @property
    def points(self) -> PointSet:
        return self.maps[""]["objects"]

    def place(self, neighbor_rows: np.ndarray, steps: int = DEFAULT_PLACE_STEPS) -> np.ndarray:
        """Map coordinates for a new vertex given its ranked neighbour rows (rank 1 first)."""
        if self.rank_disparity is None:
            raise ValueError(f"{self.artifact.describe()} has no rank_disparity table: Place is unavailable")
        return place_point(self.points.coords, neighbor_rows, self.rank_disparity, steps)

    def smoke(self) -> None:
        super().smoke()
        points = self.points
        if self.rank_disparity is not None and len(points.ids) >= 2:
            # A vertex placed from its own map neighbours must land on the map, finite.
            rows, _ = self.neighbors("", "objects", 0, "objects", min(5, len(points.ids) - 1))
            x = self.place(rows)
            if x.shape != (points.dim,) or not np.all(np.isfinite(x)):
                raise ArtifactError(f"{self.artifact.describe()}: smoke placement failed")
