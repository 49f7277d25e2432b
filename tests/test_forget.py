"""Forgetting a user end to end: two ``ordrec-serve`` replicas, a real redis-server with its
append-only file, a moto S3 registry and real ``ordrec-train run`` jobs with ``[events]``.

The user is in the operator's ratings file and recorded interactions through the
server; after ``ordrec-client forget`` and the next training no object in the
registry, no Redis key, value or stream entry, no file of Redis on disk, no export
and no server log line holds their id, and their answer is the fallback's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import boto3
import grpc
import pytest
import redis

from ordrec.client import Client
from ordrec.service.storage.objectstore import parse_s3_url
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess, run_cli, wait_for
from ordrec.v1 import recommender_pb2 as pb
from tests.admin_token import ADMIN_ENV, ADMIN_FLAGS, ADMIN_METADATA
from tests.conftest import SAMPLE_MODELS, train_into
from tests.test_job import job_text

pytestmark = pytest.mark.redis

USER = "erase-me-7f3a"  # distinctive: a substring search cannot hit it by chance
KEPT = "keep-me-51c9"  # recorded alike and never forgotten: the searches can find what is there


def ratings_with_user(sample: Path, folder: Path) -> Path:
    """The operator's input: the sample ratings plus a few of USER's."""
    lines = (sample / "ratings.data").read_text()
    extra = "".join(f"{USER}\ti{n:03d}\t{1 + n % 5}\t88125000{n}\n" for n in range(1, 9))
    path = folder / "ratings.data"
    path.write_text(lines + extra)
    return path


def write_job(folder: Path, ratings: Path, registry: str, url: str) -> Path:
    # Path() would fold s3:// into s3:/, hence the placeholder
    text = job_text(ratings.parent, Path("REGISTRY"), "n_components = 4, max_iter = 3", 1.0)
    text = text.replace('registry = "REGISTRY"', f'registry = "{registry}"\nlock = "{folder / "job.lock"}"')
    path = folder / "job.toml"
    path.write_text(text + f'\n[events]\nredis = "{url}"\ntimeout = 2\n')
    return path


def run_job(job: Path) -> str:
    result = run_cli(["ordrec.trainer", "run", str(job)], check=False)
    assert result.returncode == 0, result.stderr
    return result.stderr


def s3_objects(url: str) -> dict[str, bytes]:
    bucket, prefix = parse_s3_url(url)
    s3 = boto3.session.Session().client("s3")
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for o in page.get("Contents", [])
    ]
    return {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys if k.startswith(prefix)}


def redis_dump(client: redis.Redis) -> list[bytes]:
    """Every key, every value (DUMP) and every stream entry, as bytes."""
    found = []
    for key in client.scan_iter(count=1000):
        found += [key, client.dump(key) or b""]
        if client.type(key) == b"stream":
            for entry_id, fields in client.xrange(key):
                found += [entry_id, *fields.keys(), *fields.values()]
    return found


def aof_files(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def replica(registry: str, redis_url: str, cache: Path) -> ServerProcess:
    """One of the replicas sharing the S3 registry and Redis, sampling every answer."""
    options = ["--redis", redis_url, "--poll-interval", "0.2", "--online-sample-rate", "1"]
    return ServerProcess(registry, *options, *ADMIN_FLAGS, "--cache-dir", str(cache))


def holding(blobs, needle: str) -> list:
    return [b for b in blobs if needle.encode() in (b if isinstance(b, bytes) else str(b).encode())]


def wait_rewritten(client: redis.Redis) -> None:
    def done() -> bool:
        info = client.info("persistence")
        return not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]

    wait_for(done, timeout=30, what="the append-only file rewrite")


def test_a_forgotten_user_is_gone_from_every_store_and_answered_as_unknown(
    aof_redis, s3_url, sample_dir, tmp_path
):
    ratings = ratings_with_user(sample_dir, tmp_path)
    job = write_job(tmp_path, ratings, s3_url, aof_redis.url)
    run_job(job)  # version 1: USER from the ratings file
    raw = redis.Redis.from_url(aof_redis.url)
    with (
        replica(s3_url, aof_redis.url, tmp_path / "cache") as proc,
        replica(s3_url, aof_redis.url, tmp_path / "cache-2") as other,
        Client(proc.target, timeout=10) as client,
        Client(other.target, timeout=10) as other_client,
    ):
        for user in (USER, KEPT):
            client.record(user, ratings={"i020": 5.0, "i021": 4.0, "i022": 1.0}, model="dcr")
            client.recommend(user, model="dcr", n=5)  # sampled: an online-evaluation key
        first = client.models().models[0].version
        run_job(job)  # version 2: trained on the recorded events too
        for each in (client, other_client):
            wait_for(
                lambda c=each: c.models().models[0].version != first, timeout=30, what="version 2 to load"
            )
        assert other_client.recommend(USER, model="dcr", n=10).results[0].fallback == pb.FALLBACK_NONE
        assert holding(s3_objects(s3_url).values(), USER) and holding(redis_dump(raw), USER)
        assert holding(aof_files(aof_redis.aof_dir).values(), USER)  # the searches find what is there

        started = time.monotonic()
        out = forget_via(proc, USER, "--reason", "ticket 123")
        erased = time.monotonic() - started
        # the other replica: answers the user as unknown within --hidden-interval (0.2 s)
        wait_for(
            lambda: other_client.recommend(USER, model="dcr", n=10).results[0].fallback != pb.FALLBACK_NONE,
            timeout=2,
            interval=0.01,
            what="the other replica to forget the user",
        )
        propagated = time.monotonic() - started - erased
        reply = json.loads(out)
        counts = {
            k: int(reply[k])
            for k in ("stream_entries", "seen_items", "ratings", "served_keys", "checkpoint_events")
        }
        assert counts == {
            "stream_entries": 3,
            "seen_items": 3,
            "ratings": 3,
            "served_keys": 1,
            "checkpoint_events": 3,
        }
        assert len(reply["versions_removed"]) == 1 and len(reply["versions_pending"]) == 1  # v1 gone, v2 live
        assert reply["redis_rewrite"] == "append-only file rewrite started"

        unknown = client.recommend("never-seen-user", model="dcr", n=10).results[0]
        answer = client.recommend(USER, model="dcr", n=10).results[0]
        # exactly a never-seen user's answer: the fallback (trending, as interactions were recorded)
        assert answer.fallback == unknown.fallback != pb.FALLBACK_NONE and not answer.folded_in
        assert [(i.id, i.score) for i in answer.items] == [(i.id, i.score) for i in unknown.items]
        assert client.record(USER, ["i030"]).forgotten  # nothing recorded any more
        print(f"time to erasure: the CLI's call {erased:.2f} s, the other replica {propagated:.3f} s later")

        log = run_job(job)  # version 3: trained without USER; version 2 replaced by its redacted copy
        assert "forgotten users=1 rows=8 dropped" in log and "forgotten=0" in log
        assert "redacted 1 version(s) naming forgotten users" in log
        wait_for(lambda: client.models().models[0].version not in (first,), timeout=30, what="version 3")
        live = client.models().models[0].version
        answer = client.recommend(USER, model="dcr", n=10).results[0]
        assert answer.fallback == client.recommend("never-seen-user", model="dcr").results[0].fallback
        assert answer.fallback != pb.FALLBACK_NONE and not answer.folded_in
        run_cli(
            [
                "ordrec.trainer",
                "export",
                "dcr",
                "--registry",
                s3_url,
                "--n",
                "5",
                "--out",
                str(tmp_path / "recs.jsonl"),
            ]
        )
        run_cli(
            [
                "ordrec.trainer",
                "events",
                "export",
                "--redis",
                aof_redis.url,
                "--out",
                str(tmp_path / "events.csv"),
            ]
        )
        server_log = "".join(proc.output + other.output)
    wait_rewritten(raw)

    objects = s3_objects(s3_url)
    assert not [k for k, body in objects.items() if USER.encode() in k.encode() + body]
    assert [k for k, body in objects.items() if KEPT.encode() in body]  # kept users stay
    assert live in {k.split("/")[2] for k in objects if k.count("/") > 2}
    assert not holding(redis_dump(raw), USER) and holding(redis_dump(raw), KEPT)
    assert not [p for p, body in aof_files(aof_redis.aof_dir).items() if USER.encode() in body]
    exports = [(tmp_path / "recs.jsonl").read_text(), (tmp_path / "events.csv").read_text()]
    assert KEPT in exports[0] and KEPT in exports[1] and not holding(exports, USER)
    assert USER not in server_log and "ticket 123" in server_log


def test_forget_is_refused_with_a_clear_status_for_bad_requests(sample_registry):
    with ServerProcess(sample_registry, *ADMIN_FLAGS) as proc, grpc.insecure_channel(proc.target) as channel:
        stub = pb_stub(channel)
        for request, field in (
            (pb.ForgetUserRequest(user_id=""), "user_id"),
            (pb.ForgetUserRequest(user_id="x" * 5000), "user_id"),
            (pb.ForgetUserRequest(user_id="u001", reason="line\nbreak"), "reason"),
            (pb.ForgetUserRequest(user_id="u001", reason="r" * 2000), "reason"),
        ):
            with pytest.raises(grpc.RpcError) as err:
                stub.ForgetUser(request, timeout=10, metadata=ADMIN_METADATA)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()
        raw = channel.unary_unary("/ordrec.v1.Recommender/ForgetUser")  # bytes in, bytes out
        for garbage in (b"\xff\xff\xff", b"\x0a\xff\x01", b"\x12" + b"\x80" * 11):
            with pytest.raises(grpc.RpcError) as err:
                raw(garbage, timeout=10, metadata=ADMIN_METADATA)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, garbage


def pb_stub(channel):
    from ordrec.v1 import recommender_pb2_grpc

    return recommender_pb2_grpc.RecommenderStub(channel)


def test_without_redis_the_registry_list_reaches_a_running_server(sample_dir, tmp_path):
    """``ordrec-train registry forget`` on a local registry, no Redis: the server reads FORGOTTEN at its
    poll; both versions naming the user are replaced by redacted copies at once (the newest
    stays live); the next ``ordrec-train train`` drops the user's rows."""
    registry = tmp_path / "registry"
    dcr = [("dcr", "dcr", "ratings.data", ["--set", "max_iter=2"])]
    train_into(train_into(registry, sample_dir, dcr), sample_dir, dcr)
    with ServerProcess(registry, "--poll-interval", "0.2") as proc, Client(proc.target, timeout=10) as client:
        before = client.recommend("u001", model="dcr", n=5).results[0]
        assert before.fallback == pb.FALLBACK_NONE
        out = run_cli(
            ["ordrec.trainer", "registry", "forget", "--registry", str(registry), "--user", "u001"]
        ).stdout
        assert "versions removed 0, redacted 2" in out and "pending" not in out and "u001" not in out
        old = Registry(registry).versions("dcr")
        assert len(old) == 2 and Registry(registry).live_version("dcr")[0] == old[-1]
        assert all(Registry(registry).load("dcr", v).attributes["redacted_from"] for v in old)
        assert not [p for p in registry.rglob("*") if p.is_file() and b"u001\n" in p.read_bytes()]
        wait_for(
            lambda: (
                client.recommend("u001", model="dcr", n=5).results[0].fallback == pb.FALLBACK_POPULAR_GLOBAL
            ),
            timeout=10,
            what="the FORGOTTEN list to reach the server",
        )
        assert client.record("u001", ["i001"]).forgotten  # answered before Redis is needed
    train_into(registry, sample_dir, dcr)  # drops the user's rows
    assert len(Registry(registry).versions("dcr")) == 3
    files = [p for p in registry.rglob("*") if p.is_file()]
    assert not [p for p in files if b"u001\n" in p.read_bytes()]
    assert [p for p in files if b"u002\n" in p.read_bytes()]  # the search finds a kept user


def test_a_forgotten_user_leaves_the_maps_and_gets_cold_start_tags(sample_dir, tmp_path):
    """COE's map: Neighbors from the user is NOT_FOUND, it never returns them, Coordinates
    leaves them out; RTF's Tags answer them as a new user (from the redacted copies the
    CLI put in the versions' place)."""
    rtf = next(m for m in SAMPLE_MODELS if m[0] == "rtf")
    registry = train_into(
        tmp_path / "registry", sample_dir, [("coe", "coe", "ratings.data", ["--set", "max_iter=2"]), rtf]
    )
    with ServerProcess(registry, "--poll-interval", "0.2") as proc, Client(proc.target, timeout=10) as client:
        assert client.tags("u001", "i139", model="rtf", n=3).fallback == pb.FALLBACK_NONE
        run_cli(["ordrec.trainer", "registry", "forget", "--registry", str(registry), "--user", "u001"])
        wait_for(
            lambda: client.tags("u001", "i139", model="rtf", n=3).fallback != pb.FALLBACK_NONE,
            timeout=10,
            what="the list to reach the server",
        )
        with pytest.raises(grpc.RpcError) as err:
            client.neighbors("u001", model="coe", from_entity="user", to_entity="user", k=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        near = client.neighbors("u002", model="coe", from_entity="user", to_entity="user", k=299)
        assert len(near.neighbors) >= 297 and "u001" not in {n.id for n in near.neighbors}
        points = [p.id for page in client.coordinates(model="coe", entity_kind="user") for p in page.points]
        assert len(points) == 299 and "u001" not in points


@pytest.mark.slow  # three job runs and a replica: about 50 s on the shared machine
def test_a_rejected_run_still_redacts_the_pinned_and_candidate_versions_naming_the_user(
    aof_redis, s3_url, sample_dir, tmp_path, monkeypatch
):
    """The versions naming the user are the pinned live one and a split's candidate; the
    ForgetUser call leaves them pending; the next run, rejected by its gate, replaces both by
    redacted copies (the pin and the split follow them), the replica loads them, and then no
    object in the registry nor anything in Redis holds the id, while the kept user's answers
    are what they were."""
    from ordrec.service.storage.objectstore import open_registry
    from tests.test_job import BAD, job_text

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the default download cache
    ratings = ratings_with_user(sample_dir, tmp_path)
    job = write_job(tmp_path, ratings, s3_url, aof_redis.url)
    run_job(job)
    run_job(job)
    TRAINED = "u002"  # a user of the sample ratings, kept
    registry = open_registry(s3_url, cache_dir=tmp_path / "trainer-cache")
    first, second = registry.versions("dcr")
    registry.pin("dcr", first)
    registry.set_split("dcr", second, 0.5)
    rejecting = tmp_path / "rejecting.toml"
    rejecting.write_text(
        job.read_text().replace(
            job_text(ratings.parent, Path("X"), "n_components = 4, max_iter = 3", 1.0).split("[[models]]")[1],
            job_text(ratings.parent, Path("X"), BAD, 0.0).split("[[models]]")[1],
        )
    )
    assert "max_iter = 0" in rejecting.read_text()
    raw = redis.Redis.from_url(aof_redis.url)
    with (
        replica(s3_url, aof_redis.url, tmp_path / "cache") as proc,
        Client(proc.target, timeout=10) as client,
    ):
        client.record(USER, ratings={"i020": 5.0}, model="dcr")
        kept_before = client.recommend(TRAINED, model="dcr", n=10).results[0]
        reply = json.loads(forget_via(proc, USER))
        assert sorted(reply["versions_pending"]) == [f"dcr@{first}", f"dcr@{second}"]
        result = run_cli(["ordrec.trainer", "run", str(rejecting)], check=False)
        assert result.returncode == 3 and "result=rejected" in result.stderr, result.stderr
        assert "redacted 2 version(s) naming forgotten users" in result.stderr
        first_copy, second_copy = registry.versions("dcr")
        assert first < first_copy < second < second_copy
        assert registry.pinned("dcr") == first_copy and registry.split("dcr").candidate == second_copy
        wait_for(
            lambda: client.models().models[0].version == first_copy, timeout=30, what="the redacted copy"
        )
        answer = client.recommend(USER, model="dcr", n=10).results[0]
        unknown = client.recommend("never-seen-user", model="dcr", n=10).results[0]
        assert answer.fallback == unknown.fallback != pb.FALLBACK_NONE
        assert [(i.id, i.score) for i in answer.items] == [(i.id, i.score) for i in unknown.items]
        kept_after = client.recommend(TRAINED, model="dcr", n=10).results[0]
        assert kept_after.fallback == pb.FALLBACK_NONE
        if kept_before.model_version == first:  # the same side of the split: the same answer
            assert [(i.id, i.score) for i in kept_after.items] == [(i.id, i.score) for i in kept_before.items]
    wait_rewritten(raw)
    objects = s3_objects(s3_url)
    assert not [k for k, body in objects.items() if USER.encode() in k.encode() + body]
    assert [k for k, body in objects.items() if TRAINED.encode() in body]
    assert not holding(redis_dump(raw), USER)
    assert not [p for p, body in aof_files(aof_redis.aof_dir).items() if USER.encode() in body]
    cached = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # the replica's
    assert cached and not [p for p in cached if USER.encode() in p.read_bytes()]
    assert not (tmp_path / "xdg").exists()  # the jobs loaded the originals into folders they removed


def forget_via(proc: ServerProcess, user: str, *flags: str) -> str:
    """``ordrec-client forget --json [flags]`` against ``proc``: its stdout (the server's log on
    failure)."""
    result = run_cli(
        [
            "ordrec.client_cli",
            "--target",
            proc.target,
            "--token-env",
            ADMIN_ENV,
            "forget",
            "--user",
            user,
            *flags,
            "--json",
        ],
        check=False,
    )
    assert result.returncode == 0, result.stderr + "".join(proc.output)
    return result.stdout
