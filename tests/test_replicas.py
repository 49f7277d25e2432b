"""Many replicas on one registry: three real ``ordrec-serve`` processes on their own ports
share one S3 registry (moto's S3 server on loopback, a stand-in for S3 or MinIO) and one
real redis-server, as three pods of a Deployment would."""

from __future__ import annotations

import json
import time
import urllib.request

import grpc
import pytest

from ordrec.service.storage.objectstore import S3Registry
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess, wait_for
from ordrec.trainer.notify import notify_published
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.background_load import BackgroundLoad
from tests.conftest import free_port

pytestmark = pytest.mark.redis

# What a client of a headless Service does: resolve every replica, balance per call
# across them, and retry a call that a dying replica failed with UNAVAILABLE.
SERVICE_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [{"service": "ordrec.v1.Recommender"}],
            "timeout": "10s",
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.05s",
                "maxBackoff": "0.5s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ],
}


class Replicas:
    """N ``ordrec-serve`` processes on fixed loopback ports, each with its own cache."""

    def __init__(self, registry: str, tmp_path, *args: str, n: int = 3):
        self.registry, self.tmp_path, self.args = registry, tmp_path, args
        self.ports = [free_port() for _ in range(n)]
        self.procs: list[ServerProcess | None] = [None] * n

    def start(self, i: int) -> ServerProcess:
        proc = ServerProcess(
            self.registry,
            "--port",
            str(self.ports[i]),
            "--cache-dir",
            str(self.tmp_path / f"cache-{i}"),
            "--workers",
            "8",
            "--max-streams",
            "4",
            *self.args,
            log_path=self.tmp_path / f"replica-{i}.log",
        )
        self.procs[i] = proc.start()
        return proc

    def __enter__(self) -> Replicas:
        for i in range(len(self.ports)):
            self.start(i)
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            if proc is not None:
                proc.kill()

    @property
    def target(self) -> str:
        return "ipv4:" + ",".join(f"127.0.0.1:{p}" for p in self.ports)


def _models(port: int) -> dict[str, pb.ModelInfo]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = recommender_pb2_grpc.RecommenderStub(channel).ListModels(pb.ListModelsRequest(), timeout=5)
    return {m.name: m for m in reply.models}


def _seconds_until_all_serve(replicas: Replicas, version: str, start: float, timeout: float) -> list[float]:
    """For each replica, seconds from ``start`` until it serves ``version`` of dcr."""
    seen: dict[int, float] = {}
    deadline = start + timeout
    while len(seen) < len(replicas.ports) and time.monotonic() < deadline:
        for i, port in enumerate(replicas.ports):
            if i not in seen and _models(port)["dcr"].version == version:
                seen[i] = time.monotonic() - start
        time.sleep(0.02)
    assert len(seen) == len(replicas.ports), f"only replicas {sorted(seen)} serve {version} after {timeout} s"
    return [seen[i] for i in range(len(replicas.ports))]


@pytest.fixture
def source(sample_registry):
    """The sample DCR model, loaded into memory so it can be published again and again."""
    return Registry(sample_registry).load("dcr", mmap=False)


def _recommends_answered(proc: ServerProcess) -> float:
    """Recommend calls this replica process answered OK (its own counter: a restart starts at 0)."""
    with urllib.request.urlopen(proc.metrics_url + "/metrics", timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("grpc_server_handled_total{")
        and 'grpc_method="Recommend"' in line
        and 'grpc_code="OK"' in line
    )


class RoundRobinLoad(BackgroundLoad):
    """Threads sending Recommend through one round_robin channel over every replica."""

    def __init__(self, target: str, threads: int = 2):
        # A short reconnect backoff, so a restarted replica gets calls within a second or so
        # (gRPC's default starts at 1 s and grows to 120 s).
        options = [
            ("grpc.lb_policy_name", "round_robin"),
            ("grpc.enable_retries", 1),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
        ]
        self.channel = grpc.insecure_channel(target, options=options)
        self.stub = recommender_pb2_grpc.RecommenderStub(self.channel)
        super().__init__(threads)

    def _run(self, i: int) -> None:
        n = i
        while not self.stop_event.is_set():
            try:
                reply = self.stub.Recommend(
                    pb.RecommendRequest(model="dcr", user_ids=[f"u{1 + n % 40:03d}"], n=10)
                )
                assert len(reply.results[0].items) == 10
                with self._lock:
                    self.ok += 1
            except grpc.RpcError as exc:
                with self._lock:
                    self.failures.append(f"{exc.code().name}: {exc.details()}")
            n += 2

    def close(self) -> None:
        self.channel.close()


def test_three_replicas_take_a_version_through_redis_and_survive_rolling_kills(
    s3_url, redis_server, source, tmp_path
):
    registry = S3Registry(s3_url, cache_dir=tmp_path / "publisher")
    first = registry.publish("dcr", source)
    # A poll interval far longer than the bound, so only Redis news can meet it.
    with Replicas(s3_url, tmp_path, "--redis", redis_server.url, "--poll-interval", "60") as replicas:
        assert {_models(p)["dcr"].version for p in replicas.ports} == {first}

        new = registry.publish("dcr", source)
        start = time.monotonic()
        assert notify_published(redis_server.url, "dcr", new)
        seconds = _seconds_until_all_serve(replicas, new, start, timeout=10)
        print(f"redis news -> all three replicas serve {new}: {[f'{s:.3f}' for s in seconds]} s")
        assert max(seconds) < 2.0

        with RoundRobinLoad(replicas.target) as load:
            for i in range(len(replicas.ports)):
                before = load.ok
                replicas.procs[i].proc.kill()  # SIGKILL: no drain, in-flight calls die with the process
                replicas.procs[i].proc.wait(10)
                wait_for(lambda b=before: load.ok > b + 50, 30, what="calls on the remaining replicas")
                replicas.start(i)  # same port, as a restarted pod keeps its Service
                assert _models(replicas.ports[i])["dcr"].version == new  # it came back on the newest
                # The client balances onto the restarted replica again (after its reconnect backoff).
                wait_for(
                    lambda p=replicas.procs[i]: _recommends_answered(p) > 30,
                    30,
                    what=f"replica {i} to answer calls after its restart",
                )
        assert load.failures == [], load.failures[:5]
        print(f"round_robin client: {load.ok} calls, 0 failed, across 3 SIGKILLs and restarts")


def test_three_replicas_poll_without_redis_and_refuse_a_corrupt_version(s3_url, source, tmp_path):
    interval = 1.0
    registry = S3Registry(s3_url, cache_dir=tmp_path / "publisher")
    first = registry.publish("dcr", source)
    with Replicas(s3_url, tmp_path, "--poll-interval", str(interval)) as replicas:
        new = registry.publish("dcr", source)
        start = time.monotonic()
        seconds = _seconds_until_all_serve(replicas, new, start, timeout=10)
        print(
            f"polling every {interval} s -> all three replicas serve {new}: {[f'{s:.3f}' for s in seconds]} s"
        )
        # One interval until the next poll, plus the download, verification and smoke query.
        assert max(seconds) < interval + 1.5
        assert first != new

        # A version with one corrupted object (bits flipped on the way up): every replica
        # refuses it and keeps serving `new`.
        corrupting = S3Registry(s3_url, cache_dir=tmp_path / "publisher")
        upload = corrupting.client.upload_file

        def corrupt_arrays(filename, bucket, key, *args, **kwargs):
            if key.endswith(".npy"):
                with open(filename, "rb") as fh:
                    data = bytearray(fh.read())
                data[-1] ^= 0xFF
                corrupting.client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
                return None
            return upload(filename, bucket, key, *args, **kwargs)

        corrupting.client.upload_file = corrupt_arrays
        bad = corrupting.publish("dcr", source)

        def all_refused() -> bool:
            return all(_models(p)["dcr"].reason.startswith(f"kept: {bad} refused") for p in replicas.ports)

        wait_for(all_refused, 10 * interval, what="every replica to refuse the corrupt version")
        for port in replicas.ports:
            info = _models(port)["dcr"]
            assert info.version == new and "checksum mismatch" in info.reason
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = recommender_pb2_grpc.RecommenderStub(channel).Recommend(
                    pb.RecommendRequest(model="dcr", user_ids=["u001"], n=5), timeout=5
                )
            assert reply.model_version == new and len(reply.results[0].items) == 5


def test_liveness_is_serving_before_any_model_readiness_is_not(tmp_path):
    """The Deployment's probes: liveness on ``ordrec.liveness`` (the process answers),
    readiness on ``""`` (a model is loaded). An empty registry must not restart pods."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with ServerProcess(tmp_path / "empty") as server, grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)

        def status(service: str) -> int:
            return health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status

        assert status("") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert status("ordrec.liveness") == health_pb2.HealthCheckResponse.SERVING
