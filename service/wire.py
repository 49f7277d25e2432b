"""Recommend's reply written straight to protobuf wire bytes.

Building a ``RecommendResponse`` message (its results, ten ``add`` calls a
user, ``ByteSize`` for the size check) and then serialising it cost about
three times what joining the encoded fields costs, and this runs on every call
(docs/serving-cost.md). The bytes are what ``SerializeToString`` of the same
message would parse back to (``tests/test_wire.py`` checks it against the
message path for random requests); fields at their default value are left out,
as protobuf does.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ordrec.service.idmap import IdMap

# Field tags (field number << 3 | wire type): 0 varint, 2 length-delimited, 5 32-bit.
_LEN, _VARINT, _FIXED32 = 2, 0, 5


def _tag(field: int, wire_type: int) -> bytes:
    return bytes([field << 3 | wire_type])


def varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(tag: bytes, data: bytes) -> bytes:
    return tag + varint(len(data)) + data


_ID, _SCORE, _DISTRIBUTION = _tag(1, _LEN), _tag(2, _FIXED32), _tag(3, _LEN)  # ScoredId
_USER_ID, _ITEMS, _FALLBACK, _FOLDED_IN, _USER_VERSION = (  # UserRecommendations
    _tag(1, _LEN),
    _tag(2, _LEN),
    _tag(3, _VARINT),
    _tag(4, _VARINT),
    _tag(5, _LEN),
)
_RESULTS, _MODEL, _VERSION, _LEVELS, _DEGRADED, _STALE = (  # RecommendResponse
    _tag(1, _LEN),
    _tag(2, _LEN),
    _tag(3, _LEN),
    _tag(4, _LEN),
    _tag(5, _VARINT),
    _tag(6, _VARINT),
)
_TRUE = b"\x01"


class UserAnswer(NamedTuple):
    """One user's part of a Recommend reply."""

    user_id: str
    version: str
    ids: IdMap  # the version's items
    rows: np.ndarray
    scores: np.ndarray
    fallback: int  # a Fallback enum value (0: none)
    folded_in: bool
    distribution: np.ndarray | None  # (len(rows), levels) float32, or None


class RecommendReply(NamedTuple):
    """A Recommend reply before it is written as a message or as bytes."""

    model: str
    model_version: str
    seen_filter_degraded: bool
    rules_stale: bool
    answers: Sequence[UserAnswer]
    levels: Sequence[float]


def _text(tag: bytes, value: str) -> bytes:
    return _delimited(tag, value.encode("utf-8")) if value else b""


def _user_bytes(answer: UserAnswer) -> bytes:
    externals = answer.ids.ids
    scores = np.asarray(answer.scores, dtype="<f4").tobytes()
    parts = [_text(_USER_ID, answer.user_id)]
    for k, row in enumerate(answer.rows.tolist()):
        scored = _text(_ID, externals[row]) + _SCORE + scores[4 * k : 4 * k + 4]
        if answer.distribution is not None:
            scored += _delimited(_DISTRIBUTION, np.asarray(answer.distribution[k], dtype="<f4").tobytes())
        parts.append(_delimited(_ITEMS, scored))
    if answer.fallback:
        parts.append(_FALLBACK + varint(answer.fallback))
    if answer.folded_in:
        parts.append(_FOLDED_IN + _TRUE)
    parts.append(_text(_USER_VERSION, answer.version))
    return b"".join(parts)


def recommend_reply_bytes(reply: RecommendReply) -> bytes:
    """The serialised ``RecommendResponse`` of ``reply``."""
    parts = [_delimited(_RESULTS, _user_bytes(answer)) for answer in reply.answers]
    parts.append(_text(_MODEL, reply.model))
    parts.append(_text(_VERSION, reply.model_version))
    if reply.levels:
        parts.append(_delimited(_LEVELS, struct.pack(f"<{len(reply.levels)}f", *reply.levels)))
    if reply.seen_filter_degraded:
        parts.append(_DEGRADED + _TRUE)
    if reply.rules_stale:
        parts.append(_STALE + _TRUE)
    return b"".join(parts)
