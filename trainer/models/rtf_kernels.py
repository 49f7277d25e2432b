"""Numba kernels of RTF (Rendle et al., KDD 2009): the per-post fast gradient.

Notation follows ``docs/algorithms.md`` section 2. A post ``p = (u, i)`` has
positive tags ``T+`` (its tags) and negative tags ``T-`` (every other tag).
The model is the Tucker decomposition (paper Eq. 3-4)::

    y(u, i, t) = sum_{a,b,c} C[a,b,c] U[u,a] I[i,b] T[t,c]

and the objective maximised (paper Eq. 8, with the logistic smoothing of
Section 4.2.3) is::

    J = sum_p [ AUC_p - gamma_C |C|^2 - gamma (|U[u_p]|^2 + |I[i_p]|^2) - gamma_T |T|^2 ]
    AUC_p = z_p sum_{t+ in T+} sum_{t- in T-} s(y(u,i,t+) - y(u,i,t-)),
    z_p = 1 / (|T+| |T-|)

The paper has one ``gamma`` for all three factor matrices; ``gamma_T`` is
kept separate because every post touches (and so shrinks) every tag row,
while a user's or item's row is shrunk only at its own posts; with
``gamma_T = gamma`` this is the paper's objective.
The L2 terms are written per post because stochastic gradient ascent applies
them at every post to the parameters that post touches (paper Fig. 5); this
is the doc's objective with each row's penalty weighted by how often the row
occurs. ``objective`` and ``gradient`` below are that exact ``J`` and its
exact gradient, so a finite-difference test of the whole objective checks
the very helper (``_post_terms``) that ``sgd_epoch`` trains with.

Per post the cost is O(|T+| |T| + |T| kT + kU kI kT) (Section 4.4.2): the
pair weights ``w`` are only ever needed as row sums, so ``v`` and the tag
gradients never loop over pairs times kT.

All kernels take arrays and scalars and return arrays; they are generic in
the float type (float64 for gradient tests, float32 for fast training).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "arcp"})
def _sigmoid(x):
    if x >= 0.0:
        return 1.0 / (1.0 + np.exp(-x))
    e = np.exp(x)
    return e / (1.0 + e)


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "arcp"})
def _core_times_user_item(C, u_vec, i_vec, M, q):
    """``M = C x1 u`` (kI x kT) and ``q = M^T i = C x1 u x2 i`` (kT); O(kU kI kT)."""
    kU, kI, kT = C.shape
    M[:, :] = 0.0
    for a in range(kU):
        ua = u_vec[a]
        for b in range(kI):
            for c in range(kT):
                M[b, c] += ua * C[a, b, c]
    q[:] = 0.0
    for b in range(kI):
        ib = i_vec[b]
        for c in range(kT):
            q[c] += ib * M[b, c]


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "arcp"})
def _post_terms(C, U, I, T, u, i, pos, is_pos, M, q, y, wsum, v):
    """Everything one post's gradient needs, from the current parameters.

    Fills ``q`` (kT), ``y`` (|T| scores), ``wsum`` (per tag: sum of the pair
    weights ``w(t+, t-) = s(d)(1 - s(d))``, over its partners: for a positive
    tag the sum over all negatives, for a negative the sum over all positives)
    and ``v = sum_{t+,t-} w (T[t+] - T[t-])`` (kT). ``is_pos`` must be True
    exactly at the tags in ``pos`` and is left that way.

    Returns ``(z, smoothed_auc, correct_pairs, n_pairs)``; ``smoothed_auc`` is
    the post's ``AUC_p`` term and ``correct_pairs`` counts ``y+ > y-`` (ties
    count one half) for the training AUC the progress bar shows.
    """
    n_tags, kT = T.shape
    _core_times_user_item(C, U[u], I[i], M, q)
    for t in range(n_tags):
        acc = 0.0
        for c in range(kT):
            acc += T[t, c] * q[c]
        y[t] = acc
    wsum[:] = 0.0
    n_pos = pos.shape[0]
    n_neg = n_tags - n_pos
    smooth = 0.0
    correct = 0.0
    for p_idx in range(n_pos):
        tp = pos[p_idx]
        yp = y[tp]
        acc_w = 0.0
        for t in range(n_tags):
            if is_pos[t]:
                continue
            d = yp - y[t]
            s = _sigmoid(d)
            w = s * (1.0 - s)
            smooth += s
            acc_w += w
            wsum[t] += w
            if d > 0.0:
                correct += 1.0
            elif d == 0.0:
                correct += 0.5
        wsum[tp] = acc_w
    n_pairs = n_pos * n_neg
    z = 1.0 / n_pairs if n_pairs > 0 else 0.0
    # v = sum_{t+} wsum[t+] T[t+] - sum_{t-} wsum[t-] T[t-]: O(|T| kT), not O(|T+||T-| kT)
    v[:] = 0.0
    for t in range(n_tags):
        sign_w = wsum[t] if is_pos[t] else -wsum[t]
        if sign_w != 0.0:
            for c in range(kT):
                v[c] += sign_w * T[t, c]
    return z, z * smooth, correct, n_pairs


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "arcp"})
def _core_dot_v(C, v, r):
    """``r[a, b] = sum_c C[a,b,c] v[c]``; O(kU kI kT)."""
    kU, kI, kT = C.shape
    for a in range(kU):
        for b in range(kI):
            acc = 0.0
            for c in range(kT):
                acc += C[a, b, c] * v[c]
            r[a, b] = acc


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "arcp"})
def _post_workspace(C, n_tags):
    """Scratch arrays ``_post_terms`` fills for one post, allocated once per
    call and reused for every post: ``M (kI, kT), q, y, wsum, v, is_pos``."""
    kU, kI, kT = C.shape
    return (
        np.empty((kI, kT), dtype=C.dtype),
        np.empty(kT, dtype=C.dtype),
        np.empty(n_tags, dtype=C.dtype),
        np.empty(n_tags, dtype=C.dtype),
        np.empty(kT, dtype=C.dtype),
        np.zeros(n_tags, dtype=np.bool_),
    )


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "arcp"})
def sgd_epoch(C, U, I, T, post_user, post_item, tag_indptr, tags, order, lr, reg, reg_core, reg_tags):
    """One pass of stochastic gradient ascent over the posts in ``order``.

    Updates ``C, U, I, T`` in place (paper Fig. 5) and returns
    ``(mean smoothed AUC, exact training AUC)`` measured on each post just
    before its update. Each step moves every parameter the post touches by
    ``lr * (dAUC_p/dtheta - 2 gamma theta)``, all gradients taken at the
    parameters before the step.
    """
    kU, kI, kT = C.shape
    n_tags = T.shape[0]
    dt = C.dtype.type
    M, q, y, wsum, v, is_pos = _post_workspace(C, n_tags)
    r = np.empty((kU, kI), dtype=C.dtype)
    gU = np.empty(kU, dtype=C.dtype)
    gI = np.empty(kI, dtype=C.dtype)
    smooth_total = 0.0
    correct_total = 0.0
    pairs_total = 0.0
    decay_core = dt(1.0 - 2.0 * lr * reg_core)
    decay = dt(1.0 - 2.0 * lr * reg)
    decay_tags = dt(1.0 - 2.0 * lr * reg_tags)
    for k in range(order.shape[0]):
        p = order[k]
        u = post_user[p]
        i = post_item[p]
        pos = tags[tag_indptr[p] : tag_indptr[p + 1]]
        for t in pos:
            is_pos[t] = True
        z, smooth, correct, n_pairs = _post_terms(C, U, I, T, u, i, pos, is_pos, M, q, y, wsum, v)
        smooth_total += smooth
        if n_pairs > 0:
            correct_total += correct / n_pairs
            pairs_total += 1.0
        # dU[a] = z sum_b r[a,b] I[i,b], dI[b] = z sum_a U[u,a] r[a,b], r = C . v (old C)
        _core_dot_v(C, v, r)
        for a in range(kU):
            acc = 0.0
            for b in range(kI):
                acc += r[a, b] * I[i, b]
            gU[a] = z * acc
        for b in range(kI):
            acc = 0.0
            for a in range(kU):
                acc += U[u, a] * r[a, b]
            gI[b] = z * acc
        # C += lr (z U[u] (x) I[i] (x) v - 2 gamma_C C), one fused pass
        for a in range(kU):
            for b in range(kI):
                coef = dt(lr * z * U[u, a] * I[i, b])
                for c in range(kT):
                    C[a, b, c] = decay_core * C[a, b, c] + coef * v[c]
        for a in range(kU):
            U[u, a] = decay * U[u, a] + dt(lr) * gU[a]
        for b in range(kI):
            I[i, b] = decay * I[i, b] + dt(lr) * gI[b]
        # dT[t+] = +z q wsum[t+], dT[t-] = -z q wsum[t-]; every tag is in one of the two
        for t in range(n_tags):
            coef = dt(lr * z * (wsum[t] if is_pos[t] else -wsum[t]))
            for c in range(kT):
                T[t, c] = decay_tags * T[t, c] + coef * q[c]
        for t in pos:
            is_pos[t] = False
    n = max(order.shape[0], 1)
    return smooth_total / n, correct_total / max(pairs_total, 1.0)


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "arcp"})
def objective(C, U, I, T, post_user, post_item, tag_indptr, tags, reg, reg_core, reg_tags):
    """The objective ``J`` of the module docstring (summed over all posts)."""
    n_tags = T.shape[0]
    M, q, y, wsum, v, is_pos = _post_workspace(C, n_tags)
    total = 0.0
    core_sq = np.sum(C * C)
    tag_sq = np.sum(T * T)
    for p in range(post_user.shape[0]):
        u = post_user[p]
        i = post_item[p]
        pos = tags[tag_indptr[p] : tag_indptr[p + 1]]
        for t in pos:
            is_pos[t] = True
        z, smooth, correct, n_pairs = _post_terms(C, U, I, T, u, i, pos, is_pos, M, q, y, wsum, v)
        for t in pos:
            is_pos[t] = False
        total += smooth - reg_core * core_sq
        total -= reg * (np.sum(U[u] * U[u]) + np.sum(I[i] * I[i])) + reg_tags * tag_sq
    return total


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "arcp"})
def gradient(C, U, I, T, post_user, post_item, tag_indptr, tags, reg, reg_core, reg_tags):
    """The exact gradient of ``objective`` w.r.t. ``(C, U, I, T)``, summed over posts."""
    kU, kI, kT = C.shape
    n_tags = T.shape[0]
    gC = np.zeros_like(C)
    gU = np.zeros_like(U)
    gI = np.zeros_like(I)
    gT = np.zeros_like(T)
    M, q, y, wsum, v, is_pos = _post_workspace(C, n_tags)
    r = np.empty((kU, kI), dtype=C.dtype)
    for p in range(post_user.shape[0]):
        u = post_user[p]
        i = post_item[p]
        pos = tags[tag_indptr[p] : tag_indptr[p + 1]]
        for t in pos:
            is_pos[t] = True
        z, smooth, correct, n_pairs = _post_terms(C, U, I, T, u, i, pos, is_pos, M, q, y, wsum, v)
        _core_dot_v(C, v, r)
        for a in range(kU):
            for b in range(kI):
                gU[u, a] += z * r[a, b] * I[i, b]
                gI[i, b] += z * U[u, a] * r[a, b]
                for c in range(kT):
                    gC[a, b, c] += z * U[u, a] * I[i, b] * v[c]
        for t in range(n_tags):
            sign_w = wsum[t] if is_pos[t] else -wsum[t]
            for c in range(kT):
                gT[t, c] += z * sign_w * q[c]
        for t in pos:
            is_pos[t] = False
        gC -= 2.0 * reg_core * C
        gU[u] -= 2.0 * reg * U[u]
        gI[i] -= 2.0 * reg * I[i]
        gT -= 2.0 * reg_tags * T
    return gC, gU, gI, gT


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "arcp"})
def naive_tag_scores(C, u_vec, i_vec, T):
    """``y(u, i, t)`` for every tag by the full sum of Eq. 4, O(|T| kU kI kT).

    The reference the fast path is checked and benchmarked against.
    """
    kU, kI, kT = C.shape
    out = np.empty(T.shape[0], dtype=C.dtype)
    for t in range(T.shape[0]):
        acc = 0.0
        for a in range(kU):
            for b in range(kI):
                for c in range(kT):
                    acc += C[a, b, c] * u_vec[a] * i_vec[b] * T[t, c]
        out[t] = acc
    return out
