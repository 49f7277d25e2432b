"""Online evaluation: how often users act on what each model version recommended.

Recommend samples what it served (``sample_rate`` of the answers) into Redis::

    ordrec:served:<model>:<user id>   hash: item id -> "<version> <unix seconds>"

expiring ``window`` seconds after the user's last sample. RecordInteractions looks every
recorded item up there: an item a served version recommended to that user within the
window is a hit, counted once: the field is deleted, and only the replica whose HDEL
removed it counts it, so two replicas recording the same interaction never both do.

Sampling leaves the request path: Recommend puts a sample on a bounded queue and a
background thread writes batches of them; a full queue or a Redis failure drops samples
(``ordrec_online_dropped_total``), never a request. Without Redis,
:class:`NoOnlineEvaluation` does nothing.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import redis

from ordrec.service.metrics import Metrics

log = logging.getLogger("ordrec.online")

SERVED_KEY = "ordrec:served:{}:{}"
# Items kept per user and model: a client asking for ever new lists cannot grow a key
# without bound (the key is dropped and starts again).
MAX_FIELDS = 1000
_BATCH = 256


class NoOnlineEvaluation:
    """Online evaluation off (no Redis): samples nothing, counts nothing."""

    def wants_sample(self) -> bool:
        return False

    def sample(self, model: str, version: str, user_id: str, item_ids: Sequence[str]) -> None:
        """Queue one served answer for the online evaluation."""

    def observe(self, user_id: str, item_ids: Sequence[str]) -> int:
        """Count the hits among a user's recorded interactions; return how many."""
        return 0

    def flush(self) -> None:
        """Wait until every queued sample is written (tests)."""

    def stop(self) -> None:
        """Stop the writer thread."""


class OnlineEvaluation(NoOnlineEvaluation):
    """Samples served answers into Redis and counts hits per model and version.

    Parameters
    ----------
    client : redis.Redis
        A client with ``decode_responses=True``.
    metrics : Metrics
        Where the served, hit and hit-rate series go.
    models : callable
        The names of the loaded models that answer Recommend.
    served_versions : callable
        A model name's loaded versions; hits of other versions are not counted (their
        series were removed when they were unloaded).
    sample_rate : float
        Share of answers sampled, in [0, 1].
    window : int
        Seconds after a sample during which an interaction counts as a hit.
    """

    def __init__(
        self,
        client: redis.Redis,
        metrics: Metrics,
        models: Callable[[], Iterable[str]],
        served_versions: Callable[[str], set[str]],
        sample_rate: float,
        window: int,
        queue_size: int = 10_000,
        clock: Callable[[], float] = time.time,
        skip_user: Callable[[str], bool] | None = None,
    ):
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"the online sample rate must be in [0, 1], got {sample_rate}")
        if window < 1:
            raise ValueError(f"the online window must be at least 1 second, got {window}")
        self.client, self.metrics = client, metrics
        self.models, self.served_versions = models, served_versions
        self.sample_rate, self.window, self.clock = sample_rate, window, clock
        # Forgotten users (service/live/forgotten.py) are never sampled: checked when queued and written.
        self.skip_user = skip_user or (lambda user_id: False)
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._totals: dict[tuple[str, str], list[int]] = {}  # (model, version) -> [served, hits]
        self._lock = threading.Lock()
        self._writer = threading.Thread(target=self._run, name="ordrec-online-writer", daemon=True)
        self._writer.start()

    # ------------------------------------------------------------ sampling
    def wants_sample(self) -> bool:
        return self.sample_rate > 0 and (self.sample_rate >= 1.0 or random.random() < self.sample_rate)

    def sample(self, model: str, version: str, user_id: str, item_ids: Sequence[str]) -> None:
        if not item_ids or self.skip_user(user_id):
            return
        try:
            self._queue.put_nowait((model, version, user_id, tuple(item_ids), self.clock()))
        except queue.Full:
            self.metrics.online_dropped.inc()

    def flush(self) -> None:
        self._queue.join()

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < _BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            samples = [s for s in batch if s is not None and not self.skip_user(s[2])]
            try:
                if samples:
                    self._write(samples)
            except Exception:  # noqa: BLE001 - the writer must survive anything
                log.exception("writing online samples failed")
            finally:
                for _ in batch:
                    self._queue.task_done()
            if len(samples) < len(batch):
                return

    def _write(self, samples: list[tuple]) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for model, version, user, items, ts in samples:
                key = SERVED_KEY.format(model, user)
                pipe.hset(key, mapping=dict.fromkeys(items, f"{version} {ts:.3f}"))
                pipe.expire(key, self.window)
                pipe.hlen(key)
            sizes = pipe.execute()[2::3]
            oversized = [
                SERVED_KEY.format(s[0], s[2]) for s, size in zip(samples, sizes) if size > MAX_FIELDS
            ]
            if oversized:
                self.client.delete(*oversized)
        except redis.RedisError as exc:
            log.debug("online samples not written: %s", exc)
            self.metrics.online_dropped.inc(len(samples))
            return
        for model, version, _, items, _ in samples:
            self._count(model, version, served=len(items))

    # ---------------------------------------------------------------- hits
    def observe(self, user_id: str, item_ids: Sequence[str]) -> int:
        items = list(dict.fromkeys(item_ids))
        models = list(self.models())
        if not items or not models:
            return 0
        try:
            found = self._served_to(user_id, models, items)
            if not found:
                return 0
            pipe = self.client.pipeline(transaction=False)
            for model, _, item in found:
                pipe.hdel(SERVED_KEY.format(model, user_id), item)
            removed = pipe.execute()
        except redis.RedisError as exc:
            log.debug("online hits not counted: %s", exc)
            return 0
        hits = [(model, version) for (model, version, _), gone in zip(found, removed) if gone]
        for model, version in hits:
            self._count(model, version, hits=1)
        return len(hits)

    def _served_to(self, user_id: str, models: list[str], items: list[str]) -> list[tuple[str, str, str]]:
        """(model, version, item) for each item a loaded version served the user within the window."""
        pipe = self.client.pipeline(transaction=False)
        for model in models:
            pipe.hmget(SERVED_KEY.format(model, user_id), items)
        oldest = self.clock() - self.window
        found = []
        for model, values in zip(models, pipe.execute()):
            loaded = self.served_versions(model)
            for item, value in zip(items, values):
                version, _, when = (value or "").partition(" ")
                if version in loaded and _float(when) >= oldest:
                    found.append((model, version, item))
        return found

    # ------------------------------------------------------------- metrics
    def _count(self, model: str, version: str, served: int = 0, hits: int = 0) -> None:
        if version not in self.served_versions(model):
            return  # unloaded meanwhile: its series are gone and stay gone
        with self._lock:
            totals = self._totals.setdefault((model, version), [0, 0])
            totals[0] += served
            totals[1] += hits
            rate = totals[1] / totals[0] if totals[0] else 0.0
        m = self.metrics
        if served:
            m.online_served.labels(model, version).inc(served)
        # touched when only served counts: the page and PromQL's hits / served then see 0, not nothing
        m.online_hits.labels(model, version).inc(hits)
        m.online_hit_rate.labels(model, version).set(rate)


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("-inf")
