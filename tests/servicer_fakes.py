"""Stand-ins for what the servicer reads around a call, shared by the in-process servicer tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ordrec.service.live.seen import SeenStore
from ordrec.service.metrics import Metrics
from ordrec.service.serving.store import ModelStore
from ordrec.service.storage.registry import Registry
from tests.test_rules import dcr_artifact


class NoDeadlineContext:
    """What the handlers read of a grpc context, with no deadline; an abort fails the test
    with the status and message."""

    def time_remaining(self):
        return None

    def abort(self, code, message):
        raise AssertionError(f"{code}: {message}")


class RecordedSeen(SeenStore):
    """Items recorded since training (what Redis would hold), and whether the lookup failed open."""

    def __init__(self, recent: dict[str, list[str]], degraded: bool):
        self.recent, self.degraded = recent, degraded

    def lookup(self, seen_for: Sequence[str], ratings_for: Sequence[str] = ()):
        return {u: self.recent[u] for u in seen_for if u in self.recent}, {}, self.degraded


class FixedSet:
    """A hidden-items (or forgotten-users) backend holding one fixed set in one scope."""

    def __init__(self, scope: str, ids: frozenset[str]):
        self.scope, self.ids = scope, ids

    def token(self):
        return self.ids

    def read(self):
        return {self.scope: self.ids} if self.ids else {}

    def change(self, scope, ids, hide):
        raise AssertionError("not changed in these tests")


def dcr_store(folder: Path, n_users: int, n_items: int, seed: int) -> ModelStore:
    """A model store serving one DCR version ("dcr") over ``n_users`` x ``n_items`` random
    factors (``tests/test_rules.py``'s artifact, with item attributes), published in ``folder``."""
    registry = Registry(folder)
    registry.publish("dcr", dcr_artifact(n_users=n_users, n_items=n_items, seed=seed))
    store = ModelStore(registry, Metrics())
    store.refresh()
    return store
