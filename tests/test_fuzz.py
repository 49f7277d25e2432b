"""Random and malformed requests to every RPC of a real server: only documented
status codes come back, and the server stays up and correct."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ordrec.tools.process import ServerProcess
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc

DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.FAILED_PRECONDITION,
}
MODELS = ["", "dcr", "pairwise_dcr", "coe", "rtf", "score", "knnscal", "absent", "Bad Name", "x" * 70]
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def server(sample_registry):
    with ServerProcess(sample_registry) as proc:
        yield proc


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.target) as ch:
        yield recommender_pb2_grpc.RecommenderStub(ch)


text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300)
known_ids = st.sampled_from(["u001", "u002", "i001", "i002", "o001", "v001", "t001", "kind", "legs", ""])
ids = st.one_of(known_ids, text)
int32 = st.integers(-(2**31), 2**31 - 1)
small = st.one_of(st.integers(-5, 50), int32)
entity = st.one_of(st.sampled_from([0, 1, 2, 3]), st.integers(-100, 100))


def call_status(fn) -> grpc.StatusCode:
    try:
        result = fn()
        if hasattr(result, "__iter__") and not hasattr(result, "ListFields"):
            list(result)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        assert exc.details(), "every error carries a message"
        assert "Traceback" not in exc.details()
        return exc.code()


@SETTINGS
@given(
    model=st.sampled_from(MODELS),
    users=st.lists(ids, max_size=5),
    n=small,
    exclude=st.booleans(),
    candidates=st.lists(ids, max_size=4),
    dist=st.booleans(),
)
def test_recommend(stub, model, users, n, exclude, candidates, dist):
    req = pb.RecommendRequest(
        model=model,
        user_ids=users,
        n=n,
        candidate_item_ids=candidates,
        with_distribution=dist,
        exclude_seen=exclude,
    )
    assert call_status(lambda: stub.Recommend(req, timeout=10)) in DOCUMENTED


filters = st.one_of(
    st.sampled_from(
        [
            'genre in ("Comedy")',
            "year >= 1990",
            "a in (",
            "x between 3 and 1",
            "and",
            '"',
            "year >= 1e999",
            "y not in (1, 'a') and z != -.5",
        ]
    ),
    text,
)


@SETTINGS
@given(
    model=st.sampled_from(MODELS),
    users=st.lists(ids, max_size=3),
    n=small,
    filter_=filters,
    exclude=st.lists(ids, max_size=4),
)
def test_recommend_rules(stub, model, users, n, filter_, exclude):
    req = pb.RecommendRequest(model=model, user_ids=users, n=n, filter=filter_, exclude_item_ids=exclude)
    assert call_status(lambda: stub.Recommend(req, timeout=10)) in DOCUMENTED


floats = st.one_of(st.floats(-0.5, 1.5), st.floats(allow_nan=True, allow_infinity=True, width=32))
caps = st.one_of(st.none(), st.tuples(st.one_of(st.sampled_from(["genre", ""]), text), small))


def _with_cap(request, cap):
    if cap is not None:
        request.max_per_attribute.attribute, request.max_per_attribute.max = cap
    return request


@SETTINGS
@given(
    model=st.sampled_from(MODELS),
    users=st.lists(ids, max_size=3),
    n=small,
    explain=small,
    diversity=floats,
    cap=caps,
)
def test_recommend_features(stub, model, users, n, explain, diversity, cap):
    req = pb.RecommendRequest(model=model, user_ids=users, n=n, explain=explain, diversity=diversity)
    assert call_status(lambda: stub.Recommend(_with_cap(req, cap), timeout=10)) in DOCUMENTED


@SETTINGS
@given(
    model=st.sampled_from(MODELS),
    items=st.lists(ids, max_size=4),
    n=small,
    exclude=st.lists(ids, max_size=4),
    filter_=filters,
    diversity=floats,
    cap=caps,
)
def test_similar_items(stub, model, items, n, exclude, filter_, diversity, cap):
    req = pb.SimilarItemsRequest(
        model=model, item_ids=items, n=n, exclude_item_ids=exclude, filter=filter_, diversity=diversity
    )
    assert call_status(lambda: stub.SimilarItems(_with_cap(req, cap), timeout=10)) in DOCUMENTED


@SETTINGS
@given(model=st.one_of(st.sampled_from(MODELS + ["*"]), text))
def test_list_hidden(stub, model):
    # (HideItems changes state: its bad requests are tested on a private registry, tests/test_rules_service.py)
    assert call_status(lambda: stub.ListHidden(pb.ListHiddenRequest(model=model), timeout=10)) in DOCUMENTED


@SETTINGS
@given(model=st.sampled_from(MODELS), user=ids, item=ids, n=small, own=st.booleans())
def test_tags(stub, model, user, item, n, own):
    req = pb.TagsRequest(model=model, user_id=user, item_id=item, n=n, exclude_own_tags=own)
    assert call_status(lambda: stub.Tags(req, timeout=10)) in DOCUMENTED


@SETTINGS
@given(
    model=st.sampled_from(MODELS),
    space=st.one_of(st.sampled_from(["", "kind", "legs"]), text),
    id_=ids,
    src=entity,
    dst=entity,
    k=small,
)
def test_neighbors(stub, model, space, id_, src, dst, k):
    req = pb.NeighborsRequest(model=model, space=space, id=id_, from_entity=src, to_entity=dst, k=k)
    assert call_status(lambda: stub.Neighbors(req, timeout=10)) in DOCUMENTED


@SETTINGS
@given(
    model=st.sampled_from(MODELS),
    space=st.sampled_from(["", "kind", "x"]),
    ent=entity,
    id_list=st.lists(ids, max_size=4),
    page=small,
)
def test_coordinates(stub, model, space, ent, id_list, page):
    req = pb.CoordinatesRequest(model=model, space=space, entity=ent, ids=id_list, page_size=page)
    assert call_status(lambda: stub.Coordinates(req, timeout=10)) in DOCUMENTED


@SETTINGS
@given(
    model=st.sampled_from(MODELS),
    ranked=st.lists(st.one_of(st.sampled_from(["v001", "v002", "v003"]), ids), max_size=6),
    k=small,
)
def test_place(stub, model, ranked, k):
    req = pb.PlaceRequest(model=model, ranked_neighbor_ids=ranked, k=k)
    assert call_status(lambda: stub.Place(req, timeout=10)) in DOCUMENTED


@SETTINGS
@given(user=ids, items=st.lists(ids, max_size=4))
def test_record_interactions(stub, user, items):
    req = pb.RecordInteractionsRequest(user_id=user, item_ids=items)
    assert call_status(lambda: stub.RecordInteractions(req, timeout=10)) in DOCUMENTED


@SETTINGS
@given(
    body=st.binary(max_size=200),
    method=st.sampled_from(
        [
            "Recommend",
            "Tags",
            "Neighbors",
            "Place",
            "RecordInteractions",
            "ListModels",
            "Coordinates",
            "SimilarItems",
        ]
    ),
)
def test_raw_bytes(server, body, method):
    with grpc.insecure_channel(server.target) as ch:
        path = f"/ordrec.v1.Recommender/{method}"
        call = ch.unary_stream(path) if method == "Coordinates" else ch.unary_unary(path)
        assert call_status(lambda: call(body, timeout=10)) in DOCUMENTED


def test_server_is_still_up_and_right(server, stub):
    assert server.proc.poll() is None
    with grpc.insecure_channel(server.target) as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    reply = stub.Recommend(pb.RecommendRequest(model="dcr", user_ids=["u001"], n=5), timeout=5)
    assert len(reply.results[0].items) == 5
    assert not any("Traceback" in line for line in server.output), "".join(server.output[-30:])
