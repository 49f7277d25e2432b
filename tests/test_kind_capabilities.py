"""A kind gets the item features through the capabilities its index declares: the toy kind
(``tests/toy_kind.py``, registered by one ``kinds.register`` call) answers SimilarItems,
explanations and diversity with nothing else changed."""

from __future__ import annotations

import numpy as np
import pytest

from ordrec.service.config import Limits
from ordrec.service.indices.similar import intra_list_diversity, similar_items
from ordrec.service.metrics import Metrics
from ordrec.service.serving.servicer import RecommenderServicer
from ordrec.service.serving.store import ModelStore
from ordrec.service.storage.registry import Registry
from ordrec.v1 import recommender_pb2 as pb
from tests.servicer_fakes import NoDeadlineContext, RecordedSeen
from tests.test_dcr import make_ratings

N_USERS, N_ITEMS = 40, 60


@pytest.fixture
def servicer(toy, tmp_path):
    rng = np.random.default_rng(3)
    user = np.repeat(np.arange(N_USERS), 15)
    item = np.concatenate([rng.choice(N_ITEMS, 15, replace=False) for _ in range(N_USERS)])
    ratings = make_ratings(user, item, rng.integers(1, 6, user.size), N_USERS, N_ITEMS)
    registry = Registry(tmp_path)
    registry.publish("toy", toy.estimator_class()().fit(ratings).to_artifact())
    store = ModelStore(registry, Metrics())
    store.refresh()
    return RecommenderServicer(store, Metrics(), Limits(), RecordedSeen({}, False))


def _ids(items) -> list[str]:
    return [item.id for item in items]


def test_similar_items_are_the_declared_similaritys(servicer):
    reply = servicer.SimilarItems(
        pb.SimilarItemsRequest(model="toy", item_ids=["i1"], n=5), NoDeadlineContext()
    )
    index = servicer.store.resolve("toy", "SimilarItems").index
    vectors = index.item_similarity().vectors
    expected = np.argsort(-(vectors @ vectors[1]), kind="stable")
    assert _ids(reply.items) == [f"i{row}" for row in expected[expected != 1][:5]]
    np.testing.assert_allclose([i.score for i in reply.items], similar_items(index, np.array([1]), 5)[1])


def test_explanations_name_liked_history_items(servicer):
    request = pb.RecommendRequest(model="toy", user_ids=["u0", "u1"], n=5, explain=2)
    reply = servicer.Recommend(request, NoDeadlineContext())
    index = servicer.store.resolve("toy", "Recommend").index
    for result in reply.results:
        history = {f"i{row}" for row in index.seen(index.users.row(result.user_id)).tolist()}
        reasons = [why for item in result.items for why in item.explanations]
        assert reasons and all(why.id in history and 0 < why.share <= 1 for why in reasons)


def test_diversity_reranks_toward_dissimilar_items(servicer):
    index = servicer.store.resolve("toy", "Recommend").index
    plain = servicer.Recommend(pb.RecommendRequest(model="toy", user_ids=["u0"], n=8), NoDeadlineContext())
    request = pb.RecommendRequest(model="toy", user_ids=["u0"], n=8, diversity=0.9)
    diverse = servicer.Recommend(request, NoDeadlineContext())
    plain_ids, diverse_ids = _ids(plain.results[0].items), _ids(diverse.results[0].items)
    assert diverse_ids[0] == plain_ids[0] and diverse_ids != plain_ids
    spread = [intra_list_diversity(index, index.items.rows(ids)) for ids in (plain_ids, diverse_ids)]
    assert spread[1] > spread[0]
