"""Online evaluation: served answers sampled into Redis, interactions with them counted
as hits once, per model and version, within a window."""

from __future__ import annotations

import threading
import urllib.request

import grpc
import pytest
import redis
from prometheus_client import generate_latest

from ordrec.service.live.online import MAX_FIELDS, SERVED_KEY, OnlineEvaluation
from ordrec.service.metrics import Metrics
from ordrec.tools.process import ServerProcess, wait_for
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.scrape import metric


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _value(metric, model="dcr", version="v1") -> float:
    samples = [
        s
        for f in metric.collect()
        for s in f.samples
        if s.labels == {"model": model, "version": version} and not s.name.endswith("_created")
    ]
    return samples[0].value if samples else 0.0


@pytest.fixture
def online(redis_server):
    metrics, clock, loaded = Metrics(), Clock(), {"v1", "v2"}
    evaluation = OnlineEvaluation(
        redis.Redis.from_url(redis_server.url, decode_responses=True),
        metrics,
        lambda: ["dcr"],
        lambda model: set(loaded),
        sample_rate=1.0,
        window=3600,
        clock=clock,
    )
    yield evaluation, metrics, clock, loaded
    evaluation.stop()


def test_an_interaction_with_a_served_item_is_one_hit(online):
    evaluation, metrics, clock, _ = online
    evaluation.sample("dcr", "v1", "alice", ["a", "b", "c", "d"])
    evaluation.flush()
    assert evaluation.observe("alice", ["b", "x", "b"]) == 1
    assert evaluation.observe("alice", ["b"]) == 0  # counted once
    assert evaluation.observe("bob", ["a"]) == 0  # served to someone else
    assert _value(metrics.online_served) == 4 and _value(metrics.online_hits) == 1
    assert _value(metrics.online_hit_rate) == 0.25


def test_a_sampled_version_without_hits_reports_zero_hits(online):
    """The hits series exists from the first sample: the status page and hits / served in
    PromQL see 0 hits, not a missing series beside a 0 hit rate."""
    evaluation, metrics, _, _ = online
    evaluation.sample("dcr", "v1", "alice", ["a", "b"])
    evaluation.flush()
    text = generate_latest(metrics.registry).decode()
    assert 'ordrec_online_served_total{model="dcr",version="v1"} 2.0' in text
    assert 'ordrec_online_hits_total{model="dcr",version="v1"} 0.0' in text


def test_no_hit_after_the_window_or_for_an_unloaded_version(online):
    evaluation, metrics, clock, loaded = online
    evaluation.sample("dcr", "v1", "alice", ["a"])
    evaluation.sample("dcr", "v2", "carol", ["a"])
    evaluation.flush()
    clock.now += 3601
    assert evaluation.observe("alice", ["a"]) == 0
    clock.now -= 3601
    loaded.discard("v2")
    assert evaluation.observe("carol", ["a"]) == 0
    assert _value(metrics.online_hits, version="v2") == 0


def test_replicas_recording_the_same_interaction_count_it_once(online, redis_server):
    evaluation, metrics, _, _ = online
    other_metrics = Metrics()
    other = OnlineEvaluation(
        redis.Redis.from_url(redis_server.url, decode_responses=True),
        other_metrics,
        lambda: ["dcr"],
        lambda model: {"v1"},
        sample_rate=1.0,
        window=3600,
    )
    try:
        for round_ in range(20):
            user = f"user-{round_}"
            evaluation.sample("dcr", "v1", user, ["a"])
            evaluation.flush()
            counts = []
            threads = [
                threading.Thread(target=lambda e=e, u=user, c=counts: c.append(e.observe(u, ["a"])))
                for e in (evaluation, other)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(counts) == [0, 1]
    finally:
        other.stop()
    assert _value(metrics.online_hits) + _value(other_metrics.online_hits) == 20


def test_a_key_stays_bounded_and_redis_trouble_drops_samples_not_requests(online, redis_server):
    evaluation, metrics, _, _ = online
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    evaluation.sample("dcr", "v1", "greedy", [f"i{k}" for k in range(MAX_FIELDS + 1)])
    evaluation.flush()
    assert client.hlen(SERVED_KEY.format("dcr", "greedy")) == 0
    evaluation.sample("dcr", "v1", "alice", ["a"])
    evaluation.flush()
    assert 0 < client.ttl(SERVED_KEY.format("dcr", "alice")) <= 3600
    redis_server.stop()
    evaluation.sample("dcr", "v1", "alice", ["b"])
    evaluation.flush()
    assert metrics.registry.get_sample_value("ordrec_online_dropped_total") == 1
    assert evaluation.observe("alice", ["a"]) == 0  # no exception reaches RecordInteractions


def test_a_bad_rate_or_window_is_refused():
    with pytest.raises(ValueError, match="sample rate"):
        OnlineEvaluation(None, Metrics(), list, set, sample_rate=1.5, window=10)
    with pytest.raises(ValueError, match="window"):
        OnlineEvaluation(None, Metrics(), list, set, sample_rate=0.5, window=0)


def test_hits_through_a_real_server(sample_registry, redis_server):
    args = (*redis_server.serve_flags, "--poll-interval", "0", "--online-sample-rate", "1.0")
    with ServerProcess(sample_registry, *args) as server, grpc.insecure_channel(server.target) as channel:
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        reply = stub.Recommend(pb.RecommendRequest(model="dcr", user_ids=["u001"], n=10), timeout=10)
        items = [i.id for i in reply.results[0].items]
        wait_for(lambda: metric(server, "ordrec_online_served_total") == 10, 10, what="the sample written")
        for _ in range(2):
            stub.RecordInteractions(
                pb.RecordInteractionsRequest(user_id="u001", item_ids=items[:1]), timeout=5
            )
        assert metric(server, "ordrec_online_hits_total") == 1
        assert metric(server, "ordrec_online_hit_rate") == pytest.approx(0.1)
        version = reply.model_version
        text = urllib.request.urlopen(server.metrics_url + "/metrics", timeout=5).read().decode()
        assert f'ordrec_online_hits_total{{model="dcr",version="{version}"}} 1.0' in text


def test_without_redis_the_online_evaluation_is_off(sample_registry):
    with (
        ServerProcess(sample_registry, "--poll-interval", "0") as server,
        grpc.insecure_channel(server.target) as ch,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(ch)
        stub.Recommend(pb.RecommendRequest(model="dcr", user_ids=["u001"], n=10), timeout=10)
        assert metric(server, "ordrec_recommend_users_total") == 1
        assert metric(server, "ordrec_online_served_total") == 0


@pytest.mark.parametrize(
    "flag, value, error",
    [
        ("--online-sample-rate", "1.5", "must be a finite number in [0, 1], got 1.5"),
        ("--online-sample-rate", "-0.1", "must be a finite number in [0, 1], got -0.1"),
        ("--online-window", "0", "must be an int in [1, inf), got 0"),
    ],
)
def test_the_server_refuses_online_settings_out_of_range(flag, value, error, capsys):
    from ordrec.service.serving.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--registry", "r", flag, value])
    assert exit_.value.code == 2 and error in capsys.readouterr().err
