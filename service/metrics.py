"""Prometheus metrics: the conventional gRPC server metrics plus model lifecycle.

gRPC metrics follow the names of go-grpc-prometheus / py-grpc-prometheus so
existing dashboards and alerts work unchanged:
``grpc_server_started_total``, ``grpc_server_handled_total{grpc_code}``,
``grpc_server_handling_seconds`` (histogram).

Those three are written by :class:`CallMeter` (one per RPC, one lock a call) and read by
:class:`CallMetrics`, a collector: prometheus-client's labelled children cost four locked
updates and a dozen Python calls per RPC (``docs/serving-cost.md``, "Call metrics and the guard").
"""

from __future__ import annotations

import bisect
import threading
import time

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# The upper bounds of grpc_server_handling_seconds (seconds).
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
_GRPC_LABELS = ("grpc_type", "grpc_service", "grpc_method")
_BUCKET_NAMES = [floatToGoString(bound) for bound in LATENCY_BUCKETS] + ["+Inf"]


class CallMeter:
    """One RPC's calls (labels: type, service, method): started, handled by status code and
    the handling time's histogram, as plain numbers under one lock."""

    __slots__ = ("labels", "created", "_lock", "started", "handled", "buckets", "seconds")

    def __init__(self, labels: tuple[str, str, str]):
        self.labels, self.created = labels, time.time()
        self._lock = threading.Lock()
        self.started = 0
        self.handled: dict[str, int] = {}  # status code name -> calls
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # per bucket, not cumulative; the last: +Inf
        self.seconds = 0.0

    def start(self) -> None:
        with self._lock:
            self.started += 1

    def finish(self, code: str, seconds: float) -> None:
        """A call ended with status ``code`` (its name, e.g. "OK") after ``seconds``."""
        bucket = bisect.bisect_left(LATENCY_BUCKETS, seconds)  # the first bound >= seconds: "le"
        with self._lock:
            self.handled[code] = self.handled.get(code, 0) + 1
            self.buckets[bucket] += 1
            self.seconds += seconds

    def snapshot(self) -> tuple[int, dict[str, int], list[int], float]:
        with self._lock:
            return self.started, dict(self.handled), list(self.buckets), self.seconds


class CallMetrics:
    """``grpc_server_started_total``, ``grpc_server_handled_total`` and
    ``grpc_server_handling_seconds`` of every RPC, collected from the RPCs' meters; the same
    series prometheus-client's Counter and Histogram would expose (``_created`` included)."""

    def __init__(self, registry: CollectorRegistry):
        self._meters: dict[tuple[str, str, str], CallMeter] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def meter(self, grpc_type: str, service: str, method: str) -> CallMeter:
        """The meter of one RPC (made on first use; callers keep it)."""
        labels = (grpc_type, service, method)
        meter = self._meters.get(labels)
        if meter is None:
            with self._lock:
                meter = self._meters.setdefault(labels, CallMeter(labels))
        return meter

    def describe(self) -> list[Metric]:
        return self._families()

    def collect(self) -> list[Metric]:
        started, handled, handling = families = self._families()
        for meter in list(self._meters.values()):
            count, codes, buckets, seconds = meter.snapshot()
            labels = list(meter.labels)
            started.add_metric(labels, count, created=meter.created)
            for code, calls in sorted(codes.items()):
                handled.add_metric(labels + [code], calls, created=meter.created)
            cumulative, total = [], 0
            for name, calls in zip(_BUCKET_NAMES, buckets):
                total += calls
                cumulative.append((name, total))
            handling.add_metric(labels, cumulative, seconds)
            handling.samples.append(
                Sample("grpc_server_handling_seconds_created", dict(zip(_GRPC_LABELS, labels)), meter.created)
            )
        return families

    @staticmethod
    def _families() -> list:
        return [
            CounterMetricFamily("grpc_server_started", "RPCs started on the server.", labels=_GRPC_LABELS),
            CounterMetricFamily(
                "grpc_server_handled",
                "RPCs completed on the server, by status code.",
                labels=_GRPC_LABELS + ("grpc_code",),
            ),
            HistogramMetricFamily(
                "grpc_server_handling_seconds",
                "Time to handle an RPC on the server (seconds).",
                labels=_GRPC_LABELS,
            ),
        ]


class Metrics:
    """Every metric of one server, in its own registry (tests run several servers)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.calls = CallMetrics(r)  # grpc_server_started_total, _handled_total, _handling_seconds
        self.model_info = Gauge(
            "ordrec_model_info",
            "1 for the version of each model being served.",
            ("model", "kind", "version", "reason"),
            registry=r,
        )
        self.model_search = Gauge(
            "ordrec_model_search_info",
            "1 for what answers a served model's Recommend over the whole catalogue:"
            " 'exact' or the approximate index with its parameters.",
            ("model", "search"),
            registry=r,
        )
        self.model_created = Gauge(
            "ordrec_model_created_timestamp_seconds",
            "When the served version was trained (alert on its age).",
            ("model",),
            registry=r,
        )
        self.model_loaded = Gauge(
            "ordrec_model_loaded_timestamp_seconds",
            "When this replica loaded the served version.",
            ("model",),
            registry=r,
        )
        self.load_seconds = Gauge(
            "ordrec_model_load_seconds",
            "Time to load, verify and smoke-test the served version.",
            ("model",),
            registry=r,
        )
        self.load_failures = Counter(
            "ordrec_model_load_failures_total",
            "Versions refused at load (verification or smoke query failed).",
            ("model",),
            registry=r,
        )
        self.reloads = Counter(
            "ordrec_model_reloads_total", "Versions swapped in while serving.", ("model",), registry=r
        )
        self.index_size = Gauge(
            "ordrec_index_size", "Entries in a served model's id space.", ("model", "space"), registry=r
        )
        self.fallbacks = Counter(
            "ordrec_fallback_total",
            "Answers that used a fallback instead of the personalised model.",
            ("model", "rpc", "fallback"),
            registry=r,
        )
        self.redis_up = Gauge(
            "ordrec_redis_up", "1 when Redis answers, 0 when not (absent: not configured).", registry=r
        )
        self.open_streams = Gauge(
            "ordrec_open_streams", "Streaming RPCs open now (health Watch included).", registry=r
        )
        self.streams_ended = Counter(
            "ordrec_streams_ended_total",
            "Streams the server ended: stalled (the client stopped reading) or expired.",
            ("reason",),
            registry=r,
        )
        self.models_loaded = Gauge("ordrec_models_loaded", "Number of models being served.", registry=r)
        self.hidden_items = Gauge("ordrec_hidden_items", "Item ids hidden, all scopes together.", registry=r)
        self.rules_stale = Gauge(
            "ordrec_rules_stale",
            "1 while the hidden items cannot be refreshed (the last known ones apply).",
            registry=r,
        )

        self.http_requests = Counter(
            "ordrec_http_requests_total",
            "Requests on the HTTP port by handler (a fixed set: /v1/<Rpc>, /, /metrics, ...)"
            " and HTTP status; JSON calls also count in grpc_server_* like gRPC calls.",
            ("handler", "code"),
            registry=r,
        )
        self.batch_users = Histogram(
            "ordrec_recommend_batch_users",
            "Users scored together in one Recommend batch (concurrent calls batched dynamically).",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=r,
        )
        self.queue_seconds = Histogram(
            "ordrec_recommend_queue_seconds",
            "Time a queued Recommend call waited for the scorer before its batch was scored"
            " (seconds; calls that found the scorer free are not counted).",
            buckets=(0.00005,) + LATENCY_BUCKETS,
            registry=r,
        )
        self.shed = Counter(
            "ordrec_recommend_shed_total",
            "Recommend calls refused before scoring: the queue was full (RESOURCE_EXHAUSTED)"
            " or their deadline passed while they waited (DEADLINE_EXCEEDED).",
            ("reason",),
            registry=r,
        )

        # Per served version: the traffic of a split, and the online evaluation (service/live/online.py).
        def versioned(kind, name: str, text: str):
            return kind(name, text, ("model", "version"), registry=r)

        self.recommended_users = versioned(
            Counter,
            "ordrec_recommend_users_total",
            "Users answered by Recommend, per model and version (a split's shares).",
        )
        self.folded_in = versioned(
            Counter,
            "ordrec_fold_in_total",
            "Recommend answers for users the version has not seen, personalised from their"
            " recorded ratings instead of the popularity list.",
        )
        self.online_served = versioned(
            Counter, "ordrec_online_served_total", "Recommended items sampled for the online evaluation."
        )
        self.online_hits = versioned(
            Counter,
            "ordrec_online_hits_total",
            "Sampled recommended items the user then interacted with within the window (each once).",
        )
        self.online_hit_rate = versioned(
            Gauge,
            "ordrec_online_hit_rate",
            "online hits / online served on this replica since the version was loaded"
            " (across replicas: sum(rate(hits)) / sum(rate(served))).",
        )
        self.online_dropped = Counter(
            "ordrec_online_dropped_total",
            "Samples dropped: the writer's queue was full or Redis failed.",
            registry=r,
        )
        self.fresh_items = versioned(
            Gauge,
            "ordrec_fresh_items",
            "Fresh items (not trained on, served before the next training: service/live/fresh.py)"
            " in the version's overlay, set whenever the overlay is rebuilt.",
        )
        self._versioned = (
            self.fresh_items,
            self.recommended_users,
            self.folded_in,
            self.online_served,
            self.online_hits,
            self.online_hit_rate,
        )

    def forget_model(self, name: str) -> None:
        """Drop the labelled series of a model before re-registering its new version."""
        self.model_info.remove_by_labels({"model": name})
        self.model_search.remove_by_labels({"model": name})

    def forget_versions(self, name: str, served: set[str]) -> None:
        """Drop the per-version series of ``name``'s versions no longer served."""
        for metric in self._versioned:
            for labels in _label_sets(metric):
                if labels.get("model") == name and labels.get("version") not in served:
                    metric.remove_by_labels(labels)


def _label_sets(metric) -> list[dict[str, str]]:
    """The label values of every child of a labelled metric (from its samples: the
    children are not listed publicly)."""
    seen = {tuple(sorted(s.labels.items())) for family in metric.collect() for s in family.samples}
    return [dict(labels) for labels in seen]


def ended_code(context, failed: bool) -> grpc.StatusCode:
    """The status of a call whose handler set none: the client's view when it left early."""
    if not context.is_active():
        remaining = context.time_remaining()
        return (
            grpc.StatusCode.DEADLINE_EXCEEDED
            if remaining is not None and remaining <= 0
            else grpc.StatusCode.CANCELLED
        )
    return grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK


def split_method(full_method: str) -> tuple[str, str]:
    """``"/ordrec.v1.Recommender/Recommend"`` -> ``("ordrec.v1.Recommender", "Recommend")``."""
    _, service, method = full_method.split("/", 2) if full_method.count("/") >= 2 else ("", "", full_method)
    return service, method
