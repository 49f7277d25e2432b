"""The gRPC call metrics (``CallMetrics``: one meter per RPC, one lock a call) expose what
prometheus-client's Counter and Histogram exposed for the same calls, series for series."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from ordrec.service.metrics import LATENCY_BUCKETS, CallMetrics, Metrics

_LABELS = ("grpc_type", "grpc_service", "grpc_method")
_RPCS = [
    ("unary", "ordrec.v1.Recommender", "Recommend"),
    ("server_stream", "s.S", "Watch"),
    ("unary", "", "x"),
]
_CODES = ["OK", "INVALID_ARGUMENT", "UNAUTHENTICATED", "CANCELLED"]
# Durations on, beside and between the bucket bounds, and past the last.
_SECONDS = st.one_of(
    st.sampled_from([0.0, *LATENCY_BUCKETS, 10.0]),
    st.floats(min_value=0, max_value=5, allow_nan=False),
    st.sampled_from(LATENCY_BUCKETS).map(lambda b: b * (1 + 1e-12)),
)
_CALLS = st.lists(
    st.tuples(st.sampled_from(_RPCS), st.sampled_from(_CODES), _SECONDS, st.booleans()), max_size=40
)


def _reference(calls) -> bytes:
    """The exposition of the same calls through prometheus-client's own metrics, as the
    server used them (both children looked up when a call starts)."""
    registry = CollectorRegistry()
    started = Counter("grpc_server_started_total", "RPCs started on the server.", _LABELS, registry=registry)
    handled = Counter(
        "grpc_server_handled_total",
        "RPCs completed on the server, by status code.",
        _LABELS + ("grpc_code",),
        registry=registry,
    )
    handling = Histogram(
        "grpc_server_handling_seconds",
        "Time to handle an RPC on the server (seconds).",
        _LABELS,
        buckets=LATENCY_BUCKETS,
        registry=registry,
    )
    for labels, code, seconds, finished in calls:
        started.labels(*labels).inc()
        handling.labels(*labels)
        if finished:
            handled.labels(*labels, code).inc()
            handling.labels(*labels).observe(seconds)
    return generate_latest(registry)


def _exposition(calls) -> bytes:
    registry = CollectorRegistry()
    metrics = CallMetrics(registry)
    for labels, code, seconds, finished in calls:
        meter = metrics.meter(*labels)
        meter.start()
        if finished:
            meter.finish(code, seconds)
    return generate_latest(registry)


def _without_created(text: bytes) -> list[str]:
    """Exposition lines, the ``_created`` timestamps' values left out (they are clock readings)."""
    lines = []
    for line in text.decode().splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        lines.append(line.rsplit(" ", 1)[0] if name.endswith("_created") else line)
    return sorted(lines)


@settings(max_examples=150, deadline=None)
@given(_CALLS)
def test_the_meters_expose_what_prometheus_client_would(calls):
    assert _without_created(_exposition(calls)) == _without_created(_reference(calls))


def test_concurrent_calls_lose_no_count():
    metrics = Metrics()
    meter = metrics.calls.meter("unary", "s", "m")

    def calls() -> None:
        for _ in range(5000):
            meter.start()
            meter.finish("OK", 0.001)

    threads = [threading.Thread(target=calls) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    text = generate_latest(metrics.registry).decode()
    assert 'grpc_server_started_total{grpc_method="m",grpc_service="s",grpc_type="unary"} 20000.0' in text
    assert (
        'grpc_server_handled_total{grpc_code="OK",grpc_method="m",grpc_service="s",grpc_type="unary"} 20000.0'
        in text
    )
    assert (
        'grpc_server_handling_seconds_count{grpc_method="m",grpc_service="s",grpc_type="unary"} 20000.0'
        in text
    )
