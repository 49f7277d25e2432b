"""Serving kernels: top-k selection, and the scoring passes that feed it.

The service selects a top-k on every request, so it is one single pass here
rather than ``np.argpartition`` plus a sort, which costs several times more
on a few thousand scores (``docs/architecture.md``). Ties keep the lower
index first, so answers are deterministic.

Every kernel on a request's path keeps the GIL when its work is short.
Releasing the GIL for a few microseconds (a ``nogil`` kernel, a BLAS call,
a numpy loop over more than a few hundred elements) hands it to one of the
server's other threads, and the caller then waits to get it back, which
costs more CPU per call than the work saved (``docs/service.md``, Scaling,
has the measurements). Long products (a large catalogue) are the exception:
there the other threads should run, so they release it.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np
from numba import njit, types
from numba.core.dispatcher import Dispatcher

# Above this k an insertion buffer stops paying off; numpy takes over (public: the fused
# one-user kernel's callers check it).
KERNEL_MAX_K = 128
# Products up to this many multiply-adds keep the GIL; longer ones release it.
# A server process pinned to one core gains no parallelism from releasing it, only the
# cost of the hand-off, so only products long enough to dwarf that let others in.
_HOLD_GIL_MAX_WORK = 1 << 21


def read_only_type(dtype: types.Type, ndim: int, layout: Literal["C", "F"] = "C") -> types.Array:
    """A read-only array type. A kernel compiled for it also takes writable arrays (numba
    converts them at no cost), so a memory-mapped artifact and an in-memory copy share one
    build instead of one per mix of the two: the kernels a request calls from Python are
    declared with these types (here and in ``service/serving/wire.py``)."""
    return types.Array(dtype, ndim, layout, readonly=True)


ITEM_MATRIX_TYPES = (
    read_only_type(types.float32, 2),
    read_only_type(types.float32, 2, "F"),
)  # row- or column-major items


@njit(cache=True, inline="always")
def _insert(best_idx, best_val, count, k, s, i):
    # Insert score ``s`` of row ``i`` into the descending buffer of ``count`` (at most ``k``)
    # entries, past its equals (ties keep the lower row first); return the new count.
    pos = count if count < k else k - 1
    while pos > 0 and best_val[pos - 1] < s:
        if pos < k:
            best_val[pos] = best_val[pos - 1]
            best_idx[pos] = best_idx[pos - 1]
        pos -= 1
    best_val[pos] = s
    best_idx[pos] = i
    return count + 1 if count < k else count


@njit(cache=True)
def _top_k_kernel(scores, k):
    best_idx = np.empty(k, dtype=np.int64)
    best_val = np.empty(k, dtype=scores.dtype)
    count = 0
    for i in range(scores.shape[0]):
        s = scores[i]
        if not (s > -np.inf):  # skips -inf (excluded) and NaN
            continue
        if count == k and s <= best_val[k - 1]:
            continue
        count = _insert(best_idx, best_val, count, k, s, i)
    return best_idx[:count], best_val[:count]


@njit(cache=True)
def _top_k_masked_kernel(scores, blocked, k):
    """``_top_k_kernel`` skipping ``blocked`` rows (hidden or filtered-out items).

    Once k items are held, the threshold test comes first: a blocked item is
    then rejected by the same, well-predicted branch as most unblocked ones.
    Testing the mask first would branch at random on a mask that blocks half
    the catalogue, which measured slower than the scoring itself.
    """
    best_idx = np.empty(k, dtype=np.int64)
    best_val = np.empty(k, dtype=scores.dtype)
    count = 0
    for i in range(scores.shape[0]):
        s = scores[i]
        if count == k:
            if not (s > best_val[k - 1]) or blocked[i]:
                continue
        elif blocked[i] or not (s > -np.inf):
            continue
        count = _insert(best_idx, best_val, count, k, s, i)
    return best_idx[:count], best_val[:count]


@njit(cache=True, inline="always")
def _holds(sorted_rows, row):
    at = np.searchsorted(sorted_rows, row)
    return at < sorted_rows.size and sorted_rows[at] == row


@njit(cache=True)
def _top_k_skipping_body(scores, blocked, masked, skip, k):
    # _top_k_masked_kernel that also passes over the rows in the ascending ``skip``, without
    # writing them into ``scores``: the threshold test still comes first, so the look-up in
    # ``skip`` runs only for the few scores that would enter the list.
    best_idx = np.empty(k, dtype=np.int64)
    best_val = np.empty(k, dtype=scores.dtype)
    count = 0
    for i in range(scores.shape[0]):
        s = scores[i]
        if count == k:
            if not (s > best_val[k - 1]):
                continue
        elif not (s > -np.inf):
            continue
        if (masked and blocked[i]) or _holds(skip, i):
            continue
        count = _insert(best_idx, best_val, count, k, s, i)
    return best_idx[:count], best_val[:count]


# scores, blocked, masked, exclude, k
_TOP_K_SKIPPING = [
    (
        read_only_type(dtype, 1),
        read_only_type(types.bool_, 1),
        types.boolean,
        read_only_type(types.int64, 1),
        types.int64,
    )
    for dtype in (types.float32, types.float64)
]


@njit(_TOP_K_SKIPPING, cache=True)
def _top_k_skipping_kernel(scores, blocked, masked, exclude, k):
    for j in range(1, exclude.size):
        if exclude[j] < exclude[j - 1]:  # the look-up needs ascending rows: sort a copy
            return _top_k_skipping_body(scores, blocked, masked, np.sort(exclude), k)
    return _top_k_skipping_body(scores, blocked, masked, exclude, k)


def top_k(
    scores: np.ndarray, k: int, exclude: np.ndarray | None = None, blocked: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Indices and values of the ``k`` largest finite-or-+inf scores, best first.

    Entries equal to ``-inf`` or NaN are never returned, nor the rows listed in
    ``exclude`` or marked True in the boolean ``blocked``. Fewer than ``k``
    results come back when fewer remain. No argument is written to: callers
    pass arrays they share (a popularity count, a memory-mapped artifact).
    """
    if k <= 0 or scores.shape[0] == 0:
        return np.empty(0, np.int64), np.empty(0, scores.dtype)
    skipping = exclude is not None and exclude.size > 0
    if k <= KERNEL_MAX_K:
        if skipping:
            mask = _NO_MASK if blocked is None else blocked
            return _top_k_skipping_kernel(scores, mask, blocked is not None, exclude, k)
        if blocked is not None:
            return _top_k_masked_kernel(scores, blocked, k)
        return _top_k_kernel(scores, k)
    # Large k is rare (bounded by the request limits): a stable full sort keeps
    # the same tie order as the kernel.
    keep = scores > -np.inf
    if blocked is not None:
        keep &= ~blocked
    if skipping:
        keep[exclude] = False
    rows = np.flatnonzero(keep)
    chosen = rows[np.lexsort((rows, -scores[rows]))[:k]]
    return chosen.astype(np.int64), scores[chosen]


# Items scored per block of the batched product: a block's rows stay in cache while every
# user of the batch reads them (a batch reads the item matrix once, not once per user).
_ROWS_PER_BLOCK = 256


# A catalogue of up to this many factors (items x width) is scored from a column-major copy.
COLUMN_MAJOR_MAX_SIZE = 1 << 20


@njit(cache=True, inline="always")
def _column_scores(matrix, vector, offset, out):
    # Column-major items: each item's sum runs over the factors in order, a vector of items at a
    # time (no reassociation to ask for, so every item's sum is the same whatever the batch).
    # Four factors a pass: the partial sums are loaded and stored a quarter as often (about a
    # quarter cheaper on ML-100K's 1,682 x 100), in the same order.
    n_items, width = matrix.shape
    for i in range(n_items):
        out[i] = 0
    j = 0
    while j + 4 <= width:
        a, b, c, d = vector[j], vector[j + 1], vector[j + 2], vector[j + 3]
        for i in range(n_items):
            acc = out[i]
            acc += matrix[i, j] * a
            acc += matrix[i, j + 1] * b
            acc += matrix[i, j + 2] * c
            acc += matrix[i, j + 3] * d
            out[i] = acc
        j += 4
    for rest in range(j, width):
        weight = vector[rest]
        for i in range(n_items):
            out[i] += matrix[i, rest] * weight
    for i in range(n_items):
        out[i] += offset


# fastmath (reassociation) lets the dot product vectorise; it must be on the
# compiled entry points, since the inlined body takes its caller's flags.
@njit(cache=True, inline="always")
def _affine_rows_body(matrix, vectors, offset):
    n_items, n_users = matrix.shape[0], vectors.shape[0]
    out = np.empty((n_users, n_items), dtype=np.float32)
    if matrix.flags.f_contiguous:  # a small catalogue's column-major copy (DCRIndex)
        for b in range(n_users):
            _column_scores(matrix, vectors[b], offset, out[b])
        return out
    for start in range(0, n_items, _ROWS_PER_BLOCK):
        stop = min(start + _ROWS_PER_BLOCK, n_items)
        for b in range(n_users):
            for i in range(start, stop):
                # The same dot product, summed in the same order, for any batch size.
                acc = np.float32(0.0)
                for j in range(matrix.shape[1]):
                    acc += matrix[i, j] * vectors[b, j]
                out[b, i] = acc + offset
    return out


_AFFINE_ROWS = [(matrix, read_only_type(types.float32, 2), types.float32) for matrix in ITEM_MATRIX_TYPES]


@njit(_AFFINE_ROWS, cache=True, fastmath=True)
def _affine_rows_holding_gil(matrix, vectors, offset):
    return _affine_rows_body(matrix, vectors, offset)


@njit(_AFFINE_ROWS, cache=True, fastmath=True, nogil=True)
def _affine_rows_releasing_gil(matrix, vectors, offset):
    return _affine_rows_body(matrix, vectors, offset)


def holds_gil(work: int) -> bool:
    """Whether a product of ``work`` multiply-adds is short enough to keep the GIL."""
    return work <= _HOLD_GIL_MAX_WORK


def affine_scores(matrix: np.ndarray, vector: np.ndarray, offset: float = 0.0) -> np.ndarray:
    """``matrix @ vector + offset`` as a new float32 array (both float32, C-contiguous):
    :func:`affine_rows` of one vector."""
    return affine_rows(matrix, vector.reshape(1, -1), offset)[0]


def affine_rows(matrix: np.ndarray, vectors: np.ndarray, offset: float = 0.0) -> np.ndarray:
    """``vectors @ matrix.T + offset``, shape ``(len(vectors), len(matrix))``, float32.

    A user's row is bitwise the same whatever else is in the batch, so a
    dynamically batched Recommend answers exactly what a call of its own would.
    """
    kernel = (
        _affine_rows_holding_gil if holds_gil(matrix.size * vectors.shape[0]) else _affine_rows_releasing_gil
    )
    return kernel(matrix, vectors, np.float32(offset))


@njit(cache=True, inline="always")
def _user_top_k_body(matrix, users, user_row, scale, offset, exclude, blocked, masked, k):
    # The user's row times the level scale, then the very product affine_rows computes for it
    # (the same inlined body), so the scores are bitwise what a batch gives this user.
    vector = (users[user_row] * scale).reshape(1, -1)
    scores = _affine_rows_body(matrix, vector, offset)[0]
    for r in exclude:
        scores[r] = -np.inf
    if masked:
        return _top_k_masked_kernel(scores, blocked, k)
    return _top_k_kernel(scores, k)


# The fused body, for kernels elsewhere that compute the very same answer and go on with it
# (``service/serving/wire.py``: compiled with FUSED_FASTMATH, it gives these scores bit for bit).
user_top_k_inline = _user_top_k_body

# The fused kernels' fastmath without "nnan"/"ninf": numba compiles the selection kernels they
# call with the caller's flags (and caches that build for every later caller), and under "ninf"
# the -inf of excluded rows compares as finite, so excluded items came back when few remained.
FUSED_FASTMATH = {"reassoc", "contract", "arcp", "nsz", "afn"}


# matrix, users, user_row, scale, offset, exclude, blocked, masked, k
_USER_TOP_K = [
    (
        matrix,
        read_only_type(types.float32, 2),
        types.int64,
        read_only_type(types.float32, 1),
        types.float32,
        read_only_type(types.int64, 1),
        read_only_type(types.bool_, 1),
        types.boolean,
        types.int64,
    )
    for matrix in ITEM_MATRIX_TYPES
]


@njit(_USER_TOP_K, cache=True, fastmath=FUSED_FASTMATH)
def _user_top_k_holding_gil(matrix, users, user_row, scale, offset, exclude, blocked, masked, k):
    return _user_top_k_body(matrix, users, user_row, scale, offset, exclude, blocked, masked, k)


@njit(_USER_TOP_K, cache=True, fastmath=FUSED_FASTMATH, nogil=True)
def _user_top_k_releasing_gil(matrix, users, user_row, scale, offset, exclude, blocked, masked, k):
    return _user_top_k_body(matrix, users, user_row, scale, offset, exclude, blocked, masked, k)


_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_MASK = np.zeros(0, dtype=np.bool_)


class UserProduct(NamedTuple):
    """The operands of :func:`user_top_k` for a model version: item ``matrix``, the raw user
    factors, the per-column ``scale`` folded into a user's row and the score ``offset``."""

    matrix: np.ndarray
    users: np.ndarray
    scale: np.ndarray
    offset: np.float32


def user_top_k(
    matrix: np.ndarray,
    users: np.ndarray,
    user_row: int,
    scale: np.ndarray,
    offset: float,
    k: int,
    exclude: np.ndarray | None = None,
    blocked: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One user's top ``k`` of ``matrix @ (users[user_row] * scale) + offset`` in one kernel
    call: the scale, the product, the exclusions and the selection that :func:`affine_rows`
    then :func:`top_k` do in three calls and a copy, with the same answer (``k`` up to 128,
    every array float32 / int64 / bool and C-contiguous)."""
    if not 0 < k <= KERNEL_MAX_K:
        raise ValueError(f"user_top_k selects 1..{KERNEL_MAX_K} items, not {k}")
    kernel = _user_top_k_holding_gil if holds_gil(matrix.size) else _user_top_k_releasing_gil
    return kernel(
        matrix,
        users,
        user_row,
        scale,
        np.float32(offset),
        _NO_ROWS if exclude is None else exclude,
        _NO_MASK if blocked is None else blocked,
        blocked is not None,
        k,
    )


@njit(
    [
        (
            read_only_type(dtype, 2),
            read_only_type(types.int64, 1),
            read_only_type(types.bool_, 1),
            types.boolean,
        )
        for dtype in (types.float32, types.float64)
    ],
    cache=True,
)
def _top_k_rows_kernel(scores, ks, blocked, masked):
    count = np.zeros(scores.shape[0], dtype=np.int64)
    best_idx = np.empty((scores.shape[0], max(1, ks.max())), dtype=np.int64)
    best_val = np.empty((scores.shape[0], max(1, ks.max())), dtype=scores.dtype)
    for b in range(scores.shape[0]):
        if masked:
            idx, val = _top_k_masked_kernel(scores[b], blocked, ks[b])
        else:
            idx, val = _top_k_kernel(scores[b], ks[b])
        count[b] = idx.size
        best_idx[b, : idx.size] = idx
        best_val[b, : idx.size] = val
    return best_idx, best_val, count


def top_k_rows(
    scores: np.ndarray, ks: np.ndarray, blocked: np.ndarray | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`top_k` of every row of ``scores`` (its own ``k`` each, one ``blocked`` mask for
    all) in one kernel call; the same answers, row by row, as :func:`top_k`."""
    ks = np.asarray(ks, dtype=np.int64)
    if scores.shape[0] == 0:
        return []
    if ks.max() > KERNEL_MAX_K or ks.min() <= 0 or scores.shape[1] == 0:
        return [top_k(row, int(k), None, blocked) for row, k in zip(scores, ks)]
    masked = blocked is not None
    mask = blocked if masked else np.zeros(0, dtype=np.bool_)
    idx, val, count = _top_k_rows_kernel(scores, ks, mask, masked)
    return [(idx[b, : count[b]], val[b, : count[b]]) for b in range(scores.shape[0])]


@njit([(read_only_type(types.float64, 2), read_only_type(types.float64, 1))], cache=True)
def _negative_squared_distances(coords, point):
    out = np.empty(coords.shape[0], dtype=np.float64)
    for i in range(coords.shape[0]):
        acc = 0.0
        for j in range(coords.shape[1]):
            d = coords[i, j] - point[j]
            acc += d * d
        out[i] = -acc
    return out


def nearest_brute_force(
    coords: np.ndarray, point: np.ndarray, k: int, exclude: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` rows of ``coords`` (float64) nearest ``point``, as (rows, negative distances).

    One pass holding the GIL: on small maps it is cheaper than a KD-tree
    query, which releases the GIL. Ties: lower row first.
    """
    scores = _negative_squared_distances(coords, np.ascontiguousarray(point, dtype=np.float64))
    rows, neg_sq = top_k(scores, k, exclude)
    return rows, (-np.sqrt(-neg_sq)).astype(np.float32)


def warm_up() -> None:
    """Compile (or load from cache) the selection kernels, which compile lazily, one build per
    argument type, for the scores a request passes them. The kernels a request calls from
    Python are declared with read-only array types (writable arrays convert to those) and
    built at import, with the selection builds they call."""
    for dtype in (np.float32, np.float64):
        scores = np.zeros(4, dtype=dtype)
        _top_k_kernel(scores, 2)
        _top_k_masked_kernel(scores, np.zeros(4, dtype=np.bool_), 2)


def kernel_signatures(namespace: dict) -> dict[str, int]:
    """How many argument-type signatures each kernel in a module's ``namespace`` has compiled:
    what its ``warm_up`` covered, so a check can tell that a request compiles nothing more."""
    return {name: len(value.signatures) for name, value in namespace.items() if isinstance(value, Dispatcher)}


def compiled_signatures() -> dict[str, int]:
    """:func:`kernel_signatures` of this module."""
    return kernel_signatures(globals())
