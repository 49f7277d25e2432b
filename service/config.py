"""The server's settings and their defaults, in one place.

Imports nothing heavy: ``ordrec-serve`` builds its command line from these
defaults, and a supervising process (``--processes``) never loads numpy,
numba or the models.
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from ordrec.service.constraints import AT_LEAST_ONE, POSITIVE, Interval, ListOf, Matches, validate_params

# Entries the ordrec:events stream keeps (approximately): about 64 MB of Redis at 10-character ids.
DEFAULT_EVENTS_MAXLEN = 1_000_000
# Recommend's dynamic batching (service/serving/batching.py): users scored together at most, and calls
# that may wait for the scorer before more are refused RESOURCE_EXHAUSTED (docs/serving-cost.md).
DEFAULT_BATCH_MAX_SIZE = 64
DEFAULT_BATCH_MAX_QUEUE = 64
# ... and only versions whose one-user scoring pass costs at least this many multiply-adds
# (ML-100K's 1,682 x 80 does not; a 10^5 x 200 exact catalogue does).
DEFAULT_BATCH_MIN_WORK = 1 << 20
# Seconds; the default --max-connection-age of processes sharing a port (--processes N > 1):
# 8 client connections then split the calls within 0.4-0.6 over 20 s runs (docs/deploy.md).
SHARED_PORT_CONNECTION_AGE = 2.0


def checked(settings: Any, **as_checked: Any) -> None:
    """Check a settings dataclass's fields against its ``_parameter_constraints``."""
    validate_params(
        type(settings).__name__, {**asdict(settings), **as_checked}, settings._parameter_constraints
    )


@dataclass(frozen=True)
class Limits:
    """Upper bounds on request fields; each is a flag of ``ordrec-serve``."""

    max_n: int = 1000  # Recommend n, Tags n
    max_k: int = 1000  # Neighbors k, Place k
    max_batch: int = 1000  # user ids in one Recommend
    max_candidates: int = 100_000  # candidate_item_ids in one Recommend
    max_ids: int = 10_000  # ids in Coordinates, items in RecordInteractions, ranked neighbours in Place
    max_id_length: int = 256
    max_page_size: int = 10_000
    max_message_bytes: int = 4 * 1024 * 1024

    _parameter_constraints: ClassVar[dict[str, list]] = {
        name: [AT_LEAST_ONE]
        for name in (
            "max_n",
            "max_k",
            "max_batch",
            "max_candidates",
            "max_ids",
            "max_id_length",
            "max_page_size",
        )
    } | {"max_message_bytes": [Interval(numbers.Integral, 1024, None)]}

    def __post_init__(self) -> None:
        checked(self)


@dataclass(frozen=True)
class StreamLimits:
    max_streams: int = 4  # per server; keep well below the worker count
    max_streams_per_connection: int = 2
    stall_seconds: float = 10.0  # a reply not taken by the client for this long ends the stream
    max_seconds: float = 300.0  # no stream lives longer; clients resume with a new call

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "max_streams": [AT_LEAST_ONE],
        "max_streams_per_connection": [AT_LEAST_ONE],
        "stall_seconds": [POSITIVE],
        "max_seconds": [POSITIVE],
    }

    def __post_init__(self) -> None:
        checked(self)


@dataclass(frozen=True)
class HttpSettings:
    """The HTTP port's own bounds (the JSON API's bodies are bounded by ``max_message_bytes``)."""

    # seconds a client gets to send a whole request (line, headers and body), and an idle
    # keep-alive connection to send its next one; a stalled client is then cut off
    read_timeout: float = 10.0
    max_connections: int = 64  # open at once; over it the oldest still sending is closed
    # the JSON API's message limit (request body, and the reply as protobuf would size it,
    # checked before any work as gRPC's is): below gRPC's, because writing a reply as JSON
    # costs about 100 times the CPU of protobuf (3 s for a 3.3 MB Recommend reply)
    max_message_bytes: int = 1024 * 1024
    cors_origins: tuple[str, ...] = ()  # origins whose pages may call the JSON API ("*": any)

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "read_timeout": [POSITIVE],
        "max_connections": [AT_LEAST_ONE],
        "max_message_bytes": [Interval(numbers.Integral, 1024, None)],
        "cors_origins": [ListOf(str)],
    }

    def __post_init__(self) -> None:
        checked(self, cors_origins=list(self.cors_origins))
        for origin in self.cors_origins:
            if not CORS_ORIGIN.allows(origin):
                raise ValueError(f"CORS origin {origin!r} must be {CORS_ORIGIN}")


CORS_ORIGIN = Matches(r"^(\*|https?://[^/\s]+)$", "'*' or scheme://host[:port] (no path)")


@dataclass
class ServerConfig:
    registry: str  # a directory, or s3://bucket/prefix
    cache_dir: str | None = None  # where an s3:// registry's versions are downloaded (None: the default)
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9095  # 0 picks a free port, -1 disables the HTTP port
    http: HttpSettings = field(default_factory=HttpSettings)  # the HTTP port's JSON API and pages
    # grpcio parks a call's worker while its request arrives, so more threads queue less
    # (docs/service.md, Scaling).
    workers: int = 16
    batch_max_size: int = DEFAULT_BATCH_MAX_SIZE
    batch_max_queue: int = DEFAULT_BATCH_MAX_QUEUE
    batch_min_work: int = DEFAULT_BATCH_MIN_WORK
    poll_interval: float = 5.0  # seconds between registry polls (0: never)
    grace: float = 10.0  # seconds in-flight calls get on SIGTERM
    limits: Limits = field(default_factory=Limits)
    streams: StreamLimits = field(default_factory=StreamLimits)
    # A connection is closed (GOAWAY, then cut after the grace) at this age, which ends
    # anything a peer left hanging on it; clients reconnect transparently, and each reconnect
    # lands on a process (SO_REUSEPORT) or replica (L4 balancer) drawn anew, which re-spreads
    # the calls (docs/deploy.md). The grace covers the longest stream (--stream-max-seconds):
    # calls already open on the connection end on their own terms.
    # With --processes N a connection's process is hashed once (SO_REUSEPORT), so a client
    # with few connections loads one process more until they reconnect: there the age is
    # SHARED_PORT_CONNECTION_AGE, short enough to even the calls out within a minute
    # (docs/deploy.md, "Many replicas", has the measured shares and cost).
    max_connection_age: float = 30.0
    max_connection_age_grace: float = 300.0
    max_streams_per_connection_http2: int = 100  # HTTP/2 concurrent streams, unary included
    reuse_port: bool = False
    redis_url: str | None = None
    redis_timeout: float = 0.05  # seconds; Redis is an optimisation, never worth a slow answer
    seen_ttl: int = 30 * 86400  # seconds a recorded interaction stays excluded
    events_maxlen: int = DEFAULT_EVENTS_MAXLEN  # ordrec:events keeps about this many entries
    online_sample_rate: float = 0.1  # share of Recommend answers sampled for the online evaluation
    online_window: int = 86400  # seconds after a sampled answer in which an interaction is a hit
    trending: str = "trending"  # model name answering with trending items ("": none; needs Redis)
    trending_half_life: float = 86400.0  # seconds that halve a recorded interaction's trending weight
    trending_window: float = 7 * 86400.0  # seconds after its last interaction an item leaves trending
    fresh_interval: float = 1.0  # seconds between reads of new items' interactions (0: no fresh items)
    fresh_item_attributes: str | None = None  # a newer item-attributes file: unrated new items by attributes
    # seconds between checks of Redis' hidden-items counter: a hide reaches every replica within a second
    hidden_interval: float = 0.2
    tls_cert: str | None = None
    tls_key: str | None = None
    tokens: list[bytes] = field(default_factory=list)  # empty: no authentication
    # the admin scope (ForgetUser, HideItems, UnhideItems; service/serving/security.py)
    admin_tokens: list[bytes] = field(default_factory=list)
    admin_open: bool = False  # with no admin token: admin calls checked as ordinary ones
