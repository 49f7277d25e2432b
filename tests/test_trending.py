"""Trending: time-decayed popularity of the recorded interactions, with a real redis-server.

The store writes what RecordInteractions writes (``RedisSeenStore.record``); the index reads
it back as decayed counts; the server serves it as its own model name and as the fallback
of unknown users.
"""

from __future__ import annotations

import math
import time

import grpc
import numpy as np
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from ordrec.service.live.redis_state import RedisSeenStore
from ordrec.service.live.seen import Recorded
from ordrec.service.live.trending import (
    EPOCH_KEY,
    LAST_KEY,
    TRENDING_KEY,
    Trending,
    TrendingIndex,
    TrendingSettings,
    ranked_rows,
)
from ordrec.service.metrics import Metrics
from ordrec.service.serving.cli import build_parser, config_from_args
from ordrec.service.storage.idmap import IdMap
from ordrec.tools.process import ServerProcess
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.admin_token import ADMIN_FLAGS, ADMIN_METADATA
from tests.conftest import train_into, wait_until


def _store(url: str, half_life: float, window: float) -> RedisSeenStore:
    return RedisSeenStore(url, Metrics(), timeout=1.0, trending=TrendingSettings(half_life, window))


def _record(store: RedisSeenStore, user: str, *pairs: tuple[str, float]) -> None:
    store.record(user, [Recorded(item, ts) for item, ts in pairs])


@pytest.fixture
def fresh(redis_server):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushall()
    yield redis_server.url
    client.close()


def _read(url: str, settings: TrendingSettings) -> Trending:
    return TrendingIndex(
        redis.Redis.from_url(url, decode_responses=True), settings, cache_seconds=0
    ).current()


def test_an_old_burst_ranks_below_a_recent_touch_by_the_half_life_math(fresh):
    settings = TrendingSettings(half_life=100.0, window=10_000.0)
    store = _store(fresh, settings.half_life, settings.window)
    now = time.time()
    _record(store, "a", *[("old", now - 300)] * 3)  # 3 x 2^-3 = 0.375
    _record(store, "b", ("new", now))  # 1.0
    _record(store, "c", *[("older-but-more", now - 300)] * 9)  # 9 x 2^-3 = 1.125
    found = _read(fresh, settings)
    assert found.item_ids == ["older-but-more", "new", "old"]
    assert found.scores.tolist() == pytest.approx([1.125, 1.0, 0.375], rel=1e-3)
    store.close()


def test_an_item_untouched_for_the_window_falls_out_and_is_pruned_on_write(fresh):
    settings = TrendingSettings(half_life=1000.0, window=50.0)
    store = _store(fresh, settings.half_life, settings.window)
    now = time.time()
    _record(store, "a", ("stale", now - 100), ("stale", now - 100), ("fresh", now))
    found = _read(fresh, settings)
    assert found.item_ids == ["fresh"]  # stale scored more, but nobody touched it for 100 s > 50 s
    client = redis.Redis.from_url(fresh, decode_responses=True)
    assert client.zscore(TRENDING_KEY, "stale") is None  # the write that added it pruned it
    assert client.zscore(LAST_KEY, "stale") is None
    store.close()


def test_scores_are_rescaled_before_they_overflow(fresh):
    settings = TrendingSettings(half_life=1.0, window=10_000.0)
    client = redis.Redis.from_url(fresh, decode_responses=True)
    now = time.time()
    # As if the epoch were 600 half-lives ago and "x" touched 10 s ago: its raw score is 2^590.
    client.set(EPOCH_KEY, repr(now - 600))
    client.zadd(TRENDING_KEY, {"x": 2.0**590})
    client.zadd(LAST_KEY, {"x": now - 10})
    store = _store(fresh, settings.half_life, settings.window)
    _record(store, "u", ("y", now))
    assert float(client.get(EPOCH_KEY)) > now - 5  # moved to the write's time
    assert client.zscore(TRENDING_KEY, "x") < 1e-2  # 2^-10 relative to the new epoch
    found = _read(fresh, settings)
    assert found.item_ids == ["y", "x"]
    # Read a moment after the write: both decayed alike since (half-life 1 s), 10 half-lives apart.
    elapsed = time.time() - now
    assert 2.0**-elapsed * 0.99 <= found.scores[0] <= 1.0
    assert found.scores[1] / found.scores[0] == pytest.approx(2.0**-10, rel=1e-2)
    store.close()


def test_no_redis_or_redis_down_reads_nothing_trending(fresh):
    settings = TrendingSettings()
    assert len(TrendingIndex(None, settings).current()) == 0
    down = redis.Redis(port=1, socket_timeout=0.1, socket_connect_timeout=0.1)
    assert len(TrendingIndex(down, settings).current()) == 0
    assert len(TrendingIndex(down, settings, healthy=lambda: False).current()) == 0


def test_the_reader_caches_for_its_interval(fresh):
    settings = TrendingSettings()
    store = _store(fresh, settings.half_life, settings.window)
    clock = [time.time()]
    index = TrendingIndex(store.client, settings, cache_seconds=1.0, clock=lambda: clock[0])
    assert len(index.current()) == 0
    _record(store, "u", ("i", time.time()))
    assert len(index.current()) == 0  # still the cached answer
    clock[0] += 1.5
    assert index.current().item_ids == ["i"]
    store.close()


def test_rows_are_mapped_once_per_list_and_item_map_and_follow_a_new_list(fresh):
    settings = TrendingSettings()
    store = _store(fresh, settings.half_life, settings.window)
    clock = [time.time()]
    index = TrendingIndex(store.client, settings, cache_seconds=1.0, clock=lambda: clock[0])
    _record(store, "u", ("b", time.time()), ("zz", time.time() - 60))
    clock[0] += 1.5
    one, two = IdMap(["a", "b", "c"]), IdMap(["zz", "b"])
    current, rows = index.current_rows(one)
    assert current.item_ids == ["b", "zz"] and rows.tolist() == [1, -1]
    assert index.current_rows(one)[1] is rows  # mapped once
    assert index.current_rows(two)[1].tolist() == [1, 0]  # each version's own map
    _record(store, "v", ("c", time.time() + 5), ("c", time.time() + 6))
    clock[0] += 1.5
    current, rows = index.current_rows(one)
    assert current.item_ids[0] == "c" and rows.tolist()[0] == 2  # a new list is mapped again
    store.close()


@given(
    st.lists(st.integers(-1, 9), min_size=0, max_size=20),
    st.integers(1, 12),
    st.sets(st.integers(0, 9)),
    st.one_of(st.none(), st.sets(st.integers(0, 9))),
    st.sets(st.integers(0, 9)),
)
def test_ranked_rows_keeps_order_and_honours_every_exclusion(rows, n, exclude, candidates, blocked):
    trending = Trending([f"i{k}" for k in range(len(rows))], np.arange(len(rows), 0, -1, dtype=np.float32))
    mask = np.zeros(10, dtype=bool)
    mask[list(blocked)] = True
    got, scores = ranked_rows(
        trending,
        np.array(rows, dtype=np.int64),
        n,
        np.array(sorted(exclude), dtype=np.int64),
        None if candidates is None else np.array(sorted(candidates), dtype=np.int64),
        mask,
    )
    expected = [
        (r, float(s))
        for r, s in zip(rows, trending.scores.tolist())
        if r >= 0 and r not in exclude and (candidates is None or r in candidates) and r not in blocked
    ][:n]
    assert list(zip(got.tolist(), scores.tolist())) == expected


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--trending-half-life", "0"], "must be a finite number in (0, inf), got 0.0"),
        (["--trending-half-life", "-5"], "must be a finite number in (0, inf), got -5.0"),
        (["--trending-half-life", "nan"], "must be a finite number in (0, inf), got nan"),
        (["--trending-window", "inf"], "must be a finite number in (0, inf), got inf"),
        (["--trending-window", "soon"], "expected a finite number in (0, inf), got 'soon'"),
    ],
)
def test_bad_trending_flags_are_refused_naming_the_flag(flags, message, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--registry", "r", *flags])
    err = capsys.readouterr().err
    assert flags[0] in err and message in err


def test_a_bad_trending_model_name_is_refused():
    args = build_parser().parse_args(["--registry", "r", "--trending", "Not A Name"])
    with pytest.raises(ValueError, match="--trending"):
        config_from_args(args)
    assert config_from_args(build_parser().parse_args(["--registry", "r", "--trending", ""])).trending == ""


@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True, allow_infinity=True))
def test_settings_accept_exactly_positive_finite_seconds(half_life, window):
    ok = all(math.isfinite(x) and x > 0 for x in (half_life, window))
    if ok:
        assert TrendingSettings(half_life, window).window == window
    else:
        with pytest.raises(ValueError, match="trending"):
            TrendingSettings(half_life, window)


# ------------------------------------------------------------------ the server
def _rec(stub, user: str, model: str = "dcr", n: int = 10, **kw) -> pb.UserRecommendations:
    reply = stub.Recommend(pb.RecommendRequest(model=model, user_ids=[user], n=n, **kw), timeout=10)
    return reply.results[0]


def test_the_server_serves_trending_as_fallback_and_model(sample_registry, fresh):
    with (
        ServerProcess(sample_registry, "--redis", fresh, "--poll-interval", "0", *ADMIN_FLAGS) as server,
        grpc.insecure_channel(server.target) as channel,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        assert _rec(stub, "stranger").fallback == pb.FALLBACK_POPULAR_GLOBAL  # nothing recorded yet
        catalogue = [i.id for i in _rec(stub, "u001").items]
        hot, warm, cold = catalogue[:3]
        for user, items in (
            ("f1", [hot, warm]),
            ("f2", [hot]),
            ("f3", [hot, warm, cold, "not-in-any-model"]),
        ):
            stub.RecordInteractions(pb.RecordInteractionsRequest(user_id=user, item_ids=items), timeout=10)
        answer = wait_until(lambda: (r := _rec(stub, "stranger")).fallback == pb.FALLBACK_TRENDING and r)
        assert answer, "the unknown user never got the trending fallback"
        # counts 3, 2, 1 (only items dcr knows), then the popularity list tops it up to n
        assert [i.id for i in answer.items][:3] == [hot, warm, cold]
        assert answer.items[0].score > answer.items[1].score > answer.items[2].score > 0
        assert [i.fallback for i in answer.items] == [pb.FALLBACK_TRENDING] * 3 + [
            pb.FALLBACK_POPULAR_GLOBAL
        ] * 7
        assert len({i.id for i in answer.items}) == 10
        excluded = _rec(stub, "stranger", exclude_item_ids=[hot])
        assert [i.id for i in excluded.items][:2] == [warm, cold] and hot not in {
            i.id for i in excluded.items
        }
        assert len(excluded.items) == 10
        assert _rec(stub, "u001").fallback == pb.FALLBACK_NONE  # known users keep their model's answer

        model = _rec(stub, "anyone", model="trending")
        ids = [i.id for i in model.items]
        assert ids[:2] == [hot, warm] and set(ids[2:]) == {cold, "not-in-any-model"}  # a tie at 1
        assert {i.id for i in _rec(stub, "f1", model="trending").items} == {cold, "not-in-any-model"}
        assert [i.id for i in _rec(stub, "f1", model="trending", exclude_seen=False).items][:2] == [hot, warm]
        assert [i.id for i in _rec(stub, "x", model="trending", candidate_item_ids=[cold, warm]).items] == [
            warm,
            cold,
        ]
        listed = {m.name: m.kind for m in stub.ListModels(pb.ListModelsRequest(), timeout=10).models}
        assert listed["trending"] == "trending" and listed["dcr"] == "dcr"

        stub.HideItems(pb.HideItemsRequest(item_ids=[hot]), timeout=10, metadata=ADMIN_METADATA)
        assert hot not in [i.id for i in _rec(stub, "anyone", model="trending").items]
        assert hot not in [i.id for i in wait_until(lambda: _rec(stub, "stranger")).items]

        with pytest.raises(grpc.RpcError) as err:
            _rec(stub, "anyone", model="trending", filter="genre = 'x'")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "filter" in err.value.details()
        for bad, field in (
            (pb.RecommendRequest(model="trending", user_ids=[], n=10), "user_ids"),
            (pb.RecommendRequest(model="trending", user_ids=["u"], n=0), "n"),
            (pb.RecommendRequest(model="trending", user_ids=["u"], n=10**9), "n"),
            (pb.RecommendRequest(model="trending", user_ids=["x" * 100_000], n=10), "user_ids"),
            (pb.RecommendRequest(model="trending", user_ids=["u"], n=5, explain=3), "explain"),
            (pb.RecommendRequest(model="trending", user_ids=["u"], n=5, diversity=0.5), "diversity"),
        ):
            with pytest.raises(grpc.RpcError) as err:
                stub.Recommend(bad, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
            assert field in err.value.details()


def test_redis_down_the_fallback_is_popularity(sample_registry, redis_server):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushall()
    with (
        ServerProcess(sample_registry, *redis_server.serve_flags, "--poll-interval", "0") as server,
        grpc.insecure_channel(server.target) as channel,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        item = _rec(stub, "u001").items[0].id
        stub.RecordInteractions(pb.RecordInteractionsRequest(user_id="fan", item_ids=[item]), timeout=10)
        assert wait_until(lambda: _rec(stub, "stranger").fallback == pb.FALLBACK_TRENDING)
        redis_server.stop()
        assert wait_until(lambda: _rec(stub, "stranger").fallback == pb.FALLBACK_POPULAR_GLOBAL)
        popular = _rec(stub, "stranger")
        assert len(popular.items) == 10 and {i.fallback for i in popular.items} == {
            pb.FALLBACK_POPULAR_GLOBAL
        }
        with pytest.raises(grpc.RpcError) as err:  # not an empty list that looks like "nothing trends"
            _rec(stub, "anyone", model="trending")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "Redis" in err.value.details()


# ------------------------------------------------------ the fallback topped up to n
@pytest.fixture(scope="module")
def genre_registry(sample_dir, tmp_path_factory):
    """dcr with a genre per item (every third one "Horror"), trained through the real CLI."""
    items = [line.split("|")[0] for line in (sample_dir / "items.txt").read_text().splitlines() if line]
    csv = tmp_path_factory.mktemp("genres") / "items.csv"
    csv.write_text(
        "item,genre\n" + "".join(f"{i},{'Horror' if k % 3 == 0 else 'Drama'}\n" for k, i in enumerate(items))
    )
    flags = ["--set", "max_iter=3", "--item-attributes", str(csv)]
    return train_into(
        tmp_path_factory.mktemp("genre-registry"), sample_dir, [("dcr", "dcr", "ratings.data", flags)]
    )


def test_a_short_trending_list_is_topped_up_to_n_from_popularity(genre_registry, fresh, sample_dir):
    items = [line.split("|")[0] for line in (sample_dir / "items.txt").read_text().splitlines() if line]
    horror = {i for k, i in enumerate(items) if k % 3 == 0}
    with (
        ServerProcess(genre_registry, "--redis", fresh, "--poll-interval", "0") as server,
        grpc.insecure_channel(server.target) as channel,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        assert len(_rec(stub, "anyone", model="trending").items) == 0  # Redis up, nothing trends: empty, OK
        dramas = [i for i in items if i not in horror][:2]
        stub.RecordInteractions(pb.RecordInteractionsRequest(user_id="fan", item_ids=dramas), timeout=10)
        short = wait_until(lambda: (r := _rec(stub, "stranger", n=20)).fallback == pb.FALLBACK_TRENDING and r)
        assert short, "the unknown user never got the trending fallback"
        ids = [i.id for i in short.items]
        assert len(ids) == len(set(ids)) == 20 and set(ids[:2]) == set(dramas)
        assert [i.fallback for i in short.items] == [pb.FALLBACK_TRENDING] * 2 + [
            pb.FALLBACK_POPULAR_GLOBAL
        ] * 18

        # No trending item passes the filter: the answer is n items of the popularity list that do.
        filtered = _rec(stub, "stranger", n=5, filter='genre in ("Horror")')
        assert len(filtered.items) == 5 and {i.id for i in filtered.items} <= horror
        assert filtered.fallback == pb.FALLBACK_POPULAR_GLOBAL
        assert {i.fallback for i in filtered.items} == {pb.FALLBACK_POPULAR_GLOBAL}

        # Fewer eligible items than n: all of them, each once.
        few = _rec(stub, "stranger", n=5, candidate_item_ids=[*dramas, items[0]])
        assert sorted(i.id for i in few.items) == sorted([*dramas, items[0]])
        assert _rec(stub, "u001").items[0].fallback == pb.FALLBACK_NONE  # known users: the model's own
