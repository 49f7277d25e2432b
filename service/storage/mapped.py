"""Reading memory-mapped arrays without mapping their pages into the process.

A version's arrays are memory-mapped (``service/storage/registry.py``). Touching a
mapped page makes it part of the server's resident memory, and on kernels
with large page-cache folios one touched row can map megabytes around it.
A pass over a whole array at load (finiteness, a mean) and the few rows a
quantised graph re-scores per request are therefore read with plain file
reads: the pages stay in the kernel's page cache (shared, reclaimable) and
out of the server's mappings.
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
from numba import njit, types

from ordrec.service.storage.artifact import ArtifactError

# libc's pread(fd, buffer, count, offset), called from compiled code (the buffer as an address;
# Any: numba builds the callable type at run time).
_pread: Any = types.ExternalFunction("pread", types.intp(types.intc, types.uintp, types.uintp, types.int64))


def row_blocks(array: np.ndarray, block_bytes: int = 1 << 24) -> Iterator[np.ndarray]:
    """``array`` in blocks of whole rows, each at most about ``block_bytes``; a memory-mapped
    array is read from its file, not through its mapping."""
    if not array.ndim:
        yield array
        return
    rows = max(1, block_bytes // max(1, array[:1].nbytes))
    backing = _file_backing(array)
    if backing is None:
        for start in range(0, len(array), rows):
            yield array[start : start + rows]
        return
    filename, offset = backing
    row_shape, per_row = array.shape[1:], int(np.prod(array.shape[1:], dtype=np.int64))
    with open(filename, "rb") as fh:
        for start in range(0, len(array), rows):
            count = min(rows, len(array) - start)
            fh.seek(offset + start * per_row * array.itemsize)
            block = np.fromfile(fh, dtype=array.dtype, count=count * per_row)
            if block.size != count * per_row:
                raise ArtifactError(f"{filename}: shorter than its array")
            yield block.reshape((count, *row_shape))


def _file_backing(array: np.ndarray) -> tuple[str, int] | None:
    """(file, byte offset) of a C-contiguous array that is a whole ``np.memmap`` (or a view of
    all of one), else None."""
    base: object = array
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap) and base.filename and isinstance(base.base, mmap.mmap):
            whole = (
                array.flags.c_contiguous
                and array.nbytes == base.nbytes
                and array.dtype == base.dtype
                and array.__array_interface__["data"][0] == base.__array_interface__["data"][0]
            )
            return (base.filename, int(base.offset)) if whole else None
        base = base.base
    return None


class FileRows:
    """Rows of a memory-mapped 2-D array read with ``pread`` (or indexed, for an array that
    is not file-backed). Open for the life of the object; thread-safe (no file position)."""

    def __init__(self, array: np.ndarray):
        self.array = array
        backing = _file_backing(array) if array.ndim == 2 else None
        self._fd = -1
        if backing is not None:
            filename, self._offset = backing
            self._fd = os.open(filename, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            self._row_bytes = array.shape[1] * array.itemsize
            weakref.finalize(self, os.close, self._fd)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """``array[rows]`` as a new array."""
        if self._fd < 0:
            return np.asarray(self.array[rows])
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        out = np.empty((rows.size, self.array.shape[1]), dtype=self.array.dtype)
        if _read_rows(self._fd, self._offset, self._row_bytes, rows, out) != rows.size:
            raise ArtifactError("a memory-mapped array's file is shorter than the array")
        return out


@njit(cache=True)
def _read_rows(fd: int, offset: int, row_bytes: int, rows: np.ndarray, out: np.ndarray) -> int:
    """Read row ``rows[i]`` of a file of ``row_bytes``-byte rows starting at ``offset`` into
    ``out[i]``; returns how many were read whole (a short or failed read stops it).

    One compiled loop: a request re-scores a few dozen rows, and a Python call per row cost
    more than the reads; the GIL stays held, as the reads are page-cache copies."""
    for i in range(rows.size):
        if rows[i] < 0:
            return i
        if _pread(fd, out[i].ctypes.data, row_bytes, offset + rows[i] * row_bytes) != row_bytes:
            return i
    return rows.size


def warm_up() -> None:
    """Compile (or load from numba's cache) the row reader for the dtypes the service reads."""
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        for dtype in (np.float32, np.float64):
            _read_rows(fd, 0, 4, np.zeros(1, np.int64), np.zeros((1, 1), dtype))
    finally:
        os.close(fd)
