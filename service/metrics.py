"""Prometheus metrics: the conventional gRPC server metrics plus model lifecycle.

gRPC metrics follow the names of go-grpc-prometheus / py-grpc-prometheus so
existing dashboards and alerts work unchanged:
``grpc_server_started_total``, ``grpc_server_handled_total{grpc_code}``,
``grpc_server_handling_seconds`` (histogram).
"""

from __future__ import annotations

import time

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (
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


class Metrics:
    """Every metric of one server, in its own registry (tests run several servers)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.started = Counter(
            "grpc_server_started_total", "RPCs started on the server.", _GRPC_LABELS, registry=r
        )
        self.handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed on the server, by status code.",
            _GRPC_LABELS + ("grpc_code",),
            registry=r,
        )
        self.handling = Histogram(
            "grpc_server_handling_seconds",
            "Time to handle an RPC on the server (seconds).",
            _GRPC_LABELS,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
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
            buckets=(0.00005,) + _LATENCY_BUCKETS,
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
        self._versioned = (
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


def _ended_code(context, failed: bool) -> grpc.StatusCode:
    """The status of a call whose handler set none: the client's view when it left early."""
    if not context.is_active():
        remaining = context.time_remaining()
        return (
            grpc.StatusCode.DEADLINE_EXCEEDED
            if remaining is not None and remaining <= 0
            else grpc.StatusCode.CANCELLED
        )
    return grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK


def _split_method(full_method: str) -> tuple[str, str]:
    # "/ordrec.v1.Recommender/Recommend" -> ("ordrec.v1.Recommender", "Recommend")
    _, service, method = full_method.split("/", 2) if full_method.count("/") >= 2 else ("", "", full_method)
    return service, method


class MetricsInterceptor(grpc.ServerInterceptor):
    """Counts and times every RPC with its final status code.

    Labelled children are looked up once per method and code and cached, and
    so is the wrapped handler of each registered one: ``.labels()`` and
    building closures cost microseconds, and this runs on every call.
    """

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self._children: dict[tuple, tuple] = {}
        self._handled: dict[tuple, Counter] = {}
        self._wrapped: dict[str, tuple] = {}  # method -> (registered handler, wrapped handler)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return self.counted(handler, handler_call_details.method)

    def counted(self, handler, method: str):
        """``handler`` wrapped to count and time its calls (cached per method)."""
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, method)
        if (
            cached is None
        ):  # the first handler seen for a method; a per-call one (an auth refusal) is not kept
            self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler, full_method: str):
        service, method = _split_method(full_method)
        if handler.unary_unary:
            return handler._replace(unary_unary=self._unary(handler.unary_unary, ("unary", service, method)))
        if handler.unary_stream:
            return handler._replace(
                unary_stream=self._stream(handler.unary_stream, ("server_stream", service, method))
            )
        return handler

    def _start(self, labels: tuple):
        children = self._children.get(labels)
        if children is None:
            children = (self.metrics.started.labels(*labels), self.metrics.handling.labels(*labels))
            self._children[labels] = children
        children[0].inc()
        return children[1]

    def _record(self, labels: tuple, handling, context, start: float, failed: bool) -> None:
        code = context.code() or _ended_code(context, failed)
        key = (labels, code)
        handled = self._handled.get(key)
        if handled is None:
            handled = self._handled[key] = self.metrics.handled.labels(*labels, code.name)
        handled.inc()
        handling.observe(time.perf_counter() - start)

    def _unary(self, behavior, labels):
        def wrapper(request, context):
            handling = self._start(labels)
            start = time.perf_counter()
            failed = True
            try:
                response = behavior(request, context)
                failed = False
                return response
            finally:
                self._record(labels, handling, context, start, failed)

        return wrapper

    def _stream(self, behavior, labels):
        def wrapper(request, context):
            handling = self._start(labels)
            start = time.perf_counter()
            failed = True
            try:
                yield from behavior(request, context)
                failed = False
            finally:
                self._record(labels, handling, context, start, failed)

        return wrapper
