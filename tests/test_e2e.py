"""End to end: the sample trained through the CLI, ``ordrec-serve`` as a real
subprocess on a free loopback port, every implemented RPC over gRPC, health,
reflection, /metrics, and a clean SIGTERM exit."""

from __future__ import annotations

import re

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess, wait_for
from ordrec.trainer.data.readers import read_ratings
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.scrape import metric_in, metrics_text


@pytest.fixture(scope="module")
def server(sample_registry):
    with ServerProcess(sample_registry) as proc:
        yield proc


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.target) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel):
    return recommender_pb2_grpc.RecommenderStub(channel)


@pytest.fixture(scope="module")
def sample_ratings(sample_dir):
    return read_ratings(sample_dir / "ratings.data")


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def test_health_is_serving(channel):
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reply = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service="ordrec.v1.Recommender"), timeout=5
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_service(channel):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert "ordrec.v1.Recommender" in names and "grpc.health.v1.Health" in names


def test_list_models_shows_versions(stub, sample_registry):
    models = {m.name: m for m in stub.ListModels(pb.ListModelsRequest(), timeout=5).models}
    registry = Registry(sample_registry)
    assert set(models) == set(registry.models())
    dcr = models["dcr"]
    assert dcr.kind == "dcr" and dcr.version == registry.versions("dcr")[-1] and dcr.reason == "newest"
    assert "Recommend" in dcr.rpcs and dcr.sizes["users"] > 0


def test_recommend_excludes_training_items_and_ranks_by_score(stub, sample_ratings):
    reply = stub.Recommend(pb.RecommendRequest(model="dcr", user_ids=["u001"], n=10), timeout=5)
    (result,) = reply.results
    assert result.fallback == pb.FALLBACK_NONE and len(result.items) == 10
    scores = [i.score for i in result.items]
    assert scores == sorted(scores, reverse=True)
    user_row = sample_ratings.users.row("u001")
    seen = set(sample_ratings.items.externals(sample_ratings.item[sample_ratings.user == user_row]))
    assert not seen & {i.id for i in result.items}
    with_seen = stub.Recommend(
        pb.RecommendRequest(model="dcr", user_ids=["u001"], n=500, exclude_seen=False), timeout=5
    )
    assert seen <= {i.id for i in with_seen.results[0].items}


def test_recommend_distribution_is_a_distribution(stub):
    reply = stub.Recommend(
        pb.RecommendRequest(model="dcr", user_ids=["u002"], n=5, with_distribution=True), timeout=5
    )
    assert list(reply.levels) == [1.0, 2.0, 3.0, 4.0, 5.0]
    for item in reply.results[0].items:
        probs = np.array(item.rating_distribution)
        assert probs.shape == (5,) and np.all(probs >= 0) and probs.sum() == pytest.approx(1, abs=1e-4)


def test_recommend_batch_equals_single_calls(stub):
    users = ["u003", "u004", "u005"]
    batch = stub.Recommend(pb.RecommendRequest(model="pairwise_dcr", user_ids=users, n=5), timeout=5)
    for user, result in zip(users, batch.results):
        single = stub.Recommend(pb.RecommendRequest(model="pairwise_dcr", user_ids=[user], n=5), timeout=5)
        assert [i.id for i in result.items] == [i.id for i in single.results[0].items]
        assert result.user_id == user


def test_recommend_ranks_only_candidates(stub, sample_ratings):
    candidates = sample_ratings.items.ids[:7]
    reply = stub.Recommend(
        pb.RecommendRequest(
            model="dcr", user_ids=["u001"], n=3, candidate_item_ids=candidates, exclude_seen=False
        ),
        timeout=5,
    )
    got = [i.id for i in reply.results[0].items]
    assert len(got) == 3 and set(got) <= set(candidates)


def test_unknown_user_gets_flagged_popularity_fallback(stub):
    reply = stub.Recommend(pb.RecommendRequest(model="dcr", user_ids=["nobody", "u001"], n=4), timeout=5)
    assert reply.results[0].fallback == pb.FALLBACK_POPULAR_GLOBAL and len(reply.results[0].items) == 4
    assert reply.results[1].fallback == pb.FALLBACK_NONE


@pytest.mark.parametrize(
    "request_, code, message",
    [
        (
            pb.RecommendRequest(model="dcr", user_ids=["u001"], n=0),
            grpc.StatusCode.INVALID_ARGUMENT,
            "n must be",
        ),
        (
            pb.RecommendRequest(model="dcr", user_ids=["u001"], n=100000),
            grpc.StatusCode.INVALID_ARGUMENT,
            "n must",
        ),
        (pb.RecommendRequest(model="dcr", user_ids=[], n=5), grpc.StatusCode.INVALID_ARGUMENT, "user_ids"),
        (pb.RecommendRequest(model="dcr", user_ids=[""], n=5), grpc.StatusCode.INVALID_ARGUMENT, "empty"),
        (
            pb.RecommendRequest(model="dcr", user_ids=["x" * 1000], n=5),
            grpc.StatusCode.INVALID_ARGUMENT,
            "long",
        ),
        (
            pb.RecommendRequest(model="Bad Name", user_ids=["u001"], n=5),
            grpc.StatusCode.INVALID_ARGUMENT,
            "model",
        ),
        (
            pb.RecommendRequest(model="absent", user_ids=["u001"], n=5),
            grpc.StatusCode.NOT_FOUND,
            "no model 'absent'",
        ),
        (pb.RecommendRequest(user_ids=["u001"], n=5), grpc.StatusCode.INVALID_ARGUMENT, "several models"),
        (
            pb.RecommendRequest(model="dcr", user_ids=["u001"], n=5, candidate_item_ids=["zz"]),
            grpc.StatusCode.NOT_FOUND,
            "unknown candidate",
        ),
    ],
)
def test_recommend_bad_input_gets_the_right_status(stub, request_, code, message):
    got, details = code_of(lambda: stub.Recommend(request_, timeout=5))
    assert got == code and message in details


def test_rpc_the_model_cannot_answer(stub):
    got, details = code_of(
        lambda: stub.Tags(pb.TagsRequest(model="dcr", user_id="u", item_id="i", n=3), timeout=5)
    )
    assert got == grpc.StatusCode.FAILED_PRECONDITION and "does not answer Tags" in details


def test_record_interactions_without_redis(stub):
    got, details = code_of(
        lambda: stub.RecordInteractions(
            pb.RecordInteractionsRequest(user_id="u001", item_ids=["i001"]), timeout=5
        )
    )
    assert got == grpc.StatusCode.FAILED_PRECONDITION and "Redis" in details


def test_metrics_count_calls_by_method_and_code(server, stub):
    before = metrics_text(server)
    for _ in range(3):
        stub.Recommend(pb.RecommendRequest(model="dcr", user_ids=["u001"], n=3), timeout=5)
    code_of(lambda: stub.Recommend(pb.RecommendRequest(model="dcr", user_ids=["u001"], n=0), timeout=5))
    after = metrics_text(server)
    ok = dict(grpc_method="Recommend", grpc_code="OK")
    bad = dict(grpc_method="Recommend", grpc_code="INVALID_ARGUMENT")
    assert (
        metric_in(after, "grpc_server_handled_total", **ok)
        - metric_in(before, "grpc_server_handled_total", **ok)
        == 3
    )
    assert (
        metric_in(after, "grpc_server_handled_total", **bad)
        - metric_in(before, "grpc_server_handled_total", **bad)
        == 1
    )
    assert metric_in(after, "grpc_server_handling_seconds_count", grpc_method="Recommend") >= 4
    assert re.search(r'ordrec_model_info\{.*model="dcr".*\} 1\.0', after)
    assert metric_in(after, "ordrec_index_size", model="dcr", space="items") > 0


def test_empty_registry_is_not_serving_until_a_model_arrives(tmp_path, sample_registry):
    registry = tmp_path / "registry"
    registry.mkdir()
    with ServerProcess(registry, "--poll-interval", "0.2") as proc, grpc.insecure_channel(proc.target) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        check = lambda: health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status  # noqa: E731
        assert check() == health_pb2.HealthCheckResponse.NOT_SERVING
        stub = recommender_pb2_grpc.RecommenderStub(ch)
        got, details = code_of(lambda: stub.Recommend(pb.RecommendRequest(user_ids=["u001"], n=3), timeout=5))
        assert got == grpc.StatusCode.UNAVAILABLE
        source = Registry(sample_registry)
        Registry(registry).publish("dcr", source.load("dcr", mmap=False))
        wait_for(lambda: check() == health_pb2.HealthCheckResponse.SERVING, 20, what="SERVING")
        assert stub.Recommend(pb.RecommendRequest(user_ids=["u001"], n=3), timeout=5).results[0].items
        assert proc.terminate() == 0


def test_sigterm_exits_zero(sample_registry):
    proc = ServerProcess(sample_registry).start()
    assert proc.terminate() == 0
    assert any("stopped" in line for line in proc.output)


# ------------------------------------------------------------------ Tags (RTF)
@pytest.fixture(scope="module")
def sample_tags(sample_dir):
    from ordrec.trainer.data.readers import read_tags

    return read_tags(sample_dir / "tags.csv")


def test_tags_for_a_known_post(stub, sample_tags):
    user, item = (
        sample_tags.users.external(int(sample_tags.user[0])),
        sample_tags.items.external(int(sample_tags.item[0])),
    )
    reply = stub.Tags(pb.TagsRequest(model="rtf", user_id=user, item_id=item, n=5), timeout=5)
    assert reply.fallback == pb.FALLBACK_NONE and len(reply.tags) == 5
    scores = [t.score for t in reply.tags]
    assert scores == sorted(scores, reverse=True)
    post = (sample_tags.user == sample_tags.user[0]) & (sample_tags.item == sample_tags.item[0])
    own = set(sample_tags.tags.externals(sample_tags.tag[post]))
    all_tags = stub.Tags(
        pb.TagsRequest(model="rtf", user_id=user, item_id=item, n=1000, exclude_own_tags=True), timeout=5
    )
    assert not own & {t.id for t in all_tags.tags}
    assert len(all_tags.tags) == len(sample_tags.tags) - len(own)


def test_tags_cold_start_fallbacks(stub, sample_tags):
    user, item = sample_tags.users.ids[0], sample_tags.items.ids[0]
    cases = [
        ("stranger", item, pb.FALLBACK_POPULAR_ITEM),
        (user, "new-item", pb.FALLBACK_POPULAR_USER),
        ("stranger", "new-item", pb.FALLBACK_POPULAR_GLOBAL),
    ]
    for u, i, fallback in cases:
        reply = stub.Tags(pb.TagsRequest(model="rtf", user_id=u, item_id=i, n=3), timeout=5)
        assert reply.fallback == fallback and len(reply.tags) == 3


# ------------------------------------------------------------ maps (COE, SCORE, KNNSCAL)
def _neighbors(stub, **kw):
    return stub.Neighbors(pb.NeighborsRequest(**kw), timeout=5).neighbors


def test_coe_neighbors_all_directions(stub, sample_ratings):
    item, user = sample_ratings.items.ids[0], sample_ratings.users.ids[0]
    items = _neighbors(stub, model="coe", id=item, from_entity=pb.ENTITY_ITEM, k=5)
    assert len(items) == 5 and item not in {n.id for n in items}
    assert all(n.score <= 0 for n in items) and [n.score for n in items] == sorted(
        (n.score for n in items), reverse=True
    )
    users = _neighbors(stub, model="coe", id=item, from_entity=pb.ENTITY_ITEM, to_entity=pb.ENTITY_USER, k=4)
    assert {n.id for n in users} <= set(sample_ratings.users.ids) and len(users) == 4
    near_items = _neighbors(
        stub, model="coe", id=user, from_entity=pb.ENTITY_USER, to_entity=pb.ENTITY_ITEM, k=4
    )
    assert {n.id for n in near_items} <= set(sample_ratings.items.ids)
    got, _ = code_of(lambda: _neighbors(stub, model="coe", id="missing", k=3))
    assert got == grpc.StatusCode.NOT_FOUND
    got, _ = code_of(lambda: _neighbors(stub, model="coe", id=item, k=0))
    assert got == grpc.StatusCode.INVALID_ARGUMENT


def test_coe_recommend_is_nearest_unseen_items(stub, sample_ratings):
    reply = stub.Recommend(pb.RecommendRequest(model="coe", user_ids=["u001"], n=5), timeout=5)
    items = reply.results[0].items
    near = _neighbors(
        stub, model="coe", id="u001", from_entity=pb.ENTITY_USER, to_entity=pb.ENTITY_ITEM, k=200
    )
    user_row = sample_ratings.users.row("u001")
    seen = set(sample_ratings.items.externals(sample_ratings.item[sample_ratings.user == user_row]))
    expected = [n.id for n in near if n.id not in seen][:5]
    assert [i.id for i in items] == expected


def test_score_aspect_maps_and_related_aspects(stub, sample_dir):
    header = (sample_dir / "attributes.csv").read_text().splitlines()[0].split(",")
    aspects, first_object = (
        header[1:],
        (sample_dir / "attributes.csv").read_text().splitlines()[1].split(",")[0],
    )
    models = {m.name: m for m in stub.ListModels(pb.ListModelsRequest(), timeout=5).models}
    assert set(models["score"].spaces) == set(aspects)
    near = _neighbors(stub, model="score", space=aspects[0], id=first_object, k=5)
    assert len(near) == 5 and first_object not in {n.id for n in near}
    related = _neighbors(stub, model="score", id=aspects[0], from_entity=pb.ENTITY_ASPECT, k=3)
    assert len(related) == 3 and {n.id for n in related} <= set(aspects[1:])
    got, details = code_of(lambda: _neighbors(stub, model="score", id=first_object, k=3))
    assert got == grpc.StatusCode.INVALID_ARGUMENT and "space" in details
    got, _ = code_of(lambda: _neighbors(stub, model="score", space="no-such-aspect", id=first_object, k=3))
    assert got == grpc.StatusCode.NOT_FOUND


def test_coordinates_stream_the_whole_map_in_pages(stub, sample_ratings):
    pages = list(
        stub.Coordinates(pb.CoordinatesRequest(model="coe", entity=pb.ENTITY_ITEM, page_size=64), timeout=5)
    )
    assert [len(p.points) for p in pages[:-1]] == [64] * (len(pages) - 1)
    points = [pt for p in pages for pt in p.points]
    assert {pt.id for pt in points} == set(sample_ratings.items.ids)
    # the sample's COE is the default top-N model (64-D, docs/coe.md)
    assert all(len(pt.coords) == pages[0].dim == 64 for pt in points)
    by_id = list(
        stub.Coordinates(
            pb.CoordinatesRequest(model="coe", entity=pb.ENTITY_ITEM, ids=["i002", "i001"]), timeout=5
        )
    )
    assert [pt.id for pt in by_id[0].points] == ["i002", "i001"]
    got, _ = code_of(
        lambda: list(stub.Coordinates(pb.CoordinatesRequest(model="coe", ids=["nope"]), timeout=5))
    )
    assert got == grpc.StatusCode.NOT_FOUND


def test_knnscal_neighbors_and_place(stub, sample_dir):
    from ordrec.trainer.data.readers import read_neighbors

    graph = read_neighbors(sample_dir / "neighbors.csv")
    source = int(graph.source[0])
    own = graph.rank[graph.source == source].argsort()
    ranked = graph.vertices.externals(graph.neighbor[graph.source == source][own])
    vertex = graph.vertices.external(source)
    near = {n.id for n in _neighbors(stub, model="knnscal", id=vertex, k=10)}
    assert len(near & set(ranked)) >= 5  # the map keeps most of the list
    placed = stub.Place(pb.PlaceRequest(model="knnscal", ranked_neighbor_ids=ranked, k=10), timeout=5)
    assert len(placed.coords) == 2 and len(placed.neighbors) == 10
    assert len({n.id for n in placed.neighbors} & set(ranked)) >= 5
    got, _ = code_of(
        lambda: stub.Place(pb.PlaceRequest(model="knnscal", ranked_neighbor_ids=["zz"]), timeout=5)
    )
    assert got == grpc.StatusCode.NOT_FOUND
    got, _ = code_of(lambda: stub.Place(pb.PlaceRequest(model="knnscal", ranked_neighbor_ids=[]), timeout=5))
    assert got == grpc.StatusCode.INVALID_ARGUMENT


def test_tags_carry_display_names_when_the_data_has_them(tmp_path):
    from ordrec.trainer.models import estimator_class
    from ordrec.trainer.sample import planted_tags

    data = planted_tags(seed=2)
    data.tag_names = [f"name of {t}" for t in data.tags.ids]
    artifact = (
        estimator_class("rtf").from_flat(n_components=4, max_iter=2, verbose=False).fit(data).to_artifact()
    )
    Registry(tmp_path).publish("rtf", artifact)
    with ServerProcess(tmp_path) as proc, grpc.insecure_channel(proc.target) as ch:
        reply = recommender_pb2_grpc.RecommenderStub(ch).Tags(
            pb.TagsRequest(user_id=data.users.ids[0], item_id=data.items.ids[0], n=3), timeout=5
        )
    assert [t.label for t in reply.tags] == [f"name of {t.id}" for t in reply.tags]
