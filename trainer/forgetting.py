"""The FORGOTTEN list applied to training: forgotten users' rows dropped from any input,
and the versions still naming them replaced by redacted copies at every run.

Users are matched by the keyed hash of their id (``service/live/forgotten.py``) in the
user column of ratings, tag assignments and triples (both users of a type-B
triple); attribute tables and neighbour lists name objects, not users, and pass
unchanged. The user ids of the result no longer include the forgotten ones, so
the version trained on it cannot name them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ordrec.service.live.erasure import versions_naming
from ordrec.service.live.forgotten import list_hash, read_forgotten
from ordrec.service.live.redaction import Redacted, redact_versions
from ordrec.service.storage.idmap import IdMap


@dataclasses.dataclass(frozen=True)
class Dropped:
    """What :func:`drop_forgotten` removed."""

    users: int = 0
    rows: int = 0


def drop_forgotten(data: Any, digests: frozenset[str]) -> tuple[Any, Dropped]:
    """``data`` without the rows of users listed in ``digests``, and the counts."""
    users: IdMap | None = getattr(data, "users", None)
    if not digests or users is None:
        return data, Dropped()
    listed = list_hash().listed
    gone = np.array([listed(uid, digests) for uid in users.ids], dtype=bool)
    if not gone.any():
        return data, Dropped()
    kept_rows = np.flatnonzero(~gone)
    remap = np.full(len(users), -1, dtype=np.int64)
    remap[kept_rows] = np.arange(kept_rows.size)
    keep, user_rows = _kept(data, gone)
    changes: dict[str, Any] = {"users": users.subset(kept_rows)}
    for name in _row_columns(data):
        column = getattr(data, name)[keep]
        if name in user_rows:
            at = user_rows[name][keep]
            column = column.copy()
            column[at] = remap[column[at]]
        changes[name] = column
    return dataclasses.replace(data, **changes), Dropped(int(gone.sum()), int((~keep).sum()))


def _kept(data: Any, gone: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Rows to keep, and per column holding user rows where it holds them: ``user``, or a
    triple's ``first`` and, in type B triples (``kind`` 1), ``second``."""
    if hasattr(data, "user"):
        return ~gone[data.user], {"user": np.ones(len(data), dtype=bool)}
    type_b = data.kind == 1
    second_user = type_b & gone[np.where(type_b, data.second, 0)]
    keep = ~gone[data.first] & ~second_user
    return keep, {"first": np.ones(len(data), dtype=bool), "second": type_b}


def _row_columns(data: Any) -> list[str]:
    """Every per-row array of ``data``."""
    return [
        f.name
        for f in dataclasses.fields(data)
        if isinstance(getattr(data, f.name), np.ndarray) and len(getattr(data, f.name)) == len(data)
    ]


def apply_forgotten(data: Any, registry) -> tuple[Any, Dropped, int]:
    """``data`` with the registry's FORGOTTEN users dropped, what went, and the list's length."""
    digests = read_forgotten(registry)
    data, dropped = drop_forgotten(data, digests)
    return data, dropped, len(digests)


def redact_forgotten(registry, name: str) -> Redacted:
    """Replace every version of ``name`` that still names a forgotten user by its redacted
    copy (``service/live/redaction.py``): what every training run does, whatever its gate says."""
    digests = read_forgotten(registry)
    return redact_versions(registry, name, digests, versions_naming(registry, name, digests))
