"""Numba kernels of KNNSCAL (Castle & Trosset poster; ``docs/algorithms.md`` section 4).

The enlarged edge set E+ is stored source-major as a CSR: ``indptr`` (n + 1),
``col`` (the other end j of each directed entry (i, j)) and ``rnk`` (r_ij, or
q for a sampled non-edge); each source's entries are sorted by rank. The
entries that end at a vertex are a second CSR (``in_indptr``, ``in_src``,
``in_entry``) so that a vertex can be moved using every term of the stress
that involves it, in O(in + out degree).

Everything here takes arrays and scalars and returns arrays: no Python
objects, so the kernels compile once (``cache=True``) and run at C speed.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_EPS = 1e-12
# Row chunks of the parallel per-source fit: enough for any thread count, few enough to keep buffers cheap.
_ROW_CHUNKS = 256


# ---------------------------------------------------------------- E+ set-up
@njit(cache=True, inline="always")
def _emit_shuffled(pool, size, take, q, out_col, out_rnk, o):
    """Move ``take`` uniform draws without replacement from ``pool[:size]`` to
    its front (a partial Fisher-Yates shuffle) and emit them as non-edges of
    rank ``q`` at ``out_col[o:]``; returns the next output position."""
    for t in range(take):
        s = t + np.random.randint(0, size - t)
        tmp = pool[t]
        pool[t] = pool[s]
        pool[s] = tmp
        out_col[o] = pool[t]
        out_rnk[o] = q
        o += 1
    return o


@njit(cache=True)
def sample_nonedges(indptr, col, rnk, n, m, q, two_hop_fraction, seed):
    """Add up to ``m`` non-edges of rank ``q`` to every source's list.

    A non-edge of i is any j != i not already in i's list. A fraction
    ``two_hop_fraction`` of them is drawn from i's two-hop neighbourhood (the
    lists of i's neighbours): those are the vertices that compete with i's
    neighbours for its nearest places on the map, so their "farther than every
    neighbour" constraint is the informative one. The rest are uniform
    (the poster's random non-edges). When fewer than ``2 m`` candidates exist
    all candidates are enumerated and partially shuffled; otherwise uniform
    ones are drawn by rejection (collisions are rare).

    Returns the CSR ``(indptr, col, rnk)`` of E+ with each row's edges first
    (in their rank order) and then its non-edges.
    """
    np.random.seed(seed)
    counts = np.empty(n, dtype=np.int64)
    for i in range(n):
        deg = indptr[i + 1] - indptr[i]
        counts[i] = max(0, min(m, n - 1 - deg))
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        out_ptr[i + 1] = out_ptr[i] + (indptr[i + 1] - indptr[i]) + counts[i]
    total = out_ptr[n]
    out_col = np.empty(total, dtype=np.int32)
    out_rnk = np.empty(total, dtype=np.int32)
    mark = np.zeros(n, dtype=np.bool_)
    maxdeg = 0
    for i in range(n):
        maxdeg = max(maxdeg, indptr[i + 1] - indptr[i])
    hop = np.empty(max(1, maxdeg * maxdeg), dtype=np.int32)
    for i in range(n):
        a, b = indptr[i], indptr[i + 1]
        o = out_ptr[i]
        for e in range(a, b):
            out_col[o] = col[e]
            out_rnk[o] = rnk[e]
            o += 1
        need = counts[i]
        if need <= 0:
            continue
        available = n - 1 - (b - a)
        for e in range(a, b):
            mark[col[e]] = True
        mark[i] = True
        start = o
        if 2 * need >= available:
            # Small graph: enumerate the candidates, then a partial shuffle.
            cand = np.empty(available, dtype=np.int32)
            c = 0
            for j in range(n):
                if not mark[j]:
                    cand[c] = j
                    c += 1
            o = _emit_shuffled(cand, c, need, q, out_col, out_rnk, o)
        else:
            # Two-hop candidates (deduplicated with the marks), partially shuffled.
            h = 0
            for e in range(a, b):
                v = col[e]
                for f in range(indptr[v], indptr[v + 1]):
                    j = col[f]
                    if not mark[j]:
                        mark[j] = True
                        hop[h] = j
                        h += 1
            want = min(h, int(two_hop_fraction * need + 0.5))
            o = _emit_shuffled(hop, h, want, q, out_col, out_rnk, o)
            for t in range(want, h):  # unchosen two-hop vertices may still be drawn uniformly
                mark[hop[t]] = False
            while o - start < need:
                j = np.random.randint(0, n)
                if mark[j]:
                    continue
                mark[j] = True
                out_col[o] = j
                out_rnk[o] = q
                o += 1
        for t in range(start, o):
            mark[out_col[t]] = False
        for e in range(a, b):
            mark[col[e]] = False
        mark[i] = False
    return out_ptr, out_col, out_rnk


@njit(cache=True)
def incoming(indptr, col, n):
    """The entries ending at each vertex: CSR ``(in_indptr, in_src, in_entry)`` (counting sort)."""
    in_ptr = np.zeros(n + 1, dtype=np.int64)
    for e in range(col.shape[0]):
        in_ptr[col[e] + 1] += 1
    for v in range(n):
        in_ptr[v + 1] += in_ptr[v]
    fill = in_ptr[:-1].copy()
    in_src = np.empty(col.shape[0], dtype=np.int32)
    in_entry = np.empty(col.shape[0], dtype=np.int64)
    for i in range(n):
        for e in range(indptr[i], indptr[i + 1]):
            j = col[e]
            p = fill[j]
            in_src[p] = i
            in_entry[p] = e
            fill[j] = p + 1
    return in_ptr, in_src, in_entry


# ------------------------------------------------------------ distances, stress
@njit(cache=True, parallel=True)
def entry_distances(X, indptr, col):
    """d_ij(X) for every entry of E+ (rows in parallel: each writes only its own entries)."""
    n, dim = X.shape
    d = np.empty(col.shape[0], dtype=np.float64)
    for i in prange(n):
        for e in range(indptr[i], indptr[i + 1]):
            j = col[e]
            s = 0.0
            for c in range(dim):
                diff = X[i, c] - X[j, c]
                s += diff * diff
            d[e] = np.sqrt(s)
    return d


@njit(cache=True)
def weighted_square_sum(delta, rnk, q, edge_weight):
    """sum_e w_e delta_e^2 with w = edge_weight on graph edges (rank < q), 1 on non-edges."""
    total = 0.0
    for e in range(delta.shape[0]):
        w = edge_weight if rnk[e] < q else 1.0
        total += w * delta[e] * delta[e]
    return total


@njit(cache=True)
def stress(X, indptr, col, rnk, q, edge_weight, delta):
    """Asymmetric stress sigma_a = 1/2 sum_{(i,j) in E+} w_ij (delta_ij - d_ij(X))^2 (poster, eq. 1).

    w_ij = ``edge_weight`` on graph edges (rank < q) and 1 on sampled non-edges.
    """
    return stress_from_distances(entry_distances(X, indptr, col), rnk, q, edge_weight, delta)


@njit(cache=True)
def stress_from_distances(d, rnk, q, edge_weight, delta):
    """sigma_a from precomputed entry distances ``d`` (:func:`entry_distances`).

    One sequential pass with no reads of X: the loop computes d once per
    iteration and scores both the configuration step (old delta) and the
    disparity step (new delta) from it.
    """
    total = 0.0
    for e in range(d.shape[0]):
        r = delta[e] - d[e]
        w = edge_weight if rnk[e] < q else 1.0
        total += w * r * r
    return 0.5 * total


@njit(cache=True)
def stress_gradient(X, indptr, col, rnk, q, edge_weight, delta):
    """d sigma_a / d X: for each entry e = (i, j), w_e (1 - delta_e / d_e)(X_i - X_j) goes to
    row i and its negative to row j (both ends move the same distance)."""
    n, dim = X.shape
    g = np.zeros_like(X)
    for i in range(n):
        for e in range(indptr[i], indptr[i + 1]):
            j = col[e]
            s = 0.0
            for c in range(dim):
                diff = X[i, c] - X[j, c]
                s += diff * diff
            d = np.sqrt(s)
            w = edge_weight if rnk[e] < q else 1.0
            coef = w * (1.0 - (delta[e] / d if d > _EPS else 0.0))
            for c in range(dim):
                t = coef * (X[i, c] - X[j, c])
                g[i, c] += t
                g[j, c] -= t
    return g


# ---------------------------------------------------------------- majorization
@njit(cache=True, parallel=True)
def _incoming_terms(delta, rnk, q, edge_weight, in_entry):
    """delta_e and w_e of every incoming entry, in incoming order.

    The sweeps read the incoming side of a vertex many times per iteration;
    gathering these once per call turns 2 random reads per incoming entry and
    sweep (``delta[in_entry[p]]``, ``rnk[in_entry[p]]``, scattered over the whole
    E+ array) into sequential ones.
    """
    m = in_entry.shape[0]
    in_delta = np.empty(m, dtype=np.float64)
    in_w = np.empty(m, dtype=np.float64)
    for p in prange(m):
        e = in_entry[p]
        in_delta[p] = delta[e]
        in_w[p] = edge_weight if rnk[e] < q else 1.0
    return in_delta, in_w


@njit(cache=True, inline="always")
def _accumulate(X, i, Y, j, w, dl, acc):
    """acc += w (delta/d - 1)(X_i - Y_j), d = ||X_i - Y_j||, for one entry touching i.

    ``Y`` is X itself, or (across blocks of a parallel sweep) X as the sweep found it.
    """
    dim = X.shape[1]
    s = 0.0
    for c in range(dim):
        diff = X[i, c] - Y[j, c]
        s += diff * diff
    d = np.sqrt(s)
    ratio = dl / d if d > _EPS else 0.0
    for c in range(dim):
        acc[c] += w * (ratio - 1.0) * (X[i, c] - Y[j, c])


@njit(cache=True)
def _point_step(X, i, indptr, col, rnk, q, edge_weight, delta, in_ptr, in_src, in_delta, in_w, acc):
    """sum over entries touching i of w_e (delta_e / d_e - 1)(X_i - X_j); returns gamma_i = sum w_e.

    This is minus the gradient of sigma_a with respect to X_i (see module
    ``trainer.models.knnscal`` for the derivation); ``acc`` receives it.
    Outgoing entries are read from the E+ CSR, incoming ones from the
    pre-gathered ``in_delta``, ``in_w`` (:func:`_incoming_terms`).
    """
    dim = X.shape[1]
    for c in range(dim):
        acc[c] = 0.0
    gamma = 0.0
    for e in range(indptr[i], indptr[i + 1]):
        w = edge_weight if rnk[e] < q else 1.0
        _accumulate(X, i, X, col[e], w, delta[e], acc)
        gamma += w
    for p in range(in_ptr[i], in_ptr[i + 1]):
        _accumulate(X, i, X, in_src[p], in_w[p], in_delta[p], acc)
        gamma += in_w[p]
    return gamma


@njit(cache=True)
def majorize_gauss_seidel(X, indptr, col, rnk, q, edge_weight, delta, in_ptr, in_src, in_entry, sweeps):
    """In-place sweeps moving one vertex at a time to the minimiser of its own majorizer.

    With the others fixed, sigma_a as a function of X_i is majorized at Y_i by
    1/2 sum_e ||x - X_j||^2 - sum_e delta_e (x - X_j).(Y_i - X_j) / d_e + const,
    whose minimiser is X_i <- Y_i + (1/gamma_i) sum_e (delta_e/d_e - 1)(Y_i - X_j).
    Each vertex move therefore never increases the stress, and neither does a sweep.
    """
    majorize_blocks(X, indptr, col, rnk, q, edge_weight, delta, in_ptr, in_src, in_entry, sweeps, 1)


@njit(cache=True, inline="always")
def _accumulate_split(X, X_old, i, j, w, dl, lo, hi, acc):
    """One entry's term of a block sweep; returns its curvature.

    Within the block [lo, hi): the Gauss-Seidel term (current X_j, curvature w).
    Across blocks: X_j as the sweep found it, curvature 2 w, since
    ||a - b||^2 <= 2 ||a||^2 + 2 ||b||^2 makes the majorizer separable between
    blocks that move at the same time.
    """
    if lo <= j < hi:
        _accumulate(X, i, X, j, w, dl, acc)
        return w
    _accumulate(X, i, X_old, j, w, dl, acc)  # X_i has not moved yet in this sweep
    return 2.0 * w


@njit(cache=True, parallel=True)
def majorize_blocks(X, indptr, col, rnk, q, edge_weight, delta, in_ptr, in_src, in_entry, sweeps, n_blocks):
    """Gauss-Seidel within ``n_blocks`` contiguous vertex blocks, the blocks in parallel.

    Each block sweeps its vertices in order, reading its own rows as they move
    and the other blocks' rows as they were at the start of the sweep. Between
    blocks every entry's majorizer is split (curvature 2 w, see
    :func:`_accumulate_split`), so the sum of the block majorizers is a
    majorizer of sigma_a that the blocks minimise independently: every sweep
    is still monotone. The result depends on ``n_blocks``, not on the threads.
    With one block this is plain Gauss-Seidel.
    """
    n, dim = X.shape
    in_delta, in_w = _incoming_terms(delta, rnk, q, edge_weight, in_entry)
    for _ in range(sweeps):
        X_old = X.copy() if n_blocks > 1 else X
        for b in prange(n_blocks):
            lo = b * n // n_blocks
            hi = (b + 1) * n // n_blocks
            acc = np.empty(dim, dtype=np.float64)
            for i in range(lo, hi):
                for c in range(dim):
                    acc[c] = 0.0
                gamma = 0.0
                for e in range(indptr[i], indptr[i + 1]):
                    w = edge_weight if rnk[e] < q else 1.0
                    gamma += _accumulate_split(X, X_old, i, col[e], w, delta[e], lo, hi, acc)
                for p in range(in_ptr[i], in_ptr[i + 1]):
                    gamma += _accumulate_split(X, X_old, i, in_src[p], in_w[p], in_delta[p], lo, hi, acc)
                if gamma > 0:
                    for c in range(dim):
                        X[i, c] += acc[c] / gamma


@njit(cache=True)
def majorize_jacobi(X, indptr, col, rnk, q, edge_weight, delta, in_ptr, in_src, in_entry, sweeps):
    """The poster's diagonal majorization: X <- X + 1/2 diag(V)^-1 (B(X) - V) X.

    All vertices move at once with step 1/(2 gamma_i); V <= 2 diag(V) makes this
    a majorization step (Trosset & Groenen 2005), so the stress never increases.
    Returns the new configuration.
    """
    n, dim = X.shape
    acc = np.empty(dim, dtype=np.float64)
    in_delta, in_w = _incoming_terms(delta, rnk, q, edge_weight, in_entry)
    for _ in range(sweeps):
        Xn = X.copy()
        for i in range(n):
            gamma = _point_step(
                X, i, indptr, col, rnk, q, edge_weight, delta, in_ptr, in_src, in_delta, in_w, acc
            )
            if gamma > 0:
                for c in range(dim):
                    Xn[i, c] += acc[c] / (2.0 * gamma)
        X = Xn
    return X


# ------------------------------------------------------------------ locality
@njit(cache=True)
def _spread_bits(v, dims):
    """The low 21 bits of ``v`` spread out ``dims`` apart (bit b goes to bit b * dims)."""
    out = np.uint64(0)
    for b in range(21):
        if (v >> np.uint64(b)) & np.uint64(1):
            out |= np.uint64(1) << np.uint64(b * dims)
    return out


@njit(cache=True)
def morton_keys(X):
    """Z-order (Morton) key of each row of X over its first min(dim, 3) coordinates.

    Vertices close on the map get close keys, so sorting by the key puts the
    rows of X that one source's entries read near each other in memory.
    """
    n, dim = X.shape
    dims = min(dim, 3)
    bits = 63 // dims if dims > 1 else 63
    bits = min(bits, 21)
    levels = (1 << bits) - 1
    lo = np.empty(dims)
    hi = np.empty(dims)
    for c in range(dims):
        lo[c] = X[:, c].min()
        hi[c] = X[:, c].max()
    keys = np.empty(n, dtype=np.uint64)
    for i in range(n):
        key = np.uint64(0)
        for c in range(dims):
            span = hi[c] - lo[c]
            v = int((X[i, c] - lo[c]) / span * levels) if span > 0 else 0
            key |= _spread_bits(np.uint64(v), dims) << np.uint64(c)
        keys[i] = key
    return keys


@njit(cache=True)
def permute_rows(indptr, order):
    """CSR row permutation: new row r is old row ``order[r]``, contents in the same order.

    Returns ``(new_indptr, source_entry)`` with ``source_entry[new e] = old e``,
    so any per-entry array follows by ``array[source_entry]``.
    """
    n = order.shape[0]
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    for r in range(n):
        v = order[r]
        out_ptr[r + 1] = out_ptr[r] + (indptr[v + 1] - indptr[v])
    src = np.empty(out_ptr[n], dtype=np.int64)
    for r in range(n):
        v = order[r]
        o = out_ptr[r]
        for e in range(indptr[v], indptr[v + 1]):
            src[o] = e
            o += 1
    return out_ptr, src


# ------------------------------------------------------------------ isotonic
@njit(cache=True)
def pav(y, w):
    """Weighted least-squares non-decreasing fit of ``y`` (pool adjacent violators), O(len)."""
    m = y.shape[0]
    level = np.empty(m, dtype=np.float64)
    weight = np.empty(m, dtype=np.float64)
    size = np.empty(m, dtype=np.int64)
    top = 0
    for t in range(m):
        level[top] = y[t]
        weight[top] = w[t]
        size[top] = 1
        top += 1
        while top > 1 and level[top - 2] > level[top - 1]:
            wsum = weight[top - 2] + weight[top - 1]
            level[top - 2] = (level[top - 2] * weight[top - 2] + level[top - 1] * weight[top - 1]) / wsum
            weight[top - 2] = wsum
            size[top - 2] += size[top - 1]
            top -= 1
    out = np.empty(m, dtype=np.float64)
    t = 0
    for b in range(top):
        for _ in range(size[b]):
            out[t] = level[b]
            t += 1
    return out


@njit(cache=True)
def _sort_small(keys, idx):
    """Insertion sort of ``idx`` by ``keys[idx]``; the groups are short (ties in rank)."""
    for a in range(1, idx.shape[0]):
        v = idx[a]
        kv = keys[v]
        b = a - 1
        while b >= 0 and keys[idx[b]] > kv:
            idx[b + 1] = idx[b]
            b -= 1
        idx[b + 1] = v


@njit(cache=True)
def row_positions(indptr):
    """Each entry's position within its row: the identity order for ``isotonic_rows``."""
    n = indptr.shape[0] - 1
    perm = np.empty(indptr[n], dtype=np.int32)
    for i in range(n):
        for e in range(indptr[i], indptr[i + 1]):
            perm[e] = e - indptr[i]
    return perm


@njit(cache=True, parallel=True)
def isotonic_rows(indptr, rnk, q, edge_weight, gap, d, delta, perm):
    """Per source: delta <- the monotone (in rank) least-squares fit of d (step 4b).

    Entries of equal rank (the non-edges at rank q, or tied neighbours) are
    ordered by their current distance first (Kruskal's primary approach to
    ties), which is the best order for them. Rows are pre-sorted by rank, so
    the only sort is within tie groups. ``perm`` (one int32 per entry, the
    position within its row) keeps last iteration's order, so the insertion
    sort sees nearly sorted input: O(k) typical, O(k^2) worst, O(k log k)
    on average for random input of the sizes used here (k ~ 60).

    ``gap`` > 0 asks for strictly increasing disparities between consecutive
    distinct ranks: delta_next >= delta_prev + eps_i with
    eps_i = gap * (mean distance of i's graph edges) / (its number of edges).
    With delta = z + c (c the cumulated gaps) this is the plain isotonic fit
    z = PAV(d - c): exact and still O(k). It removes the free "pool everything
    to one value" solutions that make ties in the map cost nothing.
    """
    n = indptr.shape[0] - 1
    maxlen = 0
    for i in range(n):
        maxlen = max(maxlen, indptr[i + 1] - indptr[i])
    # Rows are independent: chunks of them run in parallel, each with its own buffers.
    n_chunks = min(n, _ROW_CHUNKS)
    for chunk in prange(n_chunks):
        order = np.empty(maxlen, dtype=np.int64)
        y = np.empty(maxlen, dtype=np.float64)
        w = np.empty(maxlen, dtype=np.float64)
        shift = np.empty(maxlen, dtype=np.float64)
        for i in range(chunk * n // n_chunks, (chunk + 1) * n // n_chunks):
            _isotonic_row(
                indptr[i], indptr[i + 1], rnk, q, edge_weight, gap, d, delta, perm, order, y, w, shift
            )


@njit(cache=True)
def _isotonic_row(a, b, rnk, q, edge_weight, gap, d, delta, perm, order, y, w, shift):
    """The monotone fit of one source's entries ``a:b`` (see :func:`isotonic_rows`)."""
    m = b - a
    for t in range(m):
        order[t] = a + perm[a + t]
    g = 0
    while g < m:
        h = g + 1
        while h < m and rnk[a + h] == rnk[a + g]:
            h += 1
        if h - g > 1:
            _sort_small(d, order[g:h])
        g = h
    eps = 0.0
    if gap > 0.0:
        ne = 0
        dsum = 0.0
        for t in range(m):
            if rnk[a + t] < q:
                ne += 1
                dsum += d[a + t]
        if ne > 0:
            eps = gap * dsum / ne / ne
    cum = 0.0
    for t in range(m):
        if t > 0 and rnk[a + t] != rnk[a + t - 1]:
            cum += eps
        shift[t] = cum
        y[t] = d[order[t]] - cum
        w[t] = edge_weight if rnk[a + t] < q else 1.0
    fit = pav(y[:m], w[:m])
    for t in range(m):
        delta[order[t]] = fit[t] + shift[t]
        perm[a + t] = order[t] - a


# ------------------------------------------------------------------ measures
@njit(cache=True)
def order_counts(X, indptr, col, rnk, q):
    """Within-list order agreement counts over graph edges (rank < q).

    Returns (agree, pairs): pairs j, k of a source's list with r_ij < r_ik, of
    which ``agree`` have d_ij < d_ik.
    """
    n, dim = X.shape
    agree = 0
    pairs = 0
    for i in range(n):
        a, b = indptr[i], indptr[i + 1]
        for e in range(a, b):
            if rnk[e] >= q:
                continue
            s = 0.0
            for c in range(dim):
                diff = X[i, c] - X[col[e], c]
                s += diff * diff
            for f in range(a, b):
                if rnk[f] >= q or rnk[f] <= rnk[e]:
                    continue
                t = 0.0
                for c in range(dim):
                    diff = X[i, c] - X[col[f], c]
                    t += diff * diff
                pairs += 1
                if s < t:
                    agree += 1
    return agree, pairs
