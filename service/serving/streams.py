"""Bounds on streaming RPCs, so open or stalled streams can never take every worker.

grpcio's sync server runs a call on a pool thread for the call's whole life: a
server stream holds its thread while the client is slow to read, and the health
service's ``Watch`` holds one for as long as the client keeps it open. Unary calls
share that pool. :class:`StreamGuard` admits at most ``max_streams`` streams per
server and ``max_streams_per_connection`` per connection (the rest are refused
RESOURCE_EXHAUSTED at once), and a watchdog cancels a stream whose reply the
client has not taken for ``stall_seconds`` or that has lived ``max_seconds``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import grpc

from ordrec.service.config import StreamLimits

log = logging.getLogger("ordrec.service")


class _Stream:
    __slots__ = ("context", "connection", "started", "waiting_since", "released")

    def __init__(self, context: grpc.ServicerContext, connection: str):
        self.context, self.connection = context, connection
        self.started = time.monotonic()
        self.waiting_since: float | None = None  # set while a reply waits for the client to take it
        self.released = False


class StreamGuard:
    """Admission and a watchdog for every server-streaming and bidi RPC."""

    def __init__(
        self, limits: StreamLimits, on_cancel: Callable[[str], None] | None = None, check_every: float = 0.5
    ):
        self.limits = limits
        self._lock = threading.Lock()
        self._open: set[_Stream] = set()
        self._per_connection: Counter[str] = Counter()
        self._on_cancel = on_cancel or (lambda reason: None)
        self._check_every = check_every
        self._stopped = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="ordrec-stream-watchdog", daemon=True)
        self._watchdog.start()

    def stop(self) -> None:
        self._stopped.set()

    def open_streams(self) -> int:
        return len(self._open)

    # -------------------------------------------------------------- wrapping
    def guarded(self, behavior):
        """A streaming handler's ``behavior`` behind admission and the watchdog."""

        def guarded(request, context):
            stream = self._admit(context)
            if stream is None:
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "too many open streams on this server or connection; retry later",
                )
            context.add_callback(lambda: self._release(stream))
            try:
                yield from self._tracked(stream, behavior(request, context))
            finally:
                self._release(stream)

        return guarded

    @staticmethod
    def _tracked(stream: _Stream, replies: Iterator) -> Iterator:
        for reply in replies:
            stream.waiting_since = time.monotonic()
            yield reply  # grpc resumes us only once the client's transport took the reply
            stream.waiting_since = None

    # ------------------------------------------------------------- admission
    def _admit(self, context) -> _Stream | None:
        connection = context.peer()
        with self._lock:
            if (
                len(self._open) >= self.limits.max_streams
                or self._per_connection[connection] >= self.limits.max_streams_per_connection
            ):
                return None
            stream = _Stream(context, connection)
            self._open.add(stream)
            self._per_connection[connection] += 1
            return stream

    def _release(self, stream: _Stream) -> None:
        with self._lock:
            if stream.released:
                return
            stream.released = True
            self._open.discard(stream)
            self._per_connection[stream.connection] -= 1
            if self._per_connection[stream.connection] <= 0:
                del self._per_connection[stream.connection]

    # -------------------------------------------------------------- watchdog
    def _watch(self) -> None:
        while not self._stopped.wait(self._check_every):
            for stream, reason, detail in self._overdue(time.monotonic()):
                log.info("ending a stream from %s: %s", stream.connection, detail)
                self._on_cancel(reason)
                stream.context.cancel()
                # A cancelled call runs its callbacks; releasing here too frees the slot even
                # if the handler is still parked inside grpc.
                self._release(stream)

    def _overdue(self, now: float) -> list[tuple[_Stream, str, str]]:
        limits, overdue = self.limits, []
        with self._lock:
            for stream in self._open:
                waiting = stream.waiting_since
                if waiting is not None and now - waiting > limits.stall_seconds:
                    overdue.append(
                        (stream, "stalled", f"the client took no reply for {limits.stall_seconds:g} s")
                    )
                elif now - stream.started > limits.max_seconds:
                    overdue.append((stream, "expired", f"open longer than {limits.max_seconds:g} s"))
        return overdue
