"""The job's Redis notification against a real redis-server, and Redis being down."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from ordrec.service.storage.registry import Registry
from ordrec.trainer.job import EXIT_PUBLISHED, EXIT_REJECTED, run_job
from ordrec.trainer.notify import CHANNEL, notify_published, version_key
from ordrec.trainer.sample import write_samples

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sample")
    write_samples(out)
    return out


def job(tmp_path: Path, sample: Path, url: str, epochs: int = 5, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(f"""
[job]
name = "redis-job"
registry = "{tmp_path / "registry"}"
redis = "{url}"
redis_timeout = 0.5

[data.ratings]
path = "{sample / "ratings.data"}"
format = "ml-100k"

[[models]]
name = "dcr"
kind = "dcr"
data = "ratings"
params = {{ n_components = 4, max_iter = {epochs} }}
gate = {{ metric = "ndcg_at_10", margin = 0.0, popularity_floor = false }}
""")
    return path


def subscriber(url: str):
    client = redis.Redis.from_url(url, decode_responses=True)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(CHANNEL)
    deadline = time.monotonic() + 5
    while not pubsub.subscribed and time.monotonic() < deadline:
        pubsub.get_message(timeout=0.1)
    # the subscribe confirmation is consumed above; make sure the server has it registered
    while client.pubsub_numsub(CHANNEL)[0][1] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    return client, pubsub


def next_message(pubsub, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.2)
        if message and message["type"] == "message":
            return message
    return None


def test_publish_sets_the_durable_key_and_announces_the_version(redis_server, sample, tmp_path):
    client, pubsub = subscriber(redis_server.url)
    assert run_job(job(tmp_path, sample, redis_server.url)) == EXIT_PUBLISHED
    (version,) = Registry(tmp_path / "registry").versions("dcr")
    message = next_message(pubsub)
    assert message is not None and message["channel"] == "ordrec:models"
    assert json.loads(message["data"]) == {"model": "dcr", "version": version}
    assert client.get("ordrec:model:dcr:version") == version == client.get(version_key("dcr"))
    assert client.ttl("ordrec:model:dcr:version") == -1  # durable: no expiry

    # A version rejected by the gate is neither stored nor announced.
    bad = job(tmp_path, sample, redis_server.url, epochs=0, name="bad.toml")
    assert run_job(bad) == EXIT_REJECTED
    assert next_message(pubsub, timeout=0.5) is None
    assert client.get("ordrec:model:dcr:version") == version
    pubsub.close()
    client.close()


def test_redis_down_does_not_fail_the_job(redis_server, sample, tmp_path, capsys):
    url = redis_server.url
    redis_server.stop()
    t0 = time.monotonic()
    assert run_job(job(tmp_path, sample, url)) == EXIT_PUBLISHED
    assert len(Registry(tmp_path / "registry").versions("dcr")) == 1
    err = capsys.readouterr().err
    assert "redis notification failed" in err and "WARNING" in err
    assert time.monotonic() - t0 < 60


def test_notify_is_quick_and_quiet_when_redis_is_unreachable(redis_server):
    url = redis_server.url
    redis_server.stop()
    t0 = time.monotonic()
    assert notify_published(url, "dcr", "20260101T000000.000000Z", timeout=0.3) is False
    assert time.monotonic() - t0 < 2.0
    # a TEST-NET-1 address: refused at once or timed out, either way bounded by the timeout
    t0 = time.monotonic()
    assert notify_published("redis://192.0.2.1:6379/0", "dcr", "v", timeout=0.3) is False
    assert time.monotonic() - t0 < 2.0
