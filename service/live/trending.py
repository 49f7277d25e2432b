"""Trending: time-decayed popularity from the recorded interactions, no training run needed.

Keys (one set per deployment, written by RecordInteractions in the same MULTI/EXEC as
the seen set, see ``service/live/redis_state.py``):

- ``ordrec:trending``: sorted set item id -> decayed count times ``2^((epoch' - epoch) / half_life)``;
- ``ordrec:trending:last``: sorted set item id -> unix seconds of the item's last interaction;
- ``ordrec:trending:epoch``: the epoch the scores are relative to;
- ``ordrec:trending:settings``: hash of the writers' ``half_life`` and ``window``; with it,
  the field ``trending`` of each ``ordrec:events`` entry a write made (:func:`counted_field`)
  lets an erasure take a user's contributions back out (``service/live/erasure.py``).

Each interaction at time ``t`` adds ``2^((t - epoch) / half_life)`` to its item (the
log-space trick): every score shrinks by the same factor as time passes, so ranking the
raw scores ranks by exponentially decayed counts and no decay job ever runs. When the
weights near float limits the write rescales every score and moves the epoch (atomic: a
Lua script). An item untouched for ``window`` seconds falls out: readers skip it, and
each write removes up to :data:`PRUNE_PER_WRITE` of them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import redis

from ordrec.service.errors import InvalidArgument
from ordrec.service.storage.idmap import IdMap

log = logging.getLogger("ordrec.trending")

TRENDING_KEY = "ordrec:trending"
LAST_KEY = "ordrec:trending:last"
EPOCH_KEY = "ordrec:trending:epoch"
SETTINGS_KEY = "ordrec:trending:settings"
TRENDING_FIELD = "trending"  # a stream entry's field: when its interaction counted in trending
AT_TS = "="  # that field's value when it counted at the entry's own ``ts`` (3 bytes an entry, not 22)
PRUNE_PER_WRITE = 100
# Weights stay below 2^RESCALE_AT (a float holds up to 2^1023, and sums of many of them).
RESCALE_AT = 512
TOP_ITEMS = 1000  # items a reader keeps: enough for any n after exclusions and rules
DEFAULT_HALF_LIFE = 86400.0
DEFAULT_WINDOW = 7 * 86400.0

# KEYS: trending, last, epoch, settings.
# ARGV: now, half_life, window, prune_limit, rescale_at, then (item, ts) pairs.
_RECORD_LUA = """
local now, half_life = tonumber(ARGV[1]), tonumber(ARGV[2])
local window, prune = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('HSET', KEYS[4], 'half_life', ARGV[2], 'window', ARGV[3])
local epoch = tonumber(redis.call('GET', KEYS[3]) or '')
if not epoch then
  epoch = now
  redis.call('SET', KEYS[3], string.format('%.17g', epoch))
end
if (now - epoch) / half_life > tonumber(ARGV[5]) then
  local factor = 2 ^ (-(now - epoch) / half_life)
  local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    redis.call('ZADD', KEYS[1], string.format('%.17g', tonumber(all[i + 1]) * factor), all[i])
  end
  epoch = now
  redis.call('SET', KEYS[3], string.format('%.17g', epoch))
end
for i = 6, #ARGV, 2 do
  local ts = math.min(tonumber(ARGV[i + 1]), now)
  redis.call('ZINCRBY', KEYS[1], string.format('%.17g', 2 ^ ((ts - epoch) / half_life)), ARGV[i])
  redis.call('ZADD', KEYS[2], 'GT', string.format('%.17g', ts), ARGV[i])
end
local cutoff = '(' .. string.format('%.17g', now - window)
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cutoff, 'LIMIT', 0, prune)
if #stale > 0 then
  redis.call('ZREM', KEYS[1], unpack(stale))
  redis.call('ZREM', KEYS[2], unpack(stale))
end
return #stale
"""


@dataclass(frozen=True)
class TrendingSettings:
    """How trending decays: ``half_life`` seconds halve an interaction's weight; an item
    untouched for ``window`` seconds falls out."""

    half_life: float = DEFAULT_HALF_LIFE
    window: float = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        for name, value in (("half-life", self.half_life), ("window", self.window)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"the trending {name} must be a positive number of seconds, got {value}")


class TrendingWriter:
    """Adds recorded interactions to the trending sets, inside the caller's pipeline."""

    def __init__(self, client: redis.Redis, settings: TrendingSettings):
        self.settings = settings
        self._script = client.register_script(_RECORD_LUA)

    def add(self, pipe, items: Sequence[tuple[str, float]], now: float) -> None:
        """Queue the increments of ``(item, timestamp)`` pairs on ``pipe`` (one script call);
        each counts at :func:`counted_at` its timestamp."""
        s = self.settings
        args: list = [repr(now), repr(s.half_life), repr(s.window), PRUNE_PER_WRITE, RESCALE_AT]
        for item, ts in items:
            args += [item, repr(counted_at(ts, now))]
        self._script(keys=[TRENDING_KEY, LAST_KEY, EPOCH_KEY, SETTINGS_KEY], args=args, client=pipe)


def counted_at(ts: float, now: float) -> float:
    """The time an interaction stamped ``ts`` counts at when written at ``now``: never later."""
    return min(ts, now)


def counted_field(ts: float, now: float) -> str:
    """The stream entry's ``trending`` field: :data:`AT_TS`, or the time it counted at when
    that is not its ``ts`` (stamped in the future)."""
    counted = counted_at(ts, now)
    return AT_TS if counted == ts else repr(counted)


@dataclass(frozen=True)
class Trending:
    """The trending items, best first, with their decayed counts now."""

    item_ids: list[str]
    scores: np.ndarray

    def __len__(self) -> int:
        return len(self.item_ids)


EMPTY = Trending([], np.zeros(0, dtype=np.float32))


class TrendingIndex:
    """Reads the top trending items, kept ``cache_seconds`` so Recommend does not pay a
    Redis round trip per call; fails open (nothing trending) while Redis is down."""

    def __init__(
        self,
        client: redis.Redis | None,
        settings: TrendingSettings,
        healthy: Callable[[], bool] = lambda: True,
        cache_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
        top: int = TOP_ITEMS,
        name: str = "",
    ):
        self.name = name  # the model name answering with this list ("": none)
        self.client, self.settings, self.healthy = client, settings, healthy
        self.cache_seconds, self.clock, self.top = cache_seconds, clock, top
        self._lock = threading.Lock()
        self._cached: tuple[float, Trending] | None = None
        # The current list's rows in each version's item map: mapped once per list and map.
        self._rows: dict[int, tuple[IdMap, Trending, np.ndarray]] = {}

    def current_rows(self, items: IdMap) -> tuple[Trending, np.ndarray]:
        """The trending list and its rows in ``items`` (-1 where the version lacks an item)."""
        current = self.current()
        memo = self._rows.get(id(items))
        if memo is not None and memo[0] is items and memo[1] is current:
            return current, memo[2]
        rows = items.rows(current.item_ids) if len(current) else np.zeros(0, np.int64)
        kept = {k: m for k, m in self._rows.items() if m[1] is current} if len(self._rows) < 8 else {}
        self._rows = {**kept, id(items): (items, current, rows)}
        return current, rows

    def current(self) -> Trending:
        """The trending list (cached); empty without Redis, while it is down, or with no data."""
        now = self.clock()
        cached = self._cached
        if cached is not None and now - cached[0] < self.cache_seconds:
            return cached[1]
        with self._lock:
            cached = self._cached
            if cached is not None and now - cached[0] < self.cache_seconds:
                return cached[1]
            found = self._read(now)
            self._cached = (now, found)
            return found

    def _read(self, now: float) -> Trending:
        if self.client is None or not self.healthy():
            return EMPTY
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.zrevrange(TRENDING_KEY, 0, self.top - 1, withscores=True)
            pipe.get(EPOCH_KEY)
            ranked, epoch = pipe.execute()
            if not ranked:
                return EMPTY
            last = self.client.zmscore(LAST_KEY, [item for item, _ in ranked])
        except redis.RedisError as exc:
            log.debug("trending read failed: %s", exc)
            return EMPTY
        return decayed(ranked, last, float(epoch or now), now, self.settings)


def decayed(
    ranked: list[tuple[str, float]],
    last: Sequence[float | None],
    epoch: float,
    now: float,
    settings: TrendingSettings,
) -> Trending:
    """Raw scores as decayed counts at ``now``, items outside the window left out."""
    cutoff = now - settings.window
    # A reader whose clock is behind the writer's: counts as of the epoch (never overflows).
    factor = 2.0 ** min((epoch - now) / settings.half_life, 0.0)
    kept = [
        (item, score * factor)
        for (item, score), seen in zip(ranked, last)
        if seen is not None and seen >= cutoff
    ]
    return Trending([i for i, _ in kept], np.array([s for _, s in kept], dtype=np.float32))


def ranked_rows(
    trending: Trending,
    rows: np.ndarray,
    n: int,
    exclude: np.ndarray | None = None,
    candidates: np.ndarray | None = None,
    blocked: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` trending items as rows of a version's item map (``rows``: the row of
    each trending item, -1 when the version does not know it), honouring exclusions,
    candidates and the blocked mask (hidden items and the filter)."""
    keep = rows >= 0
    if exclude is not None and exclude.size:
        keep &= ~np.isin(rows, exclude)
    if candidates is not None:
        keep &= np.isin(rows, candidates)
    if blocked is not None:
        keep[keep] &= ~blocked[rows[keep]]
    chosen = np.flatnonzero(keep)[:n]
    return rows[chosen], trending.scores[chosen]


def check_model_request(request) -> None:
    """Refuse what the trending model cannot do: it has no factors, attributes or ratings."""
    for field, asked in (
        ("filter", bool(request.filter)),
        ("with_distribution", request.with_distribution),
        ("explain", request.explain != 0),
        ("diversity", request.diversity != 0),
        ("max_per_attribute", request.HasField("max_per_attribute")),
    ):
        if asked:
            raise InvalidArgument(f"{field}: the trending model has no item factors or attributes")
