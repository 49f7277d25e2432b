"""The S3 registry against a real S3 HTTP endpoint: moto's standalone server on loopback,
a stand-in for S3 or MinIO (neither can be installed here)."""

from __future__ import annotations

import datetime as dt
import hashlib
import signal
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

from ordrec.service.storage.artifact import ArtifactError
from ordrec.service.storage.objectstore import S3Registry, manifest_paths, open_registry, parse_s3_url
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import run_cli
from tests.test_registry import make_artifact


def _client():
    import boto3

    return boto3.session.Session().client("s3")


def _keys(url: str) -> list[str]:
    bucket, prefix = parse_s3_url(url)
    pages = _client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def test_urls_pick_the_backend(tmp_path):
    assert isinstance(open_registry(tmp_path), Registry)
    assert parse_s3_url("s3://b/a/b/") == ("b", "a/b")
    assert parse_s3_url("s3://b") == ("b", "")
    with pytest.raises(ValueError):
        parse_s3_url("s3:///x")


def test_round_trip_through_the_store_and_the_cache(s3_url, tmp_path):
    registry = open_registry(s3_url, cache_dir=tmp_path / "cache")
    assert isinstance(registry, S3Registry)
    original = make_artifact()
    version = registry.publish("dcr", original)
    assert registry.models() == ["dcr"] and registry.versions("dcr") == [version]
    assert registry.live_version("dcr") == (version, "newest")
    # A second replica, with its own empty cache, sees the same thing.
    other = S3Registry(s3_url, cache_dir=tmp_path / "cache2")
    loaded = other.load("dcr")
    assert loaded.version == version and loaded.path.is_relative_to(tmp_path / "cache2")
    for key, array in original.arrays.items():
        np.testing.assert_array_equal(loaded.arrays[key], array)
    assert isinstance(loaded.arrays["user_factors"], np.memmap)
    assert loaded.ids["users"] == original.ids["users"]
    assert loaded.hyperparameters == {"rank": 3, "lr": 0.05, "name": "x"}
    # The store holds exactly the manifest and every file it lists.
    bucket, prefix = parse_s3_url(s3_url)
    manifest = other.manifest("dcr", version)
    expected = sorted(f"{prefix}/dcr/{version}/{p}" for p in [*manifest_paths(manifest), "manifest.json"])
    assert _keys(s3_url) == expected


def test_views_are_published_and_verified(s3_url, tmp_path):
    registry = S3Registry(s3_url, cache_dir=tmp_path)
    registry.publish("m", make_artifact(), views=lambda a: {"report.html": f"<p>{a.version}</p>".encode()})
    loaded = registry.load("m")
    assert loaded.views["report.html"].data == f"<p>{loaded.version}</p>".encode()


def test_versions_pin_prune_and_keep(s3_url, tmp_path):
    registry = S3Registry(s3_url, cache_dir=tmp_path)
    versions = [registry.publish("m", make_artifact(i)) for i in range(4)]
    assert versions == sorted(versions) == registry.versions("m")
    registry.pin("m", versions[0])
    assert registry.live_version("m") == (versions[0], "pinned")
    assert registry.load("m").version == versions[0]
    with pytest.raises(ArtifactError, match="unknown version"):
        registry.pin("m", "20200101T000000.000000Z")
    assert registry.prune("m", keep=2) == versions[1:2]
    assert registry.versions("m") == [versions[0], *versions[2:]]  # the pinned one stays
    assert not [k for k in _keys(s3_url) if versions[1] in k]  # every object of the pruned one went
    registry.unpin("m")
    assert registry.live_version("m") == (versions[-1], "newest")
    newest = registry.publish("m", make_artifact(9), keep=1)
    assert registry.versions("m") == [newest]


def test_cli_manages_an_s3_registry(s3_url, sample_dir, tmp_path):
    out = run_cli(
        [
            "ordrec.trainer",
            "train",
            "dcr",
            "--data",
            str(sample_dir / "ratings.data"),
            "--registry",
            s3_url,
            "--set",
            "max_iter=2",
        ]
    ).stdout
    assert f"to {s3_url}" in out
    listing = run_cli(["ordrec.trainer", "registry", "versions", "--registry", s3_url]).stdout
    assert "live:newest" in listing and listing.startswith("dcr\t")


def _paused_s3_publisher(url: str) -> subprocess.Popen:
    """A real publisher that stops for 30 s once it has uploaded its first file."""
    script = textwrap.dedent(f"""
        import time
        import numpy as np
        from ordrec.service.storage.artifact import Artifact
        from ordrec.service.storage.idmap import IdMap
        from ordrec.service.storage.objectstore import S3Registry
        registry = S3Registry({url!r})
        original = registry.client.upload_file
        def slow_upload(*args, **kwargs):
            original(*args, **kwargs)
            print("uploaded", args[2], flush=True)
            time.sleep(30)
        registry.client.upload_file = slow_upload
        big = np.zeros((1000, 100), np.float32)
        registry.publish("m", Artifact("dcr", {{"big": big}}, {{"users": IdMap(["x"])}}))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert "uploaded" in proc.stdout.readline()
    return proc


def test_publisher_killed_midway_leaves_no_visible_version(s3_url, tmp_path):
    registry = S3Registry(s3_url, cache_dir=tmp_path)
    first = registry.publish("m", make_artifact())
    before = _keys(s3_url)
    proc = _paused_s3_publisher(s3_url)
    try:
        assert len(_keys(s3_url)) > len(before)  # the killed publisher's first object is in the store
        assert registry.versions("m") == [first]  # but no version shows
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    assert registry.versions("m") == [first]
    assert registry.load("m").version == first
    assert registry.gc() == []  # too young: a live publisher could still be uploading
    assert len(_keys(s3_url)) > len(before)
    old = S3Registry(s3_url, cache_dir=tmp_path, stale_seconds=0)
    removed = old.gc()
    assert len(removed) == 1 and removed[0].startswith(f"{s3_url}/m/")
    assert _keys(s3_url) == before  # only the leftovers went


def test_corrupt_object_is_refused_and_not_cached(s3_url, tmp_path):
    registry = S3Registry(s3_url, cache_dir=tmp_path / "cache")
    good = registry.publish("m", make_artifact(0))
    bad = registry.publish("m", make_artifact(1))
    bucket, prefix = parse_s3_url(s3_url)
    key = f"{prefix}/m/{bad}/arrays/user_factors.npy"
    body = bytearray(_client().get_object(Bucket=bucket, Key=key)["Body"].read())
    body[-1] ^= 0xFF
    _client().put_object(Bucket=bucket, Key=key, Body=bytes(body))
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        registry.load("m", bad)
    assert not list((tmp_path / "cache").rglob(bad))
    assert registry.load("m", good).version == good


def test_missing_object_and_hostile_paths_are_refused(s3_url, tmp_path):
    registry = S3Registry(s3_url, cache_dir=tmp_path / "cache")
    version = registry.publish("m", make_artifact())
    bucket, prefix = parse_s3_url(s3_url)
    _client().delete_object(Bucket=bucket, Key=f"{prefix}/m/{version}/ids/users.txt")
    with pytest.raises(ArtifactError, match="missing"):
        registry.load("m")
    hostile = registry.manifest("m", version)
    hostile.arrays[0].path = "../../escape.npy"
    from google.protobuf import json_format

    _client().put_object(
        Bucket=bucket,
        Key=f"{prefix}/m/{version}/manifest.json",
        Body=json_format.MessageToJson(hostile).encode(),
    )
    with pytest.raises(ArtifactError, match="escapes"):
        registry.load("m")
    assert not list((tmp_path / "cache").rglob("escape.npy"))


def test_unfinished_versions_older_than_an_hour_are_the_only_garbage(s3_url, tmp_path):
    registry = S3Registry(s3_url, cache_dir=tmp_path)
    registry.publish("m", make_artifact())
    bucket, prefix = parse_s3_url(s3_url)
    orphan = dt.datetime(2020, 1, 1).strftime("%Y%m%dT%H%M%S.%fZ")
    _client().put_object(Bucket=bucket, Key=f"{prefix}/m/{orphan}/arrays/x.npy", Body=b"x")
    _client().put_object(Bucket=bucket, Key=f"{prefix}/m/PINNED.bak", Body=b"x")  # not a version: untouched
    assert registry.gc() == []  # uploaded just now
    assert S3Registry(s3_url, cache_dir=tmp_path, stale_seconds=0).gc() == [f"{s3_url}/m/{orphan}/"]
    assert f"{prefix}/m/PINNED.bak" in _keys(s3_url)


def test_job_publishes_to_s3_and_gates_against_the_live_manifest(s3_url, sample_dir, tmp_path):
    """``ordrec-train run`` with ``registry = "s3://..."``: publish, then a worse model is
    rejected by comparing with the live version's manifest read from the store."""
    from ordrec.trainer.job import EXIT_PUBLISHED, EXIT_REJECTED, load_job, run_job
    from tests.test_job import BAD, GOOD, job_text, write_job

    lock = tmp_path / "job.lock"
    good = write_job(tmp_path, job_text(sample_dir, s3_url, GOOD, extra_job=f'lock = "{lock}"'), "good.toml")
    bad = write_job(tmp_path, job_text(sample_dir, s3_url, BAD), "bad.toml")
    assert load_job(good).registry == s3_url  # not resolved as a path
    assert str(load_job(bad).lock).startswith(tempfile.gettempdir())  # the default lock is local
    assert run_job(good) == EXIT_PUBLISHED
    registry = S3Registry(s3_url, cache_dir=tmp_path / "cache")
    (first,) = registry.versions("dcr")
    assert registry.manifest("dcr", first).metrics["holdout_ndcg_at_10"] > 0.5
    assert run_job(bad) == EXIT_REJECTED
    assert registry.versions("dcr") == [first]


def test_an_unreachable_store_is_retried_not_refused(s3_url, sample_registry, tmp_path):
    """A download that fails for network reasons says nothing about the version: the
    server keeps what it serves and loads the version at the next poll."""
    from botocore.exceptions import EndpointConnectionError

    from ordrec.service.metrics import Metrics
    from ordrec.service.serving.store import ModelStore

    source = Registry(sample_registry).load("dcr", mmap=False)
    publisher = S3Registry(s3_url, cache_dir=tmp_path / "pub")
    first = publisher.publish("m", source)
    registry = S3Registry(s3_url, cache_dir=tmp_path / "cache")
    store = ModelStore(registry, Metrics())
    assert store.refresh() == ["m"] and store.snapshot()["m"].version == first
    second = publisher.publish("m", source)
    download = registry.client.download_file

    def unreachable(*args, **kwargs):
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")

    registry.client.download_file = unreachable
    assert store.refresh() == [] and store.snapshot()["m"].version == first
    assert store.refused() == {}
    registry.client.download_file = download
    assert store.refresh() == ["m"] and store.snapshot()["m"].version == second


def test_a_cached_copy_is_used_only_with_the_stores_manifest(s3_url, tmp_path):
    """A cache folder whose manifest differs from the store's (stale, or planted by
    someone who can write the cache) is downloaded afresh, never trusted."""
    registry = S3Registry(s3_url, cache_dir=tmp_path / "cache")
    version = registry.publish("m", make_artifact(0))
    folder = registry.fetch("m", version)
    assert registry.fetch("m", version) == folder  # the same manifest: the cached copy serves
    planted = registry.manifest("m", version)
    users = next(e for e in planted.ids if e.space == "users")
    users.count, users.sha256 = 1, hashlib.sha256(b"only\n").hexdigest()  # consistent with itself
    from google.protobuf import json_format

    (folder / "manifest.json").write_text(json_format.MessageToJson(planted))
    (folder / "ids" / "users.txt").write_text("only\n")
    loaded = registry.load("m", version)
    assert len(loaded.ids["users"]) == 5  # the store's version, downloaded again


def test_the_default_cache_lives_in_a_private_folder(s3_url, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    registry = S3Registry(s3_url)
    registry.publish("m", make_artifact())
    loaded = registry.load("m")
    assert loaded.path.is_relative_to(tmp_path / "xdg" / "ordrec" / "registry")
    assert (loaded.path.parent.stat().st_mode & 0o077) == 0


def test_hidden_items_live_in_the_store_without_redis(s3_url, sample_dir, tmp_path):
    """No Redis: a hide through the server or the trainer's CLI goes into the store's HIDDEN objects,
    and every replica reading the store follows it at its poll."""
    import grpc

    from ordrec.tools.process import ServerProcess, wait_for
    from ordrec.v1 import recommender_pb2 as pb
    from ordrec.v1 import recommender_pb2_grpc
    from tests.admin_token import ADMIN_FLAGS, ADMIN_METADATA

    train = ["ordrec.trainer", "train", "dcr", "--data", str(sample_dir / "ratings.data")]
    run_cli([*train, "--registry", s3_url, "--set", "max_iter=2"])
    flags = ["--poll-interval", "0.5", *ADMIN_FLAGS]
    with (
        ServerProcess(s3_url, *flags, "--cache-dir", str(tmp_path / "a")) as a,
        ServerProcess(s3_url, *flags, "--cache-dir", str(tmp_path / "b")) as b,
        grpc.insecure_channel(a.target) as ca,
        grpc.insecure_channel(b.target) as cb,
    ):
        sa, sb = recommender_pb2_grpc.RecommenderStub(ca), recommender_pb2_grpc.RecommenderStub(cb)

        def top(stub) -> list[str]:
            reply = stub.Recommend(pb.RecommendRequest(model="dcr", user_ids=["u001"], n=10), timeout=5)
            return [i.id for i in reply.results[0].items]

        before = top(sa)
        assert (
            sa.HideItems(
                pb.HideItemsRequest(model="dcr", item_ids=before[:2]), timeout=5, metadata=ADMIN_METADATA
            ).changed
            == 2
        )
        assert not set(before[:2]) & set(top(sa))
        wait_for(lambda: not set(before[:2]) & set(top(sb)), 5, what="replica b follows the store")
        run_cli(["ordrec.trainer", "registry", "hide", "--registry", s3_url, before[2]])  # all models
        wait_for(lambda: before[2] not in top(sa) and before[2] not in top(sb), 5, what="the CLI's hide")
        assert S3Registry(s3_url).hidden_scopes() == {
            "*": frozenset(before[2:3]),
            "dcr": frozenset(before[:2]),
        }
        run_cli(["ordrec.trainer", "registry", "unhide", "--registry", s3_url, "--model", "dcr", *before[:2]])
        run_cli(["ordrec.trainer", "registry", "unhide", "--registry", s3_url, before[2]])
        wait_for(lambda: top(sa) == before and top(sb) == before, 5, what="unhide")
