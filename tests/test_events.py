"""Recorded interactions as training data: merge, checkpoint, trimming, export, the job's
``[events]`` source and RecordInteractions' checks (real redis-server and server processes)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import grpc
import numpy as np
import pytest
import redis

from ordrec.client import Client
from ordrec.service.live.redis_state import EVENTS_STREAM
from ordrec.service.storage.idmap import IdMap, PackedIdMap, numbered_ids
from ordrec.service.storage.objectstore import S3Registry
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess, run_cli
from ordrec.trainer.data.types import Ratings, RatingScale
from ordrec.trainer.events import (
    CHECKPOINT_FILE,
    Checkpoint,
    Event,
    EventFeed,
    EventsError,
    load_checkpoint,
    merge,
    save_checkpoint,
    stream_id,
    with_events,
)
from ordrec.trainer.job import EXIT_FAILED, EXIT_PUBLISHED, EXIT_REJECTED, EXIT_USAGE, run_job
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.test_job import job_text
from tests.test_registry import make_artifact

pytestmark = pytest.mark.redis


def ev(n: int, user: str, item: str, value: float | None = 4.0, model: str | None = None) -> Event:
    return Event(f"{n}-0", user, item, float(n), value, model)


# --------------------------------------------------------------- merging
def test_a_later_value_replaces_the_earlier_and_rereading_changes_nothing():
    latest: dict = {}
    events = [ev(1, "u", "a", 2.0), ev(2, "u", "b", 3.0), ev(3, "u", "a", 5.0)]
    merge(latest, events)
    assert {k: e.value for k, e in latest.items()} == {("u", "a"): 5.0, ("u", "b"): 3.0}
    before = dict(latest)
    merge(latest, events)  # a crashed run's events, read again
    assert latest == before


def test_an_event_without_value_never_erases_a_rating():
    latest: dict = {}
    merge(latest, [ev(1, "u", "a", 4.0), ev(2, "u", "a", None), ev(3, "u", "b", None)])
    assert latest[("u", "a")].value == 4.0
    assert latest[("u", "b")].value is None
    merge(latest, [ev(4, "u", "b", 1.0)])
    assert latest[("u", "b")].value == 1.0


def test_events_replace_base_ratings_and_bring_new_users_and_items():
    base = Ratings(
        IdMap(["u1", "u2"]),
        IdMap(["a", "b"]),
        np.array([0, 0, 1], dtype=np.int32),
        np.array([0, 1, 0], dtype=np.int32),
        np.array([1, 2, 3], dtype=np.float32),
    )
    merged = with_events(base, [ev(1, "u1", "b", 5.0), ev(2, "new", "c", 4.0)])
    assert merged.users.ids == ["u1", "u2", "new"] and merged.items.ids == ["a", "b", "c"]
    triples = {
        (merged.users.external(u), merged.items.external(i), float(r))
        for u, i, r in zip(merged.user, merged.item, merged.rating)
    }
    assert triples == {("u1", "a", 1.0), ("u1", "b", 5.0), ("u2", "a", 3.0), ("new", "c", 4.0)}
    assert len(merged) == 4  # replaced, not added
    assert with_events(base, []) is base


def test_events_keep_a_large_id_space_packed(monkeypatch):
    """A read's packed maps stay packed when events bring new ids (no dict of every id)."""
    monkeypatch.setattr("ordrec.service.storage.idmap.PACKED_MIN_IDS", 3)
    users, items = numbered_ids(4), numbered_ids(3)
    base = Ratings(users, items, *(np.arange(3, dtype=t) for t in (np.int32, np.int32, np.float32)))
    merged = with_events(base, [ev(1, "new", "1", 5.0), ev(2, "3", "fresh", 4.0)])
    assert isinstance(merged.users, PackedIdMap) and isinstance(merged.items, PackedIdMap)
    assert list(merged.users.ids) == ["0", "1", "2", "3", "new"] and merged.items.row("fresh") == 3
    triples = {(merged.users.external(u), merged.items.external(i)) for u, i in zip(merged.user, merged.item)}
    assert triples == {("0", "0"), ("1", "1"), ("2", "2"), ("new", "1"), ("3", "fresh")}


def test_stream_ids_are_checked():
    assert stream_id("1700000000000-12") == (1700000000000, 12)
    assert stream_id("2-0") > stream_id("1-9")
    for bad in ("", "12", "1-x", "-1-0", "1-0 "):
        with pytest.raises(ValueError, match="not a stream id"):
            stream_id(bad)


# ------------------------------------------------------------ checkpoint
def test_checkpoint_round_trip_keeps_only_the_named_file(tmp_path):
    registry = Registry(tmp_path)
    assert load_checkpoint(registry, "dcr").last_id is None  # never trained on events
    first = Checkpoint("2-0")
    merge(first.latest, [ev(1, "u", "a"), ev(2, "v", "b", None)])
    save_checkpoint(registry, "dcr", first)
    second = Checkpoint("3-0", dict(first.latest))
    merge(second.latest, [ev(3, "u", "a", 1.0)])
    save_checkpoint(registry, "dcr", second)
    loaded = load_checkpoint(registry, "dcr")
    assert loaded.last_id == "3-0" and loaded.latest == second.latest
    head = json.loads((tmp_path / "dcr" / CHECKPOINT_FILE).read_text())
    assert registry.model_files("dcr", "events") == [head["file"]]  # the first file is gone
    assert head["events"] == 2


def test_a_damaged_accumulated_file_fails_loudly(tmp_path):
    registry = Registry(tmp_path)
    checkpoint = Checkpoint("1-0")
    merge(checkpoint.latest, [ev(1, "u", "a")])
    save_checkpoint(registry, "dcr", checkpoint)
    (path,) = (tmp_path / "dcr" / "events").iterdir()
    path.write_bytes(path.read_bytes().replace(b'"u"', b'"x"'))
    with pytest.raises(EventsError, match="does not match its sha256"):
        load_checkpoint(registry, "dcr")
    path.unlink()
    with pytest.raises(EventsError, match="is missing"):
        load_checkpoint(registry, "dcr")
    (tmp_path / "dcr" / CHECKPOINT_FILE).write_text("{not json")
    with pytest.raises(EventsError, match="damaged"):
        load_checkpoint(registry, "dcr")


def test_model_file_names_cannot_escape_the_model_folder(tmp_path):
    registry = Registry(tmp_path)
    for bad in ("../PINNED", "events/../../x", ".hidden", "a/b/c", "/etc/passwd", "20261125T223500.123456Z"):
        with pytest.raises(ValueError, match="not a model file name"):
            registry.write_model_file("dcr", bad, b"x")


def test_the_checkpoint_lives_in_an_s3_registry_too(s3_url, tmp_path):
    registry = S3Registry(s3_url, cache_dir=tmp_path / "cache")
    checkpoint = Checkpoint("5-0")
    merge(checkpoint.latest, [ev(5, "u", "a", 3.0)])
    save_checkpoint(registry, "dcr", checkpoint)
    save_checkpoint(registry, "dcr", checkpoint)  # the same content: the same file, kept
    assert load_checkpoint(registry, "dcr").latest == checkpoint.latest
    assert len(registry.model_files("dcr", "events")) == 1
    assert registry.versions("dcr") == []  # side files never look like versions


# ---------------------------------------------------------------- stream
def xadd(client, user, item, value=None, model=None, maxlen=None) -> str:
    fields = {"user": user, "item": item, "ts": "1.5"}
    if value is not None:
        fields["value"] = str(value)
    if model:
        fields["model"] = model
    return client.xadd(EVENTS_STREAM, fields, maxlen=maxlen, approximate=False)


@pytest.fixture
def client(redis_server):
    return redis.Redis.from_url(redis_server.url, decode_responses=True)


def test_the_feed_reads_after_the_checkpoint_and_commits_only_when_told(client, tmp_path):
    registry = Registry(tmp_path)
    ids = [xadd(client, f"u{n}", "a", n % 5 + 1) for n in range(7)]
    feed = EventFeed(registry, "dcr", client, page=2)
    feed.read()
    assert feed.next.last_id == ids[-1] and len(feed.next.latest) == 7
    again = EventFeed(registry, "dcr", client, page=2)  # not committed: the same events again
    again.read()
    assert again.next.latest == feed.next.latest
    feed.commit()
    later = [xadd(client, "u0", "a", 1), xadd(client, "w", "b", 2)]
    after = EventFeed(registry, "dcr", client, page=2)
    after.read()
    assert after.checkpoint.last_id == ids[-1]
    assert after.counts.read == 2 and after.next.last_id == later[-1]
    assert after.next.latest[("u0", "a")].value == 1.0 and len(after.next.latest) == 8


def test_other_models_and_malformed_entries_are_skipped_and_counted(client, tmp_path):
    xadd(client, "u", "a", 3, model="dcr")
    xadd(client, "u", "b", 3, model="coe")
    xadd(client, "u", "c")
    client.xadd(EVENTS_STREAM, {"user": "u", "item": "d", "ts": "soon"})
    client.xadd(EVENTS_STREAM, {"user": "u", "item": "e", "ts": "1", "value": "nan"})
    # ids an artifact cannot hold (one a line), written by something other than the server
    client.xadd(EVENTS_STREAM, {"user": "u\nv", "item": "g", "ts": "1", "value": "3"})
    client.xadd(EVENTS_STREAM, {"user": "u", "item": "h\u2028", "ts": "1", "value": "3"})
    xadd(client, "u", "f", 9)
    feed = EventFeed(Registry(tmp_path), "dcr", client)
    feed.read()
    c = feed.counts
    assert (c.read, c.malformed, c.other_model) == (8, 4, 1)
    base = Ratings(
        IdMap(["u"]), IdMap(["z"]), np.zeros(1, np.int32), np.zeros(1, np.int32), np.ones(1, np.float32)
    )
    data = feed.apply(base, RatingScale(1, 5))
    assert (feed.counts.trained, feed.counts.without_value, feed.counts.off_scale) == (1, 1, 1)
    assert sorted(data.items.ids) == ["a", "z"]


def test_events_trimmed_past_the_checkpoint_fail_unless_told_to_warn(client, tmp_path, caplog):
    registry = Registry(tmp_path)
    xadd(client, "u", "a", 1)
    feed = EventFeed(registry, "dcr", client)
    feed.read()
    feed.commit()
    for n in range(5):
        xadd(client, f"v{n}", "a", 2, maxlen=2)  # exact trim: three entries after the checkpoint go
    with pytest.raises(EventsError, match="3 entries were trimmed after this model's checkpoint"):
        EventFeed(registry, "dcr", client).read()
    warned = EventFeed(registry, "dcr", client, on_trimmed="warn")
    warned.read()
    assert warned.counts.read == 2
    assert "they are lost to training" in caplog.text
    warned.commit()
    client.delete(EVENTS_STREAM)
    xadd(client, "w", "a", 3)
    with pytest.raises(EventsError, match="the stream was reset"):
        EventFeed(registry, "dcr", client).read()


def test_a_first_run_only_warns_about_entries_trimmed_before_it(client, tmp_path, caplog):
    for n in range(4):
        xadd(client, f"u{n}", "a", 1, maxlen=1)
    feed = EventFeed(Registry(tmp_path), "dcr", client)
    feed.read()
    assert feed.counts.read == 1 and "3 entries were trimmed before this model's first run" in caplog.text


def test_untrimmed_stream_passes_the_trim_check(client, tmp_path):
    for n in range(3):
        xadd(client, f"u{n}", "a", 1, maxlen=10)
    feed = EventFeed(Registry(tmp_path), "dcr", client)
    feed.read()
    assert feed.counts.read == 3


def export(url: str, *args: str):
    return run_cli(["ordrec.trainer", "events", "export", "--redis", url, *args], check=False)


def test_export_writes_every_entry_as_recorded(client, redis_server, tmp_path):
    first = xadd(client, "u", "a", 4, model="dcr")
    xadd(client, "u", "a", 5)
    last = xadd(client, "v", "b")
    out = tmp_path / "events.csv"
    done = export(redis_server.url, "--out", str(out))
    assert done.returncode == 0 and f"wrote 3 events to {out}; last id {last}" in done.stdout
    rows = list(csv.DictReader(out.open()))
    assert [(r["user"], r["item"], r["value"], r["model"]) for r in rows] == [
        ("u", "a", "4", "dcr"),
        ("u", "a", "5", ""),
        ("v", "b", "", ""),
    ]
    jsonl = tmp_path / "events.jsonl"
    assert (
        export(redis_server.url, "--out", str(jsonl), "--since", first, "--format", "jsonl").returncode == 0
    )
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(x["user"], x.get("value")) for x in lines] == [("u", "5"), ("v", None)]


def test_export_refuses_a_bad_since_and_reports_redis_down(redis_server, tmp_path):
    out = tmp_path / "x.csv"
    bad = export(redis_server.url, "--out", str(out), "--since", "x")
    assert bad.returncode == 2 and "'x' is not a stream id" in bad.stderr
    redis_server.stop()
    down = export(redis_server.url, "--out", str(out), "--timeout", "1")
    assert down.returncode == 1 and "cannot read the events" in down.stderr
    assert not out.exists() and not list(tmp_path.glob(".ordrec-export-*"))


# ------------------------------------------------------------------- job
def write_job(folder: Path, sample: Path, events: str = "", margin: float = 1.0) -> Path:
    """A job training one small DCR on the sample ratings into ``folder/registry``;
    ``events`` is the body of its ``[events]`` table (none when empty)."""
    path = folder / "job.toml"
    events_table = f"\n[events]\n{events}\n" if events else ""
    path.write_text(
        job_text(
            sample, folder / "registry", "n_components = 4, max_iter = 3", margin, extra_job=events_table
        )
    )
    return path


def events_job(tmp_path: Path, sample: Path, url: str, margin: float = 1.0, extra: str = "") -> Path:
    return write_job(tmp_path, sample, f'redis = "{url}"\ntimeout = 1\n{extra}', margin)


def test_the_job_trains_on_events_and_advances_the_checkpoint(client, redis_server, sample_dir, tmp_path):
    for n in range(3):
        xadd(client, "newcomer", f"i{n + 1:03d}", n + 3)
    last = xadd(client, "newcomer", "brand-new-item", 5)
    assert run_job(events_job(tmp_path, sample_dir, redis_server.url)) == EXIT_PUBLISHED
    registry = Registry(tmp_path / "registry")
    artifact = registry.load("dcr")
    assert "newcomer" in artifact.ids["users"] and "brand-new-item" in artifact.ids["items"]
    assert artifact.attributes["rating_scale"] == {"low": 1, "high": 5, "step": 1}
    checkpoint = load_checkpoint(registry, "dcr")
    assert checkpoint.last_id == last and len(checkpoint.latest) == 4
    assert run_job(events_job(tmp_path, sample_dir, redis_server.url)) == EXIT_PUBLISHED  # nothing new
    assert load_checkpoint(registry, "dcr").latest == checkpoint.latest


def test_a_gate_rejection_or_a_failure_leaves_the_checkpoint(client, redis_server, sample_dir, tmp_path):
    registry = Registry(tmp_path / "registry")
    live = make_artifact()
    live.metrics = {"holdout_ndcg_at_10": 2.0}  # unbeatable
    registry.publish("dcr", live)
    xadd(client, "newcomer", "i001", 4)
    assert run_job(events_job(tmp_path, sample_dir, redis_server.url, margin=0.0)) == EXIT_REJECTED
    assert registry.read_model_file("dcr", CHECKPOINT_FILE) is None
    redis_server.stop()
    assert run_job(events_job(tmp_path, sample_dir, redis_server.url)) == EXIT_FAILED
    assert registry.read_model_file("dcr", CHECKPOINT_FILE) is None
    assert len(registry.versions("dcr")) == 1


def test_events_table_is_checked(tmp_path, sample_dir, capsys):
    path = events_job(tmp_path, sample_dir, "redis://127.0.0.1:1/0", extra='on_trimmed = "ignore"')
    assert run_job(path) == EXIT_USAGE
    assert "events.on_trimmed: must be one of 'fail', 'warn', got 'ignore'" in capsys.readouterr().err


# ------------------------------------------------------ RecordInteractions
@pytest.fixture(scope="module")
def scaled_registry(sample_dir, tmp_path_factory) -> Path:
    """A registry whose dcr version stores its rating scale (1..5), published by the job."""
    folder = tmp_path_factory.mktemp("scaled")
    assert run_job(write_job(folder, sample_dir)) == EXIT_PUBLISHED
    return folder / "registry"


def status(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def test_record_interactions_checks_values_and_records_in_one_transaction(
    scaled_registry, redis_server, client
):
    with (
        ServerProcess(scaled_registry, *redis_server.serve_flags) as proc,
        grpc.insecure_channel(proc.target) as ch,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(ch)

        def record(**kw):
            return stub.RecordInteractions(pb.RecordInteractionsRequest(user_id="stranger", **kw), timeout=5)

        interactions = [
            pb.Interaction(item_id="i001", value=4.0, timestamp=1700000000.5),
            pb.Interaction(item_id="never-seen-item"),
            pb.Interaction(item_id="i002", value=2),
        ]
        assert record(item_ids=["i003"], interactions=interactions).recorded == 4
        entries = client.xrange(EVENTS_STREAM)
        assert [f for _, f in entries][:2] == [
            {"user": "stranger", "item": "i003", "ts": entries[0][1]["ts"], "model": "dcr", "trending": "="},
            {
                "user": "stranger",
                "item": "i001",
                "ts": "1700000000.5",
                "value": "4.0",
                "model": "dcr",
                "trending": "=",  # counted in trending at its ts (the erasure's key to taking it back)
            },
        ]
        assert client.hgetall("ordrec:ratings:stranger") == {"i001": "4.0", "i002": "2.0"}
        assert client.smembers("ordrec:seen:stranger") == {"i001", "i002", "i003", "never-seen-item"}
        assert client.ttl("ordrec:ratings:stranger") > 0

        code, details = status(lambda: record(interactions=[pb.Interaction(item_id="i009", value=7)]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "'i009'" in details and "outside the rating scale 1..5" in details
        code, details = status(lambda: record(interactions=[pb.Interaction(item_id="i009", value=2.5)]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "not on the rating scale" in details
        code, details = status(lambda: record(interactions=[pb.Interaction(item_id="i9", value=math.nan)]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "not a finite number" in details
        code, details = status(lambda: record(interactions=[pb.Interaction(item_id="i9", timestamp=-1)]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "interactions[0].timestamp" in details
        code, details = status(lambda: record())
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "between 1 and" in details
        code, _ = status(lambda: record(model="nope", interactions=[pb.Interaction(item_id="i1", value=3)]))
        assert code == grpc.StatusCode.NOT_FOUND
        # ids the next training could not publish (artifacts hold ids one a line)
        code, details = status(lambda: record(item_ids=["i003", "a\nb"]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "item_ids[1]" in details
        code, details = status(lambda: record(interactions=[pb.Interaction(item_id="x\x85", value=3)]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "interactions[0].item_id" in details
        bad_user = pb.RecordInteractionsRequest(user_id="tab\tuser", item_ids=["i001"])
        code, details = status(lambda: stub.RecordInteractions(bad_user, timeout=5))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "user_id" in details
        assert len(client.xrange(EVENTS_STREAM)) == 4  # refused requests record nothing

        with Client(proc.target) as sdk:  # the Python client's ratings
            assert sdk.record("fan", ratings={"i005": 5.0}, model="dcr").recorded == 1
        (_, fields), *_ = client.xrevrange(EVENTS_STREAM, count=1)
        assert fields == {
            "user": "fan",
            "item": "i005",
            "ts": fields["ts"],
            "value": "5.0",
            "model": "dcr",
            "trending": "=",
        }
