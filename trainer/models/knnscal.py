"""KNNSCAL: Euclidean embedding of ordinal nearest-neighbour graphs.

Castle & Trosset, "Fast Euclidean Embedding of Ordinal Nearest Neighbor
Graphs" (poster), restated in
``docs/algorithms.md`` section 4.

Problem (poster, "An Optimization Problem")::

    minimise  sigma_a(Delta, X) = 1/2 sum_i sum_j w_ij (delta_ij - d_ij(X))^2
    s.t.      delta_ij <= delta_ik  if r_ij < r_ik   (within each source i)
              sum delta^2 = c                         (against collapse)

with 0/1 weights on the enlarged edge set E+ = E plus about ``5 q`` random
non-edges per source, which get rank q = max rank + 1.

Derivation of the configuration step (the poster's signs are garbled).
Group the directed entries of E+ by unordered pair p = {i, j}; let w_p be the
number of directions present (1 or 2) and b_p the sum of their disparities.
Then sigma_a = 1/2 [eta_delta^2 + sum_p w_p d_p^2 - 2 sum_p b_p d_p]
= 1/2 [eta^2 + tr X'VX - 2 tr X'B(X)X] with V = sum_p w_p A_p and
B(X) = sum_p (b_p / d_p) A_p (the poster's V and B). Its gradient is::

    d sigma_a / d X_i = sum_{e in E+ touching i} (1 - delta_e / d_e) (X_i - X_j)

where e runs over the outgoing entries (i, j) *and* the incoming entries
(j, i), both with the sign (X_i - X_j): the poster's second sum has (X_j - X_i),
which would push a vertex the wrong way along its incoming entries. Using
Cauchy-Schwarz on -d_p and V <= 2 diag(V) (2 diag(V) - V is a signless
Laplacian, so positive semidefinite) gives the diagonal majorization step::

    X_i <- X_i + 1/(2 gamma_i) sum_{e touching i} (delta_e / d_e - 1)(X_i - X_j)   (Jacobi)

with gamma_i = diag(V)_ii = in-degree + out-degree of i in E+. That is
``update="jacobi"``. Moving one vertex at a time with the others fixed, the
exact majorizer of sigma_a in X_i alone has curvature gamma_i instead of
2 gamma_i, so the step is twice as long and still monotone
(``update="gauss-seidel"``, the default: the same O(|E+|) work per sweep but
about twice the progress). Both are checked against finite differences and
for monotone stress in ``tests/test_knnscal.py``.

Disparity step: with X fixed, the minimiser over the monotone cone of each
source is the isotonic regression of its distances on its rank order (PAV);
ties in rank (all non-edges share rank q) are ordered by distance first
(Kruskal's primary approach). Rescaling that fit to sum delta^2 = c is then
the exact minimiser on the normalised cone (for a convex cone, delta . d is
maximised on the sphere by the normalised projection), so step 4b+4c never
increases the stress either and the whole iteration is monotone.

Initial configuration (step 3): graph geodesics of Delta_sym = min(r_ij, r_ji)
over the graph's edges (Isomap-style, uncapped so the global layout
survives), embedded by classical MDS when n <= ``classical_mds_max_n`` and by landmark
MDS (de Silva & Tenenbaum) with ``n_landmarks`` max-min landmarks otherwise:
O(L n k log n) time and O(L n) memory, so it stays sparse at n = 1e6.

Everything per iteration is O(|E+|) = O(n k) memory and O(n k log k) time.

Where this departs from the poster, and why (measured on the digits graph and
on planted 2-D/3-D graphs; ``docs/knnscal.md``):

- non-edges: ``two_hop_fraction`` of them come from the two-hop neighbourhood
  instead of uniformly, and there are ``nonedge_factor * q`` of them (20 q
  rather than 5 q). Uniform non-edges almost never compete with a vertex's
  listed neighbours, so they leave neighbour recall to chance;
- ``rank_gap``: plain isotonic regression lets a source pool its whole list
  to one disparity at no cost, and the fitted maps then put the list on a
  ring in arbitrary order (order agreement fell while the stress fell). A
  minimum gap between consecutive ranks fixes that; with ``rank_gap = 0`` the
  algorithm is the poster's;
- ``edge_weight``: the general weights of sigma_a; 1 (the poster's 0/1) by default;
- ``initial_disparities="isotonic"`` (a solver field): the loop starts from the isotonic fit of
  the start's distances, not from Delta = min(r_ij, q) (poster, step 2),
  which asks the k-th neighbour to sit almost as far as a non-edge and so
  undoes the start's local order before rebuilding it slowly;
- ``local_weight``: from the neighbour-embedding start, step 4a minimises
  sigma_a plus t-SNE's KL on the graph's affinities (L-BFGS, monotone), so
  the iterations fit the order without giving up the neighbours;
- the start selection (``knnscal_selection.KnnScalStartSelection``, the flat
  settings ``neighbor_embedding``, ``neighbor_embedding_starts``, ``neighbor_embedding_rank_decay``) and the
  validated iterations (``knnscal_selection.ValidatedIterations``,
  ``keep_iterations="validated"``): for n up to ``exact_max_n`` the start
  is t-SNE on the graph's rank affinities, and the fit returns whichever of that
  start, its stress refinement and the geodesic start's refinement fits the lists best (order agreement plus
  recall@k against the graph itself). The least-squares stress trades a
  source's nearest neighbours for the order of its farther entries, so on
  clustered graphs its optimum scores below the neighbour embedding;
- ``knnscal_selection.PolishedMap`` (``polish_rounds``): the validated map is then polished by
  descent on a smooth version of that score (``knnscal_polish``) and the polish is kept
  only where it lowers no measure (order agreement, recall@k, the nearer
  half's recall) and raises the sum;
- the solver's ``block_size``: the Gauss-Seidel sweep runs on contiguous vertex blocks in
  parallel with a split majorizer between blocks (still monotone; see
  ``knnscal_kernels.majorize_blocks``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from numbers import Integral, Real
from typing import ClassVar, Protocol

import numpy as np
from scipy import sparse
from scipy.sparse import csgraph

from ordrec.service.indices.models.knnscal import DEFAULT_PLACE_STEPS, place_point
from ordrec.service.storage.artifact import Artifact
from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.data.types import DataError, NeighborLists
from ordrec.trainer.models import knnscal_kernels, knnscal_local
from ordrec.trainer.models.base import Estimator, Interval, Options, Settings, check_finite
from ordrec.trainer.progress import Progress


# ------------------------------------------------------------------ inputs
def knn_lists(
    features: np.ndarray,
    k: int,
    ids: Sequence[str] | None = None,
    labels: np.ndarray | None = None,
    path: str = "",
) -> NeighborLists:
    """The directed exact k-NN lists of a feature matrix (Euclidean; rank 1 nearest, self excluded)."""
    from sklearn.neighbors import NearestNeighbors

    features = np.asarray(features, dtype=np.float64)
    n = features.shape[0]
    if not 1 <= k < n:
        raise ValueError(f"k must be in [1, {n - 1}] for {n} points, got {k}")
    nn = NearestNeighbors(n_neighbors=k + 1).fit(features)
    _, idx = nn.kneighbors(features)
    # Drop each point itself; with duplicate points it need not be in column 0.
    rows = np.empty((n, k), dtype=np.int64)
    for i in range(n):
        others = idx[i][idx[i] != i]
        rows[i] = others[:k]
    source = np.repeat(np.arange(n, dtype=np.int32), k)
    rank = np.tile(np.arange(1, k + 1, dtype=np.int32), n)
    vertices = IdMap([str(i) for i in range(n)] if ids is None else list(ids))
    return NeighborLists(
        vertices,
        source,
        rows.ravel().astype(np.int32),
        rank,
        path=path,
        labels=None if labels is None else np.asarray(labels),
    )


def neighbor_csr(data: NeighborLists) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source-major CSR (indptr, col, rank) of the graph, each row sorted by rank.

    Self-loops are dropped; a repeated (source, neighbour) pair keeps its best rank.
    """
    n = len(data.vertices)
    src = np.asarray(data.source, dtype=np.int64)
    nbr = np.asarray(data.neighbor, dtype=np.int64)
    rnk = np.asarray(data.rank, dtype=np.int64)
    if src.shape != nbr.shape or src.shape != rnk.shape:
        raise DataError(data.path, None, "source, neighbour and rank columns differ in length")
    if src.size == 0:
        raise DataError(data.path, None, "the neighbour graph has no edges")
    if rnk.min() < 1:
        raise DataError(data.path, None, "ranks start at 1 (rank 1 is the nearest neighbour)")
    if min(src.min(), nbr.min()) < 0 or max(src.max(), nbr.max()) >= n:
        raise DataError(data.path, None, "vertex row out of range")
    keep = src != nbr
    src, nbr, rnk = src[keep], nbr[keep], rnk[keep]
    order = np.lexsort((rnk, nbr, src))
    src, nbr, rnk = src[order], nbr[order], rnk[order]
    first = np.ones(src.size, dtype=bool)
    first[1:] = (src[1:] != src[:-1]) | (nbr[1:] != nbr[:-1])
    src, nbr, rnk = src[first], nbr[first], rnk[first]
    order = np.lexsort((nbr, rnk, src))
    src, nbr, rnk = src[order], nbr[order], rnk[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr, nbr.astype(np.int32), rnk.astype(np.int32)


def enlarged_edges(
    indptr: np.ndarray,
    col: np.ndarray,
    rnk: np.ndarray,
    n: int,
    nonedge_factor: float,
    seed: int,
    two_hop_fraction: float = 0.0,
):
    """E+ = E plus ``round(nonedge_factor * q)`` random non-edges of rank q per source.

    Returns ``(q, plus_indptr, plus_col, plus_rnk)``.
    """
    q = int(rnk.max()) + 1
    m = int(round(nonedge_factor * q))
    ptr, pc, pr = knnscal_kernels.sample_nonedges(
        indptr, col, rnk, n, m, q, float(two_hop_fraction), np.int64(seed)
    )
    return q, ptr, pc, pr


# ------------------------------------------------------- initial configuration
def symmetric_graph(indptr: np.ndarray, col: np.ndarray, rnk: np.ndarray, n: int) -> sparse.csr_matrix:
    """Undirected graph with edge length Delta_sym = min(r_ij, r_ji) over the graph's edges."""
    src = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    a = np.concatenate([src, col.astype(np.int64)])
    b = np.concatenate([col.astype(np.int64), src])
    w = np.concatenate([rnk, rnk]).astype(np.float64)
    order = np.lexsort((w, b, a))
    a, b, w = a[order], b[order], w[order]
    first = np.ones(a.size, dtype=bool)
    first[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    return sparse.csr_matrix((w[first], (a[first], b[first])), shape=(n, n))


def _fill_disconnected(D: np.ndarray) -> np.ndarray:
    finite = np.isfinite(D)
    if not finite.all():
        big = D[finite].max() if finite.any() else 1.0
        D = np.where(finite, D, 1.5 * big + 1.0)
    return D


def _top_eigen(B: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    vals, vecs = np.linalg.eigh(B)
    order = np.argsort(vals)[::-1][:dim]
    return np.maximum(vals[order], 0.0), vecs[:, order]


def classical_mds(D: np.ndarray, dim: int) -> np.ndarray:
    """Torgerson's classical MDS of a dense distance matrix."""
    D2 = _fill_disconnected(D) ** 2
    D2 = D2 - D2.mean(axis=0)[None, :] - D2.mean(axis=1)[:, None] + D2.mean()
    vals, vecs = _top_eigen(-0.5 * D2, dim)
    return vecs * np.sqrt(vals)[None, :]


def landmark_mds(G: sparse.csr_matrix, dim: int, n_landmarks: int, rng: np.random.Generator) -> np.ndarray:
    """Landmark MDS on graph geodesics: max-min landmarks, O(L) Dijkstra runs, O(L n) memory."""
    n = G.shape[0]
    L = min(n_landmarks, n)
    D = np.empty((L, n), dtype=np.float64)
    nearest = np.full(n, np.inf)
    landmark = int(rng.integers(n))
    chosen = []
    for t in range(L):
        chosen.append(landmark)
        D[t] = csgraph.dijkstra(G, directed=True, indices=landmark)
        nearest = np.minimum(nearest, D[t])
        nearest[chosen] = -1.0
        landmark = int(np.argmax(nearest))  # inf first: reach every component
    D = _fill_disconnected(D)
    D2 = D**2
    DL = D2[:, chosen]
    DL = 0.5 * (DL + DL.T)
    mean = DL.mean(axis=0)
    B = -0.5 * (DL - mean[None, :] - DL.mean(axis=1)[:, None] + DL.mean())
    vals, vecs = _top_eigen(B, dim)
    vals = np.where(vals > 1e-12, vals, np.inf)  # a flat direction gives zero coordinates
    pinv = vecs / np.sqrt(vals)[None, :]  # (L, dim)
    return -0.5 * (D2 - mean[:, None]).T @ pinv


# ------------------------------------------------------------------ solver
@dataclass(frozen=True)
class KnnScalSolver(Settings):
    """How a KNNSCAL fit runs, not the map it aims at: the optimiser's schedule, update rule and
    starting disparities, the sizes where exact methods give way to scalable ones, the parallel
    block size and the memory layout (``docs/knnscal.md``).

    Parameters
    ----------
    sweeps : int, default 5
        Majorization sweeps (or L-BFGS steps with a local term) per iteration (step 4a).
    update : {"gauss-seidel", "jacobi"}, default "gauss-seidel"
        Vertex-at-a-time majorization, or the poster's simultaneous diagonal one (both monotone).
    n_landmarks : int, default 32
        Landmarks of landmark MDS at the start.
    classical_mds_max_n : int, default 500
        The largest n for dense classical MDS at the start (above: landmark MDS).
    multilevel_min_n : int, default 5000
        The multilevel start coarsens graphs of more vertices than this.
    exact_max_n : int, default 5000
        The largest n for the exact neighbour embedding, the validated iterations and the polish
        (wrappers in ``knnscal_selection`` read it).
    block_size : int, default 50000
        Vertices per block of the parallel Gauss-Seidel sweep (one block below it: plain Gauss-Seidel).
    reorder : {"morton", "none"}, default "morton"
        Renumber the vertices along the Z-order curve of the start during the iterations
        (cache locality; the result comes back in the input's order).
    initial_disparities : {"isotonic", "ranks"}, default "isotonic"
        Start the iterations from the isotonic fit of the start's distances, or from the
        poster's Delta = min(r_ij, q) (step 2).
    """

    sweeps: int = 5
    update: str = "gauss-seidel"
    n_landmarks: int = 32
    classical_mds_max_n: int = 500
    multilevel_min_n: int = 5_000
    exact_max_n: int = 5_000
    block_size: int = 50_000
    reorder: str = "morton"
    initial_disparities: str = "isotonic"

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "sweeps": [Interval(Integral, 1, None)],
        "update": [Options(str, {"gauss-seidel", "jacobi"})],
        "n_landmarks": [Interval(Integral, 1, None)],
        "classical_mds_max_n": [Interval(Integral, 0, None)],
        "multilevel_min_n": [Interval(Integral, 3, None)],
        "exact_max_n": [Interval(Integral, 0, None)],
        "block_size": [Interval(Integral, 1, None)],
        "reorder": [Options(str, {"morton", "none"})],
        "initial_disparities": [Options(str, {"ranks", "isotonic"})],
    }


@dataclass(frozen=True)
class Iterations:
    """What :func:`stress_iterations` leaves: the map and disparities, each step's stress (and
    local objective), each iteration's wall time, and whether the change fell below ``tol``."""

    X: np.ndarray
    delta: np.ndarray
    history: list[tuple[int, str, float]]
    local_history: list[tuple[int, str, float]]
    seconds: list[float]
    converged: bool


def stress_iterations(
    est: KnnScal, X: np.ndarray, delta: np.ndarray, local: knnscal_local.LocalStress | None
) -> Iterations:
    """Steps 4a-4c from ``(X, delta)`` until the relative change falls below ``est.tol`` or
    ``est.max_iter`` iterations: the algorithm of one fit, on the fit's E+ (``est``'s ``plus_*_``)."""
    history = [(0, "init", est.stress(X, delta))]
    # With a local term: its objective after each step 4a (old delta) and 4b-c (new delta).
    local_history = [] if local is None else [(0, "init", local.value_and_gradient(X, delta)[0])]
    seconds: list[float] = []
    prev = history[0][2] if local is None else local_history[0][2]
    n = X.shape[0]
    with Progress("KNNSCAL", total=int(est.max_iter), enabled=bool(est.verbose)) as bar:
        for it in range(1, int(est.max_iter) + 1):
            t_it = time.perf_counter()
            X = est.configuration_step(X, delta, local)  # 4a
            # One pass over X for the distances; both stresses and the isotonic fit read them sequentially.
            d = knnscal_kernels.entry_distances(X, est.plus_indptr_, est.plus_col_)
            s_major = knnscal_kernels.stress_from_distances(d, *est.entry_weights(), delta)
            check_finite(it, coordinates=X)
            if local is not None:
                local_history.append((it, "step", local.value_and_gradient(X, delta)[0]))
            delta = est.isotonic(X, delta, d)  # 4b, 4c
            s_iso = knnscal_kernels.stress_from_distances(d, *est.entry_weights(), delta)
            del d
            check_finite(it, disparities=delta)
            history += [(it, "majorize", s_major), (it, "isotonic", s_iso)]
            objective = s_iso
            if local is not None:
                objective = local.value_and_gradient(X, delta)[0]
                local_history.append((it, "isotonic", objective))
            seconds.append(time.perf_counter() - t_it)
            est.log(f"n={n:,}: iteration {it} {seconds[-1]:.2f} s, stress {est.normalised_stress(s_iso):.6g}")
            bar.update(1, stress=est.normalised_stress(s_iso))
            # |change|: with rank gaps the disparity step can raise the stress, and a rise is not
            # convergence. With a local term the objective adds the KL, but the change is still
            # measured against the stress.
            reference = prev if local is None else s_iso / est.weight_total_
            if reference <= 0 or abs(prev - objective) / reference < float(est.tol):
                return Iterations(X, delta, history, local_history, seconds, True)
            prev = objective
    return Iterations(X, delta, history, local_history, seconds, False)


class MapChoice(Protocol):
    """A choice between the start and the iterations' map of one fit (a wrapper's, e.g.
    :class:`~ordrec.trainer.models.knnscal_selection.ValidatedIterations`'): whether it applies to
    a fit of n vertices, and the map and disparities to keep, given the start's and the
    iterations' (``X``, ``delta``) with the vertices in ``order`` (None: the input's)."""

    def applies(self, est: KnnScal, n: int) -> bool: ...

    def __call__(
        self, est: KnnScal, start: np.ndarray, X: np.ndarray, delta: np.ndarray, order: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]: ...


# ---------------------------------------------------------------- estimator
class KnnScal(Estimator):
    """KNNSCAL: non-metric MDS of a ranked neighbour graph with asymmetric stress.

    A fit is the start (geodesic MDS, ours) and the stress iterations of Castle & Trosset's
    poster (module docstring). The choices between candidate maps are wrappers in
    :mod:`~ordrec.trainer.models.knnscal_selection` (on by default in ``ordrec-train`` and jobs):
    the iterations kept only where they fit the graph at least as well as their start
    (``ValidatedIterations``), the best of several neighbour-embedding starts
    (``KnnScalStartSelection``) and the polish (``PolishedMap``). Measurements behind the
    defaults are in ``docs/knnscal.md``.

    Parameters
    ----------
    n_components : int, default 2
        Map dimension.
    nonedge_factor : float, default 20.0
        Non-edges sampled per source, as a multiple of q (the poster: 5).
    max_iter : int, default 200
        Outer iterations (4a, 4b, 4c) at most.
    tol : float, default 1e-4
        Stop when an iteration changes the stress by less than this fraction.
    init : {"auto", "multilevel", "cmds", "landmark", "spectral", "random"}, default "auto"
        Initial configuration from the Delta_sym geodesics; "auto" is "multilevel"
        (classical, then landmark MDS below the solver's size thresholds).
    edge_weight : float, default 1.0
        w_ij on graph edges (non-edges weigh 1).
    rank_gap : float, default 2.0
        Least gap between consecutive ranks' disparities, in units of the source's mean
        edge distance / k_i (0: the plain isotonic regression).
    two_hop_fraction : float, default 1.0
        Share of each source's non-edges drawn from its two-hop neighbourhood.
    n_neighbors : int, default 10
        k of the k-NN lists built when ``fit`` gets a feature matrix.
    local_weight : float, default 0.003
        Weight of t-SNE's KL added to the stress in step 4a when the fit starts from an exact
        neighbour embedding (``fit_from``'s ``affinities``; 0: the plain stress).
    solver : KnnScalSolver, dict or None, default None
        How the fit runs: sweeps per iteration, the update rule and starting disparities,
        landmarks, size thresholds of the exact methods, block size, memory layout;
        None: ``KnnScalSolver()``. A dict gives some of its fields.
    random_state : int, default 0
        Seeds the non-edge sample, the landmarks and the start.
    verbose : bool, default False
        Progress lines on stderr.
    """

    kind = "knnscal"
    input_shape = "neighbors"

    # fitted attributes that methods read before the fit that sets them is visible to mypy
    plus_indptr_: np.ndarray
    plus_col_: np.ndarray
    plus_rnk_: np.ndarray

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "n_components": [Interval(Integral, 1, None)],
        "nonedge_factor": [Interval(Real, 0, None)],
        "max_iter": [Interval(Integral, 0, None)],
        "tol": [Interval(Real, 0, None)],
        "init": [Options(str, {"auto", "cmds", "landmark", "spectral", "random", "multilevel"})],
        "edge_weight": [Interval(Real, 0, None)],
        "rank_gap": [Interval(Real, 0, None)],
        "two_hop_fraction": [Interval(Real, 0, 1)],
        "n_neighbors": [Interval(Integral, 1, None)],
        "local_weight": [Interval(Real, 0, None)],
        "solver": [None, KnnScalSolver, dict],
        "random_state": [Interval(Integral, 0, None)],
        "verbose": ["boolean"],
    }
    nested_settings: ClassVar[dict[str, type[Settings]]] = {"solver": KnnScalSolver}

    def __init__(
        self,
        *,
        n_components: int = 2,
        nonedge_factor: float = 20.0,
        max_iter: int = 200,
        tol: float = 1e-4,
        init: str = "auto",
        edge_weight: float = 1.0,
        rank_gap: float = 2.0,
        two_hop_fraction: float = 1.0,
        n_neighbors: int = 10,
        local_weight: float = 0.003,
        solver: KnnScalSolver | dict | None = None,
        random_state: int = 0,
        verbose: bool = False,
    ):
        self.n_components = n_components
        self.nonedge_factor = nonedge_factor
        self.max_iter = max_iter
        self.tol = tol
        self.init = init
        self.edge_weight = edge_weight
        self.rank_gap = rank_gap
        self.two_hop_fraction = two_hop_fraction
        self.n_neighbors = n_neighbors
        self.local_weight = local_weight
        self.solver = solver
        self.random_state = random_state
        self.verbose = verbose

    def solver_settings(self) -> KnnScalSolver:
        """The ``solver`` parameter as a :class:`KnnScalSolver`."""
        return self.settings("solver")

    # --------------------------------------------------------------- pieces
    def initial_configuration(self, indptr, col, rnk, n: int, seed=None, choice=None) -> np.ndarray:
        """Step 3: a configuration from the Delta_sym geodesics (unscaled).

        ``seed`` (default ``random_state``) draws the landmarks, the random
        start and the jitter; the neighbour embedding's further starts pass their own. A
        multilevel start fits its coarser levels with ``choice`` (:meth:`fit_from`).
        """
        rng = np.random.default_rng(self.random_state if seed is None else seed)
        dim = int(self.n_components)
        method = self.init
        if method == "auto":
            method = "multilevel"
        if method == "random":
            return rng.standard_normal((n, dim))
        solver = self.solver_settings()
        if method == "multilevel" and n <= solver.multilevel_min_n:
            method = "cmds" if n <= solver.classical_mds_max_n else "landmark"
        G = symmetric_graph(indptr, col, rnk, n)
        if method == "multilevel":
            from ordrec.trainer.models.knnscal_multilevel import multilevel_start

            X = multilevel_start(self, G, int(rnk.max()), choice)
        elif method == "spectral":
            # Laplacian eigenmap of the symmetrised graph with affinity 1 / Delta_sym.
            from sklearn.manifold import spectral_embedding

            A = G.copy()
            A.data = 1.0 / A.data
            X = spectral_embedding(A, n_components=dim, random_state=int(self.random_state), drop_first=True)
        elif method == "cmds":
            X = classical_mds(csgraph.dijkstra(G, directed=True), dim)
        else:
            X = landmark_mds(G, dim, solver.n_landmarks, rng)
        # A tiny jitter separates vertices that the geodesics put on one spot
        # (d = 0 has no direction for the majorization step).
        scale = X.std() if X.std() > 0 else 1.0
        return X + 1e-6 * scale * rng.standard_normal(X.shape)

    def geodesic_estimator(self) -> KnnScal:
        """An unfitted copy: the estimator of the multilevel start's coarser levels, fitted from
        the geodesic start (a neighbour embedding would tear the evenly sampled manifolds a
        coarsened graph stands for, and its O(n^2) start would be paid there)."""
        return type(self)(**self.get_params())

    def relabel(self, order: np.ndarray, delta: np.ndarray | None = None):
        """Renumber the vertices of E+ so that new vertex r is old vertex ``order[r]``.

        Rows move with their contents in the same order (so each row stays
        sorted by rank); per-entry ``delta`` follows when given and is returned.
        """
        pos = np.empty(order.shape[0], dtype=np.int64)
        pos[order] = np.arange(order.shape[0])
        self.plus_indptr_, src = knnscal_kernels.permute_rows(self.plus_indptr_, order)
        self.plus_col_ = pos[self.plus_col_[src]].astype(np.int32)
        self.plus_rnk_ = self.plus_rnk_[src]
        return None if delta is None else delta[src]

    def _normalise(self, delta: np.ndarray) -> np.ndarray:
        """Step 4c: sum w delta^2 = sum w (weighted mean squared disparity 1)."""
        norm2 = knnscal_kernels.weighted_square_sum(delta, self.plus_rnk_, self.q_, float(self.edge_weight))
        if norm2 <= 0:
            raise FloatingPointError("all disparities are zero: the configuration collapsed")
        delta *= np.sqrt(self.weight_total_ / norm2)
        return delta

    def log(self, message: str) -> None:
        """One flushed line on stderr when ``verbose``: a long fit shows where its time goes as it runs.

        Each line ends with the process's CPU time so far, steadier than wall time on a shared machine.
        """
        if self.verbose:
            print(f"KNNSCAL {message} [CPU {time.process_time():.1f} s]", file=sys.stderr, flush=True)

    def entry_weights(self) -> tuple[np.ndarray, int, float]:
        """What the stress kernels take for the weights of E+: its ranks, q and the edge weight."""
        return self.plus_rnk_, self.q_, float(self.edge_weight)

    def stress(self, X: np.ndarray, delta: np.ndarray) -> float:
        return knnscal_kernels.stress(X, self.plus_indptr_, self.plus_col_, *self.entry_weights(), delta)

    def _local_term(
        self, order: np.ndarray | None, to_stress_units: float
    ) -> knnscal_local.LocalStress | None:
        """The configuration step's local term (``local_weight`` > 0 after an exact neighbour embedding), or None.

        P follows the vertices into the Morton order; the KL is taken at the
        neighbour embedding's own scale, where that start is its optimum.
        """
        P = self.affinities_
        if P is None or float(self.local_weight) <= 0:
            return None
        if order is not None:
            P = P[order][:, order].tocsr()
        return knnscal_local.LocalStress(
            (self.plus_indptr_, self.plus_col_, *self.entry_weights()),
            P,
            1.0 / to_stress_units,
            float(self.local_weight),
            self.weight_total_,
        )

    def configuration_step(
        self, X: np.ndarray, delta: np.ndarray, local: knnscal_local.LocalStress | None
    ) -> np.ndarray:
        """Step 4a: ``sweeps`` majorization sweeps on sigma_a, or as many L-BFGS steps on it plus the local term."""
        if local is None:
            return self._majorize(X, delta, self.solver_settings().sweeps)
        return local.descend(X, delta, self.solver_settings().sweeps)

    def _majorize(self, X: np.ndarray, delta: np.ndarray, sweeps: int) -> np.ndarray:
        args = (
            self.plus_indptr_,
            self.plus_col_,
            *self.entry_weights(),
            delta,
            self.in_indptr_,
            self.in_src_,
            self.in_entry_,
        )
        if self.solver_settings().update == "jacobi":
            return knnscal_kernels.majorize_jacobi(X, *args, sweeps)
        knnscal_kernels.majorize_blocks(X, *args, sweeps, self._n_blocks(X.shape[0]))
        return X

    def _n_blocks(self, n: int) -> int:
        """Parallel Gauss-Seidel blocks: one per ``block_size`` vertices (fixed by n, not by the threads)."""
        return max(1, -(-n // self.solver_settings().block_size))

    def isotonic(
        self, X: np.ndarray, delta: np.ndarray, d: np.ndarray | None = None, perm: np.ndarray | None = None
    ) -> np.ndarray:
        """Steps 4b-c into ``delta``; ``perm`` (``isotonic_rows``' start order in each row) defaults to the fit's."""
        if d is None:
            d = knnscal_kernels.entry_distances(X, self.plus_indptr_, self.plus_col_)
        knnscal_kernels.isotonic_rows(
            self.plus_indptr_,
            self.plus_rnk_,
            self.q_,
            float(self.edge_weight),
            float(self.rank_gap),
            d,
            delta,
            self.perm_ if perm is None else perm,
        )
        return self._normalise(delta)

    def normalised_stress(self, raw: float) -> float:
        """sum w (delta - d)^2 / sum w delta^2, scale-free (sum w delta^2 = sum w after 4c)."""
        return 2.0 * raw / self.weight_total_

    # ------------------------------------------------------------------ fit
    def fit(self, data, choice: MapChoice | None = None) -> KnnScal:
        """Fit on a :class:`NeighborLists` graph or on a feature matrix (k-NN lists built here):
        the geodesic start, then the stress iterations (``choice``: :meth:`fit_from`)."""
        return self.fit_from(self.neighbor_lists(data), choice=choice)

    def neighbor_lists(self, data) -> NeighborLists:
        """``data`` itself, or the k-NN lists (``n_neighbors``) of a feature matrix; the parameters checked."""
        self._validate_params()
        return data if isinstance(data, NeighborLists) else knn_lists(np.asarray(data), int(self.n_neighbors))

    def fit_from(
        self,
        data: NeighborLists,
        start: np.ndarray | None = None,
        affinities: sparse.csr_matrix | None = None,
        choice: MapChoice | None = None,
    ) -> KnnScal:
        """One fit: the start (``start``, else step 3's geodesic one), then the stress iterations,
        with t-SNE's KL on ``affinities`` in step 4a when given (the local term).

        ``choice`` (a wrapper's, :class:`MapChoice`), where it applies to n vertices, gets the
        start and the iterations' map in the iterations' vertex order and returns the map and
        disparities to keep; a multilevel start's coarser levels are fitted with it too.
        """
        n = len(data.vertices)
        if n < 3:
            raise ValueError(f"KNNSCAL needs at least 3 vertices, got {n}")
        self.vertices_, self.labels_, self.data_fingerprint_ = data.vertices, data.labels, data.fingerprint()
        self.timings_ = {}
        indptr, col, rnk = self.graph_ = neighbor_csr(data)
        self._enlarge(indptr, col, rnk, n)
        t0 = time.perf_counter()
        X = self.initial_configuration(indptr, col, rnk, n, choice=choice) if start is None else start
        X, self.affinities_ = np.ascontiguousarray(X, dtype=np.float64), affinities
        self.timings_["init_s"] = time.perf_counter() - t0
        self.log(f"n={n:,}: start ({self.init}) {self.timings_['init_s']:.1f} s")
        X, order = self._reorder(X, n)
        X, delta, local = self._start_disparities(X, order)
        chosen_by = choice if choice is not None and choice.applies(self, n) else None
        start_map = X.copy() if chosen_by is not None else X  # the iterations move X in place
        t0, cpu0 = time.perf_counter(), time.process_time()  # CPU time: wall time on a shared machine varies
        run = stress_iterations(self, X, delta, local)
        self.timings_["iterations_s"] = time.perf_counter() - t0
        self.timings_["iterations_cpu_s"] = time.process_time() - cpu0
        X, delta = (
            (run.X, run.delta) if chosen_by is None else chosen_by(self, start_map, run.X, run.delta, order)
        )
        del self.in_indptr_, self.in_src_, self.in_entry_, self.perm_, self.affinities_
        self.coordinates_, self.disparities_ = self._input_order(X, delta, order)
        self.n_iter_, self.converged_ = len(run.seconds), run.converged
        self.iteration_seconds_ = np.array(run.seconds)
        self.stress_history_, self.local_history_ = run.history, run.local_history
        self.stress_ = self.normalised_stress(run.history[-1][2])
        self.rank_disparity_ = self.rank_table(self.disparities_)
        return self

    def _enlarge(self, indptr: np.ndarray, col: np.ndarray, rnk: np.ndarray, n: int) -> None:
        """E+ of the graph (``plus_*_``, ``q_``) and the total weight of its entries."""
        t0 = time.perf_counter()
        self.q_, self.plus_indptr_, self.plus_col_, self.plus_rnk_ = enlarged_edges(
            indptr,
            col,
            rnk,
            n,
            float(self.nonedge_factor),
            int(self.random_state),
            float(self.two_hop_fraction),
        )
        n_edges = int(col.shape[0])
        self.weight_total_ = float(self.edge_weight) * n_edges + (self.plus_col_.shape[0] - n_edges)
        self.timings_["edges_s"] = time.perf_counter() - t0
        self.log(f"n={n:,} |E+|={self.plus_col_.shape[0]:,}: edges {self.timings_['edges_s']:.1f} s")

    def _reorder(self, X: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The vertices along the Z-order curve of X (solver ``reorder``), and the in-edge lists."""
        t0 = time.perf_counter()
        order = None
        if self.solver_settings().reorder == "morton":
            order = np.argsort(knnscal_kernels.morton_keys(X), kind="stable")
            X = np.ascontiguousarray(X[order])
            self.relabel(order)
        self.in_indptr_, self.in_src_, self.in_entry_ = knnscal_kernels.incoming(
            self.plus_indptr_, self.plus_col_, n
        )
        self.perm_ = knnscal_kernels.row_positions(self.plus_indptr_)
        self.timings_["reorder_s"] = time.perf_counter() - t0
        self.log(f"n={n:,}: reorder {self.timings_['reorder_s']:.1f} s")
        return X, order

    def _start_disparities(
        self, X: np.ndarray, order: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, knnscal_local.LocalStress | None]:
        """Step 2: the isotonic fit of the start (default) or the poster's Delta = min(r_ij, q),
        normalised; X scaled to them, and the local term at that scale."""
        if self.solver_settings().initial_disparities == "ranks":
            delta = self._normalise(self.plus_rnk_.astype(np.float64))
        else:
            delta = self.isotonic(X, np.empty(self.plus_col_.shape[0]))
        to_stress_units = self.to_stress_units(X, delta)
        X *= to_stress_units
        local = self._local_term(order, to_stress_units)
        check_finite(0, coordinates=X, disparities=delta)
        return X, delta, local

    def _input_order(
        self, X: np.ndarray, delta: np.ndarray, order: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Back to the input's vertex order (vertex ``order[r]`` sits at row r)."""
        if order is None:
            return X, delta
        pos = np.empty(X.shape[0], dtype=np.int64)
        pos[order] = np.arange(X.shape[0])
        return np.ascontiguousarray(X[pos]), self.relabel(pos, delta)

    def to_stress_units(self, X: np.ndarray, delta: np.ndarray) -> float:
        """The factor that scales X to the disparities: argmin_s sum w (delta - s d)^2."""
        d = knnscal_kernels.entry_distances(X, self.plus_indptr_, self.plus_col_)
        w = np.where(self.plus_rnk_ < self.q_, float(self.edge_weight), 1.0)
        return float(np.sum(w * delta * d)) / max(float(np.sum(w * d * d)), 1e-300)

    def rank_table(self, delta: np.ndarray) -> np.ndarray:
        """Mean fitted disparity per rank 1..q (q = non-edges): placement's targets."""
        counts = np.bincount(self.plus_rnk_, minlength=self.q_ + 1).astype(np.float64)
        sums = np.bincount(self.plus_rnk_, weights=delta, minlength=self.q_ + 1)
        table = np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)
        # A rank nobody used keeps the next smaller rank's disparity (monotone table).
        table[1:] = np.maximum.accumulate(np.where(counts[1:] > 0, table[1:], 0.0))
        return table

    # -------------------------------------------------------------- outputs
    def place(self, ranked_neighbors: Sequence, steps: int = DEFAULT_PLACE_STEPS) -> np.ndarray:
        """Coordinates for a new vertex from its ranked neighbours (external ids or rows), nearest first.

        The same function as the service's ``Place`` (:func:`service.indices.models.knnscal.place_point`).
        """
        items = list(ranked_neighbors)
        if items and isinstance(items[0], str):
            rows = self.vertices_.rows(items)
            if (rows < 0).any():
                unknown = [x for x, r in zip(items, rows) if r < 0]
                raise KeyError(f"unknown vertex id(s): {unknown[:5]}")
        else:
            rows = np.asarray(items, dtype=np.int64)
        return place_point(self.coordinates_, rows, self.rank_disparity_, steps)

    def to_artifact(self) -> Artifact:
        arrays = {
            "coordinates": np.ascontiguousarray(self.coordinates_, dtype=np.float64),
            "rank_disparity": self.rank_disparity_.astype(np.float64),
        }
        if self.labels_ is not None:
            labels = np.asarray(self.labels_)
            if labels.dtype.kind in "iub":
                arrays["labels"] = labels.astype(np.int64)
        return Artifact(
            kind=self.kind,
            arrays=arrays,
            ids={"objects": self.vertices_},
            hyperparameters=dict(self.get_params(), solver=asdict(self.solver_settings())),
            metrics={"stress": float(self.stress_), "n_iter": float(self.n_iter_)},
            attributes={
                "q": int(self.q_),
                "n_entries": int(self.plus_col_.shape[0]),
                "converged": bool(self.converged_),
            },
            data_fingerprint=self.data_fingerprint_,
        )
