"""Dynamic batching of Recommend's scoring (TF Serving's batcher, Triton's dynamic batcher).

Concurrent Recommend calls queue their users here; whoever finds the scorer
free scores everything queued at that moment as one batch (per model version:
one matrix product, or the item index's searches, then one selection kernel,
``RecommenderIndex.recommend_batch``) and hands every caller its answers. There
is no timer: at low load a call finds the scorer free and scores itself at
once, and a batch is whatever queued while the previous one was scored.

The scorer is not a thread of its own (waking one costs more than a small
batch's work on these machines): the calling threads take turns. The one that
finds the scorer free leads; the others wait on their own lock; when a batch
is done its leader wakes the callers it answered and hands the lead to the
oldest call still queued, which scores the next batch. Every waiting call is
woken exactly once, with its answer or with the lead.

Admission: a call arriving while ``max_queue`` calls wait is refused
RESOURCE_EXHAUSTED at once (a full queue only grows the tail), and a call
whose deadline passed while it waited is answered DEADLINE_EXCEEDED without
being scored. A batch holds at most ``max_batch`` users (a single call with
more is scored alone).

Only versions that score densely and dearly queue (``min_work``: the
multiply-adds of one user's pass, ``RecommenderIndex.scoring_work``). On
ML-100K (1,682 items x 80) a queued call's sleep and wake-up cost more than
the shared pass saves, and the approximate index searches each user on its
own; their calls score on their own threads, as without a batcher.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ordrec.service.config import DEFAULT_BATCH_MAX_QUEUE, DEFAULT_BATCH_MAX_SIZE, DEFAULT_BATCH_MIN_WORK
from ordrec.service.errors import DeadlineExceeded, ResourceExhausted
from ordrec.service.indices.models.base import Ranked, RecommenderIndex
from ordrec.service.indices.rules import Eligible


class _Call:
    """One call's scoring work, where its answer (or error) is left, and how it is woken."""

    __slots__ = (
        "index",
        "user_rows",
        "n",
        "excludes",
        "candidates",
        "eligible",
        "deadline",
        "queued_at",
        "answers",
        "error",
        "ready",
        "leads",
    )

    def __init__(
        self,
        index: RecommenderIndex,
        user_rows: np.ndarray,
        n: int,
        excludes: list[np.ndarray | None],
        candidates: np.ndarray | None,
        eligible: Eligible | None,
        deadline: float | None,
    ) -> None:
        self.index, self.user_rows, self.n, self.excludes = index, user_rows, n, excludes
        self.candidates, self.eligible, self.deadline = candidates, eligible, deadline
        self.queued_at = 0.0
        self.answers: list[Ranked] | None = None
        self.error: Exception | None = None
        # Held while the call waits; released once, with its answer or the lead. A bare lock
        # (C code) rather than an Event, whose wait and set run Python code under the GIL.
        self.ready: threading.Lock | None = None
        self.leads = False

    def outcome(self) -> list[Ranked]:
        if self.error is not None:
            raise self.error
        assert self.answers is not None  # set by the batch that scored this call
        return self.answers


@dataclass(frozen=True)
class BatchObserver:
    """Where the batcher reports (Prometheus in the server, nothing in tests that need not)."""

    batch_users: Callable[[int], None] = lambda users: None
    queue_seconds: Callable[[float], None] = lambda seconds: None
    shed: Callable[[str], None] = lambda reason: None


class RecommendBatcher:
    """Scores concurrent Recommend calls together; see the module docstring."""

    def __init__(
        self,
        max_batch: int = DEFAULT_BATCH_MAX_SIZE,
        max_queue: int = DEFAULT_BATCH_MAX_QUEUE,
        observer: BatchObserver | None = None,
        min_work: int = DEFAULT_BATCH_MIN_WORK,
    ):
        if max_batch < 1 or max_queue < 0 or min_work < 0:
            raise ValueError("max_batch must be at least 1, max_queue and min_work at least 0")
        self.max_batch, self.max_queue, self.min_work = max_batch, max_queue, min_work
        self.observer = observer or BatchObserver()
        self._lock = threading.Lock()
        self._queue: deque[_Call] = deque()
        self._busy = False

    def queued(self) -> int:
        """Calls waiting for the scorer now."""
        return len(self._queue)

    def recommend(
        self,
        index: RecommenderIndex,
        user_rows: np.ndarray,
        n: int,
        *,
        excludes: list[np.ndarray | None],
        candidates: np.ndarray | None = None,
        eligible: Eligible | None = None,
        deadline: float | None = None,
    ) -> list[Ranked]:
        """``index.recommend_many(user_rows, n, ...)``, scored with whatever else is queued.

        ``deadline`` is a ``time.monotonic()`` instant after which the call is not scored.
        A version whose one-user pass costs less than ``min_work`` multiply-adds (or that
        searches per user) is scored on the caller's thread: queueing costs it more than
        sharing a pass saves (docs/serving-cost.md).
        """
        if index.scoring_work() < self.min_work:
            return index.recommend_many(
                user_rows, n, excludes=excludes, candidates=candidates, eligible=eligible
            )
        call = _Call(index, user_rows, n, excludes, candidates, eligible, deadline)
        with self._lock:
            leads = not self._busy
            if leads:
                self._busy = True
            elif len(self._queue) >= self.max_queue:
                self.observer.shed("queue_full")
                raise ResourceExhausted(
                    f"the Recommend queue is full ({self.max_queue} calls waiting); retry with backoff"
                )
            else:
                call.ready = threading.Lock()
                call.ready.acquire()
                call.queued_at = time.monotonic()
                self._queue.append(call)
        if not leads:
            call.ready.acquire()  # type: ignore[union-attr]  # made just above for a queued call
            if not call.leads:
                return call.outcome()
        self._lead(call)
        return call.outcome()

    # ------------------------------------------------------------- the lead
    def _lead(self, first: _Call) -> None:
        batch = self._take(first)
        try:
            self._score(batch)
        finally:
            for call in batch:
                if call is not first and call.ready is not None:
                    call.ready.release()
            self._pass_lead()

    def _take(self, first: _Call) -> list[_Call]:
        """``first`` and the queued calls that fit beside it (oldest first)."""
        batch, users = [first], first.user_rows.size
        with self._lock:
            queue = self._queue
            while queue and users + queue[0].user_rows.size <= self.max_batch:
                call = queue.popleft()
                users += call.user_rows.size
                batch.append(call)
        return batch

    def _pass_lead(self) -> None:
        with self._lock:
            if not self._queue:
                self._busy = False
                return
            following = self._queue.popleft()
        following.leads = True
        following.ready.release()  # type: ignore[union-attr]  # every queued call has its lock

    def _score(self, batch: list[_Call]) -> None:
        now = time.monotonic()
        live = []
        for call in batch:
            if call.deadline is not None and call.deadline <= now:
                call.error = DeadlineExceeded("the call's deadline passed while it waited to be scored")
                self.observer.shed("deadline")
                continue
            if call.queued_at:  # a call that found the scorer free waited for nothing
                self.observer.queue_seconds(now - call.queued_at)
            live.append(call)
        if not live:
            return
        self.observer.batch_users(sum(call.user_rows.size for call in live))
        by_index: dict[int, list[_Call]] = {}
        for call in live:
            by_index.setdefault(id(call.index), []).append(call)
        for calls in by_index.values():
            try:
                _score_version(calls)
            except Exception as exc:  # noqa: BLE001 - each caller reports it (rpc logs it, INTERNAL)
                for call in calls:
                    if call.answers is None:
                        call.error = exc


def _score_version(calls: list[_Call]) -> None:
    """Answer calls to one model version: those without candidate lists in one
    ``recommend_batch``, those with one (a small list, scored exactly) one by one."""
    index = calls[0].index
    if len(calls) == 1:  # a call alone (low load): the same answers, without gathering
        call = calls[0]
        call.answers = index.recommend_many(
            call.user_rows, call.n, excludes=call.excludes, candidates=call.candidates, eligible=call.eligible
        )
        return
    shared = [c for c in calls if c.candidates is None]
    for call in calls:
        if call.candidates is not None:
            call.answers = index.recommend_many(
                call.user_rows,
                call.n,
                excludes=call.excludes,
                candidates=call.candidates,
                eligible=call.eligible,
            )
    if not shared:
        return
    rows = np.concatenate([c.user_rows for c in shared]) if len(shared) > 1 else shared[0].user_rows
    ns = np.concatenate([np.full(c.user_rows.size, c.n, dtype=np.int64) for c in shared])
    excludes = [ex for c in shared for ex in c.excludes]
    eligibles = [c.eligible for c in shared for _ in range(c.user_rows.size)]
    answers = index.recommend_batch(rows, ns, excludes, eligibles)
    start = 0
    for call in shared:
        stop = start + call.user_rows.size
        call.answers = answers[start:stop]
        start = stop
