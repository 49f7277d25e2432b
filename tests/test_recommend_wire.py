"""Recommend's plain reply written as wire bytes (``service/serving/wire.py``): the bytes are
those of the general path's reply message, serialised (same ids, scores bit for bit, flags,
field order), bad requests get the general path's errors, garbage bytes INVALID_ARGUMENT, and a
real server's plain answers honour recorded items, hidden items, tokens and the metrics."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.config import Limits
from ordrec.service.indices.topk import UserProduct
from ordrec.service.live.forgotten import SCOPE, ForgottenUsers, user_digest
from ordrec.service.live.hidden import HiddenState
from ordrec.service.metrics import Metrics
from ordrec.service.serving import wire
from ordrec.service.serving.batching import RecommendBatcher
from ordrec.service.serving.servicer import RecommenderServicer, lenient_deserializer
from ordrec.service.serving.wire import WirePlan, encode_reply
from ordrec.service.storage.hidden_items import ALL_MODELS
from ordrec.service.storage.idmap import IdMap, PackedIdMap
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess
from ordrec.v1 import recommender_pb2 as pb
from tests.admin_token import ADMIN_FLAGS, ADMIN_METADATA
from tests.scrape import metric
from tests.servicer_fakes import FixedSet, NoDeadlineContext, RecordedSeen, dcr_store
from tests.test_rules import dcr_artifact

N_USERS, N_ITEMS = 10, 300
USERS = [f"u{i}" for i in range(N_USERS)]
TOKEN = "s3cret-wire-token-0123"
ITEMS = [f"i{i}" for i in range(N_ITEMS)]


class _Aborted(Exception):
    """A call's status, as a test context records it."""


class _Context(NoDeadlineContext):
    def abort(self, code, message):
        raise _Aborted(code, message)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return dcr_store(tmp_path_factory.mktemp("wire-registry"), N_USERS, N_ITEMS, seed=7)


def _servicer(store, hidden=frozenset(), forgotten=(), recent=None, degraded=False, batched=False):
    return RecommenderServicer(
        store,
        Metrics(),
        Limits(),
        RecordedSeen(recent or {}, degraded),
        HiddenState(FixedSet(ALL_MODELS, hidden), interval=3600),
        # min_work 0: every version batches, so the plain path scores through the batcher
        batcher=RecommendBatcher(8, min_work=0) if batched else None,
        forgotten=ForgottenUsers(FixedSet(SCOPE, frozenset(user_digest(u) for u in forgotten)), 3600),
    )


def _general(plain: pb.RecommendRequest) -> pb.RecommendRequest:
    """The same request forced through the general path (an exclusion of no known item)."""
    general = pb.RecommendRequest()
    general.CopyFrom(plain)
    general.exclude_item_ids.append("not-an-item")
    return general


def _outcome(call):
    try:
        return call()
    except _Aborted as exc:
        return exc.args


@settings(max_examples=80, deadline=None)
@given(
    user=st.sampled_from(USERS + ["nobody"]),
    n=st.integers(1, 160),  # past the fused kernel's 128: scored apart, then written
    exclude_seen=st.sampled_from([None, True, False]),
    hidden=st.sets(st.sampled_from(ITEMS), max_size=40).map(frozenset),
    sparse_hidden=st.booleans(),  # so many hidden that the few eligible are ranked apart
    forgotten=st.sets(st.sampled_from(USERS), max_size=3),
    recent=st.dictionaries(st.sampled_from(USERS), st.lists(st.sampled_from(ITEMS + ["i999"]), max_size=8)),
    degraded=st.booleans(),
    batched=st.booleans(),
)
def test_the_plain_replys_bytes_are_the_general_replys(
    store, user, n, exclude_seen, hidden, sparse_hidden, forgotten, recent, degraded, batched
):
    if sparse_hidden:
        hidden = frozenset(ITEMS[: N_ITEMS - 12]) | hidden
    servicer = _servicer(store, hidden, forgotten, recent, degraded, batched)
    plain = pb.RecommendRequest(model="dcr", user_ids=[user], n=n)
    if exclude_seen is not None:
        plain.exclude_seen = exclude_seen
    got = servicer.recommend_wire(plain, _Context())
    expected = servicer.Recommend(_general(plain), _Context())
    assert got == expected.SerializeToString()  # ids, scores bit for bit, flags, field order
    assert servicer.Recommend(plain, _Context()) == expected  # the message API: the same reply
    items = pb.RecommendResponse.FromString(got).results[0].items
    assert not {item.id for item in items} & hidden


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(["dcr", "", "absent", "Bad Name", "x" * 70]),
    users=st.lists(st.sampled_from(["u1", "", "x" * 300, "nobody"]), min_size=0, max_size=2),
    n=st.sampled_from([-(2**31), -1, 0, 1, 10, 1000, 1001, 2**31 - 1]),
)
def test_bad_plain_requests_get_the_general_paths_errors(store, model, users, n):
    servicer = _servicer(store)
    plain = pb.RecommendRequest(model=model, user_ids=users, n=n)
    wire = _outcome(lambda: servicer.recommend_wire(plain, _Context()))
    general = _outcome(lambda: servicer.Recommend(_general(plain), _Context()))
    if isinstance(wire, bytes):
        assert wire == general.SerializeToString()
    else:
        assert wire == general  # (status, message)
        assert wire[0] in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)


@settings(max_examples=100, deadline=None)
@given(body=st.binary(max_size=64))
def test_garbage_bytes_are_invalid_argument_or_a_request(store, body):
    servicer = _servicer(store)
    request = lenient_deserializer(pb.RecommendRequest)(body)
    outcome = _outcome(lambda: servicer.recommend_wire(request, _Context()))
    if not isinstance(request, pb.RecommendRequest):
        assert outcome[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid ordrec.v1.RecommendRequest" in outcome[1]
    else:  # bytes that happen to parse: answered as the general path answers the same request
        expected = _outcome(lambda: servicer.Recommend(_general(request), _Context()))
        if isinstance(outcome, bytes):
            assert outcome == expected.SerializeToString()
        else:
            assert outcome == expected


id_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=70)
score = st.one_of(
    st.floats(width=32),
    st.sampled_from([0.0, -0.0, float("inf"), float("-inf")]),
    st.floats(allow_nan=False),  # doubles (other kinds' scores): rounded as protobuf rounds them
)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # doubles past float32: inf
@settings(max_examples=200, deadline=None)
@given(
    items=st.lists(id_text, min_size=1, max_size=40, unique=True),
    users=st.lists(id_text, min_size=1, max_size=5, unique=True),
    data=st.data(),
    model=st.sampled_from(["dcr", "m" * 64]),
    version=st.sampled_from(["", "20260101T000000.000000Z", "v" * 130]),  # a two-byte length too
    packed=st.booleans(),
    degraded=st.booleans(),
    stale=st.booleans(),
)
def test_encoded_replies_are_protobufs_serialisation(
    items, users, data, model, version, packed, degraded, stale
):
    """Empty ids and +0.0 scores left out as proto3 leaves them, -0.0 and infinities kept,
    lengths past 127 bytes, ids from both kinds of id map."""
    if packed:
        items = [i for i in items if "\n" not in i] or ["x"]
        users = [u for u in users if "\n" not in u] or ["u"]
        item_map = PackedIdMap("".join(i + "\n" for i in items).encode())
        user_map = PackedIdMap("".join(u + "\n" for u in users).encode())
    else:
        item_map, user_map = IdMap(items), IdMap(users)
    rows = data.draw(st.lists(st.integers(0, len(items) - 1), max_size=30))
    scores = data.draw(st.lists(score, min_size=len(rows), max_size=len(rows)))
    user = data.draw(st.integers(0, len(users) - 1))
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    plan = WirePlan(item_map, user_map, model, version)
    got = encode_reply(plan, user, np.array(rows, np.int64), np.array(scores, dtype), degraded, stale)
    reply = pb.RecommendResponse(
        model=model, model_version=version, seen_filter_degraded=degraded, rules_stale=stale
    )
    result = reply.results.add(user_id=users[user], model_version=version)
    for row, value in zip(rows, scores):
        result.items.add(id=items[row], score=value)
    assert got == reply.SerializeToString()


# ------------------------------------------------------------------ a real server


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wire-server")
    Registry(folder).publish("dcr", dcr_artifact(n_users=N_USERS, n_items=N_ITEMS, seed=11))
    return folder


def _raw_call(channel, body: bytes, token: str | None) -> bytes:
    call = channel.unary_unary("/ordrec.v1.Recommender/Recommend")
    return call(body, timeout=10, metadata=[("authorization", f"Bearer {token}")] if token else None)


def test_a_real_servers_plain_answers(registry, redis_server):
    """Over gRPC against a server process with Redis and a token: the plain reply's bytes are the
    general path's, recorded and hidden items are left out of both, garbage and a missing
    token are refused, and the calls are counted."""
    env = {"WIRE_TOKEN": TOKEN}
    flags = ("--token-env", "WIRE_TOKEN", *ADMIN_FLAGS)
    with ServerProcess(registry, *redis_server.serve_flags, *flags, env=env) as server:
        with grpc.insecure_channel(server.target) as channel:
            call = lambda request: _raw_call(channel, request.SerializeToString(), TOKEN)  # noqa: E731
            plain = pb.RecommendRequest(model="dcr", user_ids=["u3"], n=20)
            first = pb.RecommendResponse.FromString(call(plain)).results[0].items
            recorded, hidden = first[0].id, first[1].id
            record = channel.unary_unary("/ordrec.v1.Recommender/RecordInteractions")
            record(
                pb.RecordInteractionsRequest(user_id="u3", item_ids=[recorded]).SerializeToString(),
                timeout=10,
                metadata=[("authorization", f"Bearer {TOKEN}")],
            )
            hide = channel.unary_unary("/ordrec.v1.Recommender/HideItems")
            hide(
                pb.HideItemsRequest(item_ids=[hidden]).SerializeToString(),
                timeout=10,
                metadata=ADMIN_METADATA,
            )
            got = call(plain)
            assert got == call(_general(plain))
            ids = [item.id for item in pb.RecommendResponse.FromString(got).results[0].items]
            assert recorded not in ids and hidden not in ids and len(ids) == 20
            for body in (b"\xff\xff\xff", b"\x12"):
                with pytest.raises(grpc.RpcError) as refused:
                    _raw_call(channel, body, TOKEN)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as refused:
                _raw_call(channel, plain.SerializeToString(), None)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ok = metric(server, "grpc_server_handled_total", grpc_code="OK", grpc_method="Recommend")
        users = metric(server, "ordrec_recommend_users_total")
        assert ok == 3 and users == 3  # two plain calls and their general twin


def test_warm_up_compiles_every_kernel_a_plain_reply_calls():
    """Writable or read-only arrays (in memory or memory-mapped), row- or column-major item
    factors: scored_reply passes them all as one type, so after warm_up nothing compiles
    (a compile on a request's path takes seconds) and the bytes do not depend on it."""
    wire.warm_up()
    compiled = wire.compiled_signatures()
    assert sum(compiled.values()) > 0
    rng = np.random.default_rng(0)
    plan = WirePlan(IdMap([f"i{i}" for i in range(6)]), IdMap(["u0", "u1"]), "m", "v")

    def read_only(array):
        view = array.view()
        view.flags.writeable = False
        return view

    items = rng.integers(-4, 5, size=(6, 3)).astype(np.float32)  # exact sums in any order
    replies = set()
    for matrix in (items, np.asfortranarray(items), read_only(items)):
        for freeze in (lambda a: a, read_only):
            product = UserProduct(
                freeze(matrix),
                freeze(np.ones((2, 3), np.float32)),
                freeze(np.ones(3, np.float32)),
                np.float32(0),
            )
            seen, recorded, blocked = np.array([1], np.int64), np.array([2], np.int64), np.zeros(6, bool)
            reply = wire.scored_reply(
                plan, product, 1, 3, freeze(seen), freeze(recorded), freeze(blocked), False, False
            )
            replies.add(reply)
    assert wire.compiled_signatures() == compiled
    assert len(replies) == 1
    ids = [item.id for item in pb.RecommendResponse.FromString(replies.pop()).results[0].items]
    assert len(ids) == 3 and not {"i1", "i2"} & set(ids)
