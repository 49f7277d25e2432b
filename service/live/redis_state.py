"""Redis, when a deployment has one: "seen since training" items and new-version news.

Keys (shared with the trainer's ``trainer/notify.py``):

- ``ordrec:seen:<user id>``: a set of item ids recorded by RecordInteractions,
  expiring ``seen_ttl`` seconds after the last write;
- ``ordrec:ratings:<user id>``: a hash item id -> latest recorded value (text),
  same expiry; Recommend reads it to fold in users the served version has not seen;
- stream ``ordrec:events``: one entry per recorded item (fields ``user``,
  ``item``, ``ts`` and, when given, ``value`` and ``model``), trimmed to about
  ``events_maxlen`` entries: what the training job reads (``trainer/events.py``); and
  ``trending``, when it counted there (``service/live/trending.py``);
- ``ordrec:trending``, ``ordrec:trending:last``, ``ordrec:trending:epoch``: time-decayed
  popularity of the recorded items (``service/live/trending.py``);
- ``ordrec:model:<name>:version``: the newest published version (durable);
- channel ``ordrec:models``: a message per publish.

Pub/sub alone loses messages while a subscriber is disconnected, so on every
(re)connect the listener wakes the reloader, which reads the registry (the
source of truth) and so catches anything missed.

Redis failures never fail a Recommend: the seen filter fails open (training
items are still excluded; the reply says ``seen_filter_degraded``), the
``ordrec_redis_up`` gauge drops to 0, and a circuit breaker keeps requests
from each paying a timeout until a background probe sees Redis again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence

import redis

from ordrec.service.config import DEFAULT_EVENTS_MAXLEN
from ordrec.service.errors import Unavailable
from ordrec.service.live.seen import Recorded, SeenStore
from ordrec.service.live.trending import TRENDING_FIELD, TrendingSettings, TrendingWriter, counted_field
from ordrec.service.metrics import Metrics

log = logging.getLogger("ordrec.redis")

SEEN_KEY = "ordrec:seen:{}"
RATINGS_KEY = "ordrec:ratings:{}"
EVENTS_STREAM = "ordrec:events"
MAX_FOLD_IN_RATINGS = 50
VERSION_KEY = "ordrec:model:{}:version"
CHANNEL = "ordrec:models"


def connect(url: str, timeout: float) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        health_check_interval=0,
        decode_responses=True,
    )


class RedisSeenStore(SeenStore):
    """Seen items in Redis sets, failing open while Redis is unreachable."""

    def __init__(
        self,
        url: str,
        metrics: Metrics,
        timeout: float = 0.05,
        seen_ttl: int = 30 * 86400,
        on_change: Callable[[], None] | None = None,
        probe_interval: float = 0.5,
        events_maxlen: int = DEFAULT_EVENTS_MAXLEN,
        trending: TrendingSettings | None = None,
    ):
        self.client = connect(url, timeout)
        # None: interactions do not feed trending (service/live/trending.py)
        self.trending = TrendingWriter(self.client, trending) if trending else None
        self.events_maxlen = events_maxlen
        self.metrics = metrics
        self.on_change = None  # set after the first probe: the owner is still being built
        self.seen_ttl = seen_ttl
        self.probe_interval = probe_interval
        self._up = threading.Event()
        self._stop = threading.Event()
        self._set_up(self._ping())
        self.on_change = on_change
        self._prober = threading.Thread(target=self._probe_loop, name="ordrec-redis-probe", daemon=True)
        self._prober.start()

    # -------------------------------------------------------------- health
    def _ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.RedisError:
            return False

    def _set_up(self, up: bool) -> None:
        changed = up != self._up.is_set()
        if changed:
            if up:
                log.info("redis is reachable")
            else:
                log.warning("redis is unreachable: the seen filter fails open until it returns")
        (self._up.set if up else self._up.clear)()
        self.metrics.redis_up.set(1 if up else 0)
        if changed and self.on_change:
            self.on_change()

    def _probe_loop(self) -> None:
        while not self._stop.wait(self.probe_interval):
            self._set_up(self._ping())

    def healthy(self) -> bool:
        return self._up.is_set()

    def _answered(self) -> None:
        # A call that succeeded closes the circuit now, not at the next probe: one slow write
        # (a timeout) must not leave the following reads failing open for a probe interval.
        if not self._up.is_set():
            self._set_up(True)

    def close(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------ the store
    def lookup(
        self, seen_for: Sequence[str], ratings_for: Sequence[str] = ()
    ) -> tuple[dict[str, list[str]], dict[str, dict[str, str]], bool]:
        if not seen_for and not ratings_for:
            return {}, {}, False
        if not self._up.is_set():
            return {}, {}, True  # circuit open: do not pay a timeout per request
        try:
            pipe = self.client.pipeline(transaction=False)
            for user in seen_for:
                pipe.smembers(SEEN_KEY.format(user))
            for user in ratings_for:
                # At most MAX_FOLD_IN_RATINGS (all of them when there are no more), so a
                # heavy user's read and solve stay bounded.
                pipe.hrandfield(RATINGS_KEY.format(user), MAX_FOLD_IN_RATINGS, withvalues=True)
            found = pipe.execute()
        except redis.RedisError as exc:
            log.debug("seen lookup failed: %s", exc)
            self._set_up(False)
            return {}, {}, True
        self._answered()
        members, rated = found[: len(seen_for)], found[len(seen_for) :]
        recent = {u: list(m) for u, m in zip(seen_for, members) if m}
        ratings = {u: dict(zip(r[::2], r[1::2])) for u, r in zip(ratings_for, rated) if r}
        return recent, ratings, False

    def record(self, user_id: str, interactions: Sequence[Recorded]) -> int:
        """One MULTI/EXEC: the stream entries, the seen set and the latest ratings.

        It returns once EXEC has answered, so with ``appendfsync always`` an
        acknowledged interaction is on disk.
        """
        seen_key, ratings_key = SEEN_KEY.format(user_id), RATINGS_KEY.format(user_id)
        ratings = {i.item: repr(i.value) for i in interactions if i.value is not None}
        now = time.time()
        try:
            pipe = self.client.pipeline(transaction=True)
            for interaction in interactions:
                pipe.xadd(
                    EVENTS_STREAM,
                    self._stream_fields(user_id, interaction, now),
                    maxlen=self.events_maxlen,
                    approximate=True,
                )
            pipe.sadd(seen_key, *{i.item for i in interactions})
            pipe.expire(seen_key, self.seen_ttl)
            if self.trending:
                self.trending.add(pipe, [(i.item, i.timestamp) for i in interactions], now)
            if ratings:
                pipe.hset(ratings_key, mapping=ratings)
                pipe.expire(ratings_key, self.seen_ttl)
            results = pipe.execute()
        except redis.RedisError as exc:
            self._set_up(False)
            # The caller must know the outcome is unknown, so it can retry (a re-read is idempotent).
            raise Unavailable(f"Redis is unreachable, interactions may not be recorded: {exc}") from None
        self._answered()
        return int(results[len(interactions)])

    def _stream_fields(self, user_id: str, interaction: Recorded, now: float) -> dict:
        """The entry's fields; with trending, the time it counted at there (an erasure's key
        to taking it back out)."""
        fields = interaction.stream_fields(user_id)
        if self.trending:
            fields[TRENDING_FIELD] = counted_field(interaction.timestamp, now)
        return fields


class VersionListener(threading.Thread):
    """Wakes the reloader on every ``ordrec:models`` message and on every (re)connect."""

    def __init__(self, url: str, wake: Callable[[], None], retry_interval: float = 0.5):
        super().__init__(name="ordrec-redis-listener", daemon=True)
        self.url, self.wake, self.retry_interval = url, wake, retry_interval
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except redis.RedisError as exc:
                log.debug("version listener disconnected: %s", exc)
            self._stop.wait(self.retry_interval)

    def _listen(self) -> None:
        client = connect(self.url, timeout=5.0)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(CHANNEL)
            self.wake()  # anything published while we were away is in the registry
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=1.0)
                if message and message.get("type") == "message":
                    log.info("new version announced: %s", _describe(message.get("data")))
                    self.wake()
        finally:
            pubsub.close()
            client.close()


def _describe(data) -> str:
    try:
        body = json.loads(data)
        return f"{body['model']}@{body['version']}"
    except (TypeError, ValueError, KeyError):
        return str(data)[:100]
