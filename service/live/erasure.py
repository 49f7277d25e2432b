"""Erasing one user everywhere ordrec holds them: ``ForgetUser`` and ``ordrec-train registry forget``.

In order (every step is idempotent, so a failed erasure is simply asked again):

1. the user's keyed hash goes on the FORGOTTEN list (``service/live/forgotten.py``): from
   then on every replica answers them as unknown and every training drops them;
2. Redis: the seen set ``ordrec:seen:<id>``, the recorded ratings
   ``ordrec:ratings:<id>``, the online-evaluation keys ``ordrec:served:<model>:<id>``
   and the user's entries of the stream ``ordrec:events`` (XDEL, counted in
   ``ordrec:events:erased`` so the trainer does not take them for trimmed ones, and
   their contributions taken out of the trending counts; the stream is then copied
   afresh, as XDEL leaves the bytes in place);
3. the registry: the user's events in every model's accumulated events file
   (the checkpoint is rewritten), and every version whose user ids name them:
   with ``redact`` (``ordrec-train registry forget``) each is replaced by a redacted copy
   (``service/live/redaction.py``); without (the ``ForgetUser`` RPC: replicas do not
   publish) it is deleted unless it is live, pinned or a split's candidate, then
   *pending* until the next training run redacts it (``trainer/forgetting.py``);
4. Redis again, at least a second after step 1 (when every replica has reloaded the
   list), for what was recorded or sampled meanwhile, then a rewrite of its
   append-only file and snapshot, so the deleted commands leave the disk too.

Nothing here logs or stores the id itself: only its entry on the list (a keyed hash).
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

import redis

from ordrec.service.live.forgotten import add_digest, list_hash, user_digest, writers
from ordrec.service.live.online import SERVED_KEY
from ordrec.service.live.redaction import USER_SPACE, redact_versions
from ordrec.service.live.redis_state import EVENTS_STREAM, RATINGS_KEY, SEEN_KEY
from ordrec.service.live.trending import (
    AT_TS,
    EPOCH_KEY,
    LAST_KEY,
    SETTINGS_KEY,
    TRENDING_FIELD,
    TRENDING_KEY,
)
from ordrec.service.storage.artifact import ArtifactError

log = logging.getLogger("ordrec.erasure")

CHECKPOINT_FILE = "EVENTS_CHECKPOINT"  # <registry>/<model>/EVENTS_CHECKPOINT (trainer/events.py)
EVENTS_FOLDER = "events"  # <registry>/<model>/events/<sha256>.jsonl
ERASED_KEY = "ordrec:events:erased"  # stream entries erasures deleted (not trimmed: trainer/events.py)
# Seconds every replica needs to reload the list through Redis (--hidden-interval, 0.2 s, with room).
SETTLE_SECONDS = 1.0
_PAGE = 1000
_SERVED_PREFIX = SERVED_KEY.split("{}")[0]
# Per entry in one step: its trending contribution taken back out, XDEL, the count (so the
# trainer never sees a deletion it cannot explain); a retry finds the entry gone and takes
# nothing twice. A contribution counts at 2^((ts - epoch) / half_life) (ts: when it counted), whatever
# rescaling happened since; one older than the window may predate the item's last pruning
# (and is not in its score): it stays. An item left with only rounding leaves trending.
# KEYS: stream, erased, trending, last, epoch, settings. ARGV: now, then entry ids.
_XDEL_COUNTED = """
local now = tonumber(ARGV[1])
local epoch = tonumber(redis.call('GET', KEYS[5]) or '')
local half_life = tonumber(redis.call('HGET', KEYS[6], 'half_life') or '')
local window = tonumber(redis.call('HGET', KEYS[6], 'window') or '')
local deleted = 0
for i = 2, #ARGV do
  local found = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])
  if #found == 1 then
    local item, at, counted
    local fields = found[1][2]
    for f = 1, #fields, 2 do
      if fields[f] == 'item' then item = fields[f + 1] end
      if fields[f] == 'ts' then at = tonumber(fields[f + 1]) end
      if fields[f] == '__TRENDING_FIELD__' then counted = fields[f + 1] end
    end
    local ts = (counted == '__AT_TS__') and at or tonumber(counted or '')
    if item and ts and epoch and half_life and window and ts >= now - window
        and redis.call('ZSCORE', KEYS[3], item) then
      local weight = 2 ^ ((ts - epoch) / half_life)
      local left = tonumber(redis.call('ZINCRBY', KEYS[3], string.format('%.17g', -weight), item))
      if left <= weight * 1e-9 then
        redis.call('ZREM', KEYS[3], item)
        redis.call('ZREM', KEYS[4], item)
      end
    end
    deleted = deleted + redis.call('XDEL', KEYS[1], ARGV[i])
  end
end
redis.call('INCRBY', KEYS[2], deleted)
return deleted
""".replace("__TRENDING_FIELD__", TRENDING_FIELD).replace("__AT_TS__", AT_TS)
_XDEL_KEYS = (EVENTS_STREAM, ERASED_KEY, TRENDING_KEY, LAST_KEY, EPOCH_KEY, SETTINGS_KEY)


@dataclass
class Erasure:
    """What one erasure removed (the ForgetUser reply)."""

    user_digest: str
    already_forgotten: bool = False
    seen_items: int = 0
    ratings: int = 0
    served_keys: int = 0
    stream_entries: int = 0
    checkpoint_events: int = 0
    versions_removed: list[str] = field(default_factory=list)
    versions_pending: list[str] = field(default_factory=list)
    versions_redacted: list[str] = field(default_factory=list)  # "name@old -> name@copy"
    redis_rewrite: str = ""


def erase_user(
    user_id: str,
    registry,
    redis_client: redis.Redis | None = None,
    settle: float = SETTLE_SECONDS,
    redact: bool = False,
) -> Erasure:
    """Forget ``user_id`` (see the module docstring); raises on the first step that fails.

    The last Redis pass waits until ``settle`` seconds after the list was written, so
    what a replica that had not reloaded it yet recorded or sampled meanwhile goes too.
    ``redact`` (``ordrec-train registry forget``): every version naming the user, live or not, is
    replaced by its redacted copy (``service/live/redaction.py``) instead of deleted or pending.
    """
    digest = user_digest(user_id)
    redis_set, files = writers(registry, redis_client)
    report = Erasure(digest, already_forgotten=add_digest(redis_set, files, digest))
    listed = time.monotonic()
    last_id = erase_from_redis(redis_client, user_id, report) if redis_client is not None else None
    for name in registry.models():
        report.checkpoint_events += erase_from_checkpoint(registry, name, user_id)
        if redact:
            done = redact_versions(registry, name, {digest}, versions_naming(registry, name, {digest}))
            report.versions_redacted += [f"{name}@{old} -> {name}@{copy}" for old, copy in done.rewritten]
            report.versions_pending += [f"{name}@{v} ({why})" for v, why in done.failed]
            continue
        removed, pending = purge_versions(registry, name, {digest})
        report.versions_removed += [f"{name}@{v}" for v in removed]
        report.versions_pending += [f"{name}@{v}" for v in pending]
    if redis_client is not None:
        time.sleep(max(0.0, listed + settle - time.monotonic()))
        erase_from_redis(redis_client, user_id, report, after=last_id or "-")
        report.redis_rewrite = rewrite_redis_files(redis_client)
    return report


# -------------------------------------------------------------------- Redis
def erase_from_redis(
    client: redis.Redis, user_id: str, report: Erasure, after: str | None = None
) -> str | None:
    """Delete the user's keys and stream entries (those after stream id ``after`` when given);
    add the counts to ``report``; return the last stream id looked at."""
    seen, ratings = SEEN_KEY.format(user_id), RATINGS_KEY.format(user_id)
    pipe = client.pipeline(transaction=True)
    pipe.scard(seen)
    pipe.hlen(ratings)
    pipe.delete(seen, ratings)
    n_seen, n_ratings, _ = pipe.execute()
    report.seen_items += int(n_seen)
    report.ratings += int(n_ratings)
    served = [
        key
        for key in client.scan_iter(match=SERVED_KEY.format("*", glob_escape(user_id)), count=_PAGE)
        if served_user(key) == user_id
    ]
    if served:
        report.served_keys += int(client.delete(*served))
    doomed, last = stream_entries_of(client, user_id, after)
    deleted = delete_stream_entries(client, doomed)
    if deleted:
        compact_stream(client)
    report.stream_entries += deleted
    return last


def glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def served_user(key: str) -> str | None:
    """The user of an ``ordrec:served:<model>:<user>`` key (model names hold no ':'), else None."""
    if not key.startswith(_SERVED_PREFIX):
        return None
    model, colon, user = key[len(_SERVED_PREFIX) :].partition(":")
    return user if model and colon else None


def stream_entries_of(client: redis.Redis, user_id: str, after: str | None) -> tuple[list[str], str | None]:
    """Ids of the user's ``ordrec:events`` entries after ``after`` (all with None), and the last id read."""
    start, doomed, last = "-" if after in (None, "-") else f"({after}", [], after
    while True:
        entries = _page(client, start)
        doomed += [entry_id for entry_id, fields in entries if fields.get("user") == user_id]
        if entries:
            last = entries[-1][0]
            start = f"({last}"
        if len(entries) < _PAGE:
            return doomed, last


def _page(client: redis.Redis, start: str) -> list[tuple[str, dict[str, str]]]:
    """One page of ``ordrec:events`` from ``start`` (the client decodes responses to str)."""
    entries = client.xrange(EVENTS_STREAM, min=start, max="+", count=_PAGE)
    return cast("list[tuple[str, dict[str, str]]]", entries or [])


def delete_stream_entries(client: redis.Redis, ids: list[str]) -> int:
    """XDEL ``ids``, counting them in ``ordrec:events:erased`` and taking their trending
    contributions back out, each entry in one atomic step; return how many went."""
    removed = 0
    for start in range(0, len(ids), _PAGE):
        page = ids[start : start + _PAGE]
        removed += int(client.eval(_XDEL_COUNTED, len(_XDEL_KEYS), *_XDEL_KEYS, repr(time.time()), *page))
    return removed


# The tail recorded since the copy began, the stream's counters, then the swap: one atomic step.
_SWAP_COMPACTED = """
local tail = redis.call('XRANGE', KEYS[1], ARGV[1], '+')
for _, entry in ipairs(tail) do redis.call('XADD', KEYS[2], entry[1], unpack(entry[2])) end
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local field = {}
for i = 1, #info, 2 do field[info[i]] = info[i + 1] end
redis.call('XSETID', KEYS[2], field['last-generated-id'], 'ENTRIESADDED', field['entries-added'],
    'MAXDELETEDID', field['max-deleted-entry-id'])
redis.call('RENAME', KEYS[2], KEYS[1])
return #tail
"""


def compact_stream(client: redis.Redis) -> None:
    """Copy ``ordrec:events`` into a fresh stream and swap it in.

    XDEL only marks an entry deleted: its bytes stay in the stream's node (and
    so in DUMP, snapshots and the append-only file) until every entry of that
    node is gone. The copy holds the surviving entries only, under the same ids
    and counters, so the trainer's checkpoints stay valid. The bulk is copied
    page by page; what arrives meanwhile is copied in the atomic swap.
    """
    copy = EVENTS_STREAM + ":compacting"
    client.delete(copy)
    start, last = "-", None
    while True:
        entries = _page(client, start)
        pipe = client.pipeline(transaction=False)
        for entry_id, fields in entries:
            pipe.xadd(copy, cast(dict, fields), id=entry_id)
        pipe.execute()
        if entries:
            last = entries[-1][0]
            start = f"({last}"
        if len(entries) < _PAGE:
            break
    client.eval(_SWAP_COMPACTED, 2, EVENTS_STREAM, copy, "-" if last is None else f"({last}")


def rewrite_redis_files(client: redis.Redis) -> str:
    """Ask Redis to rewrite its append-only file and snapshot (which still hold the deleted
    commands); what was started, or why not."""
    try:
        aof = client.config_get("appendonly").get("appendonly") == "yes"
        save = bool(client.config_get("save").get("save"))
    except redis.ResponseError as exc:  # managed Redis often refuses CONFIG
        return f"not asked: CONFIG GET refused ({exc}); rewrite the append-only file and snapshot by hand"
    started = []
    if save:
        client.bgsave(schedule=True)
        started.append("snapshot")
    if aof:
        try:
            client.bgrewriteaof()
            started.append("append-only file rewrite")
        except redis.ResponseError as exc:  # one already running began before the deletions
            return f"append-only file rewrite not started ({exc}): forget the user again once it ends"
    return " and ".join(started) + " started" if started else ""


# ----------------------------------------------------------------- registry
def write_checkpoint(registry, model: str, head: dict, data: bytes) -> None:
    """Write the accumulated events file, then the checkpoint naming it (``head`` plus file,
    sha256 and time), then delete every other events file; each write is atomic."""
    sha = hashlib.sha256(data).hexdigest()
    path = f"{EVENTS_FOLDER}/{sha}.jsonl"
    registry.write_model_file(model, path, data)
    head = {
        **head,
        "file": path,
        "sha256": sha,
        "updated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    registry.write_model_file(model, CHECKPOINT_FILE, (json.dumps(head, indent=2) + "\n").encode())
    for old in registry.model_files(model, EVENTS_FOLDER):
        if old != path:
            registry.delete_model_file(model, old)


def erase_from_checkpoint(registry, model: str, user_id: str) -> int:
    """Remove the user's events from the model's accumulated events; return how many.

    The checkpoint's file is rewritten (and the checkpoint with it); any other
    events file naming the user is a leftover no checkpoint refers to, and goes.
    """
    head_raw = registry.read_model_file(model, CHECKPOINT_FILE)
    try:
        head = json.loads(head_raw) if head_raw else None
        current = head["file"] if head else None
    except (ValueError, KeyError, TypeError):
        head, current = None, None  # damaged: the trainer refuses it anyway; scrub every file
    removed = 0
    for path in registry.model_files(model, EVENTS_FOLDER):
        data = registry.read_model_file(model, path)
        if data is None:
            continue
        kept, dropped = without_user(data, user_id)
        if not dropped:
            continue
        if path == current and head is not None:
            head["events"] = kept.count(b"\n")
            write_checkpoint(registry, model, head, kept)
            removed += dropped
        else:
            registry.delete_model_file(model, path)
    return removed


def without_user(data: bytes, user_id: str) -> tuple[bytes, int]:
    """JSON lines without the user's events (and without unreadable lines that mention the id)."""
    kept, dropped = [], 0
    for line in data.splitlines(keepends=True):
        try:
            mine = json.loads(line).get("user") == user_id
        except (ValueError, AttributeError):
            mine = user_id.encode("utf-8") in line
        if mine:
            dropped += 1
        else:
            kept.append(line)
    return b"".join(kept), dropped


def versions_naming(registry, name: str, digests: frozenset[str] | set[str]) -> list[str]:
    """The versions of ``name`` whose user ids include a forgotten one."""
    if not digests:
        return []
    listed, found = functools.partial(list_hash().listed, digests=digests), []
    for version in registry.versions(name):
        manifest = registry.manifest(name, version)
        for entry in manifest.ids:
            if entry.space != USER_SPACE:
                continue
            data = registry.read_version_file(name, version, entry.path) or b""
            if any(map(listed, _lines(data))):
                found.append(version)
                break
    return found


def purge_versions(registry, name: str, digests: frozenset[str] | set[str]) -> tuple[list[str], list[str]]:
    """Delete the versions naming a forgotten user that may go; (removed, pending: live or protected)."""
    naming = versions_naming(registry, name, digests)
    if not naming:
        return [], []
    try:
        keep = {registry.live_version(name)[0]} | registry.protected(name)
    except ArtifactError:
        keep = registry.protected(name)
    removed, pending = [], []
    for version in naming:
        if version in keep:
            pending.append(version)
        else:
            registry.delete_version(name, version)
            removed.append(version)
    return removed, pending


def _lines(data: bytes) -> Iterable[str]:
    return data.decode("utf-8", "replace").split("\n")
