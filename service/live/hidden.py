"""Items an operator hid, live: the shared state, each replica's copy, and its masks.

Where the state lives:

- with Redis: a set per scope, ``ordrec:hidden:<model>`` and ``ordrec:hidden:*``
  (all models), the scopes in ``ordrec:hidden:scopes``, and a counter
  ``ordrec:hidden:generation`` bumped by every change. Each replica reads the
  counter every ``interval`` (0.2 s), so a hide reaches every replica within
  a second without depending on pub/sub delivery;
- without Redis: ``<registry>/HIDDEN`` and ``<registry>/<model>/HIDDEN``
  (written atomically, like ``PINNED``), re-read when their stat changes at
  the registry poll interval.

Each replica keeps the last sets it read. When Redis cannot be read the
last known sets stay in force, never an empty one, and :attr:`HiddenState.stale`
tells the replies (``rules_stale``). Requests pay one mask lookup: the mask
over a model's item rows is built once per (version, change) and cached.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Protocol

import numpy as np
import redis

from ordrec.service.errors import FailedPrecondition, Unavailable
from ordrec.service.indices.rules import Eligible, hidden_mask
from ordrec.service.storage.hidden_items import ALL_MODELS
from ordrec.service.storage.idmap import IdMap

log = logging.getLogger("ordrec.hidden")

CHANNEL = "ordrec:hidden"  # also the prefix of the keys (RedisBackend)

Sets = dict[str, frozenset[str]]


class Backend(Protocol):
    def token(self) -> object: ...
    def read(self) -> Sets: ...
    def change(self, scope: str, ids: Iterable[str], hide: bool) -> int: ...


class HiddenFiles(Protocol):
    """What a registry (a folder, ``Registry``, or an object store, ``S3Registry``) offers."""

    def hidden(self, scope: str) -> frozenset[str]: ...
    def hidden_scopes(self) -> Sets: ...
    def hidden_token(self) -> object: ...
    def set_hidden(self, scope: str, ids: Iterable[str]) -> None: ...


class RegistryBackend:
    """Hidden ids in the registry's HIDDEN files (deployments without Redis, and the mirror
    read at start-up while Redis is down)."""

    def __init__(self, registry: HiddenFiles):
        self.registry = registry
        self._lock = threading.Lock()  # one writer per process; cross-process writers are rare (operators)

    def token(self) -> object:
        return self.registry.hidden_token()

    def read(self) -> Sets:
        return self.registry.hidden_scopes()

    def change(self, scope: str, ids: Iterable[str], hide: bool) -> int:
        with self._lock:
            before = self.registry.hidden(scope)
            after = before | frozenset(ids) if hide else before - frozenset(ids)
            if after != before:
                self.registry.set_hidden(scope, after)
            return abs(len(after) - len(before))


class RedisBackend:
    """Hidden ids in Redis sets, shared by every replica.

    ``prefix`` names the keys (``<prefix>:<scope>``, ``<prefix>:scopes``,
    ``<prefix>:generation``, channel ``<prefix>``): ``ordrec:hidden`` for hidden
    items, ``ordrec:forgotten`` for forgotten users (``service/live/forgotten.py``).
    """

    def __init__(self, client: redis.Redis, prefix: str = CHANNEL):
        self.client = client
        self.set_key, self.scopes_key = prefix + ":{}", prefix + ":scopes"
        self.generation_key, self.channel = prefix + ":generation", prefix

    def token(self) -> object:
        return self.client.get(self.generation_key)

    def read(self) -> Sets:
        scopes = sorted(self.client.smembers(self.scopes_key))
        pipe = self.client.pipeline(transaction=True)
        for scope in scopes:
            pipe.smembers(self.set_key.format(scope))
        # the client decodes responses (redis_state.connect), so scopes and ids are str
        return {str(scope): frozenset(ids) for scope, ids in zip(scopes, pipe.execute(), strict=True) if ids}

    def change(self, scope: str, ids: Iterable[str], hide: bool) -> int:
        ids = list(ids)
        pipe = self.client.pipeline(transaction=True)
        (pipe.sadd if hide else pipe.srem)(self.set_key.format(scope), *ids)
        pipe.sadd(self.scopes_key, scope)
        pipe.incr(self.generation_key)
        pipe.publish(self.channel, scope)
        changed = pipe.execute()[0]
        return int(changed)


def apply_change(backend: Backend, scope: str, ids: Iterable[str], hide: bool, chunk: int = 10_000) -> int:
    """Hide or unhide ``ids`` in chunks (a Redis command per 10^4 ids); the number that changed."""
    ids = list(dict.fromkeys(ids))
    return (
        sum(backend.change(scope, ids[i : i + chunk], hide) for i in range(0, len(ids), chunk)) if ids else 0
    )


class HiddenState:
    """One replica's copy of the hidden sets, refreshed in the background.

    Parameters
    ----------
    backend : Backend
        Redis or the registry.
    interval : float
        Seconds between checks of the backend's change token.
    fallback : Backend, optional
        Read once at start-up when ``backend`` cannot be (Redis down at
        start): the registry files, which writers mirror (``mirror``).
    """

    def __init__(self, backend: Backend, interval: float, fallback: Backend | None = None):
        self.backend, self.interval, self.fallback = backend, interval, fallback
        self._sets: Sets = {}
        self._token: object = object()
        self._generation = 0
        self._stale = False
        self._masks: dict[tuple[str, int], tuple[int, IdMap, Eligible | None]] = {}
        self._lock = threading.Lock()  # serialises refreshes, never taken by requests
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not self.refresh() and fallback is not None:
            try:
                self._install(fallback.read())
                log.warning("hidden items: primary store unreachable, using the registry copy")
            except OSError as exc:
                log.error("hidden items: no copy readable (%s)", exc)

    # ------------------------------------------------------------ requests
    @property
    def stale(self) -> bool:
        """True while the shared store cannot be read (the last known sets apply)."""
        return self._stale

    def sets(self) -> Sets:
        return self._sets

    def mask(self, model: str, items: IdMap) -> Eligible | None:
        """Items of ``model`` hidden for it or for all models (None when none), cached per change."""
        generation, key = self._generation, (model, id(items))
        hit = self._masks.get(key)
        if hit is not None and hit[0] == generation and hit[1] is items:
            return hit[2]
        sets = self._sets
        mask = hidden_mask(items, [sets.get(ALL_MODELS, frozenset()), sets.get(model, frozenset())])
        if mask is not None:
            mask.blocked_rows  # noqa: B018 - computed here, off the Neighbors request path
        masks = {k: v for k, v in self._masks.items() if v[0] == generation and k != key}
        masks[key] = (generation, items, mask)
        self._masks = masks  # replaced whole: readers on other threads see an old or a new dict
        return mask

    def hidden_rows(self, model: str, items: IdMap) -> np.ndarray | None:
        """The hidden rows (for searches that take row lists, e.g. Neighbors)."""
        mask = self.mask(model, items)
        return None if mask is None else mask.blocked_rows

    # ------------------------------------------------------------- changes
    def change(self, scope: str, ids: Iterable[str], hide: bool, mirror: Backend | None = None) -> int:
        """Hide or unhide, then refresh at once so this replica's next request sees it."""
        ids = list(ids)
        try:
            changed = apply_change(self.backend, scope, ids, hide)
        except redis.RedisError as exc:
            # the caller must know the change may not have been stored, so it can retry
            raise Unavailable(f"Redis is unreachable, hidden items not changed: {exc}") from None
        except OSError as exc:
            raise FailedPrecondition(f"cannot write the hidden items to the registry: {exc}") from None
        if mirror is not None:
            self._mirror(mirror, scope, ids, hide)
        self.refresh()
        return changed

    @staticmethod
    def _mirror(mirror: Backend, scope: str, ids: list[str], hide: bool) -> None:
        try:
            apply_change(mirror, scope, ids, hide)
        except OSError as exc:  # e.g. a read-only registry: Redis stays the truth
            log.warning("hidden items: registry copy not written (%s)", exc)

    def refresh(self) -> bool:
        """Re-read the sets when the backend's token changed; False when it cannot be read."""
        with self._lock:
            try:
                token = self.backend.token()
                if token != self._token:
                    self._install(self.backend.read())
                    self._token = token
            except (redis.RedisError, OSError) as exc:
                if not self._stale:
                    log.warning(
                        "hidden items: cannot read the shared state (%s); the last known"
                        " %d id(s) stay hidden",
                        exc,
                        sum(map(len, self._sets.values())),
                    )
                self._stale = True
                return False
            if self._stale:
                log.info("hidden items: shared state readable again")
            self._stale = False
            return True

    def _install(self, sets: Sets) -> None:
        self._sets = sets
        self._generation += 1

    # --------------------------------------------------------------- thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ordrec-hidden", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the refresher must survive anything
                log.exception("hidden items refresh failed")
