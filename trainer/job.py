"""``ordrec-train run JOB.toml``: the trainer as a cron job.

One TOML file names the data sources, the models with their hyperparameters,
the registry, an optional Redis and, per model, a quality gate. For every
model the job

0. replaces the versions naming a forgotten user by redacted copies
   (:mod:`trainer.forgetting`), before anything is published, and again at the
   end of the model's run, whatever its outcome;
1. reads its data source (``trainer.data.readers.read_input``; each source is
   read once per run even when several models use it) and, with an
   ``[events]`` table, merges a ratings model's recorded interactions since its
   checkpoint into it (:mod:`trainer.events`);
2. splits off a seeded held-out part (:func:`trainer.evaluation.holdout.split`);
3. fits the estimator on the rest;
4. scores the held-out part through the *serving* index built from the
   in-memory artifact (``index_class(kind).from_artifact(est.to_artifact())``,
   smoke-tested first), so the gate judges the code that answers queries;
5. compares the gate metric with the live version's stored one (read from its
   ``manifest.json`` only): the new version passes when
   ``new >= live - margin`` (every gate metric is higher-is-better); with no
   live version, or a live version without that metric, it passes;
6. if it passes: by default (``refit = true``) refits on *all* the data and
   publishes that, otherwise publishes the model measured in step 4; the
   held-out metrics are attached as ``holdout_<metric>`` in
   ``artifact.metrics`` together with ``holdout_fraction``, ``holdout_seed``
   and ``holdout_refit``;
7. notifies Redis when configured (:mod:`trainer.notify`).

Why refit by default: a model fit on 80 % of the data is a worse model to
serve. For recommenders its "seen" items (which ``Recommend`` excludes) would
miss the held-out interactions, so it would recommend items the user already
rated; RTF would drop users whose only post was held out; SCORE would lose
the masked attribute values. The held-out figure then measures the training
*procedure* (these hyperparameters on data like this), which is what the gate
compares run to run. ``refit = false`` publishes exactly the measured model
(half the training time), for models where that matters more.

Exit codes (kept by ``trainer.cli``): 0 every model published (or, with
``--dry-run``, would be), 3 at least one rejected by its gate and none failed,
1 a model failed (training diverged, artifact error, ...), the job is already
running (lock held) or it was terminated, 2 the job file is invalid or a data
source could not be read. When several models disagree the worst wins:
1, then 2, then 3, then 0. One model failing does not stop the others.

A crash at any point leaves the registry as it was: ``Registry.publish``
writes into a hidden temporary folder and renames it into place, and the job
writes nothing else into the registry except its lock file, redacted copies
(published the same way, the original deleted only after) and, after a publish,
a model's events checkpoint (each file replaced atomically).
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import logging
import math
import numbers
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ordrec.service.constraints import AT_LEAST_ONE, POSITIVE, Interval, ListOf, Matches, Options, problem
from ordrec.service.indices.ann import calibration_warnings, describe_choice, describe_params, library_of
from ordrec.service.indices.models import kinds
from ordrec.service.storage.artifact import Artifact, ArtifactError
from ordrec.service.storage.names import validate_model_name
from ordrec.service.storage.objectstore import Downloads, S3Registry, is_object_store
from ordrec.service.storage.registry import Registry
from ordrec.service.storage.scale import SCALE_ATTRIBUTE
from ordrec.trainer.data.interactions import LEVELS_ATTRIBUTE, LevelMapping, levels_attribute
from ordrec.trainer.data.types import DataError, RatingScale

EXIT_PUBLISHED, EXIT_FAILED, EXIT_USAGE, EXIT_REJECTED = 0, 1, 2, 3
_JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SOURCE_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DEFAULT_HOLDOUT = 0.2
DEFAULT_REDIS_TIMEOUT = 1.0
DEFAULT_EVENTS_TIMEOUT = 10.0
METRIC_PREFIX = "holdout_"

log = logging.getLogger("ordrec.job")


class JobError(ValueError):
    """An invalid job file: the message names the file and the key."""


class JobLocked(RuntimeError):
    """Another run of the same job holds the lock."""


class Terminated(BaseException):
    """SIGTERM arrived (cron timeout, operator): unwinds so temporary files are removed."""


# ------------------------------------------------------------------ schema
@dataclass
class DataSource:
    name: str
    path: Path
    format: str = "auto"
    skip_bad_lines: bool = False
    rating_scale: RatingScale | None = None  # ratings files only; None: the format's own
    columns: list[str] | str | None = None  # headerless attribute tables: the column names
    feedback: str = "auto"  # ratings files only: explicit, implicit (interactions) or auto
    strength: str | None = None  # implicit ratings files: the strength column
    levels: LevelMapping | None = None  # implicit data: how strengths become levels (None: default)


@dataclass
class Gate:
    metric: str
    margin: float = 0.0
    holdout: float = DEFAULT_HOLDOUT
    seed: int = 0
    # Refuse a recommender whose served top 10 finds fewer held-out liked items than the
    # most-rated items do; false for a version published for its map, not for Recommend.
    popularity_floor: bool = True
    split: str = "random"  # ratings: which of each user's ratings are held out (random, or latest by time)


@dataclass
class ModelJob:
    name: str
    kind: str
    data: str
    params: dict[str, Any]
    gate: Gate | None  # None: publish what a fit on all the data gives (``ordrec-train train``)
    refit: bool = True
    keep: int | None = None
    labels: Path | None = None
    item_attributes: Path | None = None  # published in the version for Recommend's filter
    item_attributes_format: str = "auto"
    cluster: str | None = None  # dcr: fit data-parallel on this Dask cluster (tcp://..., local:N)
    memory_check: bool = True  # false: fit even when its predicted memory exceeds what is left

    @property
    def gate_metric(self) -> str:
        return self.gate.metric if self.gate else ""

    def fit_params(self) -> dict[str, Any]:
        """The flat settings its fit is configured with: the switches a job turns on by default
        (the settings tuner, which keeps the settings the model gives; none for a cluster fit,
        one plain fit), then the model's own."""
        from ordrec.trainer.models.pipeline import job_defaults

        defaults = job_defaults(self.kind) if self.cluster is None else {}
        if defaults.get("tune"):
            defaults["tune_keep"] = sorted(self.params)
            if self.gate is not None:  # validated as the gate measures: random rows or the latest
                defaults["tune_split"] = self.gate.split
        return {**defaults, **self.params}

    def pipeline(self):
        """A fresh, unfitted fit of this model (its estimator, model selection and serving
        choices) from :meth:`fit_params`."""
        from ordrec.trainer.models.pipeline import configure

        return configure(self.kind, self.fit_params())


@dataclass
class EventsSource:
    """``[events]``: recorded interactions read from Redis and merged into every ratings model's data."""

    redis: str
    timeout: float = DEFAULT_EVENTS_TIMEOUT
    page: int = 1000
    on_trimmed: str = "fail"  # or "warn": train without entries trimmed after the checkpoint


@dataclass
class JobConfig:
    path: Path | None  # the job file (None: ``ordrec-train train``'s flags)
    name: str
    registry: Path | str  # a directory, or s3://bucket/prefix
    lock: Path
    redis: str | None = None
    redis_timeout: float = DEFAULT_REDIS_TIMEOUT
    keep: int | None = None
    events: EventsSource | None = None
    data: dict[str, DataSource] = field(default_factory=dict)
    models: list[ModelJob] = field(default_factory=list)
    trained_by: str | None = None  # the versions' "trained_by" attribute (the status page shows it)


_TYPES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "a table",
}


def _describe(value: Any) -> str:
    names = {
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        dict: "a table",
        list: "an array",
    }
    return f"{names.get(type(value), type(value).__name__)} ({value!r})"[:120]


def _resolve(base: Path, text: str) -> Path:
    path = Path(os.path.expanduser(text))
    return path if path.is_absolute() else (base / path)


def _splits() -> tuple[str, ...]:
    """The held-out splits of ratings (imported when a job is checked, not at start-up)."""
    from ordrec.trainer.evaluation.holdout import SPLITS

    return SPLITS


REDIS_URL = Matches(r"^(redis|rediss|unix)://", "a redis://, rediss:// or unix:// URL")


@dataclass(frozen=True)
class Key:
    """One key of a job-file table: its type (None: any), default, and the forms its value may
    take (:mod:`ordrec.service.constraints`; none: any value of the type)."""

    type: type | None
    default: Any = None
    required: bool = False
    allowed: tuple = ()


JOB_KEYS = {
    "name": Key(
        str, required=True, allowed=(Matches(_JOB_NAME_RE.pattern, "1-64 letters, digits, '_', '-', '.'"),)
    ),
    "registry": Key(str, required=True),
    "redis": Key(str, allowed=(REDIS_URL,)),
    "redis_timeout": Key(float, DEFAULT_REDIS_TIMEOUT, allowed=(POSITIVE,)),
    "keep": Key(int, allowed=(AT_LEAST_ONE,)),
    "lock": Key(str),
}
EVENTS_KEYS = {
    "redis": Key(str, required=True, allowed=(REDIS_URL,)),
    "timeout": Key(float, DEFAULT_EVENTS_TIMEOUT, allowed=(POSITIVE,)),
    "page": Key(int, 1000, allowed=(AT_LEAST_ONE,)),
    "on_trimmed": Key(str, "fail", allowed=(Options(str, ("fail", "warn")),)),
}
SOURCE_KEYS = {
    "path": Key(str, required=True),
    "format": Key(str, "auto"),
    "skip_bad_lines": Key(bool, False),
    "rating_scale": Key(str),
    "feedback": Key(str, "auto", allowed=(Options(str, ("auto", "explicit", "implicit")),)),
    "strength": Key(str),
    "levels": Key(str),
    "columns": Key(None, allowed=(str, ListOf(str))),
}
MODEL_KEYS = {
    "name": Key(str, required=True),
    "kind": Key(str, required=True, allowed=(Options(str, kinds.names),)),
    "data": Key(str, required=True),
    "params": Key(dict, {}),
    "gate": Key(dict, {}),
    "refit": Key(bool, True),
    "keep": Key(int, allowed=(AT_LEAST_ONE,)),
    "labels": Key(str),
    "item_attributes": Key(str),
    "cluster": Key(str),
    "memory_check": Key(bool, True),
}
GATE_KEYS = {
    "metric": Key(str),
    "margin": Key(float, 0.0, allowed=(Interval(numbers.Real, 0, None),)),  # how much worse than live passes
    "holdout": Key(float, DEFAULT_HOLDOUT, allowed=(Interval(numbers.Real, 0, 1, closed="neither"),)),
    "seed": Key(int, 0),
    "popularity_floor": Key(bool, True),
    "split": Key(str, "random", allowed=(Options(str, _splits),)),
}
FILE_KEYS = {
    "job": Key(dict, required=True),
    "data": Key(dict, required=True),
    "events": Key(dict),
    "models": Key(None, required=True, allowed=(ListOf(dict, min_length=1),)),
}


class _Checker:
    """Strict checks of TOML tables against a schema; every message names the file and the key."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, message: str) -> JobError:
        return JobError(f"{self.path}: {where}: {message}")

    def keys(self, value: Any, where: str, allowed: Iterable[str], required: Iterable[str] = ()) -> dict:
        """``value`` as a table with only ``allowed`` keys and every ``required`` one."""
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a table, got {_describe(value)}")
        allowed = set(allowed)
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(_join(where, unknown[0]), f"unknown key (allowed: {', '.join(sorted(allowed))})")
        for key in sorted(required):
            if key not in value:
                raise self.fail(_join(where, key), "missing (required)")
        return value

    def table(self, value: Any, where: str, schema: dict[str, Key]) -> dict[str, Any]:
        """Every key of ``schema``: checked value from ``value``, else its default."""
        self.keys(value, where, schema, [k for k, key in schema.items() if key.required])
        return {name: self.value(value, _join(where, name), name, key) for name, key in schema.items()}

    def value(self, table: dict, where: str, name: str, key: Key) -> Any:
        if name not in table:
            return key.default
        value = table[name]
        if key.type is not None:
            value = self._typed(value, where, key.type)
        wrong = problem(value, list(key.allowed)) if key.allowed else None
        if wrong:
            raise self.fail(where, wrong)
        return value

    def _typed(self, value: Any, where: str, kind: type) -> Any:
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is float and is_number:
            value = float(value)
            if not math.isfinite(value):
                raise self.fail(where, f"must be finite, got {value}")
            return value
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(where, f"must be {_TYPES[kind]}, got {_describe(value)}")
        return value


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise JobError(f"{path}: job file not found") from None
    except OSError as exc:
        raise JobError(f"{path}: cannot read the job file: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise JobError(f"{path}: not valid TOML: {exc}") from None


def load_job(path: str | os.PathLike) -> JobConfig:
    """Read and validate a job file; raise :class:`JobError` naming the file and key.

    Relative paths in the file are relative to the file's own folder (cron
    jobs run from an arbitrary working directory).
    """
    path = Path(path)
    c = _Checker(path)
    raw = c.table(_read_toml(path), "", FILE_KEYS)
    base = path.resolve().parent
    config = _job_config(c, path, base, c.table(raw["job"], "job", JOB_KEYS))
    config.data = _data_sources(c, base, raw["data"])
    if raw["events"] is not None:
        config.events = EventsSource(**c.table(raw["events"], "events", EVENTS_KEYS))
    names: set[str] = set()
    for position, table in enumerate(raw["models"], 1):
        model = _model_job(c, base, config, position, table)
        if model.name in names:
            raise c.fail(f"models[{position}] ({model.name!r}).name", "two models share this registry name")
        names.add(model.name)
        config.models.append(model)
    return config


def _job_config(c: _Checker, path: Path, base: Path, job: dict) -> JobConfig:
    registry = job["registry"] if is_object_store(job["registry"]) else _resolve(base, job["registry"])
    lock = _resolve(base, job["lock"]) if job["lock"] else default_lock(registry, job["name"])
    return JobConfig(
        path=path,
        name=job["name"],
        registry=registry,
        lock=lock,
        redis=job["redis"],
        redis_timeout=job["redis_timeout"],
        keep=job["keep"],
        trained_by=f"job {job['name']}",
    )


def default_lock(registry: Path | str, job_name: str) -> Path:
    """The lock file of job ``job_name``: in a local registry's folder; for an object store,
    which takes no flock, a local one (the CronJob's concurrencyPolicy: Forbid keeps runs
    apart across machines)."""
    if is_object_store(registry):
        return Path(tempfile.gettempdir()) / f"ordrec-job-{job_name}.lock"
    return Path(registry) / f".job-{job_name}.lock"


def _data_sources(c: _Checker, base: Path, tables: dict) -> dict[str, DataSource]:
    if not tables:
        raise c.fail("data", "names no data source (add a [data.<name>] table)")
    sources = {}
    for name, table in tables.items():
        where = f"data.{name}"
        if not _SOURCE_NAME_RE.match(name):
            raise c.fail(where, "a data source name is 1-64 letters, digits, '_' or '-'")
        source = c.table(table, where, SOURCE_KEYS)
        sources[name] = DataSource(
            name=name,
            path=_resolve(base, source["path"]),
            format=source["format"],
            skip_bad_lines=source["skip_bad_lines"],
            rating_scale=_rating_scale(c, where, source),
            columns=source["columns"],
            feedback=source["feedback"],
            strength=source["strength"],
            levels=_levels(c, where, source),
        )
    return sources


def _rating_scale(c: _Checker, where: str, source: dict) -> RatingScale | None:
    if source["rating_scale"] is None:
        return None
    if source["format"] in ("triples", "triplets"):
        raise c.fail(f"{where}.rating_scale", f"is for ratings files, not {source['format']}")
    try:
        return RatingScale.parse(source["rating_scale"])
    except ValueError as exc:
        raise c.fail(f"{where}.rating_scale", str(exc)) from None


def _levels(c: _Checker, where: str, source: dict) -> LevelMapping | None:
    """The data table's ``levels = "scheme:count"`` (how implicit strengths become levels)."""
    try:
        return None if source["levels"] is None else LevelMapping.parse(source["levels"])
    except ValueError as exc:
        raise c.fail(f"{where}.levels", str(exc)) from None


def gate_metric(kind_name: str, metric: str | None) -> str:
    """The held-out metric a gate of ``kind_name`` compares (default: the kind's first);
    a ValueError naming the choices when it has no such metric."""
    from ordrec.trainer.evaluation.holdout import METRICS

    kind = kinds.get(kind_name)
    metrics = METRICS[kind.input_shape]
    metric = metric or metrics[0]
    if metric not in metrics:
        raise ValueError(
            f"{metric!r} is not a held-out metric of {kind.name} "
            f"({kind.input_shape} data): choose one of {', '.join(metrics)}"
        )
    return metric


def _model_job(c: _Checker, base: Path, config: JobConfig, position: int, table: Any) -> ModelJob:
    c.keys(table, f"models[{position}]", MODEL_KEYS, [k for k, key in MODEL_KEYS.items() if key.required])
    name = c.value(table, f"models[{position}].name", "name", MODEL_KEYS["name"])
    where = f"models[{position}] ({name!r})"
    try:
        validate_model_name(name)
    except ValueError as exc:
        raise c.fail(f"{where}.name", str(exc)) from None
    model = c.table(table, where, MODEL_KEYS)
    kind = kinds.get(model["kind"])
    if model["cluster"] is not None:
        _check_cluster(c, f"{where}.cluster", kind.name, model["cluster"])
    if model["data"] not in config.data:
        raise c.fail(f"{where}.data", f"no [data.{model['data']}] table (have: {', '.join(config.data)})")
    source = config.data[model["data"]]
    given = {"rating_scale": source.rating_scale, "strength": source.strength, "levels": source.levels}
    given["feedback"] = None if source.feedback == "auto" else source.feedback
    for key, value in given.items():
        if value is not None and kind.input_shape != "ratings":
            raise c.fail(
                f"data.{model['data']}.{key}",
                f"is for ratings data; model {name!r} ({kind.name}) reads {kind.input_shape}",
            )
    from ordrec.trainer.models.pipeline import accepted_params

    estimator = kind.estimator_class()
    params = dict(c.keys(model["params"], f"{where}.params", accepted_params(kind.name)))
    if "verbose" in estimator.param_names():
        params.setdefault("verbose", False)  # progress bars are noise in a cron log
    gate = c.table(model["gate"], f"{where}.gate", GATE_KEYS)
    try:
        metric = gate_metric(kind.name, gate["metric"])
    except ValueError as exc:
        raise c.fail(f"{where}.gate.metric", str(exc)) from None
    if model["labels"] is not None and not kind.is_map:
        raise c.fail(
            f"{where}.labels",
            f"display labels are for map models ({', '.join(kinds.map_names())}), not {kind.name}",
        )
    if model["item_attributes"] is not None and kind.input_shape != "ratings":
        raise c.fail(
            f"{where}.item_attributes",
            f"item attributes are for recommenders (ratings data), not {kind.name}",
        )
    return ModelJob(
        name=name,
        kind=kind.name,
        data=model["data"],
        params=params,
        gate=Gate(
            metric=metric,
            margin=gate["margin"],
            holdout=gate["holdout"],
            seed=gate["seed"],
            popularity_floor=gate["popularity_floor"],
            split=gate["split"],
        ),
        refit=model["refit"],
        keep=config.keep if model["keep"] is None else model["keep"],
        labels=_resolve(base, model["labels"]) if model["labels"] else None,
        item_attributes=_resolve(base, model["item_attributes"]) if model["item_attributes"] else None,
        cluster=model["cluster"],
        memory_check=model["memory_check"],
    )


def _check_cluster(c: _Checker, where: str, kind: str, address: str) -> None:
    """A ``cluster`` key: DCR only, and a well-formed ``local:N``."""
    from ordrec.trainer.models.dcr_distributed import check_cluster

    try:
        check_cluster(kind, address)
    except ValueError as exc:
        raise c.fail(where, str(exc)) from None


# -------------------------------------------------------------------- lock
@contextmanager
def job_lock(path: Path, job_name: str) -> Iterator[None]:
    """Hold an exclusive non-blocking ``flock`` on ``path`` for the block.

    The kernel drops the lock when the process dies however it dies, so a
    killed run never leaves a stale lock. The file itself stays (deleting a
    lock file races with the next run opening it); it holds the holder's pid.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown holder"
        finally:
            os.close(fd)
        raise JobLocked(f"job {job_name!r} is already running ({holder}; lock {path})") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} since {_now()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def lock_failure(path: Path, exc: OSError) -> str:
    """The error line for a lock that could not be taken; a permission error says what to do.

    The usual cause is a container's user (the image's uid 10001) meeting a
    registry folder made on the host by another user.
    """
    text = f"cannot take the lock {path}: {exc}"
    if not isinstance(exc, PermissionError):
        return text
    folder = path.parent
    uid, gid = os.getuid(), os.getgid()
    try:
        stat = folder.stat()
        owner = f"{stat.st_uid}:{stat.st_gid}"
    except OSError:
        owner = "OWNER_UID:OWNER_GID"
    return (
        f"{text}; this job runs as uid {uid} (gid {gid}), which cannot write in {folder} "
        f"(owned by {owner}): run the job as the folder's owner (Docker: "
        f"`docker run --user {owner} ...`), or let uid {uid} write there (`chown -R {uid}:{gid} {folder}`)"
    )


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------- gate
def gate_passes(new: float, live: float | None, margin: float) -> bool:
    """``new >= live - margin`` (higher is better); no live figure passes; NaN never does."""
    if not math.isfinite(new):
        return False
    if live is None or not math.isfinite(live):
        return True
    return new >= live - margin


@dataclass
class LiveFigure:
    version: str | None
    reason: str  # "pinned", "newest", or why there is no comparable figure
    value: float | None = None
    fraction: float | None = None
    seed: float | None = None


def below_popularity(metrics: dict[str, float]) -> str | None:
    """Why a recommender is refused whatever the live version: its served top-10 finds fewer of
    the held-out liked items than the most-rated items do (None when it does not, or when the
    held-out part has no liked item to measure it by)."""
    new, popular = metrics.get("topn_recall_at_10"), metrics.get("popularity_recall_at_10")
    if new is None or popular is None or not (math.isfinite(new) and math.isfinite(popular)):
        return None
    if new >= popular:
        return None
    return f"topn_recall_at_10 {new:.4f} < popularity's {popular:.4f} on the held-out part"


def live_figure(registry: Registry | S3Registry, name: str, metric: str) -> LiveFigure:
    """The live version's stored held-out metric, from its manifest alone (no arrays read)."""
    try:
        version, reason = registry.live_version(name)
    except ArtifactError:
        return LiveFigure(None, "no live version")
    try:
        metrics = registry.manifest(name, version).metrics
    except ArtifactError as exc:
        return LiveFigure(version, f"live manifest unreadable ({exc})")
    key = METRIC_PREFIX + metric
    if key not in metrics:
        return LiveFigure(version, f"live version has no {key} (published outside a job?)")
    return LiveFigure(
        version,
        reason,
        float(metrics[key]),
        metrics.get(METRIC_PREFIX + "fraction"),
        metrics.get(METRIC_PREFIX + "seed"),
    )


# -------------------------------------------------------------------- run
@dataclass
class Outcome:
    model: str
    status: str  # published | rejected | would_publish | failed | data_error
    metric: str = ""
    new: float | None = None
    live: float | None = None
    live_version: str | None = None
    version: str | None = None
    message: str = ""
    seconds: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)  # the published version's

    @property
    def exit_code(self) -> int:
        return {
            "published": EXIT_PUBLISHED,
            "would_publish": EXIT_PUBLISHED,
            "rejected": EXIT_REJECTED,
            "data_error": EXIT_USAGE,
        }.get(self.status, EXIT_FAILED)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


@dataclass
class Fitted:
    """A model ready to publish: its artifact, the data it was fitted on (its fit metrics are
    measured there), its smoke-tested serving index when one was built, and measured metrics."""

    artifact: Artifact
    data: Any
    index: Any = None
    metrics: dict[str, float] = field(default_factory=dict)


def serving_index(kind: str, artifact: Artifact):
    """The index that would serve ``artifact``, built in memory and smoke-tested."""
    index = kinds.get(kind).index_class().from_artifact(artifact)
    index.smoke()
    return index


def holdout_metrics(metrics: dict[str, float], gate: Gate, refit: bool) -> dict[str, float]:
    """The held-out measures as a version stores them (``holdout_*``), with how they were taken."""
    stored = {METRIC_PREFIX + k: float(v) for k, v in metrics.items()}
    stored.update(
        {
            METRIC_PREFIX + "fraction": gate.holdout,
            METRIC_PREFIX + "seed": gate.seed,
            METRIC_PREFIX + "refit": float(refit),
        }
    )
    return stored


def fit_metrics(kind: str, data, artifact: Artifact) -> dict[str, float]:
    """The protocol's measures of the fitted model on its own training data ({} when it has none)."""
    measure = getattr(kinds.get(kind).protocol_module(), "fit_metrics", None)
    return measure(data, artifact) if measure else {}


class JobRunner:
    """Runs a job's models: each read, fitted, measured and gated when it has a gate, and
    published through :meth:`publish`, the one way ``run`` and ``train`` publish."""

    def __init__(self, config: JobConfig, dry_run: bool, registry: Registry | S3Registry):
        self.config = config
        self.dry_run = dry_run
        self.registry = registry
        self._data: dict[tuple[str, str], Any] = {}  # (data source, input shape) -> what was read
        self._redis: Any = None  # the [events] connection, opened on first use

    def say(
        self, model: str | None, message: str, *args, level: int = logging.INFO, exc_info: bool = False
    ) -> None:
        prefix = f"job={self.config.name}" + (f" model={model}" if model else "")
        log.log(level, prefix + " " + message, *args, exc_info=exc_info)

    def read(self, model: ModelJob, shape: str):
        key = (model.data, shape)
        if key not in self._data:
            from ordrec.trainer.data.readers import read_input

            source = self.config.data[model.data]
            t0 = time.perf_counter()
            data = read_input(
                shape,
                source.path,
                source.format,
                skip_bad_lines=source.skip_bad_lines,
                rating_scale=source.rating_scale,
                column_names=source.columns,
                feedback=source.feedback,  # load_job leaves these unset for other shapes
                strength=source.strength,
            )
            skipped = getattr(data, "skipped_lines", 0)
            if skipped:
                self.say(
                    model.name,
                    "skipped %d malformed line(s) of %s",
                    skipped,
                    source.path,
                    level=logging.WARNING,
                )
            data = self.forget(model, data)
            size = len(data) if hasattr(data, "__len__") else len(data.objects)
            self.say(
                model.name,
                "read data=%s path=%s format=%s records=%d skipped_lines=%d feedback=%s seconds=%.1f",
                source.name,
                source.path,
                source.format,
                size,
                skipped,
                getattr(data, "feedback", "-"),
                time.perf_counter() - t0,
            )
            self._data[key] = data
        return self._data[key]

    def forget(self, model: ModelJob, data):
        """``data`` without the registry's FORGOTTEN users, the counts logged."""
        from ordrec.trainer.forgetting import apply_forgotten

        data, dropped, listed = apply_forgotten(data, self.registry)
        self.say(
            model.name,
            "forgotten users=%d rows=%d dropped (FORGOTTEN lists %d)",
            dropped.users,
            dropped.rows,
            listed,
        )
        return data

    def redact_forgotten(self, model: ModelJob) -> None:
        """Replace the model's versions that still name a forgotten user by redacted copies:
        before every run and after it, published or not (a rejected gate must not keep them)."""
        from ordrec.trainer.forgetting import redact_forgotten

        try:
            redacted = redact_forgotten(self.registry, model.name)
        except Exception as exc:  # noqa: BLE001 - the run's outcome stands; the next run retries
            redacted = None
            problem = f"{type(exc).__name__}: {exc}"
        else:
            problem = "; ".join(f"{v}: {why}" for v, why in redacted.failed)
        if redacted is not None and redacted.rewritten:
            self.say(
                model.name,
                "redacted %d version(s) naming forgotten users: %s",
                len(redacted.rewritten),
                " ".join(f"{old}->{copy}" for old, copy in redacted.rewritten),
            )
        if problem:
            self.say(
                model.name,
                "versions naming forgotten users not redacted (the next run tries again): %s",
                problem,
                level=logging.ERROR,
            )

    def scale(self, model: ModelJob) -> RatingScale | None:
        """The rating scale of a ratings model's data (None: any finite number)."""
        from ordrec.trainer.data.readers import ratings_scale

        source = self.config.data[model.data]
        return ratings_scale(source.path, source.format, source.rating_scale)

    def events_feed(self, model: ModelJob, shape: str):
        """The model's recorded interactions since its checkpoint, read; None without ``[events]``."""
        events = self.config.events
        if events is None or shape != "ratings":
            return None
        from ordrec.service.live.redis_state import connect
        from ordrec.trainer.events import EventFeed

        if self._redis is None:
            self._redis = connect(events.redis, events.timeout)
        feed = EventFeed(
            self.registry, model.name, self._redis, events.page, events.on_trimmed, erase=not self.dry_run
        )
        feed.read()
        return feed

    def commit_events(self, model: ModelJob, feed, version: str) -> None:
        from ordrec.trainer.events import EventsError

        try:
            feed.commit()
        except Exception as exc:
            raise EventsError(
                f"version {version} is published but the events checkpoint was not advanced"
                f" (the next run reads the same events again): {type(exc).__name__}: {exc}"
            ) from exc
        self.say(model.name, "events checkpoint advanced to %s", feed.next.last_id or "-")

    def fit(self, model: ModelJob, data):
        """A fresh estimator (with its model selection and serving choices, ``configure``) fitted
        on ``data``: in this process, or on the model's ``cluster`` (nothing is published until
        the fit has completed either way)."""
        pipeline = model.pipeline()
        self.say(model.name, "fit: %s", pipeline.describe())
        if model.cluster is None:
            fitted = pipeline.fit(data, check_memory=model.memory_check)
            note = fitted.fit_note()
            if note:
                self.say(model.name, "%s", note)
            return fitted
        self.say(model.name, "fitting on cluster %s", model.cluster)
        return pipeline.fit_on_cluster(data, model.cluster)

    def run_model(self, model: ModelJob) -> Outcome:
        """Read, fit (measured and judged first when the model has a gate) and publish one model."""
        out = Outcome(model.name, "failed", metric=model.gate_metric)
        data, scale, feed = self.prepare(model)
        measured = None
        if model.gate is not None:
            measured = self.measure(model, model.gate, data, out)
            if measured is None:
                return out
        if self.dry_run:
            out.status = "would_publish"
            return out
        if measured is not None and not model.refit:
            fitted = measured
        else:
            metrics = None if measured is None else measured.metrics
            # The measured model is not published: its fit, artifact, index and split go before
            # the fit on all the data, whose memory check counts none of them.
            del measured
            fitted = self.fit_all(model, data, metrics)
        out.version = self.publish(model, fitted, scale, feed)
        out.status = "published"
        out.metrics = dict(fitted.artifact.metrics)
        return out

    def prepare(self, model: ModelJob):
        """The model's training data (forgotten users dropped, recorded events merged, made
        trainable), the rating scale its ratings were checked against, and its events feed."""
        from ordrec.trainer.data.interactions import DEFAULT_MAPPING, implicit_note, trainable

        shape = kinds.get(model.kind).input_shape
        try:
            data = self.read(model, shape)
            # Implicit data has strengths, not ratings on a scale: recorded values are not checked.
            ratings = shape == "ratings" and not getattr(data, "implicit", False)
            scale = self.scale(model) if ratings else None
        except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            raise DataError(str(self.config.data[model.data].path), None, f"cannot read: {exc}") from None
        feed = self.events_feed(model, shape)
        if feed is not None:
            data = feed.apply(data, scale)
            self.say(model.name, feed.summary())
        levels = self.config.data[model.data].levels
        if levels is None and model.pipeline().chooses_levels and getattr(data, "implicit", False):
            # The tuner chooses the level mapping on validation; the fit's data is levelled by it.
            self.say(model.name, "%s; levels chosen on validation (tune)", implicit_note(data))
            return data, scale, feed
        data, note = trainable(data, levels or DEFAULT_MAPPING)
        if note:
            self.say(model.name, note)
        return data, scale, feed

    def measure(self, model: ModelJob, gate: Gate, data, out: Outcome) -> Fitted | None:
        """Fit on all but a seeded held-out part, score that part through the serving index
        and judge it against the live version; None when it is not to be published (``out``
        says why), else the measured model with its ``holdout_*`` metrics."""
        from ordrec.trainer.evaluation import holdout

        how = (gate.holdout, gate.seed, gate.split)
        train, test = holdout.split(data, *how)
        t0 = time.perf_counter()
        estimator = self.fit(model, train)
        levelled = estimator.fitted_data(train)
        if levelled is not train:  # the same rows, as the chosen model sees them
            train, test = levelled, holdout.split(estimator.fitted_data(data), *how)[1]
        self.say(
            model.name,
            "fit kind=%s part=train holdout=%g seed=%d seconds=%.1f",
            model.kind,
            gate.holdout,
            gate.seed,
            time.perf_counter() - t0,
        )
        artifact = estimator.to_artifact()
        index = serving_index(model.kind, artifact)
        metrics = holdout.evaluate(index, test, gate.seed)
        self.say(
            model.name, "evaluated on held-out part: %s", " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
        )
        out.new = metrics[gate.metric]
        if not self.judge(model, gate, metrics, out):
            return None
        return Fitted(artifact, train, index, holdout_metrics(metrics, gate, model.refit))

    def judge(self, model: ModelJob, gate: Gate, metrics: dict[str, float], out: Outcome) -> bool:
        """Whether the measured model passes its gate; ``out`` gets the live figure and why."""
        if out.new is None or not math.isfinite(out.new):
            out.message = (
                f"{gate.metric} is undefined on the held-out part (too little data for a"
                f" {gate.holdout:g} holdout?)"
            )
            return False
        below = below_popularity(metrics)
        if below and not gate.popularity_floor:
            self.say(
                model.name, "%s (popularity_floor = false: published anyway)", below, level=logging.WARNING
            )
        elif below:
            out.status = "rejected"
            out.message = below
            return False
        live = live_figure(self.registry, model.name, gate.metric)
        out.live, out.live_version = live.value, live.version
        if live.value is not None and (live.fraction != gate.holdout or live.seed != gate.seed):
            self.say(
                model.name,
                "live %s was measured with holdout=%s seed=%s, this run uses %g/%d:"
                " the figures are not strictly comparable",
                live.version,
                live.fraction,
                live.seed,
                gate.holdout,
                gate.seed,
                level=logging.WARNING,
            )
        if live.value is None and live.version is not None:
            self.say(model.name, "gate has nothing to compare with: %s", live.reason, level=logging.WARNING)
        if not gate_passes(out.new, live.value, gate.margin):
            out.status = "rejected"
            out.message = f"{gate.metric} {out.new:.4f} < live {live.value:.4f} - margin {gate.margin:g}"
            return False
        out.message = (
            "no live version"
            if live.version is None
            else f"{gate.metric} {out.new:.4f} >= live {_fmt(live.value)} - margin {gate.margin:g}"
            if live.value is not None
            else live.reason
        )
        return True

    def fit_all(self, model: ModelJob, data, measured_metrics: dict[str, float] | None) -> Fitted:
        """A fit on all the data: what ``train`` publishes, or a job's refit, which keeps the
        measured model's ``holdout_*`` metrics (``measured_metrics``)."""
        t0 = time.perf_counter()
        pipeline = self.fit(model, data)
        data = pipeline.fitted_data(data)
        artifact = pipeline.to_artifact()
        if measured_metrics is None:
            self.say(model.name, "fit kind=%s part=all seconds=%.1f", model.kind, time.perf_counter() - t0)
            return Fitted(artifact, data)
        index = serving_index(model.kind, artifact)
        self.say(model.name, "refit part=all seconds=%.1f", time.perf_counter() - t0)
        return Fitted(artifact, data, index, measured_metrics)

    def publish(self, model: ModelJob, fitted: Fitted, scale: RatingScale | None, feed) -> str:
        """The one way a version reaches the registry, for ``run`` and ``train`` alike: the
        artifact completed (:meth:`complete`), published atomically, then what follows it."""
        artifact = self.complete(model, fitted, scale)
        views = self._report(model, fitted.index) if kinds.get(model.kind).is_map else None
        for name, entry in sorted(artifact.indexes.items()):  # minutes at 10^6 items: say so first
            self.say(model.name, "publishing: building index %r (%s)", name, describe_params(entry.params))
        started = time.perf_counter()
        version = self.registry.publish(model.name, artifact, keep=model.keep, views=views)
        self.say(model.name, "published version %s in %.1f s", version, time.perf_counter() - started)
        for name, entry in sorted(artifact.indexes.items()):
            self.say(
                model.name, "index %r: %s", name, describe_choice(library_of(entry.params), entry.params)
            )
        for warning in calibration_warnings(artifact.indexes):
            self.say(model.name, "version %s: %s", version, warning, level=logging.WARNING)
        if feed is not None:
            self.commit_events(model, feed, version)
        self.after_publish(model, version)
        return version

    def complete(self, model: ModelJob, fitted: Fitted, scale: RatingScale | None) -> Artifact:
        """The artifact with its fit metrics (measured on the data it was fitted on), measured
        metrics, provenance, rating scale and item attributes."""
        artifact = fitted.artifact
        for metric, value in fit_metrics(model.kind, fitted.data, artifact).items():
            artifact.metrics.setdefault(metric, value)
        artifact.metrics.update(fitted.metrics)
        if self.config.trained_by:
            artifact.attributes["trained_by"] = self.config.trained_by  # the status page shows it
        if scale is not None:
            artifact.attributes[SCALE_ATTRIBUTE] = scale.as_attribute()  # checks recorded values
        levels = levels_attribute(fitted.data)
        if levels is not None:
            artifact.attributes[LEVELS_ATTRIBUTE] = levels  # how strengths became the fitted levels
        if model.item_attributes:
            from ordrec.service.indices.item_attributes import attach_item_attributes

            attach_item_attributes(artifact, model.item_attributes, model.item_attributes_format)
        return artifact

    def after_publish(self, model: ModelJob, version: str) -> None:
        """Warn when a pin keeps the new version from serving; notify the servers (``redis``)."""
        pinned = self.registry.pinned(model.name)
        if pinned:
            self.say(
                model.name,
                "is pinned to %s: version %s is stored but not served until unpinned",
                pinned,
                version,
                level=logging.WARNING,
            )
        if self.config.redis:
            from ordrec.trainer.notify import notify_published

            notify_published(self.config.redis, model.name, version, self.config.redis_timeout, log)

    def _report(self, model: ModelJob, index) -> Callable[[Artifact], dict[str, bytes]]:
        """The map report (``report.html``) published in the version's own atomic rename.

        A report that cannot be drawn is logged and left out: it is a view for
        people and must not keep a model that passed its gate from serving.
        """

        def views(artifact: Artifact) -> dict[str, bytes]:
            try:
                from ordrec.trainer.report_html import read_labels, report_views

                labels = read_labels(model.labels) if model.labels else None
                return report_views(artifact, labels, index=index)
            except Exception as exc:  # noqa: BLE001 - see the docstring
                self.say(
                    model.name, "map report left out: %s: %s", type(exc).__name__, exc, level=logging.WARNING
                )
                return {}

        return views

    def run_redacted(self, model: ModelJob) -> Outcome:
        """:meth:`run_model` between two redactions of the model's versions naming forgotten
        users: before (no replica loads a new version beside them) and after, whatever the
        outcome (a user forgotten during the run may be in its version)."""
        if not self.dry_run:
            self.redact_forgotten(model)
        try:
            return self.run_model(model)
        finally:
            if not self.dry_run:
                self.redact_forgotten(model)

    def run(self, only: list[str] | None = None) -> list[Outcome]:
        outcomes = []
        for model in self.config.models:
            if only and model.name not in only:
                continue
            t0 = time.perf_counter()
            self.say(model.name, "start kind=%s data=%s", model.kind, model.data)
            try:
                out = self.run_redacted(model)
            except DataError as exc:
                out = Outcome(model.name, "data_error", metric=model.gate_metric, message=str(exc))
            except Exception as exc:  # one model's failure must not stop the others
                # Expected failures have messages an operator can act on; anything else is a
                # bug and its traceback belongs in the cron log.
                expected = isinstance(
                    exc, (FloatingPointError, ArtifactError, ValueError, OSError, MemoryError)
                )
                self.say(
                    model.name,
                    "failed: %s: %s",
                    type(exc).__name__,
                    exc,
                    level=logging.ERROR,
                    exc_info=not expected,
                )
                out = Outcome(
                    model.name, "failed", metric=model.gate_metric, message=f"{type(exc).__name__}: {exc}"
                )
            out.seconds = time.perf_counter() - t0
            level = logging.INFO if out.exit_code in (EXIT_PUBLISHED, EXIT_REJECTED) else logging.ERROR
            self.say(
                model.name,
                "result=%s metric=%s new=%s live=%s live_version=%s version=%s margin=%g seconds=%.1f (%s)",
                out.status,
                out.metric,
                _fmt(out.new),
                _fmt(out.live),
                out.live_version or "-",
                out.version or "-",
                model.gate.margin if model.gate else 0.0,
                out.seconds,
                out.message or "ok",
                level=level,
            )
            outcomes.append(out)
        return outcomes


def exit_code(outcomes: list[Outcome]) -> int:
    """The worst outcome: failed (1), then data error (2), then rejected (3), else published (0)."""
    codes = {o.exit_code for o in outcomes}
    for code in (EXIT_FAILED, EXIT_USAGE, EXIT_REJECTED):
        if code in codes:
            return code
    return EXIT_PUBLISHED


def _install_log_handler() -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter("%(asctime)s ordrec-job %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%SZ")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if os.environ.get("ORDREC_JOB_DEBUG") else logging.INFO)
    log.propagate = False
    return handler


def _on_sigterm(signum, frame):
    raise Terminated()


def run_job(
    path: str | os.PathLike,
    dry_run: bool = False,
    only: list[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> int:
    """Run the job file ``path``; return the exit code (see the module docstring).

    ``dry_run`` trains, evaluates and gates but never publishes or notifies.
    ``only`` restricts the run to those model names. ``cache_dir``: where an ``s3://``
    registry's versions are downloaded (into a temporary folder removed when the run
    ends: :class:`~ordrec.service.storage.objectstore.Downloads`).
    """
    handler = _install_log_handler()
    previous = None
    try:
        try:
            config = load_job(path)
        except JobError as exc:
            log.error("%s", exc)
            return EXIT_USAGE
        unknown = sorted(set(only or []) - {m.name for m in config.models})
        if unknown:
            log.error("%s: no model named %s in the job", path, ", ".join(unknown))
            return EXIT_USAGE
        if threading_is_main():
            previous = signal.signal(signal.SIGTERM, _on_sigterm)
        t0 = time.perf_counter()
        log.info(
            "job=%s start file=%s registry=%s models=%d%s",
            config.name,
            config.path,
            config.registry,
            len(config.models),
            " dry_run=true" if dry_run else "",
        )
        try:
            with job_lock(config.lock, config.name), Downloads(cache_dir) as downloads:
                outcomes = JobRunner(config, dry_run, downloads.open_registry(config.registry)).run(only)
        except (JobLocked, ArtifactError) as exc:  # the lock held, or no download folder
            log.error("job=%s %s", config.name, exc)
            return EXIT_FAILED
        except OSError as exc:  # models catch their own errors: this is the lock file itself
            log.error("job=%s %s", config.name, lock_failure(config.lock, exc))
            return EXIT_FAILED
        except (Terminated, KeyboardInterrupt) as exc:
            what = "SIGTERM" if isinstance(exc, Terminated) else "an interrupt"
            log.error("job=%s terminated by %s; the registry keeps only complete versions", config.name, what)
            return EXIT_FAILED
        code = exit_code(outcomes)
        counts = {
            s: sum(o.status == s for o in outcomes)
            for s in ("published", "would_publish", "rejected", "failed", "data_error")
        }
        log.info(
            "job=%s done exit=%d %s seconds=%.1f",
            config.name,
            code,
            " ".join(f"{k}={v}" for k, v in counts.items() if v or k in ("published", "rejected")),
            time.perf_counter() - t0,
        )
        return code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        log.removeHandler(handler)


def train_model(config: JobConfig, model: ModelJob, downloads: Downloads) -> Outcome:
    """``ordrec-train train``: one model of ``config`` run as a job's model is, under the job's
    lock (one ``train`` of a model at a time), its log on stderr. Its errors are raised, for
    the CLI to turn into its exit codes; a held lock is a failed outcome, as in :func:`run_job`."""
    handler = _install_log_handler()
    try:
        with job_lock(config.lock, config.name):
            return JobRunner(config, False, downloads.open_registry(config.registry)).run_redacted(model)
    except JobLocked as exc:
        log.error("job=%s %s", config.name, exc)
        return Outcome(model.name, "failed", metric=model.gate_metric, message=str(exc))
    finally:
        log.removeHandler(handler)


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
