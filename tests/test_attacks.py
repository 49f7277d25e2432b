"""What an outside attacker and a careless operator tried, against a real server process.

Each scenario failed on the server before the hardening it names (issue 15) and must
keep passing: stream floods and stalled readers, a tampered registry, replies over the
message limit, cancellations counted as errors, unknown models, Health/List.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ordrec.service.artifacts import Artifact, Registry
from ordrec.service.idmap import IdMap
from ordrec.tools.process import ServerProcess, wait_for
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent


def big_map(n_items: int = 20_000, seed: int = 0) -> Artifact:
    """A COE map large enough that a stream of all its points outruns HTTP/2 flow control."""
    rng = np.random.default_rng(seed)
    n_users = 10
    return Artifact(
        kind="coe",
        arrays={
            "user_coords": rng.normal(size=(n_users, 2)),
            "item_coords": rng.normal(size=(n_items, 2)),
            "seen_indptr": np.zeros(n_users + 1, np.int64),
            "seen_indices": np.zeros(0, np.int32),
            "item_popularity": np.ones(n_items, np.float32),
        },
        ids={
            "users": IdMap([f"u{u}" for u in range(n_users)]),
            "items": IdMap([f"item-{i:08d}" for i in range(n_items)]),
        },
        hyperparameters={"dim": 2, "function": "sigmoid"},
    )


@pytest.fixture(scope="module")
def attack_registry(sample_registry, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("attack-registry")
    source, target = Registry(sample_registry), Registry(root)
    target.publish("dcr", source.load("dcr", mmap=False))
    target.publish("bigmap", big_map())
    return root


# A reader that stops reading: without BDP probing the client's HTTP/2 window stays at its
# initial 64 KiB, so the server's writes block once that much is unread. A local subchannel
# pool gives each channel a connection of its own (grpc shares them otherwise).
STALLED_READER = [("grpc.http2.bdp_probe", 0), ("grpc.use_local_subchannel_pool", 1)]


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(server.metrics_url + "/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        named = line.startswith(name + "{") or line.startswith(name + " ")
        if named and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def recommend_latencies(target: str, seconds: float) -> tuple[list[float], list[str]]:
    latencies, errors = [], []
    with grpc.insecure_channel(target) as channel:
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        request = pb.RecommendRequest(model="dcr", user_ids=["u001"], n=10)
        stub.Recommend(request, timeout=5)  # connect before timing
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.perf_counter()
            try:
                stub.Recommend(request, timeout=3)
                latencies.append(time.perf_counter() - start)
            except grpc.RpcError as exc:
                errors.append(exc.code().name)
    return latencies, errors


# ------------------------------------------------------------------ streams
def test_open_and_stalled_streams_cannot_starve_unary_calls(attack_registry):
    watch = health_pb2.HealthCheckRequest(service="")
    with ServerProcess(attack_registry) as server:
        channels = [grpc.insecure_channel(server.target, options=STALLED_READER) for _ in range(15)]
        try:
            calls = []
            for channel in channels[:5]:  # 50 Coordinates streams nobody reads
                stub = recommender_pb2_grpc.RecommenderStub(channel)
                calls += [
                    stub.Coordinates(pb.CoordinatesRequest(model="bigmap", page_size=1), timeout=60)
                    for _ in range(10)
                ]
            for channel in channels[5:]:  # 200 health Watch streams, no token needed
                stub = health_pb2_grpc.HealthStub(channel)
                calls += [stub.Watch(watch, timeout=60) for _ in range(20)]
            wait_for(
                lambda: metric(server, "grpc_server_started_total", grpc_type="server_stream") >= 16,
                10,
                what="the streams to reach the server",
            )
            latencies, errors = recommend_latencies(server.target, seconds=5)
            health = health_pb2_grpc.HealthStub(channels[-1]).Check(watch, timeout=2)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            for call in calls:
                call.cancel()
            for channel in channels:
                channel.close()
        assert errors == []
        p50, p99 = np.quantile(latencies, [0.5, 0.99])
        print(
            f"Recommend under the stream flood: {len(latencies)} calls, p50 {p50 * 1e3:.2f} ms,"
            f" p99 {p99 * 1e3:.2f} ms, 0 errors"
        )
        assert len(latencies) > 100 and p99 < 0.050, (len(latencies), p99)
        assert metric(server, "grpc_server_handled_total", grpc_code="RESOURCE_EXHAUSTED") > 0


def test_a_stream_the_client_stopped_reading_is_ended_and_its_slot_freed(attack_registry):
    args = ("--max-streams", "2", "--stream-stall-seconds", "1")
    with (
        ServerProcess(attack_registry, *args) as server,
        grpc.insecure_channel(server.target, options=STALLED_READER) as stalled,
        grpc.insecure_channel(server.target) as reader,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(stalled)
        calls = [
            stub.Coordinates(pb.CoordinatesRequest(model="bigmap", page_size=1), timeout=60) for _ in range(2)
        ]
        wait_for(
            lambda: metric(server, "ordrec_streams_ended_total", reason="stalled") == 2,
            15,
            what="the stalled streams to be ended",
        )
        wait_for(lambda: metric(server, "ordrec_open_streams") == 0, 5, what="their slots to be freed")
        pages = list(
            recommender_pb2_grpc.RecommenderStub(reader).Coordinates(
                pb.CoordinatesRequest(model="bigmap", page_size=5000), timeout=30
            )
        )
        assert sum(len(p.points) for p in pages) == 20_000
        for call in calls:
            call.cancel()


def test_a_stream_open_too_long_is_ended(attack_registry):
    with (
        ServerProcess(attack_registry, "--stream-max-seconds", "1") as server,
        grpc.insecure_channel(server.target) as channel,
    ):
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=30
        )
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            for _ in watch:
                pass
        assert info.value.code() == grpc.StatusCode.CANCELLED and time.monotonic() - start < 5
        assert metric(server, "ordrec_streams_ended_total", reason="expired") == 1


def test_the_server_refuses_a_stream_limit_that_could_take_every_worker(attack_registry):
    with pytest.raises(RuntimeError, match="must be below --workers"):
        ServerProcess(attack_registry, "--workers", "4", "--max-streams", "4", startup_timeout=20).start()


# ---------------------------------------------------------- status codes
def test_a_cancelled_stream_is_counted_cancelled_not_unknown(attack_registry):
    with ServerProcess(attack_registry) as server, grpc.insecure_channel(server.target) as channel:
        call = recommender_pb2_grpc.RecommenderStub(channel).Coordinates(
            pb.CoordinatesRequest(model="bigmap", page_size=10), timeout=30
        )
        next(call)
        call.cancel()
        labels = {"grpc_method": "Coordinates"}
        wait_for(
            lambda: metric(server, "grpc_server_handled_total", grpc_code="CANCELLED", **labels) == 1,
            10,
            what="the cancelled stream to be counted",
        )
        assert metric(server, "grpc_server_handled_total", grpc_code="UNKNOWN", **labels) == 0


def test_a_reply_over_the_message_limit_is_refused_before_any_work(attack_registry):
    users = [f"attacker-{i:04d}" for i in range(1000)]
    request = pb.RecommendRequest(model="dcr", user_ids=users, n=1000, with_distribution=True)
    with ServerProcess(attack_registry) as server, grpc.insecure_channel(server.target) as channel:
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        start = time.perf_counter()
        with pytest.raises(grpc.RpcError) as info:
            stub.Recommend(request, timeout=10)
        assert time.perf_counter() - start < 0.5
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "user_ids x n=1000 with_distribution" in info.value.details()
        assert metric(server, "grpc_server_handled_total", grpc_method="Recommend", grpc_code="OK") == 0
        # the same request within the limit is answered in full
        fits = stub.Recommend(
            pb.RecommendRequest(model="dcr", user_ids=users[:20], n=1000, with_distribution=True), timeout=30
        )
        assert len(fits.results) == 20 and all(r.items for r in fits.results)


def test_every_rpc_with_a_sized_reply_checks_it_before_work(attack_registry):
    with (
        ServerProcess(attack_registry, "--max-message-bytes", "8192") as server,
        grpc.insecure_channel(server.target) as channel,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        calls = {
            "k=1000": lambda k: stub.Neighbors(
                pb.NeighborsRequest(model="bigmap", id="item-00000001", k=k), timeout=5
            ),
            "page_size=5000": lambda k: list(
                stub.Coordinates(pb.CoordinatesRequest(model="bigmap", page_size=k * 5), timeout=5)
            ),
        }
        for field, call in calls.items():
            with pytest.raises(grpc.RpcError) as info:
                call(1000)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in info.value.details()
        assert len(calls["k=1000"](10).neighbors) == 10
        assert metric(server, "grpc_server_handled_total", grpc_code="RESOURCE_EXHAUSTED") == 0


def test_feature_settings_are_bounded_before_work(attack_registry):
    """Explanations, diversity and SimilarItems baskets: oversized or out-of-range settings are
    INVALID_ARGUMENT naming the field, and the largest allowed basket is answered quickly."""
    users = [f"attacker-{i:04d}" for i in range(1000)]
    with ServerProcess(attack_registry) as server, grpc.insecure_channel(server.target) as channel:
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        refused = {
            "explain=20": pb.RecommendRequest(model="dcr", user_ids=users, n=1000, explain=20),
            "explain must be": pb.RecommendRequest(model="dcr", user_ids=["u001"], n=5, explain=10**6),
            "diversity must be": pb.RecommendRequest(
                model="dcr", user_ids=["u001"], n=5, diversity=float("inf")
            ),
            "max_per_attribute.attribute is": pb.RecommendRequest(
                model="dcr",
                user_ids=["u001"],
                n=5,
                max_per_attribute=pb.AttributeCap(attribute="g" * 10**5, max=1),
            ),
        }
        for field, request in refused.items():
            start = time.perf_counter()
            with pytest.raises(grpc.RpcError) as info:
                stub.Recommend(request, timeout=10)
            assert time.perf_counter() - start < 0.5
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in info.value.details()
        too_many = pb.SimilarItemsRequest(
            model="bigmap", item_ids=[f"item-{i:08d}" for i in range(5000)], n=5
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.SimilarItems(too_many, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "item_ids" in info.value.details()
        largest = pb.SimilarItemsRequest(
            model="bigmap", item_ids=[f"item-{i:08d}" for i in range(1000)], n=1000
        )
        start = time.perf_counter()
        reply = stub.SimilarItems(largest, timeout=10)
        assert len(reply.items) == 1000 and time.perf_counter() - start < 3
        assert metric(server, "grpc_server_handled_total", grpc_code="INTERNAL") == 0


def test_client_mistakes_never_fire_the_documented_error_alert(attack_registry):
    alert = re.search(
        r'alert: OrdrecErrors.*?grpc_code=~"([^"]+)"', (ROOT / "docs" / "service.md").read_text(), re.S
    ).group(1)
    mistakes = [
        lambda s: s.Recommend(pb.RecommendRequest(model="absent", user_ids=["u1"], n=3), timeout=5),
        lambda s: s.Recommend(pb.RecommendRequest(model="dcr", user_ids=["u1"], n=0), timeout=5),
        lambda s: s.Neighbors(pb.NeighborsRequest(model="bigmap", id="nobody", k=3), timeout=5),
        lambda s: s.Tags(pb.TagsRequest(model="dcr", user_id="u", item_id="i", n=3), timeout=5),
    ]
    with ServerProcess(attack_registry) as server, grpc.insecure_channel(server.target) as channel:
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        codes = []
        for mistake in mistakes * 5:
            with pytest.raises(grpc.RpcError) as info:
                mistake(stub)
            codes.append(info.value.code().name)
        assert codes[:4] == ["NOT_FOUND", "INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION"]
        assert not [c for c in codes if re.fullmatch(alert, c)], codes
        fired = sum(metric(server, "grpc_server_handled_total", grpc_code=c) for c in alert.split("|"))
        assert fired == 0


def test_unknown_model_is_not_found_and_a_registered_unloadable_one_unavailable(attack_registry, tmp_path):
    registry = tmp_path / "reg"
    (registry / "broken").mkdir(parents=True)  # in the registry, no loadable version
    Registry(registry).publish("dcr", Registry(attack_registry).load("dcr", mmap=False))
    with ServerProcess(registry) as server, grpc.insecure_channel(server.target) as channel:
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        for model, code in (("absent", grpc.StatusCode.NOT_FOUND), ("broken", grpc.StatusCode.UNAVAILABLE)):
            with pytest.raises(grpc.RpcError) as info:
                stub.Recommend(pb.RecommendRequest(model=model, user_ids=["u001"], n=3), timeout=5)
            assert info.value.code() == code, info.value.details()


def test_health_list_answers_without_logging_a_traceback(attack_registry):
    with ServerProcess(attack_registry) as server, grpc.insecure_channel(server.target) as channel:
        listing = health_pb2_grpc.HealthStub(channel).List(health_pb2.HealthListRequest(), timeout=5)
        assert listing.statuses[""].status == health_pb2.HealthCheckResponse.SERVING
        assert "ordrec.v1.Recommender" in listing.statuses
        raw = channel.unary_unary("/ordrec.v1.Recommender/Recommend")
        with pytest.raises(grpc.RpcError):
            raw(b"\xff\xff garbage", timeout=5)
        assert server.terminate() == 0
    assert "Traceback" not in "".join(server.output)


# ------------------------------------------------------- tampered registry
def publish_map_with_report(registry: Registry) -> Path:
    from ordrec.trainer.report_html import report_views

    artifact = big_map(n_items=50)
    version = registry.publish("films", artifact, views=lambda a: report_views(a))
    return registry.root / "films" / version


def test_report_is_served_from_the_verified_copy_with_a_strict_policy(tmp_path):
    registry = Registry(tmp_path / "reg")
    folder = publish_map_with_report(registry)
    report = registry.load("films").views["report.html"]
    with ServerProcess(registry.root) as server:
        (folder / report.path).write_bytes(b"<script>alert(1)</script>")  # after load: never read again
        with urllib.request.urlopen(f"{server.metrics_url}/maps/films", timeout=10) as reply:
            assert reply.read() == report.data
            policy = reply.headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and f"'sha256-{report.script_hashes[0]}'" in policy
        assert "unsafe-inline" not in policy.split("script-src", 1)[1].split(";", 1)[0]
        head = urllib.request.urlopen(
            urllib.request.Request(f"{server.metrics_url}/maps/films", method="HEAD"), timeout=10
        )
        assert (
            head.status == 200
            and head.read() == b""
            and int(head.headers["Content-Length"]) == len(report.data)
        )


@pytest.mark.parametrize("tamper", ["report_symlink", "report_edited", "version_symlink"])
def test_a_tampered_version_is_refused_and_the_old_one_keeps_serving(tmp_path, tamper):
    registry = Registry(tmp_path / "reg")
    first = publish_map_with_report(registry)
    with ServerProcess(registry.root, "--poll-interval", "0.2") as server:
        good = urllib.request.urlopen(f"{server.metrics_url}/maps/films", timeout=10).read()
        second = publish_map_with_report_unloaded(registry, tamper, tmp_path)
        wait_for(
            lambda: metric(server, "ordrec_model_load_failures_total", model="films") == 1,
            15,
            what="the tampered version to be refused",
        )
        assert urllib.request.urlopen(f"{server.metrics_url}/maps/films", timeout=10).read() == good
        assert first.name != second
        assert "root:" not in good.decode("utf-8", "replace")


def publish_map_with_report_unloaded(registry: Registry, tamper: str, tmp_path: Path) -> str:
    """Publish a second version by hand-tampering a copy, as an attacker with write access would."""
    staged = Registry(tmp_path / "staging")
    folder = publish_map_with_report(staged)
    report = next(folder.rglob("*report.html"))
    if tamper == "report_symlink":
        report.unlink()
        os.symlink("/etc/passwd", report)
    elif tamper == "report_edited":
        with open(report, "ab") as fh:
            fh.write(b"<script>alert(document.cookie)</script>")
    target = registry.root / "films" / folder.name
    if tamper == "version_symlink":
        os.symlink(folder, target)  # a version folder pointing outside the registry
    else:
        folder.rename(target)
    return folder.name
