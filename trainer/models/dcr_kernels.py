"""Numba kernels of DCR and Pairwise DCR (Hu & Li, WWW 2017).

Arrays and scalars in, arrays (or scalars) out; no Python objects. Factor
tensors are laid out ``(n, L, f)``: ``n`` users or items, ``L = S - 1``
learned levels (level 1 is all ones and needs no model), ``f`` the rank.
Row-major in the entity keeps each user's concatenated factors contiguous,
which is exactly the artifact's ``(n, L * f)`` layout served by one matrix
product.

Step functions (``pointwise_step``, ``pairwise_step``) update their vectors in
place; by default *without* projecting, so a finite-difference test can
compare the step with the objective's gradient. The epoch kernels pass the
radius, and the steps project in the same pass.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ordrec.trainer.data.line_kernels import counting_order, counting_reorder
from ordrec.trainer.data.types import DataError
from ordrec.trainer.models.base import check_finite

# Reassociation lets LLVM vectorise the dot products and norms (sums in a
# different order: rounding differences only). No "nnan"/"ninf": the NaN
# checks must keep working.
FAST = {"reassoc", "contract"}


@njit(cache=True, inline="always")
def projection_scale(norm2, radius, sphere):
    """The factor that projects a vector of squared norm ``norm2``.

    Ball (Eq. 1's bound ``|x| <= radius``): rescale only a vector outside the
    ball, the exact Euclidean projection, which also keeps small vectors
    small. Sphere: rescale every non-zero vector to norm ``radius``, the
    paper's literal ``U <- U / |U|``.
    """
    if norm2 > radius * radius or (sphere and norm2 > 0.0):
        return radius / np.sqrt(norm2)
    return 1.0


@njit(cache=True, fastmath=FAST)
def project(x, start, radius, sphere):
    """Project ``x[start:]`` (ball or sphere, ``projection_scale``) in place; returns its
    squared norm before projecting.

    The training steps project inside their update loop (norms from inner
    products); this is the explicit form the tests compare them with.
    """
    norm2 = 0.0
    for k in range(start, x.shape[0]):
        norm2 += x[k] * x[k]
    scale = projection_scale(norm2, radius, sphere)
    for k in range(start, x.shape[0]):
        x[k] *= scale
    return norm2


@njit(cache=True)
def pointwise_objective(u, v, label, reg):
    """Per-example objective of one level: ``log P(r^t = label) - reg/2 (|u|^2 + |v|^2)``.

    ``P(r^t = 1) = (u.v + 1) / 2`` (Eq. 1); the L2 term is the paper's
    regularisation (lambda in {0.01, 0.001}), spread over the examples.
    """
    dot = 0.0
    nrm = 0.0
    for k in range(u.shape[0]):
        dot += u[k] * v[k]
        nrm += u[k] * u[k] + v[k] * v[k]
    p = 0.5 * (dot + 1.0)
    if label == 0:
        p = 1.0 - p
    return np.log(p) - 0.5 * reg * nrm


@njit(cache=True, fastmath=FAST, inline="always")
def pointwise_step(u, v, label, lr, reg, floor, u_fixed, u_radius=0.0, sphere=False):
    """One stochastic gradient-ascent step on ``pointwise_objective`` (in place).

    The gradient of ``log P`` is ``+-(1/P) v/2`` for ``u`` and ``+-(1/P) u/2``
    for ``v`` (the derivatives under Eq. 1). ``P`` reaches 0 on the boundary of
    the unit ball, so ``1/P`` is capped at ``1/floor``: the step then stays
    finite while still pushing the wrong prediction back. The first
    ``u_fixed`` coordinates of ``u`` stay frozen.

    ``u_radius > 0`` also projects (``projection_scale``) ``u[u_fixed:]`` onto that
    radius and ``v`` onto 1 in the same pass; the default is the bare
    gradient step the tests check. Returns ``P`` of the observed label
    (floored) before the step, and the squared norms after the step, before
    any projection, of ``u[u_fixed:]`` and ``v``.

    Two passes over the vectors. The step is ``u' = c u + b v`` and ``v' = c v
    + b u`` (``c = 1 - lr reg``, ``b = lr g``), so the norms after it follow from
    ``u.v``, ``|u|^2`` and ``|v|^2`` before it (``|u'|^2 = c^2 |u|^2 + 2 c b u.v
    + b^2 |v|^2``): the first pass sums those three, and the second applies
    step and projection together with no running sum: a sum in the update
    loop would make each iteration wait on the previous one's add.
    """
    if u_fixed == 0:
        # A literal start lets LLVM vectorise the loops (one starting at a
        # run-time offset vectorises worse).
        uv_f, uu_f, vv_f = 0.0, 0.0, 0.0
        uv, uu, vv = _inner_products(u, v, 0, u.shape[0])
    else:
        uv_f, uu_f, vv_f = _inner_products(u, v, 0, u_fixed)
        uv, uu, vv = _inner_products(u, v, u_fixed, u.shape[0])
    p = 0.5 * (uv_f + uv + 1.0)
    if label != 0:
        q = max(p, floor)
        g = 0.5 / q
    else:
        q = max(1.0 - p, floor)
        g = -0.5 / q
    c = 1.0 - lr * reg
    b = lr * g
    # Only u's free part is projected; v's norm runs over every coordinate.
    nu = _clamp_zero(c * c * uu + 2.0 * c * b * uv + b * b * vv)
    nv = _clamp_zero(c * c * (vv_f + vv) + 2.0 * c * b * (uv_f + uv) + b * b * (uu_f + uu))
    su = projection_scale(nu, u_radius, sphere) if u_radius > 0.0 else 1.0
    sv = projection_scale(nv, 1.0, sphere) if u_radius > 0.0 else 1.0
    # Coefficients in the factors' own type: float32 factors then update in
    # float32 lanes instead of converting every coordinate to float64 and back.
    real = u.dtype.type
    uc, ub, vc, vb = real(su * c), real(su * b), real(sv * c), real(sv * b)
    if u_fixed == 0:
        _coupled_ascent(u, v, uc, ub, vc, vb, 0)
        return q, nu, nv
    for k in range(u_fixed):  # frozen user coordinates: only v moves
        v[k] = vc * v[k] + vb * u[k]
    _coupled_ascent(u, v, uc, ub, vc, vb, u_fixed)
    return q, nu, nv


@njit(cache=True, fastmath=FAST, inline="always")
def _inner_products(u, v, lo, hi):
    """``u.v``, ``|u|^2`` and ``|v|^2`` over coordinates ``lo:hi``, in the factors' own
    type (float32 factors: 8 lanes per AVX2 register). ``_triple_products`` with the
    third vector ``v``: the compiler folds the repeated sums (same time per step)."""
    uu, uv, _, vv, _, _ = _triple_products(u, v, v, lo, hi)
    return uv, uu, vv


@njit(cache=True, inline="always")
def _clamp_zero(norm2):
    """A squared norm from the expansion can round below 0 for a vector near 0;
    NaN passes through (the epochs detect divergence from it)."""
    return 0.0 if norm2 < 0.0 else norm2


@njit(cache=True, fastmath=FAST, inline="always")
def _coupled_ascent(u, v, uc, ub, vc, vb, start):
    """``u[k], v[k] = uc u[k] + ub v[k], vc v[k] + vb u[k]`` for ``k >= start``,
    both from the old values."""
    for k in range(start, u.shape[0]):
        uk = u[k]
        vk = v[k]
        u[k] = uc * uk + ub * vk
        v[k] = vc * vk + vb * uk


@njit(cache=True)
def log_accumulate(prod, total, q):
    """Sum of ``log q`` as a running product, one ``log`` per underflow guard.

    ``q`` in (0, 1]; the product is folded into ``total`` once it drops below
    1e-150 (so it never underflows for ``q >= 1e-150``), which takes one
    ``log`` per about 50 steps at typical P instead of one per step (a
    ``log`` per step is a noticeable share of an epoch). A ``q`` of 0 gives
    ``-inf`` as ``log`` would.
    """
    prod *= q
    if prod < 1e-150:
        total += np.log(prod)
        prod = 1.0
    return prod, total


@njit(cache=True, parallel=True, fastmath=FAST)
def pointwise_epoch(U, V, user, item, level, order, lr, reg, floor, u_fixed, u_radius, sphere, train_levels):
    """One SGA pass over the ratings for the levels ``train_levels``, levels in parallel.

    ``level[n]`` is the 0-based ordinal index of rating ``n`` (0 = lowest
    value); learned level ``t`` (0-based, i.e. rating threshold ``t + 1``)
    labels rating ``n`` with 1 when ``level[n] >= t + 1``. Levels are
    independent problems (Section 3.3, step 1), so ``prange`` runs them on
    separate threads without locks. ``u_fixed`` leading user coordinates are
    frozen (the item-bias variant); the rest are projected onto the ball of
    ``u_radius`` so that ``|U_u| <= 1`` still holds (``sphere``: rescaled to
    exactly that norm, the paper's literal projection). Levels not in
    ``train_levels`` are left as they are (a level whose epoch count is
    reached is frozen). Returns the summed log-likelihood per level (0 for the
    levels not trained).
    """
    loglik = np.zeros(U.shape[1])
    for w in prange(train_levels.shape[0]):
        t = train_levels[w]
        total = 0.0
        prod = 1.0
        for idx in range(order.shape[0]):
            n = order[idx]
            u = U[user[n], t]
            v = V[item[n], t]
            label = 1 if level[n] >= t + 1 else 0
            q, nu, nv = pointwise_step(u, v, label, lr, reg, floor, u_fixed, u_radius, sphere)
            prod, total = log_accumulate(prod, total, q)
        loglik[t] = total + np.log(prod)
    return loglik


@njit(cache=True)
def shuffle_segments(indptr, items, levels, seed):
    """Shuffle each user's ratings in place (Fisher-Yates inside every CSR segment).

    ``items`` and ``levels`` are permuted together, so a segment keeps its
    ratings but is visited in a fresh random order each epoch while its
    memory stays contiguous.
    """
    np.random.seed(seed)
    for u in range(indptr.shape[0] - 1):
        lo = indptr[u]
        for p in range(indptr[u + 1] - 1, lo, -1):
            q = np.random.randint(lo, p + 1)
            it = items[p]
            items[p] = items[q]
            items[q] = it
            lv = levels[p]
            levels[p] = levels[q]
            levels[q] = lv


@njit(cache=True, parallel=True, fastmath=FAST)
def pointwise_epoch_by_user(
    U, V, indptr, items, levels, user_order, lr, reg, floor, u_fixed, u_radius, sphere, train_levels
):
    """One SGA pass for the levels ``train_levels``, the ratings grouped by user (levels in parallel).

    The same steps as ``pointwise_epoch`` (``pointwise_step``, then the
    projection), in a different order: users in the order ``user_order``, each
    user's ratings (CSR ``indptr, items, levels``, shuffled by
    ``shuffle_segments``) one after the other. ``U[u, t]`` then stays in cache
    for the whole segment instead of being fetched from a random row for
    every rating, which is most of the cost once the factors outgrow the cache
    (48k users x 4 levels x rank 40 is 61 MB). Returns the summed
    log-likelihood per level and the summed squared norms of the updated
    vectors per level (NaN when any factor went NaN: the cheap finiteness
    check); both 0 for the levels not trained.
    """
    loglik = np.zeros(U.shape[1])
    norms = np.zeros(U.shape[1])
    for w in prange(train_levels.shape[0]):
        t = train_levels[w]
        total = 0.0
        prod = 1.0
        nsum = 0.0
        for j in range(user_order.shape[0]):
            row = user_order[j]
            u = U[row, t]
            for p in range(indptr[row], indptr[row + 1]):
                v = V[items[p], t]
                label = 1 if levels[p] >= t + 1 else 0
                q, nu, nv = pointwise_step(u, v, label, lr, reg, floor, u_fixed, u_radius, sphere)
                prod, total = log_accumulate(prod, total, q)
                nsum += nu + nv
        loglik[t] = total + np.log(prod)
        norms[t] = nsum
    return loglik, norms


@njit(cache=True, parallel=True, fastmath=FAST)
def pointwise_loglik(U, V, user, item, level):
    """Log-likelihood per level of the given ratings (P clipped to [1e-12, 1]).

    Levels in parallel, as in the epochs: the validation-stopped fits call
    this after every epoch, and single-threaded it would cost more than the
    epoch itself.
    """
    L = U.shape[1]
    out = np.zeros(L)
    for t in prange(L):
        total = 0.0
        for n in range(user.shape[0]):
            u = U[user[n], t]
            v = V[item[n], t]
            dot = 0.0
            for k in range(u.shape[0]):
                dot += u[k] * v[k]
            p = 0.5 * (dot + 1.0)
            if level[n] < t + 1:
                p = 1.0 - p
            total += np.log(max(p, 1e-12))
        out[t] = total
    return out


@njit(cache=True)
def pairwise_loss(u, vi, vj, c, lam):
    """Pairwise loss of one ordered pair (Eq. 5): ``log(1 + exp(-(SC_ui - SC_uj)))``
    plus ``lam * (|u|^2 + |vi|^2 + |vj|^2)`` over all levels.

    ``u, vi, vj`` are ``(L, f)``; ``c[t]`` the weight of level ``t`` in SC,
    ``(f(t) - f(t-1)) / 2`` (Eq. 4 with Eq. 1), so
    ``SC_ui - SC_uj = sum_t c_t u^t . (v_i^t - v_j^t)``.
    """
    d = 0.0
    nrm = 0.0
    for t in range(u.shape[0]):
        for k in range(u.shape[1]):
            d += c[t] * u[t, k] * (vi[t, k] - vj[t, k])
            nrm += u[t, k] * u[t, k] + vi[t, k] * vi[t, k] + vj[t, k] * vj[t, k]
    # log(1 + e^-d) computed without overflow
    if d > 0:
        loss = np.log1p(np.exp(-d))
    else:
        loss = -d + np.log1p(np.exp(d))
    return loss + lam * nrm


@njit(cache=True, fastmath=FAST)
def pairwise_step(u, vi, vj, c, lr, lam, u_fixed, u_radius=0.0, sphere=False):
    """One gradient-descent step on ``pairwise_loss`` (Eqs. 6-7), in place.

    ``dL/dd = -1 / (1 + e^d)``; ``d(d)/du^t = c_t (v_i^t - v_j^t)``,
    ``d(d)/dv_i^t = c_t u^t = -d(d)/dv_j^t``; the L2 term adds ``2 lam x``.
    The first ``u_fixed`` user coordinates stay frozen. Returns the loss
    before the step.

    ``u_radius > 0`` also projects every level's three vectors in the same
    update (``u`` onto radius ``u_radius``, the items onto 1): the step of
    level ``t`` reads only level ``t``'s old values, so this equals the step
    followed by the projection. The default (no projection) is the bare
    gradient step the tests check.
    """
    d = 0.0
    nrm = 0.0
    # _pair_level_step computes these products again, from L1: keeping them from this
    # pass would need a per-step scratch array for no measurable gain.
    for t in range(u.shape[0]):
        uu, ui, uj, ii, jj, _ = _triple_products(u[t], vi[t], vj[t], 0, u.shape[1])
        d += c[t] * (ui - uj)
        nrm += uu + ii + jj
    if d > 0:
        e = np.exp(-d)
        s = e / (1.0 + e)  # 1 / (1 + e^d)
        loss = np.log1p(e)
    else:
        e = np.exp(d)
        s = 1.0 / (1.0 + e)
        loss = -d + np.log1p(e)
    decay = 1.0 - 2.0 * lr * lam
    for t in range(u.shape[0]):
        _pair_level_step(u[t], vi[t], vj[t], decay, lr * s * c[t], u_fixed, u_radius, sphere)
    return loss + lam * nrm


@njit(cache=True, fastmath=FAST, inline="always")
def _pair_level_step(ut, it, jt, D, S, u_fixed, u_radius, sphere):
    """One level of ``pairwise_step``: ``u' = D u + S (i - j)``, ``i' = D i + S u``,
    ``j' = D j - S u`` (``u'`` only from ``u_fixed`` on), each projected when
    ``u_radius > 0``.

    As in ``pointwise_step``, the norms after the step come from the inner
    products before it, so the update loop carries no running sum.
    """
    uuF, uiF, ujF, iiF, jjF, _ = _triple_products(ut, it, jt, 0, u_fixed)
    uuR, uiR, ujR, iiR, jjR, ijR = _triple_products(ut, it, jt, u_fixed, ut.shape[0])
    uu, ii, jj = uuF + uuR, iiF + iiR, jjF + jjR
    nu = _clamp_zero(D * D * uuR + 2.0 * D * S * (uiR - ujR) + S * S * (iiR - 2.0 * ijR + jjR))
    ni = _clamp_zero(D * D * ii + 2.0 * D * S * (uiF + uiR) + S * S * uu)
    nj = _clamp_zero(D * D * jj - 2.0 * D * S * (ujF + ujR) + S * S * uu)
    su = projection_scale(nu, u_radius, sphere) if u_radius > 0.0 else 1.0
    si = projection_scale(ni, 1.0, sphere) if u_radius > 0.0 else 1.0
    sj = projection_scale(nj, 1.0, sphere) if u_radius > 0.0 else 1.0
    real = ut.dtype.type  # the factors' type: no float64 round trip per coordinate
    uD, uS, iD, iS, jD, jS = (
        real(su * D),
        real(su * S),
        real(si * D),
        real(si * S),
        real(sj * D),
        real(sj * S),
    )
    for k in range(u_fixed):  # frozen user coordinates: the items only
        uk = ut[k]
        it[k] = iD * it[k] + iS * uk
        jt[k] = jD * jt[k] - jS * uk
    if u_fixed == 0:  # a literal start vectorises (see pointwise_step)
        _pair_update(ut, it, jt, uD, uS, iD, iS, jD, jS, 0)
    else:
        _pair_update(ut, it, jt, uD, uS, iD, iS, jD, jS, u_fixed)


@njit(cache=True, fastmath=FAST, inline="always")
def _triple_products(x, y, z, lo, hi):
    """``x.x, x.y, x.z, y.y, z.z, y.z`` over coordinates ``lo:hi``, in the vectors' type."""
    xx = x.dtype.type(0.0)
    xy = x.dtype.type(0.0)
    xz = x.dtype.type(0.0)
    yy = x.dtype.type(0.0)
    zz = x.dtype.type(0.0)
    yz = x.dtype.type(0.0)
    for k in range(lo, hi):
        xx += x[k] * x[k]
        xy += x[k] * y[k]
        xz += x[k] * z[k]
        yy += y[k] * y[k]
        zz += z[k] * z[k]
        yz += y[k] * z[k]
    return xx, xy, xz, yy, zz, yz


@njit(cache=True, fastmath=FAST, inline="always")
def _pair_update(ut, it, jt, uD, uS, iD, iS, jD, jS, start):
    """``u, i, j = uD u + uS (i - j), iD i + iS u, jD j - jS u`` for ``k >= start``, from the old values."""
    for k in range(start, ut.shape[0]):
        uk = ut[k]
        ik = it[k]
        jk = jt[k]
        ut[k] = uD * uk + uS * (ik - jk)
        it[k] = iD * ik + iS * uk
        jt[k] = jD * jk - jS * uk


@njit(cache=True, fastmath=FAST, inline="always")
def _pair_step_from(U, V, items, levels, u, lo, hi, a, c, lr, lam, u_fixed, u_radius, sphere):
    """One pairwise step from rating ``a`` of user ``u`` (ratings ``lo:hi``):
    draw a partner of another level (up to 8 uniform tries), orient the pair
    so the higher rating comes first, step. Returns (loss, 1), or (0.0, 0)
    when no partner was found."""
    b = -1
    for _try in range(8):
        cand = np.random.randint(lo, hi)
        if levels[cand] != levels[a]:
            b = cand
            break
    if b < 0:
        return 0.0, 0
    if levels[a] > levels[b]:
        i = items[a]
        j = items[b]
    else:
        i = items[b]
        j = items[a]
    return pairwise_step(U[u], V[i], V[j], c, lr, lam, u_fixed, u_radius, sphere), 1


@njit(cache=True, fastmath=FAST)
def pairwise_epoch(U, V, indptr, items, levels, c, n_steps, lr, lam, u_fixed, u_radius, sphere, seed):
    """``n_steps`` SGD steps on pairs sampled on the fly (never materialised).

    ``indptr, items, levels`` hold each user's training ratings (CSR). A step
    draws a rating ``(u, i)`` uniformly, then another rating ``(u, j)`` of the
    same user uniformly until the two differ in level (up to 8 draws), and
    orients the pair so the higher rating comes first. Drawing the first
    rating uniformly weights users by their number of ratings, as the sum
    over observed pairs in Eq. 5 does per rating. ``U, V`` are ``(n, L, f)``.
    Returns (mean loss, steps taken).
    """
    np.random.seed(seed)
    n_users = indptr.shape[0] - 1
    nnz = items.shape[0]
    # row -> user, built once per call (O(nnz)); user rows fit int32 (4 bytes per entry, not 8)
    owner = np.empty(nnz, np.int32)
    for u in range(n_users):
        for p in range(indptr[u], indptr[u + 1]):
            owner[p] = u
    total = 0.0
    taken = 0
    for _ in range(n_steps):
        a = np.random.randint(0, nnz)
        u = owner[a]
        lo = indptr[u]
        hi = indptr[u + 1]
        if hi - lo < 2:
            continue
        loss, took = _pair_step_from(U, V, items, levels, u, lo, hi, a, c, lr, lam, u_fixed, u_radius, sphere)
        total += loss
        taken += took
    return total / max(taken, 1), taken


@njit(cache=True, fastmath=FAST)
def pairwise_epoch_by_user(
    U, V, indptr, items, levels, c, user_order, pairs_per_rating, lr, lam, u_fixed, u_radius, sphere, seed
):
    """``pairwise_epoch`` with the pairs grouped by user.

    Users in the order ``user_order``; user ``u`` with ``n_u`` ratings gets
    ``round(pairs_per_rating * n_u)`` draws in a row, each a pair sampled as
    in ``pairwise_epoch`` (a rating, then another of different level, up to
    8 tries). Every user is weighted by its number of ratings as there, but
    exactly instead of in expectation, and ``U_u`` stays in cache for its
    draws instead of being fetched from a random row every step.
    Returns (mean loss, steps taken).
    """
    np.random.seed(seed)
    total = 0.0
    taken = 0
    for idx in range(user_order.shape[0]):
        u = user_order[idx]
        lo = indptr[u]
        hi = indptr[u + 1]
        if hi - lo < 2:
            continue
        draws = int(pairs_per_rating * (hi - lo) + 0.5)
        for _ in range(draws):
            a = np.random.randint(lo, hi)
            loss, took = _pair_step_from(
                U, V, items, levels, u, lo, hi, a, c, lr, lam, u_fixed, u_radius, sphere
            )
            total += loss
            taken += took
    return total / max(taken, 1), taken


@njit(cache=True)
def _rated(sorted_items, lo, hi, item):
    """Whether ``item`` is in the sorted segment ``sorted_items[lo:hi]`` (binary search)."""
    end = hi
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_items[mid] < item:
            lo = mid + 1
        else:
            hi = mid
    return lo < end and sorted_items[lo] == item


@njit(cache=True)
def with_unrated(indptr, sorted_items, levels, want, cdf, seed):
    """Each user's ratings and ``want[u]`` unrated items at level 0.

    The top-N-aware DCR's "not rated" level (``levels`` of the ratings are
    1 and up): user ``u``'s segment
    (``sorted_items[indptr[u]:indptr[u + 1]]``, sorted) is followed by items
    drawn from ``cdf`` (the cumulative sampling distribution over items) that
    the user did not rate, redrawn up to 8 times on a rated one; ``want`` is
    rounded stochastically, so each user gets ``want[u]`` on average (the fit
    asks ``unrated_share`` per rating; a DSGD stratum its block's share of
    that). Returns the new CSR ``(indptr, items, levels)``.
    """
    np.random.seed(seed)
    return join_unrated(indptr, sorted_items, levels, stochastic_counts(want), cdf)


@njit(cache=True)
def with_unrated_into(indptr, sorted_items, levels, want, cdf, seed, out_ptr, out_items, out_levels):
    """:func:`with_unrated` written into buffers the caller allocated once (capacity
    ``indptr[-1] + sum(ceil(want))``); the same draws. Returns the number of entries written."""
    np.random.seed(seed)
    return join_unrated_into(
        indptr, sorted_items, levels, stochastic_counts(want), cdf, out_ptr, out_items, out_levels
    )


@njit(cache=True)
def stochastic_counts(want):
    """``want`` (non-negative) rounded stochastically to integers: up with probability the
    fraction, so each count's mean is ``want``. Draws from numba's seeded stream."""
    counts = np.zeros(want.shape[0], dtype=np.int64)
    for u in range(want.shape[0]):
        counts[u] = int(want[u])
        if np.random.random() < want[u] - int(want[u]):
            counts[u] += 1
    return counts


@njit(cache=True)
def join_unrated(indptr, sorted_items, levels, counts, cdf):
    """The CSR ``indptr, sorted_items, levels`` with ``counts[u]`` items drawn from ``cdf`` that
    user ``u`` did not rate appended to its segment at level 0 (``with_unrated``'s join; draws
    from numba's stream as seeded by the caller). An item of zero weight is never drawn."""
    n_users = indptr.shape[0] - 1
    out_ptr = np.zeros(n_users + 1, dtype=np.int64)
    capacity = indptr[n_users] + counts.sum()
    out_items = np.empty(capacity, dtype=sorted_items.dtype)
    out_levels = np.empty(capacity, dtype=levels.dtype)
    n = join_unrated_into(indptr, sorted_items, levels, counts, cdf, out_ptr, out_items, out_levels)
    return out_ptr, out_items[:n], out_levels[:n]


@njit(cache=True)
def join_unrated_into(indptr, sorted_items, levels, counts, cdf, out_ptr, out_items, out_levels):
    """:func:`join_unrated` into the caller's ``out_ptr`` (users + 1), ``out_items`` and
    ``out_levels`` (at least ``indptr[-1] + counts.sum()`` long); returns the entries written."""
    n_users = indptr.shape[0] - 1
    out_ptr[0] = 0
    p = 0
    for u in range(n_users):
        lo, hi = indptr[u], indptr[u + 1]
        for q in range(lo, hi):
            out_items[p] = sorted_items[q]
            out_levels[p] = levels[q]
            p += 1
        for _ in range(counts[u]):
            for _try in range(8):
                draw = np.searchsorted(cdf, np.random.random() * cdf[-1], side="right")
                draw = min(draw, cdf.shape[0] - 1)
                if not _rated(sorted_items, lo, hi, draw):
                    out_items[p] = draw
                    out_levels[p] = 0
                    p += 1
                    break
        # A draw rejected 8 times leaves the segment short: the next one starts here.
        out_ptr[u + 1] = p
    return p


class UnratedSampler:
    """Each epoch's training CSR for the top-N-aware fits: the ratings joined by a fresh
    unrated draw (:func:`with_unrated`), written into buffers allocated once per fit so an
    epoch's draw never sits beside the last one's (10 bytes per rating at share 1)."""

    def __init__(
        self, indptr: np.ndarray, items: np.ndarray, levels: np.ndarray, want: np.ndarray, cdf: np.ndarray
    ):
        self.indptr, self.items, self.levels, self.want, self.cdf = indptr, items, levels, want, cdf
        capacity = int(indptr[-1]) + int(np.ceil(want).sum())
        self.out_ptr = np.empty(indptr.size, dtype=np.int64)
        self.out_items = np.empty(capacity, dtype=items.dtype)
        self.out_levels = np.empty(capacity, dtype=levels.dtype)

    def draw(self, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The CSR ``(indptr, items, levels)`` of a fresh draw seeded by ``seed`` (views of the
        buffers: the next draw overwrites them)."""
        n = with_unrated_into(
            self.indptr,
            self.items,
            self.levels,
            self.want,
            self.cdf,
            seed,
            self.out_ptr,
            self.out_items,
            self.out_levels,
        )
        return self.out_ptr, self.out_items[:n], self.out_levels[:n]


# ------------------------------------------------------------------ compact training arrays
#: Ratings converted per step by :func:`rating_levels`: its float64 temporaries stay a few MB.
LEVEL_CHUNK = 1 << 20


def level_dtype(n_levels: int) -> np.dtype:
    """The smallest integer type holding level indices ``0..n_levels`` (one spare for "not rated")."""
    return np.dtype(np.int8 if n_levels < 127 else np.int16 if n_levels < 32767 else np.int32)


def distinct_values(rating: np.ndarray) -> np.ndarray:
    """The sorted distinct values of ``rating`` as float64, by chunks of :data:`LEVEL_CHUNK`
    (no rating-sized float64 copy)."""
    rating = np.asarray(rating)
    chunks = (rating[lo : lo + LEVEL_CHUNK] for lo in range(0, rating.size, LEVEL_CHUNK))
    return np.unique(np.concatenate([np.unique(c.astype(np.float64)) for c in chunks] or [np.empty(0)]))


def rating_levels(
    rating: np.ndarray, levels=None, source: str = "", fewest: int = 2
) -> tuple[np.ndarray, np.ndarray]:
    """The ordered rating values and each rating's 0-based level index.

    ``levels=None`` takes the distinct values present (so 0.5..5.0 in steps
    of 0.5 gives ten levels); an explicit list keeps values no rating uses
    (e.g. a scale 1..10 where nobody gave a 1). Ratings must be one of the
    levels (to within 1e-6). The indices come in the smallest integer type
    that holds them (:func:`level_dtype`), computed by chunks of
    :data:`LEVEL_CHUNK` ratings so no rating-sized float64 copy is made.
    """
    rating = np.asarray(rating)
    chunks = [rating[lo : lo + LEVEL_CHUNK] for lo in range(0, rating.size, LEVEL_CHUNK)]
    if levels is None:
        values = distinct_values(rating)
    else:
        if isinstance(levels, str):
            levels = [float(x) for x in levels.split(",") if x.strip()]
        values = np.unique(np.asarray(levels, dtype=np.float64))
    if values.size < fewest:  # one value is enough beside the "not rated" level
        raise DataError(source, None, f"DCR needs at least two distinct rating values, got {values.tolist()}")
    out = np.empty(rating.size, dtype=level_dtype(values.size))
    for lo, chunk in zip(range(0, rating.size, LEVEL_CHUNK), chunks):
        out[lo : lo + chunk.size] = _nearest_level(values, chunk.astype(np.float64), source)
    return values, out


def _nearest_level(values: np.ndarray, rating: np.ndarray, source: str) -> np.ndarray:
    """The index of the level nearest each rating; a rating further than 1e-6 from every level is a DataError."""
    index = np.clip(np.searchsorted(values, rating), 0, values.size - 1)
    below = np.clip(index - 1, 0, values.size - 1)
    closer = np.abs(values[below] - rating) < np.abs(values[index] - rating)
    index = np.where(closer, below, index)
    bad = np.abs(values[index] - rating) > 1e-6
    if np.any(bad):
        raise DataError(source, None, f"rating {rating[bad][0]} is not one of the levels {values.tolist()}")
    return index


def user_csr(n_users: int, user: np.ndarray, *columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """``indptr`` and the columns sorted by (user, first column), ties in input order.

    Integer ids take two stable counting sorts (first column, then user: the
    order of ``np.lexsort``) through one index array of 4 bytes per rating
    below 2**31 ratings; other keys take ``np.lexsort``.
    """
    first = np.asarray(columns[0])
    user = np.asarray(user)
    if first.dtype.kind in "iu" and user.dtype.kind in "iu" and first.size and int(first.min()) >= 0:
        index = np.int32 if user.size < 2**31 else np.int64
        by_first = np.empty(user.size, dtype=index)
        counting_order(first, int(first.max()) + 1, by_first)
        order = np.empty(user.size, dtype=index)
        counting_reorder(user, n_users, by_first, order)
        del by_first
    else:
        order = np.lexsort((first, user))
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(user, minlength=n_users), out=indptr[1:])
    return (indptr,) + tuple(np.ascontiguousarray(col[order]) for col in columns)


#: Factor rows drawn or checked per step: float64 temporaries of a few MB, never factor-sized.
ROW_BLOCK = 1 << 12


def normal_rows(X: np.ndarray, rows: np.ndarray, rng: np.random.Generator, std: float) -> None:
    """``X[rows] = rng.normal(0, std, (rows.size,) + X.shape[1:])`` in blocks of rows: the same
    draws in the same order as one call, without its float64 copy of the factors."""
    for lo in range(0, rows.size, ROW_BLOCK):
        block = rows[lo : lo + ROW_BLOCK]
        X[block] = rng.normal(0.0, std, size=(block.size,) + X.shape[1:])


def check_rows_finite(epoch: int, name: str, X: np.ndarray, rows: np.ndarray) -> None:
    """``check_finite`` of ``X[rows]`` (named ``name``), in blocks of rows: no copy of the factors."""
    for lo in range(0, rows.size, ROW_BLOCK):
        check_finite(epoch, **{name: X[rows[lo : lo + ROW_BLOCK]]})


def held_out_rows(
    user: np.ndarray, n_users: int, rng: np.random.Generator, fraction: float, minimum: int
) -> tuple[np.ndarray, np.ndarray]:
    """Row indices ``(kept, held out)`` (ascending) of a hold-out of ``max(minimum, fraction * n_u)``
    random ratings of each user, int32 below 2**31 ratings.

    The ratings a user holds out are its first by one uniform key per rating (``rng.random``,
    ties in row order): the draws and the choice of ``np.lexsort((keys, user))``, reached
    through a counting sort by user (an int32 order) and a sort of each user's keys, so the
    working set is the keys (8 bytes per rating), the order (4), one flag (1) and the rows (4).
    """
    counts = np.bincount(user, minlength=n_users)
    held = np.maximum(minimum, np.floor(fraction * counts)).astype(np.int64)
    keys = rng.random(user.size)
    index = np.int32 if user.size < 2**31 else np.int64
    order = np.empty(user.size, dtype=index)
    counting_order(user, n_users, order)
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    is_held = np.zeros(user.size, dtype=np.bool_)
    _mark_held(order, indptr, keys, held, is_held)
    del order, keys
    n_held = int(np.count_nonzero(is_held))
    kept = np.empty(user.size - n_held, dtype=index)
    out = np.empty(n_held, dtype=index)
    _split_rows(is_held, kept, out)
    return kept, out


@njit(cache=True)
def _mark_held(order, indptr, keys, held, is_held):
    """Flag, in each user's segment of ``order`` (rows by user, ties in row order), the
    ``held[u]`` rows of smallest key (ties in row order: a stable sort)."""
    for u in range(indptr.shape[0] - 1):
        lo, hi = indptr[u], indptr[u + 1]
        take = min(held[u], hi - lo)
        if take <= 0:
            continue
        rows = order[lo:hi]
        if take == hi - lo:
            for r in rows:
                is_held[r] = True
            continue
        chosen = np.argsort(keys[rows], kind="mergesort")
        for j in range(take):
            is_held[rows[chosen[j]]] = True


@njit(cache=True)
def _split_rows(is_held, kept, out):
    """The ascending row numbers without and with the flag, into ``kept`` and ``out``."""
    a = 0
    b = 0
    for r in range(is_held.shape[0]):
        if is_held[r]:
            out[b] = r
            b += 1
        else:
            kept[a] = r
            a += 1
