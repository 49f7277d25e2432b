"""Recommend's reply written as bytes (service/wire.py) parses to the message the servicer
builds, for random requests over a version with long and non-ASCII ids, fold-in, fallbacks,
distributions, recorded items and a degraded seen filter; and the server sends it."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.artifacts import ALL_MODELS, Registry
from ordrec.service.config import Limits
from ordrec.service.hidden import HiddenState
from ordrec.service.idmap import IdMap
from ordrec.service.metrics import Metrics
from ordrec.service.seen import SeenStore
from ordrec.service.servicer import RecommenderServicer
from ordrec.service.store import ModelStore
from ordrec.service.wire import varint
from ordrec.tools.process import ServerProcess
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.test_rules import FILTERS, dcr_artifact

N_USERS, N_ITEMS = 10, 70
# Ids past 127 UTF-8 bytes take a two-byte length; some are not ASCII.
ITEMS = [f"é-{i}-" + "x" * (130 if i % 3 == 0 else i) for i in range(N_ITEMS)]
USERS = [f"ü{i}" for i in range(N_USERS)]


class _Context:
    def time_remaining(self):
        return None

    def abort(self, code, message):
        raise AssertionError(f"{code}: {message}")


class _Recorded(SeenStore):
    """Recorded items and ratings as Redis would return them, and a seen filter that may fail
    open."""

    def __init__(self, degraded: bool):
        self.degraded = degraded

    def lookup(self, seen_for, ratings_for=()):
        recent = {u: [ITEMS[1], ITEMS[4], "gone"] for u in seen_for if u in (USERS[0], "new")}
        ratings = {u: {ITEMS[2]: "5", ITEMS[7]: "1", ITEMS[9]: "4"} for u in ratings_for if u == "new"}
        return recent, ratings, self.degraded


class _NoHidden:
    def token(self):
        return 0

    def read(self):
        return {ALL_MODELS: frozenset({ITEMS[5], ITEMS[6]})}

    def change(self, scope, ids, hide):
        raise AssertionError("not changed here")


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    artifact = dcr_artifact(n_users=N_USERS, n_items=N_ITEMS, seed=5)
    artifact.ids = {"users": IdMap(USERS), "items": IdMap(ITEMS)}
    registry = Registry(tmp_path_factory.mktemp("wire-registry"))
    registry.publish("dcr", artifact)
    return registry


@pytest.fixture(scope="module")
def store(registry):
    store = ModelStore(registry, Metrics())
    store.refresh()
    return store


requests = st.builds(
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
    users=st.lists(st.sampled_from(USERS + ["new", "nobody"]), min_size=1, max_size=5, unique=True),
    n=st.integers(1, 80),
    excluded=st.lists(st.sampled_from(ITEMS), max_size=8),
    filter_text=st.sampled_from(FILTERS),
    candidates=st.one_of(st.just([]), st.lists(st.sampled_from(ITEMS), min_size=1, max_size=10)),
    distribution=st.booleans(),
    seen=st.booleans(),
)


@settings(max_examples=80, deadline=None)
@given(request=requests, degraded=st.booleans())
def test_the_written_bytes_parse_to_the_servicers_message(store, request, degraded):
    servicer = RecommenderServicer(
        store, Metrics(), Limits(), _Recorded(degraded), HiddenState(_NoHidden(), interval=3600)
    )
    message = servicer.Recommend(request, _Context())
    written = servicer.RecommendWire(request, _Context())
    assert pb.RecommendResponse.FromString(written) == message
    assert len(written) == message.ByteSize()  # the same fields, none spelled out at its default


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16_383, 16_384, 2**31])
def test_varint_is_protobufs(value):
    encoded = varint(value)
    assert pb.RecommendRequest.FromString(b"\x18" + encoded).n == value % 2**32 - (
        2**32 if value % 2**32 >= 2**31 else 0
    )


def test_the_server_sends_the_written_reply(registry):
    with ServerProcess(registry.root) as server, grpc.insecure_channel(server.target) as channel:
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        reply = stub.Recommend(
            pb.RecommendRequest(model="dcr", user_ids=[USERS[3], "nobody"], n=7, with_distribution=True),
            timeout=30,
        )
    assert [r.user_id for r in reply.results] == [USERS[3], "nobody"]
    assert reply.results[1].fallback == pb.FALLBACK_POPULAR_GLOBAL
    assert all(len(r.items) == 7 for r in reply.results)
    assert all(item.id in ITEMS for r in reply.results for item in r.items)
    assert len(reply.levels) == 5 and len(reply.results[0].items[0].rating_distribution) == 5
