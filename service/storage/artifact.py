"""The artifact type: one model version in memory (arrays, id maps, metadata, views, indexes)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ordrec.service.storage.idmap import IdMap


class ArtifactError(Exception):
    """A model version that is missing, corrupt or inconsistent with its manifest."""


def code_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ordrec")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0+unknown"


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
