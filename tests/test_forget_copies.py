"""Copies of a forgotten user outside the registry's versions: an S3 replica's download
cache, the download folders of the job and of ``ordrec-train`` commands, stream entries
written after the erasure and the trending counts (docs/operations.md, "Forgetting a user")."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest
import redis

from ordrec.service.live.erasure import Erasure, erase_from_redis, erase_user
from ordrec.service.live.forgotten import user_digest
from ordrec.service.live.redis_state import EVENTS_STREAM, RedisSeenStore
from ordrec.service.live.seen import Recorded
from ordrec.service.live.trending import LAST_KEY, TrendingIndex, TrendingSettings
from ordrec.service.metrics import Metrics
from ordrec.service.serving.store import ModelStore
from ordrec.service.storage.objectstore import S3Registry
from ordrec.service.storage.registry import Registry
from ordrec.trainer.events import EventFeed, lost_after
from ordrec.trainer.job import EXIT_PUBLISHED, run_job
from tests.test_forget import USER, ratings_with_user
from tests.test_job import job_text


def files_holding(folder: Path, needle: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def s3_job(folder: Path, ratings: Path, registry: str) -> Path:
    """A DCR job on ``ratings`` publishing to the ``s3://`` registry."""
    text = job_text(ratings.parent, Path("REGISTRY"), "n_components = 4, max_iter = 3", 1.0)
    text = text.replace('registry = "REGISTRY"', f'registry = "{registry}"\nlock = "{folder / "job.lock"}"')
    path = folder / "job.toml"
    path.write_text(text)
    return path


def test_a_replica_drops_its_copy_of_a_version_the_store_deleted_at_its_next_poll(
    s3_url, sample_registry, tmp_path
):
    """The replica loaded the version naming the user, then a newer one (so both are among
    its newest cached); ForgetUser deletes the older one from the store; the replica's next
    poll, which loads nothing, leaves no copy of the id in its cache."""
    from ordrec.service.live.redaction import redact_artifact

    named = Registry(sample_registry).load("dcr", mmap=False)
    publisher = S3Registry(s3_url, cache_dir=tmp_path / "publisher")
    first = publisher.publish("dcr", named)
    replica = S3Registry(s3_url, cache_dir=tmp_path / "replica")
    store = ModelStore(replica, Metrics())
    assert store.refresh() == ["dcr"]
    retrained = redact_artifact(named, {user_digest("u001")})  # a newer version without the user
    assert retrained is not None
    second = publisher.publish("dcr", retrained)
    assert store.refresh() == ["dcr"] and store.snapshot()["dcr"].version == second
    assert files_holding(tmp_path / "replica", "u001\n")  # the first version, still cached

    report = erase_user("u001", publisher)
    assert report.versions_removed == [f"dcr@{first}"] and not report.versions_pending
    assert store.refresh() == []  # a poll that loads nothing
    assert not files_holding(tmp_path / "replica", "u001\n")
    assert files_holding(tmp_path / "replica", "u002\n")  # the served version stays cached


def test_a_replica_loading_every_version_the_job_publishes_keeps_no_copy_of_the_user(
    s3_url, sample_dir, tmp_path, monkeypatch
):
    """The issue's order: the user is forgotten through the RPC (the live version naming
    them pending); the next job publishes; a replica loads each version the moment it is
    published. When the job returns, nothing in the replica's cache holds the id."""
    ratings = ratings_with_user(sample_dir, tmp_path)
    job = s3_job(tmp_path, ratings, s3_url)
    assert run_job(job) == EXIT_PUBLISHED
    replica = S3Registry(s3_url, cache_dir=tmp_path / "replica")
    store = ModelStore(replica, Metrics())
    assert store.refresh() == ["dcr"]
    report = erase_user(USER, S3Registry(s3_url, cache_dir=tmp_path / "rpc"))
    assert len(report.versions_pending) == 1  # live: left to the next run

    publish = S3Registry.publish

    def publish_then_poll(self, *args, **kwargs):
        version = publish(self, *args, **kwargs)
        store.refresh()  # a replica polling right after each publish
        return version

    monkeypatch.setattr(S3Registry, "publish", publish_then_poll)
    assert run_job(job) == EXIT_PUBLISHED
    assert files_holding(tmp_path / "replica", "u002\n")  # what is cached can be searched
    assert not files_holding(tmp_path / "replica", USER)


@pytest.fixture
def default_caches(tmp_path, monkeypatch) -> list[Path]:
    """The default download cache and the system's temporary folder, both in ``tmp_path``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return [tmp_path / "xdg", tmp_path / "tmp"]


def left_in(folders: list[Path]) -> list[Path]:
    """Files of ordrec's downloads left in ``folders``."""
    return [p for folder in folders for p in folder.rglob("*") if p.is_file() and "ordrec" in str(p)]


@pytest.mark.slow  # three job runs on moto
def test_the_job_leaves_no_download_behind(s3_url, sample_dir, tmp_path, default_caches):
    """The job loads the versions naming a forgotten user to redact them: into a temporary
    folder (under --cache-dir when given) removed when the run ends."""
    from ordrec.trainer.cli import main

    job = s3_job(tmp_path, ratings_with_user(sample_dir, tmp_path), s3_url)
    assert run_job(job) == EXIT_PUBLISHED
    erase_user(USER, S3Registry(s3_url, cache_dir=tmp_path / "rpc"))
    assert run_job(job) == EXIT_PUBLISHED
    assert not left_in(default_caches)
    erase_user("u002", S3Registry(s3_url, cache_dir=tmp_path / "rpc"))
    assert main(["run", str(job), "--cache-dir", str(tmp_path / "downloads")]) == EXIT_PUBLISHED
    assert (tmp_path / "downloads").is_dir() and not list((tmp_path / "downloads").iterdir())
    assert not left_in(default_caches)


def test_export_leaves_no_download_behind(s3_url, sample_registry, tmp_path, default_caches):
    from ordrec.trainer.cli import main

    S3Registry(s3_url, cache_dir=tmp_path / "publisher").publish(
        "dcr", Registry(sample_registry).load("dcr", mmap=False)
    )
    out = tmp_path / "recs.jsonl"
    argv = ["export", "dcr", "--registry", s3_url, "--n", "3", "--out", str(out)]
    assert main(argv) == 0 and "u001" in out.read_text()
    assert not left_in(default_caches)
    assert main([*argv, "--workers", "2", "--cache-dir", str(tmp_path / "downloads")]) == 0
    assert (tmp_path / "downloads").is_dir() and not list((tmp_path / "downloads").iterdir())
    assert not left_in(default_caches)


def test_a_download_folder_whose_command_died_is_removed_by_the_next(s3_url, tmp_path):
    """A folder no live command holds (its holder was SIGKILLed) goes at the next command's
    first download; one a running command holds stays."""
    from ordrec.service.storage.objectstore import DOWNLOADS_PREFIX, Downloads
    from tests.test_registry import make_artifact

    S3Registry(s3_url, cache_dir=tmp_path / "publisher").publish("m", make_artifact())
    abandoned = tmp_path / f"{DOWNLOADS_PREFIX}dead"
    (abandoned / "bucket").mkdir(parents=True)
    (abandoned / "bucket" / "users.txt").write_text("u0\n")
    os.utime(abandoned, (0, 0))
    with Downloads(tmp_path) as running:
        running.open_registry(s3_url).load("m")
        held = running.folder
        assert held is not None and files_holding(held, "u0\n")
        os.utime(held, (0, 0))
        with Downloads(tmp_path) as later:
            later.open_registry(s3_url).load("m")
            assert not abandoned.exists() and held.exists()
    assert not list(tmp_path.glob(DOWNLOADS_PREFIX + "*"))


def test_downloads_make_their_parent_and_open_a_local_registry_as_it_is(tmp_path, s3_url):
    from ordrec.service.storage.objectstore import Downloads

    parent = tmp_path / "missing" / "deeper"
    with Downloads(parent) as downloads:
        registry = downloads.open_registry(s3_url)
        assert isinstance(registry, S3Registry) and registry.cache_root.parent == parent
    assert list(parent.iterdir()) == []
    assert isinstance(Downloads().open_registry(tmp_path), Registry)


@pytest.fixture
def client(redis_server):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.close()


def written_after_the_erasure(client, registry) -> None:
    """The user is forgotten, then a producer that does not read the FORGOTTEN list writes
    five entries for them between two of a kept user."""
    client.xadd(EVENTS_STREAM, {"user": "kept", "item": "i1", "ts": "1", "value": "4"})
    erase_user("gone-4e1d", registry, client, settle=0)
    for n in range(5):
        client.xadd(EVENTS_STREAM, {"user": "gone-4e1d", "item": f"i{n}", "ts": "2", "value": "5"})
    client.xadd(EVENTS_STREAM, {"user": "kept", "item": "i2", "ts": "3", "value": "3"})


def stream_users(client) -> list[str]:
    return [fields["user"] for _, fields in client.xrange(EVENTS_STREAM)]


@pytest.mark.redis
def test_the_job_deletes_stream_entries_other_producers_wrote_for_a_forgotten_user(
    client, redis_server, tmp_path
):
    """The job's read skips those entries and deletes them from the stream, bytes and all,
    without reporting them as trimmed."""
    registry = Registry(tmp_path / "registry")
    written_after_the_erasure(client, registry)
    feed = EventFeed(registry, "dcr", client)
    feed.read()
    assert stream_users(client) == ["kept", "kept"]
    assert b"gone-4e1d" not in redis.Redis.from_url(redis_server.url).dump(EVENTS_STREAM)
    assert lost_after(client, feed.next.position) == 0  # not taken for trimmed entries
    assert "erased=5" in feed.summary() and {user for user, _ in feed.next.latest} == {"kept"}


@pytest.mark.redis
def test_a_dry_run_only_skips_them(client, tmp_path):
    registry = Registry(tmp_path / "registry")
    written_after_the_erasure(client, registry)
    feed = EventFeed(registry, "dcr", client, erase=False)
    feed.read()
    assert stream_users(client).count("gone-4e1d") == 5 and feed.counts.erased == 0
    assert {user for user, _ in feed.next.latest} == {"kept"}


@pytest.mark.redis
def test_forgetting_a_user_takes_their_contributions_out_of_trending(client, redis_server):
    """Trending equals what it would be had the user never recorded: the items only they
    touched (one stamped in the future) leave it, a shared item keeps the other user's
    count; an entry another producer wrote (it never counted in trending) takes nothing
    out; asking again changes nothing."""
    client.flushall()
    hour = 3600.0
    settings = TrendingSettings(half_life=hour, window=10 * 86400.0)
    store = RedisSeenStore(redis_server.url, Metrics(), timeout=1.0, trending=settings)
    now = time.time()
    ahead = Recorded("stamped-ahead", now + hour)  # counted at the time it was written
    store.record("gone-4e1d", [Recorded("solo", now - hour), Recorded("shared", now - 2 * hour), ahead])
    store.record("kept", [Recorded("shared", now), Recorded("other", now - hour)])
    client.xadd(EVENTS_STREAM, {"user": "gone-4e1d", "item": "other", "ts": repr(now)})
    store.close()
    for _ in range(2):
        erase_from_redis(client, "gone-4e1d", Erasure(user_digest("gone-4e1d")))
        found = TrendingIndex(client, settings, cache_seconds=0).current()
        assert found.item_ids == ["shared", "other"]
        assert found.scores[0] == pytest.approx(1.0, rel=1e-2)  # kept's touch just now
        assert found.scores[1] / found.scores[0] == pytest.approx(0.5, rel=1e-6)  # an hour older
        assert client.zscore(LAST_KEY, "solo") is None and client.zscore(LAST_KEY, "stamped-ahead") is None
