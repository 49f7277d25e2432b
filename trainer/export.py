"""Batch export: the top-N of every user (or of listed users) from one version, to a file.

The answers come from the serving index and rules of ``Recommend`` (the service's
own code): training items excluded, and with ``--redis`` the items recorded since
training too (the seen sets; while Redis cannot be read the export goes on without
them, with a warning, as Recommend fails open), hidden items honoured (the registry's
HIDDEN files, or Redis with ``--redis``), forgotten users left out (listed ones
too: their id is written nowhere), users the version does not know answered with
the popularity fallback and flagged. Users are scored in
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
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from ordrec.service.config import Limits
from ordrec.service.indices.models import build_index
from ordrec.service.indices.rules import hidden_mask
from ordrec.service.live.forgotten import list_hash, read_forgotten
from ordrec.service.live.hidden import RegistryBackend
from ordrec.service.live.redis_state import SEEN_KEY
from ordrec.service.storage.hidden_items import ALL_MODELS
from ordrec.trainer.atomic import atomic_output
from ordrec.trainer.data.types import DataError
from ordrec.trainer.progress import Progress

log = logging.getLogger("ordrec.export")

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


@dataclass
class ExportSummary:
    users: int = 0
    fallbacks: int = 0
    forgotten: int = 0  # users left out: forgotten ones of the version or of the list
    rows: int = 0
    seen_degraded: bool = False  # Redis could not be read: recorded items were not excluded


class RecordedItems:
    """The items each user recorded since training (the servers' seen sets), failing open:
    after the first Redis error it answers nothing and says so (``degraded``)."""

    def __init__(self, client=None):
        self.client, self.degraded = client, False

    def lookup(self, users: list[str]) -> dict[str, list[str]]:
        if self.client is None or self.degraded or not users:
            return {}
        import redis

        try:
            pipe = self.client.pipeline(transaction=False)
            for user in users:
                pipe.smembers(SEEN_KEY.format(user))
            found = pipe.execute()
        except redis.RedisError as exc:
            self.degraded = True
            log.warning("Redis unreadable (%s): items recorded since training are not excluded", exc)
            return {}
        return {u: sorted(m) for u, m in zip(users, found) if m}


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

    def batch(self, users: list[str], recorded: dict[str, list[str]] | None = None) -> Batch:
        """The batch's answers: ``recommend_many`` for known users (their training items and
        ``recorded`` ones excluded), the fallback for the rest."""
        index, n = self.index, self.n
        rows = index.users.rows(users)
        items = np.full((len(users), n), -1, dtype=np.int64)
        scores = np.full((len(users), n), np.nan, dtype=np.float64)
        known = np.flatnonzero(rows >= 0)
        found = (
            index.recommend_many(
                rows[known],
                n,
                excludes=[self.excluded(int(rows[i]), users[i], recorded) for i in known],
                eligible=self.eligible,
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
        return Batch(users, items, scores, fallback)

    def excluded(self, row: int, user: str, recorded: dict[str, list[str]] | None) -> np.ndarray:
        """Item rows Recommend excludes for the user: training items and recorded ones."""
        seen = self.index.seen(row)
        if not recorded or user not in recorded:
            return seen
        found = self.index.items.rows(recorded[user])
        return np.union1d(seen, found[found >= 0])


def _scorer(registry, model: str, n: int, version: str | None, hidden_sets) -> _Scorer:
    index = build_index(registry.load(model, version))
    if not hasattr(index, "recommend_many"):
        raise ValueError(f"model {model!r} ({index.kind}) does not answer Recommend")
    hidden = [hidden_sets.get(ALL_MODELS, frozenset()), hidden_sets.get(model, frozenset())]
    return _Scorer(index, n, hidden_mask(index.items, hidden))


_WORKER: dict[str, _Scorer] = {}


def _start_worker(location: str, cache_dir, model: str, n: int, version: str, hidden_sets) -> None:
    from ordrec.service.storage.objectstore import open_registry

    _WORKER["scorer"] = _scorer(open_registry(location, cache_dir), model, n, version, hidden_sets)


def _worker_batch(users: list[str], recorded: dict[str, list[str]]) -> Batch:
    return _WORKER["scorer"].batch(users, recorded)


def _batches(
    scorer: _Scorer, chunks: list[list[str]], workers: int, start_args: tuple, recorded: RecordedItems
) -> Iterator[Batch]:
    """The chunks' answers in order: here, or in ``workers`` processes (each loads the
    version itself, memory-mapped), at most two chunks a worker in flight; the recorded
    items are read here, a chunk at a time."""
    if workers <= 1 or len(chunks) <= 1:
        for chunk in chunks:
            yield scorer.batch(chunk, recorded.lookup(chunk))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_worker, initargs=start_args
    ) as pool:

        def submit(chunk: list[str]):
            return pool.submit(_worker_batch, chunk, recorded.lookup(chunk))

        pending = [submit(chunk) for chunk in chunks[: 2 * workers]]
        for position in range(len(chunks)):
            batch = pending.pop(0).result()
            if position + 2 * workers < len(chunks):
                pending.append(submit(chunks[position + 2 * workers]))
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
    redis_client=None,
) -> ExportSummary:
    """Write the answers to ``out`` atomically (see the module docstring); the summary.

    ``redis_client``: the servers' Redis, whose seen sets are excluded too (fail-open)."""
    fmt = export_format(out)
    version = registry.requested_version(model, version)
    hidden_sets = (hidden or RegistryBackend(registry)).read()
    forgotten = read_forgotten(registry)
    scorer = _scorer(registry, model, n, version, hidden_sets)
    summary = ExportSummary()
    listed = list(scorer.index.users.ids) if users is None else users
    hash_ = list_hash()
    users = [u for u in listed if not hash_.listed(u, forgotten)]
    summary.forgotten = len(listed) - len(users)
    recorded = RecordedItems(redis_client)
    chunks = [users[start : start + batch] for start in range(0, len(users), batch)]
    # Workers download (an s3:// registry) into the exporting process's folder, so they reuse its copy.
    start_args = (str(registry.root), getattr(registry, "cache_root", None), model, n, version, hidden_sets)
    item_ids = np.array(scorer.index.items.ids, dtype=object)
    with (
        atomic_output(out) as fh,
        Progress(f"export {model}", len(users), enabled=progress) as bar,
    ):
        writer = _WRITERS[fmt](fh)
        for answered in _batches(scorer, chunks, workers, start_args, recorded):
            summary.rows += writer.write(answered, item_ids)
            summary.users += len(answered.users)
            summary.fallbacks += int(answered.fallback.sum())
            bar.update(len(answered.users))
        writer.close()
    summary.seen_degraded = recorded.degraded
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
