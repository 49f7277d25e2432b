"""The choices KNNSCAL makes between candidate maps, each a wrapper around a :class:`KnnScal` the
way ``GridSearchCV`` wraps an estimator (innermost first, as ``pipeline.WRAPPERS["knnscal"]``
stacks them): :class:`ValidatedIterations` keeps a fit's stress iterations only where they fit
the graph at least as well as their start; :class:`KnnScalStartSelection` fits from the best of
several neighbour embeddings and (where the fit is validated) keeps whichever of that fit and the
geodesic start's fits the lists better; :class:`PolishedMap` polishes the winner once.
``docs/knnscal.md`` has the measurements."""

from __future__ import annotations

import copy
import time
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from scipy import sparse

from ordrec.service.storage.artifact import Artifact
from ordrec.trainer.models import knnscal_kernels, knnscal_local
from ordrec.trainer.models.base import Interval, Options, validate_params
from ordrec.trainer.models.knnscal import KnnScal, MapChoice, neighbor_csr
from ordrec.trainer.models.knnscal_polish import polish as polish_map


def served(fitted: Any) -> KnnScal:
    """The fitted KnnScal inside a fitted wrapper chain (the map its artifact serves)."""
    while not isinstance(fitted, KnnScal):
        fitted = fitted.estimator_
    return fitted


def graph_score(fitted: Any) -> float:
    """The outermost ``graph_score_`` of a fitted chain (how well the served map fits the lists);
    NaN where no wrapper validated the map."""
    while not isinstance(fitted, KnnScal):
        if hasattr(fitted, "graph_score_"):
            return float(fitted.graph_score_)
        fitted = fitted.estimator_
    return float("nan")


class _IterationsCheck:
    """The validated choice of one fit (and of a multilevel start's coarser levels): the
    iterations' map, or the start where that fits the lists better; the last fit's outcome
    (the outermost: coarser levels are fitted first) in ``kept`` and ``score``."""

    def __init__(self) -> None:
        self.kept, self.score = True, float("nan")

    def applies(self, est: KnnScal, n: int) -> bool:
        """Up to the solver's ``exact_max_n`` vertices: the k-d tree queries would add time at 10^6."""
        self.kept, self.score = True, float("nan")
        return n <= est.solver_settings().exact_max_n

    def __call__(
        self, est: KnnScal, start: np.ndarray, X: np.ndarray, delta: np.ndarray, order: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        # The graph is in input order; X may be in the Morton order (row r = vertex order[r]).
        inverse = np.arange(X.shape[0]) if order is None else np.argsort(order)
        refined = sum(knnscal_local.graph_agreement(X[inverse], *est.graph_))
        started = sum(knnscal_local.graph_agreement(start[inverse], *est.graph_))
        self.score, self.kept = max(refined, started), refined >= started
        return (X, delta) if self.kept else (start, est.isotonic(start, delta))


class ValidatedIterations:
    """A :class:`KnnScal` fit whose stress iterations are kept only where the map they reach fits
    the graph at least as well as their start.

    "Fits the graph": order agreement plus recall@k against the ranked lists themselves
    (``knnscal_local.graph_agreement``), never features. The stress optimum is not the best map
    by those measures on every graph, so the iterations must earn their place. A start that wins
    gets its own isotonic disparities back (step 2); the estimator's ``stress_`` and
    ``stress_history_`` still describe the iterations. Up to the solver's ``exact_max_n``
    vertices; a multilevel start's coarser levels are chosen the same way.

    Parameters
    ----------
    estimator : KnnScal
        The settings of the fit (a copy is fitted).
    keep_iterations : {"validated", "always"}, default "validated"
        "validated": the choice above; "always": the iterations' map (the poster).

    Attributes
    ----------
    estimator_ : KnnScal
        The fitted map.
    iterations_kept_ : bool
        Whether the iterations' map was kept (True where nothing was validated).
    graph_score_ : float
        The kept map's order agreement plus recall@k; NaN where nothing was validated.
    """

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "keep_iterations": [Options(str, {"always", "validated"})],
    }

    def __init__(self, estimator: KnnScal, *, keep_iterations: str = "validated"):
        self.estimator = estimator
        self.keep_iterations = keep_iterations

    def get_params(self) -> dict[str, Any]:
        return {"keep_iterations": self.keep_iterations}

    def map_choice(self) -> MapChoice | None:
        """The choice a fit (or a start's coarser levels) is made with; None: keep the iterations."""
        validate_params(type(self).__name__, self.get_params(), self._parameter_constraints)
        return _IterationsCheck() if self.keep_iterations == "validated" else None

    def fit(self, data) -> ValidatedIterations:
        """Fit a copy of the estimator on a graph or a feature matrix from its geodesic start."""
        return self.fit_from(copy.copy(self.estimator).neighbor_lists(data))

    def fit_from(self, data, start=None, affinities=None) -> ValidatedIterations:
        """Fit a copy of the estimator as ``KnnScal.fit_from`` does, with the choice."""
        choice = self.map_choice()
        self.estimator_ = copy.copy(self.estimator).fit_from(data, start, affinities, choice)
        self.iterations_kept_, self.graph_score_ = (
            (True, float("nan")) if choice is None else _outcome(choice)
        )
        return self

    def to_artifact(self) -> Artifact:
        return self.estimator_.to_artifact()


def _outcome(choice: Any) -> tuple[bool, float]:
    return bool(choice.kept), float(choice.score)


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
    Where that fit is validated (a :class:`ValidatedIterations` estimator, up to
    ``exact_max_n`` vertices) the geodesic start is fitted too and the map that fits the
    lists better is kept in ``estimator_``.

    Parameters
    ----------
    estimator : ValidatedIterations or KnnScal
        The settings of every fit (a copy is fitted per candidate).
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
        self,
        estimator: ValidatedIterations | KnnScal,
        *,
        method: str = "auto",
        n_starts: int = 4,
        rank_decay: float | str = 2.0,
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
        model = served_settings(self.estimator)
        data = model.neighbor_lists(data)
        method = self.resolved_method(model, len(data.vertices))
        self.neighbor_embedding_used_ = method != "none"
        if method == "none":
            self.estimator_ = copy.copy(self.estimator).fit_from(data)
            return self
        started = time.perf_counter()
        start, P = self.best_start(model, data, method)
        self.start_seconds_ = time.perf_counter() - started
        fitted = copy.copy(self.estimator).fit_from(
            data, start, P if method == "exact" else None
        )  # exact KL only
        if np.isfinite(graph_score(fitted)):  # validated: the geodesic start's fit is the other candidate
            geodesic = copy.copy(self.estimator).fit_from(data)
            if graph_score(geodesic) > graph_score(fitted):
                fitted = geodesic
        self.estimator_ = fitted
        return self

    def best_start(self, est: KnnScal, data, method: str) -> tuple[np.ndarray, sparse.csr_matrix]:
        """The neighbour embedding of the graph that fits its lists best, of ``n_starts``, and the affinities."""
        indptr, col, rnk = neighbor_csr(data)
        n = len(data.vertices)
        P = knnscal_local.rank_affinities(indptr, col, rnk, n, self.decay(indptr))
        choice = self.estimator.map_choice() if isinstance(self.estimator, ValidatedIterations) else None
        geodesic = est.initial_configuration(indptr, col, rnk, n, choice=choice)
        geodesic = np.ascontiguousarray(geodesic, dtype=np.float64)
        best, scores = geodesic, []
        for j in range(int(self.n_starts)):
            seed = (int(est.random_state), j)
            start = geodesic if j == 0 else est.initial_configuration(indptr, col, rnk, n, seed, choice)
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


def served_settings(estimator: Any) -> KnnScal:
    """The (unfitted) KnnScal inside a wrapper chain: the settings every fit takes."""
    while not isinstance(estimator, KnnScal):
        estimator = estimator.estimator
    return estimator


class PolishedMap:
    """Step 5: polish the fitted map by descent on a smooth version of the score that validated it
    (``knnscal_polish``), kept only where it fits the graph better.

    Only a validated map (a finite ``graph_score_`` in the chain it wraps) is polished. Each
    round's order agreement, recall@k and nearer half's recall are recorded; a round is kept
    only if it lowers none of them and raises the first two's sum, and then gets the isotonic
    fit of its own distances and is scaled to it, as a kept start is. The polished map is the
    served KnnScal's.

    Parameters
    ----------
    estimator : KnnScalStartSelection, ValidatedIterations or KnnScal
        What is fitted first (a copy).
    rounds : int, default 30
        Rounds of descent on the smooth surrogate (0: no polish).
    sharpness : float, default 30.0
        The surrogate's s (larger is closer to the 0/1 count).

    Attributes
    ----------
    estimator_ : fitted ``estimator``
    polished_ : bool
        Whether a polished round was kept.
    polish_scores_ : ndarray of shape (rounds run, 3)
        Each round's order agreement, recall@k and nearer half's recall.
    graph_score_ : float
        The served map's order agreement plus recall@k (NaN: not validated, not polished).
    """

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "rounds": [Interval(Integral, 0, None)],
        "sharpness": [Interval(Real, 0, None, closed="neither")],
    }

    def __init__(self, estimator: Any, *, rounds: int = 30, sharpness: float = 30.0):
        self.estimator = estimator
        self.rounds = rounds
        self.sharpness = sharpness

    def get_params(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "sharpness": self.sharpness}

    @property
    def best_estimator_(self) -> KnnScal:
        """The served (polished) KnnScal."""
        return served(self.estimator_)

    def fit(self, data) -> PolishedMap:
        """Fit a copy of the estimator, then polish its map where it was validated."""
        validate_params(type(self).__name__, self.get_params(), self._parameter_constraints)
        self.estimator_ = copy.copy(self.estimator).fit(data)
        self.graph_score_, self.polished_ = graph_score(self.estimator_), False
        self.polish_scores_ = np.empty((0, 3))
        if np.isfinite(self.graph_score_) and int(self.rounds) > 0:
            self._polish(self.best_estimator_)
        return self

    def _polish(self, model: KnnScal) -> None:
        X, self.polish_scores_, kept = polish_map(
            model.coordinates_,
            *model.graph_,
            rounds=int(self.rounds),
            sharpness=float(self.sharpness),
            seed=int(model.random_state),
        )
        if X is None:
            model.log("polish: no round raised the score without lowering a measure; the map stays")
            return
        score = float(self.polish_scores_[kept, :2].sum())
        model.log(f"polish: round {kept + 1} kept, score {self.graph_score_:.4f} -> {score:.4f}")
        delta = model.isotonic(
            X, model.disparities_.copy(), perm=knnscal_kernels.row_positions(model.plus_indptr_)
        )
        model.coordinates_ = np.ascontiguousarray(X * model.to_stress_units(X, delta))
        model.disparities_ = delta
        model.rank_disparity_ = model.rank_table(delta)
        self.graph_score_, self.polished_ = score, True

    def to_artifact(self) -> Artifact:
        """The served map's artifact (the pipeline records the polish's settings)."""
        return self.estimator_.to_artifact()
