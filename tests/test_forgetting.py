"""The pieces of forgetting a user: dropping them from training inputs (property tests),
matching their Redis keys exactly, erased stream entries not taken for trimmed ones,
and the checkpoint rewritten without them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.live.erasure import (
    Erasure,
    compact_stream,
    delete_stream_entries,
    erase_from_checkpoint,
    erase_from_redis,
    stream_entries_of,
)
from ordrec.service.live.forgotten import user_digest
from ordrec.service.live.redis_state import EVENTS_STREAM
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.registry import Registry
from ordrec.trainer.data.triples import ExplicitTriples
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.events import Checkpoint, Event, load_checkpoint, lost_after, save_checkpoint
from ordrec.trainer.forgetting import Dropped, drop_forgotten

ratings_data = st.integers(1, 8).flatmap(
    lambda n_users: st.tuples(
        st.just(n_users),
        st.lists(
            st.tuples(st.integers(0, n_users - 1), st.integers(0, 5), st.integers(1, 5)),
            min_size=1,
            max_size=40,
        ),
        st.sets(st.integers(0, n_users - 1)),
    )
)


@settings(max_examples=200, deadline=None)
@given(ratings_data)
def test_dropping_forgotten_users_keeps_every_other_rating_exactly(case):
    n_users, triples, forgotten_rows = case
    users, items = IdMap([f"user{i}" for i in range(n_users)]), IdMap([f"item{i}" for i in range(6)])
    user, item, rating = (np.array(c) for c in zip(*triples))
    data = Ratings(
        users, items, user.astype(np.int32), item.astype(np.int32), rating.astype(np.float32), "x", 3
    )
    digests = frozenset(user_digest(f"user{i}") for i in forgotten_rows)
    out, dropped = drop_forgotten(data, digests)

    def as_set(d):
        return {
            (d.users.external(int(u)), d.items.external(int(i)), float(r))
            for u, i, r in zip(d.user, d.item, d.rating)
        }

    expected = {t for t in as_set(data) if t[0] not in {f"user{i}" for i in forgotten_rows}}
    assert as_set(out) == expected and len(out) == len(data) - dropped.rows
    assert not {f"user{i}" for i in forgotten_rows} & set(out.users.ids)
    assert dropped.users == len(forgotten_rows) and out.skipped_lines == 3 and out.items == items
    assert out.user.dtype == np.int32 and (len(out) == 0 or out.user.max() < len(out.users))


def test_triples_lose_rows_naming_a_forgotten_user_in_either_user_column():
    users, items = IdMap(["a", "b", "c"]), IdMap(["i0", "i1", "i2"])
    # type A <u, i, j> (second is an item row), type B <u, v, i> (second is a user row)
    data = ExplicitTriples(
        users,
        items,
        kind=np.array([0, 0, 1, 1, 1]),
        first=np.array([0, 2, 2, 1, 0]),
        second=np.array([1, 1, 1, 0, 2]),
        third=np.array([2, 2, 2, 0, 1]),
    )
    out, dropped = drop_forgotten(data, frozenset({user_digest("b")}))
    assert out.users.ids == ["a", "c"] and dropped == Dropped(users=1, rows=2)  # b second, b first
    kept = [
        (int(k), int(f), int(s), int(t)) for k, f, s, t in zip(out.kind, out.first, out.second, out.third)
    ]
    # c renumbered 1 in `first` and in a type-B `second`; the type-A `second` (an item row) untouched
    assert kept == [(0, 0, 1, 2), (0, 1, 1, 2), (1, 0, 1, 1)]


@pytest.fixture
def client(redis_server):
    return redis.Redis.from_url(redis_server.url, decode_responses=True)


@pytest.mark.redis
@pytest.mark.parametrize("user", ["x", "a*b", "q?[z]", "back\\slash", "with:colon"])
def test_only_the_users_own_keys_go(client, user):
    others = ["y:" + user, user + "2", "x" if user != "x" else "xx", "y"]
    for who in [user, *others]:
        client.sadd(f"ordrec:seen:{who}", "i1")
        client.hset(f"ordrec:served:dcr:{who}", "i1", "v 1")
        client.hset(f"ordrec:served:other:{who}", "i2", "v 1")
        client.xadd(EVENTS_STREAM, {"user": who, "item": "i1", "ts": "1"})
    report = Erasure(user_digest(user))
    erase_from_redis(client, user, report)
    assert (report.seen_items, report.served_keys, report.stream_entries) == (1, 2, 1)
    left = set(client.scan_iter())
    assert not {f"ordrec:seen:{user}", f"ordrec:served:dcr:{user}", f"ordrec:served:other:{user}"} & left
    assert {f"ordrec:served:dcr:{w}" for w in others} <= left and {f"ordrec:seen:{w}" for w in others} <= left
    assert [f["user"] for _, f in client.xrange(EVENTS_STREAM)] == others


@pytest.mark.redis
def test_erased_entries_are_not_reported_as_trimmed_and_the_copy_keeps_ids_and_counters(client, redis_server):
    ids = [client.xadd(EVENTS_STREAM, {"user": f"u{n % 3}", "item": "i", "ts": "1"}) for n in range(9)]
    position = client.xinfo_stream(EVENTS_STREAM)["entries-added"]
    doomed, last = stream_entries_of(client, "u1", None)
    assert last == ids[-1] and delete_stream_entries(client, doomed) == 3
    compact_stream(client)
    info = client.xinfo_stream(EVENTS_STREAM)
    assert info["entries-added"] == 9 and info["length"] == 6 and info["last-generated-id"] == ids[-1]
    assert [i for i, _ in client.xrange(EVENTS_STREAM)] == [i for n, i in enumerate(ids) if n % 3 != 1]
    assert lost_after(client, position) == 0
    client.xtrim(EVENTS_STREAM, maxlen=2, approximate=False)  # a real trim past the checkpoint is still seen
    assert lost_after(client, 3) > 0
    assert b"u1" not in redis.Redis.from_url(redis_server.url).dump(EVENTS_STREAM)  # not just flagged


def test_the_checkpoint_is_rewritten_without_the_user(tmp_path):
    registry = Registry(tmp_path)
    latest = {
        (u, i): Event(f"1-{n}", u, i, 1.0, 4.0)
        for n, (u, i) in enumerate([("gone", "i1"), ("kept", "i1"), ("gone", "i2")])
    }
    save_checkpoint(registry, "dcr", Checkpoint("1-2", latest, 3))
    registry.write_model_file("dcr", "events/leftover.jsonl", json.dumps({"user": "gone"}).encode() + b"\n")
    assert erase_from_checkpoint(registry, "dcr", "gone") == 2
    checkpoint = load_checkpoint(registry, "dcr")  # checksum verified
    assert (
        list(checkpoint.latest) == [("kept", "i1")]
        and checkpoint.last_id == "1-2"
        and checkpoint.position == 3
    )
    assert registry.model_files("dcr", "events") == [
        f"events/{json.loads(registry.read_model_file('dcr', 'EVENTS_CHECKPOINT'))['sha256']}.jsonl"
    ]
    assert erase_from_checkpoint(registry, "dcr", "gone") == 0  # idempotent
