"""Batch export: the top-N of every user (or of listed users) from one version, to a file.

The answers come from the serving index and rules of ``Recommend`` (the service's
own code): training items excluded, hidden items honoured (the registry's HIDDEN
files, or Redis with ``--redis``), forgotten users left out, users the version does
not know answered with the popularity fallback and flagged. Users are scored in
batches through ``recommend_many``, one matrix product per batch.

Formats, from the file's extension:

- ``.csv`` and ``.parquet``: one row per (user, rank): ``user, rank, item, score, fallback``;
- ``.jsonl``: one object per user: ``{"user", "fallback", "items": [...], "scores": [...]}``.

The file is written to a temporary sibling, synced and renamed into place, so a
reader never sees half an export and a failed one leaves the old file.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from ordrec.service.artifacts import ALL_MODELS
from ordrec.service.config import Limits
from ordrec.service.forgotten import read_forgotten, user_digest
from ordrec.service.hidden import RegistryBackend
from ordrec.service.models import build_index
from ordrec.service.rules import hidden_mask
from ordrec.trainer.data.types import DataError
from ordrec.trainer.progress import Progress

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}
DEFAULT_BATCH = 1000


@dataclass
class Answer:
    """One user's top-N: item ids and scores (higher is better), and whether it is the fallback."""

    user: str
    items: list[str]
    scores: list[float]
    fallback: bool


@dataclass
class ExportSummary:
    users: int = 0
    fallbacks: int = 0
    forgotten: int = 0  # users of the version left out (all users) or answered as unknown (listed)
    rows: int = 0


def export_format(path: str | os.PathLike) -> str:
    """The format named by ``path``'s extension; ValueError naming the ones there are."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"{path}: the extension names the format: {', '.join(FORMATS)}")
    return FORMATS[suffix]


def read_users(path: str | os.PathLike, max_length: int | None = None) -> list[str]:
    """User ids, one a line; a DataError naming the file and line for an empty, padded,
    over-long, repeated or non-UTF-8 one."""
    max_length = max_length or Limits().max_id_length
    users: dict[str, int] = {}
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise DataError(str(path), number, f"not UTF-8 ({exc.reason})") from None
            problem = _id_problem(line, max_length)
            if problem is None and line in users:
                problem = f"repeats the user id of line {users[line]}"
            if problem:
                raise DataError(str(path), number, problem)
            users[line] = number
    return list(users)


def _id_problem(line: str, max_length: int) -> str | None:
    if not line:
        return "empty line (one user id a line)"
    if line != line.strip() or not line.isprintable():
        return "the id has surrounding spaces or control characters"
    if len(line) > max_length:
        return f"the id is {len(line)} characters long; the limit is {max_length}"
    return None


def answers(
    registry,
    model: str,
    n: int,
    users: list[str] | None,
    version: str | None = None,
    hidden=None,
    batch: int = DEFAULT_BATCH,
) -> tuple[Iterator[list[Answer]], int, ExportSummary]:
    """Batches of answers, how many users there will be, and the summary they fill in."""
    index = build_index(registry.load(model, version))
    if not hasattr(index, "recommend_many"):
        raise ValueError(f"model {model!r} ({index.kind}) does not answer Recommend")
    sets = (hidden or RegistryBackend(registry)).read()
    eligible = hidden_mask(index.items, [sets.get(ALL_MODELS, frozenset()), sets.get(model, frozenset())])
    forgotten = read_forgotten(registry)
    summary = ExportSummary()
    if users is None:
        kept = [u for u in index.users.ids if not (forgotten and user_digest(u) in forgotten)]
        summary.forgotten = len(index.users) - len(kept)
        users = kept
    total = len(users)

    def batches() -> Iterator[list[Answer]]:
        for start in range(0, total, batch):
            chunk = users[start : start + batch]
            rows = index.users.rows(chunk)
            if forgotten:
                gone = np.array([user_digest(u) in forgotten for u in chunk], dtype=bool)
                summary.forgotten += int((gone & (rows >= 0)).sum())
                rows[gone] = -1
            yield _answer_batch(index, chunk, rows, n, eligible, summary)

    return batches(), total, summary


def _answer_batch(
    index, users: list[str], rows: np.ndarray, n: int, eligible, summary: ExportSummary
) -> list[Answer]:
    known = np.flatnonzero(rows >= 0)
    ranked: list[Any] = [None] * len(users)
    if known.size:
        found = index.recommend_many(
            rows[known], n, excludes=[index.seen(int(rows[i])) for i in known], eligible=eligible
        )
        for i, answer in zip(known.tolist(), found):
            ranked[i] = answer
    popular = None
    out = []
    for i, user in enumerate(users):
        fallback = ranked[i] is None
        if fallback:
            popular = popular or index.popular(n, eligible=eligible)
            ranked[i] = popular
        item_rows, scores = ranked[i]
        out.append(Answer(user, index.items.externals(item_rows.tolist()), scores.tolist(), fallback))
        summary.rows += len(item_rows)
    summary.users += len(users)
    summary.fallbacks += sum(a.fallback for a in out)
    return out


def export(
    registry,
    model: str,
    n: int,
    out: str | os.PathLike,
    users: list[str] | None = None,
    version: str | None = None,
    hidden=None,
    batch: int = DEFAULT_BATCH,
    progress: bool = True,
) -> ExportSummary:
    """Write the answers to ``out`` atomically (see the module docstring); the summary."""
    fmt = export_format(out)
    batches, total, summary = answers(registry, model, n, users, version, hidden, batch)
    folder = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=".ordrec-export-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh, Progress(f"export {model}", total, enabled=progress) as bar:
            writer = _WRITERS[fmt](fh)
            for chunk in batches:
                writer.write(chunk)
                bar.update(len(chunk))
            writer.close()
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    return summary


class _CsvWriter:
    def __init__(self, fh: IO[bytes]):
        import io

        self.text = io.TextIOWrapper(fh, encoding="utf-8", newline="", write_through=True)
        self.csv = csv.writer(self.text)
        self.csv.writerow(["user", "rank", "item", "score", "fallback"])

    def write(self, chunk: list[Answer]) -> None:
        self.csv.writerows(
            (a.user, rank, item, repr(score), int(a.fallback))
            for a in chunk
            for rank, (item, score) in enumerate(zip(a.items, a.scores), 1)
        )

    def close(self) -> None:
        self.text.flush()
        self.text.detach()


class _JsonlWriter:
    def __init__(self, fh: IO[bytes]):
        self.fh = fh

    def write(self, chunk: list[Answer]) -> None:
        self.fh.write(
            "".join(
                json.dumps({"user": a.user, "fallback": a.fallback, "items": a.items, "scores": a.scores})
                + "\n"
                for a in chunk
            ).encode("utf-8")
        )

    def close(self) -> None:
        pass


class _ParquetWriter:
    def __init__(self, fh: IO[bytes]):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError("a .parquet export needs pyarrow: pip install 'ordrec[parquet]'") from None
        self.pa = pa
        self.schema = pa.schema(
            [
                ("user", pa.string()),
                ("rank", pa.int32()),
                ("item", pa.string()),
                ("score", pa.float64()),
                ("fallback", pa.bool_()),
            ]
        )
        self.writer = pq.ParquetWriter(fh, self.schema)

    def write(self, chunk: list[Answer]) -> None:
        counts = [len(a.items) for a in chunk]
        columns = {
            "user": np.repeat(np.array([a.user for a in chunk], dtype=object), counts),
            "rank": np.concatenate([np.arange(1, c + 1, dtype=np.int32) for c in counts]) if chunk else [],
            "item": [item for a in chunk for item in a.items],
            "score": [score for a in chunk for score in a.scores],
            "fallback": np.repeat([a.fallback for a in chunk], counts),
        }
        self.writer.write_table(self.pa.table(columns, schema=self.schema))

    def close(self) -> None:
        self.writer.close()


_WRITERS: dict[str, Any] = {"csv": _CsvWriter, "jsonl": _JsonlWriter, "parquet": _ParquetWriter}
