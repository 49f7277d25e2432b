"""The HTTP side port: Prometheus ``/metrics``, ``/healthz`` and the map reports.

``/maps/<model>`` serves the HTML report of the served version of a map
model: the ``report.html`` view its manifest lists, verified and read once at
load, under a Content-Security-Policy that runs only the scripts the manifest
names. Nothing is read from disk per request.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ordrec.service.metrics import Metrics
from ordrec.service.store import ModelStore

log = logging.getLogger("ordrec.http")
REPORT_FILE = "report.html"
_MAP_PATH = re.compile(r"^/maps/([a-z0-9][a-z0-9_.-]{0,63})/?$")
_PAGE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def content_security_policy(script_hashes: tuple[str, ...] = ()) -> str:
    scripts = " ".join(f"'sha256-{h}'" for h in script_hashes) or "'none'"
    return (
        f"default-src 'none'; script-src {scripts}; style-src 'unsafe-inline'; img-src data:;"
        " base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


class _Handler(BaseHTTPRequestHandler):
    server_version = "ordrec"
    metrics: Metrics
    store: ModelStore
    healthy: Callable[[], bool]
    detail: Callable[[], dict]

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._head_only = True
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            ok = self.healthy()
            lines = ["serving" if ok else "not serving"] + [f"{k}: {v}" for k, v in self.detail().items()]
            self._send(200 if ok else 503, ("\n".join(lines) + "\n").encode(), "text/plain")
        elif path in ("/maps", "/maps/"):
            self._send(200, self._map_index(), "text/html; charset=utf-8")
        elif match := _MAP_PATH.match(path):
            self._send_report(match.group(1))
        else:
            self._send(404, b"not found: try /metrics, /healthz or /maps/\n", "text/plain")

    def _map_index(self) -> bytes:
        links = "".join(
            f'<li><a href="/maps/{name}">{name}</a> ({m.kind} {m.version})</li>'
            for name, m in sorted(self.store.snapshot().items())
            if REPORT_FILE in m.index.artifact.views
        )
        return (
            f"<!doctype html><title>ordrec maps</title><ul>{links or '<li>no map reports</li>'}</ul>".encode()
        )

    def _send_report(self, name: str) -> None:
        model = self.store.snapshot().get(name)
        report = model.index.artifact.views.get(REPORT_FILE) if model else None
        if report is None:
            self._send(404, f"no report for model {name!r}\n".encode(), "text/plain")
            return
        self._send(
            200, report.data, "text/html; charset=utf-8", content_security_policy(report.script_hashes)
        )

    def _send(self, status: int, body: bytes, content_type: str, policy: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", policy or content_security_policy())
        for header, value in _PAGE_HEADERS.items():
            self.send_header(header, value)
        self.end_headers()
        if not getattr(self, "_head_only", False):
            self.wfile.write(body)

    def log_message(self, fmt: str, *args) -> None:  # quiet: access logs go to debug
        log.debug("%s %s", self.address_string(), fmt % args)


def start_http_server(
    host: str,
    port: int,
    metrics: Metrics,
    store: ModelStore,
    healthy: Callable[[], bool],
    detail: Callable[[], dict],
) -> ThreadingHTTPServer:
    handler = type(
        "Handler",
        (_Handler,),
        {
            "metrics": metrics,
            "store": store,
            "healthy": staticmethod(healthy),
            "detail": staticmethod(detail),
        },
    )
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="ordrec-http", daemon=True).start()
    return server
