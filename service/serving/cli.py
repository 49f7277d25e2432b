"""``ordrec-serve``: run the gRPC service (the load generator is ``ordrec-loadtest``).

BLAS, OpenMP and numba threads are pinned to one per process before numpy is
imported: requests run on the gRPC thread pool, and a BLAS call fanning out
over both cores of a small machine costs more in wake-ups than it saves.
Scale out with more processes (``--processes``), not more threads per call.
"""

from __future__ import annotations

import os
import sys

# Only when this module starts the process: imported into a process whose numba already
# runs a thread pool (a test, a notebook), a changed NUMBA_NUM_THREADS breaks its next compile.
if "numpy" not in sys.modules and "numba" not in sys.modules:
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import faulthandler  # noqa: E402
import gc  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

from ordrec.service.config import (  # noqa: E402
    SHARED_PORT_CONNECTION_AGE,
    HttpSettings,
    Limits,
    ServerConfig,
    StreamLimits,
)
from ordrec.service.constraints import (  # noqa: E402
    AT_LEAST_ONE_FLAG,
    AT_LEAST_ZERO_FLAG,
    FRACTION_FLAG,
    NOT_NEGATIVE_SECONDS_FLAG,
    SECONDS_FLAG,
    flag,
)

log = logging.getLogger("ordrec.service")


_DEFAULTS = ServerConfig(registry="")


def field_flag(settings: Any, name: str) -> Callable[[str], Any]:
    """The argparse type of a settings field: parsed as its default's type, checked by its
    declared ``_parameter_constraints`` (the same check the dataclass makes)."""
    parse = type(getattr(settings(), name))
    return flag(parse, *settings._parameter_constraints[name])


def build_parser() -> argparse.ArgumentParser:
    d = _DEFAULTS
    p = argparse.ArgumentParser(
        prog="ordrec-serve",
        description="Serve ordrec models over gRPC.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Load test: ordrec-loadtest --help",
    )
    p.add_argument(
        "--registry",
        required=True,
        help="registry the trainer publishes to: a directory, or s3://bucket/prefix (credentials and"
        " endpoint from the standard AWS environment and config, e.g. AWS_ENDPOINT_URL)",
    )
    p.add_argument(
        "--cache-dir",
        help="local folder an s3:// registry's versions are downloaded to and"
        " memory-mapped from (default: $XDG_CACHE_HOME/ordrec/registry, else"
        " <temp>/ordrec-cache-<uid>)",
    )
    p.add_argument("--host", default=d.host, help="gRPC bind address")
    p.add_argument("--port", type=int, default=d.port, help="gRPC port (0: pick a free one)")
    p.add_argument(
        "--metrics-host", default=d.metrics_host, help="bind address of /metrics, /healthz and /maps"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=d.metrics_port,
        help="HTTP port for /metrics (0: pick a free one, -1: off)",
    )
    http = p.add_argument_group("the HTTP port's JSON API (POST /v1/<Rpc>) and pages (docs/service.md)")
    for name, kind, default, text in (
        (
            "--http-read-timeout",
            field_flag(HttpSettings, "read_timeout"),
            d.http.read_timeout,
            "seconds a client gets to send a whole request (and an idle connection its next one)",
        ),
        (
            "--http-max-connections",
            field_flag(HttpSettings, "max_connections"),
            d.http.max_connections,
            "connections open at once; over it the oldest one still sending is closed",
        ),
        (
            "--http-max-message-bytes",
            field_flag(HttpSettings, "max_message_bytes"),
            d.http.max_message_bytes,
            "the JSON API's request body and reply limit (the reply sized as protobuf, checked"
            " before any work); below --max-message-bytes: JSON costs ~100x the CPU to write",
        ),
    ):
        http.add_argument(name, type=kind, default=default, help=text)
    http.add_argument(
        "--http-cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="an origin (https://shop.example) whose pages may call the JSON API from a browser;"
        " repeat for several, '*' for any (default: none, same origin only)",
    )
    p.add_argument(
        "--workers", type=AT_LEAST_ONE_FLAG, default=d.workers, help="gRPC worker threads per process"
    )
    p.add_argument(
        "--batch-max-size",
        type=AT_LEAST_ZERO_FLAG,
        default=d.batch_max_size,
        help="users of concurrent Recommend calls scored together at most (0: no batching, each"
        " call scores on its own and --batch-max-queue does not apply)",
    )
    p.add_argument(
        "--batch-max-queue",
        type=AT_LEAST_ZERO_FLAG,
        default=d.batch_max_queue,
        help="Recommend calls that may wait for the scorer; more are refused RESOURCE_EXHAUSTED at once"
        " (a waiting call holds a worker, so --workers bounds it too)",
    )
    p.add_argument(
        "--batch-min-work",
        type=AT_LEAST_ZERO_FLAG,
        default=d.batch_min_work,
        help="batch only versions whose one-user scoring pass costs at least this many"
        " multiply-adds (items x factor width; 0: every version, approximate indexes included)",
    )
    p.add_argument(
        "--processes",
        type=AT_LEAST_ZERO_FLAG,
        default=1,
        help="server processes sharing the port (SO_REUSEPORT), each pinned to a core;"
        " 0 = one per CPU this process may run on",
    )
    p.add_argument("--reuse-port", action="store_true", help="bind with SO_REUSEPORT (set for --processes)")
    p.add_argument("--cpu", type=int, help="pin this process to one CPU")
    p.add_argument(
        "--poll-interval",
        type=NOT_NEGATIVE_SECONDS_FLAG,
        default=d.poll_interval,
        help="seconds between registry polls for new versions (0: never)",
    )
    p.add_argument(
        "--grace",
        type=NOT_NEGATIVE_SECONDS_FLAG,
        default=d.grace,
        help="seconds in-flight calls get on SIGTERM",
    )
    p.add_argument(
        "--redis",
        dest="redis_url",
        metavar="URL",
        help="redis://host:port/db for new-version news and seen items (optional)",
    )
    p.add_argument(
        "--redis-timeout", type=SECONDS_FLAG, default=d.redis_timeout, help="seconds per Redis call"
    )
    p.add_argument(
        "--seen-ttl",
        type=AT_LEAST_ONE_FLAG,
        default=d.seen_ttl,
        help="seconds a recorded interaction stays excluded",
    )
    p.add_argument(
        "--events-maxlen",
        type=AT_LEAST_ONE_FLAG,
        default=d.events_maxlen,
        help="entries the ordrec:events stream keeps (about; older ones are trimmed): the"
        " training job must run before this many new interactions arrive",
    )
    online = p.add_argument_group("online evaluation, with --redis (docs/service.md)")
    for name, kind, default, text in (
        (
            "--online-sample-rate",
            FRACTION_FLAG,
            d.online_sample_rate,
            "share of Recommend answers sampled (0: off)",
        ),
        (
            "--online-window",
            AT_LEAST_ONE_FLAG,
            d.online_window,
            "seconds in which a served item's interaction is a hit",
        ),
    ):
        online.add_argument(name, type=kind, default=default, help=text)
    trending = p.add_argument_group("trending, with --redis (docs/service.md, 'Trending')")
    trending.add_argument(
        "--trending",
        metavar="NAME",
        default=d.trending,
        help="model name whose Recommend answers the trending items ('': none); unknown users"
        " of every model fall back to trending when it has data",
    )
    for name, default, text in (
        ("--trending-half-life", d.trending_half_life, "seconds that halve an interaction's weight"),
        ("--trending-window", d.trending_window, "seconds after its last interaction an item leaves"),
    ):
        trending.add_argument(name, type=SECONDS_FLAG, default=default, help=text)
    p.add_argument(
        "--fresh-interval",
        type=NOT_NEGATIVE_SECONDS_FLAG,
        default=d.fresh_interval,
        metavar="SECONDS",
        help="with --redis: seconds between reads of the interactions with items the served versions"
        " were not trained on, which Recommend then serves (docs/service.md, 'Fresh items'); 0: off",
    )
    p.add_argument(
        "--fresh-item-attributes",
        metavar="FILE",
        help="with --redis: a newer item-attributes file (the trainer's formats); its items no version"
        " was trained on and nobody rated yet are served at the mean of the items sharing their values",
    )
    p.add_argument("--tls-cert", help="PEM certificate chain: serve TLS (needs --tls-key)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument("--token-file", help="file of accepted bearer tokens, one a line")
    p.add_argument("--token-env", help="environment variable holding an accepted bearer token")
    p.add_argument(
        "--admin-token-file",
        help="file of admin bearer tokens, one a line: ForgetUser, HideItems and UnhideItems need one"
        " (they are accepted on every other call too)",
    )
    p.add_argument("--admin-token-env", help="environment variable holding an admin bearer token")
    p.add_argument(
        "--admin-open",
        action="store_true",
        help="without admin tokens, let any caller that passes the ordinary token check (anyone,"
        " without --token-file) erase users and hide items; by default they are refused",
    )
    p.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="Python's GIL switch interval in seconds (sys.setswitchinterval; Python's own default)",
    )
    p.add_argument("--log-level", default="INFO")
    streams = p.add_argument_group("streams and connections (docs/service.md, 'Streams')")
    streams.add_argument(
        "--max-streams",
        type=field_flag(StreamLimits, "max_streams"),
        default=d.streams.max_streams,
        help="open streaming RPCs per process (health Watch included); keep below --workers",
    )
    streams.add_argument(
        "--max-streams-per-connection",
        type=field_flag(StreamLimits, "max_streams_per_connection"),
        default=d.streams.max_streams_per_connection,
    )
    streams.add_argument(
        "--stream-stall-seconds",
        type=field_flag(StreamLimits, "stall_seconds"),
        default=d.streams.stall_seconds,
        help="end a stream whose reply the client has not taken for this long",
    )
    streams.add_argument(
        "--stream-max-seconds",
        type=field_flag(StreamLimits, "max_seconds"),
        default=d.streams.max_seconds,
        help="end a stream open longer than this",
    )
    streams.add_argument(
        "--max-connection-age",
        type=SECONDS_FLAG,
        default=None,
        help="seconds before a connection is asked to reconnect (GOAWAY); reconnects re-spread"
        f" calls over --processes and replicas (default {d.max_connection_age:g}, with --processes"
        f" above 1 {SHARED_PORT_CONNECTION_AGE:g})",
    )
    streams.add_argument(
        "--max-connection-age-grace",
        type=SECONDS_FLAG,
        default=d.max_connection_age_grace,
        help="seconds the calls open at a GOAWAY may still take before the connection is cut"
        " (keep it at least --stream-max-seconds)",
    )
    limits = p.add_argument_group("request bounds")
    for name, default in vars(d.limits).items():
        limits.add_argument(
            f"--{name.replace('_', '-')}", type=field_flag(Limits, name), default=default, dest=name
        )
    return p


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    from ordrec.service.serving.security import AccessPolicy, load_tokens

    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    if args.max_streams >= args.workers:
        raise ValueError(
            f"--max-streams ({args.max_streams}) must be below --workers ({args.workers}),"
            " or open streams could hold every worker"
        )
    if args.trending:
        from ordrec.service.errors import InvalidArgument
        from ordrec.service.serving.validation import model_name

        try:
            model_name(args.trending)  # the name a client would send
        except InvalidArgument as exc:
            raise ValueError(f"--trending: {exc}") from None
    if args.fresh_item_attributes:
        from ordrec.service.indices.item_attributes import read_item_attributes

        read_item_attributes(args.fresh_item_attributes)  # a bad file stops the start, naming its line
    limits = Limits(**{name: getattr(args, name) for name in vars(Limits())})
    streams = StreamLimits(
        max_streams=args.max_streams,
        max_streams_per_connection=args.max_streams_per_connection,
        stall_seconds=args.stream_stall_seconds,
        max_seconds=args.stream_max_seconds,
    )
    config = ServerConfig(
        registry=args.registry,
        cache_dir=args.cache_dir,
        host=args.host,
        port=args.port,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        http=HttpSettings(
            read_timeout=args.http_read_timeout,
            max_connections=args.http_max_connections,
            max_message_bytes=args.http_max_message_bytes,
            cors_origins=tuple(args.http_cors_origin),
        ),
        workers=args.workers,
        batch_max_size=args.batch_max_size,
        batch_max_queue=args.batch_max_queue,
        batch_min_work=args.batch_min_work,
        poll_interval=args.poll_interval,
        grace=args.grace,
        limits=limits,
        streams=streams,
        max_connection_age=connection_age(args.max_connection_age, args.processes),
        max_connection_age_grace=args.max_connection_age_grace,
        reuse_port=args.reuse_port,
        redis_url=args.redis_url,
        redis_timeout=args.redis_timeout,
        seen_ttl=args.seen_ttl,
        events_maxlen=args.events_maxlen,
        online_sample_rate=args.online_sample_rate,
        online_window=args.online_window,
        trending=args.trending,
        trending_half_life=args.trending_half_life,
        trending_window=args.trending_window,
        fresh_interval=args.fresh_interval,
        fresh_item_attributes=args.fresh_item_attributes,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tokens=load_tokens(args.token_file, args.token_env),
        admin_tokens=load_tokens(args.admin_token_file, args.admin_token_env),
        admin_open=args.admin_open,
    )
    AccessPolicy(
        config.tokens, config.admin_tokens, config.admin_open
    )  # refuses a contradiction before loading
    return config


def serve(args: argparse.Namespace) -> int:
    import numba

    from ordrec.service.serving.server import Server

    numba.set_num_threads(1)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    # `kill -USR1 <pid>` writes every thread's stack to the log: how to see where a
    # process that will not stop (or answer) is waiting, without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    server = Server(config_from_args(args))
    server.stop_on_signals()
    server.start()
    # The models and indices are long-lived: move them out of the collector's
    # view so full collections do not walk them while requests wait.
    gc.collect()
    gc.freeze()
    # A line a supervisor (or a test) can wait for.
    print(f"ordrec-serve ready port={server.port} metrics_port={server.metrics_port}", flush=True)
    server.wait()
    # The drain is over: every call finished within the grace period or was cancelled. A
    # handler thread can still be parked inside grpc (a stream's yield after its call was
    # cancelled blocks forever: grpc/grpc#22874), and a normal interpreter exit joins the
    # RPC pool's threads, so it would hang. Nothing is left to do at exit (Redis and HTTP
    # are closed), so the process leaves without joining them.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.processes == 0:
        args.processes = len(os.sched_getaffinity(0))
    if args.processes > 1:
        from ordrec.service.serving.supervisor import Supervisor

        passed_on = without_flags(
            argv, {"--processes", "--port", "--metrics-port", "--cpu", "--max-connection-age"}
        )
        age = connection_age(args.max_connection_age, args.processes)
        passed_on += ["--max-connection-age", repr(age)]
        return Supervisor(passed_on, args.processes, args.host, args.port, args.metrics_port).run()
    try:
        return serve(args)
    except (OSError, ValueError) as exc:
        print(f"ordrec-serve: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1


def connection_age(given: float | None, processes: int) -> float:
    """``--max-connection-age`` as given, else the default for this many processes: short when
    several share the port, so their calls even out (docs/deploy.md, "Many replicas")."""
    if given is not None:
        return given
    return SHARED_PORT_CONNECTION_AGE if processes > 1 else _DEFAULTS.max_connection_age


def without_flags(argv: list[str], flags: set[str]) -> list[str]:
    """``argv`` minus the given value-taking flags (``--flag V`` or ``--flag=V``)."""
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token.split("=", 1)[0] in flags:
            skip = "=" not in token
        else:
            out.append(token)
    return out
