"""The delimited-file rules every line reader shares, and its two parsers.

One set of rules (:func:`check_fields`: field counts, ids, numbers, scales,
timestamps, line length; errors name the file and the 1-based line) and two
parsers that apply them:

- the fast path (:func:`parse_records_fast`, numba kernels in
  :mod:`trainer.data.line_kernels`): the file in bounded chunks of raw bytes;
  ids are byte ranges interned into a hash table and decoded once per
  distinct id, numbers parsed in the kernel; a line the kernel does not take
  is judged on its own by :func:`check_fields`, then the kernel resumes, so
  bad lines are reported or skipped without re-reading the file. Output
  columns grow in place (int32 ids, numbers in their column's dtype), so no
  per-record Python object and no second copy of a column is made;
- the per-line parser (:func:`parse_lines`), the reference: it splits and
  validates every line, and reads what the fast path hands over.

The fast path hands the file to the per-line parser whenever it cannot be
sure to match it (a BOM, a C1 control inside an id, a check that fails after
the kernel), so whatever it returns the per-line parser returns too, and its
errors are the per-line parser's (tests/test_readers.py checks both ways).
"""

from __future__ import annotations

import bisect
import codecs
import csv
import math
import os
import re
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ordrec.service.storage.idmap import IdMap, has_control, id_map_from_lines
from ordrec.trainer.data.line_kernels import DENSE_LIMIT, grouped_duplicates, intern_ids, parse_text_lines
from ordrec.trainer.data.types import DataError, RatingScale, excerpt

CHUNK_BYTES = 1 << 24  # 16 MiB of lines per kernel call keeps memory bounded on 10M-line files
#: The longest line any reader accepts, in bytes before its newline. Longer
#: lines are errors (or skipped), read in bounded pieces and never held whole.
MAX_LINE_BYTES = 1 << 20
#: A timestamp field is 1 to this many ASCII digits (seconds since 1970 need 10).
TIMESTAMP_DIGITS = 20
_TIMESTAMP = re.compile(f"[0-9]{{1,{TIMESTAMP_DIGITS}}}")
#: A kept timestamp is stored as an int64, so it may not exceed this.
TIMESTAMP_MAX = 2**63 - 1

# The ids' rule (``has_control``), less the line break that separates ids one a line.
_CONTROL_IN_LINES = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")  # ids one a line

SEPARATOR_NAMES = {"\t": "tab", ",": "comma", "::": "'::'"}


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
        """The ids as a map, packed when there are many (ids were checked: none empty, none
        holding a line break)."""
        return id_map_from_lines("".join(f"{x}\n" for x in self.index).encode("utf-8"), distinct=True)


@dataclass
class Column:
    """One field of a record: an id (into id space ``space``) or a number."""

    field: int
    name: str
    kind: str = "id"  # "id", "float", "int", or "timestamp" (checked; kept as int64 when ``keep``)
    space: int = 0
    minimum: float | None = None  # numbers only
    scale: RatingScale | None = None  # numbers only: the values allowed
    dtype: str = "float64"  # numbers only: the type they are kept in (ratings: float32)
    keep: bool = False  # timestamps only: keep the value (in ``Records.numbers``), not only check it

    @property
    def is_number(self) -> bool:
        return self.kind in ("float", "int")

    @property
    def is_kept_stamp(self) -> bool:
        return self.kind == "timestamp" and self.keep

    @property
    def is_value(self) -> bool:
        """A column whose values ``Records.numbers`` holds: a number, or a kept timestamp."""
        return self.is_number or self.is_kept_stamp

    @property
    def value_dtype(self) -> str:
        return "int64" if self.is_kept_stamp else self.dtype


class LineGaps:
    """The line number of every record, kept as the few places where it jumps.

    Records read from consecutive lines need no entry; a blank, skipped or
    header line adds one (``at``: the first record after it, ``shift``: its
    line minus ``first_line`` minus its index). 8 bytes per gap, not per record.
    """

    def __init__(self, first_line: int):
        self.first_line = first_line
        self.at = array("q")
        self.shift = array("q")

    def note(self, record: int, line: int) -> None:
        """Record ``record`` (and those after it, until the next note) starts on ``line``."""
        shift = line - self.first_line - record
        if shift != (self.shift[-1] if self.shift else 0):
            self.at.append(record)
            self.shift.append(shift)

    def note_run(self, record: int, lines: np.ndarray) -> None:
        """Records ``record, record + 1, ...`` are on ``lines`` (ascending): a note per jump only."""
        jumps = np.flatnonzero(np.diff(lines) != 1) + 1
        for k in np.r_[0, jumps].tolist():
            self.note(record + k, int(lines[k]))

    def line(self, record: int) -> int:
        k = bisect.bisect_right(self.at, record) - 1
        return self.first_line + record + (self.shift[k] if k >= 0 else 0)

    def lines(self, n: int) -> np.ndarray:
        """Every record's line as an int64 array (for dropping records)."""
        out = self.first_line + np.arange(n, dtype=np.int64)
        for k, (start, shift) in enumerate(zip(self.at, self.shift)):
            stop = self.at[k + 1] if k + 1 < len(self.at) else n
            out[start:stop] += shift
        return out


class GrowingArray:
    """A typed column appended to in blocks and grown in place (``ndarray.resize``, a
    ``realloc``), so a column of n values never sits beside a second copy of itself."""

    def __init__(self, dtype, capacity: int = 1 << 16):
        self.data = np.empty(capacity, dtype=dtype)
        self.size = 0

    def extend(self, values) -> None:
        need = self.size + len(values)
        if need > self.data.size:
            self.data.resize(max(need, self.data.size + self.data.size // 2), refcheck=False)
        self.data[self.size : need] = values
        self.size = need

    def view(self) -> np.ndarray:
        """The values so far (a view: do not keep it across ``extend``)."""
        return self.data[: self.size]

    def finish(self) -> np.ndarray:
        """The values, the spare capacity given back."""
        self.data.resize(self.size, refcheck=False)
        return self.data


@dataclass
class Records:
    """Parsed records: id rows per id column, values per number column, and line numbers."""

    spaces: list[IdMap]
    ids: list[np.ndarray]  # int32 per id column
    numbers: list[np.ndarray]  # per value column (number or kept timestamp), in its dtype
    first_line: int  # line of record 0 when ``lines`` and ``gaps`` are None (no gaps)
    lines: np.ndarray | None = None  # int64 line per record, when given row by row
    skipped: int = 0
    fast: bool = False
    engine: str = "per-line"  # which parser read the file: "text-ids" (the fast path) or "per-line"
    gaps: LineGaps | None = None  # the line numbers as their jumps, when ``lines`` is None

    def line(self, record: int) -> int:
        if self.lines is not None:
            return int(self.lines[record])
        if self.gaps is not None:
            return self.gaps.line(int(record))
        return self.first_line + int(record)

    def keep(self, mask: np.ndarray) -> None:
        """Drop the records where ``mask`` is False (after skipping bad ones)."""
        if self.lines is None:
            gaps = self.gaps or LineGaps(self.first_line)
            self.lines = gaps.lines(mask.size)
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
    must differ on every line (no self-edges). ``fast``: try the numba path
    (:func:`parse_records_fast`) before the per-line parser (:func:`parse_lines`).
    """
    if fast:
        records = parse_records_fast(
            path, sep, n_fields, columns, n_spaces, header_lines, distinct, skip_bad_lines
        )
        if records is not None:
            return records
    return parse_lines(
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
    """``(problem, values)`` for one split line, as the per-line parser judges it.

    ``values``: one per value column (:attr:`Column.is_value`), in column order.

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
    values: list[float] = []  # numbers, and kept timestamps as ints
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
            if c.keep:
                stamp = int(text_value)
                if stamp > TIMESTAMP_MAX:
                    return f"{c.name} {excerpt(text_value)} is larger than {TIMESTAMP_MAX} (2**63 - 1)", []
                values.append(stamp)
            continue
        try:
            number: float = int(text_value) if c.kind == "int" else float(text_value)
        except ValueError:
            kind = "an integer" if c.kind == "int" else "a number"
            return f"{c.name} {excerpt(text_value)} is not {kind}", []
        if c.kind == "float" and not math.isfinite(number):
            return f"{c.name} {excerpt(text_value)} is not a finite number", []
        if c.minimum is not None and number < c.minimum:
            return f"{c.name} {excerpt(text_value)} is below the minimum {c.minimum:g}", []
        off_scale = c.scale.problem(number) if c.scale is not None else None
        if off_scale:
            return f"{c.name} {excerpt(text_value)} {off_scale}", []
        values.append(number)
    return None, values


def no_data_lines(path: str, skipped: int) -> DataError:
    """The error of a file without a data line, counting the lines skipped as bad."""
    return DataError(path, None, "no data lines" + (f" ({skipped} skipped as bad)" if skipped else ""))


def parse_lines(
    path, sep, n_fields, columns, n_spaces, header_lines, skip_bad_lines, distinct, encoding=None
) -> Records:
    """The per-line parser, the reference: every line split and judged by :func:`check_fields`."""
    problems = Problems(path, skip_bad_lines)
    split = splitter(sep)
    spaces = [IdSpace() for _ in range(n_spaces)]
    known = [space.index for space in spaces]
    id_columns = [c for c in columns if c.kind == "id"]
    num_columns = [c for c in columns if c.is_value]
    id_out = [array("i") for _ in id_columns]
    num_out = [array("q" if c.is_kept_stamp else "d") for c in num_columns]
    gaps: LineGaps | None = None
    count = 0
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
        for numbers_out, parsed in zip(num_out, values):
            numbers_out.append(parsed)
        gaps = gaps or LineGaps(number)
        gaps.note(count, number)
        count += 1
    if gaps is None:
        raise no_data_lines(path, problems.skipped)
    return Records(
        spaces=[s.idmap() for s in spaces],
        ids=[np.frombuffer(a, dtype=np.int32) for a in id_out],
        numbers=[
            np.frombuffer(a, dtype=np.int64 if c.is_kept_stamp else np.float64).astype(c.value_dtype)
            for a, c in zip(num_out, num_columns)
        ],
        first_line=gaps.first_line,
        skipped=problems.skipped,
        gaps=gaps,
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
    value_columns = [c for c in columns if c.is_value]
    id_slot = np.full(n_fields, -1, dtype=np.int64)
    num_slot = np.full(n_fields, -1, dtype=np.int64)
    stamp_slot = np.full(n_fields, -1, dtype=np.int64)
    for slot, c in enumerate(id_columns):
        id_slot[c.field] = slot
    for slot, c in enumerate(num_columns):
        num_slot[c.field] = slot
    for slot, c in enumerate(c for c in columns if c.is_kept_stamp):
        stamp_slot[c.field] = slot
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
    rules = (num_int, num_scale, digits_max, stamp_slot)
    sep1 = sep_bytes[1] if len(sep_bytes) == 2 else 0
    return sep_bytes[0], sep1, id_columns, value_columns, id_slot, num_slot, rules


def _starts_with_bom(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(3) == codecs.BOM_UTF8


def parse_records_fast(
    path, sep, n_fields, columns, n_spaces, header_lines, distinct, skip_bad_lines
) -> Records | None:
    """The numba path; None when the per-line parser must read the file."""
    layout = _layout(sep, n_fields, columns)
    if layout is None or _starts_with_bom(path):
        return None  # a BOM is rare; the per-line parser strips it
    records = _parse_text_ids(
        path, sep, n_fields, header_lines, layout, n_spaces, columns, distinct, skip_bad_lines
    )
    if records is None or not _passes_checks(records.ids, records.numbers, layout, columns, distinct):
        return None
    return records


def _passes_checks(ids, numbers, layout, columns, distinct) -> bool:
    """The per-line parser's checks that the kernel leaves to afterwards (minimum, self-edges)."""
    id_columns, num_columns = layout[2], layout[3]
    for value, c in zip(numbers, num_columns):
        if c.minimum is not None and np.any(value < c.minimum):
            return False
    if distinct is not None:
        a = id_columns.index(columns[distinct[0]])
        b = id_columns.index(columns[distinct[1]])
        if np.any(ids[a] == ids[b]):
            return False
    return True


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

    def lines(self) -> bytes:
        """The ids' bytes as read, each followed by a line break (an id never holds one: the
        kernel ends it at the line's end)."""
        arena = self.arena[: self.offsets[self.n]]
        breaks = self.offsets[1 : self.n + 1] + np.arange(self.n)  # where each id's "\n" goes
        lines = np.empty(arena.size + self.n, dtype=np.uint8)
        keep = np.ones(lines.size, dtype=bool)
        keep[breaks] = False
        lines[keep], lines[breaks] = arena, ord("\n")
        return lines.tobytes()

    def has_control(self, codec: str) -> bool:
        """Whether an id holds a control character (the per-line parser then names its line)."""
        return _CONTROL_IN_LINES.search(self.lines().decode(codec)) is not None

    def id_map(self, codec: str) -> IdMap | None:
        """The ids as a map (packed when there are many), or None when one holds a control character."""
        raw = self.lines()
        text = raw.decode(codec)
        if _CONTROL_IN_LINES.search(text):
            return None
        return id_map_from_lines(raw if codec == "utf-8" else text.encode("utf-8"), distinct=True)


def _value_sources(value_columns) -> list[tuple[bool, int]]:
    """Per value column: (a kept timestamp?, its column in the kernel's numbers or stamps)."""
    counts = [0, 0]
    sources = []
    for c in value_columns:
        sources.append((c.is_kept_stamp, counts[c.is_kept_stamp]))
        counts[c.is_kept_stamp] += 1
    return sources


class _Columns:
    """The fast path's output: id rows (int32) and values (each column's dtype) grown in
    place chunk by chunk, ids interned per id space, and the line numbers as their jumps."""

    def __init__(self, id_columns, value_columns, n_spaces: int, first_line: int):
        self.space_slots = [[s for s, c in enumerate(id_columns) if c.space == sp] for sp in range(n_spaces)]
        self.interners = [_Interner() for _ in range(n_spaces)]
        self.rows = [GrowingArray(np.int32) for _ in id_columns]
        self.numbers = [GrowingArray(c.value_dtype) for c in value_columns]
        self.sources = _value_sources(value_columns)
        self.gaps = LineGaps(first_line)
        self.count = 0

    def add(self, buf, starts, ends, numbers, stamps, line: int) -> None:
        """Records of consecutive lines from ``line`` on: id byte ranges into ``buf``, numbers
        and kept timestamps (rows x columns each)."""
        for space, slots in enumerate(self.space_slots):
            if slots:
                got = self.interners[space].add(
                    buf, np.ascontiguousarray(starts[:, slots]), np.ascontiguousarray(ends[:, slots])
                )
                for j, s in enumerate(slots):
                    self.rows[s].extend(got[:, j])
        for out, (is_stamp, k) in zip(self.numbers, self.sources):
            out.extend(stamps[:, k] if is_stamp else numbers[:, k])
        self.gaps.note(self.count, line)
        self.count += len(numbers)

    def records(self, codec: str, skipped: int) -> Records | None:
        """The records, or None when there are none or an id needs the per-line parser's verdict."""
        if self.count == 0:
            return None
        spaces = []
        for interner in self.interners:
            ids = interner.id_map(codec)
            if ids is None:
                return None  # C1 controls or U+2028/2029: the per-line parser names the line
            spaces.append(ids)
        return Records(
            spaces=spaces,
            ids=[r.finish() for r in self.rows],
            numbers=[n.finish() for n in self.numbers],
            first_line=self.gaps.first_line,
            skipped=skipped,
            fast=True,
            engine="text-ids",
            gaps=self.gaps if self.gaps.at else None,
        )


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
    sep0, sep1, id_columns, value_columns, id_slot, num_slot, rules = layout
    n_id = len(id_columns)
    n_num = sum(not c.is_kept_stamp for c in value_columns)
    n_stamp = len(value_columns) - n_num
    encoding = detect_encoding(path)
    codec = "utf-8" if encoding == "utf-8-sig" else encoding
    split = splitter(sep)
    problems = Problems(path, skip_bad_lines)
    out = _Columns(id_columns, value_columns, n_spaces, header_lines + 1)
    line = header_lines + 1
    for n, data in _chunks(path, header_lines):
        whole = np.frombuffer(data, dtype=np.uint8)
        out_start = np.empty((n, max(n_id, 1)), dtype=np.int64)
        out_end = np.empty((n, max(n_id, 1)), dtype=np.int64)
        out_num = np.empty((n, max(n_num, 1)), dtype=np.float64)
        out_stamp = np.empty((n, max(n_stamp, 1)), dtype=np.int64)
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
                out_stamp,
            )
            if rows:
                out.add(buf, out_start[:rows], out_end[:rows], out_num[:rows], out_stamp[:rows], line)
                line += rows
            if bail < 0:
                break
            # One line the kernel did not take: judge it as the per-line parser does.
            start = pos + bail
            stop = data.index(b"\n", start)
            problem, fields, values = _judge_raw_line(
                data[start:stop], codec, split, n_fields, sep, columns, distinct
            )
            if fields is not None:
                if problem is not None:
                    # Report it only if no earlier line breaks a check made afterwards (else the
                    # per-line parser finds that earlier line) and no earlier id needs its verdict.
                    if not skip_bad_lines and (
                        not _passes_checks(
                            [r.view() for r in out.rows],
                            [x.view() for x in out.numbers],
                            layout,
                            columns,
                            distinct,
                        )
                        or any(i.has_control(codec) for i in out.interners)
                    ):
                        return None
                    problems.bad(line, problem)
                else:
                    encoded = [fields[c.field].encode(codec) for c in id_columns]
                    bounds = np.cumsum([0] + [len(e) for e in encoded])
                    blob = np.frombuffer(b"".join(encoded) or b"\0", dtype=np.uint8)
                    kept = [is_stamp for is_stamp, _ in out.sources]
                    out.add(
                        blob,
                        bounds[None, :-1].astype(np.int64),
                        bounds[None, 1:].astype(np.int64),
                        np.array([v for v, s in zip(values, kept) if not s], dtype=np.float64).reshape(
                            1, n_num
                        ),
                        np.array([v for v, s in zip(values, kept) if s], dtype=np.int64).reshape(1, n_stamp),
                        line,
                    )
            line += 1
            pos = stop + 1
        del out_start, out_end, out_num, out_stamp
    return out.records(codec, problems.skipped)


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
