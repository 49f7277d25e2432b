"""Interactions (clicks, plays, purchases) as data the ratings models take.

Three steps the readers and the fit entry points share:

- :func:`aggregate` folds repeated (user, item) records into one row: the
  strength is the number of records or the sum of a strength column, the time
  the latest timestamp. Two numba passes over the records, no sort: 8 bytes a
  record beside the input, and one row's worth of output per distinct pair;
- :func:`check_levels` refuses an explicit rating column with more distinct
  values than :data:`MAX_RATING_LEVELS` (a play count read as a rating would
  become thousands of ordinal levels and exhaust memory in the fit);
- :func:`ordinal_levels` maps implicit strengths to at most
  :data:`IMPLICIT_LEVELS` ordinal levels per user (quantiles), so DCR and COE
  train on interactions until they learn from the strength itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numba import njit

from ordrec.trainer.data.line_kernels import counting_order
from ordrec.trainer.data.types import DataError, Ratings, excerpt

#: An explicit rating column with more distinct values than this is refused (before any fit).
MAX_RATING_LEVELS = 32
#: The ordinal levels implicit strengths become (per-user quantiles), 1 (weakest) .. this.
IMPLICIT_LEVELS = 5
_LEVELS_OF = "levels of "  # how ``Ratings.strength`` names strengths mapped to levels


# ------------------------------------------------------------------ repeats
@dataclass
class Aggregated:
    """One row per distinct (user, item), in order of first appearance."""

    user: np.ndarray  # int32
    item: np.ndarray  # int32
    strength: np.ndarray  # float32: records, or the strength column summed
    time: np.ndarray | None  # int64: the latest timestamp of the pair
    repeats: int  # records folded into an earlier one


@njit(cache=True)
def _first_records(order, user, item, n_items, head):
    """``head[k]``: the first record (in file order) of record ``k``'s (user, item) pair,
    visiting records grouped by user (``order``); returns the number of distinct pairs."""
    last_user = np.full(n_items, -1, dtype=np.int32)
    first = np.empty(n_items, dtype=np.int64)
    pairs = 0
    for idx in range(order.shape[0]):
        k = order[idx]
        v = item[k]
        if last_user[v] == user[k]:
            head[k] = first[v]
        else:
            last_user[v] = user[k]
            first[v] = k
            head[k] = k
            pairs += 1
    return pairs


@njit(cache=True)
def _fold(head, user, item, strength, time, out_user, out_item, out_strength, out_time):
    """Fold every record into its pair's row (rows numbered by first record); ``head`` is
    overwritten with each record's row. ``strength``/``time`` of size 0: count / no time."""
    rows = 0
    for k in range(head.shape[0]):
        if head[k] == k:
            row = rows
            rows += 1
            out_user[row] = user[k]
            out_item[row] = item[k]
            out_strength[row] = 0.0
            if time.shape[0]:
                out_time[row] = time[k]
        else:
            row = head[head[k]]  # the first record comes earlier: already holds its row
        head[k] = row
        out_strength[row] += strength[k] if strength.shape[0] else 1.0
        if time.shape[0] and time[k] > out_time[row]:
            out_time[row] = time[k]


def aggregate(
    user: np.ndarray,
    item: np.ndarray,
    n_users: int,
    n_items: int,
    strength: np.ndarray | None = None,
    time: np.ndarray | None = None,
) -> Aggregated:
    """Repeated (user, item) records folded into one row each (see :class:`Aggregated`)."""
    n = user.shape[0]
    index = np.int32 if n < 2**31 else np.int64
    order = np.empty(n, dtype=index)
    counting_order(user, max(n_users, 1), order)
    head = np.empty(n, dtype=index)
    pairs = _first_records(order, user, item, max(n_items, 1), head)
    del order
    out_user = np.empty(pairs, dtype=np.int32)
    out_item = np.empty(pairs, dtype=np.int32)
    out_strength = np.empty(pairs, dtype=np.float64)
    out_time = np.empty(pairs if time is not None else 0, dtype=np.int64)
    _fold(
        head,
        user,
        item,
        np.empty(0, np.float64) if strength is None else strength.astype(np.float64, copy=False),
        np.empty(0, np.int64) if time is None else time,
        out_user,
        out_item,
        out_strength,
        out_time,
    )
    return Aggregated(
        out_user, out_item, out_strength.astype(np.float32), out_time if time is not None else None, n - pairs
    )


# ------------------------------------------------------------------ levels
@njit(cache=True)
def _more_values_than(values, limit):
    """Whether ``values`` (uint32 bit patterns) hold more than ``limit`` distinct ones; stops
    at the first value past the limit, so a long column of a few levels costs one pass."""
    seen = np.empty(limit + 1, dtype=np.uint32)
    count = 0
    for k in range(values.shape[0]):
        v = values[k]
        known = False
        for j in range(count):
            if seen[j] == v:
                known = True
                break
        if not known:
            if count == limit:
                return True
            seen[count] = v
            count += 1
    return False


def check_levels(rating: np.ndarray, path: str, column: str, limit: int = MAX_RATING_LEVELS) -> None:
    """Refuse an explicit rating column of more than ``limit`` distinct values, naming the file,
    the column, the count and the fixes (read it as interactions, or declare the scale)."""
    values = np.ascontiguousarray(rating, dtype=np.float32)
    if not _more_values_than(values.view(np.uint32), limit):
        return
    distinct = np.unique(values).size
    raise DataError(
        path,
        None,
        f"column {excerpt(column)} holds {distinct} distinct values, more than the {limit} rating levels"
        " a ratings model can take (each value would be an ordinal level). A count such as plays"
        " or purchases is not a rating: read it as interactions (--feedback implicit, or"
        ' feedback = "implicit" in a job\'s [data.<name>] table), or, if these are ratings,'
        " declare the scale with --rating-scale LOW..HIGH[:STEP]",
    )


@njit(cache=True)
def _user_quantile_levels(order, user, value, n_levels, out):
    """``out[k]``: record ``k``'s level 1..n_levels, its strength's mid-rank quantile among
    its user's records (``order`` groups records by user; ties share a level)."""
    n = order.shape[0]
    start = 0
    while start < n:
        u = user[order[start]]
        stop = start
        while stop < n and user[order[stop]] == u:
            stop += 1
        rows = order[start:stop]
        ranked = np.sort(value[rows])
        count = stop - start
        for r in range(count):
            v = value[rows[r]]
            below = np.searchsorted(ranked, v, side="left")
            upto = np.searchsorted(ranked, v, side="right")
            quantile = (below + 0.5 * (upto - below)) / count
            out[rows[r]] = 1 + min(n_levels - 1, int(quantile * n_levels))
        start = stop


def ordinal_levels(data: Ratings, n_levels: int = IMPLICIT_LEVELS) -> Ratings:
    """Implicit ``data`` with each strength replaced by its level 1..``n_levels``: the
    quantile of the strength among the user's own interactions (the user's strongest fifth
    is level 5, a user's single interaction the middle level). Explicit data is returned as
    it is."""
    if not data.implicit or data.strength.startswith(_LEVELS_OF):  # already levels
        return data
    order = np.empty(len(data), dtype=np.int32 if len(data) < 2**31 else np.int64)
    counting_order(data.user, max(data.n_users, 1), order)
    levels = np.empty(len(data), dtype=np.float32)
    _user_quantile_levels(order, data.user, data.rating, n_levels, levels)
    return replace(data, rating=levels, strength=_LEVELS_OF + data.strength)


def trainable(data):
    """``data`` as the ordinal models fit it, and a line saying what was done (None: nothing).

    Implicit ratings become their per-user levels (:func:`ordinal_levels`); any other
    input passes unchanged.
    """
    if not isinstance(data, Ratings) or not data.implicit:
        return data, None
    what = "records" if data.strength == "rows" else f"{data.strength!r} summed"
    note = (
        f"implicit feedback, {len(data)} (user, item) rows, strength = {what} per (user, item);"
        f" fitted as levels 1..{IMPLICIT_LEVELS}, each strength's quantile among its user's interactions"
    )
    return ordinal_levels(data), note
