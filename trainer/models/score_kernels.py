"""Numba kernels of SCORE (Le & Lauw, IJCAI 2019): one conditional triplet's
log-likelihood gradient and Riemannian SGD epochs that sample triplets on the
fly, either from an attribute table's value groups or from an explicit
triplet list.

Conventions shared by every kernel:

- ``X`` (n_aspect_rows, K+1) and ``Y`` (n_object_rows, K+1) are unit vectors,
  updated in place; ``delta`` (n_aspect_rows,) is clipped to [0, 1].
- A triplet's aspect ``t`` indexes ``aspect_row[t]`` (which row of ``X`` and
  ``delta`` it trains) and ``object_offset[t]`` (added to i, j, k to find rows
  of ``Y``). That one indirection gives the three modes without three kernels:
  multi-map (identity, offset 0), single pooled map (every aspect -> row 0) and
  disjoint maps (own aspect row, own copy of the objects).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _sigmoid(z):
    if z >= 0.0:
        return 1.0 / (1.0 + np.exp(-z))
    e = np.exp(z)
    return e / (1.0 + e)


@njit(cache=True)
def triplet_gradient(x, yi, yj, yk, delta, alpha, gx, gi, gj, gk):
    """Log-likelihood of one triplet <i, j, k>_t and its Euclidean gradients.

    ``l = delta * s(alpha (d_jk - d_ij)) + (1 - delta) * s(alpha (y_i.y_j - y_k.y_j))``
    (Eqs. 3, 5, 6) with ``d_ij = |(I - x x^T)(y_j - y_i)|``. The gradients of
    ``ln l`` are written into ``gx, gi, gj, gk``; for unit ``x`` the one of
    ``x`` is already tangent: ``d|P u| / dx = -(x.u) P u / |P u|``.

    Returns ``(ln l, sigma_t, sigma_g)``; the last two drive the delta update
    of Algorithm 1, line 10.
    """
    dim = x.shape[0]
    xu = 0.0  # x . (y_j - y_i)
    xw = 0.0  # x . (y_j - y_k)
    for m in range(dim):
        xu += x[m] * (yj[m] - yi[m])
        xw += x[m] * (yj[m] - yk[m])
    # a = P u, b = P w: the two difference vectors on t's tangent plane.
    dij2 = 0.0
    djk2 = 0.0
    gij = 0.0
    gkj = 0.0
    for m in range(dim):
        am = (yj[m] - yi[m]) - xu * x[m]
        bm = (yj[m] - yk[m]) - xw * x[m]
        dij2 += am * am
        djk2 += bm * bm
        gij += yi[m] * yj[m]
        gkj += yk[m] * yj[m]
    dij = np.sqrt(dij2)
    djk = np.sqrt(djk2)
    st = _sigmoid(alpha * (djk - dij))  # Eq. 3
    sg = _sigmoid(alpha * (gij - gkj))  # Eq. 5
    lik = delta * st + (1.0 - delta) * sg  # Eq. 6
    # d ln l = (delta dst + (1 - delta) dsg) / l, ds = alpha s (1 - s) dz
    ct = delta * alpha * st * (1.0 - st) / lik
    cg = (1.0 - delta) * alpha * sg * (1.0 - sg) / lik
    # Zero distance has no direction: its gradient is taken as zero.
    inv_ij = 1.0 / dij if dij > 1e-12 else 0.0
    inv_jk = 1.0 / djk if djk > 1e-12 else 0.0
    for m in range(dim):
        ahat = ((yj[m] - yi[m]) - xu * x[m]) * inv_ij
        bhat = ((yj[m] - yk[m]) - xw * x[m]) * inv_jk
        # aspect-specific part: + d_jk - d_ij
        gi[m] = ct * ahat + cg * yj[m]
        gj[m] = ct * (bhat - ahat) + cg * (yi[m] - yk[m])
        gk[m] = -ct * bhat - cg * yj[m]
        gx[m] = ct * (-xw * bhat + xu * ahat)
    return np.log(lik), st, sg


@njit(cache=True)
def _retract_step(z, g, lr, kappa, mu):
    """z <- R_z(lr * Proj_z(g + kappa mu)) (Eqs. 8, 9): project the ascent
    direction onto the tangent space at z, step, renormalise."""
    dim = z.shape[0]
    dot = 0.0
    for m in range(dim):
        g[m] += kappa * mu[m]  # vMF prior: d/dz kappa mu.z
        dot += z[m] * g[m]
    norm = 0.0
    for m in range(dim):
        z[m] += lr * (g[m] - dot * z[m])
        norm += z[m] * z[m]
    norm = np.sqrt(norm)
    for m in range(dim):
        z[m] /= norm


@njit(cache=True)
def sgd_step(X, Y, delta, ar, oi, oj, ok, alpha, lr, kappa, mu, learn_delta, gx, gi, gj, gk):
    """One Algorithm-1 step on the triplet whose rows are resolved already;
    ``learn_delta`` False keeps delta fixed (the disjoint baseline)."""
    x = X[ar]
    yi = Y[oi]
    yj = Y[oj]
    yk = Y[ok]
    ll, st, sg = triplet_gradient(x, yi, yj, yk, delta[ar], alpha, gx, gi, gj, gk)
    _retract_step(x, gx, lr, kappa, mu)
    _retract_step(yi, gi, lr, kappa, mu)
    _retract_step(yj, gj, lr, kappa, mu)
    _retract_step(yk, gk, lr, kappa, mu)
    if learn_delta:
        d = delta[ar] + lr * (st - sg)  # Algorithm 1, line 10, then clip to [0, 1]
        delta[ar] = min(1.0, max(0.0, d))
    return ll


@njit(cache=True)
def _draw_group_triplet(members, aspect_start, group_start, group_end, group_aspect, group_cum):
    """One triplet drawn uniformly from all triplets of an attribute table
    (layout in :func:`group_epoch`): a group in proportion to its triplet
    count, i != j inside it, k among the aspect's other objects."""
    total = group_cum[-1]
    g = np.searchsorted(group_cum, np.random.random() * total, side="right")
    if g >= group_cum.shape[0]:  # a draw that rounded up to the total: last non-empty group
        g = np.searchsorted(group_cum, total, side="left")
    t = group_aspect[g]
    s = group_start[g]
    n_g = group_end[g] - s
    a0 = aspect_start[t]
    n_out = aspect_start[t + 1] - a0 - n_g
    pi = np.random.randint(n_g)
    pj = np.random.randint(n_g - 1)
    if pj >= pi:
        pj += 1
    pk = a0 + np.random.randint(n_out)
    if pk >= s:  # skip over the group's own block
        pk += n_g
    return t, members[s + pi], members[s + pj], members[pk]


@njit(cache=True)
def group_epoch(
    X,
    Y,
    delta,
    aspect_row,
    object_offset,
    members,
    aspect_start,
    group_start,
    group_end,
    group_aspect,
    group_cum,
    n_steps,
    lr0,
    lr1,
    alpha,
    kappa,
    mu,
    learn_delta,
    seed,
):
    """``n_steps`` SGD steps on triplets drawn uniformly from an attribute table.

    ``members`` lists, per aspect, its objects sorted by value group
    (``aspect_start[t]:aspect_start[t+1]``); group g is
    ``members[group_start[g]:group_end[g]]`` of aspect ``group_aspect[g]``.
    ``group_cum`` is the cumulative number of triplets per group,
    ``n_g (n_g - 1) (N_t - n_g)``, so drawing a group in proportion to it and
    then i != j inside and k outside is a uniform draw from all triplets,
    without ever listing them. The learning rate falls linearly from ``lr0`` to
    ``lr1`` over the epoch. Returns the mean log-likelihood of the drawn triplets.
    """
    np.random.seed(seed)
    dim = X.shape[1]
    gx = np.empty(dim)
    gi = np.empty(dim)
    gj = np.empty(dim)
    gk = np.empty(dim)
    acc = 0.0
    for step in range(n_steps):
        lr = lr0 + (lr1 - lr0) * step / n_steps
        t, i, j, k = _draw_group_triplet(
            members, aspect_start, group_start, group_end, group_aspect, group_cum
        )
        off = object_offset[t]
        acc += sgd_step(
            X,
            Y,
            delta,
            aspect_row[t],
            off + i,
            off + j,
            off + k,
            alpha,
            lr,
            kappa,
            mu,
            learn_delta,
            gx,
            gi,
            gj,
            gk,
        )
    return acc / max(n_steps, 1)


@njit(cache=True)
def triplet_epoch(
    X,
    Y,
    delta,
    aspect_row,
    object_offset,
    ta,
    ti,
    tj,
    tk,
    n_steps,
    lr0,
    lr1,
    alpha,
    kappa,
    mu,
    learn_delta,
    seed,
):
    """``n_steps`` SGD steps on triplets drawn uniformly (with replacement)
    from explicit arrays ``(ta, ti, tj, tk)``; otherwise as :func:`group_epoch`."""
    np.random.seed(seed)
    dim = X.shape[1]
    gx = np.empty(dim)
    gi = np.empty(dim)
    gj = np.empty(dim)
    gk = np.empty(dim)
    n = ta.shape[0]
    acc = 0.0
    for step in range(n_steps):
        lr = lr0 + (lr1 - lr0) * step / n_steps
        p = np.random.randint(n)
        t = ta[p]
        off = object_offset[t]
        acc += sgd_step(
            X,
            Y,
            delta,
            aspect_row[t],
            off + ti[p],
            off + tj[p],
            off + tk[p],
            alpha,
            lr,
            kappa,
            mu,
            learn_delta,
            gx,
            gi,
            gj,
            gk,
        )
    return acc / max(n_steps, 1)


@njit(cache=True)
def sample_group_triplets(members, aspect_start, group_start, group_end, group_aspect, group_cum, n, seed):
    """Draw ``n`` triplets exactly as :func:`group_epoch` does, as arrays
    ``(n, 4)`` of (aspect, i, j, k); used to test the sampler."""
    np.random.seed(seed)
    out = np.empty((n, 4), dtype=np.int64)
    for step in range(n):
        t, i, j, k = _draw_group_triplet(
            members, aspect_start, group_start, group_end, group_aspect, group_cum
        )
        out[step, 0] = t
        out[step, 1] = i
        out[step, 2] = j
        out[step, 3] = k
    return out
