"""The HTTP side port: the JSON API (``POST /v1/<Rpc>``, ``/openapi.json``), the status
page (``/``), Prometheus ``/metrics``, ``/healthz`` and the map reports (``/maps``).

``/maps/<model>`` serves the HTML report of the served version of a map
model: the ``report.html`` view its manifest lists, verified and read once at
load, under a Content-Security-Policy that runs only the scripts the manifest
names. Nothing is read from disk per request.

The port is bounded against slow and greedy clients: a request (line, headers, body)
must arrive within ``HttpSettings.read_timeout`` seconds or its connection is cut (408);
at most ``max_connections`` are open, and over that the oldest one still sending its
request is closed to make room (503 when every open one is being answered); bodies over
the message limit are refused before they are read (413). The JSON calls themselves are
``service/serving/gateway.py``'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ordrec.service.config import HttpSettings
from ordrec.service.metrics import Metrics
from ordrec.service.serving.gateway import JSON_TYPE, HttpError, JsonGateway
from ordrec.service.serving.openapi import openapi_document
from ordrec.service.serving.status_page import StatusPage
from ordrec.service.serving.store import ModelStore

log = logging.getLogger("ordrec.http")
REPORT_FILE = "report.html"
_MAP_PATH = re.compile(r"^/maps/([a-z0-9][a-z0-9_.-]{0,63})/?$")
_RPC_PATH = re.compile(r"^/v1/([^/]{0,200})$")
_PAGE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_GET_HANDLERS = ("/", "/metrics", "/healthz", "/maps", "/openapi.json")
_READ_CHUNK = 1 << 16


def content_security_policy(script_hashes: tuple[str, ...] = ()) -> str:
    scripts = " ".join(f"'sha256-{h}'" for h in script_hashes) or "'none'"
    return (
        f"default-src 'none'; script-src {scripts}; style-src 'unsafe-inline'; img-src data:;"
        " base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


class ReadDeadlines:
    """Connections still sending a request, each with the time it must be done by. A
    thread shuts the reading side of a late one, which wakes its handler's blocked read,
    so no client holds a thread past the timeout however slowly it trickles bytes."""

    def __init__(self, timeout: float, tick: float = 0.2):
        self.timeout, self.tick = timeout, tick
        self._due: dict[socket.socket, float] = {}
        self._cut: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="ordrec-http-deadlines", daemon=True).start()

    def arm(self, conn: socket.socket) -> None:
        with self._lock:
            self._due[conn] = time.monotonic() + self.timeout

    def disarm(self, conn: socket.socket) -> bool:
        """Stop the clock of ``conn``; True when it was cut for being late."""
        with self._lock:
            self._due.pop(conn, None)
            return conn in self._cut

    def is_cut(self, conn: socket.socket) -> bool:
        with self._lock:
            return conn in self._cut

    def forget(self, conn: socket.socket) -> None:
        with self._lock:
            self._due.pop(conn, None)
            self._cut.discard(conn)

    def evict_oldest(self) -> bool:
        """Cut the connection that has been sending its request longest; False when none is."""
        with self._lock:
            if not self._due:
                return False
            self._shut(min(self._due, key=self._due.__getitem__))
            return True

    def stop(self) -> None:
        self._stop.set()

    def _shut(self, conn: socket.socket) -> None:
        del self._due[conn]
        self._cut.add(conn)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RD)  # the reply side stays open for a 408

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            now = time.monotonic()
            with self._lock:
                for conn in [c for c, due in self._due.items() if due <= now]:
                    self._shut(conn)


class HttpServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them (see the module doc)."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address, handler, settings: HttpSettings, metrics: Metrics):
        super().__init__(address, handler)
        self.settings, self.metrics = settings, metrics
        self.deadlines = ReadDeadlines(settings.read_timeout)
        self._open = 0
        self._lock = threading.Lock()

    def process_request(self, request, client_address) -> None:
        with self._lock:
            admitted = self._open < self.settings.max_connections or self.deadlines.evict_oldest()
            if admitted:
                self._open += 1
        if admitted:
            super().process_request(request, client_address)
        else:
            self._refuse(request)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.deadlines.forget(request)
            with self._lock:
                self._open -= 1

    def _refuse(self, request: socket.socket) -> None:
        body = HttpError(grpc.StatusCode.UNAVAILABLE, "too many open connections: try again", 503).body()
        head = (
            f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: {JSON_TYPE}\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
        )
        try:
            request.settimeout(0.5)
            request.sendall(head.encode() + body)
        except OSError:
            pass
        self.metrics.http_requests.labels("(connection)", "503").inc()
        self.shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        """A client that left or stopped reading (the write timed out) is routine: logged at
        debug, not as a traceback on stderr (socketserver's default)."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            log.debug("HTTP connection from %s ended: %s", client_address[0], error)
        else:
            log.error("HTTP request from %s failed", client_address[0], exc_info=error)

    def server_close(self) -> None:
        self.deadlines.stop()
        super().server_close()


class _Handler(BaseHTTPRequestHandler):
    server_version = "ordrec"
    protocol_version = "HTTP/1.1"
    # headers and body leave in two writes: with Nagle, the body waits for the client's
    # delayed ACK of the headers (40 ms a call on a keep-alive connection)
    disable_nagle_algorithm = True
    server: HttpServer
    metrics: Metrics
    store: ModelStore
    gateway: JsonGateway
    status_page: StatusPage
    openapi: bytes
    healthy: Callable[[], bool]
    detail: Callable[[], dict]

    # ------------------------------------------------------------ plumbing
    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def handle_one_request(self) -> None:
        self._unread = False
        self._head_only = False
        self.server.deadlines.arm(self.connection)
        try:
            super().handle_one_request()
        finally:
            self.server.deadlines.disarm(self.connection)

    def handle_expect_100(self) -> bool:
        """Answer "100 Continue" only to a body the JSON API would read: one declared over the
        message limit gets its 413 before the client sends it (not a reset mid-upload)."""
        declared = self.headers.get("Content-Length", "").strip()
        if declared.isdigit() and int(declared) > self.gateway.servicer.limits.max_message_bytes:
            return True  # no 100: do_POST answers 413 and closes the connection
        return super().handle_expect_100()

    def _received(self) -> bool:
        """The request line and headers are in: stop the clock, except for a POST's (it runs
        on through the body). False, with a 408 sent, when they came too late."""
        length = self.headers.get("Content-Length", "0").strip()
        self._unread = bool(self.headers.get("Transfer-Encoding")) or length not in ("", "0")
        if self.server.deadlines.is_cut(self.connection):
            self._send_error("other", self._late())
            return False
        if self.command != "POST":
            self.server.deadlines.disarm(self.connection)
        return True

    def _late(self) -> HttpError:
        return HttpError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"the request did not arrive within {self.server.settings.read_timeout:g} s",
            408,
        )

    def _path(self) -> str:
        return self.path.split("?", 1)[0]

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        policy: str | None = None,
        handler: str = "other",
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        if self._unread:  # a body left unread cannot be skipped safely: end the connection
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", policy or content_security_policy())
        for header, value in (*_PAGE_HEADERS.items(), *headers):
            self.send_header(header, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if not self._head_only:
            self.wfile.write(body)
        self.metrics.http_requests.labels(handler, str(status)).inc()

    def _send_json(self, handler: str, status: int, body: bytes, headers=()) -> None:
        self._send(
            status,
            body,
            JSON_TYPE,
            handler=handler,
            headers=(("Cache-Control", "no-store"), *self._cors(), *headers),
        )

    def _send_error(self, handler: str, error: HttpError, headers=()) -> None:
        self._send_json(handler, error.http_status, error.body(), headers)

    def log_message(self, fmt: str, *args) -> None:  # quiet: access logs go to debug
        log.debug("%s %s", self.address_string(), fmt % args)

    # ----------------------------------------------------------------- GET
    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._head_only = True
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if not self._received():
            return
        path = self._path()
        if path == "/":
            self._send(200, self.status_page.render(), "text/html; charset=utf-8", handler="/")
        elif path == "/openapi.json":
            self._send_json("/openapi.json", 200, self.openapi)
        elif path == "/metrics":
            self._send(200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST, handler="/metrics")
        elif path == "/healthz":
            ok = self.healthy()
            lines = ["serving" if ok else "not serving"] + [f"{k}: {v}" for k, v in self.detail().items()]
            self._send(
                200 if ok else 503, ("\n".join(lines) + "\n").encode(), "text/plain", handler="/healthz"
            )
        elif path in ("/maps", "/maps/"):
            self._send(200, self._map_index(), "text/html; charset=utf-8", handler="/maps")
        elif match := _MAP_PATH.match(path):
            self._send_report(match.group(1))
        elif _RPC_PATH.match(path):
            self._not_allowed()
        else:
            self._send(404, b"not found: try /, /metrics, /healthz, /maps/ or /openapi.json\n", "text/plain")

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
            self._send(404, f"no report for model {name!r}\n".encode(), "text/plain", handler="/maps")
            return
        policy = content_security_policy(report.script_hashes)
        self._send(200, report.data, "text/html; charset=utf-8", policy, handler="/maps")

    # ------------------------------------------------------------ the JSON API
    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        if not self._received():
            return
        match = _RPC_PATH.match(self._path())
        if not match:
            self._not_allowed()
            return
        try:
            method = self.gateway.method(match.group(1))
        except HttpError as exc:
            self._send_error("/v1/(unknown)", exc)
            return
        handler = f"/v1/{method.name}"
        headers = [(k.lower(), v) for k, v in self.headers.items()]
        try:
            reply = self.gateway.call(method, headers, self._read_body, self.address_string())
        except HttpError as exc:
            extra = (("WWW-Authenticate", "Bearer"),) if exc.http_status == 401 else ()
            self._send_error(handler, exc, extra)
        else:
            self._send_json(handler, 200, reply)

    def _read_body(self) -> bytes:
        """The request body, after the transport's checks: a JSON content type (415), a
        Content-Length (411) within the message limit (413), all of it within the read
        timeout (408). Called by the gateway once the token is checked."""
        limit = self.gateway.servicer.limits.max_message_bytes
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        media, _, params = (self.headers.get("Content-Type") or "").partition(";")
        charset = params.strip().lower().removeprefix("charset=").strip('"')
        if media.strip().lower() != JSON_TYPE or (params.strip() and charset not in ("utf-8", "utf8")):
            shown = (self.headers.get("Content-Type") or "none")[:100]
            raise HttpError(invalid, f"the body must be {JSON_TYPE} (UTF-8), not {shown!r}", 415)
        if self.headers.get("Transfer-Encoding"):
            raise HttpError(invalid, "send the body with a Content-Length, not a Transfer-Encoding", 411)
        if len(self.headers.get_all("Content-Length", [])) > 1:
            raise HttpError(invalid, "the request has more than one Content-Length", 400)
        text = self.headers.get("Content-Length", "0")  # none and no Transfer-Encoding: no body
        if not text.strip().isdigit():
            raise HttpError(invalid, f"Content-Length {text[:40]!r} is not a byte count", 400)
        length = int(text)
        if length > limit:
            raise HttpError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the body is {length:,} bytes, over the JSON API's {limit:,}-byte limit (--http-max-message-bytes)",
                413,
            )
        chunks, received, stalled = [], 0, False
        try:
            while received < length:
                chunk = self.rfile.read(min(_READ_CHUNK, length - received))
                if not chunk:
                    break
                chunks.append(chunk)
                received += len(chunk)
        except OSError:  # TimeoutError included: no byte for a whole read timeout
            stalled = True
        late = self.server.deadlines.disarm(self.connection) or stalled
        if received < length:
            self.close_connection = True
            if late:
                raise self._late()
            raise HttpError(invalid, f"the body ended after {received:,} of {length:,} bytes", 400)
        self._unread = False
        return b"".join(chunks)

    def _cors(self) -> tuple[tuple[str, str], ...]:
        """CORS headers for a page of an origin ``--http-cors-origin`` lists (none else)."""
        origin, allowed = self.headers.get("Origin"), self.server.settings.cors_origins
        if not origin or not allowed:
            return ()
        if "*" in allowed:
            return (("Access-Control-Allow-Origin", "*"),)
        if origin in allowed:
            return (("Access-Control-Allow-Origin", origin), ("Vary", "Origin"))
        return ()

    def do_OPTIONS(self) -> None:  # noqa: N802 - http.server's naming
        """A browser's CORS preflight of ``POST /v1/<Rpc>`` (not allowed when no origin may call)."""
        if not self._received():
            return
        match = _RPC_PATH.match(self._path())
        if not match or match.group(1) not in self.gateway.methods or not self.server.settings.cors_origins:
            self._not_allowed()
            return
        cors = self._cors()
        if not cors:
            origin = (self.headers.get("Origin") or "none")[:100]
            message = f"origin {origin!r} may not call this API from a browser (--http-cors-origin)"
            self._send_error("(preflight)", HttpError(grpc.StatusCode.PERMISSION_DENIED, message))
            return
        allow = (
            ("Access-Control-Allow-Methods", "POST"),
            ("Access-Control-Allow-Headers", "authorization, content-type"),
            ("Access-Control-Max-Age", "600"),
        )
        self._send(204, b"", JSON_TYPE, handler="(preflight)", headers=(*cors, *allow))

    def _not_allowed(self) -> None:
        path = self._path()
        api = path.startswith("/v1/")
        # OPTIONS only where it can answer: a preflight, for the origins --http-cors-origin lists
        preflight = ", OPTIONS" if self.server.settings.cors_origins else ""
        allow = f"POST{preflight}" if api else "GET, HEAD"
        message = f"{self.command} is not allowed on {path[:100]}: " + (
            "call an RPC with POST and a JSON body" if api else "only GET and HEAD are"
        )
        error = HttpError(grpc.StatusCode.UNIMPLEMENTED, message, 405)
        self._send_error("(method)", error, (("Allow", allow),))

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        if self._received():
            self._not_allowed()

    do_DELETE = do_PATCH = do_PUT


def start_http_server(
    host: str,
    port: int,
    metrics: Metrics,
    store: ModelStore,
    healthy: Callable[[], bool],
    detail: Callable[[], dict],
    *,
    gateway: JsonGateway,
    status_page: StatusPage,
    settings: HttpSettings,
) -> HttpServer:
    openapi = json.dumps(openapi_document(secured=gateway.secured), indent=1).encode()
    handler = type(
        "Handler",
        (_Handler,),
        {
            "metrics": metrics,
            "store": store,
            "gateway": gateway,
            "status_page": status_page,
            "openapi": openapi,
            "timeout": settings.read_timeout,  # per socket operation, beside the whole-request deadline
            "healthy": staticmethod(healthy),
            "detail": staticmethod(detail),
        },
    )
    server = HttpServer((host, port), handler, settings, metrics)
    threading.Thread(target=server.serve_forever, name="ordrec-http", daemon=True).start()
    return server
