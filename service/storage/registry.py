"""The versioned registry on a local disk: publishing, listing, pruning, loading.

Layout::

    <registry>/<model-name>/<version>/...             one version (storage/format.py)
    <registry>/<model-name>/PINNED                    optional: the pinned version
    <registry>/<model-name>/SPLIT                     optional: a candidate version and its share of users
    <registry>/HIDDEN, <registry>/<model-name>/HIDDEN optional: hidden items (storage/hidden_items.py)

Publishing writes into a hidden temporary sibling folder, fsyncs every file
and the folder, then renames it into place, so a reader never sees a
half-written version.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ordrec.service.storage.artifact import Artifact, ArtifactError, ViewSource, code_version
from ordrec.service.storage.checksums import (
    _fsync_dir,
    _replace_synced,
    _sha256_file,
    _write_array,
    _write_synced,
)
from ordrec.service.storage.format import (
    _ARRAY_NAME_RE,
    FORMAT,
    INDEXES_DIR,
    MANIFEST,
    _encode_ids,
    _inside,
    _manifest_json,
    _set_views,
    _struct,
    load_version,
    read_manifest,
)
from ordrec.service.storage.hidden_items import ALL_MODELS, HIDDEN_FILE, hidden_file, hidden_ids
from ordrec.service.storage.names import (
    _NAME_RE,
    _VERSION_FMT,
    is_version,
    validate_model_file,
    validate_model_name,
    validate_root_file,
)
from ordrec.service.storage.policy import LiveVersions
from ordrec.v1 import manifest_pb2

_TMP_PREFIX = ".tmp-"


_TRASH_PREFIX = ".trash-"


_NEW_TMP_SECONDS = 10


def _lock_folder(path: Path) -> int:
    """An exclusive lock on ``path`` held until the returned descriptor is closed."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _abandoned(path: Path) -> bool:
    """True when no process holds ``path``'s lock (trash is never locked)."""
    if path.name.startswith(_TRASH_PREFIX):
        return True
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


class Registry(LiveVersions):
    """A directory of models, each a folder of immutable versions."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    # ---------------------------------------------------------------- listing
    def models(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _NAME_RE.match(p.name))

    def has_model(self, name: str) -> bool:
        return _NAME_RE.match(name) is not None and (self.root / name).is_dir()

    def versions(self, name: str) -> list[str]:
        folder = self.root / validate_model_name(name)
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and is_version(p.name))

    def manifest(self, name: str, version: str) -> manifest_pb2.Manifest:
        """The manifest of one version, read without loading it (as :class:`S3Registry` does)."""
        return read_manifest(self.root / validate_model_name(name) / version)

    # ------------------------------------- model side files (PINNED, SPLIT, events)
    def read_model_file(self, name: str, path: str) -> bytes | None:
        """A file beside the versions of ``name`` (see :func:`validate_model_file`), or None."""
        try:
            return (self.root / validate_model_name(name) / validate_model_file(path)).read_bytes()
        except FileNotFoundError:
            return None

    def write_model_file(self, name: str, path: str, data: bytes) -> None:
        """Replace that file atomically (a synced rename, like PINNED)."""
        target = self.root / validate_model_name(name) / validate_model_file(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        _replace_synced(target.parent, target.name, data)

    def delete_model_file(self, name: str, path: str) -> None:
        target = self.root / validate_model_name(name) / validate_model_file(path)
        try:
            target.unlink()
        except FileNotFoundError:
            return
        _fsync_dir(target.parent)

    def model_files(self, name: str, folder: str) -> list[str]:
        """``folder/<file>`` paths of the files in one side folder of ``name``."""
        where = self.root / validate_model_name(name) / folder
        if not where.is_dir():
            return []
        return sorted(
            f"{folder}/{p.name}" for p in where.iterdir() if p.is_file() and not p.name.startswith(".")
        )

    def read_version_file(self, name: str, version: str, path: str) -> bytes | None:
        """One file of a published version as stored (not verified), or None."""
        folder = self.root / validate_model_name(name) / version
        try:
            return _inside(folder, path).read_bytes() if is_version(version) else None
        except FileNotFoundError:
            return None

    # ------------------------------------------ registry-level files (FORGOTTEN)
    def read_root_file(self, filename: str) -> bytes | None:
        """A file at the registry's top (e.g. ``FORGOTTEN``), or None."""
        try:
            return (self.root / validate_root_file(filename)).read_bytes()
        except FileNotFoundError:
            return None

    def write_root_file(self, filename: str, data: bytes) -> None:
        """Replace that file atomically (a synced rename, like PINNED)."""
        self.root.mkdir(parents=True, exist_ok=True)
        _replace_synced(self.root, validate_root_file(filename), data)

    def root_file_token(self, filename: str) -> object:
        """Changes whenever the file does: what a server's poll compares."""
        try:
            st = (self.root / validate_root_file(filename)).stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    # ---------------------------------------------------------- hidden items
    def _hidden_path(self, scope: str) -> Path:
        if scope == ALL_MODELS:
            return self.root / HIDDEN_FILE
        return self.root / validate_model_name(scope) / HIDDEN_FILE

    def hidden(self, scope: str) -> frozenset[str]:
        """Item ids hidden for ``scope`` (a model name, or ``ALL_MODELS``) without Redis."""
        try:
            return hidden_ids(self._hidden_path(scope).read_bytes())
        except FileNotFoundError:
            return frozenset()

    def hidden_token(self) -> tuple:
        """Changes whenever a HIDDEN file does: what the server's poll compares."""
        token = []
        for path in [self.root / HIDDEN_FILE] + [self.root / n / HIDDEN_FILE for n in self.models()]:
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            token.append((str(path), st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(token)

    def set_hidden(self, scope: str, ids: Iterable[str]) -> None:
        """Replace the hidden ids of ``scope`` atomically (like PINNED: a synced rename)."""
        path = self._hidden_path(scope)
        path.parent.mkdir(parents=True, exist_ok=True)
        _replace_synced(path.parent, HIDDEN_FILE, hidden_file(ids))

    # ------------------------------------------------------------ publishing
    def publish(
        self,
        name: str,
        artifact: Artifact,
        keep: int | None = None,
        views: ViewSource | Callable[[Artifact], ViewSource] | None = None,
    ) -> str:
        """Write ``artifact`` as a new version of ``name`` atomically; return the version.

        ``views`` are files for people published in the same rename (e.g.
        ``report.html``), listed in the manifest with their checksums. A
        callable is given a copy of the artifact with its name, version and
        created_at already set (so a report can show them) and returns them.

        The temporary folder is locked while it is written, so :meth:`gc`
        removes only the leftovers of publishers that died.
        """
        validate_model_name(name)
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        self._remove_abandoned(folder)
        tmp = folder / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        tmp.mkdir()
        lock = _lock_folder(tmp)
        try:
            manifest = self._write_payload(tmp, name, artifact)

            def views_of(version: str) -> ViewSource:
                if callable(views):
                    return views(
                        dataclasses.replace(
                            artifact,
                            name=name,
                            version=version,
                            created_at=manifest.created_at,
                            path=folder / version,
                        )
                    )
                return views or {}

            version = self._rename_into_place(tmp, folder, manifest, views_of)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            os.close(lock)
        artifact.name, artifact.version = name, version
        artifact.created_at, artifact.path = manifest.created_at, folder / version
        for entry in manifest.indexes:
            artifact.indexes[entry.name] = dataclasses.replace(
                artifact.indexes[entry.name], path=folder / version / entry.path
            )
        if keep is not None:
            self.prune(name, keep)
        return version

    def _write_payload(self, tmp: Path, name: str, artifact: Artifact) -> manifest_pb2.Manifest:
        (tmp / "arrays").mkdir()
        (tmp / "ids").mkdir()
        manifest = manifest_pb2.Manifest(
            format=FORMAT,
            name=name,
            kind=artifact.kind,
            created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            code_version=code_version(),
            data_fingerprint=artifact.data_fingerprint,
        )
        manifest.hyperparameters.CopyFrom(_struct(artifact.hyperparameters))
        manifest.attributes.CopyFrom(_struct(artifact.attributes))
        for key, value in artifact.metrics.items():
            manifest.metrics[key] = float(value)
        for key, array in sorted(artifact.arrays.items()):
            if not _ARRAY_NAME_RE.match(key):
                raise ArtifactError(f"array name {key!r} must match {_ARRAY_NAME_RE.pattern}")
            array = np.asarray(array)
            if array.dtype.hasobject:
                raise ArtifactError(f"array {key!r} has dtype object: artifacts hold plain arrays only")
            rel = f"arrays/{key}.npy"
            digest = _write_array(tmp / rel, array)
            manifest.arrays.add(path=rel, sha256=digest, shape=list(array.shape), dtype=array.dtype.str)
        for space, ids in sorted(artifact.ids.items()):
            if not _ARRAY_NAME_RE.match(space):
                raise ArtifactError(f"id space {space!r} must match {_ARRAY_NAME_RE.pattern}")
            rel = f"ids/{space}.txt"
            digest = _write_synced(tmp / rel, _encode_ids(space, ids))
            manifest.ids.add(space=space, path=rel, sha256=digest, count=len(ids))
        self._write_indexes(tmp, manifest, artifact)
        _fsync_dir(tmp / "arrays")
        _fsync_dir(tmp / "ids")
        return manifest

    @staticmethod
    def _write_indexes(tmp: Path, manifest: manifest_pb2.Manifest, artifact: Artifact) -> None:
        if not artifact.indexes:
            return
        (tmp / INDEXES_DIR).mkdir()
        for key, index in sorted(artifact.indexes.items()):
            if not _ARRAY_NAME_RE.match(key) or not _ARRAY_NAME_RE.match(index.library.replace("-", "_")):
                raise ArtifactError(f"index {key!r} ({index.library!r}) must match {_ARRAY_NAME_RE.pattern}")
            if index.write is None:
                raise ArtifactError(f"index {key!r} has nothing to write")
            rel = f"{INDEXES_DIR}/{key}.{index.library}"
            index.write(tmp / rel)
            with open(tmp / rel, "rb+") as fh:
                os.fsync(fh.fileno())
            entry = manifest.indexes.add(
                name=key,
                path=rel,
                sha256=_sha256_file(tmp / rel),
                library=index.library,
                size_bytes=(tmp / rel).stat().st_size,
            )
            entry.params.CopyFrom(_struct(index.params))
        _fsync_dir(tmp / INDEXES_DIR)

    def _rename_into_place(
        self, tmp: Path, folder: Path, manifest: manifest_pb2.Manifest, views_of: Callable[[str], ViewSource]
    ) -> str:
        for _ in range(100):
            version = self._next_version(folder)
            manifest.version = version
            _set_views(tmp, manifest, views_of(version))
            _write_synced(tmp / MANIFEST, _manifest_json(manifest))
            _fsync_dir(tmp)
            try:
                # rename(2) onto an existing non-empty folder fails, so two
                # publishers racing for one version cannot overwrite each other.
                os.rename(tmp, folder / version)
            except OSError:
                if (folder / version).exists():
                    continue
                raise
            _fsync_dir(folder)
            return version
        raise ArtifactError(f"{folder}: could not find a free version name")

    def _next_version(self, folder: Path) -> str:
        now = _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)
        existing = self.versions(folder.name)
        if existing:
            newest = _dt.datetime.strptime(existing[-1], _VERSION_FMT)
            now = max(now, newest + _dt.timedelta(microseconds=1))
        return now.strftime(_VERSION_FMT)

    # -------------------------------------------------------------- retention
    def _remove_versions(self, name: str, versions: list[str]) -> None:
        folder = self.root / validate_model_name(name)
        for version in versions:
            self._remove_version(folder, version)

    def _remove_leftovers(self, name: str) -> None:
        self._remove_abandoned(self.root / validate_model_name(name))

    @staticmethod
    def _remove_version(folder: Path, version: str) -> None:
        # Rename first so a concurrent reader never sees a half-deleted version.
        trash = folder / f"{_TRASH_PREFIX}{version}-{uuid.uuid4().hex}"
        os.rename(folder / version, trash)
        shutil.rmtree(trash, ignore_errors=True)
        _fsync_dir(folder)

    def gc(self) -> list[Path]:
        """Remove what killed publishers and pruners left behind in every model; return it."""
        removed: list[Path] = []
        for name in self.models():
            removed += self._remove_abandoned(self.root / name)
        return removed

    @staticmethod
    def _remove_abandoned(folder: Path) -> list[Path]:
        """Temporary folders no live publisher holds, and trash a killed prune left.

        A publisher locks its temporary folder from just after creating it; the lock
        dies with the process. A folder younger than a few seconds is left alone, so one
        created but not yet locked is never taken.
        """
        removed = []
        young = time.time() - _NEW_TMP_SECONDS
        for path in folder.iterdir():
            if not path.name.startswith((_TMP_PREFIX, _TRASH_PREFIX)) or path.is_symlink():
                continue
            try:
                if path.lstat().st_mtime > young or not _abandoned(path):
                    continue
            except FileNotFoundError:
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        return removed

    # ---------------------------------------------------------------- loading
    def load(
        self, name: str, version: str | None = None, *, mmap: bool = True, views: bool = True
    ) -> Artifact:
        """Load and verify a version (default: the live one)."""
        version = self.requested_version(name, version)
        return load_version(self.root / validate_model_name(name) / version, mmap=mmap, views=views)
