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

from ordrec.trainer.data.types import on_scale

_on_scale = njit(cache=True, inline="always")(on_scale)  # the per-line parser's own check
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


@njit(cache=True, inline="always")
def _scan_field(buf, p, end, sep0, sep1, no_quotes):
    """The field that starts at byte ``p``: ``(q, field_end, at_eol)`` where ``q``
    is the separator or newline that ends it and ``field_end`` excludes a CR
    before a newline; ``q = -1`` when a quote means the fast path must give up."""
    q = p
    while q < end:
        c = buf[q]
        if c == 10:
            break
        if c == sep0 and (sep1 == 0 or (q + 1 < end and buf[q + 1] == sep1)):
            break
        if c == 34 and no_quotes:
            return -1, 0, False
        q += 1
    at_eol = q >= end or buf[q] == 10
    field_end = q
    if at_eol and field_end > p and buf[field_end - 1] == 13:
        field_end -= 1
    return q, field_end, at_eol


@njit(cache=True)
def _parse_number(buf, start, end, integer):
    """``[-]digits[.digits]`` in buf[start:end] as (ok, value); ``[-]digits`` only when ``integer``.

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
        if frac == 0 or integer:
            return False, 0.0
    if p != end or digits > _MAX_NUMBER_DIGITS:
        return False, 0.0
    value = mantissa / (10.0**frac)
    return True, -value if negative else value


@njit(cache=True)
def _allowed(number, field, num_scale):
    """Whether ``number`` lies on field ``field``'s scale (``num_scale[field]``: low, high, step; step 0: any)."""
    step = num_scale[field, 2]
    return step == 0 or _on_scale(number, num_scale[field, 0], num_scale[field, 1], step)


@njit(cache=True)
def _is_timestamp(buf, start, end, most):
    """1 to ``most`` ASCII digits in buf[start:end] (the per-line parser's timestamp rule)."""
    if end - start < 1 or end - start > most:
        return False
    for t in range(start, end):
        if buf[t] < 48 or buf[t] > 57:
            return False
    return True


@njit(cache=True)
def parse_numeric_lines(
    buf,
    n_fields,
    sep0,
    sep1,
    no_quotes,
    id_slot,
    num_slot,
    num_int,
    num_scale,
    digits_max,
    max_line,
    out_ids,
    out_num,
):
    """Parse whole lines of ``buf`` (uint8, ends with a newline).

    Parameters
    ----------
    buf : uint8 array
        Whole lines; ``\\n`` or ``\\r\\n`` endings.
    n_fields : int
        Fields every line must have.
    sep0, sep1 : int
        Separator bytes; ``sep1 == 0`` for a one-byte separator (``::`` is 58, 58).
    no_quotes : bool
        Give up at a line holding ``"`` (comma files may quote fields, and a
        quoted comma changes the field count).
    id_slot, num_slot : int64 arrays of length ``n_fields``
        For field f, the column of ``out_ids`` (canonical integer id) or of
        ``out_num`` (decimal number) it goes to, or -1 to ignore the field.
    num_int : int64 array of length ``n_fields``
        1 where the number must be an integer (``int(text)`` rejects "1.0").
    num_scale : float64 array (n_fields, 3)
        ``low, high, step`` of a number field's scale; step 0 for none.
    digits_max : int64 array of length ``n_fields``
        For a field that must be 1 to ``digits_max`` ASCII digits (a
        timestamp), that bound; 0 for other fields.
    max_line : int
        Give up at a line of more bytes (before its ``\\n``).
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
            q, field_end, at_eol = _scan_field(buf, p, end, sep0, sep1, no_quotes)
            if q < 0:
                return row, line_start
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
                ok, number = _parse_number(buf, p, field_end, num_int[field] != 0)
                if not ok or not _allowed(number, field, num_scale):
                    return row, line_start
                out_num[row, s] = number
            if digits_max[field] > 0 and not _is_timestamp(buf, p, field_end, digits_max[field]):
                return row, line_start
            field += 1
            if at_eol:
                if q - line_start > max_line:
                    return row, line_start
                p = q + 1
                break
            p = q + step
        if field != n_fields:
            return row, line_start
        row += 1
    return row, -1


@njit(cache=True)
def parse_text_lines(
    buf,
    n_fields,
    sep0,
    sep1,
    no_quotes,
    strip_tab,
    id_slot,
    num_slot,
    num_int,
    num_scale,
    digits_max,
    max_line,
    out_start,
    out_end,
    out_num,
):
    """Like :func:`parse_numeric_lines`, but ids may be any text: their byte ranges are returned.

    An id field is stripped of spaces (and of tabs when ``strip_tab``) at both
    ends, exactly as the per-line parser strips it. The kernel gives up on an
    empty id, an id holding an ASCII control byte (the per-line parser reports
    those), and, with ``no_quotes``, on any ``"``. Non-ASCII bytes are kept;
    the caller decodes each distinct id once and checks it.

    ``out_start[row, slot]`` / ``out_end[row, slot]`` receive the id's byte range.
    """
    end = buf.shape[0]
    step = 1 if sep1 == 0 else 2
    row = 0
    p = 0
    while p < end:
        line_start = p
        field = 0
        while True:
            q, field_end, at_eol = _scan_field(buf, p, end, sep0, sep1, no_quotes)
            if q < 0:
                return row, line_start
            if field >= n_fields:
                return row, line_start
            s = id_slot[field]
            if s >= 0:
                a = p
                b = field_end
                while a < b and (buf[a] == 32 or (strip_tab and buf[a] == 9)):
                    a += 1
                while b > a and (buf[b - 1] == 32 or (strip_tab and buf[b - 1] == 9)):
                    b -= 1
                if a == b:
                    return row, line_start
                for t in range(a, b):
                    if buf[t] < 32 or buf[t] == 127:
                        return row, line_start
                out_start[row, s] = a
                out_end[row, s] = b
            s = num_slot[field]
            if s >= 0:
                ok, number = _parse_number(buf, p, field_end, num_int[field] != 0)
                if not ok or not _allowed(number, field, num_scale):
                    return row, line_start
                out_num[row, s] = number
            if digits_max[field] > 0 and not _is_timestamp(buf, p, field_end, digits_max[field]):
                return row, line_start
            field += 1
            if at_eol:
                if q - line_start > max_line:
                    return row, line_start
                p = q + 1
                break
            p = q + step
        if field != n_fields:
            return row, line_start
        row += 1
    return row, -1


@njit(cache=True)
def _fnv1a(buf, start, end):
    h = np.uint64(14695981039346656037)
    prime = np.uint64(1099511628211)
    for p in range(start, end):
        h = (h ^ np.uint64(buf[p])) * prime
    return h


@njit(cache=True)
def intern_ids(buf, starts, ends, slots, uhash, arena, offsets, n_unique, rows):
    """Number byte strings in order of first appearance with an open-addressing hash table.

    Parameters
    ----------
    buf : uint8 array
    starts, ends : int64 arrays (n, k)
        Byte ranges of the ids; visited row by row, columns in order (the
        per-line parser's order), so the k columns share one id space.
    slots : int32 array, power-of-two length
        Hash table of unique-id numbers (-1 empty).
    uhash : uint64 array; arena : uint8 array; offsets : int64 array
        Per unique id its hash, and its bytes ``arena[offsets[u]:offsets[u + 1]]``.
    n_unique : int
        Ids known so far (the state carries over between chunks).
    rows : int32 array (n, k)
        Receives each id's number.

    Returns
    -------
    (n_unique, slots, uhash, arena, offsets) : the state, grown when needed.
    Equality is decided on the bytes, never on the hash alone.
    """
    n, k = starts.shape
    mask = np.uint64(slots.shape[0] - 1)
    for r in range(n):
        for j in range(k):
            a = starts[r, j]
            b = ends[r, j]
            h = _fnv1a(buf, a, b)
            i = h & mask
            found = -1
            while True:
                u = slots[i]
                if u < 0:
                    break
                if uhash[u] == h and offsets[u + 1] - offsets[u] == b - a:
                    o = offsets[u]
                    same = True
                    for t in range(b - a):
                        if arena[o + t] != buf[a + t]:
                            same = False
                            break
                    if same:
                        found = u
                        break
                i = (i + np.uint64(1)) & mask
            if found >= 0:
                rows[r, j] = found
                continue
            if n_unique + 2 > uhash.shape[0]:
                grown_hash = np.empty(uhash.shape[0] * 2, dtype=np.uint64)
                grown_hash[: uhash.shape[0]] = uhash
                uhash = grown_hash
                grown_offsets = np.zeros(offsets.shape[0] * 2, dtype=np.int64)
                grown_offsets[: offsets.shape[0]] = offsets
                offsets = grown_offsets
            need = offsets[n_unique] + (b - a)
            if need > arena.shape[0]:
                grown_arena = np.empty(max(arena.shape[0] * 2, need), dtype=np.uint8)
                grown_arena[: arena.shape[0]] = arena
                arena = grown_arena
            o = offsets[n_unique]
            for t in range(b - a):
                arena[o + t] = buf[a + t]
            offsets[n_unique + 1] = need
            uhash[n_unique] = h
            slots[i] = n_unique
            rows[r, j] = n_unique
            n_unique += 1
            if 2 * n_unique > slots.shape[0]:
                slots = np.full(slots.shape[0] * 2, -1, dtype=np.int32)
                mask = np.uint64(slots.shape[0] - 1)
                for u in range(n_unique):
                    i = uhash[u] & mask
                    while slots[i] >= 0:
                        i = (i + np.uint64(1)) & mask
                    slots[i] = u
    return n_unique, slots, uhash, arena, offsets


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
