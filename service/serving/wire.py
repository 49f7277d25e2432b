"""Recommend's reply written straight to protobuf wire bytes, for the plain request.

The usual request (one known user, nothing but ``n`` and ``exclude_seen``) is answered
without a reply message: one numba call scores the user, sets the seen items aside,
selects the top ``n`` and writes the ``RecommendResponse`` bytes grpcio sends, the item
ids' UTF-8 bytes copied from one buffer per version (:class:`WirePlan`). The bytes are
those ``SerializeToString`` gives for the message the general path builds (field order,
proto3's omitted defaults and all; ``tests/test_recommend_wire.py`` holds them equal).
A ten-item reply message cost 5.5 us in process to build and serialise, its bytes
written here about 1 us (``docs/serving-cost.md``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, typeof, types

from ordrec.service.indices.topk import (
    FUSED_FASTMATH,
    ITEM_MATRIX_TYPES,
    UserProduct,
    holds_gil,
    kernel_signatures,
    read_only_type,
    user_top_k_inline,
)
from ordrec.service.storage.idmap import IdMap

# Field tags (field number << 3 | wire type) of the fields the plain reply holds.
_LENGTH, _FIXED32, _VARINT = 2, 5, 0
_REPLY_RESULTS, _REPLY_MODEL, _REPLY_VERSION = 1 << 3 | _LENGTH, 2 << 3 | _LENGTH, 3 << 3 | _LENGTH
_REPLY_DEGRADED, _REPLY_STALE = 5 << 3 | _VARINT, 6 << 3 | _VARINT
_RESULT_USER, _RESULT_ITEMS, _RESULT_VERSION = 1 << 3 | _LENGTH, 2 << 3 | _LENGTH, 5 << 3 | _LENGTH
_ITEM_ID, _ITEM_SCORE = 1 << 3 | _LENGTH, 2 << 3 | _FIXED32


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string_field(tag: int, text: str) -> bytes:
    """A proto3 string field's bytes: nothing for an empty string, as protobuf writes it."""
    data = text.encode("utf-8")
    return tag.to_bytes(1, "little") + _varint(len(data)) + data if data else b""


def _read_only(array: np.ndarray) -> np.ndarray:
    """``array`` as a read-only view: every plan array is one numba type, whatever made it."""
    view = array.view()
    view.flags.writeable = False
    return view


def _as_array(data: bytes) -> np.ndarray:
    return _read_only(np.frombuffer(data, dtype=np.uint8))


class WirePlan:
    """What a version's plain replies share, built once per version, as one tuple for the
    kernels (a tuple of arrays costs numba no more to take than the arrays apart): the item
    and user ids as UTF-8 lines and their line starts (id r is
    ``lines[starts[r]:starts[r + 1] - 1]``), the result's version field and the reply's model
    and version fields."""

    __slots__ = ("arrays",)

    def __init__(self, items: IdMap, users: IdMap, model: str, version: str):
        item_lines, item_starts = items.utf8_lines()
        user_lines, user_starts = users.utf8_lines()
        self.arrays = (
            _as_array(item_lines),
            _read_only(item_starts),
            _as_array(user_lines),
            _read_only(user_starts),
            _as_array(_string_field(_RESULT_VERSION, version)),
            _as_array(_string_field(_REPLY_MODEL, model) + _string_field(_REPLY_VERSION, version)),
        )


# The scoring kernels' declared argument types (topk's convention: arrays read-only, which
# writable ones convert to at no cost; one build per item-matrix layout): matrix, factors,
# user_row, scale, offset, seen, recorded, blocked, masked, k, plan, degraded, stale.
_ROWS, _VECTOR = read_only_type(types.int64, 1), read_only_type(types.float32, 1)
_SCORE_REPLY = [
    (matrix, read_only_type(types.float32, 2), types.int64, _VECTOR, types.float32, _ROWS, _ROWS)
    + (read_only_type(types.bool_, 1), types.boolean, types.int64)
    + (typeof(WirePlan(IdMap([]), IdMap([]), "", "").arrays), types.boolean, types.boolean)
    for matrix in ITEM_MATRIX_TYPES
]


@njit(cache=True, inline="always")
def _varint_size(value):
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


@njit(cache=True, inline="always")
def _put_varint(out, at, value):
    while value >= 0x80:
        out[at] = (value & 0x7F) | 0x80
        value >>= 7
        at += 1
    out[at] = value
    return at + 1


@njit(cache=True, inline="always")
def _put_bytes(out, at, source, start, stop):
    for i in range(start, stop):
        out[at] = source[i]
        at += 1
    return at


@njit(cache=True, inline="always")
def _item_size(id_length, score_bits):
    # ScoredId: the id unless empty, the score unless +0.0 (proto3 leaves both out then).
    size = 0
    if id_length:
        size += 1 + _varint_size(id_length) + id_length
    if score_bits != 0:
        size += 5
    return size


@njit(cache=True, inline="always")
def _write_reply(rows, scores, plan, user_row, degraded, stale):
    items, item_starts, users, user_starts, result_tail, reply_tail = plan
    n = rows.shape[0]
    as_float = np.empty(n, dtype=np.float32)  # the wire's float: a double score rounds as protobuf does
    for i in range(n):
        as_float[i] = scores[i]
    bits = as_float.view(np.uint32)
    user_start, user_stop = user_starts[user_row], user_starts[user_row + 1] - 1
    user_length = user_stop - user_start
    result = result_tail.shape[0]
    if user_length:
        result += 1 + _varint_size(user_length) + user_length
    for i in range(n):
        item_size = _item_size(item_starts[rows[i] + 1] - 1 - item_starts[rows[i]], bits[i])
        result += 1 + _varint_size(item_size) + item_size
    total = 1 + _varint_size(result) + result + reply_tail.shape[0] + 2 * degraded + 2 * stale
    out = np.empty(total, dtype=np.uint8)
    out[0] = _REPLY_RESULTS
    at = _put_varint(out, 1, result)
    if user_length:
        out[at] = _RESULT_USER
        at = _put_bytes(out, _put_varint(out, at + 1, user_length), users, user_start, user_stop)
    for i in range(n):
        start, stop = item_starts[rows[i]], item_starts[rows[i] + 1] - 1
        out[at] = _RESULT_ITEMS
        at = _put_varint(out, at + 1, _item_size(stop - start, bits[i]))
        if stop > start:
            out[at] = _ITEM_ID
            at = _put_bytes(out, _put_varint(out, at + 1, stop - start), items, start, stop)
        if bits[i] != 0:
            out[at] = _ITEM_SCORE
            for shift in range(4):
                out[at + 1 + shift] = (bits[i] >> (8 * shift)) & 0xFF
            at += 5
    at = _put_bytes(out, at, result_tail, 0, result_tail.shape[0])
    at = _put_bytes(out, at, reply_tail, 0, reply_tail.shape[0])
    if degraded:
        out[at], out[at + 1] = _REPLY_DEGRADED, 1
        at += 2
    if stale:
        out[at], out[at + 1] = _REPLY_STALE, 1
    return out


@njit(cache=True)
def _encode_kernel(rows, scores, plan, user_row, degraded, stale):
    return _write_reply(rows, scores, plan, user_row, degraded, stale)


def encode_reply(
    plan: WirePlan, user_row: int, rows: np.ndarray, scores: np.ndarray, degraded: bool, stale: bool
) -> bytes:
    """The ``RecommendResponse`` bytes of one known user's ranked ``rows`` and ``scores``."""
    return _encode_kernel(
        np.array(rows, dtype=np.int64),  # copies of a few items: one kernel signature
        np.array(scores, dtype=np.float32),  # rounded to the wire's float as protobuf rounds
        plan.arrays,
        user_row,
        degraded,
        stale,
    ).tobytes()


@njit(cache=True, inline="always")
def _score_reply_body(
    matrix, factors, user_row, scale, offset, seen, recorded, blocked, masked, k, plan, degraded, stale
):
    exclude = seen if recorded.shape[0] == 0 else np.concatenate((seen, recorded))
    rows, scores = user_top_k_inline(matrix, factors, user_row, scale, offset, exclude, blocked, masked, k)
    return _write_reply(rows, scores, plan, user_row, degraded, stale)


# The fused kernels of topk.user_top_k compiled with its flags: the same scores, bit for bit.
@njit(_SCORE_REPLY, cache=True, fastmath=FUSED_FASTMATH)
def _score_reply_holding_gil(
    matrix, factors, user_row, scale, offset, seen, recorded, blocked, masked, k, plan, degraded, stale
):
    return _score_reply_body(
        matrix, factors, user_row, scale, offset, seen, recorded, blocked, masked, k, plan, degraded, stale
    )


@njit(_SCORE_REPLY, cache=True, fastmath=FUSED_FASTMATH, nogil=True)
def _score_reply_releasing_gil(
    matrix, factors, user_row, scale, offset, seen, recorded, blocked, masked, k, plan, degraded, stale
):
    return _score_reply_body(
        matrix, factors, user_row, scale, offset, seen, recorded, blocked, masked, k, plan, degraded, stale
    )


_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_MASK = np.zeros(0, dtype=np.bool_)


def scored_reply(
    plan: WirePlan,
    product: UserProduct,
    user_row: int,
    k: int,
    seen: np.ndarray,
    recorded: np.ndarray | None,
    blocked: np.ndarray | None,
    degraded: bool,
    stale: bool,
) -> bytes:
    """One user's whole-catalogue top ``k`` (``topk.user_top_k``'s answer: ``seen`` and
    ``recorded`` rows excluded, ``blocked`` ones skipped) as ``RecommendResponse`` bytes, in
    one kernel call."""
    kernel = _score_reply_holding_gil if holds_gil(product.matrix.size) else _score_reply_releasing_gil
    return kernel(
        product.matrix,
        product.users,
        user_row,
        product.scale,
        product.offset,
        seen,
        _NO_ROWS if recorded is None else recorded,
        _NO_MASK if blocked is None else blocked,
        blocked is not None,
        k,
        plan.arrays,
        degraded,
        stale,
    ).tobytes()


def warm_up() -> None:
    """Compile (or load from numba's cache) the reply encoder. The scoring kernels are declared
    (``_SCORE_REPLY``: each item layout, every array read-only) and built at import: four
    builds, where compiling each mix of writable and read-only arrays a server meets took twenty."""
    plan = WirePlan(IdMap(["i0", "i1"]), IdMap(["u0"]), "m", "v")
    encode_reply(plan, 0, np.zeros(1, np.int64), np.ones(1, np.float32), False, False)


def compiled_signatures() -> dict[str, int]:
    """:func:`topk.kernel_signatures` of this module."""
    return kernel_signatures(globals())
