"""Progress of long training loops, on stderr.

On a terminal it is a tqdm bar. Anywhere else (a pipe, a log file, cron) it
is plain lines, one every ``interval`` seconds and one at the end, because a
bar's ``\\r`` redraws turn a log into one giant line.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

# Seconds between two plain progress lines: often enough to see a long fit
# move, rarely enough that a log stays readable.
LOG_INTERVAL = 10.0


def _is_terminal(stream: IO[str]) -> bool:
    try:
        if not stream.isatty():
            return False
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
    try:
        # A pseudo-terminal of no width (e.g. under `script` without a window)
        # would show an empty bar: plain lines there too.
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, ValueError, OSError):  # a terminal whose size cannot be asked
        return True


def _format_stats(stats: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in stats.items())


class Progress:
    """``with Progress("COE", total=epochs, enabled=verbose) as bar: bar.update(1, loss=...)``

    Parameters
    ----------
    label : str
        What is progressing (``"COE"``, ``"SCORE[multi]"``).
    total : int
        Steps expected.
    enabled : bool
        False draws nothing (the estimators' ``verbose``).
    stream : file, optional
        Where to draw (default: ``sys.stderr`` at construction).
    interval : float
        Seconds between plain lines when ``stream`` is not a terminal.
    """

    def __init__(
        self,
        label: str,
        total: int,
        enabled: bool = True,
        stream: IO[str] | None = None,
        interval: float = LOG_INTERVAL,
    ):
        self.label, self.total, self.enabled = label, max(int(total), 1), bool(enabled)
        self.stream = stream or sys.stderr
        self.interval = interval
        self.done = 0
        self.stats: dict[str, float] = {}
        self.start = time.perf_counter()
        self._last_line = self.start
        self._bar: Any = None
        if self.enabled and _is_terminal(self.stream):
            from tqdm import tqdm  # only a terminal draws a bar

            self._bar = tqdm(total=self.total, desc=label, file=self.stream, dynamic_ncols=True, leave=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            self._line()

    def update(self, steps: int = 1, **stats: float) -> None:
        """Count ``steps`` more done; ``stats`` (e.g. ``loss=...``) are shown beside the count."""
        self.done += steps
        self.stats = {k: float(v) for k, v in stats.items()}
        if self._bar is not None:
            if self.stats:
                self._bar.set_postfix_str(_format_stats(self.stats), refresh=False)
            self._bar.update(steps)
        elif self.enabled:
            now = time.perf_counter()
            if now - self._last_line >= self.interval:
                self._last_line = now
                self._line()

    def _line(self) -> None:
        elapsed = time.perf_counter() - self.start
        stats = _format_stats(self.stats)
        self.stream.write(f"{self.label}: {self.done}/{self.total} {elapsed:.1f}s {stats}".rstrip() + "\n")
        self.stream.flush()
