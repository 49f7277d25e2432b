"""The closed loop end to end: a real redis-server with its append-only file synced on every
write, a real ``ordrec-serve`` and real ``ordrec-train run`` processes.

Interactions recorded for new users reach the next version; killing Redis and the job
(SIGKILL, at seeded random points) loses no acknowledged interaction and counts none twice.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
import redis

from ordrec.service.live.redis_state import EVENTS_STREAM
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess, run_cli, wait_for
from ordrec.trainer.events import load_checkpoint
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.conftest import RedisServer
from tests.test_events import write_job

pytestmark = pytest.mark.redis

ROUNDS = 4
SEED = 18


def job_file(tmp_path: Path, sample: Path, url: str) -> Path:
    # margin 1: every run publishes, the loop (not the gate) is under test; page 7: several pages a run
    return write_job(tmp_path, sample, f'redis = "{url}"\ntimeout = 2\npage = 7', margin=1.0)


def run_job(job: Path) -> int:
    return run_cli(["ordrec.trainer", "run", str(job)], check=False).returncode


def base_pairs(sample: Path) -> set[tuple[str, str]]:
    lines = (sample / "ratings.data").read_text().splitlines()
    return {tuple(line.split("\t")[:2]) for line in lines}  # type: ignore[misc]


class Recorder:
    """Records through the server, retrying each call until it is acknowledged (Redis may be
    down), and keeps the latest acknowledged value per (user, item): what training must see."""

    def __init__(self, stub):
        self.stub = stub
        self.expected: dict[tuple[str, str], float] = {}
        self.retries = 0

    def record(self, user: str, ratings: dict[str, float], timeout: float = 30.0) -> None:
        request = pb.RecordInteractionsRequest(
            user_id=user, interactions=[pb.Interaction(item_id=i, value=v) for i, v in ratings.items()]
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.stub.RecordInteractions(request, timeout=5)
                break
            except grpc.RpcError as exc:
                # UNAVAILABLE: the outcome is unknown, the retry may add the same entry again
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
                assert time.monotonic() < deadline, "Redis did not come back"
                self.retries += 1
                time.sleep(0.05)
        self.expected.update({(user, item): value for item, value in ratings.items()})


def assert_trained_exactly(registry: Registry, sample: Path, expected: dict, client) -> None:
    """The live version's training pairs are the base pairs plus the recorded ones, each once;
    the checkpoint holds the latest recorded value of each and names the stream's last entry."""
    artifact = registry.load("dcr")
    users, items = artifact.ids["users"], artifact.ids["items"]
    indptr, indices = artifact.arrays["seen_indptr"], artifact.arrays["seen_indices"]
    trained = [
        (users.external(u), items.external(int(i)))
        for u in range(len(users))
        for i in indices[indptr[u] : indptr[u + 1]]
    ]
    assert len(trained) == len(set(trained))  # no pair twice
    assert set(trained) == base_pairs(sample) | set(expected)
    checkpoint = load_checkpoint(registry, "dcr")
    assert {key: event.value for key, event in checkpoint.latest.items()} == expected
    assert checkpoint.last_id == client.xrevrange(EVENTS_STREAM, count=1)[0][0]


def live_version(stub) -> str:
    # the registry's one model (ListModels also lists the server's trending list)
    (model,) = [m for m in stub.ListModels(pb.ListModelsRequest(), timeout=5).models if m.kind != "trending"]
    return model.version


def test_new_users_reach_the_next_version_and_the_checkpoint_advances(aof_redis, sample_dir, tmp_path):
    job = job_file(tmp_path, sample_dir, aof_redis.url)
    assert run_job(job) == 0  # the base version; no stream yet
    registry = Registry(tmp_path / "registry")
    assert load_checkpoint(registry, "dcr").last_id is None
    client = redis.Redis.from_url(aof_redis.url, decode_responses=True)
    with (
        ServerProcess(registry.root, *aof_redis.serve_flags, "--poll-interval", "0.2") as proc,
        grpc.insecure_channel(proc.target) as channel,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        first = live_version(stub)
        recorder = Recorder(stub)
        for n in range(5):
            recorder.record(f"new-{n}", {"i001": 5.0, f"i{n + 10:03d}": 4.0, "item-never-trained": 1.0})
        # before any training: folded in from the recorded ratings, not the popularity list
        (folded,) = stub.Recommend(pb.RecommendRequest(user_ids=["new-0"], n=5), timeout=5).results
        assert folded.folded_in and len(folded.items) == 5
        assert {s.id for s in folded.items}.isdisjoint({"i001", "i010", "item-never-trained"})
        assert run_job(job) == 0
        wait_for(lambda: live_version(stub) != first, timeout=30, what="the new version to load")
        reply = stub.Recommend(pb.RecommendRequest(user_ids=["new-0"], n=5), timeout=5)
        (result,) = reply.results
        assert result.fallback == pb.FALLBACK_NONE and not result.folded_in  # a known user now
        assert {s.id for s in result.items}.isdisjoint({"i001", "i010", "item-never-trained"})
    assert_trained_exactly(registry, sample_dir, recorder.expected, client)


def test_killing_redis_and_the_job_loses_nothing_and_counts_nothing_twice(aof_redis, sample_dir, tmp_path):
    rng = random.Random(SEED)
    job = job_file(tmp_path, sample_dir, aof_redis.url)
    started = time.monotonic()
    assert run_job(job) == 0
    job_seconds = time.monotonic() - started  # kill moments scale with this machine's speed
    registry = Registry(tmp_path / "registry")
    client = redis.Redis.from_url(aof_redis.url, decode_responses=True)
    kills = {"redis": 0, "job": 0}
    with (
        ServerProcess(registry.root, "--redis", aof_redis.url) as proc,
        grpc.insecure_channel(proc.target) as channel,
    ):
        recorder = Recorder(recommender_pb2_grpc.RecommenderStub(channel))
        for round_ in range(ROUNDS):
            if round_ == 0:  # down before the first call: the retry path is certainly taken
                aof_redis.kill()
                kills["redis"] += 1
                killer = threading.Timer(0.3, aof_redis.start)
            else:  # down at a random moment, maybe inside a MULTI/EXEC
                killer = threading.Timer(rng.uniform(0.0, 0.5), restart_redis, (aof_redis, kills))
            killer.start()
            for n in range(15):
                ratings = {f"i{rng.randrange(1, 60):03d}": float(rng.randint(1, 5)) for _ in range(2)}
                if recorder.expected and rng.random() < 0.3:  # a user changes an earlier rating
                    (user, item) = rng.choice(sorted(recorder.expected))
                    recorder.record(user, {item: float(rng.randint(1, 5))})
                recorder.record(f"r{round_}-user{n}", ratings)
            killer.join()
            interrupt_a_job(job, aof_redis, rng, kills, job_seconds, kill_the_job=round_ == 0)
    assert kills["job"] >= 1 and kills["redis"] >= ROUNDS
    for _ in range(3):  # Redis may still be coming back
        if run_job(job) == 0:
            break
    else:
        pytest.fail("the job never succeeded after the interruptions")
    assert_trained_exactly(registry, sample_dir, recorder.expected, client)
    assert recorder.retries > 0  # Redis was down under recording calls


def restart_redis(server: RedisServer, kills: dict) -> None:
    server.kill()
    kills["redis"] += 1
    time.sleep(0.2)
    server.start()


def interrupt_a_job(
    job: Path, server: RedisServer, rng: random.Random, kills: dict, seconds: float, kill_the_job: bool
) -> None:
    """Run the job and, at a random moment of a run that takes about ``seconds``, SIGKILL it or kill
    Redis under it, or let it finish; ``kill_the_job`` kills it within the first half of its run."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ordrec.trainer", "run", str(job)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(rng.uniform(0.0, seconds * (0.5 if kill_the_job else 1.0)))
    what = "job" if kill_the_job else rng.choice(["job", "job", "redis", "none"])
    if what == "job" and proc.poll() is None:
        proc.kill()
        kills["job"] += 1
    elif what == "redis":
        restart_redis(server, kills)
    proc.wait(120)
