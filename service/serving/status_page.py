"""The status page (``GET /`` on the HTTP port): what this process serves and how it is doing.

The models with their live and candidate versions and split share and the online hit
rates per version; when each version was trained and what its manifest records (data
fingerprint, the gate's held-out figures); calls per second, p99 latency and errors per RPC over
the last minute (from the process's own Prometheus metrics, sampled every few seconds),
and the hidden-item counts. Plain HTML rendered here, every value escaped, no script:
it is served under the map reports' strict Content-Security-Policy.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html import escape

from ordrec.service.live.hidden import HiddenState
from ordrec.service.metrics import Metrics
from ordrec.service.serving.store import LoadedModel, ModelStore

# The codes the documented error alert counts (docs/service.md, "Metrics"): failures of the
# server, never a client's mistake.
SERVER_ERROR_CODES = frozenset({"INTERNAL", "UNKNOWN", "UNAVAILABLE", "DATA_LOSS"})
GATE_PREFIX = "holdout_"  # the cron job's held-out figures in a version's metrics (trainer/job.py)


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of a Prometheus histogram from its cumulative ``(le, count)``
    buckets, interpolated within the bucket as PromQL's ``histogram_quantile`` does (the
    last finite bound when it falls in ``+Inf``); None without observations."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in ordered:
        if count >= rank and count > below:
            if math.isinf(upper):
                return lower
            # min: at the bucket's top the sum can round one ulp past ``upper``
            return min(upper, lower + (upper - lower) * (rank - below) / (count - below))
        lower, below = upper, count
    return lower


@dataclass
class _Calls:
    """One RPC's cumulative counts at one moment."""

    started: float = 0.0
    handled: dict[str, float] = field(default_factory=dict)  # grpc_code -> count
    buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count


def read_calls(metrics: Metrics) -> dict[tuple[str, str], _Calls]:
    """(service, method) -> counts, read from the gRPC metrics (JSON calls included)."""
    calls: dict[tuple[str, str], _Calls] = {}
    for family in metrics.registry.collect():
        if not family.name.startswith("grpc_server_"):
            continue
        for s in family.samples:
            key = (s.labels.get("grpc_service", ""), s.labels.get("grpc_method", ""))
            if s.name == "grpc_server_started_total":
                calls.setdefault(key, _Calls()).started += s.value
            elif s.name == "grpc_server_handled_total":
                handled = calls.setdefault(key, _Calls()).handled
                handled[s.labels["grpc_code"]] = handled.get(s.labels["grpc_code"], 0.0) + s.value
            elif s.name == "grpc_server_handling_seconds_bucket":
                buckets = calls.setdefault(key, _Calls()).buckets
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
    return calls


@dataclass(frozen=True)
class RpcTraffic:
    """One RPC over the window (and since start)."""

    service: str
    method: str
    per_second: float
    p99: float | None  # seconds
    server_errors: float
    client_errors: float
    total: float
    total_server_errors: float


class TrafficWindow:
    """Snapshots of the gRPC metrics every ``interval`` seconds, kept for ``window``
    seconds, so the page shows rates over the last minute rather than since start."""

    def __init__(
        self,
        metrics: Metrics,
        window: float = 60.0,
        interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.metrics, self.window, self.interval, self.clock = metrics, window, interval, clock
        self._snapshots: deque[tuple[float, dict]] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.sample()

    def start(self) -> TrafficWindow:
        threading.Thread(target=self._run, name="ordrec-status-window", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        now, calls = self.clock(), read_calls(self.metrics)
        with self._lock:
            self._snapshots.append((now, calls))
            while len(self._snapshots) > 1 and self._snapshots[1][0] <= now - self.window:
                self._snapshots.popleft()

    def traffic(self) -> tuple[float, list[RpcTraffic]]:
        """Seconds covered and one row per RPC seen, from the oldest kept snapshot to now."""
        now, current = self.clock(), read_calls(self.metrics)
        with self._lock:
            then, old = self._snapshots[0]
        seconds = max(now - then, 1e-9)
        rows = []
        for (service, method), calls in sorted(current.items()):
            before = old.get((service, method), _Calls())
            codes = {c: n - before.handled.get(c, 0.0) for c, n in calls.handled.items()}
            buckets = [(le, n - before.buckets.get(le, 0.0)) for le, n in calls.buckets.items()]
            rows.append(
                RpcTraffic(
                    service=service,
                    method=method,
                    per_second=(calls.started - before.started) / seconds,
                    p99=histogram_quantile(0.99, buckets),
                    server_errors=sum(n for c, n in codes.items() if c in SERVER_ERROR_CODES),
                    client_errors=sum(n for c, n in codes.items() if c not in SERVER_ERROR_CODES | {"OK"}),
                    total=calls.started,
                    total_server_errors=sum(n for c, n in calls.handled.items() if c in SERVER_ERROR_CODES),
                )
            )
        return seconds, rows


def _versioned(metrics: Metrics) -> dict[str, dict[tuple[str, str], float]]:
    """Per (model, version) values of the versioned series, by sample name."""
    out: dict[str, dict[tuple[str, str], float]] = {}
    for family in metrics.registry.collect():
        for s in family.samples:
            if "model" in s.labels and "version" in s.labels:
                out.setdefault(s.name, {})[(s.labels["model"], s.labels["version"])] = s.value
    return out


def _when(unix_seconds: float) -> str:
    return datetime.fromtimestamp(unix_seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:.4g}"


def _figure(value: object) -> str:
    return "" if value is None else _number(float(value))  # type: ignore[arg-type]


def _table(headings: Iterable[str], rows: Iterable[Iterable[object]], empty: str) -> str:
    """An HTML table, every cell escaped."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headings)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        return f"<p class=empty>{escape(empty)}</p>"
    # a narrow window scrolls the table, not the page
    return f"<div class=wide><table><tr>{head}</tr>{body}</table></div>"


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d1d1f;background:#fff}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse}th,td{padding:.25em .7em;border-bottom:1px solid #ddd;text-align:left}
th{background:#f3f3f5}td{font-variant-numeric:tabular-nums;white-space:nowrap}
td:last-child{white-space:normal;max-width:36em}.meta,.empty{color:#666}
.wide{max-width:100%;overflow-x:auto}
.bad{color:#b00020;font-weight:600}.ok{color:#17702f;font-weight:600}
"""


class StatusPage:
    """Renders ``/`` from the store, the hidden items and the process's own metrics."""

    def __init__(
        self,
        store: ModelStore,
        metrics: Metrics,
        healthy: Callable[[], bool],
        detail: Callable[[], dict],
        hidden: HiddenState | None = None,
        window: TrafficWindow | None = None,
    ):
        self.store, self.metrics, self.healthy, self.detail, self.hidden = (
            store,
            metrics,
            healthy,
            detail,
            hidden,
        )
        self.window = window or TrafficWindow(metrics)
        self.started = time.time()

    def render(self) -> bytes:
        ok = self.healthy()
        health = " · ".join(f"{k}: {v}" for k, v in self.detail().items())
        now = time.time()
        page = (
            "<!doctype html><html lang=en><meta charset=utf-8>"
            '<meta name=viewport content="width=device-width">'
            "<meta http-equiv=refresh content=10>"
            f"<title>ordrec status</title><style>{_STYLE}</style><body>"
            "<h1>ordrec status</h1>"
            f"<p class=meta>{escape(socket.gethostname())} · pid {os.getpid()} · up {_duration(now - self.started)}"
            f" · {escape(_when(now))} · refreshes every 10 s</p>"
            f"<p><span class={'ok' if ok else 'bad'}>{'serving' if ok else 'not serving'}</span>"
            f" · {escape(health)}</p>"
            + self._models()
            + self._gate()
            + self._traffic()
            + self._hidden()
            + '<p class=meta><a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a>'
            ' · <a href="/maps/">/maps/</a> · <a href="/openapi.json">/openapi.json</a></p>'
            "</body></html>"
        )
        return page.encode("utf-8")

    def _versions(self) -> list[tuple[LoadedModel, str, float]]:
        """(model, role, share of users) for every served version: live, then candidate."""
        out = []
        for name, live in sorted(self.store.snapshot().items()):
            candidate = self.store.candidate(name)
            share = candidate.share if candidate else 0.0
            out.append((live, "live", 1.0 - share))
            if candidate is not None:
                out.append((candidate.model, "candidate", share))
        return out

    def _models(self) -> str:
        """Two tables that fit a laptop screen: what each version serves and how it does online,
        then where it comes from."""
        series = _versioned(self.metrics)

        def figure(name: str, key: tuple[str, str]) -> str:
            value = series.get(name, {}).get(key)
            return "" if value is None else _number(value)

        serving, provenance = [], []
        for model, role, share in self._versions():
            key = (model.name, model.version)
            artifact = model.index.artifact
            serving.append(
                (
                    model.name,
                    model.kind,
                    role,
                    model.version,
                    f"{share:.0%}",
                    getattr(model.index, "search", "") or "",
                    figure("ordrec_recommend_users_total", key),
                    figure("ordrec_online_served_total", key),
                    figure("ordrec_online_hits_total", key),
                    figure("ordrec_online_hit_rate", key),
                )
            )
            provenance.append(
                (
                    model.name,
                    model.version,
                    model.created_at,
                    str(artifact.attributes.get("trained_by", "by hand (ordrec-train train)")),
                    _when(model.loaded_at),
                    artifact.data_fingerprint[:16],
                    model.reason,
                )
            )
        serving_headings = (
            "model",
            "kind",
            "role",
            "version",
            "users' share",
            "index",
            "users answered",
            "online: items sampled",
            "online: hits (items)",
            "online: hit rate",
        )
        provenance_headings = (
            "model",
            "version",
            "trained (manifest)",
            "trained by",
            "loaded here",
            "data fingerprint",
            "why this version",
        )
        return (
            "<h2>Models</h2>"
            + _table(serving_headings, serving, "no model loaded")
            + "<p class=meta>Online: a sample of Recommend answers (--online-sample-rate); each"
            " recommended item of a sampled answer counts once, a hit when the user then interacts"
            " with it within --online-window.</p>"
            + "<h2>Versions</h2>"
            + _table(provenance_headings, provenance, "no model loaded")
        )

    def _gate(self) -> str:
        """One row per figure, one column per version (versions are few, figures many: this
        way the table stays narrow): the gate's held-out figures first, the others after."""
        versions = self._versions()
        names = {n for m, _, _ in versions for n in m.index.artifact.metrics}
        ordered = sorted(names, key=lambda n: (not n.startswith(GATE_PREFIX), n))
        rows = [
            (
                name.removeprefix(GATE_PREFIX),
                *(_figure(m.index.artifact.metrics.get(name)) for m, _, _ in versions),
            )
            for name in ordered
        ]
        headings = ("figure", *(f"{m.name} {role} {m.version}" for m, role, _ in versions))
        return (
            "<h2>Evaluation (each version's manifest: the training job's gate, held-out, first)</h2>"
            + _table(headings, rows, "no version records metrics")
        )

    def _traffic(self) -> str:
        seconds, traffic = self.window.traffic()
        rows = [
            (
                t.method if t.service.endswith(".Recommender") else f"{t.service}/{t.method}",
                f"{t.per_second:.2f}",
                "" if t.p99 is None else f"{t.p99 * 1e3:.2f}",
                _number(t.server_errors),
                _number(t.client_errors),
                _number(t.total),
                _number(t.total_server_errors),
            )
            for t in traffic
        ]
        headings = (
            "RPC",
            "calls/s",
            "p99 ms",
            "server errors",
            "client errors",
            "calls since start",
            "server errors since start",
        )
        return f"<h2>Traffic (gRPC and JSON, last {seconds:.0f} s)</h2>" + _table(
            headings, rows, "no calls yet"
        )

    def _hidden(self) -> str:
        if self.hidden is None:
            return ""
        rows = [(scope, f"{len(ids):,}") for scope, ids in sorted(self.hidden.sets().items())]
        stale = " <span class=bad>stale: the last known items apply</span>" if self.hidden.stale else ""
        return f"<h2>Hidden items{stale}</h2>" + _table(
            ("scope (* = every model)", "hidden"), rows, "no hidden items"
        )


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}d {hours}h" if days else f"{hours}h {minutes}m" if hours else f"{minutes}m {secs}s"
