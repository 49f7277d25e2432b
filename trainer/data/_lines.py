"""Shared line and field parsing for the readers.

Three parsers read the same delimited files, tried in this order:

- integer ids (numba): chunks of raw bytes, canonical integer ids and plain
  decimal numbers, ids numbered with a lookup table (MovieLens, Last.fm);
- text ids (numba): the same pass, but ids are byte ranges interned into a
  hash table and decoded once per distinct id; a line the kernel does not
  take is judged on its own by :func:`check_fields` (the per-line parser's
  check), then the kernel resumes, so bad lines are reported or skipped
  without re-reading the file;
- the per-line parser, the reference: it validates every line, names the
  file, the 1-based line number and the problem, and can skip bad lines.

The numba parsers hand the file to the per-line parser whenever they cannot
be sure to match it (a BOM, a C1 control inside an id, a check that fails
after the kernel), so whatever they return, the per-line parser returns too,
and their errors are its errors (tests/test_readers.py checks both ways).
"""

from __future__ import annotations

import codecs
import csv
import math
import os
import re
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.data._fast_kernels import (
    DENSE_LIMIT,
    first_appearance,
    grouped_duplicates,
    intern_ids,
    parse_numeric_lines,
    parse_text_lines,
)
from ordrec.trainer.data.types import DataError, RatingScale, excerpt

CHUNK_BYTES = 1 << 24  # 16 MiB of lines per kernel call keeps memory bounded on 10M-line files
#: The longest line any reader accepts, in bytes before its newline. Longer
#: lines are errors (or skipped), read in bounded pieces and never held whole.
MAX_LINE_BYTES = 1 << 20
#: A timestamp field is 1 to this many ASCII digits (seconds since 1970 need 10).
TIMESTAMP_DIGITS = 20
_TIMESTAMP = re.compile(f"[0-9]{{1,{TIMESTAMP_DIGITS}}}")

# Ids are written one per line into artifacts, so an id must not contain a line
# break or any other control character (C0, DEL, C1, and the Unicode line and
# paragraph separators that str.splitlines also splits on).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")

SEPARATOR_NAMES = {"\t": "tab", ",": "comma", "::": "'::'"}


def has_control(text: str) -> bool:
    return _CONTROL.search(text) is not None


def check_path(path) -> str:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(path, None, "no such file")
    if os.path.isdir(path):
        raise DataError(path, None, "is a folder, not a file")
    if os.path.getsize(path) == 0:
        raise DataError(path, None, "empty file")
    return path


def detect_encoding(path: str) -> str:
    """``"utf-8-sig"`` when the whole file decodes as UTF-8, else ``"latin-1"``.

    Latin-1 decodes every byte, so the fallback never fails; data sets such as
    MovieLens ``u.item`` and Last.fm ``tags.dat`` are latin-1.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        try:
            while True:
                block = f.read(CHUNK_BYTES)
                if not block:
                    decoder.decode(b"", final=True)
                    return "utf-8-sig"
                decoder.decode(block)
        except UnicodeDecodeError:
            return "latin-1"


def too_long() -> str:
    """The problem of a line longer than :data:`MAX_LINE_BYTES`."""
    return f"line longer than {MAX_LINE_BYTES} bytes (the line length limit)"


def _bounded_lines(f) -> Iterator[bytes | None]:
    """Every line of binary file ``f`` with its newline, or None for a line over :data:`MAX_LINE_BYTES`.

    ``readline`` with a limit reads a too-long line in pieces, so it is never
    held whole in memory.
    """
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) <= MAX_LINE_BYTES or raw.endswith(b"\n"):
            yield raw
            continue
        while raw and not raw.endswith(b"\n"):
            raw = f.readline(MAX_LINE_BYTES)
        yield None


def iter_lines(
    path: str, encoding: str | None = None, problems: Problems | None = None
) -> Iterator[tuple[int, str]]:
    """``(line_number, text)`` for every line, 1-based, without its ``\\n`` or ``\\r\\n``.

    Lines are split on ``\\n`` only, so a stray ``\\r`` inside a line stays in
    the text (and is then reported as a control character in an id). A line
    longer than :data:`MAX_LINE_BYTES` goes to ``problems`` (raised when None).
    """
    encoding = encoding or detect_encoding(path)
    bom = encoding == "utf-8-sig"
    codec = "utf-8" if bom else encoding
    problems = problems or Problems(path, skip=False)
    with open(path, "rb") as f:
        for number, raw in enumerate(_bounded_lines(f), start=1):
            if raw is None:
                problems.bad(number, too_long())
                continue
            if number == 1 and bom and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            yield number, raw.decode(codec)


def peek_lines(path: str, limit: int = 20) -> list[str]:
    """The first ``limit`` non-blank lines (for format detection), passing over over-long ones."""
    out = []
    # Judging the format needs no over-long line; reading the data reports them.
    too_long_lines = Problems(path, skip=True)
    for _, text in iter_lines(path, "latin-1", too_long_lines):
        if text.strip():
            out.append(text)
            if len(out) >= limit:
                break
    if not out and too_long_lines.first:
        raise too_long_lines.first
    return out


def splitter(sep: str):
    """A function splitting one line into stripped fields.

    Comma-separated lines may quote fields (``"a,b"``) as in RFC 4180; tab and
    ``::`` files never quote.
    """
    if sep == ",":

        def split(line: str) -> list[str]:
            if '"' in line:
                return [f.strip(" \t") for f in next(csv.reader([line]))]
            return [f.strip(" \t") for f in line.split(",")]
    elif sep == "\t":

        def split(line: str) -> list[str]:
            return [f.strip(" ") for f in line.split("\t")]
    else:

        def split(line: str) -> list[str]:
            return [f.strip(" \t") for f in line.split(sep)]

    return split


class Problems:
    """Raise on a bad line, or count it when bad lines are skipped."""

    def __init__(self, path: str, skip: bool):
        self.path, self.skip, self.skipped = path, skip, 0
        self.first: DataError | None = None  # the first line skipped, as the error it would have been

    def bad(self, line: int | None, message: str) -> None:
        error = DataError(self.path, line, message)
        if not self.skip:
            raise error
        self.first = self.first or error
        self.skipped += 1


class IdSpace:
    """External ids numbered in order of first appearance, validated once each."""

    def __init__(self):
        self.index: dict[str, int] = {}

    def add(self, value: str) -> int:
        return self.index.setdefault(value, len(self.index))

    def idmap(self) -> IdMap:
        ids = IdMap.__new__(IdMap)
        ids._ids = list(self.index)
        ids._index = self.index
        return ids


@dataclass
class Column:
    """One field of a record: an id (into id space ``space``) or a number."""

    field: int
    name: str
    kind: str = "id"  # "id", "float", "int", or "timestamp" (checked, not kept)
    space: int = 0
    minimum: float | None = None  # numbers only
    scale: RatingScale | None = None  # numbers only: the values allowed

    @property
    def is_number(self) -> bool:
        return self.kind in ("float", "int")


@dataclass
class Records:
    """Parsed records: id rows per id column, values per number column, and line numbers."""

    spaces: list[IdMap]
    ids: list[np.ndarray]  # int32 per id column
    numbers: list[np.ndarray]  # float64 per number column
    first_line: int  # line of record 0 when ``lines`` is None (no gaps)
    lines: np.ndarray | None = None  # int64 line per record when lines have gaps
    skipped: int = 0
    fast: bool = False
    engine: str = "per-line"  # which parser read the file: "integer-ids", "text-ids" or "per-line"

    def line(self, record: int) -> int:
        return int(self.lines[record]) if self.lines is not None else self.first_line + int(record)

    def keep(self, mask: np.ndarray) -> None:
        """Drop the records where ``mask`` is False (after skipping bad ones)."""
        if self.lines is None:
            self.lines = self.first_line + np.arange(mask.size, dtype=np.int64)
        self.ids = [x[mask] for x in self.ids]
        self.numbers = [x[mask] for x in self.numbers]
        self.lines = self.lines[mask]


def _describe_count(n_fields: int, sep: str, got: int) -> str:
    return f"expected {n_fields} {SEPARATOR_NAMES.get(sep, repr(sep))}-separated fields, got {got}"


def parse_records(
    path: str,
    sep: str,
    n_fields: int,
    columns: Sequence[Column],
    n_spaces: int,
    *,
    header_lines: int = 0,
    skip_bad_lines: bool = False,
    distinct: tuple[int, int] | None = None,
    encoding: str | None = None,
    fast: bool = True,
) -> Records:
    """Read the data lines of a delimited file into :class:`Records`.

    ``header_lines`` leading lines are skipped (the caller has read them).
    ``distinct=(a, b)`` names two id columns (indices into ``columns``) that
    must differ on every line (no self-edges).
    """
    if fast:
        records = parse_records_fast(
            path, sep, n_fields, columns, n_spaces, header_lines, distinct, skip_bad_lines
        )
        if records is not None:
            return records
    return _parse_lines(
        path, sep, n_fields, columns, n_spaces, header_lines, skip_bad_lines, distinct, encoding
    )


def check_fields(
    fields: list[str],
    n_fields: int,
    sep: str,
    columns: Sequence[Column],
    distinct: tuple[int, int] | None,
    known: list[dict] | None = None,
) -> tuple[str | None, list]:
    """``(problem, numbers)`` for one split line, as the per-line parser judges it.

    ``known``: per id space, ids already accepted (their control-character
    check is skipped, which keeps the per-line parser quick).
    """
    if len(fields) != n_fields:
        return _describe_count(n_fields, sep, len(fields)), []
    for c in columns:
        if c.kind == "id":
            value = fields[c.field]
            if not value:
                return f"empty {c.name} id", []
            if (known is None or value not in known[c.space]) and has_control(value):
                return f"{c.name} id {excerpt(value)} contains a line break or control character", []
    if distinct is not None:
        a, b = columns[distinct[0]], columns[distinct[1]]
        if fields[a.field] == fields[b.field]:
            return f"{b.name} {excerpt(fields[b.field])} is the {a.name} itself (self-edge)", []
    values = []
    for c in columns:
        if c.kind == "id":
            continue
        text_value = fields[c.field]
        if c.kind == "timestamp":
            if not _TIMESTAMP.fullmatch(text_value):
                return (
                    f"{c.name} {excerpt(text_value)} is not a non-negative integer of at most "
                    f"{TIMESTAMP_DIGITS} digits",
                    [],
                )
            continue
        try:
            value = int(text_value) if c.kind == "int" else float(text_value)
        except ValueError:
            kind = "an integer" if c.kind == "int" else "a number"
            return f"{c.name} {excerpt(text_value)} is not {kind}", []
        if c.kind == "float" and not math.isfinite(value):
            return f"{c.name} {excerpt(text_value)} is not a finite number", []
        if c.minimum is not None and value < c.minimum:
            return f"{c.name} {excerpt(text_value)} is below the minimum {c.minimum:g}", []
        off_scale = c.scale.problem(value) if c.scale is not None else None
        if off_scale:
            return f"{c.name} {excerpt(text_value)} {off_scale}", []
        values.append(value)
    return None, values


def _parse_lines(
    path, sep, n_fields, columns, n_spaces, header_lines, skip_bad_lines, distinct, encoding
) -> Records:
    problems = Problems(path, skip_bad_lines)
    split = splitter(sep)
    spaces = [IdSpace() for _ in range(n_spaces)]
    known = [space.index for space in spaces]
    id_columns = [c for c in columns if c.kind == "id"]
    num_columns = [c for c in columns if c.is_number]
    id_out = [array("i") for _ in id_columns]
    num_out = [array("d") for _ in num_columns]
    lines = array("q")
    for number, text in iter_lines(path, encoding, problems):
        if number <= header_lines or not text.strip():
            continue  # a blank line holds no data, so passing over it loses nothing
        fields = split(text)
        problem, values = check_fields(fields, n_fields, sep, columns, distinct, known)
        if problem is not None:
            problems.bad(number, problem)
            continue
        for out, c in zip(id_out, id_columns):
            out.append(spaces[c.space].add(fields[c.field]))
        for out, value in zip(num_out, values):
            out.append(value)
        lines.append(number)
    if not lines:
        raise DataError(
            path,
            None,
            "no data lines" + (f" ({problems.skipped} skipped as bad)" if problems.skipped else ""),
        )
    return Records(
        spaces=[s.idmap() for s in spaces],
        ids=[np.frombuffer(a, dtype=np.int32).copy() for a in id_out],
        numbers=[np.frombuffer(a, dtype=np.float64).copy() for a in num_out],
        first_line=int(lines[0]),
        lines=np.frombuffer(lines, dtype=np.int64).copy(),
        skipped=problems.skipped,
    )


def _rest_after_newline(f) -> bytes:
    """Read past the next newline of ``f`` in blocks; the bytes after it in the last block."""
    while True:
        block = f.read(CHUNK_BYTES)
        newline = block.find(b"\n")
        if not block or newline >= 0:
            return block[newline + 1 :] if block else b""


def _chunks(path: str, header_lines: int) -> Iterator[tuple[int, bytes]]:
    """``(number_of_lines, bytes)`` of whole lines after the header, about CHUNK_BYTES each.

    A line longer than :data:`MAX_LINE_BYTES` that spans blocks is not
    gathered: it is passed over and stands in as ``MAX_LINE_BYTES + 1``
    spaces, which every parser judges too long, so line numbers stay right.
    """
    with open(path, "rb") as f:
        for _ in range(header_lines):
            f.readline()
        carry = b""
        while True:
            block = f.read(CHUNK_BYTES)
            if not block:
                if carry:
                    yield 1, carry + b"\n"
                return
            block = carry + block
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                if len(block) > MAX_LINE_BYTES:
                    carry = _rest_after_newline(f)
                    yield 1, b" " * (MAX_LINE_BYTES + 1) + b"\n"
                    continue
                carry = block
                continue
            carry = block[cut:]
            whole = block[:cut]
            yield whole.count(b"\n"), whole


def _layout(sep, n_fields, columns):
    sep_bytes = sep.encode("ascii")
    if len(sep_bytes) not in (1, 2):
        return None
    id_columns = [c for c in columns if c.kind == "id"]
    num_columns = [c for c in columns if c.is_number]
    id_slot = np.full(n_fields, -1, dtype=np.int64)
    num_slot = np.full(n_fields, -1, dtype=np.int64)
    for slot, c in enumerate(id_columns):
        id_slot[c.field] = slot
    for slot, c in enumerate(num_columns):
        num_slot[c.field] = slot
    num_int = np.zeros(n_fields, dtype=np.int64)
    num_scale = np.zeros((n_fields, 3), dtype=np.float64)
    for c in num_columns:
        num_int[c.field] = c.kind == "int"
        if c.scale is not None:
            num_scale[c.field] = (c.scale.low, c.scale.high, c.scale.step)
    digits_max = np.zeros(n_fields, dtype=np.int64)
    for c in columns:
        if c.kind == "timestamp":
            digits_max[c.field] = TIMESTAMP_DIGITS
    rules = (num_int, num_scale, digits_max)
    sep1 = sep_bytes[1] if len(sep_bytes) == 2 else 0
    return sep_bytes[0], sep1, id_columns, num_columns, id_slot, num_slot, rules


def _starts_with_bom(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(3) == codecs.BOM_UTF8


def parse_records_fast(
    path, sep, n_fields, columns, n_spaces, header_lines, distinct, skip_bad_lines
) -> Records | None:
    """The numba paths: integer ids, then text ids; None when the per-line parser must read the file."""
    layout = _layout(sep, n_fields, columns)
    if layout is None or _starts_with_bom(path):
        return None  # a BOM is rare; the per-line parser strips it
    records = _parse_integer_ids(path, n_fields, header_lines, sep == ",", layout, n_spaces)
    if records is None:
        records = _parse_text_ids(
            path, sep, n_fields, header_lines, layout, n_spaces, columns, distinct, skip_bad_lines
        )
    if records is None or not _passes_checks(records, layout, columns, distinct):
        return None
    return records


def _passes_checks(records: Records, layout, columns, distinct) -> bool:
    """The per-line parser's checks that the kernels leave to afterwards (integers, minimum, self-edges)."""
    id_columns, num_columns = layout[2], layout[3]
    for value, c in zip(records.numbers, num_columns):
        if c.minimum is not None and np.any(value < c.minimum):
            return False
    if distinct is not None:
        a = id_columns.index(columns[distinct[0]])
        b = id_columns.index(columns[distinct[1]])
        if np.any(records.ids[a] == records.ids[b]):
            return False
    return True


def _parse_integer_ids(path, n_fields, header_lines, no_quotes, layout, n_spaces) -> Records | None:
    """Canonical integer ids (MovieLens, Last.fm): parse, then number with a lookup table."""
    sep0, sep1, id_columns, num_columns, id_slot, num_slot, rules = layout
    id_parts, num_parts = [], []
    for n, data in _chunks(path, header_lines):
        buf = np.frombuffer(data, dtype=np.uint8)
        out_ids = np.empty((n, max(len(id_columns), 1)), dtype=np.int64)
        out_num = np.empty((n, max(len(num_columns), 1)), dtype=np.float64)
        rows, bail = parse_numeric_lines(
            buf, n_fields, sep0, sep1, no_quotes, id_slot, num_slot, *rules, MAX_LINE_BYTES, out_ids, out_num
        )
        if bail >= 0:
            return None
        # Narrow per chunk so a 10M-line file never holds all columns as int64.
        ids = out_ids[:rows, : len(id_columns)]
        if ids.size and ids.max() < 2**31:
            ids = ids.astype(np.int32)
        id_parts.append(ids)
        num_parts.append(out_num[:rows, : len(num_columns)].copy())
        del out_ids, out_num
    if not id_parts or sum(p.shape[0] for p in id_parts) == 0:
        return None
    ids_all = np.concatenate(id_parts) if len(id_parts) > 1 else id_parts[0]
    del id_parts
    numbers = [np.concatenate([p[:, s] for p in num_parts]) for s in range(len(num_columns))]
    del num_parts
    # Number each id space in order of first appearance, reading the columns
    # of one space interleaved line by line, exactly as the per-line parser does.
    spaces: list[IdMap] = []
    rows_out: list[np.ndarray | None] = [None] * len(id_columns)
    for space in range(n_spaces):
        slots = [s for s, c in enumerate(id_columns) if c.space == space]
        if not slots:
            spaces.append(IdMap([]))
            continue
        column = ids_all[:, slots].ravel()  # row-major: line by line, columns in order
        unique, rows = first_appearance(column)
        rows = rows.reshape(-1, len(slots))
        for j, s in enumerate(slots):
            rows_out[s] = np.ascontiguousarray(rows[:, j])
        spaces.append(IdMap([str(v) for v in unique.tolist()]))
    return Records(
        spaces=spaces,
        ids=rows_out,
        numbers=numbers,
        first_line=header_lines + 1,
        fast=True,
        engine="integer-ids",
    )


class _Interner:
    """State of :func:`intern_ids` for one id space, carried across chunks."""

    def __init__(self):
        self.n = 0
        self.slots = np.full(1 << 12, -1, dtype=np.int32)
        self.uhash = np.zeros(1 << 12, dtype=np.uint64)
        self.arena = np.empty(1 << 16, dtype=np.uint8)
        self.offsets = np.zeros(1 << 12, dtype=np.int64)

    def add(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        rows = np.empty(starts.shape, dtype=np.int32)
        self.n, self.slots, self.uhash, self.arena, self.offsets = intern_ids(
            buf, starts, ends, self.slots, self.uhash, self.arena, self.offsets, self.n, rows
        )
        return rows

    def ids(self, codec: str) -> list[str]:
        data = self.arena[: self.offsets[self.n]].tobytes()
        bounds = self.offsets[: self.n + 1].tolist()
        return [data[a:b].decode(codec) for a, b in zip(bounds[:-1], bounds[1:])]


def _parse_text_ids(
    path, sep, n_fields, header_lines, layout, n_spaces, columns, distinct, skip_bad_lines
) -> Records | None:
    """Any ids: the kernel returns byte ranges, hashed into id spaces; odd lines go through Python.

    The kernel stops at each line it does not take (a quote, a blank line, an
    empty id, a control byte, a number such as ``3.``); that one line is
    judged by :func:`check_fields` exactly as the per-line parser would, its
    ids interned through the same table, and the kernel resumes after it. So
    a bad line is reported (or skipped) without reading the file again, and a
    few odd lines do not slow a big file down. Each distinct id is decoded
    once, in the file's encoding, and checked for control characters.
    """
    sep0, sep1, id_columns, num_columns, id_slot, num_slot, rules = layout
    n_id, n_num = len(id_columns), len(num_columns)
    encoding = detect_encoding(path)
    codec = "utf-8" if encoding == "utf-8-sig" else encoding
    split = splitter(sep)
    problems = Problems(path, skip_bad_lines)
    space_slots = [[s for s, c in enumerate(id_columns) if c.space == space] for space in range(n_spaces)]
    interners = [_Interner() for _ in range(n_spaces)]
    row_parts: list[list[np.ndarray]] = [[] for _ in id_columns]
    num_parts: list[np.ndarray] = []
    line_parts: list[np.ndarray] = []
    gaps = False
    line = header_lines + 1

    def intern(buf, starts, ends):
        for space, slots in enumerate(space_slots):
            if slots:
                got = interners[space].add(
                    buf, np.ascontiguousarray(starts[:, slots]), np.ascontiguousarray(ends[:, slots])
                )
                for j, s in enumerate(slots):
                    row_parts[s].append(np.ascontiguousarray(got[:, j]))

    def records() -> Records | None:
        if not num_parts or sum(p.shape[0] for p in num_parts) == 0:
            return None
        spaces = []
        for interner in interners:
            ids = interner.ids(codec)
            if any(has_control(x) for x in ids):
                return None  # C1 controls or U+2028/2029: the per-line parser names the line
            spaces.append(IdMap(ids))
        return Records(
            spaces=spaces,
            ids=[np.concatenate(parts) for parts in row_parts],
            numbers=[np.concatenate([p[:, s] for p in num_parts]) for s in range(n_num)],
            first_line=header_lines + 1,
            lines=np.concatenate(line_parts) if gaps else None,
            skipped=problems.skipped,
            fast=True,
            engine="text-ids",
        )

    for n, data in _chunks(path, header_lines):
        whole = np.frombuffer(data, dtype=np.uint8)
        out_start = np.empty((n, max(n_id, 1)), dtype=np.int64)
        out_end = np.empty((n, max(n_id, 1)), dtype=np.int64)
        out_num = np.empty((n, max(n_num, 1)), dtype=np.float64)
        pos = 0
        while pos < len(data):
            buf = whole[pos:]
            rows, bail = parse_text_lines(
                buf,
                n_fields,
                sep0,
                sep1,
                sep == ",",
                sep != "\t",
                id_slot,
                num_slot,
                *rules,
                MAX_LINE_BYTES,
                out_start,
                out_end,
                out_num,
            )
            if rows:
                intern(buf, out_start[:rows], out_end[:rows])
                num_parts.append(out_num[:rows, :n_num].copy())
                line_parts.append(np.arange(line, line + rows, dtype=np.int64))
                line += rows
            if bail < 0:
                break
            # One line the kernel did not take: judge it as the per-line parser does.
            gaps = True
            start = pos + bail
            stop = data.index(b"\n", start)
            problem, fields, values = _judge_raw_line(
                data[start:stop], codec, split, n_fields, sep, columns, distinct
            )
            if fields is not None:
                if problem is not None:
                    if not skip_bad_lines:
                        # Report it only if no earlier line breaks a check made afterwards;
                        # else the per-line parser finds that earlier line.
                        so_far = records()
                        if so_far is not None and not _passes_checks(so_far, layout, columns, distinct):
                            return None
                        if so_far is None and num_parts:
                            return None
                    problems.bad(line, problem)
                else:
                    encoded = [fields[c.field].encode(codec) for c in id_columns]
                    bounds = np.cumsum([0] + [len(e) for e in encoded])
                    blob = np.frombuffer(b"".join(encoded) or b"\0", dtype=np.uint8)
                    intern(blob, bounds[None, :-1].astype(np.int64), bounds[None, 1:].astype(np.int64))
                    num_parts.append(np.array(values, dtype=np.float64).reshape(1, n_num))
                    line_parts.append(np.array([line], dtype=np.int64))
            line += 1
            pos = stop + 1
        del out_start, out_end, out_num
    return records()


def _judge_raw_line(raw: bytes, codec: str, split, n_fields, sep, columns, distinct):
    """``(problem, fields, values)`` of one line the kernel did not take, judged as the per-line
    parser judges it; ``fields`` is None for a blank line."""
    if len(raw) > MAX_LINE_BYTES:
        return too_long(), [], []
    text = (raw[:-1] if raw.endswith(b"\r") else raw).decode(codec)
    if not text.strip():
        return None, None, []
    fields = split(text)
    problem, values = check_fields(fields, n_fields, sep, columns, distinct)
    return problem, fields, values


def find_duplicates(group: np.ndarray, n_groups: int, value: np.ndarray, n_values: int) -> np.ndarray:
    """Indices ``(later, earlier)`` of records whose ``(group, value)`` pair repeats an earlier record's.

    ``later`` ascending; ``earlier`` is the first record with the same pair.
    Without sorting when ``n_values`` is small enough for a lookup table
    (ratings: group = user, value = item), else by a stable sort of the keys.
    """
    group = np.ascontiguousarray(group)
    value = np.ascontiguousarray(value)
    if n_values <= group.size * 2 + DENSE_LIMIT and n_groups < 2**31:
        later, earlier = grouped_duplicates(group, value, max(n_groups, 1), max(n_values, 1))
    else:
        keys = group.astype(np.int64) * n_values + value.astype(np.int64)
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        repeat = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1]) + 1
        run_start = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
        later = order[repeat]
        earlier = order[run_start[np.searchsorted(run_start, repeat, side="right") - 1]]
    pairs = np.stack([later, earlier], axis=1).astype(np.int64)
    return pairs[np.argsort(pairs[:, 0], kind="stable")]
