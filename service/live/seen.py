"""Per-user "seen since training" items, excluded by Recommend.

Without Redis there is nothing recorded since training: the training items
(shipped in the artifact) are the whole seen set, and RecordInteractions
answers FAILED_PRECONDITION. The Redis-backed store lives in
``service.live.redis_state``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ordrec.service.errors import FailedPrecondition


@dataclass(frozen=True)
class Recorded:
    """One interaction to record: the item, its optional rating, when, and the model it is for."""

    item: str
    timestamp: float
    value: float | None = None
    model: str | None = None

    def stream_fields(self, user_id: str) -> dict[str, str]:
        """The ``ordrec:events`` entry: ``value`` and ``model`` only when given."""
        fields = {"user": user_id, "item": self.item, "ts": repr(self.timestamp)}
        if self.value is not None:
            fields["value"] = repr(self.value)
        if self.model:
            fields["model"] = self.model
        return fields


class SeenStore:
    """The no-Redis store: nothing recorded, never degraded."""

    def lookup(
        self, seen_for: Sequence[str], ratings_for: Sequence[str] = ()
    ) -> tuple[dict[str, list[str]], dict[str, dict[str, str]], bool]:
        """In one round trip: items recorded per user of ``seen_for`` since training, ratings
        recorded per user of ``ratings_for`` (item id -> value as text, for fold-in; users
        without any left out), and whether the lookup failed open."""
        return {}, {}, False

    def record(self, user_id: str, interactions: Sequence[Recorded]) -> int:
        """Store ``interactions`` durably; the number of items new to the user's seen set."""
        raise FailedPrecondition("RecordInteractions needs Redis: start ordrec-serve with --redis URL")

    def healthy(self) -> bool:
        return True
