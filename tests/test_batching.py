"""Dynamic batching of Recommend (service/serving/batching.py): batched answers equal lone ones,
the queue bound and deadlines, in process and against a real server process."""

from __future__ import annotations

import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.config import DEFAULT_BATCH_MIN_WORK, Limits
from ordrec.service.errors import DeadlineExceeded, ResourceExhausted, ServiceError
from ordrec.service.indices.models import build_index
from ordrec.service.indices.rules import combine, hidden_mask
from ordrec.service.live.hidden import HiddenState
from ordrec.service.live.seen import SeenStore
from ordrec.service.metrics import Metrics
from ordrec.service.serving.batching import BatchObserver, RecommendBatcher
from ordrec.service.serving.servicer import RecommenderServicer
from ordrec.service.storage.artifact import Artifact
from ordrec.service.storage.hidden_items import ALL_MODELS
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess, run_cli
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.servicer_fakes import FixedSet, NoDeadlineContext, dcr_store
from tests.test_rules import FILTERS, dcr_artifact

N_USERS, N_ITEMS = 12, 80


class _Stall:
    """A stand-in index whose one call holds the scorer until released, so the calls that
    follow queue up and are scored as one batch."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()

    def scoring_work(self):
        return 1 << 40  # dear enough to be batched whatever min_work is

    def recommend_many(self, rows, n, *, excludes, candidates=None, eligible=None):
        self.entered.set()
        assert self.release.wait(30)
        return [(np.empty(0, np.int64), np.empty(0, np.float32))] * rows.size


def _hold_scorer(batcher: RecommendBatcher) -> tuple[_Stall, threading.Thread]:
    stall = _Stall()
    holder = threading.Thread(
        target=batcher.recommend,
        args=(stall, np.array([0]), 1),
        kwargs={"excludes": [None], "candidates": np.array([0])},  # a candidate list: recommend_many
    )
    holder.start()
    assert stall.entered.wait(10)
    return stall, holder


def _wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return dcr_store(tmp_path_factory.mktemp("batching-registry"), N_USERS, N_ITEMS, seed=3)


@pytest.fixture(scope="module")
def pool():
    with ThreadPoolExecutor(max_workers=16) as executor:
        yield executor


# ------------------------------------------------------------ the index's batch
@settings(max_examples=60, deadline=None)
@given(
    users=st.lists(st.integers(0, N_USERS - 1), min_size=1, max_size=20),
    data=st.data(),
)
def test_recommend_batch_answers_what_each_user_gets_alone(users, data):
    index = build_index(dcr_artifact(n_users=N_USERS, n_items=N_ITEMS, seed=3))
    ns, excludes, eligibles = [], [], []
    rules = {}
    for _ in users:
        ns.append(data.draw(st.integers(1, 150)))  # above 128: the sort path of top_k
        excluded = data.draw(st.sets(st.integers(0, N_ITEMS - 1), max_size=30))
        excludes.append(np.array(sorted(excluded), dtype=np.int64) if excluded else None)
        text = data.draw(st.sampled_from(FILTERS))
        hidden = data.draw(st.sampled_from([frozenset(), frozenset({"i1", "i5", "i70"})]))
        key = (text, hidden)
        if key not in rules:  # one Eligible per rule set, as the servicer's caches give
            rules[key] = combine(
                hidden_mask(index.items, [hidden]), index.item_attributes.eligible(text) if text else None
            )
        eligibles.append(rules[key])
    rows = np.array(users, dtype=np.int64)
    batched = index.recommend_batch(rows, np.array(ns), excludes, eligibles)
    for u, n, ex, el, (got_rows, got_scores) in zip(users, ns, excludes, eligibles, batched):
        want_rows, want_scores = index.recommend(u, n, exclude=ex, eligible=el)
        np.testing.assert_array_equal(got_rows, want_rows)
        np.testing.assert_array_equal(got_scores, want_scores)


# ------------------------------------------------------------- through the servicer
request_strategy = st.builds(
    lambda users, n, excluded, filter_text, candidates, distribution, seen: pb.RecommendRequest(
        model="dcr",
        user_ids=users,
        n=n,
        exclude_item_ids=excluded,
        filter=filter_text,
        candidate_item_ids=candidates,
        with_distribution=distribution,
        exclude_seen=seen,
    ),
    users=st.lists(
        st.sampled_from([f"u{i}" for i in range(N_USERS)] + ["nobody"]), min_size=1, max_size=4, unique=True
    ),
    n=st.integers(1, 90),
    excluded=st.lists(st.sampled_from([f"i{i}" for i in range(N_ITEMS)] + ["i999"]), max_size=10),
    filter_text=st.sampled_from(FILTERS),
    candidates=st.one_of(
        st.just([]), st.lists(st.sampled_from([f"i{i}" for i in range(N_ITEMS)]), min_size=1, max_size=12)
    ),
    distribution=st.booleans(),
    seen=st.booleans(),
)


@settings(max_examples=40, deadline=None)
@given(
    requests=st.lists(request_strategy, min_size=2, max_size=10),
    hidden=st.sampled_from([frozenset(), frozenset({"i2", "i3", "i40"})]),
    max_batch=st.integers(1, 40),
)
def test_batched_servicer_answers_exactly_what_the_unbatched_one_does(
    store, pool, requests, hidden, max_batch
):
    state = HiddenState(FixedSet(ALL_MODELS, hidden), interval=3600)
    sizes: list[int] = []
    batcher = RecommendBatcher(max_batch, 100, BatchObserver(batch_users=sizes.append), min_work=0)
    batched = RecommenderServicer(store, Metrics(), Limits(), SeenStore(), state, batcher=batcher)
    alone = RecommenderServicer(store, Metrics(), Limits(), SeenStore(), state)
    want = [alone.Recommend(r, NoDeadlineContext()) for r in requests]
    # Hold the scorer so every call queues, then let them through as batches.
    stall, holder = _hold_scorer(batcher)
    scoring = sum(any(u != "nobody" for u in r.user_ids) for r in requests)
    futures = [pool.submit(batched.Recommend, r, NoDeadlineContext()) for r in requests]
    _wait_until(lambda: batcher.queued() == scoring or all(f.done() for f in futures))
    stall.release.set()
    got = [f.result(timeout=30) for f in futures]
    holder.join(10)
    assert got == want
    if scoring >= 2 and max_batch >= 8:  # every request here has at most 4 users
        assert max(sizes) > 1  # they really were scored together


def test_a_full_queue_is_refused_at_once_and_later_calls_are_served():
    index = build_index(dcr_artifact(n_users=N_USERS, n_items=N_ITEMS, seed=3))
    shed: list[str] = []
    batcher = RecommendBatcher(64, 2, BatchObserver(shed=shed.append), min_work=0)
    stall, holder = _hold_scorer(batcher)
    results: list = [None, None]

    def queued(i):
        results[i] = batcher.recommend(index, np.array([i]), 5, excludes=[None])

    waiting = [threading.Thread(target=queued, args=(i,)) for i in range(2)]
    for thread in waiting:
        thread.start()
    _wait_until(lambda: batcher.queued() == 2)
    start = time.perf_counter()
    with pytest.raises(ResourceExhausted, match="queue is full"):
        batcher.recommend(index, np.array([3]), 5, excludes=[None])
    assert time.perf_counter() - start < 0.5  # at once, not after the queue drained
    assert shed == ["queue_full"]
    stall.release.set()
    for thread in waiting:
        thread.join(10)
    holder.join(10)
    for i in range(2):
        want = index.recommend(i, 5)
        np.testing.assert_array_equal(results[i][0][0], want[0])
    assert batcher.recommend(index, np.array([3]), 5, excludes=[None])  # the scorer is free again


def test_a_call_whose_deadline_passed_while_queued_is_not_scored():
    index = build_index(dcr_artifact(n_users=N_USERS, n_items=N_ITEMS, seed=3))
    shed: list[str] = []
    batcher = RecommendBatcher(64, 8, BatchObserver(shed=shed.append), min_work=0)
    stall, holder = _hold_scorer(batcher)
    outcome: dict[str, object] = {}

    def call(name, deadline):
        try:
            outcome[name] = batcher.recommend(index, np.array([1]), 3, excludes=[None], deadline=deadline)
        except ServiceError as exc:
            outcome[name] = exc

    late = threading.Thread(target=call, args=("late", time.monotonic() + 0.05))
    patient = threading.Thread(target=call, args=("patient", time.monotonic() + 60))
    late.start()
    patient.start()
    _wait_until(lambda: batcher.queued() == 2)
    time.sleep(0.1)
    stall.release.set()
    for thread in (late, patient, holder):
        thread.join(10)
    assert isinstance(outcome["late"], DeadlineExceeded)
    assert shed == ["deadline"]
    np.testing.assert_array_equal(outcome["patient"][0][0], index.recommend(1, 3)[0])


def test_a_version_too_cheap_to_batch_is_scored_on_the_callers_thread():
    index = build_index(dcr_artifact(n_users=N_USERS, n_items=N_ITEMS, seed=3))
    assert 0 < index.scoring_work() < DEFAULT_BATCH_MIN_WORK  # 80 items x 12: far below
    batcher = RecommendBatcher(64, 0)  # a queue of none: any queued call would be refused
    stall, holder = _hold_scorer(batcher)
    rows, _ = batcher.recommend(index, np.array([2]), 4, excludes=[None])[0]  # not refused, not waiting
    np.testing.assert_array_equal(rows, index.recommend(2, 4)[0])
    stall.release.set()
    holder.join(10)


def test_settings_are_checked():
    with pytest.raises(ValueError):
        RecommendBatcher(max_batch=0)
    with pytest.raises(ValueError):
        RecommendBatcher(max_queue=-1)
    with pytest.raises(ValueError):
        RecommendBatcher(min_work=-1)


# -------------------------------------------------------------- a real server
def _large_dcr(n_users: int, n_items: int, width: int = 32) -> Artifact:
    """A catalogue whose 1,000-user batch takes tens of milliseconds to score exactly."""
    rng = np.random.default_rng(0)
    return Artifact(
        "dcr",
        {
            "user_factors": (rng.normal(size=(n_users, width)) / 8).astype(np.float32),
            "item_factors": (rng.normal(size=(n_items, width)) / 8).astype(np.float32),
            "seen_indptr": np.zeros(n_users + 1, dtype=np.int64),
            "seen_indices": np.zeros(0, dtype=np.int32),
            "item_popularity": rng.random(n_items).astype(np.float32),
        },
        {
            "users": IdMap([f"u{i}" for i in range(n_users)]),
            "items": IdMap([f"i{i}" for i in range(n_items)]),
        },
        attributes={"levels": [1.0, 2.0, 3.0, 4.0, 5.0], "relevance": "linear", "rank": width // 4},
    )


def _shed(server: ServerProcess) -> dict[str, float]:
    text = urllib.request.urlopen(server.metrics_url + "/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("ordrec_recommend_shed_total{"):
            out[line.split('reason="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.slow
def test_server_sheds_load_with_resource_exhausted_and_drops_expired_calls(tmp_path):
    registry = Registry(tmp_path / "registry")
    registry.publish("big", _large_dcr(1000, 30_000))
    users = [f"u{i}" for i in range(1000)]
    with ServerProcess(
        registry.root, "--batch-max-queue", "1", "--batch-max-size", "1000", "--batch-min-work", "0"
    ) as server:
        channel = grpc.insecure_channel(server.target)
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        stub.Recommend(pb.RecommendRequest(model="big", user_ids=users[:1], n=5), timeout=30)  # warm
        stop = time.monotonic() + 4
        codes: dict[str, int] = {}
        lock = threading.Lock()

        def hammer(batch: int, timeout: float) -> None:
            while time.monotonic() < stop:
                try:
                    stub.Recommend(
                        pb.RecommendRequest(model="big", user_ids=users[:batch], n=5), timeout=timeout
                    )
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                with lock:
                    codes[code] = codes.get(code, 0) + 1

        threads = [threading.Thread(target=hammer, args=(1000, 30)) for _ in range(2)]
        threads += [threading.Thread(target=hammer, args=(1, 0.02)) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        shed = _shed(server)
        channel.close()
    assert codes.get("RESOURCE_EXHAUSTED", 0) > 0, codes
    # A refusal can reach a client whose own 20 ms deadline already passed: it sees that instead.
    refused, expired = codes["RESOURCE_EXHAUSTED"], codes.get("DEADLINE_EXCEEDED", 0)
    assert refused <= shed["queue_full"] <= refused + expired
    assert shed.get("deadline", 0) > 0, shed
    assert codes.get("OK", 0) > 0
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}, codes


@pytest.mark.parametrize("flag", ["--batch-max-size", "--batch-max-queue", "--batch-min-work"])
def test_negative_batching_settings_are_refused_naming_the_flags(tmp_path, flag):
    result = run_cli(
        ["ordrec.service", "--registry", str(tmp_path), "--metrics-port", "-1", flag, "-1"], check=False
    )
    assert result.returncode == 2
    assert f"argument {flag}: must be an int in [0, inf), got -1" in result.stderr
