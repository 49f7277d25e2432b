"""Threads calling the server back to back while a test breaks something."""

from __future__ import annotations

import threading

from ordrec.tools.process import wait_for


class BackgroundLoad:
    """Runs ``_run(i)`` on ``threads`` threads inside a ``with`` block, which starts once 20 calls succeeded.

    Subclasses count successes in ``ok`` and append failures to ``failures``, both under ``_lock``,
    and stop when ``stop_event`` is set.
    """

    def __init__(self, threads: int):
        self.stop_event = threading.Event()
        self.ok = 0
        self.failures: list = []
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, i: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Releases what the subclass holds once the threads are done."""

    def __enter__(self):
        for t in self.threads:
            t.start()
        wait_for(lambda: self.ok > 20, 30, what="load to start")
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(15)
        self.close()
