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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from ordrec.service.config import Limits
from ordrec.service.indices.models import build_index
from ordrec.service.indices.rules import hidden_mask
from ordrec.service.live.forgotten import read_forgotten, user_digest
from ordrec.service.live.hidden import RegistryBackend
from ordrec.service.storage.hidden_items import ALL_MODELS
from ordrec.trainer.atomic import atomic_output
from ordrec.trainer.data.types import DataError
from ordrec.trainer.progress import Progress

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}
DEFAULT_BATCH = 1000


@dataclass
class Batch:
    """Top-N of a batch of users: item rows and scores (``-1`` / NaN past the items there
    were), and which answers are the fallback."""

    users: list[str]
    items: np.ndarray  # int64, (users, n)
    scores: np.ndarray  # float64, (users, n)
    fallback: np.ndarray  # bool, (users,)
    forgotten: int = 0  # users of the batch the version knows but who were forgotten


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


@dataclass
class _Scorer:
    """What scoring needs, in the exporting process or in each worker."""

    index: Any
    n: int
    eligible: Any
    forgotten: frozenset[str]

    def batch(self, users: list[str]) -> Batch:
        """The batch's answers: ``recommend_many`` for known users, the fallback for the rest."""
        index, n = self.index, self.n
        rows = index.users.rows(users)
        forgotten = 0
        if self.forgotten:
            gone = np.array([user_digest(u) in self.forgotten for u in users], dtype=bool)
            forgotten = int((gone & (rows >= 0)).sum())
            rows[gone] = -1
        items = np.full((len(users), n), -1, dtype=np.int64)
        scores = np.full((len(users), n), np.nan, dtype=np.float64)
        known = np.flatnonzero(rows >= 0)
        found = (
            index.recommend_many(
                rows[known], n, excludes=[index.seen(int(rows[i])) for i in known], eligible=self.eligible
            )
            if known.size
            else []
        )
        for i, (item_rows, item_scores) in zip(known.tolist(), found):
            items[i, : len(item_rows)], scores[i, : len(item_rows)] = item_rows, item_scores
        fallback = rows < 0
        if fallback.any():
            item_rows, item_scores = index.popular(n, eligible=self.eligible)
            items[fallback, : len(item_rows)], scores[fallback, : len(item_rows)] = item_rows, item_scores
        return Batch(users, items, scores, fallback, forgotten)


def _scorer(registry, model: str, n: int, version: str | None, hidden_sets, forgotten) -> _Scorer:
    index = build_index(registry.load(model, version))
    if not hasattr(index, "recommend_many"):
        raise ValueError(f"model {model!r} ({index.kind}) does not answer Recommend")
    hidden = [hidden_sets.get(ALL_MODELS, frozenset()), hidden_sets.get(model, frozenset())]
    return _Scorer(index, n, hidden_mask(index.items, hidden), forgotten)


_WORKER: dict[str, _Scorer] = {}


def _start_worker(location: str, model: str, n: int, version: str, hidden_sets, forgotten) -> None:
    from ordrec.service.storage.objectstore import open_registry

    _WORKER["scorer"] = _scorer(open_registry(location), model, n, version, hidden_sets, forgotten)


def _worker_batch(users: list[str]) -> Batch:
    return _WORKER["scorer"].batch(users)


def _batches(scorer: _Scorer, chunks: list[list[str]], workers: int, start_args: tuple) -> Iterator[Batch]:
    """The chunks' answers in order: here, or in ``workers`` processes (each loads the
    version itself, memory-mapped), at most two chunks a worker in flight."""
    if workers <= 1 or len(chunks) <= 1:
        yield from map(scorer.batch, chunks)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_worker, initargs=start_args
    ) as pool:
        pending = [pool.submit(_worker_batch, chunk) for chunk in chunks[: 2 * workers]]
        for position in range(len(chunks)):
            batch = pending.pop(0).result()
            if position + 2 * workers < len(chunks):
                pending.append(pool.submit(_worker_batch, chunks[position + 2 * workers]))
            yield batch


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
    workers: int = 1,
) -> ExportSummary:
    """Write the answers to ``out`` atomically (see the module docstring); the summary."""
    fmt = export_format(out)
    version = registry.requested_version(model, version)
    hidden_sets = (hidden or RegistryBackend(registry)).read()
    forgotten = read_forgotten(registry)
    scorer = _scorer(registry, model, n, version, hidden_sets, forgotten)
    summary = ExportSummary()
    if users is None:
        users = [u for u in scorer.index.users.ids if not (forgotten and user_digest(u) in forgotten)]
        summary.forgotten = len(scorer.index.users) - len(users)
    chunks = [users[start : start + batch] for start in range(0, len(users), batch)]
    start_args = (str(registry.root), model, n, version, hidden_sets, forgotten)
    item_ids = np.array(scorer.index.items.ids, dtype=object)
    with (
        atomic_output(out) as fh,
        Progress(f"export {model}", len(users), enabled=progress) as bar,
    ):
        writer = _WRITERS[fmt](fh)
        for answered in _batches(scorer, chunks, workers, start_args):
            summary.rows += writer.write(answered, item_ids)
            summary.users += len(answered.users)
            summary.fallbacks += int(answered.fallback.sum())
            summary.forgotten += answered.forgotten
            bar.update(len(answered.users))
        writer.close()
    return summary


def _long(batch: Batch, item_ids: np.ndarray) -> dict[str, np.ndarray]:
    """One entry per (user, rank): the columns of the csv and parquet files."""
    valid = batch.items >= 0
    counts = valid.sum(axis=1)
    return {
        "user": np.repeat(np.array(batch.users, dtype=object), counts),
        "rank": np.cumsum(valid, axis=1, dtype=np.int32)[valid],
        "item": item_ids[batch.items[valid]],
        "score": batch.scores[valid],
        "fallback": np.repeat(batch.fallback, counts),
    }


class _CsvWriter:
    def __init__(self, fh: IO[bytes]):
        import io

        self.text = io.TextIOWrapper(fh, encoding="utf-8", newline="", write_through=True)
        self.csv = csv.writer(self.text)
        self.csv.writerow(["user", "rank", "item", "score", "fallback"])

    def write(self, batch: Batch, item_ids: np.ndarray) -> int:
        c = _long(batch, item_ids)
        scores = map(repr, c["score"].tolist())  # repr: the exact float back
        self.csv.writerows(
            zip(c["user"], c["rank"].tolist(), c["item"], scores, c["fallback"].astype(int).tolist())
        )
        return len(c["user"])

    def close(self) -> None:
        self.text.flush()
        self.text.detach()


class _JsonlWriter:
    def __init__(self, fh: IO[bytes]):
        self.fh = fh

    def write(self, batch: Batch, item_ids: np.ndarray) -> int:
        lines, rows = [], 0
        for user, items, scores, fallback in zip(
            batch.users, batch.items, batch.scores, batch.fallback.tolist()
        ):
            valid = items >= 0
            rows += int(valid.sum())
            record = {
                "user": user,
                "fallback": fallback,
                "items": item_ids[items[valid]].tolist(),
                "scores": scores[valid].tolist(),
            }
            lines.append(json.dumps(record) + "\n")
        self.fh.write("".join(lines).encode("utf-8"))
        return rows

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

    def write(self, batch: Batch, item_ids: np.ndarray) -> int:
        columns = _long(batch, item_ids)
        self.writer.write_table(self.pa.table(columns, schema=self.schema))
        return len(columns["user"])

    def close(self) -> None:
        self.writer.close()


_WRITERS: dict[str, Any] = {"csv": _CsvWriter, "jsonl": _JsonlWriter, "parquet": _ParquetWriter}
