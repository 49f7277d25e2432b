"""The JSON API and the status page in a real headless Chromium (tests/test_report_browser.py
drives it over the DevTools protocol), served by a real ``ordrec-serve`` with a real Redis.

A shop page on another origin, allowed by ``--http-cors-origin``, calls the API with
``fetch`` (a CORS preflight, then the POST with a bearer token) and gets the gRPC answer;
the same page from an origin not listed cannot; the status page's Content-Security-Policy
stops a script injected into it from sending anything. The status page is screenshot
(test-artifacts/status-page.png; docs/img/status-page.png is a copy) after a split,
traffic over both transports, online hits and hidden items have given it something to show.

Skips when Chromium is missing unless ORDREC_REQUIRE_BROWSER is set.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess, run_cli, wait_for
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.admin_token import ADMIN_FLAGS, ADMIN_TOKEN
from tests.test_report_browser import ARTIFACTS, browser, new_page  # noqa: F401 - browser: a fixture

pytestmark = [pytest.mark.browser, pytest.mark.redis]
TOKEN = "browser-test-token-0123456789"
JOB = """
[job]
name = "dcr-nightly"
registry = "{registry}"

[data.ratings]
path = "{ratings}"
format = "ml-100k"

[[models]]
name = "dcr"
kind = "dcr"
data = "ratings"
params = {{ n_components = 8, max_iter = 8, random_state = {seed} }}
gate = {{ metric = "ndcg_at_10", margin = 0.5, holdout = 0.2, seed = 0, popularity_floor = false }}
"""


class ShopPage(BaseHTTPRequestHandler):
    """A page of another web application: the origin the API's CORS rules are about."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = b"<!doctype html><title>shop</title><p>a shop"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def shop():
    server = ThreadingHTTPServer(("127.0.0.1", 0), ShopPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def registry(sample_dir, tmp_path_factory) -> Path:
    """Two dcr versions published by the training job (so their manifests hold the gate's
    figures), the first pinned live and the second a candidate for 30 % of the users."""
    root = tmp_path_factory.mktemp("browser-registry")
    for seed in (0, 1):
        job = root / f"job{seed}.toml"
        job.write_text(JOB.format(registry=root / "reg", ratings=sample_dir / "ratings.data", seed=seed))
        result = run_cli(["ordrec.trainer", "run", str(job)], check=False)
        assert result.returncode == 0, result.stderr
    registry = Registry(root / "reg")
    first, second = registry.versions("dcr")
    registry.pin("dcr", first)
    registry.set_split("dcr", second, 0.3)
    return root / "reg"


@pytest.fixture(scope="module")
def served(registry, shop, tmp_path_factory):
    from tests.conftest import RedisServer

    redis = RedisServer().start()
    tokens = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens.write_text(TOKEN + "\n")
    args = (
        "--redis",
        redis.url,
        "--online-sample-rate",
        "1",
        "--token-file",
        str(tokens),
        "--http-cors-origin",
        f"http://127.0.0.1:{shop}",
        *ADMIN_FLAGS,
    )
    try:
        with ServerProcess(registry, *args) as server:
            yield server
    finally:
        redis.stop()


FETCH = """
fetch({url!r}, {{
  method: "POST",
  headers: {headers},
  body: {body!r},
}}).then(r => r.json().then(j => [r.status, j]), e => ["failed", e.name + ": " + e.message])
"""


SCREEN_WIDTH = 1400  # a laptop's browser window: every table of the status page fits it
# each table (or the page) that does not fit the window: its first heading and its width
OVERFLOWING = """
[...document.querySelectorAll('table')]
  .filter(t => t.getBoundingClientRect().right > document.documentElement.clientWidth)
  .map(t => [[...t.querySelectorAll('th')].map(h => h.textContent).join('|'), t.getBoundingClientRect().width])
  .concat(document.documentElement.scrollWidth > document.documentElement.clientWidth
          ? [['page', document.documentElement.scrollWidth]] : [])
"""
# the Models table's online hits and hit rate, a pair per row
ONLINE_COLUMNS = """
(() => {
  const table = [...document.querySelectorAll('table')]
    .find(t => [...t.querySelectorAll('th')].some(h => h.textContent.startsWith('online: hits')));
  if (!table) return [];
  const heads = [...table.querySelectorAll('th')].map(h => h.textContent);
  const hits = heads.findIndex(h => h.startsWith('online: hits'));
  const rate = heads.findIndex(h => h.startsWith('online: hit rate'));
  return [...table.querySelectorAll('tr')].slice(1)
    .map(r => [r.cells[hits].textContent, r.cells[rate].textContent]);
})()
"""


def fetch(page, url: str, body: dict, token: str | None = TOKEN):
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    return page.eval(FETCH.format(url=url, headers=json.dumps(headers), body=json.dumps(body)))


def test_a_page_of_an_allowed_origin_calls_the_api_with_fetch(browser, served, shop, registry):  # noqa: F811
    api = served.metrics_url
    request = {"model": "dcr", "userIds": ["u001", "u002", "u003", "u004"], "n": 5}
    page = new_page(browser)
    try:
        page.call("Page.navigate", url=f"http://127.0.0.1:{shop}/")
        page.wait_event("Page.loadEventFired")
        status, answer = fetch(page, f"{api}/v1/Recommend", request)
        with grpc.insecure_channel(served.target) as channel:
            reply = recommender_pb2_grpc.RecommenderStub(channel).Recommend(
                json_format.ParseDict(request, pb.RecommendRequest()),
                metadata=[("authorization", f"Bearer {TOKEN}")],
                timeout=10,
            )
        assert status == 200
        assert answer == json_format.MessageToDict(reply, always_print_fields_with_no_presence=True)
        assert {r["modelVersion"] for r in answer["results"]} <= set(Registry(registry).versions("dcr"))
        status, error = fetch(page, f"{api}/v1/Recommend", request, token=None)
        assert status == 401 and error["status"] == "UNAUTHENTICATED"  # readable: CORS on errors too
        assert page.errors() and all("status of 401" in e for e in page.errors()), page.errors()
    finally:
        page.ws.close()


def test_a_page_of_another_origin_cannot(browser, served, shop):  # noqa: F811
    page = new_page(browser)
    try:
        page.call("Page.navigate", url=f"http://localhost:{shop}/")  # same page, origin not listed
        page.wait_event("Page.loadEventFired")
        result = fetch(page, f"{served.metrics_url}/v1/ListModels", {})
        assert result[0] == "failed" and result[1].startswith("TypeError"), result
    finally:
        page.ws.close()
    text = urllib.request.urlopen(served.metrics_url + "/metrics", timeout=5).read().decode()
    assert 'ordrec_http_requests_total{code="403",handler="(preflight)"}' in text


def test_the_status_page_policy_stops_injected_scripts_from_sending(browser, served):  # noqa: F811
    page = new_page(browser)
    try:
        page.call("Page.navigate", url=f"{served.metrics_url}/")
        page.wait_event("Page.loadEventFired")
        result = fetch(page, f"{served.metrics_url}/v1/ListModels", {})
        assert result[0] == "failed", result  # connect-src falls back to default-src 'none'
        assert any("Content Security Policy" in e for e in page.errors()), page.errors()
    finally:
        page.ws.close()


def metric_sum(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_status_page_in_headless_chromium(browser, served, shop):  # noqa: F811
    api = served.metrics_url
    page = new_page(browser)
    try:
        page.call("Page.navigate", url=f"http://127.0.0.1:{shop}/")
        page.wait_event("Page.loadEventFired")
        users = [f"u{i:03d}" for i in range(1, 41)]
        status, answer = fetch(page, f"{api}/v1/Recommend", {"model": "dcr", "userIds": users, "n": 10})
        assert status == 200
        with grpc.insecure_channel(served.target) as channel:
            stub = recommender_pb2_grpc.RecommenderStub(channel)
            for user in users:
                stub.Recommend(
                    pb.RecommendRequest(model="dcr", user_ids=[user], n=10),
                    metadata=[("authorization", f"Bearer {TOKEN}")],
                    timeout=10,
                )
        wait_for(lambda: metric_sum(api, "ordrec_online_served_total") > 0, 10, what="online samples")
        for result in answer["results"][:20]:  # half the users act on their first recommendation
            body = {"userId": result["userId"], "itemIds": [result["items"][0]["id"]]}
            assert fetch(page, f"{api}/v1/RecordInteractions", body)[0] == 200
        hide_some = {"model": "dcr", "itemIds": ["i001", "i002", "i003"]}
        assert (
            fetch(page, f"{api}/v1/HideItems", hide_some, token=TOKEN)[0] == 403  # an admin call
        )
        assert fetch(page, f"{api}/v1/HideItems", hide_some, token=ADMIN_TOKEN)[0] == 200
        assert (
            fetch(page, f"{api}/v1/HideItems", {"model": "*", "itemIds": ["i200"]}, token=ADMIN_TOKEN)[0]
            == 200
        )
        wait_for(lambda: metric_sum(api, "ordrec_online_hits_total") > 0, 10, what="online hits")
    finally:
        page.ws.close()
    page = new_page(browser)  # a fresh tab: the first one's load event is in its event list
    try:
        page.call(
            "Emulation.setDeviceMetricsOverride",
            width=SCREEN_WIDTH,
            height=900,
            deviceScaleFactor=1,
            mobile=False,
        )
        page.call("Page.navigate", url=f"{api}/")
        page.wait_event("Page.loadEventFired")
        text = page.eval("document.body.innerText")
        for words in (
            "serving",
            "candidate",
            "30%",
            "70%",
            "ndcg_at_10",
            "hit_rate_at_10",
            "Recommend",
            "Hidden items",
        ):
            assert words in text, words
        rows = page.eval("document.querySelectorAll('table tr').length")
        assert rows > 10
        shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        png = base64.b64decode(shot["data"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "status-page.png").write_bytes(png)
        assert page.eval(OVERFLOWING) == [], f"tables wider than a {SCREEN_WIDTH} px window"
        online = page.eval(ONLINE_COLUMNS)
        assert online and all(rate == "" or hits != "" for hits, rate in online), online
        assert page.errors() == []
    finally:
        page.ws.close()
