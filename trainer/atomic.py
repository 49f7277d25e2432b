"""Files replaced whole: written to a temporary sibling, synced, then renamed over the target."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any


@contextmanager
def atomic_output(out: str | os.PathLike, mode: str = "wb", **open_args: Any) -> Iterator[IO[Any]]:
    """A file for the block that becomes ``out`` when the block ends, and never exists if it
    fails: a reader sees the old file or the whole new one, never half of it."""
    folder = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=".ordrec-export-", dir=folder)
    try:
        with os.fdopen(fd, mode, **open_args) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
