"""Redis (seen items, version news, failing open) and security (tokens, TLS),
against real server processes and a real redis-server on loopback."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess, wait_for
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.conftest import self_signed_cert
from tests.scrape import metric


def recommend(stub, user="u001", n=10, **kw):
    return stub.Recommend(pb.RecommendRequest(model="dcr", user_ids=[user], n=n, **kw), timeout=5)


@pytest.fixture
def redis_server_process(redis_server, sample_registry):
    with ServerProcess(sample_registry, "--redis", redis_server.url, "--poll-interval", "0") as proc:
        yield proc, redis_server


def test_recorded_interactions_are_excluded(redis_server_process):
    proc, _ = redis_server_process
    with grpc.insecure_channel(proc.target) as ch:
        stub = recommender_pb2_grpc.RecommenderStub(ch)
        before = [i.id for i in recommend(stub).results[0].items]
        reply = stub.RecordInteractions(
            pb.RecordInteractionsRequest(user_id="u001", item_ids=before[:3]), timeout=5
        )
        assert reply.recorded == 3
        after = recommend(stub)
        assert not after.seen_filter_degraded
        ids = [i.id for i in after.results[0].items]
        assert not set(before[:3]) & set(ids)
        assert ids[:7] == before[3:10]  # the rest keep their order
        # an unknown user's recorded items are excluded from the fallback too
        popular = [i.id for i in recommend(stub, user="newcomer", n=5).results[0].items]
        stub.RecordInteractions(
            pb.RecordInteractionsRequest(user_id="newcomer", item_ids=popular[:1]), timeout=5
        )
        assert popular[0] not in [i.id for i in recommend(stub, user="newcomer", n=5).results[0].items]


def test_redis_down_fails_open_and_recovers(redis_server_process):
    proc, server = redis_server_process
    with grpc.insecure_channel(proc.target) as ch:
        stub = recommender_pb2_grpc.RecommenderStub(ch)
        health = health_pb2_grpc.HealthStub(ch)

        def redis_health():
            return health.Check(health_pb2.HealthCheckRequest(service="ordrec.redis"), timeout=5).status

        assert metric(proc, "ordrec_redis_up") == 1
        server.stop()
        # Answers keep coming while Redis is down, flagged as degraded.
        for _ in range(20):
            assert recommend(stub).results[0].items
        wait_for(lambda: recommend(stub).seen_filter_degraded, 10, what="degraded flag")
        assert metric(proc, "ordrec_redis_up") == 0
        assert redis_health() == health_pb2.HealthCheckResponse.NOT_SERVING
        overall = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
        assert overall == health_pb2.HealthCheckResponse.SERVING
        assert (
            "redis: down" in urllib.request.urlopen(proc.metrics_url + "/healthz", timeout=5).read().decode()
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.RecordInteractions(
                pb.RecordInteractionsRequest(user_id="u001", item_ids=["i001"]), timeout=5
            )
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        server.start()  # back on the same port (the fixture stops it at the end)
        wait_for(lambda: not recommend(stub).seen_filter_degraded, 15, what="recovery")
        assert metric(proc, "ordrec_redis_up") == 1
        assert redis_health() == health_pb2.HealthCheckResponse.SERVING


def test_a_write_that_succeeds_closes_the_circuit_before_the_next_probe(redis_server):
    """One timed-out write opens the circuit; the next acknowledged write closes it at once,
    so the reads after it are not failing open for a probe interval (a CI flake's cause)."""
    from ordrec.service.errors import Unavailable
    from ordrec.service.live.redis_state import RedisSeenStore
    from ordrec.service.live.seen import Recorded
    from ordrec.service.metrics import Metrics

    seen = RedisSeenStore(redis_server.url, Metrics(), timeout=0.3, probe_interval=3600)
    admin = redis.Redis.from_url(redis_server.url)
    try:
        admin.client_pause(1500)  # every client's commands wait 1.5 s: the write times out
        with pytest.raises(Unavailable):
            seen.record("u1", [Recorded("i1", 1.0)])
        assert not seen.healthy() and seen.lookup(["u1"])[2]  # open: reads fail open
        assert admin.ping()  # answered once the pause is over
        assert seen.record("u1", [Recorded("i2", 2.0)]) >= 1
        assert seen.healthy()
        recent, _, degraded = seen.lookup(["u1"])
        assert not degraded and "i2" in recent["u1"]
    finally:
        admin.close()
        seen.close()


def test_version_news_over_redis_reloads_without_polling(redis_server_process, tmp_path):
    proc, server = redis_server_process
    registry = Registry(proc.args[proc.args.index("--registry") + 1])
    with grpc.insecure_channel(proc.target) as ch:
        stub = recommender_pb2_grpc.RecommenderStub(ch)
        old = recommend(stub).model_version
        version = registry.publish("dcr", registry.load("dcr", mmap=False))
        client = redis.Redis.from_url(server.url)
        client.set("ordrec:model:dcr:version", version)
        client.publish("ordrec:models", json.dumps({"model": "dcr", "version": version}))
        wait_for(lambda: recommend(stub).model_version == version, 10, what="reload on news")
        assert version > old


TOKEN = "s3cret-token-for-tests-0123456789"


def test_bearer_token_required(sample_registry, tmp_path):
    token_file = tmp_path / "tokens"
    token_file.write_text("an-older-rotated-token-abcdef\n" + TOKEN + "\n")
    with (
        ServerProcess(sample_registry, "--token-file", str(token_file)) as proc,
        grpc.insecure_channel(proc.target) as ch,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(ch)
        for metadata in (
            [],
            [("authorization", "Bearer wrong-token-wrong-token")],
            [("authorization", TOKEN)],
        ):
            with pytest.raises(grpc.RpcError) as info:
                stub.ListModels(pb.ListModelsRequest(), timeout=5, metadata=metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Coordinates(pb.CoordinatesRequest(model="dcr"), timeout=5))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as info:  # the plain Recommend, answered as wire bytes
            stub.Recommend(pb.RecommendRequest(model="dcr", user_ids=["1"], n=3), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reflection = reflection_pb2_grpc.ServerReflectionStub(ch)
        asked = [reflection_pb2.ServerReflectionRequest(list_services="")]
        with pytest.raises(grpc.RpcError) as info:  # a bidi stream
            list(reflection.ServerReflectionInfo(iter(asked), timeout=5))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        good = [("authorization", f"Bearer {TOKEN}")]
        assert stub.ListModels(pb.ListModelsRequest(), timeout=5, metadata=good).models
        (listed,) = reflection.ServerReflectionInfo(iter(asked), timeout=5, metadata=good)
        assert "ordrec.v1.Recommender" in {s.name for s in listed.list_services_response.service}
        # Health stays open for orchestrators' probes.
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        text = urllib.request.urlopen(proc.metrics_url + "/metrics", timeout=5).read().decode()
        assert 'grpc_code="UNAUTHENTICATED"' in text


def test_short_or_missing_tokens_refuse_to_start(sample_registry, tmp_path):
    token_file = tmp_path / "tokens"
    token_file.write_text("short\n")
    result = subprocess.run(
        [*ServerProcess(sample_registry).args, "--token-file", str(token_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "at least 16 characters" in result.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_tls(sample_registry, tmp_path):
    key, cert = self_signed_cert(tmp_path)
    with ServerProcess(sample_registry, "--tls-cert", str(cert), "--tls-key", str(key)) as proc:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(f"localhost:{proc.port}", credentials) as ch:
            stub = recommender_pb2_grpc.RecommenderStub(ch)
            assert stub.ListModels(pb.ListModelsRequest(), timeout=10).models
        with grpc.insecure_channel(proc.target) as ch:
            with pytest.raises(grpc.RpcError) as info:
                recommender_pb2_grpc.RecommenderStub(ch).ListModels(pb.ListModelsRequest(), timeout=3)
            assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
