"""Numba kernels of the line readers' fast path (:mod:`trainer.data.lines`).

One pass over a chunk of raw bytes that holds whole lines of a delimited
file: fields split, ids returned as byte ranges, numbers parsed. It gives up
(returns the byte offset of the line) at the first thing it is not sure
about, so the caller can judge that line by the per-line rules, which are
the authority on what is an error. Whatever this kernel accepts, the
per-line parser accepts with the same result. Then: ids interned in order of
first appearance, and repeated pairs found without sorting.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ordrec.trainer.data.types import on_scale

_on_scale = njit(cache=True, inline="always")(on_scale)  # the per-line parser's own check
_MAX_NUMBER_DIGITS = 15  # mantissa < 2**53, so mantissa / 10**k is correctly rounded
_MAX_STAMP_DIGITS = 18  # below 10**18 every digit string fits an int64; longer ones go to the per-line rule


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


@njit(cache=True, inline="always")
def _parse_digits(buf, start, end):
    """The ASCII digits buf[start:end] (at most :data:`_MAX_STAMP_DIGITS`) as an int64."""
    value = 0
    for t in range(start, end):
        value = value * 10 + (buf[t] - 48)
    return value


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
    stamp_slot,
    max_line,
    out_start,
    out_end,
    out_num,
    out_stamp,
):
    """Parse whole lines of ``buf`` (uint8, ends with a newline); ids may be any text.

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
    strip_tab : bool
        Strip tabs as well as spaces around an id (not in tab-separated files).
    id_slot, num_slot : int64 arrays of length ``n_fields``
        For field f, the column of ``out_start``/``out_end`` (an id) or of
        ``out_num`` (a decimal number) it goes to, or -1 to ignore the field.
    num_int : int64 array of length ``n_fields``
        1 where the number must be an integer (``int(text)`` rejects "1.0").
    num_scale : float64 array (n_fields, 3)
        ``low, high, step`` of a number field's scale; step 0 for none.
    digits_max : int64 array of length ``n_fields``
        For a field that must be 1 to ``digits_max`` ASCII digits (a
        timestamp), that bound; 0 for other fields.
    stamp_slot : int64 array of length ``n_fields``
        For a timestamp field that is kept, the column of ``out_stamp`` it goes
        to (-1: checked only). A kept timestamp of more than 18 digits is left
        to the per-line parser (it may not fit an int64).
    max_line : int
        Give up at a line of more bytes (before its ``\\n``).
    out_start, out_end : int64 arrays (rows, n_id_columns)
        Receive each id's byte range, stripped of spaces (and tabs when
        ``strip_tab``) exactly as the per-line parser strips it.
    out_num : float64 array (rows, n_number_columns)
    out_stamp : int64 array (rows, n_kept_timestamps)

    The kernel gives up on an empty id, an id holding an ASCII control byte
    (the per-line parser reports those), with ``no_quotes`` on any ``"``,
    and on a number other than ``[-]d+[.d+]`` of at most 15 digits. Non-ASCII
    bytes are kept; the caller decodes each distinct id once and checks it.

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
            if digits_max[field] > 0:
                if not _is_timestamp(buf, p, field_end, digits_max[field]):
                    return row, line_start
                s = stamp_slot[field]
                if s >= 0:
                    if field_end - p > _MAX_STAMP_DIGITS:
                        return row, line_start
                    out_stamp[row, s] = _parse_digits(buf, p, field_end)
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
def _count_starts(keys, n_keys):
    """Where each key's run starts in a counting sort of ``keys`` (``n_keys + 1`` offsets)."""
    start = np.zeros(n_keys + 1, dtype=np.int64)
    for k in range(keys.shape[0]):
        start[keys[k] + 1] += 1
    for g in range(n_keys):
        start[g + 1] += start[g]
    return start


@njit(cache=True)
def counting_order(keys, n_keys, out):
    """``out`` receives the positions ``0..n-1`` ordered by ``keys`` (non-negative, below
    ``n_keys``), ties in position order: a stable argsort in one pass."""
    start = _count_starts(keys, n_keys)
    for k in range(keys.shape[0]):
        g = keys[k]
        out[start[g]] = k
        start[g] += 1


@njit(cache=True)
def counting_reorder(keys, n_keys, rows, out):
    """``out`` receives ``rows`` ordered by ``keys[rows]``, ties in their order in ``rows``."""
    start = _count_starts(keys, n_keys)
    for k in range(rows.shape[0]):
        g = keys[rows[k]]
        out[start[g]] = rows[k]
        start[g] += 1


def grouped_duplicates(
    group: np.ndarray, value: np.ndarray, n_groups: int, n_values: int
) -> tuple[np.ndarray, np.ndarray]:
    """Records whose ``(group, value)`` repeats an earlier record's, without sorting.

    A stable counting sort by ``group`` visits each group's records in file
    order; ``last_group[v]`` remembers which group last used value ``v`` and
    ``first[v]`` the record that did. Returns ``(later, earlier)`` record
    indices, ``earlier`` being the first record with the same pair. The visit
    order is int32 below 2**31 records, and the outputs are sized by a first
    counting pass (repeats are rare): 4 bytes per record beside the input.
    """
    n = group.shape[0]
    order = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
    counting_order(group, n_groups, order)
    m = _visit_repeats(order, group, value, n_values, np.empty(0, np.int64), np.empty(0, np.int64))
    later = np.empty(m, dtype=np.int64)
    earlier = np.empty(m, dtype=np.int64)
    _visit_repeats(order, group, value, n_values, later, earlier)
    return later, earlier


@njit(cache=True)
def _visit_repeats(order, group, value, n_values, later, earlier):
    """Count the repeated ``(group, value)`` records visited in ``order`` (grouped by
    ``group``), writing them to ``later``/``earlier`` when those have room; returns the count."""
    last_group = np.full(n_values, -1, dtype=np.int32)
    first = np.empty(n_values, dtype=np.int64)
    m = 0
    for idx in range(order.shape[0]):
        k = order[idx]
        g = group[k]
        v = value[k]
        if last_group[v] == g:
            if m < later.shape[0]:
                later[m] = k
                earlier[m] = first[v]
            m += 1
        else:
            last_group[v] = g
            first[v] = k
    return m


# Lookup tables (entries) the kernels above may allocate beyond two per record;
# larger id or value ranges take the sort-based path instead.
DENSE_LIMIT = 1 << 22
