"""Redacted copies of the versions that name forgotten users (GDPR Art. 17).

A version names a user in its ``users`` id map and holds their row in the
per-user arrays: factors or map coordinates, and lists sliced per user (the
training items excluded at serving, RTF's tag lists and posts). A redacted copy
has the forgotten users' rows *removed* from all of them and the id map rebuilt,
so no file of it holds their id or anything else that was theirs; every other
user's rows, every item-side array and the search indexes are copied unchanged,
so every other user gets exactly the answers the original gave. Reports (views)
are not copied: they are drawn from the data and the next training draws anew.

The copy is published as the *successor* version (the original's name plus a
microsecond, so it sorts where the original did: a newest live version stays
live, an older one stays older), PINNED and a split's candidate are moved to it,
then the original is deleted. Servers see the live version change and load the
copy; pins and splits stay valid throughout.
"""

from __future__ import annotations

import datetime as _dt
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ordrec.service.indices.models import build_index
from ordrec.service.live.forgotten import list_hash
from ordrec.service.storage.artifact import Artifact, ArtifactError, SearchIndex
from ordrec.service.storage.names import _VERSION_FMT

USER_SPACE = "users"  # the id space of a version that names users
# Arrays with one row per user.
USER_ROWS = ("user_factors", "user_coords")


@dataclass(frozen=True)
class UserLists:
    """Lists stored CSR-style: ``indptr`` (one more than its rows) slicing ``values``; the
    ``nested`` lists have one row per entry of these (RTF's posts, each a list of tags)."""

    indptr: str
    values: tuple[str, ...]
    nested: tuple[UserLists, ...] = ()

    def names(self) -> set[str]:
        return {self.indptr, *self.values}.union(*(n.names() for n in self.nested))


# Lists with one row per user.
USER_LISTS = (
    UserLists("seen_indptr", ("seen_indices", "seen_ratings")),
    UserLists("user_tag_indptr", ("user_tag_indices", "user_tag_counts")),
    UserLists("post_indptr", ("post_items",), (UserLists("post_tag_indptr", ("post_tags",)),)),
)
PER_USER = set(USER_ROWS).union(*(lists.names() for lists in USER_LISTS))


@dataclass
class Redacted:
    """What :func:`redact_versions` rewrote: ``(original, copy)`` pairs, and the versions
    that could not be (with why), which still name a forgotten user."""

    rewritten: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


def forgotten_rows(users, digests: frozenset[str] | set[str]) -> np.ndarray:
    """Which rows of an id map hold a forgotten user (a boolean mask)."""
    listed = list_hash().listed
    return np.fromiter((listed(uid, digests) for uid in users.ids), dtype=bool, count=len(users))


def without_list_rows(arrays: Mapping[str, np.ndarray], lists: UserLists, gone: np.ndarray) -> dict:
    """The arrays of ``lists`` (and its nested lists) without the rows ``gone`` marks."""
    indptr = np.asarray(arrays[lists.indptr])
    if indptr.shape != (gone.size + 1,):
        raise ArtifactError(f"{lists.indptr}: {indptr.shape[0] - 1} rows, expected {gone.size}")
    counts = np.diff(indptr)
    kept_entries = np.repeat(~gone, counts)
    out = {lists.indptr: np.concatenate([[0], np.cumsum(counts[~gone])]).astype(indptr.dtype)}
    for name in (name for name in lists.values if name in arrays):  # versions before seen_ratings
        values = np.asarray(arrays[name])
        if values.shape[0] != kept_entries.size:
            raise ArtifactError(
                f"{name}: {values.shape[0]} entries, {lists.indptr} slices {kept_entries.size}"
            )
        out[name] = values[kept_entries]
    for nested in lists.nested:
        if nested.indptr in arrays:
            out.update(without_list_rows(arrays, nested, ~kept_entries))
    return out


def redact_artifact(artifact: Artifact, digests: frozenset[str] | set[str]) -> Artifact | None:
    """A copy of ``artifact`` without the users whose digest is listed (None when it names
    none of them); an ArtifactError when it holds a per-user array this module does not know."""
    users = artifact.ids.get(USER_SPACE)
    if users is None or not digests:
        return None
    gone = forgotten_rows(users, digests)
    if not gone.any():
        return None
    unknown = sorted(n for n in artifact.arrays if n.startswith("user") and n not in PER_USER)
    if unknown:
        raise ArtifactError(f"{artifact.describe()}: cannot redact per-user array(s) {', '.join(unknown)}")
    kept = np.flatnonzero(~gone)
    arrays = dict(artifact.arrays)
    for name in USER_ROWS:
        if name in arrays:
            rows = np.asarray(arrays[name])
            if rows.shape[0] != gone.size:
                raise ArtifactError(
                    f"{artifact.describe()}: {name} has {rows.shape[0]} rows, {gone.size} users"
                )
            arrays[name] = rows[kept]
    for lists in USER_LISTS:
        if lists.indptr in arrays:
            arrays.update(without_list_rows(arrays, lists, gone))
    return Artifact(
        kind=artifact.kind,
        arrays=arrays,
        ids={**artifact.ids, USER_SPACE: users.subset(kept)},
        hyperparameters=dict(artifact.hyperparameters),
        metrics=dict(artifact.metrics),
        attributes={
            **artifact.attributes,
            "redacted_from": artifact.version,
            "redacted_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        },
        data_fingerprint=artifact.data_fingerprint,
        indexes={name: copied_index(index) for name, index in artifact.indexes.items()},
    )


def copied_index(index: SearchIndex) -> SearchIndex:
    """A published search index written again as the same bytes (indexes are over items)."""
    if index.path is None:
        raise ArtifactError(f"index {index.library!r} has no file to copy")
    return SearchIndex(index.library, dict(index.params), write=partial(shutil.copyfile, index.path))


def successor_version(versions: Iterable[str], version: str) -> str:
    """The first free name after ``version`` (a microsecond later, or more) that still sorts
    before the next version; an ArtifactError when there is no room."""
    taken = sorted(versions)
    later = [v for v in taken if v > version]
    start = _dt.datetime.strptime(version, _VERSION_FMT)
    for step in range(1, 1001):
        name = (start + _dt.timedelta(microseconds=step)).strftime(_VERSION_FMT)
        if later and name >= later[0]:
            break
        if name not in taken:
            return name
    raise ArtifactError(f"no free version name between {version} and the next one")


def redact_version(registry, name: str, version: str, digests: frozenset[str] | set[str]) -> str | None:
    """Replace ``name@version`` by its redacted copy (see the module docstring); the copy's
    version, or None when the version names no listed user."""
    redacted = redact_artifact(registry.load(name, version, views=False), digests)
    if redacted is None:
        return None
    copy = registry.publish(name, redacted, version=successor_version(registry.versions(name), version))
    try:
        build_index(registry.load(name, copy))  # servers must be able to load it
    except Exception:
        registry.delete_version(name, copy)
        raise
    if registry.pinned(name) == version:
        registry.pin(name, copy)
    split = registry.split(name)
    if split is not None and split.candidate == version:
        registry.set_split(name, copy, split.share)
    registry.delete_version(name, version)
    return copy


def redact_versions(
    registry, name: str, digests: frozenset[str] | set[str], versions: Iterable[str]
) -> Redacted:
    """Redact each of ``versions`` of ``name``; one that fails is reported, the rest go on."""
    done = Redacted()
    for version in versions:
        try:
            copy = redact_version(registry, name, version, digests)
        except Exception as exc:  # noqa: BLE001 - reported; the next run tries again
            done.failed.append((version, f"{type(exc).__name__}: {exc}"))
            continue
        if copy is not None:
            done.rewritten.append((version, copy))
    return done
