"""The artifact format and the versioned registry.

Layout (``design.md``)::

    <registry>/<model-name>/<version>/manifest.json   protobuf JSON of ordrec.v1.Manifest
    <registry>/<model-name>/<version>/arrays/*.npy    arrays, loaded with mmap, never pickled
    <registry>/<model-name>/<version>/ids/*.txt       external ids, one a line, row order
    <registry>/<model-name>/PINNED                    optional: the pinned version

Publishing writes into a hidden temporary sibling folder, fsyncs every file
and the folder, then renames it into place, so a reader never sees a
half-written version. Loading verifies every checksum, shape and dtype
against the manifest and raises :class:`ArtifactError` on any mismatch.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from ordrec.v1 import manifest_pb2
from ordrec.service.idmap import IdMap

FORMAT = 1
MANIFEST = "manifest.json"
PIN_FILE = "PINNED"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_ARRAY_NAME_RE = re.compile(r"^[a-z0-9_]{1,64}$")
# Fixed width, so text order is time order: 20261125T223500.123456Z
_VERSION_RE = re.compile(r"^\d{8}T\d{6}\.\d{6}Z$")
_VERSION_FMT = "%Y%m%dT%H%M%S.%fZ"
_CHUNK = 1 << 20
_STALE_TMP_SECONDS = 3600


class ArtifactError(Exception):
    """A model version that is missing, corrupt or inconsistent with its manifest."""


def code_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ordrec")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0+unknown"


def validate_model_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"model name {name!r} must be 1-64 characters of a-z, 0-9, '_', '-', '.'"
            " starting with a letter or digit"
        )
    return name


def is_version(text: str) -> bool:
    return bool(_VERSION_RE.match(text))


@dataclass
class Artifact:
    """One model version: arrays, id maps and metadata.

    The trainer builds one in memory and publishes it; the service loads it
    back (arrays memory-mapped read-only) and hands it to the scorer of its
    ``kind``.
    """

    kind: str
    arrays: Mapping[str, np.ndarray]
    ids: Mapping[str, IdMap]
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)
    data_fingerprint: str = ""
    name: str = ""
    version: str = ""
    created_at: str = ""
    path: Path | None = None

    def array(self, key: str) -> np.ndarray:
        try:
            return self.arrays[key]
        except KeyError:
            raise ArtifactError(f"{self.describe()}: missing array {key!r}") from None

    def idmap(self, space: str) -> IdMap:
        try:
            return self.ids[space]
        except KeyError:
            raise ArtifactError(f"{self.describe()}: missing id space {space!r}") from None

    def describe(self) -> str:
        where = f"{self.name}@{self.version}" if self.version else "in-memory artifact"
        return f"{self.kind} {where}"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_view(folder: Path, filename: str, data: bytes) -> Path:
    """Replace a derived view file (e.g. report.html) in a published version atomically."""
    tmp = folder / f".{filename}.{uuid.uuid4().hex}"
    _write_synced(tmp, data)
    os.replace(tmp, folder / filename)
    _fsync_dir(folder)
    return folder / filename


def _write_views(folder: Path, views: Mapping[str, bytes]) -> None:
    for filename, data in views.items():
        if "/" in filename or filename.startswith(".") or filename == MANIFEST:
            raise ArtifactError(f"view file name {filename!r} is not a plain file name")
        _write_synced(folder / filename, data)


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


def _encode_ids(space: str, ids: IdMap) -> bytes:
    for external in ids.ids:
        if not external or "\n" in external or "\r" in external:
            raise ArtifactError(f"id space {space!r}: id {external!r} is empty or has a line break")
    return ("\n".join(ids.ids) + "\n").encode("utf-8") if len(ids) else b""


def _struct(data: Mapping[str, Any]) -> Struct:
    msg = Struct()
    msg.update(json.loads(json.dumps(dict(data), default=_json_default)))
    return msg


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in a manifest")


def _from_struct(msg: Struct) -> dict[str, Any]:
    """A Struct as plain Python; protobuf stores every number as a double, so
    whole numbers come back as ints (hyperparameters such as ranks are ints)."""

    def restore(value: Any) -> Any:
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            return int(value)
        if isinstance(value, list):
            return [restore(v) for v in value]
        if isinstance(value, dict):
            return {k: restore(v) for k, v in value.items()}
        return value

    return restore(json_format.MessageToDict(msg))


def _manifest_json(manifest: manifest_pb2.Manifest) -> bytes:
    text = json_format.MessageToJson(manifest, preserving_proto_field_name=True, indent=2)
    return (text + "\n").encode("utf-8")


class Registry:
    """A directory of models, each a folder of immutable versions."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    # ---------------------------------------------------------------- listing
    def models(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _NAME_RE.match(p.name))

    def versions(self, name: str) -> list[str]:
        folder = self.root / validate_model_name(name)
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and is_version(p.name))

    def pinned(self, name: str) -> str | None:
        pin = self.root / validate_model_name(name) / PIN_FILE
        try:
            version = pin.read_text().strip()
        except FileNotFoundError:
            return None
        return version or None

    def live_version(self, name: str) -> tuple[str, str]:
        """The version a server should serve, and why ("pinned" or "newest")."""
        pinned = self.pinned(name)
        if pinned is not None:
            if pinned not in self.versions(name):
                raise ArtifactError(f"{name}: pinned version {pinned} does not exist")
            return pinned, "pinned"
        versions = self.versions(name)
        if not versions:
            raise ArtifactError(f"{name}: no published version in {self.root}")
        return versions[-1], "newest"

    # --------------------------------------------------------------- pinning
    def pin(self, name: str, version: str) -> None:
        if version not in self.versions(name):
            raise ArtifactError(f"{name}: cannot pin unknown version {version!r}")
        folder = self.root / name
        tmp = folder / f".{PIN_FILE}.{uuid.uuid4().hex}"
        _write_synced(tmp, (version + "\n").encode())
        os.replace(tmp, folder / PIN_FILE)
        _fsync_dir(folder)

    def unpin(self, name: str) -> None:
        folder = self.root / validate_model_name(name)
        try:
            (folder / PIN_FILE).unlink()
        except FileNotFoundError:
            return
        _fsync_dir(folder)

    # ------------------------------------------------------------ publishing
    def publish(self, name: str, artifact: Artifact, keep: int | None = None,
                views: Mapping[str, bytes] | Callable[[Artifact], Mapping[str, bytes]] | None = None
                ) -> str:
        """Write ``artifact`` as a new version of ``name`` atomically; return the version.

        ``views`` are derived files published in the same rename (e.g.
        ``report.html``): they are for people, not checksummed, and never
        read back by the loader. A callable is given a copy of the artifact
        with its name, version and created_at already set (so a report can
        show them) and returns the files.
        """
        validate_model_name(name)
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".tmp-{uuid.uuid4().hex}"
        try:
            manifest = self._write_payload(tmp, name, artifact)
            stamped = None
            if callable(views):
                def stamped(version: str) -> Mapping[str, bytes]:
                    return views(dataclasses.replace(artifact, name=name, version=version,
                                                     created_at=manifest.created_at, path=folder / version))
            else:
                _write_views(tmp, views or {})
            version = self._rename_into_place(tmp, folder, manifest, stamped)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        artifact.name, artifact.version = name, version
        artifact.created_at, artifact.path = manifest.created_at, folder / version
        if keep is not None:
            self.prune(name, keep)
        return version

    def _write_payload(self, tmp: Path, name: str, artifact: Artifact) -> manifest_pb2.Manifest:
        (tmp / "arrays").mkdir(parents=True)
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
        _fsync_dir(tmp / "arrays")
        _fsync_dir(tmp / "ids")
        return manifest

    def _rename_into_place(self, tmp: Path, folder: Path, manifest: manifest_pb2.Manifest,
                           stamped: Callable[[str], Mapping[str, bytes]] | None = None) -> str:
        for _ in range(100):
            version = self._next_version(folder)
            manifest.version = version
            _write_synced(tmp / MANIFEST, _manifest_json(manifest))
            if stamped is not None:
                _write_views(tmp, stamped(version))
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
    def prune(self, name: str, keep: int) -> list[str]:
        """Delete all but the newest ``keep`` versions (never the pinned one); return what went."""
        if keep < 1:
            raise ValueError("keep must be at least 1")
        folder = self.root / validate_model_name(name)
        pinned = self.pinned(name)
        doomed = [v for v in self.versions(name)[:-keep] if v != pinned]
        for version in doomed:
            # Rename first so a concurrent reader never sees a half-deleted version.
            trash = folder / f".trash-{version}-{uuid.uuid4().hex}"
            os.rename(folder / version, trash)
            shutil.rmtree(trash, ignore_errors=True)
        self._remove_stale_temporaries(folder)
        return doomed

    @staticmethod
    def _remove_stale_temporaries(folder: Path) -> None:
        cutoff = time.time() - _STALE_TMP_SECONDS
        for path in folder.glob(".tmp-*"):
            if path.stat().st_mtime < cutoff:
                shutil.rmtree(path, ignore_errors=True)

    # ---------------------------------------------------------------- loading
    def load(self, name: str, version: str | None = None, *, mmap: bool = True) -> Artifact:
        """Load and verify a version (default: the live one)."""
        if version is None:
            version, _ = self.live_version(name)
        if not is_version(version):
            raise ArtifactError(f"{name}: {version!r} is not a version name")
        return load_version(self.root / validate_model_name(name) / version, mmap=mmap)

    def iter_live(self) -> Iterator[tuple[str, str, str]]:
        """(name, version, reason) for every model with a live version."""
        for name in self.models():
            try:
                version, reason = self.live_version(name)
            except ArtifactError:
                continue
            yield name, version, reason


def read_manifest(folder: Path) -> manifest_pb2.Manifest:
    path = folder / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArtifactError(f"{path}: missing manifest") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: unreadable manifest: {exc}") from None
    try:
        manifest = json_format.Parse(text, manifest_pb2.Manifest())
    except json_format.ParseError as exc:
        raise ArtifactError(f"{path}: invalid manifest: {exc}") from None
    if manifest.format != FORMAT:
        raise ArtifactError(f"{path}: format {manifest.format}, this code reads format {FORMAT}")
    if manifest.version != folder.name or manifest.name != folder.parent.name:
        raise ArtifactError(
            f"{path}: manifest says {manifest.name}@{manifest.version}, "
            f"folder is {folder.parent.name}/{folder.name}"
        )
    return manifest


def _inside(folder: Path, rel: str) -> Path:
    path = (folder / rel).resolve()
    if folder.resolve() not in path.parents:
        raise ArtifactError(f"{folder}: manifest path {rel!r} escapes the version folder")
    return path


def _verify_checksum(path: Path, expected: str) -> None:
    try:
        actual = _sha256_file(path)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: listed in the manifest but missing") from None
    if actual != expected:
        raise ArtifactError(f"{path}: checksum mismatch (manifest {expected[:12]}…, file {actual[:12]}…)")


def _load_array(folder: Path, entry: manifest_pb2.ArrayFile, mmap: bool) -> np.ndarray:
    path = _inside(folder, entry.path)
    _verify_checksum(path, entry.sha256)
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except ValueError as exc:
        raise ArtifactError(f"{path}: not a plain numpy array: {exc}") from None
    if tuple(array.shape) != tuple(entry.shape):
        raise ArtifactError(f"{path}: shape {tuple(array.shape)} but the manifest says {tuple(entry.shape)}")
    if array.dtype.str != entry.dtype:
        raise ArtifactError(f"{path}: dtype {array.dtype.str} but the manifest says {entry.dtype}")
    if mmap and array.size == 0:
        array = np.asarray(array)
    return array


def _load_ids(folder: Path, entry: manifest_pb2.IdFile) -> IdMap:
    path = _inside(folder, entry.path)
    _verify_checksum(path, entry.sha256)
    ids = path.read_text(encoding="utf-8").split("\n")[:-1]
    if len(ids) != entry.count:
        raise ArtifactError(f"{path}: {len(ids)} ids but the manifest says {entry.count}")
    try:
        return IdMap(ids)
    except ValueError as exc:
        raise ArtifactError(f"{path}: {exc}") from None


def load_version(folder: str | os.PathLike, *, mmap: bool = True) -> Artifact:
    """Load one version folder, verifying it completely against its manifest."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    arrays = {Path(e.path).stem: _load_array(folder, e, mmap) for e in manifest.arrays}
    ids = {e.space: _load_ids(folder, e) for e in manifest.ids}
    return Artifact(
        kind=manifest.kind,
        arrays=arrays,
        ids=ids,
        hyperparameters=_from_struct(manifest.hyperparameters),
        metrics=dict(manifest.metrics),
        attributes=_from_struct(manifest.attributes),
        data_fingerprint=manifest.data_fingerprint,
        name=manifest.name,
        version=manifest.version,
        created_at=manifest.created_at,
        path=folder,
    )
