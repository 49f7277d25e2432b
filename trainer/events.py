"""Recorded interactions as training data: a job's ``[events]`` source and ``events export``.

``RecordInteractions`` appends one entry per item to the Redis stream
``ordrec:events`` (``service/live/redis_state.py``). A job with an ``[events]``
table merges, for every ratings model, the entries recorded since that
model's checkpoint into its base data; a later value for the same (user,
item) replaces the earlier one and the base data's.

Per model, the registry keeps beside its versions

- ``events/<sha256>.jsonl``: every event the model has been trained on, the
  latest per (user, item), one JSON object a line, named by its checksum;
- ``EVENTS_CHECKPOINT``: ``{"last_id", "file", "sha256", "events"}``: the
  last stream id consumed and the accumulated file.

The checkpoint is replaced (atomically) only after a successful publish. A
crash, a failure or a gate rejection leaves the old one, so the next run reads
the same entries again; merging by (user, item) makes that re-read
idempotent: nothing is lost and nothing counts twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ordrec.service.live.erasure import (
    CHECKPOINT_FILE,
    ERASED_KEY,
    compact_stream,
    delete_stream_entries,
    write_checkpoint,
)
from ordrec.service.live.forgotten import list_hash, read_forgotten
from ordrec.service.live.redis_state import EVENTS_STREAM
from ordrec.service.storage.idmap import IdMap, has_control
from ordrec.trainer.data.interactions import aggregate, check_levels
from ordrec.trainer.data.types import Ratings, RatingScale

DEFAULT_PAGE = 1000
_ID_RE = re.compile(r"^(\d{1,20})-(\d{1,20})$")

log = logging.getLogger("ordrec.job")


class EventsError(ValueError):
    """The events source cannot be read as it must be (Redis down, checkpoint damaged, events trimmed)."""


def stream_id(text: str) -> tuple[int, int]:
    """``"1700000000000-3"`` as (milliseconds, sequence); ValueError for anything else."""
    match = _ID_RE.match(text)
    if not match:
        raise ValueError(f"{text[:80]!r} is not a stream id (MILLISECONDS-SEQUENCE, e.g. 1700000000000-0)")
    return int(match[1]), int(match[2])


# ------------------------------------------------------------------ events
@dataclass(frozen=True)
class Event:
    """One stream entry: who did what to which item, with an optional rating and model."""

    id: str
    user: str
    item: str
    ts: float
    value: float | None = None
    model: str | None = None

    @classmethod
    def from_entry(cls, entry_id: str, fields: Mapping[str, str]) -> Event:
        """An ``ordrec:events`` entry; ValueError naming the entry when it is malformed."""
        try:
            user, item, ts = fields["user"], fields["item"], float(fields["ts"])
            value = float(fields["value"]) if "value" in fields else None
        except (KeyError, ValueError) as exc:
            raise ValueError(f"stream entry {entry_id}: malformed ({type(exc).__name__}: {exc})") from None
        if not user or not item or not math.isfinite(ts) or (value is not None and not math.isfinite(value)):
            raise ValueError(f"stream entry {entry_id}: empty id or non-finite number")
        if has_control(user) or has_control(item):  # an artifact could not hold it: one id a line
            raise ValueError(f"stream entry {entry_id}: an id holds a line break or control character")
        return cls(entry_id, user, item, ts, value, fields.get("model") or None)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "user": self.user, "item": self.item, "ts": self.ts}
        if self.value is not None:
            data["value"] = self.value
        if self.model is not None:
            data["model"] = self.model
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Event:
        return cls(
            str(data["id"]),
            str(data["user"]),
            str(data["item"]),
            float(data["ts"]),
            None if data.get("value") is None else float(data["value"]),
            data.get("model"),
        )


def merge(latest: dict[tuple[str, str], Event], events: Iterable[Event]) -> None:
    """Fold ``events`` (in stream order) into ``latest``, keyed by (user, item).

    A later event replaces an earlier one, except that an event without a
    value never erases a recorded rating (a click after a rating is not a
    new rating). Merging the same events twice changes nothing.
    """
    for event in events:
        key = (event.user, event.item)
        known = latest.get(key)
        if known is not None and event.value is None and known.value is not None:
            continue
        if known is None or stream_id(event.id) >= stream_id(known.id):
            latest[key] = event


# ------------------------------------------------------------------ stream
def read_pages(client, after: str | None, page: int = DEFAULT_PAGE) -> Iterator[tuple[list, int | None]]:
    """Pages of ``ordrec:events`` entries after id ``after`` (all with None), the last one short.

    Each page comes with the stream's ``entries-added`` (Redis >= 7, else None)
    read in the same MULTI/EXEC: after the short last page it is the position
    of the last entry read in the stream's whole history.
    """
    start = "-" if after is None else f"({after}"
    while True:
        pipe = client.pipeline(transaction=True)
        pipe.xrange(EVENTS_STREAM, min=start, max="+", count=page)
        pipe.xinfo_stream(EVENTS_STREAM)
        entries, info = pipe.execute(raise_on_error=False)
        if isinstance(entries, Exception):
            raise entries
        yield entries, None if isinstance(info, Exception) else info.get("entries-added")
        if len(entries) < page:
            return
        start = f"({entries[-1][0]}"


def lost_after(client, position: int | None) -> int:
    """How many entries after history position ``position`` are no longer in the stream.

    Trimming (and XDEL) remove entries from the stream but not from
    ``entries-added``, so ``entries-added - length`` entries are gone; those
    past the checkpoint's position were never read. Entries a ForgetUser
    deleted (counted in ``ordrec:events:erased``) are not lost: they are left
    out of the count (it may then miss trimmed entries as many as those erased
    before the checkpoint: a warning not given, never a false one). A stream
    that is missing or counts fewer entries than the checkpoint was reset: -1.
    """
    try:
        info = client.xinfo_stream(EVENTS_STREAM)
    except Exception as exc:  # redis' ResponseError: the stream does not exist (yet, or any more)
        if "no such key" not in str(exc).lower():
            raise
        return -1 if position else 0
    added = info.get("entries-added")
    if added is None:
        log.warning("redis < 7 reports no entries-added: trimmed events cannot be detected")
        return 0
    if position is not None and added < position:
        return -1
    erased = int(client.get(ERASED_KEY) or 0)
    return max(0, added - info["length"] - erased - (position or 0))


# ------------------------------------------------------------- checkpoint
@dataclass
class Checkpoint:
    """What a model has been trained on: the last stream id and the accumulated events."""

    last_id: str | None = None
    latest: dict[tuple[str, str], Event] = field(default_factory=dict)
    position: int | None = None  # the stream's entries-added when last_id was read (see lost_after)

    def encode(self) -> tuple[bytes, str]:
        """The accumulated file (sorted, so equal contents give equal bytes) and its sha256."""
        lines = [json.dumps(e.to_json(), sort_keys=True) + "\n" for _, e in sorted(self.latest.items())]
        data = "".join(lines).encode("utf-8")
        return data, hashlib.sha256(data).hexdigest()


def load_checkpoint(registry, model: str) -> Checkpoint:
    """The model's checkpoint with its accumulated events, checksum verified; empty when none."""
    raw = registry.read_model_file(model, CHECKPOINT_FILE)
    if raw is None:
        return Checkpoint()
    where = f"{registry.root}/{model}/{CHECKPOINT_FILE}"
    try:
        head = json.loads(raw)
        last_id, path, sha, position = head["last_id"], head["file"], head["sha256"], head.get("position")
        if last_id is not None:  # None: published before the stream had any entry
            stream_id(last_id)
        if position is not None and not isinstance(position, int):
            raise TypeError(f"position {position!r} is not an integer")
    except (ValueError, KeyError, TypeError) as exc:
        raise EventsError(
            f"{where}: damaged ({exc}); restore it or delete it to re-read the stream"
        ) from None
    data = registry.read_model_file(model, path)
    if data is None or hashlib.sha256(data).hexdigest() != sha:
        problem = "is missing" if data is None else "does not match its sha256"
        raise EventsError(f"{where}: the accumulated events file {path} {problem}")
    latest: dict[tuple[str, str], Event] = {}
    try:
        merge(latest, (Event.from_json(json.loads(line)) for line in data.decode("utf-8").splitlines()))
    except (ValueError, KeyError, TypeError) as exc:
        raise EventsError(f"{registry.root}/{model}/{path}: unreadable ({exc})") from None
    return Checkpoint(last_id, latest, position)


def save_checkpoint(registry, model: str, checkpoint: Checkpoint) -> None:
    """Write the accumulated file, then replace the checkpoint naming it, then drop older files.

    Each write is atomic; a crash between them leaves the old checkpoint valid
    (an unreferenced file is removed by the next save).
    """
    data, _ = checkpoint.encode()
    head = {"last_id": checkpoint.last_id, "position": checkpoint.position, "events": len(checkpoint.latest)}
    write_checkpoint(registry, model, head, data)


# --------------------------------------------------------------- the feed
@dataclass
class Counts:
    """What one model's run did with the events (logged, and the operator's alert inputs)."""

    read: int = 0  # new stream entries read
    malformed: int = 0
    other_model: int = 0  # entries naming another model
    without_value: int = 0  # accumulated events skipped: explicit ratings need a value
    off_scale: int = 0  # accumulated events skipped: value not on the data's rating scale
    trained: int = 0  # accumulated events in the training data
    forgotten: int = 0  # accumulated events of forgotten users, dropped
    erased: int = 0  # new stream entries of forgotten users, deleted from the stream


class EventFeed:
    """One model's events: the checkpoint, the entries after it, and the commit after publishing."""

    def __init__(
        self,
        registry,
        model: str,
        client,
        page: int = DEFAULT_PAGE,
        on_trimmed: str = "fail",
        erase: bool = True,
    ):
        self.registry, self.model, self.client = registry, model, client
        self.page, self.on_trimmed = page, on_trimmed
        self.erase = erase  # delete the forgotten users' entries it reads (False: a dry run)
        self.counts = Counts()
        self._digests: frozenset[str] = frozenset()
        self._forgotten_entries: list[str] = []
        self.checkpoint = load_checkpoint(registry, model)
        self.next = Checkpoint(
            self.checkpoint.last_id, dict(self.checkpoint.latest), self.checkpoint.position
        )

    def read(self) -> None:
        """Merge the entries after the checkpoint into :attr:`next` (nothing is stored yet),
        and delete those of forgotten users from the stream (other producers may write them
        after an erasure): the checkpoint moves past them, so no later run would."""
        import redis

        self._digests = read_forgotten(self.registry)
        try:
            self._check_lost()
            for entries, added in read_pages(self.client, self.checkpoint.last_id, self.page):
                merge(self.next.latest, self._parse(entries))
                if entries:
                    self.next.last_id = entries[-1][0]
                if added is not None:
                    self.next.position = added
            if self.erase and self._forgotten_entries:
                self.counts.erased = delete_stream_entries(self.client, self._forgotten_entries)
                compact_stream(self.client)  # XDEL leaves the bytes in place
        except redis.RedisError as exc:
            raise EventsError(f"cannot read {EVENTS_STREAM}: {exc}") from None

    def _check_lost(self) -> None:
        lost = lost_after(self.client, self.checkpoint.position)
        if lost == 0:
            return
        since = self.checkpoint.last_id
        what = (
            "the stream was reset (deleted, or Redis lost its data)"
            if lost < 0
            else f"{lost} entries were trimmed"
        )
        message = (
            f"{EVENTS_STREAM}: {what}"
            + (f" after this model's checkpoint {since}" if since else " before this model's first run")
            + ": they are lost to training (raise ordrec-serve --events-maxlen or run the job more often)"
        )
        if since is None or self.on_trimmed == "warn":
            log.warning("model=%s %s", self.model, message)
            return
        raise EventsError(message + '; set [events] on_trimmed = "warn" to train without them')

    def _parse(self, entries: list[tuple[str, dict]]) -> Iterator[Event]:
        listed = list_hash().listed  # the key read once a page, not once an entry
        for entry_id, fields in entries:
            self.counts.read += 1
            if listed(str(fields.get("user", "")), self._digests):
                self._forgotten_entries.append(entry_id)
                continue
            try:
                event = Event.from_entry(entry_id, fields)
            except ValueError as exc:
                self.counts.malformed += 1
                log.warning("model=%s skipped %s", self.model, exc)
                continue
            if event.model not in (None, self.model):
                self.counts.other_model += 1
                continue
            yield event

    def forget(self, digests: frozenset[str]) -> int:
        """Drop forgotten users' events from :attr:`next` (so the next checkpoint never
        holds them again); return how many went."""
        listed = list_hash().listed
        doomed = [key for key in self.next.latest if listed(key[0], digests)] if digests else []
        for key in doomed:
            del self.next.latest[key]
        return len(doomed)

    def apply(self, base: Ratings, scale: RatingScale | None) -> Ratings:
        """``base`` with every accumulated event it can take merged in (forgotten users'
        events dropped first): for explicit ratings, those with a value on ``scale``; for
        implicit data, every one (an event without a value is one interaction, a value
        below 0 is off scale)."""
        self.counts.forgotten += self.forget(read_forgotten(self.registry))
        usable = []
        for event in self.next.latest.values():
            if event.value is None and not base.implicit:
                self.counts.without_value += 1
            elif event.value is not None and _off_scale(event.value, base, scale):
                self.counts.off_scale += 1
            else:
                usable.append(event)
        self.counts.trained = len(usable)
        if base.implicit:
            return with_interactions(base, usable)
        merged = with_events(base, usable)
        if scale is None and usable:  # no scale checked the recorded values: count their levels
            check_levels(merged.rating, merged.source, "rating")
        return merged

    def commit(self) -> None:
        """Advance the checkpoint: call only after the version trained on :attr:`next` is published.

        The FORGOTTEN list is read again, so a user forgotten while the job ran
        does not come back in the checkpoint.
        """
        self.counts.forgotten += self.forget(read_forgotten(self.registry))
        save_checkpoint(self.registry, self.model, self.next)

    def summary(self) -> str:
        c = self.counts
        return (
            f"events since={self.checkpoint.last_id or '-'} until={self.next.last_id or '-'} read={c.read}"
            f" accumulated={len(self.next.latest)} trained={c.trained} without_value={c.without_value}"
            f" off_scale={c.off_scale} malformed={c.malformed} other_model={c.other_model}"
            f" forgotten={c.forgotten} erased={c.erased}"
        )


def _off_scale(value: float, base: Ratings, scale: RatingScale | None) -> bool:
    """Whether a recorded value cannot join ``base``: off its rating scale, or a negative strength."""
    if base.implicit:
        return value < 0
    return scale is not None and scale.problem(value) is not None


@dataclass
class _EventRows:
    """Events as rows of ``base``'s id maps (extended by the ids new to it)."""

    users: IdMap
    items: IdMap
    user: np.ndarray  # int32
    item: np.ndarray  # int32
    time: np.ndarray  # int64 Unix seconds (the ``ts`` recorded)

    @classmethod
    def of(cls, base: Ratings, events: list[Event]) -> _EventRows:
        users = _extended(base.users, (e.user for e in events))
        items = _extended(base.items, (e.item for e in events))
        return cls(
            users,
            items,
            users.rows(e.user for e in events).astype(np.int32),
            items.rows(e.item for e in events).astype(np.int32),
            np.array([int(e.ts) for e in events], dtype=np.int64),
        )

    def times(self, base: Ratings, keep: slice | np.ndarray = slice(None)) -> np.ndarray | None:
        """The base rows' times (``keep``), then the events': only when ``base`` has times."""
        return None if base.time is None else np.concatenate([base.time[keep], self.time])


def with_events(base: Ratings, events: list[Event]) -> Ratings:
    """``base`` plus ``events`` (at most one per (user, item)); an event replaces the base rating.

    Users and items new to ``base`` get new rows after its own. When ``base`` has
    timestamps, an event's row takes its recorded time.
    """
    if not events:
        return base
    rows = _EventRows.of(base, events)
    rating = np.array([e.value for e in events], dtype=np.float32)
    width = np.int64(len(rows.items))
    replaced = np.isin(
        base.user.astype(np.int64) * width + base.item, rows.user.astype(np.int64) * width + rows.item
    )
    keep = ~replaced
    return replace(
        base,
        users=rows.users,
        items=rows.items,
        user=np.concatenate([base.user[keep], rows.user]),
        item=np.concatenate([base.item[keep], rows.item]),
        rating=np.concatenate([base.rating[keep], rating]),
        time=rows.times(base, keep),
        source=f"{base.source} + {EVENTS_STREAM}",
    )


def with_interactions(base: Ratings, events: list[Event]) -> Ratings:
    """Implicit ``base`` plus ``events`` as interactions: an event adds its value, or 1
    without one, to its (user, item)'s strength (a new pair gets a row after the base's),
    and the pair's time becomes the later of the two when ``base`` has timestamps."""
    if not events:
        return base
    rows = _EventRows.of(base, events)
    strength = np.array([1.0 if e.value is None else e.value for e in events], dtype=np.float32)
    folded = aggregate(
        np.concatenate([base.user, rows.user]),
        np.concatenate([base.item, rows.item]),
        len(rows.users),
        len(rows.items),
        np.concatenate([base.rating, strength]),
        rows.times(base),
    )
    return replace(
        base,
        users=rows.users,
        items=rows.items,
        user=folded.user,
        item=folded.item,
        rating=folded.strength,
        time=folded.time,
        source=f"{base.source} + {EVENTS_STREAM}",
    )


def _extended(ids: IdMap, more: Iterable[str]) -> IdMap:
    new = [x for x in dict.fromkeys(more) if x not in ids]
    return ids.extended(new) if new else ids


# ------------------------------------------------------------------ export
EXPORT_COLUMNS = ("id", "user", "item", "value", "ts", "model")


def export(client, out: str, since: str | None = None, fmt: str = "csv", page: int = DEFAULT_PAGE) -> tuple:
    """Write the raw entries after ``since`` to ``out`` (atomically); return (count, last id).

    Every entry is written as recorded, repeats included: the warehouse keeps
    the history, the trainer keeps the latest per (user, item). Pass the last
    id back as ``since`` to export only what is new.
    """
    import csv

    from ordrec.trainer.atomic import atomic_output

    if since is not None:
        stream_id(since)
    count, last = 0, since
    with atomic_output(out, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh) if fmt == "csv" else None
        if writer:
            writer.writerow(EXPORT_COLUMNS)
        for entries, _ in read_pages(client, since, page):
            for entry_id, fields in entries:
                row = {"id": entry_id, **fields}
                if writer:
                    writer.writerow([row.get(c, "") for c in EXPORT_COLUMNS])
                else:
                    fh.write(json.dumps({c: row[c] for c in EXPORT_COLUMNS if c in row}) + "\n")
            count += len(entries)
            last = entries[-1][0] if entries else last
    return count, last
