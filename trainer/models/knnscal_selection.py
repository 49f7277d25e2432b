"""Start selection for KNNSCAL: fit from the best of several neighbour embeddings of the graph,
and (where the fit is validated) keep whichever of that fit and the geodesic start's fits the
lists better, then polish the winner once. A wrapper around a :class:`KnnScal`, the way
``GridSearchCV`` wraps an estimator; ``docs/knnscal.md`` has the measurements."""

from __future__ import annotations

import time
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from scipy import sparse

from ordrec.service.storage.artifact import Artifact
from ordrec.trainer.models import knnscal_local
from ordrec.trainer.models.base import Interval, Options, validate_params
from ordrec.trainer.models.knnscal import KnnScal, neighbor_csr


def embed(method: str, X: np.ndarray, P: sparse.csr_matrix, seed: int) -> np.ndarray:
    """One neighbour embedding of P ("exact" t-SNE, or "sampled") from the geodesic start X."""
    # t-SNE's start scale: a spread of 1e-4, so early exaggeration forms the clusters.
    Y = 1e-4 * (X - X.mean(axis=0)) / max(float(X[:, 0].std()), 1e-300)
    if method == "exact":
        return knnscal_local.tsne_exact(Y, P)
    return knnscal_local.neighbor_embedding_sampled(Y * 1e4, P, seed=int(seed))


class KnnScalStartSelection:
    """Fit a :class:`KnnScal` from the best of ``n_starts`` neighbour embeddings (t-SNE on the
    graph's rank affinities), validated against the geodesic start.

    Each start (the estimator's geodesic start, then ``n_starts - 1`` more from other seeds) is
    embedded and scored by order agreement plus recall@k against the graph itself; the best
    (the first on a tie) starts the fit, whose local term uses the same affinities ("exact").
    Where the estimator's fit is validated (solver ``keep_iterations="validated"``, up to
    ``exact_max_n`` vertices) the geodesic start is fitted too and the map that fits the
    lists better is kept; the winner is then polished (solver ``polish_rounds``).

    Parameters
    ----------
    estimator : KnnScal
        The settings of every fit (a copy is fitted).
    method : {"auto", "exact", "sampled", "none"}, default "auto"
        The neighbour embedding: "auto" is "exact" up to the solver's ``exact_max_n``
        vertices, else "none" (the estimator's own geodesic fit).
    n_starts : int, default 4
        Neighbour embeddings from as many starts; the one that fits the lists best is kept.
    rank_decay : float or "auto", default 2.0
        p_j|i proportional to exp(-rank_decay (r_ij - 1) / k_i); "auto": 1 + k / 10.
    """

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "method": [Options(str, {"auto", "exact", "sampled", "none"})],
        "n_starts": [Interval(Integral, 1, None)],
        "rank_decay": [Interval(Real, 0, None), Options(str, {"auto"})],
    }

    def __init__(
        self, estimator: KnnScal, *, method: str = "auto", n_starts: int = 4, rank_decay: float | str = 2.0
    ):
        self.estimator = estimator
        self.method = method
        self.n_starts = n_starts
        self.rank_decay = rank_decay

    def get_params(self) -> dict[str, Any]:
        return {"method": self.method, "n_starts": self.n_starts, "rank_decay": self.rank_decay}

    def decay(self, indptr: np.ndarray) -> float:
        """The rank affinities' decay: ``rank_decay``, or under "auto" 1 + k / 10 (k the longest list)."""
        if self.rank_decay == "auto":
            return 1.0 + int(np.diff(indptr).max()) / 10.0
        return float(self.rank_decay)

    def resolved_method(self, est: KnnScal, n: int) -> str:
        """``method`` with "auto" decided for n vertices (the exact gradient is O(n^2) per iteration)."""
        if self.method != "auto":
            return self.method
        return "exact" if n <= est.solver_settings().exact_max_n else "none"

    def fit(self, data) -> KnnScalStartSelection:
        """Fit a copy of ``estimator`` from the chosen start into ``estimator_``; sets
        ``neighbor_embedding_used_``, and with it ``ne_scores_`` (each start's score, in start
        order), ``ne_start_`` (the kept one) and ``start_seconds_``."""
        validate_params(type(self).__name__, self.get_params(), self._parameter_constraints)
        est = type(self.estimator)(**self.estimator.get_params())
        data = est.neighbor_lists(data)
        method = self.resolved_method(est, len(data.vertices))
        self.neighbor_embedding_used_ = method != "none"
        if method == "none":
            self.estimator_ = est.fit_from(data).polish()
            return self
        started = time.perf_counter()
        start, P = self.best_start(est, data, method)
        self.start_seconds_ = time.perf_counter() - started
        est.fit_from(data, start, P if method == "exact" else None)  # the local term: exact KL only
        if np.isfinite(est.graph_score_):  # validated: the geodesic start's fit is the other candidate
            geodesic = est.geodesic_estimator().fit_from(data)
            if geodesic.graph_score_ > est.graph_score_:
                est.adopt(geodesic)
        self.estimator_ = est.polish()
        return self

    def best_start(self, est: KnnScal, data, method: str) -> tuple[np.ndarray, sparse.csr_matrix]:
        """The neighbour embedding of the graph that fits its lists best, of ``n_starts``, and the affinities."""
        indptr, col, rnk = neighbor_csr(data)
        n = len(data.vertices)
        P = knnscal_local.rank_affinities(indptr, col, rnk, n, self.decay(indptr))
        geodesic = np.ascontiguousarray(est.initial_configuration(indptr, col, rnk, n), dtype=np.float64)
        best, scores = geodesic, []
        for j in range(int(self.n_starts)):
            seed = (int(est.random_state), j)
            start = geodesic if j == 0 else est.initial_configuration(indptr, col, rnk, n, seed=seed)
            Y = embed(method, start, P, int(est.random_state))
            scores.append(sum(knnscal_local.graph_agreement(Y, indptr, col, rnk)))
            if scores[-1] > max(scores[:-1], default=-np.inf):
                best = Y
        self.ne_scores_ = np.array(scores)
        self.ne_start_ = int(np.argmax(self.ne_scores_))
        est.log(f"n={n:,}: neighbour embeddings scored {', '.join(f'{v:.4f}' for v in scores)}")
        return best, P

    def to_artifact(self) -> Artifact:
        """The fitted estimator's artifact (the pipeline records the start selection's settings)."""
        return self.estimator_.to_artifact()
