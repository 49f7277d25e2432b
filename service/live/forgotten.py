"""Forgotten users (GDPR Art. 17): the registry's FORGOTTEN list and each replica's copy of it.

The list holds the sha256 of every forgotten user id (hex, one a line), never the
id itself, so searching the registry or Redis for an erased id finds nothing:

- ``<registry>/FORGOTTEN``: the list every training reads (``trainer/forgetting.py``)
  and every replica loads; written by ``ForgetUser`` and ``ordrec-train registry forget``;
- with Redis also the set ``ordrec:forgotten:users`` and the counter
  ``ordrec:forgotten:generation``, so a replica sees an erasure within
  ``--hidden-interval`` (0.2 s) instead of the registry poll.

Replicas refresh it with the hidden items' machinery (``service/live/hidden.py``): a
change token read in the background, the last known list kept while the store
cannot be read. A forgotten user is answered as an unknown one (the fallback),
never folded in, never sampled for online evaluation, and nothing more is
recorded for them. The list only grows: a forgotten id stays forgotten.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

import numpy as np

from ordrec.service.live.hidden import Backend, HiddenState, RedisBackend, RegistryBackend, apply_change
from ordrec.service.storage.idmap import IdMap

FORGOTTEN_FILE = "FORGOTTEN"
REDIS_PREFIX = "ordrec:forgotten"
SCOPE = "users"  # the one scope of the list (hidden items have one per model)
_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


def user_digest(user_id: str) -> str:
    """The FORGOTTEN list's entry for ``user_id``: its sha256, hex."""
    return hashlib.sha256(user_id.encode("utf-8")).hexdigest()


def parse_list(data: bytes | None) -> frozenset[str]:
    """The digests of a FORGOTTEN file (lines that are not a digest are ignored)."""
    if not data:
        return frozenset()
    return frozenset(line for line in data.decode("utf-8", "replace").splitlines() if _DIGEST_RE.match(line))


def read_forgotten(registry) -> frozenset[str]:
    """The registry's FORGOTTEN list (what the trainer applies)."""
    return parse_list(registry.read_root_file(FORGOTTEN_FILE))


class ForgottenFiles:
    """The FORGOTTEN file as the hidden items' registry files (``hidden.HiddenFiles``), one scope."""

    def __init__(self, registry):
        self.registry = registry

    def hidden(self, scope: str) -> frozenset[str]:
        return read_forgotten(self.registry)

    def hidden_scopes(self) -> dict[str, frozenset[str]]:
        digests = self.hidden(SCOPE)
        return {SCOPE: digests} if digests else {}

    def hidden_token(self) -> object:
        return self.registry.root_file_token(FORGOTTEN_FILE)

    def set_hidden(self, scope: str, ids: Iterable[str]) -> None:
        self.registry.write_root_file(FORGOTTEN_FILE, encode_list(ids))

    def add(self, digests: Iterable[str]) -> frozenset[str]:
        """Add ``digests`` to the file with no concurrent writer's addition lost (a locked
        file, or S3 writes conditional on the ETag); the list as it was before."""
        added = frozenset(digests)
        before = self.registry.update_root_file(
            FORGOTTEN_FILE, lambda data: encode_list(parse_list(data) | added)
        )
        return parse_list(before)


def encode_list(digests: Iterable[str]) -> bytes:
    """A FORGOTTEN file's bytes: the digests sorted, one a line."""
    return "".join(f"{d}\n" for d in sorted(digests)).encode("ascii")


def backends(registry, redis_client=None) -> tuple[Backend, RegistryBackend]:
    """(what replicas read, the registry file): Redis when there is one, else the file itself."""
    files = RegistryBackend(ForgottenFiles(registry))
    if redis_client is None:
        return files, files
    return RedisBackend(redis_client, REDIS_PREFIX), files


def writers(registry, redis_client=None) -> tuple[Backend | None, ForgottenFiles]:
    """What an erasure writes: the Redis set (None without Redis) and the registry file."""
    redis_set = RedisBackend(redis_client, REDIS_PREFIX) if redis_client is not None else None
    return redis_set, ForgottenFiles(registry)


def add_digest(primary: Backend | None, files: ForgottenFiles, digest: str) -> bool:
    """Put ``digest`` on the list (Redis first, then the file); True when it was there already.

    The file is changed by a compare-and-swap (:meth:`ForgottenFiles.add`), so two
    concurrent erasures never lose one; it also gets the Redis set, so the file
    holds every digest a replica acts on.
    """
    known: frozenset[str] = frozenset()
    if primary is not None:
        known = primary.read().get(SCOPE, frozenset())
        apply_change(primary, SCOPE, [digest], True)
    before = files.add(known | {digest})
    return digest in (known | before)


class ForgottenUsers:
    """One replica's copy of the FORGOTTEN list, refreshed in the background."""

    def __init__(self, backend: Backend, interval: float, fallback: Backend | None = None):
        self.state = HiddenState(backend, interval, fallback)
        self._rows: dict[tuple[int, int], tuple[frozenset[str], IdMap, np.ndarray]] = {}

    def digests(self) -> frozenset[str]:
        return self.state.sets().get(SCOPE, frozenset())

    def contains(self, user_id: str) -> bool:
        """True when ``user_id`` was forgotten (costs a sha256 only while the list is not empty)."""
        digests = self.digests()
        return bool(digests) and user_digest(user_id) in digests

    def unknown(self, user_ids: Sequence[str], rows: np.ndarray) -> np.ndarray:
        """``rows`` with -1 (unknown) for the forgotten users among ``user_ids``."""
        digests = self.digests()
        if not digests:
            return rows
        gone = [i for i, uid in enumerate(user_ids) if user_digest(uid) in digests]
        if not gone:
            return rows
        rows = rows.copy()
        rows[gone] = -1
        return rows

    def rows(self, users: IdMap) -> np.ndarray:
        """The rows of forgotten users in a version's user map (cached per list and map)."""
        digests = self.digests()
        if not digests:
            return np.empty(0, dtype=np.int64)
        key = (id(digests), id(users))
        hit = self._rows.get(key)
        if hit is not None and hit[0] is digests and hit[1] is users:
            return hit[2]
        found = np.array(
            [r for r, uid in enumerate(users.ids) if user_digest(uid) in digests], dtype=np.int64
        )
        rows = {k: v for k, v in self._rows.items() if v[0] is digests}
        rows[key] = (digests, users, found)
        self._rows = rows  # replaced whole, like the hidden masks
        return found

    def refresh(self) -> bool:
        return self.state.refresh()

    def start(self) -> None:
        self.state.start()

    def stop(self) -> None:
        self.state.stop()


class ForgetfulSeen:
    """A seen store that knows nothing of forgotten users: Recommend then neither excludes
    their recorded items nor folds them in (``service/live/seen.py``'s interface)."""

    def __init__(self, inner, forgotten: ForgottenUsers):
        self.inner, self.forgotten = inner, forgotten

    def lookup(
        self, seen_for: Sequence[str], ratings_for: Sequence[str] = ()
    ) -> tuple[dict[str, list[str]], dict[str, dict[str, str]], bool]:
        if self.forgotten.digests():
            seen_for = [u for u in seen_for if not self.forgotten.contains(u)]
            ratings_for = [u for u in ratings_for if not self.forgotten.contains(u)]
        return self.inner.lookup(seen_for, ratings_for)

    def record(self, user_id: str, interactions) -> int:
        return self.inner.record(user_id, interactions)

    def healthy(self) -> bool:
        return self.inner.healthy()
