"""Numba kernel for the fast path of the line readers.

One pass over a chunk of raw bytes that holds whole lines of a delimited
file whose interesting fields are plain numbers. It gives up (returns the
byte offset of the line) at the first thing it is not sure about, so the
caller can fall back to the exact per-line parser, which is the authority on
what is an error. Whatever this kernel accepts, the per-line parser accepts
with the same result.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_MAX_ID_DIGITS = 18  # stays below 2**63
_MAX_NUMBER_DIGITS = 15  # mantissa < 2**53, so mantissa / 10**k is correctly rounded


@njit(cache=True)
def _parse_id(buf, start, end):
    """Canonical non-negative decimal integer in buf[start:end], or -1.

    Canonical means the text is exactly ``str(value)``: no sign, no leading
    zero, no space, so the external id string is recovered by ``str``.
    """
    n = end - start
    if n < 1 or n > _MAX_ID_DIGITS:
        return -1
    if n > 1 and buf[start] == 48:
        return -1
    value = 0
    for p in range(start, end):
        c = buf[p]
        if c < 48 or c > 57:
            return -1
        value = value * 10 + (c - 48)
    return value


@njit(cache=True)
def _parse_number(buf, start, end):
    """``[-]digits[.digits]`` in buf[start:end] as (ok, value).

    The value equals Python's ``float(text)``: the mantissa is an exact
    integer below 2**53 and 10**k is exact, so the one division is correctly
    rounded.
    """
    p = start
    negative = False
    if p < end and buf[p] == 45:
        negative = True
        p += 1
    mantissa = 0
    digits = 0
    frac = 0
    int_digits = 0
    while p < end and 48 <= buf[p] <= 57:
        mantissa = mantissa * 10 + (buf[p] - 48)
        digits += 1
        int_digits += 1
        p += 1
    if int_digits == 0:
        return False, 0.0
    if p < end and buf[p] == 46:
        p += 1
        while p < end and 48 <= buf[p] <= 57:
            mantissa = mantissa * 10 + (buf[p] - 48)
            digits += 1
            frac += 1
            p += 1
        if frac == 0:
            return False, 0.0
    if p != end or digits > _MAX_NUMBER_DIGITS:
        return False, 0.0
    value = mantissa / (10.0 ** frac)
    return True, -value if negative else value


@njit(cache=True)
def parse_numeric_lines(buf, n_fields, sep0, sep1, id_slot, num_slot, out_ids, out_num):
    """Parse whole lines of ``buf`` (uint8, ends with a newline).

    Parameters
    ----------
    buf : uint8 array
        Whole lines; ``\\n`` or ``\\r\\n`` endings.
    n_fields : int
        Fields every line must have.
    sep0, sep1 : int
        Separator bytes; ``sep1 == 0`` for a one-byte separator (``::`` is 58, 58).
    id_slot, num_slot : int64 arrays of length ``n_fields``
        For field f, the column of ``out_ids`` (canonical integer id) or of
        ``out_num`` (decimal number) it goes to, or -1 to ignore the field.
    out_ids : int64 array (rows, n_id_columns)
    out_num : float64 array (rows, n_number_columns)

    Returns
    -------
    (rows, bail) : rows parsed; ``bail`` is -1 when every line parsed, else
    the byte offset of the first line the kernel did not accept.
    """
    end = buf.shape[0]
    step = 1 if sep1 == 0 else 2
    row = 0
    p = 0
    while p < end:
        line_start = p
        field = 0
        while True:
            q = p
            while q < end:
                c = buf[q]
                if c == 10:
                    break
                if c == sep0 and (sep1 == 0 or (q + 1 < end and buf[q + 1] == sep1)):
                    break
                q += 1
            at_eol = q >= end or buf[q] == 10
            field_end = q
            if at_eol and field_end > p and buf[field_end - 1] == 13:
                field_end -= 1
            if field >= n_fields:
                return row, line_start
            s = id_slot[field]
            if s >= 0:
                value = _parse_id(buf, p, field_end)
                if value < 0:
                    return row, line_start
                out_ids[row, s] = value
            s = num_slot[field]
            if s >= 0:
                ok, number = _parse_number(buf, p, field_end)
                if not ok:
                    return row, line_start
                out_num[row, s] = number
            field += 1
            if at_eol:
                p = q + 1
                break
            p = q + step
        if field != n_fields:
            return row, line_start
        row += 1
    return row, -1


@njit(cache=True)
def first_appearance_dense(column, max_value):
    """First-appearance numbering of non-negative integers ``<= max_value`` with a lookup table.

    Returns ``(unique values in order of first appearance, int32 rows)``;
    one pass, no sort.
    """
    table = np.full(max_value + 1, -1, dtype=np.int32)
    rows = np.empty(column.shape[0], dtype=np.int32)
    order = np.empty(column.shape[0], dtype=np.int64)
    n = 0
    for k in range(column.shape[0]):
        v = column[k]
        r = table[v]
        if r < 0:
            r = n
            table[v] = n
            order[n] = v
            n += 1
        rows[k] = r
    return order[:n].copy(), rows


@njit(cache=True)
def grouped_duplicates(group, value, n_groups, n_values):
    """Records whose ``(group, value)`` repeats an earlier record's, without sorting.

    A stable counting sort by ``group`` visits each group's records in file
    order; ``last_group[v]`` remembers which group last used value ``v`` and
    ``first[v]`` the record that did. Returns ``(later, earlier)`` record
    indices, ``earlier`` being the first record with the same pair.
    """
    n = group.shape[0]
    start = np.zeros(n_groups + 1, dtype=np.int64)
    for k in range(n):
        start[group[k] + 1] += 1
    for g in range(n_groups):
        start[g + 1] += start[g]
    order = np.empty(n, dtype=np.int64)
    for k in range(n):
        g = group[k]
        order[start[g]] = k
        start[g] += 1
    last_group = np.full(n_values, -1, dtype=np.int32)
    first = np.empty(n_values, dtype=np.int64)
    later = np.empty(n, dtype=np.int64)
    earlier = np.empty(n, dtype=np.int64)
    m = 0
    for idx in range(n):
        k = order[idx]
        g = group[k]
        v = value[k]
        if last_group[v] == g:
            later[m] = k
            earlier[m] = first[v]
            m += 1
        else:
            last_group[v] = g
            first[v] = k
    return later[:m].copy(), earlier[:m].copy()


# Lookup tables (entries) the kernels above may allocate beyond two per record;
# larger id or value ranges take the sort-based path instead.
DENSE_LIMIT = 1 << 22


def first_appearance(column: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique values of a non-negative integer column in order of first appearance, and the column as rows.

    Vectorised equivalent of ``IdMap.from_values`` for integer ids: a lookup
    table when the values are small enough (MovieLens, Last.fm), else a sort.
    """
    if column.size == 0:
        return column[:0].astype(np.int64), np.empty(0, dtype=np.int32)
    top = int(column.max())
    if top < column.size * 2 + DENSE_LIMIT:
        return first_appearance_dense(column, top)
    unique, first, inverse = np.unique(column, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(order.size, dtype=np.int32)
    rank[order] = np.arange(order.size, dtype=np.int32)
    return unique[order], rank[inverse.ravel()]
