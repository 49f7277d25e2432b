"""Parquet ratings (the format warehouses export), read through pyarrow.

pyarrow is optional (``pip install 'ordrec[parquet]'``) and imported only
when a Parquet file is read. Columns are found by the csv header rules
(:func:`trainer.data.readers.read_ratings`), then checked by type: ids are
strings or integers (integers become their decimal text, so ``7`` and
``"7"`` are the same id), ratings are numbers. Values are checked row by row
as the line readers check lines, and an error names the file and the 1-based
row (``file: row N: ...``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ordrec.service.storage.idmap import has_control
from ordrec.trainer.data.lines import (
    TIMESTAMP_DIGITS,
    GrowingArray,
    IdSpace,
    LineGaps,
    Records,
)
from ordrec.trainer.data.types import DataError, RatingScale, excerpt

# One check over a whole column: the rows it fails, and the message for a failing row.
Check = tuple[np.ndarray, Callable[[int], str]]


def _pyarrow(path: str):
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(path, None, "reading Parquet needs pyarrow: pip install 'ordrec[parquet]'") from None
    return pa, pc, pq


def parquet_columns(path: str) -> list[str]:
    """The column names of a Parquet file (its schema only is read)."""
    pa, _, pq = _pyarrow(path)
    try:
        return list(pq.read_schema(path).names)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(path, None, f"not a readable Parquet file: {exc}") from None


#: Rows per batch read from a Parquet file: its arrow columns stay a few tens of MB.
BATCH_ROWS = 1 << 20


def read_batches(path: str, names: list[str]) -> Iterator[list[Any]]:
    """The named columns, batch by batch (row groups in pieces of at most :data:`BATCH_ROWS`
    rows), as pyarrow arrays with dictionary-encoded columns decoded."""
    pa, _, pq = _pyarrow(path)
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=names)
        for batch in batches:
            out = []
            for name in names:
                column = batch.column(name)
                if pa.types.is_dictionary(column.type):
                    column = column.dictionary_decode()
                out.append(column)
            yield out
    except (pa.ArrowException, OSError) as exc:
        raise DataError(path, None, f"not a readable Parquet file: {exc}") from None


def _type_problem(pa, column, role: str) -> str | None:
    kind = column.type
    if role in ("user", "item"):
        ok = pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)
        return None if ok else f"is {kind}; {role} ids must be strings or integers"
    if role in ("rating", "strength"):
        ok = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
        return None if ok else f"is {kind}; {role}s must be numbers"
    ok = pa.types.is_integer(kind) or pa.types.is_timestamp(kind)
    return None if ok else f"is {kind}; a timestamp must be an integer or a Parquet timestamp"


def check_types(path: str, names: list[str], roles: list[str], columns: list[Any]) -> None:
    """Raise naming the first column whose type cannot hold its role."""
    pa, _, _ = _pyarrow(path)
    for name, role, column in zip(names, roles, columns):
        problem = _type_problem(pa, column, role)
        if problem:
            raise DataError(path, None, f"column {excerpt(name)} ({role}) {problem}")


def _id_checks(pc, column, role: str) -> list[Check]:
    """Null, empty and control-character ids: judged once per distinct value."""
    encoded = pc.dictionary_encode(column.cast("string"))
    values = encoded.dictionary.to_pylist()
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    null = np.asarray(encoded.is_null())
    bad_values = [k for k, v in enumerate(values) if not v or has_control(v)]
    bad = np.isin(codes, bad_values) & ~null

    def why(row: int) -> str:
        value = values[int(codes[row])]
        if not value:
            return f"empty {role} id"
        return f"{role} id {excerpt(value)} contains a line break or control character"

    return [(null, lambda row: f"empty {role} id (null)"), (bad, why)]


def _rating_checks(
    ratings: np.ndarray, null: np.ndarray, scale: RatingScale | None, role: str = "rating"
) -> list[Check]:
    finite = np.isfinite(ratings)
    checks: list[Check] = [
        (null, lambda row: f"{role} is missing (null)"),
        (~finite & ~null, lambda row: f"{role} {float(ratings[row])!r} is not a finite number"),
    ]
    if role == "strength":  # as the line readers' minimum: a count or a duration is never negative
        checks.append(
            (finite & (ratings < 0), lambda row: f"strength {float(ratings[row]):g} is below the minimum 0")
        )
    if scale is not None:
        # RatingScale.problem per distinct value: the same rule (types.on_scale) as every other reader.
        distinct = np.unique(ratings[finite & ~null])
        off = [v for v in distinct.tolist() if scale.problem(v)]
        checks.append(
            (
                np.isin(ratings, off) & finite & ~null,
                lambda row: f"rating {float(ratings[row]):g} {scale.problem(float(ratings[row]))}",
            )
        )
    return checks


def _timestamp_checks(pa, column) -> list[Check]:
    null = np.asarray(column.is_null())
    checks: list[Check] = [(null, lambda row: "timestamp is missing (null)")]
    if pa.types.is_integer(column.type):
        stamps = column.fill_null(0).to_numpy()
        # An int64 has at most 19 digits, within TIMESTAMP_DIGITS; only the sign can be wrong.
        assert TIMESTAMP_DIGITS >= 19
        checks.append((stamps < 0, lambda row: f"timestamp {int(stamps[row])} is not a non-negative integer"))
    return checks


def first_problem(checks: list[Check]) -> tuple[np.ndarray, int | None, str | None]:
    """``(bad rows mask, first bad row, its problem)``; the problem is the first check it fails."""
    bad = np.zeros(checks[0][0].shape, dtype=bool)
    for mask, _ in checks:
        bad |= mask
    if not bad.any():
        return bad, None, None
    row = int(np.argmax(bad))
    message = next(why(row) for mask, why in checks if mask[row])
    return bad, row, message


def read_parquet_records(
    path: str,
    names: list[str],
    timestamps: list[str],
    scale: RatingScale | None,
    skip_bad_lines: bool,
    implicit: bool = False,
) -> Records:
    """Records (user, item[, value][, time]) of a Parquet file; ``names`` are the user and item
    columns and the rating (or, ``implicit``, strength) column when there is one.

    Read batch by batch (:func:`read_batches`) into growing int32 / float32 columns; ids
    are numbered in order of first appearance across the file. The first of
    ``timestamps`` is kept (int64: an integer, or a Parquet timestamp's count of its
    unit), the others checked. ``Records.line`` gives 1-based row numbers. A bad row
    raises ``DataError`` naming it, or is dropped and counted when ``skip_bad_lines``.
    """
    pa, pc, _ = _pyarrow(path)
    roles = ["user", "item", "strength" if implicit else "rating"][: len(names)]
    roles += ["timestamp"] * len(timestamps)
    spaces = [IdSpace(), IdSpace()]
    ids = [GrowingArray(np.int32), GrowingArray(np.int32)]
    values = [GrowingArray(np.float32) for _ in names[2:]] + [GrowingArray(np.int64) for _ in timestamps[:1]]
    gaps = LineGaps(1)
    offset = skipped = kept = 0
    for columns in read_batches(path, names + timestamps):
        if offset == 0:
            check_types(path, names + timestamps, roles, columns)
        keep, bad = _checked_rows(pa, pc, columns, roles, scale, offset, path, skip_bad_lines)
        skipped += bad
        rows = np.flatnonzero(keep)
        mask = pa.array(keep)
        for column, space, out in zip(columns[:2], spaces, ids):
            # dictionary_encode numbers a batch's values in order of first appearance; the
            # space numbers the ones it has not seen in that order, as the line readers do.
            encoded = pc.dictionary_encode(column.filter(mask).cast("string"))
            known = np.array([space.add(v) for v in encoded.dictionary.to_pylist()], dtype=np.int32)
            out.extend(known[encoded.indices.to_numpy(zero_copy_only=False)])
        for column, out in zip(columns[2:], values):
            wanted = pa.int64() if out.data.dtype == np.int64 else pa.float64()
            out.extend(column.cast(wanted).filter(mask).to_numpy(zero_copy_only=False))
        if rows.size:
            gaps.note_run(kept, rows + offset + 1)
        kept += rows.size
        offset += len(columns[0])
    if offset == 0:
        raise DataError(path, None, "no data rows")
    if kept == 0:
        raise DataError(path, None, f"no data rows ({skipped} skipped as bad)")
    return Records(
        spaces=[s.idmap() for s in spaces],
        ids=[x.finish() for x in ids],
        numbers=[x.finish() for x in values],
        first_line=1,
        skipped=skipped,
        engine="parquet",
        gaps=gaps if gaps.at else None,
    )


def _checked_rows(
    pa,
    pc,
    columns: list[Any],
    roles: list[str],
    scale: RatingScale | None,
    offset: int,
    path: str,
    skip_bad_lines: bool,
) -> tuple[np.ndarray, int]:
    """``(rows to keep, how many are bad)`` of one batch; the first bad row (numbered from
    ``offset``) raises naming it unless bad rows are skipped."""
    checks = _id_checks(pc, columns[0], "user") + _id_checks(pc, columns[1], "item")
    for column, role in zip(columns[2:], roles[2:]):
        if role == "timestamp":
            checks += _timestamp_checks(pa, column)
            continue
        null = np.asarray(column.is_null())
        values = column.cast(pa.float64()).fill_null(math.nan).to_numpy(zero_copy_only=False)
        checks += _rating_checks(values, null, scale if role == "rating" else None, role)
    bad, row, message = first_problem(checks)
    if row is not None and not skip_bad_lines:
        raise DataError(path, None, message, row=offset + row + 1)
    return ~bad, int(bad.sum())
