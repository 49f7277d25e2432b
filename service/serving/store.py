"""The set of served models and how versions become live.

A request takes one :class:`LoadedModel` reference at its start and uses it
to the end, so it sees one version end to end. Loading, verification and the
smoke query happen off the request path (at start-up, or on the reloader
thread); only then is the reference swapped, by replacing the whole mapping
(an atomic assignment under the GIL, so readers need no lock).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ordrec.service.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from ordrec.service.indices.models import build_index
from ordrec.service.indices.models.base import ModelIndex
from ordrec.service.metrics import Metrics
from ordrec.service.storage.artifact import ArtifactError
from ordrec.service.storage.objectstore import RegistryUnavailable
from ordrec.service.storage.policy import Split
from ordrec.service.storage.registry import Registry

log = logging.getLogger("ordrec.service")


@dataclass(frozen=True)
class LoadedModel:
    name: str
    version: str
    reason: str  # "newest", "pinned", "candidate", or "kept: <why a newer version was refused>"
    index: ModelIndex
    loaded_at: float
    load_seconds: float

    @property
    def kind(self) -> str:
        return self.index.kind

    @property
    def created_at(self) -> str:
        return self.index.artifact.created_at


@dataclass(frozen=True)
class Candidate:
    """A version loaded beside the live one for a share of the users (a split)."""

    model: LoadedModel
    share: float


def user_bucket(model: str, user_id: str) -> float:
    """A user's place in [0, 1) for ``model``'s split: the same in every process and run
    (sha256, not Python's salted ``hash``), and independent between models."""
    digest = hashlib.sha256(f"{model}\x00{user_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _created_timestamp(created_at: str) -> float:
    try:
        return _dt.datetime.fromisoformat(created_at).timestamp()
    except ValueError:
        return 0.0


class ModelStore:
    """Loads live versions from a registry and swaps them in atomically."""

    def __init__(self, registry: Registry, metrics: Metrics, on_change: Callable[[], None] | None = None):
        self.registry = registry
        self.metrics = metrics
        self._models: dict[str, LoadedModel] = {}
        self._candidates: dict[str, Candidate] = {}  # swapped whole, like _models
        self._refused: dict[tuple[str, str], str] = {}  # (name, version) -> error, never retried
        self._lock = threading.Lock()  # serialises loaders, never taken by requests
        self._on_change = on_change

    # ------------------------------------------------------------- requests
    def snapshot(self) -> dict[str, LoadedModel]:
        return self._models

    def resolve(self, name: str, rpc: str) -> LoadedModel:
        """The model a request names, or the only loaded model that answers ``rpc``."""
        models = self._models
        if not name:
            able = [m for m in models.values() if rpc in m.index.rpcs]
            if len(able) == 1:
                return able[0]
            if not able:
                raise Unavailable(f"no loaded model answers {rpc} yet")
            raise InvalidArgument(
                f"several models answer {rpc} ({', '.join(sorted(m.name for m in able))}): name one in 'model'"
            )
        model = models.get(name)
        if model is None:
            loaded = ", ".join(sorted(models)) or "none"
            if self.registry.has_model(name):
                raise Unavailable(f"model {name!r} is in the registry but not loaded yet (loaded: {loaded})")
            raise NotFound(f"no model {name!r} in the registry (loaded: {loaded})")
        if rpc not in model.index.rpcs:
            raise FailedPrecondition(
                f"model {name!r} is a {model.kind} model and does not answer {rpc}"
                f" (it answers {', '.join(sorted(model.index.rpcs))})"
            )
        return model

    def candidate(self, name: str) -> Candidate | None:
        return self._candidates.get(name)

    def for_user(self, model: LoadedModel, user_id: str) -> LoadedModel:
        """The version that answers ``user_id``: the split's candidate for the users whose
        bucket falls below its share, else ``model`` (the live version)."""
        candidate = self._candidates.get(model.name)
        if candidate is None or user_bucket(model.name, user_id) >= candidate.share:
            return model
        return candidate.model

    def loaded_versions(self, name: str) -> set[str]:
        """The versions of ``name`` this process serves (live, and a split's candidate)."""
        return {m.version for m in (self._models.get(name), self._candidate_model(name)) if m}

    def _candidate_model(self, name: str) -> LoadedModel | None:
        candidate = self._candidates.get(name)
        return candidate.model if candidate else None

    # -------------------------------------------------------------- loading
    def refresh(self, names: Iterable[str] | None = None) -> list[str]:
        """Load every model whose live version (or split) differs from the served one; return what changed."""
        changed = []
        with self._lock:
            for name in list(names) if names is not None else self.registry.models():
                live_changed = self._refresh_one(name)
                if self._refresh_candidate(name) or live_changed:
                    changed.append(name)
        if changed and self._on_change:
            self._on_change()
        return changed

    def _refresh_one(self, name: str) -> bool:
        try:
            version, reason = self.registry.live_version(name)
        except ArtifactError as exc:
            log.debug("no live version of %s: %s", name, exc)
            return False
        current = self._models.get(name)
        if current is not None and current.version == version:
            if current.reason != reason:  # pinned <-> newest on the same version
                self._install(
                    name,
                    LoadedModel(
                        name, version, reason, current.index, current.loaded_at, current.load_seconds
                    ),
                )
                return True
            return False
        loaded = self._promoted_candidate(name, version, reason) or self._load(name, version, reason)
        if loaded is None:
            if current is not None and (name, version) in self._refused:
                kept = f"kept: {version} refused ({self._refused[(name, version)][:200]})"
                if current.reason != kept:
                    self._install(
                        name,
                        LoadedModel(
                            name,
                            current.version,
                            kept,
                            current.index,
                            current.loaded_at,
                            current.load_seconds,
                        ),
                    )
            return False
        if current is not None:
            self.metrics.reloads.labels(name).inc()
        self._install(name, loaded)
        return True

    def _promoted_candidate(self, name: str, version: str, reason: str) -> LoadedModel | None:
        """The loaded candidate when it became the live version (a promote): no second load."""
        candidate = self._candidate_model(name)
        if candidate is None or candidate.version != version:
            return None
        return LoadedModel(
            name, version, reason, candidate.index, candidate.loaded_at, candidate.load_seconds
        )

    def _load(self, name: str, version: str, reason: str) -> LoadedModel | None:
        """Load, verify and smoke-test one version; None when it is refused or unreachable."""
        if (name, version) in self._refused:
            return None
        start = time.perf_counter()
        try:
            artifact = self.registry.load(name, version)
            index = build_index(artifact)
        except RegistryUnavailable as exc:
            # Says nothing about the version: try again at the next poll, keep serving meanwhile.
            log.warning("could not fetch %s@%s, retrying at the next poll: %s", name, version, exc)
            return None
        except Exception as exc:  # noqa: BLE001 - any failure refuses the version, the old one stays
            error = f"{type(exc).__name__}: {exc}"
            self._refused[(name, version)] = error
            self.metrics.load_failures.labels(name).inc()
            log.error("refused %s@%s: %s", name, version, error)
            return None
        seconds = time.perf_counter() - start
        log.info("loaded %s@%s (%s, %s) in %.3f s", name, version, index.kind, reason, seconds)
        return LoadedModel(name, version, reason, index, time.time(), seconds)

    def _refresh_candidate(self, name: str) -> bool:
        """Load, keep or drop the split's candidate of ``name``; True when it changed."""
        current = self._candidates.get(name)
        wanted = self._wanted_split(name)
        if wanted is None:
            if current is None:
                return False
            self._set_candidate(name, None)
            return True
        if current is not None and current.model.version == wanted.candidate:
            if current.share == wanted.share:
                return False
            self._set_candidate(name, Candidate(current.model, wanted.share))
            return True
        loaded = self._load(name, wanted.candidate, "candidate")
        if loaded is None:  # refused, or the store unreachable: no split until it loads
            if current is not None:
                self._set_candidate(name, None)
            return current is not None
        self._set_candidate(name, Candidate(loaded, wanted.share))
        return True

    def _wanted_split(self, name: str) -> Split | None:
        """The registry's split of ``name`` when it names a version other than the served one."""
        live = self._models.get(name)
        try:
            split = self.registry.split(name)
        except ArtifactError as exc:
            log.error("ignoring the split of %s: %s", name, exc)
            return None
        if split is None or live is None or split.candidate == live.version:
            return None
        return split

    def _set_candidate(self, name: str, candidate: Candidate | None) -> None:
        candidates = dict(self._candidates)
        if candidate is None:
            candidates.pop(name, None)
            log.info("no split for %s", name)
        else:
            candidates[name] = candidate
            log.info("split %s: %.1f%% of users to %s", name, 100 * candidate.share, candidate.model.version)
        self._candidates = candidates  # the atomic swap
        self._publish_info(name)

    def _install(self, name: str, model: LoadedModel) -> None:
        models = dict(self._models)
        models[name] = model
        self._models = models  # the atomic swap
        m = self.metrics
        self._publish_info(name)
        search = getattr(model.index, "search", "")
        if search:
            m.model_search.labels(name, search).set(1)
        m.model_created.labels(name).set(_created_timestamp(model.created_at))
        m.model_loaded.labels(name).set(model.loaded_at)
        m.load_seconds.labels(name).set(model.load_seconds)
        for space, size in model.index.sizes().items():
            m.index_size.labels(name, space).set(size)
        m.models_loaded.set(len(models))

    def _publish_info(self, name: str) -> None:
        """``ordrec_model_info`` for the served versions of ``name``, and no other version's series."""
        m = self.metrics
        m.forget_model(name)
        for model in (self._models.get(name), self._candidate_model(name)):
            if model is not None:
                m.model_info.labels(name, model.kind, model.version, model.reason.split(":")[0]).set(1)
        m.forget_versions(name, self.loaded_versions(name))

    def refused(self) -> dict[tuple[str, str], str]:
        return dict(self._refused)


class Reloader(threading.Thread):
    """Polls the registry every ``interval`` seconds (None: only when woken) and
    refreshes the store; ``wake()`` checks at once (Redis news, tests)."""

    def __init__(self, store: ModelStore, interval: float | None):
        super().__init__(name="ordrec-reloader", daemon=True)
        self.store, self.interval = store, interval
        self._wake = threading.Event()
        self._stop = threading.Event()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.store.refresh()
            except Exception:  # noqa: BLE001 - the poller must survive anything
                log.exception("registry poll failed")
