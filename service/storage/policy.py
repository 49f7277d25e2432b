"""Which version is live (pinning, splitting) and which may go (pruning), the same for every registry backend."""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

from ordrec.service.storage.artifact import ArtifactError
from ordrec.service.storage.hidden_items import ALL_MODELS
from ordrec.service.storage.names import is_version, validate_model_name

PIN_FILE = "PINNED"
SPLIT_FILE = "SPLIT"  # JSON {"candidate": version, "share": fraction}: see LiveVersions.split


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


class LiveVersions(ABC):
    """Which version is live (pinned or split), which items are hidden and which versions
    pruning may delete, the same for every registry backend.

    A backend provides where it lives (``root``, for messages), its listings, three primitives
    on the small files beside a model's versions, its hidden ids, and how it removes versions
    and the leftovers of killed publishers: the abstract methods below.
    """

    root: str | os.PathLike[str]

    @abstractmethod
    def models(self) -> list[str]:
        """The model names, sorted."""

    @abstractmethod
    def versions(self, name: str) -> list[str]:
        """The published versions of ``name``, oldest first."""

    @abstractmethod
    def read_model_file(self, name: str, path: str) -> bytes | None:
        """A file beside the versions of ``name``, or None when absent."""

    @abstractmethod
    def write_model_file(self, name: str, path: str, data: bytes) -> None:
        """Replace that file atomically."""

    @abstractmethod
    def delete_model_file(self, name: str, path: str) -> None:
        """Delete that file (nothing when absent)."""

    @abstractmethod
    def hidden(self, scope: str) -> frozenset[str]:
        """Item ids hidden for ``scope`` (a model name, or ``ALL_MODELS``)."""

    @abstractmethod
    def _remove_versions(self, name: str, versions: list[str]) -> None:
        """Delete these versions of ``name`` so a reader never sees one half-deleted."""

    @abstractmethod
    def _remove_leftovers(self, name: str) -> None:
        """Delete what killed publishers and pruners left beside the versions of ``name``."""

    def hidden_scopes(self) -> dict[str, frozenset[str]]:
        """Every scope that has a HIDDEN file, with its ids."""
        scopes = {ALL_MODELS: self.hidden(ALL_MODELS)}
        for name in self.models():
            scopes[name] = self.hidden(name)
        return {scope: ids for scope, ids in scopes.items() if ids}

    def live_version(self, name: str) -> tuple[str, str]:
        """The version a server should serve, and why ("pinned" or "newest")."""
        pinned = self.pinned(name)
        versions = self.versions(name)
        if pinned is not None:
            if pinned not in versions:
                raise ArtifactError(f"{name}: pinned version {pinned} does not exist")
            return pinned, "pinned"
        if not versions:
            raise ArtifactError(f"{name}: no published version in {self.root}")
        return versions[-1], "newest"

    def iter_live(self) -> Iterator[tuple[str, str, str]]:
        """(name, version, reason) for every model with a live version."""
        for name in self.models():
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
        data = self.read_model_file(validate_model_name(name), PIN_FILE)
        version = data.decode("utf-8", "replace").strip() if data else ""
        return version or None

    def pin(self, name: str, version: str) -> None:
        if version not in self.versions(name):
            raise ArtifactError(f"{name}: cannot pin unknown version {version!r}")
        self.write_model_file(name, PIN_FILE, (version + "\n").encode())

    def unpin(self, name: str) -> None:
        self.delete_model_file(validate_model_name(name), PIN_FILE)

    # -------------------------------------------------------------- splitting
    def split(self, name: str) -> Split | None:
        """The model's split, or None; a malformed SPLIT file is an :class:`ArtifactError`."""
        data = self.read_model_file(validate_model_name(name), SPLIT_FILE)
        return Split.parse(data, f"{self.root}/{name}/{SPLIT_FILE}") if data else None

    def set_split(self, name: str, candidate: str, share: float) -> Split:
        """Send ``share`` of the users to ``candidate``; the rest keep the live version."""
        split = Split(candidate, float(share))
        if candidate not in self.versions(name):
            raise ArtifactError(f"{name}: no version {candidate!r} to split to")
        live, _ = self.live_version(name)
        if candidate == live:
            raise ArtifactError(f"{name}: {candidate} is already the live version")
        self.write_model_file(name, SPLIT_FILE, split.to_json())
        return split

    def clear_split(self, name: str) -> None:
        self.delete_model_file(validate_model_name(name), SPLIT_FILE)

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
        if version not in self.versions(name):
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

    # -------------------------------------------------------------- retention
    def prune(self, name: str, keep: int) -> list[str]:
        """Delete all but the newest ``keep`` versions (never the pinned one nor a split's
        candidate); return what went."""
        if keep < 1:
            raise ValueError("keep must be at least 1")
        kept = self.protected(name)
        doomed = [v for v in self.versions(name)[:-keep] if v not in kept]
        self._remove_versions(name, doomed)
        self._remove_leftovers(name)
        return doomed

    def delete_version(self, name: str, version: str) -> None:
        """Delete one version (never the live one, the pinned one nor a split's candidate)."""
        self.check_deletable(name, version)
        self._remove_versions(name, [version])
