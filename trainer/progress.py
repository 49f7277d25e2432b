"""A dependency-free progress line for long training loops (stderr)."""
from __future__ import annotations

import sys
import time


class Progress:
    """``with Progress("COE", total=epochs, enabled=verbose) as bar: bar.update(1, loss=...)``"""

    def __init__(self, label: str, total: int, enabled: bool = True, stream=None):
        self.label, self.total, self.enabled = label, max(int(total), 1), enabled
        self.stream = stream or sys.stderr
        self.done = 0
        self.start = time.perf_counter()
        self._last_draw = 0.0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._draw(final=True)
            self.stream.write("\n")
            self.stream.flush()

    def update(self, steps: int = 1, **stats: float) -> None:
        self.done += steps
        self.stats = stats
        now = time.perf_counter()
        if self.enabled and (now - self._last_draw > 0.2 or self.done >= self.total):
            self._last_draw = now
            self._draw()

    def _draw(self, final: bool = False) -> None:
        width = 24
        filled = int(width * min(self.done, self.total) / self.total)
        elapsed = time.perf_counter() - self.start
        stats = " ".join(f"{k}={v:.4g}" for k, v in getattr(self, "stats", {}).items())
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {elapsed:6.1f}s {stats}")
        self.stream.flush()
