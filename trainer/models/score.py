"""SCORE: Spherical Conditional Ordinal Embedding (Le & Lauw, IJCAI 2019).

Every aspect ``t`` and object ``i`` is a unit vector in R^(K+1) (``x_t``,
``y_i``); aspect t's map is the projection of the objects on the tangent plane
at ``x_t`` (Eq. 2). A conditional triplet ``<i, j, k>_t`` ("under t, j is more
similar to i than to k") has likelihood
``l = delta_t s(alpha (d^t_jk - d^t_ij)) + (1 - delta_t) s(alpha (y_i.y_j - y_k.y_j))``
(Eqs. 3, 5, 6); a vMF prior adds ``kappa mu.z`` per point (Eq. 7). Learning is
Riemannian SGD (Algorithm 1): gradient, projection on the tangent space
(Eq. 9), step, retraction by normalising (Eq. 8), then the delta update and
clip to [0, 1].

Inputs: an :class:`~trainer.data.types.AttributeTable` (one aspect per
attribute; ``<i, j, k>_t`` whenever i and j share t's value and k has another),
whose triplets are sampled uniformly on the fly and never listed, or explicit
:class:`~trainer.data.triplets.ConditionalTriplets`.

Modes (``mode``):

- ``"multi"``: SCORE, one tangent-plane map per aspect on a shared sphere;
- ``"single"``: every aspect's triplets pooled into one map (one aspect
  point and one delta shared by all aspects), the paper's single-map mode;
- ``"disjoint"``: every aspect learns alone, on its own copy of the object
  points: no sharing at all. Its delta is held at 1, so each map is fitted
  directly (the paper's disjoint baselines, SOE and t-STE, are plain map
  learners); with the delta update a lone aspect lets the sphere's global view
  absorb its triplets (delta -> 0) and leaves the map itself untrained.

The artifact always lists every aspect; in single mode they share one point.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real
from typing import ClassVar

import numpy as np

from ordrec.service.storage.artifact import Artifact
from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.data.triplets import ConditionalTriplets
from ordrec.trainer.data.types import AttributeTable
from ordrec.trainer.models import score_kernels
from ordrec.trainer.models.base import Estimator, Interval, Options, check_finite
from ordrec.trainer.progress import Progress

MODES = ("multi", "single", "disjoint")
# Exact training preservation costs O(objects^2) per aspect: recorded up to this size.
PRESERVATION_MAX_OBJECTS = 5000


# ------------------------------------------------------- preservation (Eq. 10)
def _pair_distances(coords: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    diff = coords[rows][:, None, :] - coords[cols][None, :, :]
    return np.sqrt(np.einsum("abk,abk->ab", diff, diff))


def satisfied_triplets(coords: np.ndarray, values: np.ndarray, chunk: int = 256) -> tuple[int, int]:
    """``(satisfied, total)`` over every triplet ``<i, j, k>`` of one aspect.

    A triplet has i != j sharing a value (``values >= 0``; -1 is missing) and k
    with another value; it is satisfied when ``d(j, i) < d(j, k)`` strictly
    (Eq. 10). Counted per anchor j without listing triplets: the distances
    from j to the other groups are sorted once, and a row-wise binary search
    gives, for every same-group i, how many k lie strictly farther.
    """
    coords = np.asarray(coords, dtype=np.float64)
    values = np.asarray(values)
    valid = np.nonzero(values >= 0)[0]
    vals = values[valid]
    satisfied = total = 0
    for v in np.unique(vals):
        same, other = valid[vals == v], valid[vals != v]
        n_s, n_o = same.size, other.size
        if n_s < 2 or n_o == 0:
            continue
        total += n_s * (n_s - 1) * n_o
        for start in range(0, n_s, chunk):
            anchors = same[start : start + chunk]
            to_other = np.sort(_pair_distances(coords, anchors, other), axis=1)
            to_same = _pair_distances(coords, anchors, same)
            # Offset each row into its own interval so one searchsorted on the
            # flattened sorted rows works row by row (offsets are exact in
            # float64 for equal values, so ties stay ties).
            span = 2.0 * max(to_other.max(), to_same.max()) + 1.0
            row = np.arange(anchors.size)
            flat = (to_other + (row * span)[:, None]).ravel()
            at_most = np.searchsorted(flat, to_same + (row * span)[:, None], side="right")
            farther = n_o - (at_most - (row * n_o)[:, None])
            # i == j (distance 0) is not a triplet: remove its term.
            self_at_most = np.searchsorted(flat, row * span, side="right") - row * n_o
            satisfied += int(farther.sum() - (n_o - self_at_most).sum())
    return satisfied, total


@dataclass
class GroupLayout:
    """An attribute table's triplets in the form the sampler draws from.

    ``members[aspect_start[t]:aspect_start[t+1]]`` are aspect t's objects
    (those with a value), sorted by value; group g is
    ``members[group_start[g]:group_end[g]]``; ``group_cum`` is the running
    total of ``n_g (n_g - 1) (N_t - n_g)``, the group's number of triplets.
    """

    members: np.ndarray
    aspect_start: np.ndarray
    group_start: np.ndarray
    group_end: np.ndarray
    group_aspect: np.ndarray
    group_cum: np.ndarray

    @classmethod
    def from_codes(cls, codes: np.ndarray) -> GroupLayout:
        codes = np.asarray(codes)
        n_aspects = codes.shape[1]
        members, aspect_start = [], [0]
        g_start, g_end, g_aspect, g_count = [], [], [], []
        base = 0
        for t in range(n_aspects):
            col = codes[:, t]
            objs = np.nonzero(col >= 0)[0]
            objs = objs[np.argsort(col[objs], kind="stable")]
            sizes = np.unique(col[objs], return_counts=True)[1].astype(np.int64)
            n_t = objs.size
            starts = base + np.cumsum(sizes) - sizes
            g_start.append(starts)
            g_end.append(starts + sizes)
            g_aspect.append(np.full(sizes.size, t, dtype=np.int64))
            g_count.append(sizes.astype(np.float64) * (sizes - 1) * (n_t - sizes))
            members.append(objs)
            base += n_t
            aspect_start.append(base)
        return cls(
            _concat(members, np.int64),
            np.asarray(aspect_start, np.int64),
            _concat(g_start, np.int64),
            _concat(g_end, np.int64),
            _concat(g_aspect, np.int64),
            np.cumsum(_concat(g_count, np.float64)),
        )

    def triplets_per_aspect(self, n_aspects: int) -> np.ndarray:
        counts = np.diff(np.concatenate([[0.0], self.group_cum]))
        return np.bincount(self.group_aspect, weights=counts, minlength=n_aspects)

    @property
    def n_triplets(self) -> float:
        return float(self.group_cum[-1]) if self.group_cum.size else 0.0


def _concat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.empty(0, dtype)


def random_sphere(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    z = rng.standard_normal((n, dim))
    return z / np.linalg.norm(z, axis=1, keepdims=True)


class SCORE(Estimator):
    """Fit SCORE maps by Riemannian SGD.

    Parameters
    ----------
    n_components : int
        K, the dimension of each aspect's map; points live on S^K in R^(K+1).
    mode : {"multi", "single", "disjoint"}
        See the module docstring.
    alpha : float
        Sigmoid scale of Eqs. 3 and 5 (paper: 30).
    learning_rate, learning_rate_final : float, default 0.05, 0.0005
        Learning rate, decayed linearly from ``learning_rate`` to
        ``learning_rate_final`` over all steps (paper: 0.05, "decayed").
    max_iter : int, default 20
        Number of epochs; finiteness is checked after each.
    steps_per_epoch : int
        SGD steps per epoch; 0 means one pass's worth (the number of training
        triplets), capped at ``max_steps_per_epoch``.
    max_steps_per_epoch : int
        Cap of the default epoch length, for tables with 1e12 triplets.
    kappa : float
        vMF concentration (paper: 0 on Zoo and HouseVote); ``mu`` is its mean
        direction, default the last axis (paper: (0, 0, 1)).
    delta_init : float
        Initial delta_t (the prior is uniform on [0, 1]); disjoint mode uses 1.
    random_state : int, default 0
        Seeds the initialisation and the triplet draws.
    verbose : bool, default False
        Progress line on stderr.
    """

    kind = "score"
    # Fitted from an attribute table (codes, values, layout) or from explicit triplets.
    codes_: np.ndarray | None
    values_: list[list] | None
    layout_: GroupLayout | None
    triplets_: tuple[np.ndarray, ...] | None
    input_shape = "attributes"

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "n_components": [Interval(Integral, 1, None)],
        "mode": [Options(str, set(MODES))],
        "alpha": [Interval(Real, None, None)],
        "learning_rate": [Interval(Real, 0, None)],
        "learning_rate_final": [Interval(Real, 0, None)],
        "max_iter": [Interval(Integral, 0, None)],
        "steps_per_epoch": [Interval(Integral, 0, None)],
        "max_steps_per_epoch": [Interval(Integral, 0, None)],
        "kappa": [Interval(Real, None, None)],
        "mu": [None, list, tuple, np.ndarray],
        "delta_init": [Interval(Real, 0, 1)],
        "random_state": [Interval(Integral, 0, None)],
        "verbose": ["boolean"],
    }

    def __init__(
        self,
        *,
        n_components=2,
        mode="multi",
        alpha=30.0,
        learning_rate=0.05,
        learning_rate_final=0.0005,
        max_iter=20,
        steps_per_epoch=0,
        max_steps_per_epoch=2_000_000,
        kappa=0.0,
        mu=None,
        delta_init=0.5,
        random_state=0,
        verbose=False,
    ):
        self.n_components = n_components
        self.mode = mode
        self.alpha = alpha
        self.learning_rate = learning_rate
        self.learning_rate_final = learning_rate_final
        self.max_iter = max_iter
        self.steps_per_epoch = steps_per_epoch
        self.max_steps_per_epoch = max_steps_per_epoch
        self.kappa = kappa
        self.mu = mu
        self.delta_init = delta_init
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------------ fit
    def _mu(self, dim: int) -> np.ndarray:
        if self.mu is None:
            mu = np.zeros(dim)
            mu[-1] = 1.0
            return mu
        mu = np.asarray(self.mu, dtype=np.float64)
        if mu.shape != (dim,) or not np.isfinite(mu).all() or np.linalg.norm(mu) == 0:
            raise ValueError(f"mu must be a non-zero vector of length {dim}")
        return mu / np.linalg.norm(mu)

    def fit(self, data) -> SCORE:
        """Learn from an :class:`AttributeTable` or :class:`ConditionalTriplets`."""
        self._validate_params()
        if isinstance(data, AttributeTable):
            self.objects_, self.aspects_ = data.objects, IdMap(list(data.attributes))
            self.codes_ = np.ascontiguousarray(data.codes, dtype=np.int32)
            self.values_ = [list(v) for v in data.values]
            self.labels_ = list(data.labels) if data.labels is not None else None
            self.layout_ = GroupLayout.from_codes(self.codes_)
            self.triplets_ = None
            per_aspect = self.layout_.triplets_per_aspect(len(self.aspects_))
        elif isinstance(data, ConditionalTriplets):
            self.objects_, self.aspects_ = data.objects, data.aspects
            self.codes_, self.values_, self.labels_, self.layout_ = None, None, None, None
            self.triplets_ = tuple(
                np.ascontiguousarray(a, dtype=np.int64) for a in (data.aspect, data.i, data.j, data.k)
            )
            per_aspect = data.counts().astype(np.float64)
        else:
            raise TypeError(f"SCORE fits an AttributeTable or ConditionalTriplets, not {type(data).__name__}")
        self.fingerprint_ = data.fingerprint()
        n_obj, n_asp = len(self.objects_), len(self.aspects_)
        n_triplets = float(per_aspect.sum())
        if n_triplets <= 0:
            raise ValueError(
                "the data hold no triplet: every aspect needs two objects sharing a value"
                " and one with another value"
            )
        self.triplets_per_aspect_ = per_aspect
        dim = int(self.n_components) + 1

        # Mode = which aspect row and which copy of the objects a triplet trains.
        if self.mode == "multi":
            aspect_row, n_sets = np.arange(n_asp), 1
            object_offset = np.zeros(n_asp, np.int64)
        elif self.mode == "single":
            aspect_row, n_sets = np.zeros(n_asp, np.int64), 1
            object_offset = np.zeros(n_asp, np.int64)
        else:
            aspect_row, n_sets = np.arange(n_asp), n_asp
            object_offset = np.arange(n_asp, dtype=np.int64) * n_obj
        self.aspect_row_ = aspect_row.astype(np.int64)
        self.object_set_ = (np.arange(n_asp) if self.mode == "disjoint" else np.zeros(n_asp)).astype(np.int32)
        n_rows = int(aspect_row.max()) + 1

        rng = np.random.default_rng(self.random_state)
        X = random_sphere(rng, n_rows, dim)
        Y = random_sphere(rng, n_sets * n_obj, dim)
        learn_delta = self.mode != "disjoint"
        delta = np.full(n_rows, float(self.delta_init) if learn_delta else 1.0)
        mu = self._mu(dim)
        steps = int(self.steps_per_epoch) or int(min(n_triplets, int(self.max_steps_per_epoch)))
        epochs = int(self.max_iter)
        lr0, lr1 = float(self.learning_rate), float(self.learning_rate_final)
        self.loglik_ = []
        with Progress(f"SCORE[{self.mode}]", epochs, enabled=bool(self.verbose)) as bar:
            for epoch in range(epochs):
                # Linear decay over the whole run, cut into per-epoch segments.
                a = lr0 + (lr1 - lr0) * epoch / epochs
                b = lr0 + (lr1 - lr0) * (epoch + 1) / epochs
                seed = int(rng.integers(2**31 - 1))
                if self.layout_ is not None:
                    L = self.layout_
                    ll = score_kernels.group_epoch(
                        X,
                        Y,
                        delta,
                        self.aspect_row_,
                        object_offset,
                        L.members,
                        L.aspect_start,
                        L.group_start,
                        L.group_end,
                        L.group_aspect,
                        L.group_cum,
                        steps,
                        a,
                        b,
                        float(self.alpha),
                        float(self.kappa),
                        mu,
                        learn_delta,
                        seed,
                    )
                else:
                    assert self.triplets_ is not None  # fitted from explicit triplets
                    ta, ti, tj, tk = self.triplets_
                    ll = score_kernels.triplet_epoch(
                        X,
                        Y,
                        delta,
                        self.aspect_row_,
                        object_offset,
                        ta,
                        ti,
                        tj,
                        tk,
                        steps,
                        a,
                        b,
                        float(self.alpha),
                        float(self.kappa),
                        mu,
                        learn_delta,
                        seed,
                    )
                check_finite(epoch, aspect_points=X, object_points=Y, deltas=delta)
                self.loglik_.append(float(ll))
                bar.update(1, loglik=ll)
        self.X_, self.delta_ = X, delta
        self.Y_ = Y.reshape(n_sets, n_obj, dim)
        self.train_preservation_ = None
        if self.codes_ is not None and n_obj <= PRESERVATION_MAX_OBJECTS:
            self.train_preservation_ = self._training_preservation()
        return self

    def _training_preservation(self) -> np.ndarray:
        """Per aspect, the exact preservation (Eq. 10) of every training
        triplet, measured on the serving index's maps (recorded as a metric)."""
        from ordrec.service.indices.models.score import SCOREIndex

        index = SCOREIndex.from_artifact(self._artifact(metrics={}))
        out = np.full(len(self.aspects_), np.nan)
        codes = self.codes_
        assert codes is not None  # called only for a fit from an attribute table
        for t, name in enumerate(self.aspects_.ids):
            sat, tot = satisfied_triplets(index.map_coordinates(name), codes[:, t])
            if tot:
                out[t] = sat / tot
        return out

    # ------------------------------------------------------------- results
    @property
    def aspect_points(self) -> np.ndarray:
        """(n_aspects, K+1): each aspect's point (shared by all in single mode)."""
        return self.X_[self.aspect_row_]

    @property
    def deltas(self) -> np.ndarray:
        return self.delta_[self.aspect_row_]

    def to_artifact(self) -> Artifact:
        """Arrays: ``object_points`` (n_sets, n_objects, K+1), ``aspect_points``,
        ``aspect_object_set`` (which object set each aspect projects), ``deltas``
        and, for attribute input, ``codes`` (n_objects, n_aspects, -1 = missing);
        value labels and object labels travel in the attributes. Metric
        ``preservation``: mean over aspects of the exact preservation of the
        training triplets (attribute input up to
        ``PRESERVATION_MAX_OBJECTS`` objects)."""
        metrics = {"final_mean_loglik": self.loglik_[-1]} if self.loglik_ else {}
        pres = getattr(self, "train_preservation_", None)
        if pres is not None and np.isfinite(pres).any():
            metrics["preservation"] = float(np.nanmean(pres))
        return self._artifact(metrics)

    def _artifact(self, metrics: dict) -> Artifact:
        arrays = {
            "object_points": np.ascontiguousarray(self.Y_, dtype=np.float64),
            "aspect_points": np.ascontiguousarray(self.aspect_points, dtype=np.float64),
            "aspect_object_set": self.object_set_,
            "deltas": np.ascontiguousarray(self.deltas, dtype=np.float64),
        }
        attributes = {
            "mode": self.mode,
            "n_components": int(self.n_components),
            "triplets_per_aspect": [float(c) for c in self.triplets_per_aspect_],
        }
        if self.codes_ is not None and self.values_ is not None:  # both set together
            arrays["codes"] = self.codes_
            attributes["values"] = {name: vals for name, vals in zip(self.aspects_.ids, self.values_)}
            if self.labels_ is not None:
                attributes["object_labels"] = self.labels_
            pres = getattr(self, "train_preservation_", None)
            if pres is not None:
                attributes["preservation_per_aspect"] = {
                    name: (None if np.isnan(v) else float(v)) for name, v in zip(self.aspects_.ids, pres)
                }
        params = self.get_params()
        params["mu"] = None if self.mu is None else [float(v) for v in self.mu]
        return Artifact(
            kind=self.kind,
            arrays=arrays,
            ids={"objects": self.objects_, "aspects": self.aspects_},
            hyperparameters=params,
            metrics=metrics,
            attributes=attributes,
            data_fingerprint=self.fingerprint_,
        )
