"""A registry in S3-compatible object storage, and :func:`open_registry` for either kind.

Layout under ``s3://<bucket>/<prefix>``, the same as the local registry's::

    <prefix>/<model>/<version>/manifest.json    written LAST: its presence makes the version visible
    <prefix>/<model>/<version>/arrays/*.npy     every file the manifest lists, written first
    <prefix>/<model>/<version>/...
    <prefix>/<model>/PINNED                     optional: the pinned version
    <prefix>/<model>/SPLIT                      optional: a candidate version and its share

Object stores have no rename, so atomicity comes from order: a publisher stages the
version in a local folder (the local registry's own code writes it, so the files and
the manifest are byte for byte what a local publish writes), uploads every file, then
the manifest, with ``If-None-Match: *`` so two publishers can never overwrite one
version's manifest. Listing versions lists manifests, so a publisher killed midway
leaves objects nobody sees; :meth:`S3Registry.gc` deletes them once they are older than
``stale_seconds`` (an hour: no live publish takes that long between its first file and
its manifest). Pruning deletes a version's manifest first, so it disappears at once and
a reader never sees half of it.

Readers (the server) download a version into a local cache folder (every file the
manifest lists, then the manifest, into a temporary folder renamed into place), then
load it with :func:`~ordrec.service.storage.format.load_version`, the same code that loads a
local version: symbolic links, paths, checksums, shapes and dtypes are checked exactly
as for a local registry, and the arrays are memory-mapped from the cache. A version
that fails any check is deleted from the cache and refused; the served one stays.

boto3 is imported only here and only for an ``s3://`` registry (``pip install
ordrec[s3]``). Credentials, region and endpoint come from boto3's standard chain:
``AWS_*`` environment variables, ``~/.aws/config``, a web identity token (IRSA on EKS)
or instance metadata, and ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` for MinIO or
another S3-compatible store. Nothing is read from a job file or a flag.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import logging
import os
import random
import shutil
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from ordrec.service.storage.artifact import Artifact, ArtifactError, ViewSource
from ordrec.service.storage.format import FORMAT, MANIFEST, _inside, load_version
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
from ordrec.service.storage.registry import _TMP_PREFIX, Registry
from ordrec.v1 import manifest_pb2

log = logging.getLogger("ordrec.registry")

S3_SCHEME = "s3://"
STALE_SECONDS = 3600  # an unfinished version older than this has lost its publisher
CACHE_KEEP = 2  # cached versions kept per model: the one just loaded and the one it replaces


class RegistryUnavailable(Exception):
    """The store could not be reached or answered an error: nothing is known about the
    version, so it is retried at the next poll rather than refused."""


def is_object_store(location: str | os.PathLike) -> bool:
    return isinstance(location, str) and location.startswith(S3_SCHEME)


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/ordrec/registry``, else ``<system temp>/ordrec-cache-<uid>``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "ordrec" / "registry"
    return Path(tempfile.gettempdir()) / f"ordrec-cache-{os.getuid()}"


def open_registry(location: str | os.PathLike, cache_dir: str | os.PathLike | None = None):
    """A :class:`Registry` for a local directory, an :class:`S3Registry` for ``s3://bucket/prefix``."""
    if is_object_store(location):
        return S3Registry(str(location), cache_dir=cache_dir)
    return Registry(location)


class Downloads:
    """Where a command that ends (a training job, an export, any ``ordrec-train`` command)
    downloads ``s3://`` versions: a private temporary folder under ``parent`` (default the
    system's temporary folder), made at the first ``s3://`` registry opened and removed with
    everything in it when the command ends, so no copy of a version outlives the command.

    The folder is held by an exclusive ``flock`` while the command runs; a folder whose
    holder died without removing it (SIGKILL, a crash) is removed by the next command
    that downloads under the same parent.
    """

    def __init__(self, parent: str | os.PathLike | None = None):
        self.parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
        self.folder: Path | None = None
        self._held: int | None = None

    def open_registry(self, location: str | os.PathLike):
        """:func:`open_registry`, an ``s3://`` registry downloading into this folder."""
        if not is_object_store(location):
            return Registry(location)
        return S3Registry(str(location), cache_dir=self._folder())

    def _folder(self) -> Path:
        if self.folder is None:
            try:
                self.parent.mkdir(parents=True, exist_ok=True)
                remove_abandoned_downloads(self.parent)
                folder = Path(tempfile.mkdtemp(prefix=DOWNLOADS_PREFIX, dir=self.parent))  # mode 0700
                self._held = os.open(folder, os.O_RDONLY)
            except OSError as exc:
                raise ArtifactError(f"cannot make a download folder in {self.parent}: {exc}") from None
            fcntl.flock(self._held, fcntl.LOCK_EX)
            self.folder = folder
        return self.folder

    def close(self) -> None:
        """Remove the folder and everything downloaded into it."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def __enter__(self) -> Downloads:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


DOWNLOADS_PREFIX = "ordrec-downloads-"
_YOUNG_SECONDS = 60.0  # a folder this new may not be locked yet by the command that made it


def remove_abandoned_downloads(parent: Path) -> list[Path]:
    """Remove the download folders under ``parent`` that are ours and no live command holds."""
    removed = []
    for folder in parent.glob(DOWNLOADS_PREFIX + "*"):
        try:
            if folder.stat().st_uid != os.getuid() or time.time() - folder.stat().st_mtime < _YOUNG_SECONDS:
                continue
            fd = os.open(folder, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a running command's
        finally:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` as ``("bucket", "some/prefix")`` (no slashes at the ends)."""
    if not url.startswith(S3_SCHEME):
        raise ValueError(f"{url!r} is not an s3:// URL")
    bucket, _, prefix = url[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket (s3://bucket/prefix)")
    return bucket, prefix.strip("/")


def manifest_paths(manifest: Message) -> list[str]:
    """Every file a manifest lists: each ``path`` field of every entry, however nested.

    Read from the message's own descriptor, so a file kind added to the manifest later
    (an index file beside the arrays, say) is downloaded without a change here.
    """
    paths: list[str] = []
    for field, value in manifest.ListFields():
        if field.message_type is None:
            if field.name == "path" and isinstance(value, str) and value:
                paths.append(value)
            continue
        if field.message_type.GetOptions().map_entry:
            continue
        items = value if field.is_repeated else [value]
        for item in items:
            paths += manifest_paths(item)
    return sorted(set(paths))


def _client():
    """An S3 client from boto3's standard credential and endpoint chain."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise RuntimeError("an s3:// registry needs boto3: pip install 'ordrec[s3]'") from None
    # Bounded waits: a poll that hangs would stall reloads; retries ride out throttling (503 SlowDown).
    config = Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 5, "mode": "standard"})
    return boto3.session.Session().client("s3", config=config)


# A conditional PUT lost to another writer (412), or raced one in flight (409, S3 asks to retry).
_LOST_RACE = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")
_UNSUPPORTED = ("NotImplemented", "501")  # a store without conditional writes (older MinIO, Ceph)


def _error_code(exc: Exception) -> str:
    """The S3 error code of a botocore ClientError ("" for anything else)."""
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _missing(exc: Exception) -> bool:
    return _error_code(exc) in ("404", "NoSuchKey", "NotFound")


class S3Registry(LiveVersions):
    """The registry interface of :class:`~ordrec.service.storage.registry.Registry` over S3.

    Parameters
    ----------
    url : str
        ``s3://bucket/prefix``.
    cache_dir : path, optional
        Where versions are downloaded and memory-mapped from (default
        :func:`default_cache_dir`); one folder per bucket and prefix.
    client : optional
        A boto3 S3 client (default: one from the standard chain).
    stale_seconds : float
        Age after which :meth:`gc` deletes an unfinished version.
    """

    def __init__(
        self,
        url: str,
        cache_dir: str | os.PathLike | None = None,
        client: Any = None,
        stale_seconds: float = STALE_SECONDS,
    ):
        self.url = url.rstrip("/")
        self.root = self.url  # where it lives, for messages
        self.bucket, self.prefix = parse_s3_url(url)
        self.client = client if client is not None else _client()
        self.stale_seconds = stale_seconds
        base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.cache_root, self._default_cache = base, cache_dir is None
        # One folder per bucket and prefix; quoted, so distinct prefixes never share a folder.
        self.cache = base / self.bucket / (urllib.parse.quote(self.prefix, safe="") or "_")
        self._known_models: frozenset[str] = frozenset()

    def __repr__(self) -> str:
        return f"S3Registry({self.url!r})"

    # ------------------------------------------------------------------ keys
    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def _list(self, prefix: str, delimiter: str | None = None) -> Iterator[dict]:
        """Every page of a listing (keys and common prefixes)."""
        kwargs = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        yield from self.client.get_paginator("list_objects_v2").paginate(**kwargs)

    def _get(self, key: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except Exception as exc:  # botocore's ClientError; not imported at module level
            if _missing(exc):
                return None
            raise

    def _delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    # --------------------------------------------------------------- listing
    def models(self) -> list[str]:
        names = set()
        for page in self._list(self._key("") + ("/" if self.prefix else ""), "/"):
            for common in page.get("CommonPrefixes", []):
                name = common["Prefix"].rstrip("/").rsplit("/", 1)[-1]
                if _NAME_RE.match(name):
                    names.add(name)
        self._known_models = frozenset(names)
        return sorted(names)

    def has_model(self, name: str) -> bool:
        """From the last :meth:`models` listing (every poll refreshes it), so an unknown
        name in a request never costs a request to the store."""
        return name in self._known_models

    def _objects(self, name: str) -> list[dict]:
        prefix = self._key(validate_model_name(name)) + "/"
        return [obj for page in self._list(prefix) for obj in page.get("Contents", [])]

    def _version_of(self, name: str, key: str) -> tuple[str, str] | None:
        """(version, path inside it) for a key under ``<model>/<version>/``, else None."""
        rest = key[len(self._key(name)) + 1 :]
        version, _, path = rest.partition("/")
        return (version, path) if path and is_version(version) else None

    def versions(self, name: str) -> list[str]:
        """Published versions: those whose manifest exists.

        Cached copies of versions the listing no longer has (deleted, or replaced by a
        redacted copy) are deleted here, so a replica's poll, which lists, drops them
        within one poll interval whether or not it loads anything.
        """
        cached = self._cached_versions(name)  # before listing: a copy fetched meanwhile is listed
        found = []
        for obj in self._objects(name):
            parts = self._version_of(name, obj["Key"])
            if parts and parts[1] == MANIFEST:
                found.append(parts[0])
        for version in sorted(cached - set(found)):
            shutil.rmtree(self.cache / name / version, ignore_errors=True)
        return sorted(found)

    def _cached_versions(self, name: str) -> set[str]:
        """The versions of ``name`` with a folder in this registry's download cache."""
        model_dir = self.cache / validate_model_name(name)
        if not model_dir.is_dir():
            return set()
        return {p.name for p in model_dir.iterdir() if p.is_dir() and is_version(p.name)}

    def manifest(self, name: str, version: str) -> manifest_pb2.Manifest:
        data = self._get(self._key(validate_model_name(name), version, MANIFEST))
        if data is None:
            raise ArtifactError(f"{self.url}/{name}/{version}: missing manifest")
        return _parse_manifest(data, f"{self.url}/{name}/{version}/{MANIFEST}")

    def read_version_file(self, name: str, version: str, path: str) -> bytes | None:
        """One file of a version as stored (not verified), or None."""
        if not is_version(version):
            return None
        _inside(Path("/"), path)  # a hostile path cannot name another key
        return self._get(self._key(validate_model_name(name), version, path))

    # ------------------------------------------ registry-level files (FORGOTTEN)
    def read_root_file(self, filename: str) -> bytes | None:
        return self._get(self._key(validate_root_file(filename)))

    def write_root_file(self, filename: str, data: bytes) -> None:
        """One PUT: readers see the old or the new file."""
        self.client.put_object(Bucket=self.bucket, Key=self._key(validate_root_file(filename)), Body=data)

    def update_root_file(
        self, filename: str, change: Callable[[bytes | None], bytes], attempts: int = 50
    ) -> bytes | None:
        """Replace that object by ``change(current)`` unless another writer replaced it in
        between (a PUT conditional on the ETag read, If-None-Match when absent; retried after
        a short random pause); return what it held before (None when absent)."""
        key = self._key(validate_root_file(filename))
        for _ in range(attempts):
            before, etag = self._get_tagged(key)
            after = change(before)
            if after == before:
                return before
            condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=after, **condition)
                return before
            except Exception as exc:  # botocore's ClientError
                code = _error_code(exc)
                if code in _UNSUPPORTED:
                    log.warning("%s does not support conditional writes; %s written without", self.url, key)
                    self.client.put_object(Bucket=self.bucket, Key=key, Body=after)
                    return before
                if code not in _LOST_RACE and not _missing(exc):
                    raise
            time.sleep(random.uniform(0.01, 0.1))
        raise ArtifactError(f"{self.url}/{filename}: {attempts} conditional writes lost to other writers")

    def _get_tagged(self, key: str) -> tuple[bytes | None, str | None]:
        """The object's body and ETag, (None, None) when absent."""
        try:
            reply = self.client.get_object(Bucket=self.bucket, Key=key)
        except Exception as exc:  # botocore's ClientError
            if _missing(exc):
                return None, None
            raise
        return reply["Body"].read(), reply["ETag"]

    def root_file_token(self, filename: str) -> object:
        """The object's ETag (None when absent): changes whenever it does."""
        try:
            key = self._key(validate_root_file(filename))
            return self.client.head_object(Bucket=self.bucket, Key=key)["ETag"]
        except Exception as exc:  # botocore's ClientError
            if _missing(exc):
                return None
            raise

    # ---------------------------------------------------------- hidden items
    def _hidden_key(self, scope: str) -> str:
        return (
            self._key(HIDDEN_FILE)
            if scope == ALL_MODELS
            else self._key(validate_model_name(scope), HIDDEN_FILE)
        )

    def hidden(self, scope: str) -> frozenset[str]:
        """Item ids hidden for ``scope`` (a model name, or ``ALL_MODELS``) without Redis."""
        data = self._get(self._hidden_key(scope))
        return hidden_ids(data) if data else frozenset()

    def hidden_token(self) -> tuple:
        """The HIDDEN objects' ETags: changes whenever one does (what the server's poll compares)."""
        token = []
        for key in [self._hidden_key(ALL_MODELS)] + [self._hidden_key(n) for n in self.models()]:
            try:
                token.append((key, self.client.head_object(Bucket=self.bucket, Key=key)["ETag"]))
            except Exception as exc:  # botocore's ClientError
                if not _missing(exc):
                    raise
        return tuple(token)

    def set_hidden(self, scope: str, ids: Iterable[str]) -> None:
        """Replace the hidden ids of ``scope`` (one PUT: readers see the old or the new list)."""
        self.client.put_object(Bucket=self.bucket, Key=self._hidden_key(scope), Body=hidden_file(ids))

    # ------------------------------------- model side files (PINNED, SPLIT, events)
    def read_model_file(self, name: str, path: str) -> bytes | None:
        return self._get(self._key(validate_model_name(name), validate_model_file(path)))

    def write_model_file(self, name: str, path: str, data: bytes) -> None:
        """One PUT: an object is replaced whole, so readers see the old or the new file."""
        key = self._key(validate_model_name(name), validate_model_file(path))
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def delete_model_file(self, name: str, path: str) -> None:
        key = self._key(validate_model_name(name), validate_model_file(path))
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def model_files(self, name: str, folder: str) -> list[str]:
        prefix = self._key(validate_model_name(name), folder) + "/"
        return sorted(
            folder + "/" + obj["Key"][len(prefix) :]
            for page in self._list(prefix)
            for obj in page.get("Contents", [])
            if "/" not in obj["Key"][len(prefix) :]
        )

    # ------------------------------------------------------------ publishing
    def publish(
        self,
        name: str,
        artifact: Artifact,
        keep: int | None = None,
        views: ViewSource | Callable[[Artifact], ViewSource] | None = None,
        version: str | None = None,
    ) -> str:
        """Upload ``artifact`` as a new version of ``name``: every file, then the manifest; return the version.

        ``version`` names it (an ArtifactError when taken); by default the next one in time.

        The version is staged by the local registry's own ``publish`` in a temporary
        folder, so its files and manifest are exactly what a local publish writes.
        """
        validate_model_name(name)
        with tempfile.TemporaryDirectory(prefix="ordrec-publish-") as tmp:
            newest = self.versions(name)
            staging = _StagingRegistry(tmp, newest[-1] if newest else None)
            if version is not None and version in newest:
                raise ArtifactError(f"{self.url}/{name}/{version}: the version exists")
            version = staging.publish(name, artifact, views=views, version=version)
            folder = Path(tmp) / name / version
            self._upload(name, version, folder)
        artifact.path = None  # the staged copy is gone; the version lives in the store
        log.info("published %s@%s to %s", name, version, self.url)
        if keep is not None:
            self.prune(name, keep)
        return version

    def _upload(self, name: str, version: str, folder: Path) -> None:
        files = [p for p in sorted(folder.rglob("*")) if p.is_file() and p != folder / MANIFEST]
        for path in files:
            rel = path.relative_to(folder).as_posix()
            self.client.upload_file(str(path), self.bucket, self._key(name, version, rel))
        key, body = self._key(name, version, MANIFEST), (folder / MANIFEST).read_bytes()
        try:
            # Last, and never over an existing manifest: this put is what publishes.
            self.client.put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*")
        except Exception as exc:
            code = _error_code(exc)
            if code in _LOST_RACE:
                raise ArtifactError(
                    f"{self.url}/{name}/{version}: another publisher took this version"
                ) from None
            if code not in _UNSUPPORTED:
                raise
            # A store without conditional writes (older MinIO, Ceph): the version name is
            # still unique to the microsecond and the job's lock keeps publishers apart.
            log.warning("%s does not support conditional writes; publishing without them", self.url)
            self.client.put_object(Bucket=self.bucket, Key=key, Body=body)

    # -------------------------------------------------------------- retention
    def _remove_versions(self, name: str, versions: list[str]) -> None:
        if not versions:
            return
        for version in versions:  # this machine's cached copies too
            shutil.rmtree(self.cache / name / version, ignore_errors=True)
        # Manifests first: each version disappears at once, then its files go.
        self._delete([self._key(name, v, MANIFEST) for v in versions])
        gone = set(versions)
        rest = [
            o["Key"] for o in self._objects(name) if (self._version_of(name, o["Key"]) or ("", ""))[0] in gone
        ]
        self._delete(rest)

    def _remove_leftovers(self, name: str) -> None:
        self._remove_stale(name)

    def gc(self) -> list[str]:
        """Delete the objects of versions that never got (or lost) their manifest and are
        older than ``stale_seconds``: what killed publishers and pruners left; return their URLs."""
        removed: list[str] = []
        for name in self.models():
            removed += self._remove_stale(name)
        return removed

    def _remove_stale(self, name: str) -> list[str]:
        groups: dict[str, list[dict]] = {}
        files: dict[str, set[str]] = {}
        for obj in self._objects(name):
            parts = self._version_of(name, obj["Key"])
            if parts:
                groups.setdefault(parts[0], []).append(obj)
                files.setdefault(parts[0], set()).add(parts[1])
        cutoff = time.time() - self.stale_seconds
        removed = []
        for version, objs in sorted(groups.items()):
            if MANIFEST in files[version]:
                continue
            if max(o["LastModified"].timestamp() for o in objs) > cutoff:
                continue  # a publisher may still be uploading
            self._delete([o["Key"] for o in objs])
            removed.append(f"{self.url}/{name}/{version}/")
        return removed

    # ---------------------------------------------------------------- loading
    def load(
        self, name: str, version: str | None = None, *, mmap: bool = True, views: bool = True
    ) -> Artifact:
        """Download a version into the cache (unless there already), verify it completely, load it."""
        version = self.requested_version(name, version)
        try:
            folder = self.fetch(name, version)
        except ArtifactError:
            raise
        except Exception as exc:  # network, throttling, permissions: botocore's errors
            raise RegistryUnavailable(
                f"{self.url}/{name}/{version}: download failed: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            artifact = load_version(folder, mmap=mmap, views=views)
        except ArtifactError:
            # A corrupt copy must not be trusted next time: the next load downloads afresh.
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._trim_cache(name, keep={version})
        return artifact

    def fetch(self, name: str, version: str) -> Path:
        """The cache folder of ``name@version``, downloaded if it is not there yet.

        The files go into a temporary sibling renamed into place once the manifest is
        in, so a cached folder is always a whole download (a replica killed midway
        leaves only a temporary folder, removed at its next download).
        """
        model_dir = self.cache / validate_model_name(name)
        folder = model_dir / version
        manifest_bytes = self._get(self._key(name, version, MANIFEST))
        if manifest_bytes is None:
            raise ArtifactError(f"{self.url}/{name}/{version}: missing manifest")
        # The cached copy is trusted only with the store's own manifest: the checks at load
        # compare the files with the cached manifest, so that manifest must be the real one.
        if (folder / MANIFEST).is_file():
            if (folder / MANIFEST).read_bytes() == manifest_bytes:
                return folder
            shutil.rmtree(folder, ignore_errors=True)
        self._make_private_dir(model_dir)
        self._remove_old_tmp(model_dir)
        tmp = model_dir / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            manifest = _parse_manifest(manifest_bytes, f"{self.url}/{name}/{version}/{MANIFEST}")
            for rel in manifest_paths(manifest):
                target = _inside(tmp, rel)  # a hostile path cannot write outside the folder
                target.parent.mkdir(parents=True, exist_ok=True)
                self._download(self._key(name, version, rel), target)
            (tmp / MANIFEST).write_bytes(manifest_bytes)
            try:
                os.rename(tmp, folder)
            except OSError:
                if not (folder / MANIFEST).is_file():  # not a concurrent download of the same version
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return folder

    def _download(self, key: str, target: Path) -> None:
        try:
            self.client.download_file(self.bucket, key, str(target))
        except Exception as exc:
            if _missing(exc):
                raise ArtifactError(f"s3://{self.bucket}/{key}: listed in the manifest but missing") from None
            raise

    def _make_private_dir(self, path: Path) -> None:
        """Create ``path`` (new folders mode 0700) and refuse a cache folder another user
        owns: the default cache sits in the shared temporary directory, where anyone could
        have created ``ordrec-cache-<uid>`` first."""
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        for part in (path, *path.parents):
            # An explicit --cache-dir (a Kubernetes volume, owned by root) is the operator's
            # choice; what we create below it, and the default in the temp folder, must be ours.
            if part == self.cache_root and not self._default_cache:
                break
            if part.stat().st_uid != os.getuid():
                raise ArtifactError(f"{part}: the cache folder belongs to another user")
            if part == self.cache_root:
                break

    @staticmethod
    def _remove_old_tmp(model_dir: Path) -> None:
        cutoff = time.time() - STALE_SECONDS
        for path in model_dir.glob(f"{_TMP_PREFIX}*"):
            try:
                if path.stat().st_mtime < cutoff:
                    shutil.rmtree(path, ignore_errors=True)
            except FileNotFoundError:
                continue

    def _trim_cache(self, name: str, keep: set[str]) -> None:
        """Keep the newest ``CACHE_KEEP`` cached versions (and ``keep``); delete the rest, and
        (through :meth:`versions`) every copy of a version the store no longer has.

        An older version may still be memory-mapped by the index being replaced: on
        POSIX its pages stay valid after the unlink until the last mapping goes.
        """
        with contextlib.suppress(Exception):  # the store unreachable: trim by age only
            self.versions(name)
        cached = sorted(self._cached_versions(name))
        for version in sorted(set(cached[:-CACHE_KEEP]) - keep):
            shutil.rmtree(self.cache / name / version, ignore_errors=True)


def _parse_manifest(data: bytes, where: str) -> manifest_pb2.Manifest:
    try:
        manifest = json_format.Parse(data.decode("utf-8"), manifest_pb2.Manifest())
    except (UnicodeDecodeError, json_format.ParseError) as exc:
        raise ArtifactError(f"{where}: invalid manifest: {exc}") from None
    if manifest.format != FORMAT:
        raise ArtifactError(f"{where}: format {manifest.format}, this code reads format {FORMAT}")
    return manifest


class _StagingRegistry(Registry):
    """A local registry in a temporary folder that names versions after the store's newest,
    so a version name always sorts after every version already published."""

    def __init__(self, root: str | os.PathLike, newest: str | None):
        super().__init__(root)
        self._newest = newest

    def _next_version(self, folder: Path) -> str:
        now = _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)
        if self._newest:
            newest = _dt.datetime.strptime(self._newest, _VERSION_FMT)
            now = max(now, newest + _dt.timedelta(microseconds=1))
        return now.strftime(_VERSION_FMT)
