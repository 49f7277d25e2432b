"""Checksummed, synced files: sha256 of what is written and read, fsync before a rename."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import numpy as np

from ordrec.service.storage.artifact import ArtifactError

_CHUNK = 1 << 20


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _replace_synced(folder: Path, filename: str, data: bytes) -> None:
    tmp = folder / f".{filename}.{uuid.uuid4().hex}"
    _write_synced(tmp, data)
    os.replace(tmp, folder / filename)
    _fsync_dir(folder)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> str:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return hashlib.sha256(data).hexdigest()


def _write_array(path: Path, array: np.ndarray) -> str:
    with open(path, "wb") as fh:
        np.save(fh, np.ascontiguousarray(array), allow_pickle=False)
        fh.flush()
        os.fsync(fh.fileno())
    return _sha256_file(path)


def _verify_checksum(path: Path, expected: str) -> None:
    try:
        actual = _sha256_file(path)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: listed in the manifest but missing") from None
    if actual != expected:
        raise ArtifactError(f"{path}: checksum mismatch (manifest {expected[:12]}…, file {actual[:12]}…)")
