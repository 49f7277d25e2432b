"""A neighbour-embedding start for KNNSCAL, computed from the ranked graph alone.

t-SNE (van der Maaten & Hinton 2008) on the neighbour graph instead of the
features: affinities come from the ranks, map similarities are Student-t,
and the objective is KL(P || Q). Two solvers:

- ``exact``: the full O(n^2) gradient per iteration, gradient descent with
  momentum, gains and early exaggeration as in t-SNE (small n only);
- ``sampled``: the same attraction on the graph's edges and a repulsion
  estimated from uniformly sampled non-edges (negative sampling, as UMAP and
  NCVis do), O(|E|) per epoch, for any n.

Everything here is the graph's: the ranks r_ij and the lists, never features.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from scipy import sparse

_EPS = 1e-12


# ------------------------------------------------------------------ affinities
def rank_affinities(
    indptr: np.ndarray, col: np.ndarray, rnk: np.ndarray, n: int, decay: float
) -> sparse.csr_matrix:
    """Symmetric P from the ranked lists: p_ij = (p_j|i + p_i|j) / 2n, summing to 1.

    p_j|i is proportional to exp(-decay (r_ij - 1) / k_i) over i's k_i listed
    neighbours (decay 0: uniform over the list, t-SNE's kNN affinities with a
    uniform kernel); a positive decay keeps the list's order in the weights.
    """
    deg = np.diff(indptr)
    src = np.repeat(np.arange(n, dtype=np.int64), deg)
    k_i = np.maximum(deg[src], 1).astype(np.float64)
    w = np.exp(-float(decay) * (rnk.astype(np.float64) - 1.0) / k_i)
    row_sum = np.bincount(src, weights=w, minlength=n)
    w /= row_sum[src]
    conditional = sparse.csr_matrix((w, (src, col.astype(np.int64))), shape=(n, n))
    P = (conditional + conditional.T).tocsr()
    P.sum_duplicates()
    P.data /= P.data.sum()
    return P


# ------------------------------------------------------------------ exact KL
@njit(cache=True, inline="always")
def _sq_dist(Y, i, j):
    """||y_i - y_j||^2."""
    d2 = 0.0
    for c in range(Y.shape[1]):
        diff = Y[i, c] - Y[j, c]
        d2 += diff * diff
    return d2


@njit(cache=True, parallel=True)
def _repulsion(Y, rep):
    """rep_i = sum_j w_ij^2 (y_i - y_j) with w = 1 / (1 + d^2); returns Z = sum_{i != j} w_ij."""
    n, dim = Y.shape
    z_row = np.zeros(n)
    for i in prange(n):
        z = 0.0
        for c in range(dim):
            rep[i, c] = 0.0
        for j in range(n):
            if j == i:
                continue
            d2 = _sq_dist(Y, i, j)
            w = 1.0 / (1.0 + d2)
            z += w
            for c in range(dim):
                rep[i, c] += w * w * (Y[i, c] - Y[j, c])
        z_row[i] = z
    return _in_order_sum(z_row)


@njit(cache=True)
def _in_order_sum(values):
    """Sum from first to last. Inside a parallel function numba turns ``array.sum()`` into a
    reduction split by thread, whose rounding then depends on the thread count; t-SNE's
    iterations amplify that difference into another map."""
    total = 0.0
    for v in values:
        total += v
    return total


@njit(cache=True, parallel=True)
def kl_gradient_exact(Y, p_indptr, p_col, p_val, exaggeration, grad):
    """t-SNE's gradient 4 sum_j (a p_ij - q_ij) w_ij (y_i - y_j) into ``grad`` (a = exaggeration).

    Returns KL(P || Q) at Y (without exaggeration; P sums to 1): the same
    pass gives Z, so the value costs O(|P|) more, and a line search needs it.
    """
    n, dim = Y.shape
    z = _repulsion(Y, grad)
    kl_row = np.zeros(n)
    for i in prange(n):
        for c in range(dim):
            grad[i, c] = -grad[i, c] / z
        for e in range(p_indptr[i], p_indptr[i + 1]):
            j = p_col[e]
            d2 = _sq_dist(Y, i, j)
            if p_val[e] > 0:
                kl_row[i] += p_val[e] * np.log(p_val[e] * z * (1.0 + d2))
            coef = exaggeration * p_val[e] / (1.0 + d2)
            for c in range(dim):
                grad[i, c] += coef * (Y[i, c] - Y[j, c])
        for c in range(dim):
            grad[i, c] *= 4.0
    return _in_order_sum(kl_row)


@njit(cache=True)
def kl_divergence_exact(Y, p_indptr, p_col, p_val):
    """KL(P || Q) = sum_ij p_ij log(p_ij / q_ij), q_ij = w_ij / sum_{k != l} w_kl."""
    n, dim = Y.shape
    z = 0.0
    for i in range(n):
        for j in range(n):
            if j != i:
                d2 = _sq_dist(Y, i, j)
                z += 1.0 / (1.0 + d2)
    kl = 0.0
    for i in range(n):
        for e in range(p_indptr[i], p_indptr[i + 1]):
            j = p_col[e]
            d2 = _sq_dist(Y, i, j)
            if p_val[e] > 0:
                kl += p_val[e] * np.log(p_val[e] * z * (1.0 + d2))
    return kl


def tsne_exact(
    Y: np.ndarray,
    P: sparse.csr_matrix,
    n_iter: int = 1000,
    exaggeration: float = 12.0,
    exaggeration_iter: int = 250,
) -> np.ndarray:
    """t-SNE's optimiser (momentum 0.5 then 0.8, gains, learning rate max(n / a / 4, 50)) on graph P."""
    n = Y.shape[0]
    Y = np.ascontiguousarray(Y, dtype=np.float64).copy()
    grad = np.zeros_like(Y)
    update = np.zeros_like(Y)
    gains = np.ones_like(Y)
    lr = max(n / exaggeration / 4.0, 50.0)
    p_indptr, p_col, p_val = P.indptr.astype(np.int64), P.indices.astype(np.int64), P.data
    for it in range(int(n_iter)):
        early = it < exaggeration_iter
        kl_gradient_exact(Y, p_indptr, p_col, p_val, exaggeration if early else 1.0, grad)
        momentum = 0.5 if early else 0.8
        # Gains grow while the step keeps its direction, shrink when it reverses.
        keeps = (update * grad) < 0.0
        gains = np.where(keeps, gains + 0.2, gains * 0.8)
        np.maximum(gains, 0.01, out=gains)
        update = momentum * update - lr * gains * grad
        Y += update
    return Y - Y.mean(axis=0)


# ------------------------------------------------------------- local term
class LocalStress:
    """The configuration step's objective with a local term: sigma_a(X) / W + weight * KL(P || Q(scale X)).

    sigma_a alone trades a source's nearest neighbours for the order of its
    farther entries; t-SNE's KL on the graph's affinities (attraction along
    the edges, repulsion from every vertex) holds the neighbours. ``scale``
    maps the stress's units back to the neighbour embedding's, so at the
    start the KL term sits at the embedding's own optimum. W = sum w makes
    sigma_a / W a per-entry quantity, so ``weight`` does not grow with |E+|.
    The KL is exact, O(n^2) per evaluation: for the small-n path only.

    Parameters
    ----------
    stress_args : tuple
        (indptr, col, rnk, q, edge_weight) of E+, as the stress kernels take them.
    P : scipy.sparse.csr_matrix
        Symmetric affinities summing to 1, in the same vertex order as E+.
    scale : float
        Factor from the stress's units to the neighbour embedding's.
    weight : float
        The KL's weight.
    total : float
        W = sum w over E+.
    """

    def __init__(self, stress_args: tuple, P: sparse.csr_matrix, scale: float, weight: float, total: float):
        self.indptr, self.col, self.rnk, self.q, self.edge_weight = stress_args
        self.p = (P.indptr.astype(np.int64), P.indices.astype(np.int64), P.data.astype(np.float64))
        self.scale, self.weight, self.total = float(scale), float(weight), float(total)

    def value_and_gradient(self, X: np.ndarray, delta: np.ndarray) -> tuple[float, np.ndarray]:
        """The objective and its gradient with respect to X (disparities ``delta`` fixed)."""
        from ordrec.trainer.models import knnscal_kernels

        args = (self.indptr, self.col, self.rnk, self.q, self.edge_weight, delta)
        value = knnscal_kernels.stress(X, *args) / self.total
        grad = knnscal_kernels.stress_gradient(X, *args) / self.total
        kl_grad = np.empty_like(X)
        kl = kl_gradient_exact(np.ascontiguousarray(self.scale * X), *self.p, 1.0, kl_grad)
        return value + self.weight * kl, grad + (self.weight * self.scale) * kl_grad

    def descend(self, X: np.ndarray, delta: np.ndarray, steps: int) -> np.ndarray:
        """``steps`` L-BFGS iterations on X with ``delta`` fixed; never returns a worse X.

        Every accepted step satisfies the line search's sufficient-decrease
        (Armijo) condition, so the objective does not rise; the final check
        only guards against a line search that stops without a step.
        """
        from scipy.optimize import minimize

        shape = X.shape

        def fun(flat):
            value, grad = self.value_and_gradient(flat.reshape(shape), delta)
            return value, grad.ravel()

        start = fun(X.ravel())[0]
        result = minimize(fun, X.ravel(), jac=True, method="L-BFGS-B", options={"maxiter": int(steps)})
        if not result.fun <= start:
            return X
        return np.ascontiguousarray(result.x.reshape(shape))


# ------------------------------------------------------------- sampled (O(|E|))
@njit(cache=True)
def _sgd_epochs(Y, heads, tails, weights, n_epochs, negatives, exaggeration, exaggeration_epochs, seed):
    """UMAP-style SGD with the Cauchy kernel: edges sampled in proportion to p_ij,
    ``negatives`` uniform non-edges per attraction; the learning rate falls linearly to 0."""
    np.random.seed(seed)
    n, dim = Y.shape
    m = heads.shape[0]
    w_max = weights.max()
    period = w_max / weights  # an edge of weight p is used every w_max / p epochs
    next_use = period.copy()
    for epoch in range(n_epochs):
        alpha = 1.0 - epoch / n_epochs
        strength = exaggeration if epoch < exaggeration_epochs else 1.0
        for e in range(m):
            if next_use[e] > epoch + 1:
                continue
            next_use[e] += period[e]
            i = heads[e]
            j = tails[e]
            d2 = _sq_dist(Y, i, j)
            coef = -2.0 * strength / (1.0 + d2)
            for c in range(dim):
                g = min(4.0, max(-4.0, coef * (Y[i, c] - Y[j, c])))
                Y[i, c] += alpha * g
                Y[j, c] -= alpha * g
            for _ in range(negatives):
                k = np.random.randint(0, n)
                if k == i:
                    continue
                d2 = _sq_dist(Y, i, k)
                coef = 2.0 / ((0.001 + d2) * (1.0 + d2))
                for c in range(dim):
                    g = min(4.0, max(-4.0, coef * (Y[i, c] - Y[k, c])))
                    Y[i, c] += alpha * g


def neighbor_embedding_sampled(
    Y: np.ndarray,
    P: sparse.csr_matrix,
    n_epochs: int = 500,
    negatives: int = 5,
    exaggeration: float = 1.0,
    exaggeration_epochs: int = 0,
    seed: int = 0,
) -> np.ndarray:
    """Negative-sampling neighbour embedding of graph P: O(|E| (1 + negatives)) per epoch."""
    coo = sparse.triu(P, k=1).tocoo()
    Y = np.ascontiguousarray(Y, dtype=np.float64).copy()
    _sgd_epochs(
        Y,
        coo.row.astype(np.int64),
        coo.col.astype(np.int64),
        coo.data.astype(np.float64),
        int(n_epochs),
        int(negatives),
        float(exaggeration),
        int(exaggeration_epochs),
        np.int64(seed),
    )
    return Y - Y.mean(axis=0)


# ------------------------------------------------------- graph-only validation
def graph_agreement(
    X: np.ndarray, indptr: np.ndarray, col: np.ndarray, rnk: np.ndarray
) -> tuple[float, float]:
    """(order agreement, recall@k) of map X against the graph itself; no features.

    Order agreement: over pairs of a source's list with r_ij < r_ik, the share
    with d_ij < d_ik. Recall@k: the share of each source's k_i listed
    neighbours among its k_i nearest on the map (k-d tree; O(n k log n)).
    """
    order, recall, _ = graph_measures(X, indptr, col, rnk)
    return order, recall


def graph_measures(X: np.ndarray, indptr: np.ndarray, col: np.ndarray, rnk: np.ndarray) -> np.ndarray:
    """Order agreement, recall@k and the nearer half's recall of map X against the graph.

    The nearer half's recall: the share of each source's first ceil(k_i / 2)
    listed neighbours among its ceil(k_i / 2) nearest on the map (rows are
    sorted by rank), so a map cannot trade a source's nearest neighbours for
    its farther ones unseen.
    """
    from scipy.spatial import cKDTree

    from ordrec.trainer.models.knnscal_kernels import order_counts

    q = int(rnk.max()) + 1
    agree, pairs = order_counts(X, indptr, col, rnk, q)
    k = int(np.diff(indptr).max())
    _, near = cKDTree(X).query(X, k=min(k + 1, X.shape[0]))
    return np.array(
        [
            agree / max(pairs, 1),
            _listed_share(near, indptr, col, False),
            _listed_share(near, indptr, col, True),
        ]
    )


@njit(cache=True)
def _listed_share(near, indptr, col, nearer_half):
    """Share of listed neighbours among each source's first m_i map neighbours (self skipped).

    m_i = k_i, or with ``nearer_half`` ceil(k_i / 2), counting only the first m_i listed.
    """
    hits = 0
    listed = 0
    for i in range(indptr.shape[0] - 1):
        k_i = indptr[i + 1] - indptr[i]
        m_i = (k_i + 1) // 2 if nearer_half else k_i
        taken = 0
        for t in range(near.shape[1]):
            j = near[i, t]
            if j == i:
                continue
            if taken == m_i:
                break
            taken += 1
            for e in range(indptr[i], indptr[i] + m_i):
                if col[e] == j:
                    hits += 1
                    break
        listed += m_i
    return hits / max(listed, 1)
