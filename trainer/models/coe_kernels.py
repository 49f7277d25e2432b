"""Numba kernels of COE (Le & Lauw, SDM 2016): triple counting, sampling, SGA, exact accuracy.

Everything here takes arrays and scalars and returns arrays; no Python objects.

Triples are never materialised. Ratings are kept twice as compact CSR arrays,
once grouped by user (type-A triples live inside a user's row: a pair of the
user's items with different z-scores) and once grouped by item (type-B triples
live inside an item's column: a pair of the item's users with different
z-scores). Within each group the values are sorted, so the number of triples
of a group of ``m`` values whose tie groups have sizes ``c_1, c_2, ...`` is
``(m^2 - sum c_k^2) / 2``: counting needs a sort, never an enumeration.
Memory is O(ratings) whatever the number of triples (Netflix: 1e8 ratings,
2.5e11 type-B triples).

Function codes: 0 = sigmoid (COE-S, Eq. 3.2), 1 = Gompertz (COE-G, Eq. 3.3).
"""

from __future__ import annotations

import numpy as np
from numba import njit

SIGMOID, GOMPERTZ = 0, 1
_LN2 = np.log(2.0)
# Below this a distance counts as zero and its unit vector as the zero vector.
_TINY = 1e-12
# exp() argument cap: Gompertz's slope grows like e^{-alpha Delta} on the wrong side.
_EXP_CAP = 50.0


# ------------------------------------------------------------ preparation
@njit(cache=True)
def group_triple_counts(indptr, values):
    """Triples per group of a CSR whose values are sorted inside each group.

    A group of ``m`` values with tie groups of sizes ``c_k`` holds
    ``(m^2 - sum_k c_k^2) / 2`` pairs with different values (int64).
    """
    n = indptr.shape[0] - 1
    counts = np.zeros(n, dtype=np.int64)
    for g in range(n):
        start, end = indptr[g], indptr[g + 1]
        m = end - start
        ties = np.int64(0)
        run = np.int64(0)
        for p in range(start, end):
            if p > start and values[p] == values[p - 1]:
                run += 1
            else:
                ties += run * run
                run = 1
        ties += run * run
        counts[g] = (np.int64(m) * m - ties) // 2
    return counts


# --------------------------------------------------------------- gradients
@njit(cache=True, inline="always")
def _log_prob_and_slope(delta, func, scale):
    """ln P(Delta) and d ln P / d Delta for the two triple probability functions.

    Sigmoid (Eq. 3.2): P = s(lambda Delta), slope = lambda (1 - s(lambda Delta)).
    Gompertz (Eq. 3.3, a = 1, b = ln 2): ln P = -ln2 e^{-alpha Delta},
    slope = alpha ln2 e^{-alpha Delta}.
    """
    t = scale * delta
    if func == SIGMOID:
        # ln s(t) and 1 - s(t), written to stay finite for large |t|
        if t >= 0:
            e = np.exp(-t)
            return -np.log1p(e), scale * e / (1.0 + e)
        e = np.exp(t)
        return t - np.log1p(e), scale / (1.0 + e)
    e = np.exp(min(-t, _EXP_CAP))
    return -_LN2 * e, scale * _LN2 * e


@njit(cache=True)
def triple_log_prob(X, Y, kind, a, b, c, func, scale):
    """ln P of one triple: type A (kind 0) ``<u=a, i=b, j=c>``, type B (kind 1) ``<u=a, v=b, i=c>``.

    Delta_uij = |x_u - y_j| - |x_u - y_i| (Eq. 3.1); Delta_uvi = |x_v - y_i| - |x_u - y_i|.
    """
    if kind == 0:
        d_near = np.sqrt(np.sum((X[a] - Y[b]) ** 2))
        d_far = np.sqrt(np.sum((X[a] - Y[c]) ** 2))
    else:
        d_near = np.sqrt(np.sum((X[a] - Y[c]) ** 2))
        d_far = np.sqrt(np.sum((X[b] - Y[c]) ** 2))
    return _log_prob_and_slope(d_far - d_near, func, scale)[0]


@njit(cache=True)
def triple_gradient(X, Y, kind, a, b, c, func, scale):
    """Gradient of ln P of one triple w.r.t. its three points, shape (3, D).

    Rows follow the triple's order: type A -> (x_u, y_i, y_j), type B ->
    (x_u, x_v, y_i). These are the bracketed terms of Algorithm 1 without the
    prior (Section 3.3): with slope g and unit vectors a = (x_u - y_i)/|.|,
    b = (x_u - y_j)/|.| (type A), dx_u = g (b - a), dy_i = g a, dy_j = -g b.
    """
    D = X.shape[1]
    out = np.zeros((3, D))
    _gradient_into(X, Y, kind, a, b, c, func, scale, out)
    return out


@njit(cache=True, inline="always")
def _gradient_into(X, Y, kind, a, b, c, func, scale, out):
    D = X.shape[1]
    if kind == 0:  # <u, i, j>: near = (x_u, y_i), far = (x_u, y_j)
        p_near, q_near, p_far, q_far = X[a], Y[b], X[a], Y[c]
    else:  # <u, v, i>: near = (x_u, y_i), far = (x_v, y_i)
        p_near, q_near, p_far, q_far = X[a], Y[c], X[b], Y[c]
    s_near = 0.0
    s_far = 0.0
    for k in range(D):
        s_near += (p_near[k] - q_near[k]) ** 2
        s_far += (p_far[k] - q_far[k]) ** 2
    d_near = np.sqrt(s_near)
    d_far = np.sqrt(s_far)
    g = _log_prob_and_slope(d_far - d_near, func, scale)[1]
    # Guard 1/|.|: at zero distance the unit vector is undefined; use 0.
    inv_near = 1.0 / d_near if d_near > _TINY else 0.0
    inv_far = 1.0 / d_far if d_far > _TINY else 0.0
    for k in range(D):
        un = (p_near[k] - q_near[k]) * inv_near  # unit vector from the near item/user pair
        uf = (p_far[k] - q_far[k]) * inv_far
        if kind == 0:
            out[0, k] = g * (uf - un)  # x_u: away from y_i's side less than from y_j's
            out[1, k] = g * un  # y_i pulled toward x_u
            out[2, k] = -g * uf  # y_j pushed away from x_u
        else:
            out[0, k] = -g * un  # x_u pulled toward y_i
            out[1, k] = g * uf  # x_v pushed away from y_i
            out[2, k] = g * (un - uf)  # y_i toward x_u, away from x_v


@njit(cache=True, inline="always")
def _step(X, Y, kind, a, b, c, func, scale, reg, lr, grad):
    """One ascent step on one triple: each of its points moves by lr * (grad ln P - reg * point)."""
    _gradient_into(X, Y, kind, a, b, c, func, scale, grad)
    if kind == 0:
        P0, P1, P2 = X[a], Y[b], Y[c]
    else:
        P0, P1, P2 = X[a], X[b], Y[c]
    for k in range(X.shape[1]):
        P0[k] += lr * (grad[0, k] - reg * P0[k])
        P1[k] += lr * (grad[1, k] - reg * P1[k])
        P2[k] += lr * (grad[2, k] - reg * P2[k])


# ---------------------------------------------------------------- sampling
@njit(cache=True, inline="always")
def _draw_group(cum, total):
    """A group with probability proportional to its weight (cum: float64 exclusive prefix sums).

    With weights = triple counts this is uniform over the triple set; float64
    holds counts exactly up to 2^53 (Netflix type B: 2.5e11). Zero-weight
    groups are never returned: ``side="right"`` skips empty intervals.
    """
    n = cum.shape[0] - 1
    while True:
        g = np.searchsorted(cum, np.random.random() * total, side="right") - 1
        if g < n:
            return g


@njit(cache=True, inline="always")
def _draw_pair(start, end, values):
    """Two positions of a group with different values, higher value first.

    Ordered pairs drawn uniformly and rejected on ties give every unordered
    pair with different values the same probability 1/count: together with
    _draw_group the triple is uniform over the whole triple set.
    """
    m = end - start
    while True:
        p = start + np.int64(np.random.random() * m)
        q = start + np.int64(np.random.random() * m)
        if p >= end:
            p = end - 1
        if q >= end:
            q = end - 1
        if values[p] != values[q]:
            break
    if values[p] > values[q]:
        return p, q
    return q, p


@njit(cache=True, inline="always")
def _is_rated(seen, start, end, item):
    """Whether ``item`` is among ``seen[start:end]`` (sorted item ids of one user)."""
    pos = start + np.searchsorted(seen[start:end], item)
    return pos < end and seen[pos] == item


@njit(cache=True, inline="always")
def _draw_unrated_triple(a_indptr, a_items, user_cum, seen, item_cum, picked_cum):
    """A rated-over-unrated triple ``<u, i, j>``: u rated i, never rated j.

    The user is drawn with weight ``user_cum`` (its rating count or summed pick
    weights, 0 for a user with no unrated item of positive weight), one of the
    user's ratings uniformly, or with weight ``picked_cum`` (prefix sums of each
    rating's weight, rows as ``a_items``) when it is not empty, and j with weight
    ``item_cum`` (popularity ** power) among the items the user did not rate, by
    rejection; the caller's weights guarantee an unrated item of positive weight
    exists, so the loop ends.
    """
    u = _draw_group(user_cum, user_cum[user_cum.shape[0] - 1])
    start, end = a_indptr[u], a_indptr[u + 1]
    if picked_cum.shape[0]:
        low, high = picked_cum[start], picked_cum[end]
        p = np.searchsorted(picked_cum, low + np.random.random() * (high - low), side="right") - 1
        p = max(start, p)
    else:
        p = start + np.int64(np.random.random() * (end - start))
    if p >= end:
        p = end - 1
    total = item_cum[item_cum.shape[0] - 1]
    while True:
        j = _draw_group(item_cum, total)
        if not _is_rated(seen, start, end, j):
            return u, a_items[p], j


@njit(cache=True, inline="always")
def _totals(source):
    """Total group weight of type A and of type B (the last prefix sums)."""
    a_cum, b_cum = source[3], source[7]
    return a_cum[a_cum.shape[0] - 1], b_cum[b_cum.shape[0] - 1]


@njit(cache=True, inline="always")
def _draw_triple(source, totals, p_a, p_unrated, unrated):
    """One triple as (kind, first, second, third); kind 0 = A, 1 = B, 2 = A against an unrated item.

    ``source``: the eight arrays of ``TripleSource.arrays``; ``unrated``: the
    three of ``TripleSource.unrated_arrays`` and ``TripleSource.picked_cum``; ``totals``: the type-A and
    type-B weight totals (``_totals``, hoisted out of the loop). With ``p_unrated == 0`` no
    random number is spent on the unrated choice, so the paper's draws are
    exactly those of a build without it.
    """
    a_indptr, a_items, a_values, a_cum, b_indptr, b_users, b_values, b_cum = source
    if p_unrated > 0.0 and (p_unrated >= 1.0 or np.random.random() < p_unrated):
        user_cum, seen, item_cum, picked_cum = unrated
        u, i, j = _draw_unrated_triple(a_indptr, a_items, user_cum, seen, item_cum, picked_cum)
        return 2, u, i, j
    total_a, total_b = totals
    if total_b == 0 or (total_a > 0 and np.random.random() < p_a):
        u = _draw_group(a_cum, total_a)
        p, q = _draw_pair(a_indptr[u], a_indptr[u + 1], a_values)
        return 0, u, a_items[p], a_items[q]
    i = _draw_group(b_cum, total_b)
    p, q = _draw_pair(b_indptr[i], b_indptr[i + 1], b_values)
    return 1, b_users[p], b_users[q], i


@njit(cache=True)
def sample_triples(source, n, p_a, seed, p_unrated, unrated):
    """``n`` triples drawn as ``sga_epoch`` draws them (for tests and diagnostics).

    Returns (kind, first, second, third) int64 arrays: type A (kind 0)
    ``<u, i, j>`` with u preferring i; type B (kind 1) ``<u, v, i>`` with u
    liking i more than v does; kind 2 ``<u, i, j>`` with u having rated i
    and not j (drawn with probability ``p_unrated``).
    """
    np.random.seed(seed)
    totals = _totals(source)
    kind = np.zeros(n, dtype=np.int64)
    first = np.zeros(n, dtype=np.int64)
    second = np.zeros(n, dtype=np.int64)
    third = np.zeros(n, dtype=np.int64)
    for t in range(n):
        kind[t], first[t], second[t], third[t] = _draw_triple(source, totals, p_a, p_unrated, unrated)
    return kind, first, second, third


@njit(cache=True)
def sga_epoch(X, Y, source, n_steps, p_a, func, scale, reg, lr_start, lr_end, seed, p_unrated, unrated):
    """``n_steps`` steps of stochastic gradient ascent (Algorithm 1), in place.

    Each step draws a type (A with probability ``p_a``), a group (user for
    A, item for B) with probability proportional to its weight in
    the ``*_cum`` arrays of ``source`` (``TripleSource.arrays``), and one of
    the group's triples uniformly; with weights = triple counts and
    ``p_a`` = T_A / (T_A + T_B) that is the paper's uniform draw over the
    triple set. With probability ``p_unrated`` the step instead draws a
    rated-over-unrated triple (``_draw_unrated_triple`` with the arrays
    ``unrated``, ``TripleSource.unrated_arrays``), a type-A triple whose far
    item the user did not rate (top-N training, docs/coe.md).
    It then moves the triple's three points by
    ``lr * (grad ln P - reg * point)``.
    The learning rate falls linearly from ``lr_start`` to ``lr_end`` over the
    epoch (the caller decays it across epochs). Returns the mean ln P of the
    drawn triples (before their step) as a progress statistic.
    """
    np.random.seed(seed)
    totals = _totals(source)
    grad = np.zeros((3, X.shape[1]))
    log_sum = 0.0
    for t in range(n_steps):
        lr = lr_start + (lr_end - lr_start) * (t / n_steps)
        kind, a, b, c = _draw_triple(source, totals, p_a, p_unrated, unrated)
        if kind == 2:
            kind = 0  # geometrically a type-A triple
        _step(X, Y, kind, a, b, c, func, scale, reg, lr, grad)
        if t % 64 == 0:  # a cheap running estimate of the objective
            log_sum += triple_log_prob(X, Y, kind, a, b, c, func, scale)
    n_logged = (n_steps + 63) // 64
    return log_sum / max(n_logged, 1)


@njit(cache=True)
def sga_explicit(X, Y, kind, first, second, third, n_steps, func, scale, reg, lr_start, lr_end, seed):
    """SGA over an explicit list of triples (a triples file), drawn uniformly."""
    np.random.seed(seed)
    D = X.shape[1]
    n = kind.shape[0]
    grad = np.zeros((3, D))
    for t in range(n_steps):
        lr = lr_start + (lr_end - lr_start) * (t / n_steps)
        r = np.int64(np.random.random() * n)
        if r >= n:
            r = n - 1
        k_ = kind[r]
        a, b, c = first[r], second[r], third[r]
        _step(X, Y, k_, a, b, c, func, scale, reg, lr, grad)


# --------------------------------------------------------------- evaluation
@njit(cache=True)
def _fenwick_add(tree, pos):
    pos += 1
    while pos < tree.shape[0]:
        tree[pos] += 1
        pos += pos & (-pos)


@njit(cache=True)
def _fenwick_prefix(tree, pos):
    """How many inserted ranks are <= pos."""
    s = np.int64(0)
    pos += 1
    while pos > 0:
        s += tree[pos]
        pos -= pos & (-pos)
    return s


@njit(cache=True)
def concordant_pairs(indptr, values, dist):
    """Per group: pairs with different values, and those the distances order correctly.

    A pair (k, l) with values[k] > values[l] is reproduced when
    dist[k] < dist[l] strictly (Eq. 5.5/5.6: ties in distance count as
    wrong). Exact over all pairs in O(m log m) per group: walk the group in
    increasing distance, and for each element count, with a Fenwick tree over
    value ranks, the already-seen (strictly nearer) elements of strictly
    higher value. No pair is enumerated.
    """
    n = indptr.shape[0] - 1
    pairs = np.zeros(n, dtype=np.int64)
    correct = np.zeros(n, dtype=np.int64)
    for g in range(n):
        start, end = indptr[g], indptr[g + 1]
        m = end - start
        if m < 2:
            continue
        vals = values[start:end]
        ds = dist[start:end]
        # dense ranks of the values (ties share a rank)
        order_v = np.argsort(vals, kind="mergesort")
        rank = np.empty(m, dtype=np.int64)
        r = -1
        ties = np.int64(0)
        run = np.int64(0)
        for t in range(m):
            if t == 0 or vals[order_v[t]] != vals[order_v[t - 1]]:
                r += 1
                ties += run * run
                run = 1
            else:
                run += 1
            rank[order_v[t]] = r
        ties += run * run
        pairs[g] = (np.int64(m) * m - ties) // 2
        tree = np.zeros(r + 2, dtype=np.int64)
        order_d = np.argsort(ds, kind="mergesort")
        inserted = np.int64(0)
        t = 0
        good = np.int64(0)
        while t < m:
            # a block of equal distances: query all before inserting any
            t_end = t + 1
            while t_end < m and ds[order_d[t_end]] == ds[order_d[t]]:
                t_end += 1
            for s in range(t, t_end):
                good += inserted - _fenwick_prefix(tree, rank[order_d[s]])
            for s in range(t, t_end):
                _fenwick_add(tree, rank[order_d[s]])
                inserted += 1
            t = t_end
        correct[g] = good
    return pairs, correct


@njit(cache=True)
def knn_mean_rating(indptr, rating, dist, k):
    """Per group: the mean rating of its ``k`` nearest members (NaN for an empty group)."""
    n = indptr.shape[0] - 1
    out = np.full(n, np.nan)
    for g in range(n):
        start, end = indptr[g], indptr[g + 1]
        m = end - start
        if m == 0:
            continue
        order = np.argsort(dist[start:end], kind="mergesort")
        kk = min(k, m)
        s = 0.0
        for t in range(kk):
            s += rating[start + order[t]]
        out[g] = s / kk
    return out
