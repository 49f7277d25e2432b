"""Interactions (clicks, plays, purchases) as data the ratings models take.

Three steps the readers and the fit entry points share:

- :func:`aggregate` folds repeated (user, item) records into one row: the
  strength is the number of records or the sum of a strength column, the time
  the latest timestamp. Two numba passes over the records, no sort: 8 bytes a
  record beside the input, and one row's worth of output per distinct pair;
- :func:`check_levels` refuses an explicit rating column with more distinct
  values than :data:`MAX_RATING_LEVELS` (a play count read as a rating would
  become thousands of ordinal levels and exhaust memory in the fit);
- :func:`ordinal_levels` maps implicit strengths to ordinal levels by a
  :class:`LevelMapping` (per-user quantiles, log bins, or once / repeatedly; the
  number of levels a setting), which a version's manifest records
  (:data:`LEVELS_ATTRIBUTE`) and ``reproduce topn`` chooses on validation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numba import njit

from ordrec.trainer.data.line_kernels import counting_order
from ordrec.trainer.data.types import DataError, Ratings, excerpt

#: An explicit rating column with more distinct values than this is refused (before any fit).
MAX_RATING_LEVELS = 32
#: The default number of ordinal levels implicit strengths become, 1 (weakest) .. this.
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


@dataclass(frozen=True)
class LevelMapping:
    """How implicit strengths become the ordinal levels 1..``levels`` the models fit.

    ``quantile``: the strength's mid-rank quantile among its user's interactions (a user's
    strongest share is the top level, a lone interaction the middle one); ``log``: log bins of
    the strength, ``1 + floor(log2(strength))`` capped at ``levels`` (1, 2-3, 4-7, ... plays);
    ``repeat``: "picked once < picked repeatedly", ``floor(strength)`` capped at ``levels``
    (2 levels: once, more than once). Every mapping is monotone in the strength and gives
    equal strengths of a user equal levels.
    """

    scheme: str = "quantile"
    levels: int = IMPLICIT_LEVELS

    def __post_init__(self):
        if self.scheme not in LEVEL_SCHEMES or not 1 <= self.levels <= MAX_RATING_LEVELS:
            raise ValueError(
                f"level mapping {self.scheme}:{self.levels}: scheme one of {LEVEL_SCHEMES},"
                f" levels 1..{MAX_RATING_LEVELS}"
            )

    @classmethod
    def parse(cls, text: str) -> LevelMapping:
        """``"scheme:count"`` (``"log:4"``), or a scheme alone with the default count."""
        scheme, _, count = text.partition(":")
        if count and not count.isdigit():
            raise ValueError(f"{text!r}: expected SCHEME[:LEVELS], SCHEME one of {LEVEL_SCHEMES}")
        return cls(scheme, int(count) if count else IMPLICIT_LEVELS)

    def __str__(self) -> str:
        return f"{self.scheme}:{self.levels}"

    def describe(self) -> str:
        """One line for logs and notes: what the levels mean."""
        return {
            "quantile": f"levels 1..{self.levels}, each strength's quantile among its user's interactions",
            "log": f"levels 1..{self.levels}, 1 + floor(log2(strength)) capped",
            "repeat": f"levels 1..{self.levels}, picked once < picked repeatedly (floor(strength) capped)",
        }[self.scheme]

    def as_attribute(self, strength: str) -> dict:
        """What a version's manifest records (``attributes[LEVELS_ATTRIBUTE]``)."""
        return {"scheme": self.scheme, "levels": self.levels, "strength": strength}


#: The mappings, and the manifest attribute a version fitted on levels records its mapping in.
LEVEL_SCHEMES = ("quantile", "log", "repeat")
LEVELS_ATTRIBUTE = "implicit_levels"
DEFAULT_MAPPING = LevelMapping()
#: The level mappings chosen among on validation (``reproduce topn``, the settings tuner), the
#: first the default; mappings that give a training part the same order of levels fit alike.
LEVEL_GRID = ("quantile:5", "quantile:3", "log:5", "log:3", "repeat:2")


def _quantile_levels(data: Ratings, n_levels: int) -> np.ndarray:
    order = np.empty(len(data), dtype=np.int32 if len(data) < 2**31 else np.int64)
    counting_order(data.user, max(data.n_users, 1), order)
    levels = np.empty(len(data), dtype=np.float32)
    _user_quantile_levels(order, data.user, data.rating, n_levels, levels)
    return levels


def strength_levels(data: Ratings, mapping: LevelMapping) -> np.ndarray:
    """Each row's level 1..``mapping.levels`` (float32) from its strength ``data.rating``."""
    if mapping.scheme == "quantile":
        return _quantile_levels(data, mapping.levels)
    strength = np.maximum(data.rating.astype(np.float64), 1.0)  # below one pick: the lowest level
    raw = 1.0 + np.floor(np.log2(strength)) if mapping.scheme == "log" else np.floor(strength)
    return np.clip(raw, 1, mapping.levels).astype(np.float32)


def distinct_mappings(data: Ratings, candidates: tuple[str, ...]) -> tuple[str, ...]:
    """The ``candidates`` whose levels order ``data``'s interactions differently (the first of
    each group kept): mappings giving the same order of levels fit the same model."""
    kept: dict[bytes, str] = {}
    for text in candidates:
        levels = strength_levels(data, LevelMapping.parse(text))
        order = np.unique(levels, return_inverse=True)[1].astype(np.int32)
        kept.setdefault(order.tobytes(), text)
    return tuple(kept.values())


def ordinal_levels(data: Ratings, mapping: LevelMapping = DEFAULT_MAPPING) -> Ratings:
    """Implicit ``data`` with each strength replaced by its level (:class:`LevelMapping`; by
    default the per-user quantile, 1..5). Explicit data, or data already mapped, is returned
    as it is."""
    if not data.implicit or data.levels:
        return data
    levels = strength_levels(data, mapping)
    return replace(data, rating=levels, strength=_LEVELS_OF + data.strength, levels=str(mapping))


def levels_attribute(data) -> dict | None:
    """The manifest's record of how ``data``'s strengths became levels (None: not mapped)."""
    if not isinstance(data, Ratings) or not data.levels:
        return None
    return LevelMapping.parse(data.levels).as_attribute(data.strength.removeprefix(_LEVELS_OF))


def trainable(data, mapping: LevelMapping = DEFAULT_MAPPING):
    """``data`` as the ordinal models fit it, and a line saying what was done (None: nothing).

    Implicit ratings become levels (:func:`ordinal_levels` with ``mapping``); any other
    input passes unchanged.
    """
    if not isinstance(data, Ratings) or not data.implicit:
        return data, None
    return ordinal_levels(
        data, mapping
    ), f"{implicit_note(data)}; fitted as {mapping.scheme} {mapping.describe()}"


def implicit_note(data: Ratings) -> str:
    """What implicit ``data`` holds, for the fit log: its rows and what their strength is."""
    what = "records" if data.strength == "rows" else f"{data.strength!r} summed"
    return f"implicit feedback, {len(data)} (user, item) rows, strength = {what} per (user, item)"
