"""``ordrec-train``: train, evaluate, publish and manage model versions.

Subcommands::

    ordrec-train train KIND --data PATH [--format F] [--rating-scale S] --registry DIR [--name NAME] [--set k=v ...]
                       [--feedback auto|explicit|implicit] [--strength COLUMN]   (interactions: clicks, plays)
                       [--cluster tcp://HOST:8786 | local:N]   (dcr: fit data-parallel on Dask)
                       [--no-memory-check]   fit even when its predicted memory exceeds what is left
                       [--gate [METRIC]]   a one-model job: same publishing as ``run``, gate off unless asked
    ordrec-train reproduce KIND --data PATH [--format F] --runs R [--seed S] [--json OUT] ...
    ordrec-train sample --out DIR          write the built-in generated sample data sets
    ordrec-train registry versions --registry DIR [--model NAME]
    ordrec-train registry pin --registry DIR --model NAME --version V
    ordrec-train registry unpin --registry DIR --model NAME
    ordrec-train registry split MODEL --registry DIR --candidate V --share S   (or --off)
    ordrec-train registry promote MODEL --registry DIR   the split's candidate becomes the (pinned) live version
    ordrec-train registry hide|unhide|hidden --registry DIR [--redis URL] [--model NAME] [ITEM ...]
    ordrec-train registry prune --registry DIR --model NAME --keep K
    ordrec-train registry gc --registry DIR
    ordrec-train registry forget --registry DIR --user ID [--redis URL] [--reason TEXT]   erase a user everywhere
    ordrec-train registry rekey-forgotten --registry DIR --users FILE [--redis URL]   key a list from before the key
    ordrec-train run JOB.toml              a cron job: train, evaluate, gate, publish
    ordrec-train report --registry DIR --model NAME
    ordrec-train events export --redis URL --out FILE [--since ID] [--format csv|jsonl]
    ordrec-train export MODEL --registry DIR --n N --out FILE.parquet|csv|jsonl [--users FILE] [--version V]

Registry administration is the ``registry`` group; its commands' old spellings
without ``registry`` (``ordrec-train pin ...``) still work for one release and say so on stderr.

Every --registry takes a directory or ``s3://bucket/prefix`` (``pip install ordrec[s3]``;
credentials and endpoint from the standard AWS environment and config).

Exit codes: 0 success (for ``run``: published), 1 failure, 2 usage or data
error, 3 (``run``, ``train --gate``) rejected by the quality gate.
"""

from __future__ import annotations

import argparse
import logging
import numbers
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from google.protobuf.json_format import MessageToDict

from ordrec.service.constraints import AT_LEAST_ONE_FLAG, SECONDS_FLAG, Interval, flag
from ordrec.service.indices.ann import describe_choice
from ordrec.service.indices.models import kinds
from ordrec.service.storage.artifact import ArtifactError
from ordrec.service.storage.objectstore import Downloads  # opens a directory, or s3://bucket/prefix
from ordrec.service.storage.registry import Registry as LocalRegistry
from ordrec.trainer.data.interactions import LevelMapping
from ordrec.trainer.data.types import DataError, RatingScale
from ordrec.trainer.models.tuning import describe_tuning
from ordrec.trainer.reproduce.params import parse_assignments

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REJECTED = 0, 1, 2, 3
# Modules of pyproject's `train` extra: a serving-only install lacks them.
TRAIN_EXTRA_MODULES = ("sklearn", "tqdm", "tomli")

log = logging.getLogger("ordrec.trainer")


# ----------------------------------------------------------------- helpers
def rating_scale_argument(text: str) -> RatingScale:
    """``--rating-scale`` as a :class:`RatingScale`; a bad one is a usage error naming the rule."""
    try:
        return RatingScale.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_data_arguments(parser: argparse.ArgumentParser, required: bool = True, ratings: bool = True) -> None:
    """``--data``, ``--format``, ``--skip-bad-lines`` and, when the command may read ratings, ``--rating-scale``."""
    parser.add_argument("--data", required=required, help="input file (or folder for some formats)")
    parser.add_argument(
        "--format",
        default="auto",
        help="input format: ml-100k, ml-1m, ml-10m, csv, tsv, lastfm-tags, zoo, neighbors, "
        "triples ... (default: detect from the file)",
    )
    parser.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="skip malformed lines instead of failing (their number is reported)",
    )
    parser.add_argument(
        "--columns",
        metavar="A,B,...",
        help="attribute tables without a header or id column: the column names (ids are line numbers)",
    )
    if ratings:
        parser.add_argument(
            "--rating-scale",
            type=rating_scale_argument,
            metavar="LOW..HIGH[:STEP]",
            help="ratings allowed, e.g. 1..5 or 0.5..5:0.5 (default: the format's own; "
            "ml-100k/ml-1m 1..5, ml-10m 0.5..5:0.5, csv/tsv any finite number)",
        )


def add_feedback_arguments(parser: argparse.ArgumentParser) -> None:
    """``--feedback`` and ``--strength``: read a ratings file as interactions (clicks, plays)."""
    parser.add_argument(
        "--feedback",
        choices=("auto", "explicit", "implicit"),
        default="auto",
        help="explicit: star ratings; implicit: interactions (clicks, plays, purchases), a repeated"
        " (user, item) adding up; auto (default): implicit when the header names no rating column"
        " but a strength column (plays, count, quantity, weight ...) or only user, item, timestamp",
    )
    parser.add_argument(
        "--strength",
        metavar="COLUMN",
        help="implicit feedback: the column holding each interaction's strength (a count such as"
        " plays, or a duration), summed over repeats (default: a column so named, else 1 a record)",
    )
    parser.add_argument(
        "--levels",
        type=level_mapping,
        metavar="SCHEME[:N]",
        help="implicit feedback: how strengths become the N ordinal levels the models fit: quantile"
        " (per user), log (1 + floor(log2 strength)) or repeat (once < repeatedly); default quantile:5"
        " (reproduce topn: chosen on validation)",
    )


def level_mapping(text: str) -> LevelMapping:
    """``--levels`` as a :class:`LevelMapping` (a usage error naming the choices otherwise)."""
    try:
        return LevelMapping.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ----------------------------------------------------------------- commands
def add_cache_dir_argument(parser: argparse.ArgumentParser) -> None:
    """``--cache-dir``: where a command downloads an ``s3://`` registry's versions."""
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="s3:// registry: download versions into a temporary folder in DIR, removed when the"
        " command ends (default: the system's temporary folder)",
    )


def cmd_train(args: argparse.Namespace) -> int:
    """One model fitted on ``--data`` and published, through the same path as a job's model."""
    from ordrec.trainer.job import train_model

    config = train_job(args)
    (model,) = config.models
    out = train_model(config, model, args.downloads)
    if out.status != "published":
        print(f"ordrec-train: {model.name} not published: {out.message}", file=sys.stderr)
        return out.exit_code
    print(f"published {model.name}@{out.version} to {args.registry}")
    print(format_metrics(out.metrics, "  "))
    return EXIT_OK


def train_job(args: argparse.Namespace):
    """``train``'s flags as a one-model job (a ``JobConfig``): no gate unless ``--gate``, so the
    model is fitted on all the data and published; its own lock, ``.job-train-<name>.lock``."""
    from ordrec.service.storage.names import validate_model_name
    from ordrec.service.storage.objectstore import is_object_store
    from ordrec.trainer.job import DataSource, Gate, JobConfig, ModelJob, default_lock, gate_metric

    kind = kinds.get(args.kind)
    if args.cluster:
        from ordrec.trainer.models.dcr_distributed import check_cluster

        check_cluster(args.kind, args.cluster)  # before the data is read
    if args.labels and not kind.is_map:
        raise ValueError(f"--labels is for map models ({', '.join(kinds.map_names())}), not {args.kind}")
    for option, path in (("--labels", args.labels), ("--item-attributes", args.item_attributes)):
        if path and not Path(path).is_file():  # before the fit, not after it
            raise FileNotFoundError(f"{option}: no such file: {path}")
    name = validate_model_name(args.name or args.kind)
    params = parse_assignments(args.set or [])
    params.setdefault("random_state", args.seed)
    if "verbose" in kind.estimator_class().param_names():
        # One model fitted while someone waits: its epochs show (a bar on a terminal, plain lines
        # every few seconds elsewhere); a job's config keeps them off unless it sets verbose.
        params.setdefault("verbose", True)
    source = DataSource(
        name="train",
        path=Path(args.data),
        format=args.format,
        skip_bad_lines=args.skip_bad_lines,
        rating_scale=args.rating_scale,
        columns=args.columns,
        feedback=args.feedback,
        strength=args.strength,
        levels=args.levels,
    )
    model = ModelJob(
        name=name,
        kind=kind.name,
        data=source.name,
        params=params,
        gate=None if args.gate is None else Gate(gate_metric(kind.name, args.gate)),
        keep=args.keep,
        labels=Path(args.labels) if args.labels else None,
        item_attributes=Path(args.item_attributes) if args.item_attributes else None,
        item_attributes_format=args.item_attributes_format,
        cluster=args.cluster,
        memory_check=not args.no_memory_check,
    )
    registry = args.registry if is_object_store(args.registry) else Path(args.registry)
    job_name = f"train-{name}"
    return JobConfig(
        path=None,
        name=job_name,
        registry=registry,
        lock=default_lock(registry, job_name),
        data={source.name: source},
        models=[model],
    )


def format_metrics(metrics: dict[str, float], indent: str = "") -> str:
    """``name=value`` pairs, sorted by name, four significant digits; "no metrics" when empty."""
    return indent + (" ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())) or "no metrics")


def cmd_reproduce(args: argparse.Namespace) -> int:
    from ordrec.trainer.reproduce.report import write_json

    rows = protocol_module(args.kind).run(args)
    if args.json:
        write_json(rows, args.json)
        print(f"wrote {len(rows)} rows to {args.json}")
    return EXIT_OK


def cmd_sample(args: argparse.Namespace) -> int:
    from ordrec.trainer.sample import write_samples

    for path in write_samples(args.out, seed=args.seed):
        print(path)
    return EXIT_OK


def _version_metrics(registry, name: str, version: str) -> str:
    try:  # the manifest only: listing does not verify every array
        manifest = registry.manifest(name, version)
    except ArtifactError as exc:
        return f"unreadable manifest: {exc}"
    indexes = [
        f"index {entry.name}: {describe_choice(entry.library, MessageToDict(entry.params))}"
        for entry in manifest.indexes
    ]
    tuned = MessageToDict(manifest.hyperparameters).get("tuning")
    choice = [describe_tuning(tuned)] if tuned else []  # what the settings tuner chose
    return "\t".join([format_metrics(dict(manifest.metrics)), *indexes, *choice])


def cmd_versions(args: argparse.Namespace) -> int:
    registry = args.downloads.open_registry(args.registry)
    for name in [args.model] if args.model else registry.models():
        pinned = registry.pinned(name)
        split = registry.split(name)
        try:
            live, reason = registry.live_version(name)
        except ArtifactError:
            live, reason = None, ""
        for version in registry.versions(name):
            marks = [
                m
                for m, on in (
                    ("live:" + reason, version == live),
                    ("pinned", version == pinned),
                    (
                        f"candidate:{split.share:g}" if split else "",
                        bool(split) and version == split.candidate,
                    ),
                )
                if on
            ]
            print(f"{name}\t{version}\t{' '.join(marks)}\t{_version_metrics(registry, name, version)}")
    return EXIT_OK


def cmd_pin(args: argparse.Namespace) -> int:
    args.downloads.open_registry(args.registry).pin(args.model, args.version)
    print(f"pinned {args.model} to {args.version}")
    return EXIT_OK


def cmd_unpin(args: argparse.Namespace) -> int:
    args.downloads.open_registry(args.registry).unpin(args.model)
    print(f"unpinned {args.model}: the newest version is live")
    return EXIT_OK


def cmd_split(args: argparse.Namespace) -> int:
    registry = args.downloads.open_registry(args.registry)
    if args.off:
        registry.clear_split(args.model)
        print(f"no split for {args.model}: every user gets the live version")
        return EXIT_OK
    if not args.candidate or args.share is None:
        raise ValueError("split needs --candidate V and --share S (or --off)")
    split = registry.set_split(args.model, args.candidate, args.share)
    live, reason = registry.live_version(args.model)
    print(
        f"split {args.model}: {split.share:.1%} of users to {split.candidate}, the rest to {live} ({reason})"
    )
    if reason != "pinned":
        print(
            f"warning: {args.model} is not pinned, so the next publish replaces {live} as the live"
            f" side of the split; pin it to keep the comparison: ordrec-train pin --model {args.model}"
            f" --version {live}",
            file=sys.stderr,
        )
    return EXIT_OK


def cmd_promote(args: argparse.Namespace) -> int:
    version = args.downloads.open_registry(args.registry).promote(args.model)
    print(f"promoted {args.model}@{version}: pinned and live for every user (unpin to follow new versions)")
    return EXIT_OK


def _hidden_backends(args: argparse.Namespace):
    """Where hidden items live: Redis (mirrored to the registry) when given, else the registry."""
    from ordrec.service.live.hidden import RedisBackend, RegistryBackend
    from ordrec.service.live.redis_state import connect

    files = RegistryBackend(args.downloads.open_registry(args.registry))
    if args.redis:
        return RedisBackend(connect(args.redis, 5.0)), files
    return files, None


def _hidden_scope(args: argparse.Namespace) -> str:
    from ordrec.service.storage.hidden_items import ALL_MODELS
    from ordrec.service.storage.names import validate_model_name

    return ALL_MODELS if args.model in (None, "", ALL_MODELS) else validate_model_name(args.model)


def cmd_hide(args: argparse.Namespace) -> int:
    from ordrec.service.live.hidden import apply_change
    from ordrec.service.storage.idmap import has_control

    ids = list(args.item_ids)
    if args.file:
        ids += [
            line.strip() for line in Path(args.file).read_text(encoding="utf-8").splitlines() if line.strip()
        ]
    if not ids:
        raise ValueError("no item ids given (arguments or --file)")
    bad = next((i for i in ids if has_control(i)), None)
    if bad is not None:  # a HIDDEN file holds ids one a line, as artifacts do
        raise ValueError(f"item id {bad[:80]!r} holds a line break or another control character")
    import redis

    scope = _hidden_scope(args)
    backend, mirror = _hidden_backends(args)
    hide = args.hide
    from ordrec.service.errors import ServiceError

    try:
        changed = apply_change(backend, scope, ids, hide)
    except redis.RedisError as exc:
        print(f"ordrec-train: Redis is unreachable, nothing changed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ServiceError as exc:
        print(f"ordrec-train: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if mirror is not None:  # the copy a replica reads when Redis is down at its start-up
        apply_change(mirror, scope, ids, hide)
    print(
        f"{'hid' if hide else 'unhid'} {changed} of {len(ids)} item(s) for"
        f" {'all models' if scope == '*' else scope}"
    )
    return EXIT_OK


def cmd_hidden(args: argparse.Namespace) -> int:
    backend, _ = _hidden_backends(args)
    for scope, ids in sorted(backend.read().items()):
        if args.model in (None, "") or scope in ("*", args.model):
            print(f"{scope}\t{len(ids)}\t{' '.join(sorted(ids)[: args.show])}")
    return EXIT_OK


def cmd_prune(args: argparse.Namespace) -> int:
    for version in args.downloads.open_registry(args.registry).prune(args.model, args.keep):
        print(f"removed {args.model}@{version}")
    return EXIT_OK


def cmd_gc(args: argparse.Namespace) -> int:
    for path in args.downloads.open_registry(args.registry).gc():
        print(f"removed {path}")
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from ordrec.trainer.job import run_job

    return run_job(args.job, dry_run=args.dry_run, only=args.only, cache_dir=args.cache_dir)


def cmd_events_export(args: argparse.Namespace) -> int:
    import redis

    from ordrec.service.live.redis_state import connect
    from ordrec.trainer.events import export

    try:
        count, last = export(connect(args.redis, args.timeout), args.out, args.since, args.format)
    except redis.RedisError as exc:
        print(f"ordrec-train: error: cannot read the events from {args.redis}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {count} events to {args.out}; last id {last or '-'} (pass it as --since next time)")
    return EXIT_OK


def cmd_forget(args: argparse.Namespace) -> int:
    """Erase a user everywhere (``service/live/erasure.py``); prints what went, never the id again."""
    import redis

    from ordrec.service.live.erasure import erase_user
    from ordrec.service.live.redis_state import connect

    user = args.user.strip()
    if not user or "\n" in user:
        raise ValueError("--user: give one user id (not empty, no line breaks)")
    try:
        client = connect(args.redis, 10.0) if args.redis else None
        report = erase_user(user, args.downloads.open_registry(args.registry), client, redact=True)
    except redis.RedisError as exc:
        print(
            f"ordrec-train: Redis is unreachable, erasure incomplete (run it again): {exc}", file=sys.stderr
        )
        return EXIT_FAILED
    log.info("forgot user digest=%s reason=%r", report.user_digest, args.reason or "")
    print(format_erasure(report, redis_given=bool(args.redis)))
    if report.versions_pending:  # a version still names the user: the erasure is not finished
        print("ordrec-train: some versions were not redacted: run the erasure again", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_rekey_forgotten(args: argparse.Namespace) -> int:
    """Key the bare sha256 entries of the ids in ``--users`` (``service/live/forgotten.py``)."""
    from ordrec.service.live.forgotten import rekey, writers
    from ordrec.service.live.redis_state import connect

    text = sys.stdin.read() if args.users == "-" else Path(args.users).read_text(encoding="utf-8")
    client = connect(args.redis, 10.0) if args.redis else None
    replaced, left = rekey(*writers(args.downloads.open_registry(args.registry), client), text.splitlines())
    print(f"keyed {replaced} bare sha256 entr{'y' if replaced == 1 else 'ies'}; {left} left (ids not given)")
    return EXIT_OK


def format_erasure(report, redis_given: bool) -> str:
    """The erasure's counts as lines for a terminal or a ticket."""
    lines = [
        f"forgot user digest={report.user_digest}"
        + (" (already on the FORGOTTEN list)" if report.already_forgotten else ""),
        f"  redis: seen items {report.seen_items}, ratings {report.ratings}, online keys {report.served_keys},"
        f" stream entries {report.stream_entries}"
        if redis_given
        else "  redis: not given (--redis URL)",
        f"  registry: checkpoint events {report.checkpoint_events}, versions removed {len(report.versions_removed)},"
        f" redacted {len(report.versions_redacted)}"
        + "".join(f"\n    removed {v}" for v in report.versions_removed)
        + "".join(f"\n    redacted {v}" for v in report.versions_redacted),
    ]
    lines += [
        f"  pending (not redacted; the next training run tries again): {v}" for v in report.versions_pending
    ]
    if report.redis_rewrite:
        lines.append(f"  redis files: {report.redis_rewrite}")
    return "\n".join(lines)


def cmd_export(args: argparse.Namespace) -> int:
    """Top-N of every (or every listed) user from one version, to a file (``trainer/export.py``)."""
    from ordrec.trainer.export import export, export_format, read_users

    export_format(args.out)  # a bad extension fails before any work
    if args.n < 1:
        raise ValueError(f"--n must be at least 1, got {args.n}")
    users = read_users(args.users) if args.users else None
    hidden, redis_client = None, None
    if args.redis:
        from ordrec.service.live.hidden import RedisBackend
        from ordrec.service.live.redis_state import connect

        redis_client = connect(args.redis, 10.0)
        hidden = RedisBackend(redis_client)
    registry = args.downloads.open_registry(args.registry)
    if args.workers < 1 or args.batch < 1:
        raise ValueError("--workers and --batch must be at least 1")
    summary = export(
        registry,
        args.model,
        args.n,
        args.out,
        users,
        args.version,
        hidden,
        args.batch,
        workers=args.workers,
        redis_client=redis_client,
    )
    print(
        f"wrote {summary.rows} recommendations for {summary.users} users to {args.out}"
        f" ({summary.fallbacks} fallback, {summary.forgotten} forgotten left out)"
    )
    if summary.seen_degraded:
        print(
            "warning: Redis could not be read: items recorded since training were not excluded",
            file=sys.stderr,
        )
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from ordrec.trainer.report_html import write_report

    registry = args.downloads.open_registry(args.registry)
    if not isinstance(registry, LocalRegistry):
        # Versions in an object store are immutable once their manifest is up; a new
        # report comes with the next publish (the job draws it for map models).
        raise ValueError(
            "report redraws a version in a local registry only; "
            "an s3:// version gets its report when it is published"
        )
    print(write_report(registry, args.model, args.version, labels_path=args.labels))
    return EXIT_OK


# ------------------------------------------------------------------ parser


# Protocols over several kinds (``reproduce NAME``): module and summary.
PROTOCOLS = {
    "topn": (
        "ordrec.trainer.reproduce.topn",
        "every recommender's full-catalogue top-N (recall, NDCG, coverage) beside popularity and EASE",
    ),
}


def protocol_module(name: str):
    """The module of ``reproduce NAME``: a kind's paper protocol, or one of ``PROTOCOLS``."""
    return kinds.resolve(PROTOCOLS[name][0]) if name in PROTOCOLS else kinds.get(name).protocol_module()


def protocol_summary(name: str) -> str:
    return PROTOCOLS[name][1] if name in PROTOCOLS else kinds.get(name).summary


def add_protocol_arguments(p: argparse.ArgumentParser, module, kind: str) -> None:
    ratings = kind in PROTOCOLS or kinds.get(kind).input_shape == "ratings"
    p.allow_abbrev = False  # a retired flag (--rank) must not pass as the prefix of another (--rank-grid)
    add_data_arguments(p, required=getattr(module, "DATA_REQUIRED", True), ratings=ratings)
    p.add_argument("--runs", type=AT_LEAST_ONE_FLAG, default=getattr(module, "DEFAULT_RUNS", 5))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the result rows to this JSON file")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    if getattr(module, "READS_INTERACTIONS", False):
        add_feedback_arguments(p)
    module.add_arguments(p)
    p.set_defaults(func=cmd_reproduce)


def _reproduce_kind(argv: Sequence[str]) -> str | None:
    """The KIND of ``reproduce KIND ...`` in argv, if that is the command."""
    words = [a for a in argv if not a.startswith("-")]
    known = (*kinds.names(), *PROTOCOLS)
    return words[1] if len(words) >= 2 and words[0] == "reproduce" and words[1] in known else None


def build_parser(reproduce_kind: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ordrec-train", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="fit one model on a data file and publish it")
    train.add_argument("kind", choices=kinds.names())
    add_data_arguments(train)
    add_feedback_arguments(train)
    train.add_argument("--registry", required=True)
    add_cache_dir_argument(train)
    train.add_argument("--name", help="model name in the registry (default: the kind)")
    train.add_argument("--set", action="append", metavar="KEY=VALUE", help="a hyperparameter")
    train.add_argument(
        "--seed", type=int, default=0, help="the estimator's random_state (unless --set random_state=...)"
    )
    train.add_argument(
        "--keep", type=AT_LEAST_ONE_FLAG, default=None, help="retain only the newest K versions"
    )
    train.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="dcr only: fit data-parallel on a Dask cluster, a scheduler address (tcp://host:8786)"
        " or local:N (N single-threaded worker processes here); pip install 'ordrec[distributed]'",
    )
    train.add_argument(
        "--no-memory-check",
        action="store_true",
        help="fit even when the fit's predicted memory exceeds what this process has left"
        " (RLIMIT_AS, the cgroup's memory.max, MemAvailable)",
    )
    train.add_argument(
        "--item-attributes",
        metavar="FILE",
        help="item metadata published in the version for Recommend's filter: MovieLens u.item"
        " or movies.dat (genre, year), or a csv 'id,<attribute>,...' (numeric or categorical,"
        " '|' between several values)",
    )
    train.add_argument(
        "--item-attributes-format", default="auto", choices=("auto", "ml-100k", "ml-1m", "csv")
    )
    train.add_argument(
        "--labels",
        help="map models: display names for the report (MovieLens u.item, "
        "or 'id<TAB>label' / 'id|label' lines)",
    )
    train.add_argument(
        "--gate",
        nargs="?",
        const="",
        metavar="METRIC",
        help="judge the model as a job's gate does before publishing: fit on all but a held-out 20%%,"
        " publish (refitted on all the data) only if METRIC (default: the kind's first) is not below"
        " the live version's; exit 3 when refused",
    )
    train.set_defaults(func=cmd_train)

    reproduce = sub.add_parser("reproduce", help="run a paper's evaluation protocol")
    protocols = reproduce.add_subparsers(dest="kind", required=True)
    for kind in (*kinds.names(), *PROTOCOLS):
        p = protocols.add_parser(kind, help=protocol_summary(kind))
        if kind == reproduce_kind:
            # Only the chosen protocol is imported: the others pull in their
            # models and kernels, which would slow every command's start-up.
            add_protocol_arguments(p, protocol_module(kind), kind)

    sample = sub.add_parser("sample", help="write the built-in generated sample data sets")
    sample.add_argument("--out", required=True)
    sample.add_argument("--seed", type=int, default=0)
    sample.set_defaults(func=cmd_sample)

    registry = sub.add_parser(
        "registry", help="registry administration: versions, pin, split, promote, hide, prune, gc, forget"
    )
    add_registry_commands(registry.add_subparsers(dest="registry_command", required=True))
    add_registry_commands(sub, deprecated=True)

    run = sub.add_parser("run", help="a cron job described by a TOML file")
    run.add_argument("job")
    run.add_argument(
        "--dry-run", action="store_true", help="train, evaluate and gate, but never publish or notify"
    )
    run.add_argument(
        "--only", action="append", metavar="MODEL", help="run only this model of the job (repeatable)"
    )
    add_cache_dir_argument(run)
    run.set_defaults(func=cmd_run)

    events = sub.add_parser("events", help="recorded interactions (the ordrec:events stream)")
    events_sub = events.add_subparsers(dest="events_command", required=True)
    export = events_sub.add_parser("export", help="write the recorded events to a file for a warehouse")
    export.add_argument("--redis", required=True, metavar="URL")
    export.add_argument("--out", required=True, help="the file (replaced atomically)")
    export.add_argument("--since", metavar="ID", help="only entries after this stream id (exclusive)")
    export.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    export.add_argument("--timeout", type=SECONDS_FLAG, default=10.0, help="seconds per Redis call")
    export.set_defaults(func=cmd_events_export)

    ex = sub.add_parser(
        "export", help="write the top-N of every user (or a list) from a version, as Recommend answers"
    )
    ex.add_argument("model")
    ex.add_argument("--registry", required=True)
    ex.add_argument("--n", type=AT_LEAST_ONE_FLAG, default=100, help="items per user")
    ex.add_argument("--out", required=True, help="FILE.csv, FILE.jsonl or FILE.parquet (replaced atomically)")
    ex.add_argument(
        "--users", metavar="FILE", help="user ids, one a line (default: every user of the version)"
    )
    ex.add_argument("--version", help="the version (default: the live one)")
    ex.add_argument(
        "--redis", metavar="URL", help="the servers' Redis: hidden items and recorded ones (left out too)"
    )
    ex.add_argument("--batch", type=AT_LEAST_ONE_FLAG, default=1000, help="users scored per matrix product")
    ex.add_argument(
        "--workers",
        type=AT_LEAST_ONE_FLAG,
        default=1,
        help="scoring processes, each mapping the version (2 on 2 cores)",
    )
    add_cache_dir_argument(ex)
    ex.set_defaults(func=cmd_export)

    report = sub.add_parser("report", help="(re)write the HTML report of a map model's version")
    report.add_argument("--registry", required=True)
    report.add_argument("--model", required=True)
    report.add_argument("--version")
    report.add_argument(
        "--labels",
        help="display names (MovieLens u.item, or 'id<TAB>label' / 'id|label' lines);"
        " default: the labels published with the version",
    )
    report.set_defaults(func=cmd_report)
    return parser


# The registry administration commands: ``ordrec-train registry NAME``; the top-level
# spellings (``ordrec-train NAME``) still work for one release, with a warning.
REGISTRY_COMMANDS = (
    "versions",
    "pin",
    "unpin",
    "split",
    "promote",
    "hide",
    "unhide",
    "hidden",
    "prune",
    "gc",
    "forget",
)


def _command(sub, deprecated: bool, name: str, **kwargs) -> argparse.ArgumentParser:
    """One registry command's parser; a deprecated one says which spelling replaces it."""
    if deprecated:
        kwargs["help"] = f"deprecated: ordrec-train registry {name}"
    parser = sub.add_parser(name, **kwargs)
    parser.set_defaults(deprecated_spelling=name if deprecated else None)
    return parser


def add_registry_commands(sub, deprecated: bool = False) -> None:
    """Add the registry administration commands to ``sub`` (see REGISTRY_COMMANDS)."""
    versions = _command(sub, deprecated, "versions", help="list published versions")
    versions.add_argument("--registry", required=True)
    versions.add_argument("--model")
    versions.set_defaults(func=cmd_versions)

    for name, func, helptext in (
        ("pin", cmd_pin, "serve this version until unpinned"),
        ("unpin", cmd_unpin, "serve the newest version again"),
    ):
        p = _command(sub, deprecated, name, help=helptext)
        p.add_argument("--registry", required=True)
        p.add_argument("--model", required=True)
        if name == "pin":
            p.add_argument("--version", required=True)
        p.set_defaults(func=func)

    split = _command(
        sub, deprecated, "split", help="send a share of users to a candidate version (stable per user)"
    )
    split.add_argument("model")
    split.add_argument("--registry", required=True)
    split.add_argument("--candidate", metavar="VERSION", help="the version to compare with the live one")
    split.add_argument(
        "--share",
        type=flag(float, Interval(numbers.Real, 0, 1, closed="right")),
        help="share of users in (0, 1], e.g. 0.1",
    )
    split.add_argument("--off", action="store_true", help="end the split: every user gets the live version")
    split.set_defaults(func=cmd_split)
    promote = _command(
        sub, deprecated, "promote", help="make the split's candidate the live version (pinned)"
    )
    promote.add_argument("model")
    promote.add_argument("--registry", required=True)
    promote.set_defaults(func=cmd_promote)

    for name, helptext in (
        ("hide", "hide items from Recommend and Neighbors now, without retraining"),
        ("unhide", "undo hide"),
    ):
        p = _command(sub, deprecated, name, help=helptext)
        p.add_argument("--registry", required=True)
        p.add_argument(
            "--redis", metavar="URL", help="where the servers keep hidden items (else the registry)"
        )
        p.add_argument("--model", help="one model (default: all models, '*')")
        p.add_argument("--file", help="item ids, one a line")
        p.add_argument("item_ids", nargs="*")
        p.set_defaults(func=cmd_hide, hide=name == "hide")
    hidden = _command(sub, deprecated, "hidden", help="list hidden items: scope, count, the first ids")
    hidden.add_argument("--registry", required=True)
    hidden.add_argument("--redis", metavar="URL")
    hidden.add_argument("--model")
    hidden.add_argument("--show", type=AT_LEAST_ONE_FLAG, default=20, help="ids to print per scope")
    hidden.set_defaults(func=cmd_hidden)

    prune = _command(
        sub, deprecated, "prune", help="delete all but the newest K versions (never the pinned one)"
    )
    prune.add_argument("--registry", required=True)
    prune.add_argument("--model", required=True)
    prune.add_argument("--keep", type=AT_LEAST_ONE_FLAG, required=True)
    prune.set_defaults(func=cmd_prune)

    gc = _command(
        sub,
        deprecated,
        "gc",
        help="remove what killed publishers left (temporary folders no live"
        " publisher holds); safe beside a running publish",
    )
    gc.add_argument("--registry", required=True)
    gc.set_defaults(func=cmd_gc)

    forget = _command(
        sub,
        deprecated,
        "forget",
        help="erase a user everywhere (GDPR Art. 17): Redis, events, registry, answers, later training",
    )
    forget.add_argument("--registry", required=True)
    forget.add_argument("--user", required=True, metavar="ID", help="the user id to erase")
    forget.add_argument(
        "--redis", metavar="URL", help="the servers' Redis (else only the registry is erased)"
    )
    forget.add_argument(
        "--reason",
        help="why, e.g. the request's ticket (logged with the id's entry on the list, never the id)",
    )
    add_cache_dir_argument(forget)
    forget.set_defaults(func=cmd_forget)
    if deprecated:
        return
    rekey = sub.add_parser(
        "rekey-forgotten",
        help="replace the FORGOTTEN list's bare sha256 entries (lists from before the key) by keyed"
        " ones, for the user ids given (the key: $ORDREC_FORGOTTEN_KEY_FILE or $ORDREC_FORGOTTEN_KEY)",
    )
    rekey.add_argument("--registry", required=True)
    rekey.add_argument(
        "--users",
        required=True,
        metavar="FILE",
        help="user ids, one a line ('-': stdin), e.g. every id of the user database or the training data",
    )
    rekey.add_argument("--redis", metavar="URL", help="the servers' Redis (its copy of the list too)")
    add_cache_dir_argument(rekey)
    rekey.set_defaults(func=cmd_rekey_forgotten, deprecated_spelling=None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_reproduce_kind(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if getattr(args, "deprecated_spelling", None):
        print(
            f"ordrec-train: 'ordrec-train {args.deprecated_spelling}' is deprecated and goes in the next"
            f" release: use 'ordrec-train registry {args.deprecated_spelling}'",
            file=sys.stderr,
        )
    # Every s3:// download of the command goes into one temporary folder, removed at the end
    # (SIGTERM too unwinds to the end; after a SIGKILL the next command removes it).
    args.downloads = Downloads(getattr(args, "cache_dir", None))
    restore = _exit_on_sigterm()
    try:
        return args.func(args)
    except DataError as exc:
        print(f"ordrec-train: data error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ArtifactError, ValueError, argparse.ArgumentTypeError, FileNotFoundError) as exc:
        print(f"ordrec-train: error: {exc}", file=sys.stderr)
        return EXIT_USAGE if not isinstance(exc, ArtifactError) else EXIT_FAILED
    except FloatingPointError as exc:
        print(f"ordrec-train: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except MemoryError as exc:
        print(f"ordrec-train: out of memory: {exc or 'an allocation failed'}", file=sys.stderr)
        return EXIT_FAILED
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in TRAIN_EXTRA_MODULES:
            raise
        print(
            f"ordrec-train: {exc}: the trainer's dependencies are the `train` extra: "
            f"pip install 'ordrec[train]'",
            file=sys.stderr,
        )
        return EXIT_FAILED
    finally:
        args.downloads.close()
        restore()


def _exit_on_sigterm():
    """Make SIGTERM exit through ``finally`` blocks (status 143); return what puts the
    previous handler back (nothing to do off the main thread, where none can be set)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def exit_143(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_143)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
