"""The map reports in a real headless Chromium, served by a real ``ordrec-serve``.

Models of the three map kinds are trained on the built-in planted sample
(``trainer.sample``) and published with their report; an ``ordrec-serve``
subprocess serves ``/maps/<model>``; Chromium (Debian's ``chromium``, see
scripts/ensure_chromium.sh) loads each page, driven over the DevTools
protocol by the small stdlib websocket client below (no new dependency).
Checked: no console error or uncaught exception, the number of drawn marks,
that wheel zoom, drag pan and hover labels work with real input events, and a
screenshot per model is saved under test-artifacts/.

Skips when Chromium is missing unless ORDREC_REQUIRE_BROWSER is set.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess
from ordrec.trainer.report_html import report_views

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--mute-audio",
    "--window-size=1280,900",
]


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("ORDREC_REQUIRE_BROWSER"):
        pytest.fail(
            "ORDREC_REQUIRE_BROWSER is set but chromium is not installed (run scripts/ensure_chromium.sh)"
        )
    pytest.skip("chromium is not installed (scripts/ensure_chromium.sh installs it)")


# --------------------------------------------------- a minimal CDP client
class WebSocket:
    """Just enough RFC 6455 for the DevTools protocol: masked text frames out,
    unmasked (possibly fragmented) text frames in, pings answered."""

    def __init__(self, url: str, timeout: float = 30.0):
        assert url.startswith("ws://")
        hostport, _, path = url[5:].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("websocket handshake: connection closed")
            head += chunk
        head, _, self.buffer = head.partition(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket handshake refused: {head[:200]!r}")

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("websocket closed")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            header = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def send(self, text: str) -> None:
        self._send_frame(0x1, text.encode())

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            opcode = b0 & 0x0F
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("websocket closed by the browser")
            message += payload
            if b0 & 0x80:
                return message.decode()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send_frame(0x8, b"")
        self.sock.close()


class Page:
    """One browser tab over the DevTools protocol; keeps every event it sees."""

    def __init__(self, ws_url: str):
        self.ws = WebSocket(ws_url)
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, timeout: float = 30.0, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)
        raise TimeoutError(method)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict:
        seen = next((e for e in self.events if e.get("method") == method), None)
        deadline = time.monotonic() + timeout
        while seen is None and time.monotonic() < deadline:
            message = json.loads(self.ws.recv())
            self.events.append(message)
            if message.get("method") == method:
                seen = message
        if seen is None:
            raise TimeoutError(method)
        return seen

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        found = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(details.get("exception", {}).get("description") or details.get("text", ""))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(json.dumps(params.get("args"))[:500])
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(
                    f"{params['entry'].get('source')}: {params['entry'].get('text')} "
                    f"{params['entry'].get('url', '')}"
                )
        return found

    def mouse(self, kind: str, x: float, y: float, **extra) -> None:
        self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)


@pytest.fixture(scope="module")
def browser():
    binary = chromium_binary()
    profile = tempfile.mkdtemp(prefix="ordrec-chromium-")
    proc = subprocess.Popen(
        [binary, *CHROMIUM_FLAGS, "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode}")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def new_page(devtools: str) -> Page:
    request = urllib.request.Request(f"{devtools}/json/new?about:blank", method="PUT")
    with urllib.request.urlopen(request, timeout=10) as reply:
        target = json.load(reply)
    page = Page(target["webSocketDebuggerUrl"])
    for domain in ("Runtime", "Log", "Page"):
        page.call(f"{domain}.enable")
    return page


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Three map models trained on the built-in sample, published with reports, served."""
    from ordrec.trainer.models import estimator_class
    from ordrec.trainer.sample import planted_attributes, planted_neighbors, planted_ratings

    root = tmp_path_factory.mktemp("registry")
    registry = Registry(root)
    labels = {f"i{i:03d}": f"Item number {i}" for i in range(1, 201)}
    specs = {
        "coe": (planted_ratings(), {"max_iter": 10}, labels),
        "score": (planted_attributes(), {"max_iter": 8}, None),
        "knnscal": (planted_neighbors()[0], {"max_iter": 60}, None),
    }
    expected = {}
    for kind, (data, params, names) in specs.items():
        estimator = estimator_class(kind)(**params).fit(data)
        artifact = estimator.to_artifact()
        registry.publish(f"sample-{kind}", artifact, views=lambda a, n=names: report_views(a, n))
        from ordrec.service.indices.models import index_class

        index = index_class(kind).from_artifact(artifact)
        # every point of every map (the sample is far under the 5,000 cap)
        expected[kind] = sum(len(p.ids) for by_entity in index.maps.values() for p in by_entity.values())
    with ServerProcess(root) as server:
        yield server, expected


@pytest.mark.parametrize("kind", ["coe", "score", "knnscal"])
def test_report_in_headless_chromium(browser, served, kind):
    server, expected = served
    page = new_page(browser)
    try:
        page.call("Page.navigate", url=f"{server.metrics_url}/maps/sample-{kind}")
        page.wait_event("Page.loadEventFired")
        assert page.eval("document.body.dataset.ready") == "1"
        drawn = page.eval("document.querySelectorAll('svg.scatter .pt').length")
        assert drawn == expected[kind] == int(page.eval("document.body.dataset.drawn"))
        assert page.eval("document.title").startswith(f"sample-{kind}")
        ARTIFACTS.mkdir(exist_ok=True)
        shot = page.call("Page.captureScreenshot", format="png")
        png = base64.b64decode(shot["data"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        (ARTIFACTS / f"report-{kind}.png").write_bytes(png)

        # Real input events on the first map: hover shows the mark's label,
        # wheel zooms around the pointer, drag pans.
        box = page.eval(
            "(() => { const r = document.querySelector('#map-1').getBoundingClientRect();"
            " return [r.left, r.top, r.width, r.height]; })()"
        )
        cx, cy = box[0] + box[2] / 2, box[1] + box[3] / 2
        first = "document.querySelector('#map-1 .pt')"
        where = (
            f"(() => {{ const r = {first}.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        before = np.array(page.eval(where))
        page.mouse("mouseMoved", *before)
        tip = page.eval(
            "(() => { const t = document.querySelector('#map-1').parentNode.querySelector('.tip');"
            " return [t.style.display, t.textContent]; })()"
        )
        # the mark under the pointer (the first mark, or one drawn over it)
        title = page.eval(
            f"document.elementFromPoint({before[0]}, {before[1]})"
            ".closest('.pt').querySelector('title').textContent"
        )
        assert tip == ["block", title] and title
        page.mouse("mouseWheel", cx, cy, deltaX=0, deltaY=-400)
        page.eval("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        k = float(page.eval("document.querySelector('#map-1').dataset.k"))
        assert k > 1.5
        after = np.array(page.eval(where))
        # zooming about (cx, cy) scales every offset from it by the same factor
        assert np.allclose(after - [cx, cy], (before - [cx, cy]) * k, atol=1.5)

        page.mouse("mousePressed", cx, cy, button="left", buttons=1, clickCount=1)
        page.mouse("mouseMoved", cx + 40, cy + 25, button="left", buttons=1)
        page.mouse("mouseMoved", cx + 80, cy + 50, button="left", buttons=1)
        page.mouse("mouseReleased", cx + 80, cy + 50, button="left", buttons=0, clickCount=1)
        page.eval("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        panned = np.array(page.eval(where))
        assert np.allclose(panned - after, [80, 50], atol=1.5)
        assert float(page.eval("document.querySelector('#map-1').dataset.k")) == pytest.approx(k)

        if kind == "coe":
            item_titles = page.eval(
                "[...document.querySelectorAll('#map-1 .e-items title')].map(t => t.textContent)"
            )
            assert all(t.startswith("Item number ") for t in item_titles)
        assert page.errors() == []
    finally:
        page.ws.close()


def test_harness_sees_a_broken_page(browser, tmp_path):
    """The checks above can fail: a report whose mark count disagrees with its
    data-points is reported by the page's own check as an uncaught error, and
    the harness sees it (so "no console errors" is a real assertion)."""
    from ordrec.trainer.report_html import render_report
    from tests.test_report import knnscal_artifact

    text = render_report(knnscal_artifact(n=40)).replace('data-points="40"', 'data-points="41"', 1)
    broken = tmp_path / "broken.html"
    broken.write_text(text, encoding="utf-8")
    page = new_page(browser)
    try:
        page.call("Page.navigate", url=broken.as_uri())
        page.wait_event("Page.loadEventFired")
        page.eval("1")  # let pending events arrive
        errors = page.errors()
        assert any("40 marks, expected 41" in e for e in errors), errors
        assert page.eval("document.body.dataset.ready") is None
    finally:
        page.ws.close()
