"""Request bounds and field checks. Every failure is an :class:`InvalidArgument`
whose message names the field, the value and the allowed range."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ordrec.service.config import Limits
from ordrec.service.errors import InvalidArgument
from ordrec.service.storage.idmap import has_control
from ordrec.service.storage.scale import scale_problem, stored_scale

_MODEL_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


# Upper bounds on protobuf's framing: a field tag and length prefix, a float with its tag.
_FRAME = 4
_FLOAT = 5
_REPLY_HEADROOM = 1024  # model name, version, levels


def scored_id_bytes(id_bytes: int, n_floats: int = 0) -> int:
    """Most bytes one ``ScoredId`` (with ``n_floats`` distribution values) takes in a reply."""
    return _FRAME + _FRAME + id_bytes + _FLOAT + (_FRAME + 4 * n_floats if n_floats else 0)


def check_reply_fits(reply_bytes: int, what: str, limits: Limits) -> None:
    """Refuse, before any work, a request whose reply could exceed the message size limit."""
    budget = limits.max_message_bytes - _REPLY_HEADROOM
    if reply_bytes > budget:
        raise InvalidArgument(
            f"{what} would make a reply of up to {reply_bytes:,} bytes, over the"
            f" {limits.max_message_bytes:,}-byte message limit: ask for less"
        )


def recommend_reply_bytes(user_ids: Sequence[str], n: int, item_id_bytes: int, n_levels: int) -> int:
    per_user = _FRAME + _FRAME + _FRAME + n * scored_id_bytes(item_id_bytes, n_levels)
    return sum(per_user + len(u.encode("utf-8")) for u in user_ids)


def bounded(value: int, field: str, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidArgument(f"{field} must be between {low} and {high}, got {value}")
    return value


def model_name(value: str) -> str:
    """An empty name (pick the only suitable model) or a registry folder name."""
    if value and not _MODEL_RE.match(value):
        raise InvalidArgument(f"model {value[:80]!r} is not a model name (1-64 of a-z, 0-9, '_', '-', '.')")
    return value


def one_id(value: str, field: str, limits: Limits) -> str:
    if not value:
        raise InvalidArgument(f"{field} is empty")
    if len(value) > limits.max_id_length:
        raise InvalidArgument(f"{field} is {len(value)} characters long; the limit is {limits.max_id_length}")
    return value


def stored_id(value: str, field: str, limits: Limits) -> str:
    """An id the server keeps (a recorded user or item): it reaches the next training, whose
    artifacts hold ids one a line, so it may not hold a control character (as in a data file)."""
    return _no_control(one_id(value, field, limits), field)


def _no_control(value: str, field: str) -> str:
    if has_control(value):
        raise InvalidArgument(f"{field} {value[:80]!r} holds a line break or another control character")
    return value


def id_list(
    values: Sequence[str], field: str, limits: Limits, max_count: int, min_count: int = 0
) -> list[str]:
    if not min_count <= len(values) <= max_count:
        raise InvalidArgument(f"{field} must hold between {min_count} and {max_count} ids, got {len(values)}")
    checked = list(values)
    for value in checked:
        if not value or len(value) > limits.max_id_length:  # the message is built only for a bad one
            one_id(value, f"an entry of {field}", limits)
    return checked


def stored_ids(
    values: Sequence[str], field: str, limits: Limits, max_count: int, min_count: int = 0
) -> list[str]:
    """An id list the server keeps (recorded items, hidden items): :func:`id_list`'s bounds,
    :func:`stored_id`'s rule for each entry (a HIDDEN file too holds ids one a line)."""
    checked = id_list(values, field, limits, max_count, min_count)
    for position, value in enumerate(checked):
        _no_control(value, f"{field}[{position}]")
    return checked


def rating(value: float, where: str, model: str, attributes: Mapping[str, Any]) -> float:
    """A recorded value on the rating scale in a model's ``attributes`` (any finite number
    when the model stored none)."""
    if not math.isfinite(value):
        raise InvalidArgument(f"{where}: value {value} is not a finite number")
    scale = stored_scale(attributes)
    problem = scale_problem(value, *scale) if scale else None
    if problem:
        raise InvalidArgument(f"{where}: value {value:g} {problem} of model {model!r}")
    return value


def timestamp(value: float, field: str) -> float:
    """Unix seconds: finite and not negative."""
    if not (math.isfinite(value) and value >= 0):
        raise InvalidArgument(f"{field} must be unix seconds (finite, >= 0), got {value}")
    return value


MAX_NOTE_CHARS = 1000


def note(value: str, field: str) -> str:
    """A free-text note for the log (a reason, a ticket): at most 1,000 printable characters,
    so it can neither flood nor forge log lines."""
    if len(value) > MAX_NOTE_CHARS:
        raise InvalidArgument(f"{field} is {len(value)} characters long; the limit is {MAX_NOTE_CHARS}")
    if not value.isprintable():
        raise InvalidArgument(f"{field} holds control characters (line breaks, tabs, ...)")
    return value
