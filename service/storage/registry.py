"""The artifact format and the versioned registry.

Layout::

    <registry>/<model-name>/<version>/manifest.json   protobuf JSON of ordrec.v1.Manifest
    <registry>/<model-name>/<version>/arrays/*.npy    arrays, loaded with mmap, never pickled
    <registry>/<model-name>/<version>/ids/*.txt       external ids, one a line, row order
    <registry>/<model-name>/<version>/views/*         files for people (the map report), checksummed
    <registry>/<model-name>/<version>/indexes/*       search indices (service/indices/ann.py), checksummed
    <registry>/<model-name>/PINNED                    optional: the pinned version
    <registry>/<model-name>/SPLIT                     optional: a candidate version and its share of users

Publishing writes into a hidden temporary sibling folder, fsyncs every file
and the folder, then renames it into place, so a reader never sees a
half-written version. Loading verifies every checksum, shape and dtype
against the manifest, refuses symbolic links anywhere in a version, and
raises :class:`ArtifactError` on any mismatch.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from ordrec.service.storage.idmap import IdMap, PackedIdMap
from ordrec.v1 import manifest_pb2

FORMAT = 1
MANIFEST = "manifest.json"
PIN_FILE = "PINNED"
SPLIT_FILE = "SPLIT"  # JSON {"candidate": version, "share": fraction}: see LiveVersions.split
HIDDEN_FILE = "HIDDEN"  # item ids an operator hid: <registry>/HIDDEN (all models), <registry>/<model>/HIDDEN
ALL_MODELS = "*"  # the scope of <registry>/HIDDEN
# Id spaces this large load packed (service/storage/idmap.py): a tenth of the memory, lookups a few us slower.
PACKED_MIN_IDS = 100_000
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
# Files beside a model's versions (e.g. the training job's events checkpoint): plain names,
# at most one folder deep, never hidden, so they never look like a version or a temporary folder.
_MODEL_FILE_RE = re.compile(r"^[A-Z0-9_]{1,64}$|^[a-z]{1,32}/[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def validate_model_file(path: str) -> str:
    """``path`` if it may name a file beside a model's versions, else ValueError."""
    if not _MODEL_FILE_RE.match(path) or ".." in path:
        raise ValueError(f"{path!r} is not a model file name (NAME, or folder/name)")
    return path


_ARRAY_NAME_RE = re.compile(r"^[a-z0-9_]{1,64}$")
# Fixed width, so text order is time order: 20261125T223500.123456Z
_VERSION_RE = re.compile(r"^\d{8}T\d{6}\.\d{6}Z$")
_VERSION_FMT = "%Y%m%dT%H%M%S.%fZ"
_VIEW_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
VIEWS_DIR = "views"
INDEXES_DIR = "indexes"
_CHUNK = 1 << 20


_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_ROOT_FILE_RE = re.compile(r"^[A-Z][A-Z_]{0,63}$")
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


def validate_root_file(filename: str) -> str:
    """A registry-level file's name: capitals and underscores (``FORGOTTEN``), nothing else."""
    if not _ROOT_FILE_RE.match(filename):
        raise ArtifactError(f"{filename!r} is not a registry-level file name (A-Z and _)")
    return filename


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
    views: dict[str, View] = field(default_factory=dict)  # verified and read at load
    indexes: dict[str, SearchIndex] = field(default_factory=dict)  # verified at load, opened by the index

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


def write_views(folder: Path, views: ViewSource) -> manifest_pb2.Manifest:
    """Add or replace view files of a published version: the new files first, then the
    manifest in one rename. A server reads views at load, so it shows the new ones from
    its next load of this version."""
    manifest = read_manifest(folder)
    _set_views(folder, manifest, views)
    _replace_synced(folder, MANIFEST, _manifest_json(manifest))
    return manifest


def _replace_synced(folder: Path, filename: str, data: bytes) -> None:
    tmp = folder / f".{filename}.{uuid.uuid4().hex}"
    _write_synced(tmp, data)
    os.replace(tmp, folder / filename)
    _fsync_dir(folder)


@dataclass(frozen=True)
class View:
    """A file for people published in a version (e.g. ``report.html``): checksummed in
    the manifest like the arrays. ``script_hashes`` are the base64 sha256 of the inline
    scripts the page may run; the HTTP port's Content-Security-Policy allows only those."""

    data: bytes
    script_hashes: tuple[str, ...] = ()
    path: str = ""  # inside the version folder, once published


ViewSource = Mapping[str, "bytes | View"]


@dataclass(frozen=True)
class SearchIndex:
    """A search index file published in a version (``service/indices/ann.py``), checksummed in the
    manifest like the arrays.

    In the trainer, ``write`` builds the file at a given path when the version is
    published (so an artifact that is only evaluated never pays for the build). Once
    published or loaded, ``path`` is the verified file inside the version folder.
    """

    library: str
    params: dict[str, Any]
    write: Callable[[Path], None] | None = None
    path: Path | None = None


def _as_view(value: bytes | View) -> View:
    return value if isinstance(value, View) else View(bytes(value))


def _write_view_file(folder: Path, name: str, value: bytes | View) -> manifest_pb2.ViewFile:
    """Write one view under a content-addressed path, so a rewrite never changes a file a
    reader may be verifying against the previous manifest."""
    if not _VIEW_NAME_RE.match(name):
        raise ArtifactError(f"view name {name!r} must match {_VIEW_NAME_RE.pattern}")
    view = _as_view(value)
    digest = hashlib.sha256(view.data).hexdigest()
    rel = f"{VIEWS_DIR}/{digest[:16]}-{name}"
    (folder / VIEWS_DIR).mkdir(exist_ok=True)
    _write_synced(folder / rel, view.data)
    return manifest_pb2.ViewFile(name=name, path=rel, sha256=digest, script_hashes=list(view.script_hashes))


def _set_views(folder: Path, manifest: manifest_pb2.Manifest, views: ViewSource) -> None:
    entries = {e.name: e for e in manifest.views}
    for name, value in views.items():
        entries[name] = _write_view_file(folder, name, value)
    del manifest.views[:]
    manifest.views.extend(entries[name] for name in sorted(entries))
    if (folder / VIEWS_DIR).is_dir():
        _fsync_dir(folder / VIEWS_DIR)


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


def _whole_as_int(value: Any) -> Any:
    """Whole floats as ints, through lists and dicts: protobuf's Struct stores
    every number as a double, but hyperparameters such as ranks are ints."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_whole_as_int(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole_as_int(v) for k, v in value.items()}
    return value


def _from_struct(msg: Struct) -> dict[str, Any]:
    """A Struct as plain Python, whole numbers as ints."""
    return _whole_as_int(json_format.MessageToDict(msg))


def _manifest_json(manifest: manifest_pb2.Manifest) -> bytes:
    # The Struct fields are written with whole numbers as ints ("rank": 20, not
    # 20.0) for the people who read manifests; the parser reads both forms, so
    # the format is unchanged and older manifests load as before.
    data = json_format.MessageToDict(manifest, preserving_proto_field_name=True)
    for key in ("hyperparameters", "attributes"):
        if key in data:
            data[key] = _whole_as_int(data[key])
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


@dataclass(frozen=True)
class Split:
    """A share of users sent to a candidate version beside the live one."""

    candidate: str
    share: float

    def __post_init__(self) -> None:
        if not is_version(self.candidate):
            raise ArtifactError(f"split candidate {self.candidate!r} is not a version name")
        if not 0.0 < self.share <= 1.0:
            raise ArtifactError(f"split share {self.share!r} must be in (0, 1]")

    def to_json(self) -> bytes:
        return (json.dumps({"candidate": self.candidate, "share": self.share}) + "\n").encode()

    @classmethod
    def parse(cls, data: bytes, where: str) -> Split:
        try:
            body = json.loads(data.decode("utf-8"))
            return cls(str(body["candidate"]), float(body["share"]))
        except (UnicodeDecodeError, ValueError, TypeError, KeyError) as exc:
            raise ArtifactError(f"{where}: not a split ({type(exc).__name__}: {exc})") from None


class LiveVersions:
    """Which version is live (pinned or split) and which items are hidden, the same for every
    registry backend.

    A backend provides ``models()``, ``versions(name)``, ``root`` (where it lives, for
    messages) and three primitives on the small files beside a model's versions:
    ``read_model_file(name, filename)`` (None when absent), ``write_model_file(name,
    filename, data)`` (atomic) and ``delete_model_file(name, filename)``; and ``hidden(scope)``.
    """

    def hidden_scopes(self) -> dict[str, frozenset[str]]:
        """Every scope that has a HIDDEN file, with its ids."""
        scopes = {ALL_MODELS: self.hidden(ALL_MODELS)}  # type: ignore[attr-defined]
        for name in self.models():  # type: ignore[attr-defined]
            scopes[name] = self.hidden(name)  # type: ignore[attr-defined]
        return {scope: ids for scope, ids in scopes.items() if ids}

    def live_version(self, name: str) -> tuple[str, str]:
        """The version a server should serve, and why ("pinned" or "newest")."""
        pinned = self.pinned(name)
        versions = self.versions(name)  # type: ignore[attr-defined]
        if pinned is not None:
            if pinned not in versions:
                raise ArtifactError(f"{name}: pinned version {pinned} does not exist")
            return pinned, "pinned"
        if not versions:
            raise ArtifactError(f"{name}: no published version in {self.root}")  # type: ignore[attr-defined]
        return versions[-1], "newest"

    def iter_live(self) -> Iterator[tuple[str, str, str]]:
        """(name, version, reason) for every model with a live version."""
        for name in self.models():  # type: ignore[attr-defined]
            try:
                version, reason = self.live_version(name)
            except ArtifactError:
                continue
            yield name, version, reason

    def requested_version(self, name: str, version: str | None) -> str:
        """``version``, checked, or the live one when it is None."""
        if version is None:
            version, _ = self.live_version(name)
        if not is_version(version):
            raise ArtifactError(f"{name}: {version!r} is not a version name")
        return version

    # --------------------------------------------------------------- pinning
    def pinned(self, name: str) -> str | None:
        data = self.read_model_file(validate_model_name(name), PIN_FILE)  # type: ignore[attr-defined]
        version = data.decode("utf-8", "replace").strip() if data else ""
        return version or None

    def pin(self, name: str, version: str) -> None:
        if version not in self.versions(name):  # type: ignore[attr-defined]
            raise ArtifactError(f"{name}: cannot pin unknown version {version!r}")
        self.write_model_file(name, PIN_FILE, (version + "\n").encode())  # type: ignore[attr-defined]

    def unpin(self, name: str) -> None:
        self.delete_model_file(validate_model_name(name), PIN_FILE)  # type: ignore[attr-defined]

    # -------------------------------------------------------------- splitting
    def split(self, name: str) -> Split | None:
        """The model's split, or None; a malformed SPLIT file is an :class:`ArtifactError`."""
        data = self.read_model_file(validate_model_name(name), SPLIT_FILE)  # type: ignore[attr-defined]
        return Split.parse(data, f"{self.root}/{name}/{SPLIT_FILE}") if data else None  # type: ignore[attr-defined]

    def set_split(self, name: str, candidate: str, share: float) -> Split:
        """Send ``share`` of the users to ``candidate``; the rest keep the live version."""
        split = Split(candidate, float(share))
        if candidate not in self.versions(name):  # type: ignore[attr-defined]
            raise ArtifactError(f"{name}: no version {candidate!r} to split to")
        live, _ = self.live_version(name)
        if candidate == live:
            raise ArtifactError(f"{name}: {candidate} is already the live version")
        self.write_model_file(name, SPLIT_FILE, split.to_json())  # type: ignore[attr-defined]
        return split

    def clear_split(self, name: str) -> None:
        self.delete_model_file(validate_model_name(name), SPLIT_FILE)  # type: ignore[attr-defined]

    def promote(self, name: str) -> str:
        """Make the split's candidate the live version (pinned), end the split; return it.

        PINNED is written first: a reader between the two writes sees the candidate
        live and a split to the live version, which serves every user the candidate.
        """
        split = self.split(name)
        if split is None:
            raise ArtifactError(f"{name}: no split to promote")
        self.pin(name, split.candidate)
        self.clear_split(name)
        return split.candidate

    def check_deletable(self, name: str, version: str) -> None:
        """ArtifactError unless ``version`` exists and is neither live nor protected."""
        if version not in self.versions(name):  # type: ignore[attr-defined]
            raise ArtifactError(f"{name}: no version {version!r}")
        live, _ = self.live_version(name)
        if version == live or version in self.protected(name):
            raise ArtifactError(f"{name}@{version} is live, pinned or a split's candidate: not deleted")

    def protected(self, name: str) -> set[str]:
        """Versions pruning must keep: the pinned one and a split's candidate."""
        kept = {self.pinned(name)}
        try:
            split = self.split(name)
        except ArtifactError:
            split = None
        if split is not None:
            kept.add(split.candidate)
        return {v for v in kept if v}


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
            text = self._hidden_path(scope).read_text(encoding="utf-8")
        except FileNotFoundError:
            return frozenset()
        return frozenset(line for line in text.splitlines() if line)

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
        _replace_synced(path.parent, HIDDEN_FILE, "".join(f"{i}\n" for i in sorted(ids)).encode("utf-8"))

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
    def prune(self, name: str, keep: int) -> list[str]:
        """Delete all but the newest ``keep`` versions (never the pinned one nor a split's
        candidate); return what went."""
        if keep < 1:
            raise ValueError("keep must be at least 1")
        folder = self.root / validate_model_name(name)
        kept = self.protected(name)
        doomed = [v for v in self.versions(name)[:-keep] if v not in kept]
        for version in doomed:
            self._remove_version(folder, version)
        self._remove_abandoned(folder)
        return doomed

    def delete_version(self, name: str, version: str) -> None:
        """Delete one version (never the live one, the pinned one nor a split's candidate)."""
        self.check_deletable(name, version)
        self._remove_version(self.root / validate_model_name(name), version)

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


def _refuse_links(folder: Path) -> None:
    """A version is plain folders and files: no symlink in it, nor as it or its model folder."""
    for path in (folder.parent, folder):
        if path.is_symlink():
            raise ArtifactError(f"{path}: is a symbolic link; versions hold plain folders and files only")
    for root, dirs, files in os.walk(folder):
        for entry in dirs + files:
            if os.path.islink(os.path.join(root, entry)):
                raise ArtifactError(
                    f"{os.path.join(root, entry)}: is a symbolic link; versions hold plain"
                    " folders and files only"
                )


def _inside(folder: Path, rel: str) -> Path:
    """``folder/rel`` for a plain relative path that stays inside the folder."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or any(p in (".", "..") for p in parts):
        raise ArtifactError(f"{folder}: manifest path {rel!r} escapes the version folder")
    return folder.joinpath(*parts)


def _read_nofollow(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: listed in the manifest but missing") from None
    except OSError as exc:
        raise ArtifactError(f"{path}: unreadable: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _load_view(folder: Path, entry: manifest_pb2.ViewFile) -> View:
    path = _inside(folder, entry.path)
    data = _read_nofollow(path)  # checksum and content from one read
    actual = hashlib.sha256(data).hexdigest()
    if actual != entry.sha256:
        raise ArtifactError(f"{path}: checksum mismatch (manifest {entry.sha256[:12]}…, file {actual[:12]}…)")
    return View(data, tuple(entry.script_hashes), entry.path)


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
    text = path.read_bytes()
    count = text.count(b"\n")
    if count != entry.count or (text and not text.endswith(b"\n")):
        raise ArtifactError(f"{path}: {count} ids but the manifest says {entry.count}")
    try:
        if count >= PACKED_MIN_IDS:
            return PackedIdMap(text)
        return IdMap(text.decode("utf-8").split("\n")[:-1])
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: {exc}") from None


def _load_index(folder: Path, entry: manifest_pb2.IndexFile) -> SearchIndex:
    path = _inside(folder, entry.path)
    _verify_checksum(path, entry.sha256)
    return SearchIndex(library=entry.library, params=_from_struct(entry.params), path=path)


def read_view(folder: str | os.PathLike, name: str) -> bytes | None:
    """The verified bytes of one view of a published version, or None when it has none."""
    folder = Path(folder)
    _refuse_links(folder)
    entry = next((e for e in read_manifest(folder).views if e.name == name), None)
    return _load_view(folder, entry).data if entry is not None else None


def load_version(folder: str | os.PathLike, *, mmap: bool = True, views: bool = True) -> Artifact:
    """Load one version folder, verifying it completely against its manifest.

    ``views=False`` skips the view files (to redraw a report whose old copy is damaged).
    """
    folder = Path(folder)
    _refuse_links(folder)
    manifest = read_manifest(folder)
    arrays = {Path(e.path).stem: _load_array(folder, e, mmap) for e in manifest.arrays}
    ids = {e.space: _load_ids(folder, e) for e in manifest.ids}
    loaded_views = {e.name: _load_view(folder, e) for e in manifest.views} if views else {}
    indexes = {e.name: _load_index(folder, e) for e in manifest.indexes}
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
        views=loaded_views,
        indexes=indexes,
    )
