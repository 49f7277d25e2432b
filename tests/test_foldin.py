"""Fold-in: users a version has not seen, personalised from their recorded ratings.

The planted-data tests train the real estimators on users in three taste groups (most
of them in group 0, so popularity favours group 0's items), then fold in new users of all
three groups from half of their ratings and rank the other half: fold-in must beat the
popularity list on NDCG@10 of those held-out interactions.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import redis

from ordrec.service.indices.models import build_index
from ordrec.service.indices.models.dcr import DCRIndex
from ordrec.service.storage.idmap import IdMap
from ordrec.tools.process import ServerProcess
from ordrec.trainer.data.types import Ratings
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.test_dcr_index import artifact

N_ITEMS, GROUPS, PER_USER = 150, 3, 20


def planted_users(rng: np.random.Generator, groups: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(items, ratings) per user: 12 items of the user's group rated 4-5 (85%) and 8 others rated 1-2."""
    size = N_ITEMS // GROUPS
    users = []
    for g in groups:
        own = rng.choice(np.arange(g * size, (g + 1) * size), 12, replace=False)
        other = rng.choice(
            np.setdiff1d(np.arange(N_ITEMS), np.arange(g * size, (g + 1) * size)), 8, replace=False
        )
        liked = rng.random(12) < 0.85
        ratings = np.concatenate(
            [np.where(liked, rng.integers(4, 6, 12), rng.integers(1, 3, 12)), rng.integers(1, 3, 8)]
        )
        users.append((np.concatenate([own, other]), ratings.astype(np.float32)))
    return users


def training_ratings(users) -> Ratings:
    user = np.concatenate([np.full(len(items), u) for u, (items, _) in enumerate(users)])
    return Ratings(
        IdMap([f"u{u}" for u in range(len(users))]),
        IdMap([f"i{i}" for i in range(N_ITEMS)]),
        user.astype(np.int32),
        np.concatenate([items for items, _ in users]).astype(np.int32),
        np.concatenate([r for _, r in users]),
    )


def ndcg_at_10(ranked: np.ndarray, relevant: set[int]) -> float:
    gains = [1.0 / np.log2(k + 2) for k, item in enumerate(ranked[:10].tolist()) if item in relevant]
    ideal = sum(1.0 / np.log2(k + 2) for k in range(min(10, len(relevant))))
    return sum(gains) / ideal if ideal else 0.0


def held_out_comparison(index, new_users, seed: int) -> tuple[float, float]:
    """Mean NDCG@10 of fold-in and of popularity over the new users' held-out liked items."""
    rng = np.random.default_rng(seed)
    fold, popular = [], []
    for items, ratings in new_users:
        order = rng.permutation(len(items))
        recorded, held = order[: len(items) // 2], order[len(items) // 2 :]
        relevant = {int(items[k]) for k in held if ratings[k] >= 4}
        if not relevant:
            continue
        exclude = np.sort(items[recorded]).astype(np.int64)
        vector = index.fold_in(items[recorded], ratings[recorded])
        fold.append(ndcg_at_10(index.recommend_for(vector, 10, exclude=exclude)[0], relevant))
        popular.append(ndcg_at_10(index.popular(10, exclude=exclude)[0], relevant))
    return float(np.mean(fold)), float(np.mean(popular))


@pytest.fixture(scope="module")
def planted():
    rng = np.random.default_rng(7)
    known = planted_users(rng, [0] * 200 + [1] * 50 + [2] * 50)
    new = planted_users(rng, [0] * 14 + [1] * 13 + [2] * 13)
    return training_ratings(known), new


def test_dcr_fold_in_beats_popularity_on_held_out_interactions(planted):
    from ordrec.trainer.models.dcr import DCR

    data, new_users = planted
    index = build_index(DCR(n_components=8, max_iter=30, random_state=0).fit(data).to_artifact())
    fold, popular = held_out_comparison(index, new_users, seed=1)
    print(f"DCR NDCG@10 of held-out interactions: fold-in {fold:.3f}, popularity {popular:.3f}")
    assert fold > popular


def test_coe_fold_in_beats_popularity_on_held_out_interactions(planted):
    from ordrec.trainer.models.coe import COE

    data, new_users = planted
    index = build_index(COE(max_iter=10, random_state=0).fit(data).to_artifact())
    fold, popular = held_out_comparison(index, new_users, seed=1)
    print(f"COE NDCG@10 of held-out interactions: fold-in {fold:.3f}, popularity {popular:.3f}")
    assert fold > popular


def test_dcr_fold_in_fits_the_ratings_within_the_model_bound():
    index = DCRIndex.from_artifact(artifact(n_users=30, n_items=40, rank=4, seed=3))
    items = np.arange(0, 40, 2)
    loved = index.score_vector(index.fold_in(items, np.full(items.size, 5.0)), items)
    hated = index.score_vector(index.fold_in(items, np.full(items.size, 1.0)), items)
    assert loved.mean() > hated.mean()  # the same items score higher for the user who loved them
    for values in (np.full(items.size, 5.0), np.linspace(1, 5, items.size)):
        u = index.fold_in(items, values).reshape(index.n_levels, index.rank)
        assert np.all(np.linalg.norm(u, axis=1) <= 1.0 + 1e-5)  # |U^t| <= 1 (Eq. 1)
        dist = index.distribution_for(u.reshape(-1), items)
        np.testing.assert_allclose(dist.sum(axis=1), 1.0, atol=1e-5)


def test_dcr_fold_in_keeps_the_item_bias_coordinate_frozen():
    s = 0.3
    trained = artifact(n_users=10, n_items=20, rank=3, seed=4, hyperparameters={"research": {"item_bias": s}})
    users = trained.arrays["user_factors"].reshape(10, -1, 3)
    users[:, :, 0] = s  # as trained with item_bias: every user's first coordinate is s
    users[:, :, 1:] *= np.sqrt(1 - s * s)  # the rest inside the ball of sqrt(1 - s^2)
    index = DCRIndex.from_artifact(trained)
    u = index.fold_in(np.arange(10), np.linspace(1, 5, 10)).reshape(index.n_levels, index.rank)
    np.testing.assert_allclose(u[:, 0], s, rtol=1e-6)
    assert np.all(np.linalg.norm(u[:, 1:], axis=1) <= np.sqrt(1 - s * s) + 1e-5)


def test_a_known_users_answer_is_unchanged_by_the_vector_path():
    index = DCRIndex.from_artifact(artifact(n_users=9, n_items=30, seed=5))
    for u in range(9):
        exclude = index.seen(u)
        rows, scores = index.recommend(u, 7, exclude=exclude)
        vrows, vscores = index.recommend_for(index.user_vector(u), 7, exclude=exclude)
        np.testing.assert_array_equal(rows, vrows)
        np.testing.assert_allclose(scores, vscores, rtol=1e-6)


def _recommend(stub, user: str, model: str = "dcr", **kw) -> pb.UserRecommendations:
    return stub.Recommend(pb.RecommendRequest(model=model, user_ids=[user], n=10, **kw), timeout=10).results[
        0
    ]


def test_the_server_folds_in_new_users_with_recorded_ratings(sample_registry, redis_server):
    """A real server and Redis: ratings in ordrec:ratings:<user> (as RecordInteractions writes
    them) turn the popularity answer into a folded-in one, for DCR and COE."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    with (
        ServerProcess(sample_registry, *redis_server.serve_flags, "--poll-interval", "0") as server,
        grpc.insecure_channel(server.target) as channel,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        items = [i.id for i in _recommend(stub, "u001").items]
        popular = {model: _recommend(stub, "newcomer", model) for model in ("dcr", "coe")}
        for answer in popular.values():
            assert answer.fallback == pb.FALLBACK_POPULAR_GLOBAL and not answer.folded_in
        client.hset("ordrec:ratings:newcomer", mapping={items[0]: "5", items[1]: "4", items[2]: "1"})
        client.hset("ordrec:ratings:stranger", mapping={"no-such-item": "5"})
        for model in ("dcr", "coe"):
            answer = _recommend(stub, "newcomer", model)
            assert answer.folded_in and answer.fallback == pb.FALLBACK_NONE
            assert [i.id for i in answer.items] != [i.id for i in popular[model].items]
            assert answer.model_version
            unknown_items_only = _recommend(stub, "stranger", model)
            assert (
                unknown_items_only.fallback == pb.FALLBACK_POPULAR_GLOBAL and not unknown_items_only.folded_in
            )
        with_dist = _recommend(stub, "newcomer", "dcr", with_distribution=True)
        assert with_dist.folded_in
        assert all(abs(sum(i.rating_distribution) - 1.0) < 1e-4 for i in with_dist.items)
        known = _recommend(stub, "u001")
        assert not known.folded_in and known.fallback == pb.FALLBACK_NONE


def test_the_server_folds_in_new_users_from_interactions_without_ratings(sample_registry, redis_server):
    """A newcomer who only clicked (RecordInteractions without values) is folded in by the
    top-N versions (DCR and COE take picks), not answered with the popularity list."""
    with (
        ServerProcess(sample_registry, *redis_server.serve_flags, "--poll-interval", "0") as server,
        grpc.insecure_channel(server.target) as channel,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        clicked = [i.id for i in _recommend(stub, "u001").items][:3]
        for model in ("dcr", "coe"):
            assert _recommend(stub, f"clicker-{model}", model).fallback == pb.FALLBACK_POPULAR_GLOBAL
            stub.RecordInteractions(
                pb.RecordInteractionsRequest(user_id=f"clicker-{model}", item_ids=clicked, model=model),
                timeout=10,
            )
            for exclude_seen in (True, False):
                answer = _recommend(stub, f"clicker-{model}", model, exclude_seen=exclude_seen)
                assert answer.folded_in and answer.fallback == pb.FALLBACK_NONE, (model, exclude_seen)
                if exclude_seen:  # what they clicked is not offered back
                    assert set(clicked).isdisjoint(i.id for i in answer.items)
            explained = _recommend(stub, f"clicker-{model}", model, explain=2)  # explained by the clicks
            reasons = {e.id for item in explained.items for e in item.explanations}
            assert explained.folded_in and reasons and reasons <= set(clicked)


def test_at_most_the_capped_number_of_ratings_is_read(redis_server):
    from ordrec.service.live.redis_state import MAX_FOLD_IN_RATINGS, RATINGS_KEY, RedisSeenStore
    from ordrec.service.metrics import Metrics

    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.hset(RATINGS_KEY.format("heavy"), mapping={f"i{k}": "4" for k in range(MAX_FOLD_IN_RATINGS + 30)})
    client.hset(RATINGS_KEY.format("light"), mapping={"i1": "5", "i2": "1"})
    client.sadd("ordrec:seen:light", "i1")
    seen = RedisSeenStore(redis_server.url, Metrics(), timeout=1.0)
    try:
        recent, ratings, degraded = seen.lookup(["light"], ["heavy", "light", "nobody"])
    finally:
        seen.close()
    assert not degraded and recent == {"light": ["i1"]}
    assert ratings["light"] == {"i1": "5", "i2": "1"} and "nobody" not in ratings
    assert len(ratings["heavy"]) == MAX_FOLD_IN_RATINGS and set(ratings["heavy"].values()) == {"4"}
