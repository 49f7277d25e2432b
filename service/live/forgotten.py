"""Forgotten users (GDPR Art. 17): the registry's FORGOTTEN list and each replica's copy of it.

The list holds a keyed hash of every forgotten user id, one a line, never the id itself:
``hmac-sha256:<key id>:<HMAC-SHA256 of the id, hex>``, keyed by the deployment's secret
(``$ORDREC_FORGOTTEN_KEY_FILE``, a file holding it, or ``$ORDREC_FORGOTTEN_KEY``), which
servers and trainers read alike; the key id (8 hex digits derived from the key) tells
which key wrote an entry. Without the key nobody can test an id against the list, so
enumerating numeric ids or e-mail addresses finds nothing; whoever holds the key can.
Lists written before the key held bare sha256 entries: those still match (their user stays
forgotten) and ``ordrec-train registry rekey-forgotten`` replaces them; without a key
configured, new entries are bare sha256 too (docs/operations.md, "Forgetting a user").

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

import functools
import hashlib
import hmac
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ordrec.service.live.hidden import Backend, HiddenState, RedisBackend, RegistryBackend, apply_change
from ordrec.service.storage.idmap import IdMap

FORGOTTEN_FILE = "FORGOTTEN"
REDIS_PREFIX = "ordrec:forgotten"
SCOPE = "users"  # the one scope of the list (hidden items have one per model)
KEY_FILE_ENV = "ORDREC_FORGOTTEN_KEY_FILE"
KEY_ENV = "ORDREC_FORGOTTEN_KEY"
MIN_KEY_CHARS = 32
_KEYED = "hmac-sha256:"
_DIGEST_RE = re.compile(r"^(?:hmac-sha256:[0-9a-f]{8}:)?[0-9a-f]{64}$")


def forgotten_key() -> bytes | None:
    """The deployment's key of the list (see the module docstring); None when none is set."""
    return _load_key(os.environ.get(KEY_FILE_ENV) or None, os.environ.get(KEY_ENV) or None)


@functools.lru_cache(maxsize=4)
def _load_key(path: str | None, value: str | None) -> bytes | None:
    if path:
        text, source = Path(path).read_text().strip(), f"{KEY_FILE_ENV} ({path})"
    elif value:
        text, source = value.strip(), KEY_ENV
    else:
        return None
    if len(text) < MIN_KEY_CHARS:
        raise ValueError(f"{source}: the FORGOTTEN list's key must be at least {MIN_KEY_CHARS} characters")
    return text.encode()


@functools.lru_cache(maxsize=4)
def key_id(key: bytes) -> str:
    """8 hex digits naming ``key`` in the entries it wrote (its HMAC of a fixed text: not the key)."""
    return hmac.new(key, b"ordrec FORGOTTEN key id", hashlib.sha256).hexdigest()[:8]


def legacy_digest(user_id: str) -> str:
    """An entry of a list written before the key: the id's bare sha256, hex."""
    return hashlib.sha256(user_id.encode("utf-8")).hexdigest()


class ListHash:
    """The list's hash under one key (None: the bare sha256 of lists without a key). The
    HMAC's keyed state is computed once and copied per id."""

    def __init__(self, key: bytes | None):
        self.key = key
        self.prefix = f"{_KEYED}{key_id(key)}:" if key is not None else ""
        self._keyed = hmac.new(key, digestmod=hashlib.sha256) if key is not None else None

    def entry(self, user_id: str) -> str:
        """The entry for ``user_id``: its HMAC-SHA256 tagged with the key's id, or its sha256."""
        if self._keyed is None:
            return legacy_digest(user_id)
        mac = self._keyed.copy()
        mac.update(user_id.encode("utf-8"))
        return self.prefix + mac.hexdigest()

    def listed(self, user_id: str, digests: frozenset[str] | set[str]) -> bool:
        """Whether ``user_id`` is on the list ``digests``: by its entry, or by the bare sha256
        a list written before the key holds."""
        if not digests:
            return False
        if self.entry(user_id) in digests:
            return True
        return self._keyed is not None and _holds_legacy(digests) and legacy_digest(user_id) in digests


@functools.lru_cache(maxsize=4)
def _list_hash(key: bytes | None) -> ListHash:
    return ListHash(key)


def list_hash() -> ListHash:
    """The list's hash under the deployment's key (:func:`forgotten_key`)."""
    return _list_hash(forgotten_key())


def keyed_digest(user_id: str, key: bytes) -> str:
    """The entry for ``user_id`` under ``key``."""
    return _list_hash(key).entry(user_id)


def user_digest(user_id: str) -> str:
    """The FORGOTTEN list's entry for ``user_id`` under the deployment's key (a bare sha256
    when no key is set)."""
    return list_hash().entry(user_id)


def is_listed(user_id: str, digests: frozenset[str] | set[str]) -> bool:
    """Whether ``user_id`` is on the list ``digests`` (:meth:`ListHash.listed`); loops over
    many ids take :func:`list_hash` once instead."""
    return list_hash().listed(user_id, digests)


# the list last scanned and whether it holds bare sha256 entries, replaced whole (threads share it)
_last_scanned: list[tuple[object, bool]] = [(None, False)]


def _holds_legacy(digests: frozenset[str] | set[str]) -> bool:
    """Whether ``digests`` holds a bare sha256 entry (remembered for the last list asked about)."""
    seen, found = _last_scanned[0]
    if seen is not digests:
        found = any(not d.startswith(_KEYED) for d in digests)
        _last_scanned[0] = (digests, found)
    return found


def unmatchable(digests: Iterable[str]) -> int:
    """How many entries no id can match here: written under another key (or under a key
    when none is set). A list with any cannot be applied: its users would come back."""
    key = forgotten_key()
    ours = f"{_KEYED}{key_id(key)}:" if key is not None else None
    return sum(1 for d in digests if d.startswith(_KEYED) and (ours is None or not d.startswith(ours)))


def checked(digests: frozenset[str]) -> frozenset[str]:
    """``digests``, or ValueError when some entry cannot be matched with this process's key."""
    foreign = unmatchable(digests)
    if foreign:
        raise ValueError(
            f"the FORGOTTEN list holds {foreign} entr{'y' if foreign == 1 else 'ies'} written under"
            f" another key: set {KEY_FILE_ENV} (or {KEY_ENV}) to the deployment's key"
        )
    return digests


def parse_list(data: bytes | None) -> frozenset[str]:
    """The digests of a FORGOTTEN file (lines that are not a digest are ignored)."""
    if not data:
        return frozenset()
    return frozenset(line for line in data.decode("utf-8", "replace").splitlines() if _DIGEST_RE.match(line))


def read_forgotten(registry) -> frozenset[str]:
    """The registry's FORGOTTEN list (what the trainer applies); ValueError when this
    process's key cannot match every entry (:func:`checked`)."""
    return checked(parse_list(registry.read_root_file(FORGOTTEN_FILE)))


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


def rekey(primary: Backend | None, files: ForgottenFiles, user_ids: Iterable[str]) -> tuple[int, int]:
    """Replace the bare sha256 entries of ``user_ids`` by their keyed entries, in Redis (when
    given) and in the file, keyed entries first so no user drops off between the steps;
    (entries replaced, bare entries left for ids not given)."""
    key = forgotten_key()
    if key is None:
        raise ValueError(f"no key to rekey with: set {KEY_FILE_ENV} (or {KEY_ENV})")
    listed = read_forgotten(files.registry)
    if primary is not None:
        listed |= primary.read().get(SCOPE, frozenset())
    bare = {d for d in listed if not d.startswith(_KEYED)}
    pairs = {legacy_digest(u): keyed_digest(u, key) for u in set(user_ids)}
    pairs = {old: new for old, new in pairs.items() if old in bare}
    if not pairs:
        return 0, len(bare)
    if primary is not None:
        apply_change(primary, SCOPE, pairs.values(), True)
        apply_change(primary, SCOPE, pairs.keys(), False)
    files.add(pairs.values())
    files.registry.update_root_file(FORGOTTEN_FILE, lambda data: encode_list(parse_list(data) - pairs.keys()))
    return len(pairs), len(bare) - len(pairs)


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
        self.hash = list_hash()  # the key is read once, not per request
        self._rows: dict[tuple[int, int], tuple[frozenset[str], IdMap, np.ndarray]] = {}

    def digests(self) -> frozenset[str]:
        return self.state.sets().get(SCOPE, frozenset())

    def contains(self, user_id: str) -> bool:
        """True when ``user_id`` was forgotten (costs a hash only while the list is not empty)."""
        return self.hash.listed(user_id, self.digests())

    def unknown(self, user_ids: Sequence[str], rows: np.ndarray) -> np.ndarray:
        """``rows`` with -1 (unknown) for the forgotten users among ``user_ids``."""
        digests = self.digests()
        if not digests:
            return rows
        gone = [i for i, uid in enumerate(user_ids) if self.hash.listed(uid, digests)]
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
        listed = self.hash.listed
        found = np.array([r for r, uid in enumerate(users.ids) if listed(uid, digests)], dtype=np.int64)
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
