"""SCORE index: one 2-D (K-D) map per aspect, and the shared sphere.

Spaces:

- ``<aspect name>``: the aspect's map. ``maps[aspect]["objects"]`` holds each
  object's coordinates ``E_t^T y_i``, where ``E_t`` is a fixed orthonormal
  basis of the tangent plane at the aspect point ``x_t`` (:func:`tangent_basis`).
  Since ``E_t^T (y_i - y_j)`` has the length of ``(I - x_t x_t^T)(y_i - y_j)``,
  map distances are exactly the model's aspect distances ``d^t`` (paper Eq. 2
  and appendix Eq. 12).
- ``""``: the sphere itself in R^(K+1), with ``"objects"`` and ``"aspects"``.
  Chord distance ``|x_s - x_t| = sqrt(2 - 2 cos angle)`` is monotone in the
  angle, so the nearest aspects there are the most related by angular
  similarity. Not present in disjoint mode, where objects have no shared point.

Scores on the wire are negative distances (higher is better).
"""

from __future__ import annotations

import numpy as np

from ordrec.service.indices.models.base import MapIndex, PointSet, Ranked, check_finite
from ordrec.service.storage.artifact import Artifact, ArtifactError
from ordrec.service.storage.idmap import IdMap


def tangent_basis(x: np.ndarray) -> np.ndarray:
    """A deterministic orthonormal basis ``E`` (shape (K+1, K)) of the plane
    tangent to the unit sphere at ``x``.

    Householder construction: with ``s = sign(x[-1])`` (+1 at 0) and
    ``v = x + s e_last``, the reflection ``H = I - 2 v v^T / v^T v`` maps ``x``
    to ``-s e_last``; being symmetric and orthogonal, its first K columns are
    orthonormal and orthogonal to ``x``. It depends only on ``x`` (no random
    choice), is smooth away from the equator's sign flip, and for an aspect at
    the pole ``e_last`` it gives the first K coordinate axes.
    """
    x = np.asarray(x, dtype=np.float64)
    x = x / np.linalg.norm(x)
    dim = x.shape[0]
    s = 1.0 if x[-1] >= 0 else -1.0
    v = x.copy()
    v[-1] += s
    H = np.eye(dim) - 2.0 * np.outer(v, v) / (v @ v)
    return H[:, : dim - 1]


def angular_similarity(points: np.ndarray) -> np.ndarray:
    """``1 - angle / pi`` between every pair of unit vectors (rows)."""
    cos = np.clip(points @ points.T, -1.0, 1.0)
    return 1.0 - np.arccos(cos) / np.pi


class SCOREIndex(MapIndex):
    kind = "score"
    default_entity = "objects"

    def __init__(self, artifact: Artifact):
        super().__init__(artifact)
        self.objects: IdMap = artifact.idmap("objects")
        self.aspects: IdMap = artifact.idmap("aspects")
        Y = np.asarray(artifact.array("object_points"), dtype=np.float64)
        X = np.asarray(artifact.array("aspect_points"), dtype=np.float64)
        sets = np.asarray(artifact.array("aspect_object_set"), dtype=np.int64)
        self.deltas = np.asarray(artifact.array("deltas"), dtype=np.float64)
        n_obj, n_asp = len(self.objects), len(self.aspects)
        what = artifact.describe()
        if Y.ndim != 3 or Y.shape[1] != n_obj or Y.shape[2] < 2:
            raise ArtifactError(f"{what}: object_points {Y.shape} do not match {n_obj} objects")
        if X.shape != (n_asp, Y.shape[2]):
            raise ArtifactError(f"{what}: aspect_points {X.shape} do not match {n_asp} aspects")
        if sets.shape != (n_asp,) or (n_asp and (sets.min() < 0 or sets.max() >= Y.shape[0])):
            raise ArtifactError(f"{what}: aspect_object_set does not index object_points")
        if self.deltas.shape != (n_asp,):
            raise ArtifactError(f"{what}: deltas do not match the aspects")
        check_finite("object_points", Y)
        check_finite("aspect_points", X)
        self.codes = np.asarray(artifact.array("codes")) if "codes" in artifact.arrays else None
        if self.codes is not None and self.codes.shape != (n_obj, n_asp):
            raise ArtifactError(f"{what}: codes {self.codes.shape} do not match objects x aspects")
        self.values: dict[str, list[str]] = dict(artifact.attributes.get("values", {}))
        self.mode = artifact.attributes.get("mode", "multi")
        self.dim = Y.shape[2] - 1
        self.aspect_points = X
        self.object_points = Y
        self.aspect_object_set = sets
        self.bases = np.empty((n_asp, Y.shape[2], self.dim))
        for t, name in enumerate(self.aspects.ids):
            self.bases[t] = tangent_basis(X[t])
            coords = Y[sets[t]] @ self.bases[t]
            self.maps[name] = {"objects": PointSet(self.objects, coords)}
        if Y.shape[0] == 1:  # one shared sphere: objects and aspects in R^(K+1)
            self.maps[""] = {"objects": PointSet(self.objects, Y[0]), "aspects": PointSet(self.aspects, X)}

    # ------------------------------------------------------------ queries
    def spaces(self) -> list[str]:
        return list(self.aspects.ids)

    def map_coordinates(self, aspect: str) -> np.ndarray:
        """(n_objects, K) coordinates of every object on ``aspect``'s map."""
        return self.point_set(aspect, "objects").coords

    def related_aspects(self, aspect_row: int, k: int) -> Ranked:
        """The ``k`` aspects nearest to one on the sphere (negative chord distances)."""
        if "" not in self.maps:
            raise KeyError("space '' (disjoint maps share no sphere)")
        return self.neighbors("", "aspects", aspect_row, "aspects", k)

    def aspect_similarity(self) -> np.ndarray:
        """Angular similarity between every pair of aspects on the sphere."""
        return angular_similarity(self.aspect_points)

    def value_labels(self, aspect: str) -> list[str | None] | None:
        """Each object's value of ``aspect`` as text (None when missing), to
        colour that aspect's map; None when the artifact has no codes."""
        if self.codes is None:
            return None
        t = self.aspects.row(aspect)
        if t < 0:
            raise KeyError(f"aspect {aspect!r}")
        labels = self.values.get(aspect, [])
        return [labels[c] if 0 <= c < len(labels) else None for c in self.codes[:, t]]
