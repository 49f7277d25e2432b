"""SimilarItems, explanations and diversity through a real server process and the Python client:
the answers are the index's, the rules hold, bad settings are INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from ordrec.client import Client
from ordrec.service.indices.models import build_index
from ordrec.service.indices.similar import similar_items
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess
from tests.admin_token import ADMIN_FLAGS, ADMIN_TOKEN


@pytest.fixture(scope="module")
def server(sample_registry):
    with ServerProcess(sample_registry) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server):
    with Client(server.target, timeout=20) as c:
        assert c.wait_ready(30)
        yield c


@pytest.fixture(scope="module")
def indexes(sample_registry):
    registry = Registry(sample_registry)
    return {name: build_index(registry.load(name)) for name in ("dcr", "coe")}


@pytest.mark.parametrize("model", ["dcr", "pairwise_dcr", "coe"])
def test_similar_items_for_every_recommender(client, model):
    reply = client.similar("i001", model=model, n=5, exclude=["i002"])
    ids = [item.id for item in reply.items]
    assert len(ids) == 5 and "i001" not in ids and "i002" not in ids
    scores = [item.score for item in reply.items]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("model", ["dcr", "coe"])
def test_similar_items_is_the_indexs_answer(client, indexes, model):
    index = indexes[model]
    basket = ["i003", "i010", "no-such-item"]
    reply = client.similar(basket, model=model, n=8)
    rows, scores = similar_items(index, index.items.rows(basket[:2]), 8)
    assert [item.id for item in reply.items] == [index.items.external(int(r)) for r in rows]
    np.testing.assert_allclose([item.score for item in reply.items], scores, rtol=1e-5)
    assert list(reply.unknown_item_ids) == ["no-such-item"]


def test_similar_items_errors(client):
    with pytest.raises(grpc.RpcError) as info:
        client.similar(["nothing-known"], model="dcr", n=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        client.similar("v001", model="knnscal", n=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_recommend_explanations_come_from_the_users_history(client, indexes):
    index = indexes["dcr"]
    reply = client.recommend(["u001", "u002", "nobody"], model="dcr", n=5, explain=3)
    for result in reply.results[:2]:
        history = {index.items.external(int(r)) for r in index.seen(index.users.row(result.user_id))}
        assert any(item.explanations for item in result.items)
        for item in result.items:
            assert len(item.explanations) <= 3
            assert all(why.id in history and why.id != item.id for why in item.explanations)
            shares = [why.share for why in item.explanations]
            assert all(0 < s <= 1 for s in shares) and sum(shares) <= 1 + 1e-5
            assert shares == sorted(shares, reverse=True)
    assert not any(item.explanations for item in reply.results[2].items)  # popularity: no history


def test_explain_changes_nothing_else(client):
    plain = client.recommend("u001", model="coe", n=10)
    explained = client.recommend("u001", model="coe", n=10, explain=2)
    assert [i.id for i in plain.results[0].items] == [i.id for i in explained.results[0].items]
    assert any(i.explanations for i in explained.results[0].items)


@pytest.mark.parametrize("model", ["dcr", "coe"])
def test_diversity_zero_is_the_plain_ranking_and_more_reranks_the_pool(client, model):
    plain = client.recommend(["u001", "u003"], model=model, n=10)
    zero = client.recommend(["u001", "u003"], model=model, n=10, diversity=0.0)
    assert plain == zero
    pool = client.recommend(["u001", "u003"], model=model, n=50)
    diverse = client.recommend(["u001", "u003"], model=model, n=10, diversity=0.7)
    for result, top in zip(diverse.results, pool.results):
        ids = [i.id for i in result.items]
        assert len(ids) == 10 and set(ids) <= {i.id for i in top.items}
        assert ids[0] == top.items[0].id  # the first pick is the model's best


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(explain=-1), "explain"),
        (dict(explain=21), "explain"),
        (dict(diversity=1.5), "diversity"),
        (dict(diversity=-0.1), "diversity"),
        (dict(diversity=float("nan")), "diversity"),
        (dict(max_per_attribute=("genre", 0)), "max_per_attribute.max"),
        (dict(max_per_attribute=("", 2)), "max_per_attribute.attribute"),
        (dict(max_per_attribute=("no_such_column", 2)), "max_per_attribute.attribute"),
    ],
)
def test_bad_settings_are_invalid_argument_naming_the_field(client, kwargs, field):
    with pytest.raises(grpc.RpcError) as info:
        client.recommend("u001", model="dcr", n=5, **kwargs)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in info.value.details()
    if "explain" not in kwargs:
        with pytest.raises(grpc.RpcError) as info:
            client.similar("i001", model="dcr", n=5, **kwargs)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in info.value.details()


def test_a_folded_in_user_is_explained_by_the_items_recorded_for_them(sample_registry, redis_server):
    """A real server and redis-server: a new user's recorded items they liked are their history."""
    with (
        ServerProcess(sample_registry, *redis_server.serve_flags, "--poll-interval", "0") as server,
        Client(server.target, timeout=20) as client,
    ):
        assert client.wait_ready(30)
        client.record("newcomer", ratings={"i001": 5, "i002": 4, "i003": 2}, model="dcr")
        for model in ("dcr", "coe"):
            answer = client.recommend("newcomer", model=model, n=5, explain=2).results[0]
            assert answer.folded_in
            reasons = [why for item in answer.items for why in item.explanations]
            assert reasons and {why.id for why in reasons} <= {"i001", "i002"}  # i003 (2) is below their mean
            assert all(why.rating == {"i001": 5, "i002": 4}[why.id] for why in reasons)


def test_hidden_items_never_come_back_as_similar_items(sample_registry, tmp_path):
    """HideItems (kept in a private registry: no Redis) applies to SimilarItems from the next call."""
    source, private = Registry(sample_registry), Registry(tmp_path)
    for name in ("dcr", "coe"):
        private.publish(name, source.load(name, mmap=False))
    with (
        ServerProcess(tmp_path, "--poll-interval", "0.2", *ADMIN_FLAGS) as server,
        Client(server.target, timeout=20, token=ADMIN_TOKEN) as client,
    ):
        assert client.wait_ready(30)
        before = {m: [i.id for i in client.similar("i001", model=m, n=5).items] for m in ("dcr", "coe")}
        client.hide([before["dcr"][0], before["coe"][0]])
        for model, ids in before.items():
            after = [i.id for i in client.similar("i001", model=model, n=5).items]
            assert ids[0] not in after and len(after) == 5
