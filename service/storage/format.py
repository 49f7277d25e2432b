"""The on-disk format of one version: writing its manifest and views, loading and verifying it.

Layout of a version folder::

    <version>/manifest.json   protobuf JSON of ordrec.v1.Manifest
    <version>/arrays/*.npy    arrays, loaded with mmap, never pickled
    <version>/ids/*.txt       external ids, one a line, row order
    <version>/views/*         files for people (the map report), checksummed
    <version>/indexes/*       search indices (service/indices/ann.py), checksummed

Loading verifies every checksum, shape and dtype against the manifest, refuses
symbolic links anywhere in a version, and raises :class:`ArtifactError` on any mismatch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from ordrec.service.storage.artifact import Artifact, ArtifactError, SearchIndex, View, ViewSource
from ordrec.service.storage.checksums import _fsync_dir, _replace_synced, _verify_checksum, _write_synced
from ordrec.service.storage.idmap import IdMap, PackedIdMap, id_map_from_lines
from ordrec.v1 import manifest_pb2

FORMAT = 1


MANIFEST = "manifest.json"


_ARRAY_NAME_RE = re.compile(r"^[a-z0-9_]{1,64}$")


_VIEW_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


VIEWS_DIR = "views"


INDEXES_DIR = "indexes"


def write_views(folder: Path, views: ViewSource) -> manifest_pb2.Manifest:
    """Add or replace view files of a published version: the new files first, then the
    manifest in one rename. A server reads views at load, so it shows the new ones from
    its next load of this version."""
    manifest = read_manifest(folder)
    _set_views(folder, manifest, views)
    _replace_synced(folder, MANIFEST, _manifest_json(manifest))
    return manifest


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


def _encode_ids(space: str, ids: IdMap) -> bytes:
    if isinstance(ids, PackedIdMap):  # its text is the file: one id a line, none empty
        blob, _ = ids.utf8_lines()
        if b"\r" not in blob and b"\n\n" not in blob and not blob.startswith(b"\n"):
            return blob
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
        return id_map_from_lines(text)
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
