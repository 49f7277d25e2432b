"""Per-user "seen since training" items, excluded by Recommend.

Without Redis there is nothing recorded since training: the training items
(shipped in the artifact) are the whole seen set, and RecordInteractions
answers FAILED_PRECONDITION. The Redis-backed store lives in
``service.redis_state``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ordrec.service.errors import FailedPrecondition


class SeenStore:
    """The no-Redis store: nothing recorded, never degraded."""

    def lookup(
        self, seen_for: Sequence[str], ratings_for: Sequence[str] = ()
    ) -> tuple[dict[str, list[str]], dict[str, dict[str, str]], bool]:
        """In one round trip: items recorded per user of ``seen_for`` since training, ratings
        recorded per user of ``ratings_for`` (item id -> value as text, for fold-in; users
        without any left out), and whether the lookup failed open."""
        return {}, {}, False

    def record(self, user_id: str, item_ids: Sequence[str]) -> int:
        raise FailedPrecondition("RecordInteractions needs Redis: start ordrec-serve with --redis URL")

    def healthy(self) -> bool:
        return True
