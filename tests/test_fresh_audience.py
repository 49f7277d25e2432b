"""Fresh items reach their own audience (issue 44): a fresh item's place comes from its raters'
ratings relative to their other items, so one taste group's favourite reaches that group and
not everyone, and an item a group rated low stays away from it.

The planted groups (``tests/fresh_planted.py``) share a liking for a few blockbusters, so all
users' factors have a common part: a fold-in that follows the raters' common part makes a
group's item everyone's.
"""

from __future__ import annotations

import numpy as np
import pytest

from ordrec.service.indices.item_attributes import ItemAttributeTable
from ordrec.service.indices.models import build_index
from ordrec.service.indices.models.base import RecommenderIndex
from ordrec.service.indices.rules import ATTRIBUTES_KEY, encode_item_attributes
from ordrec.service.live.fresh import FreshEvidence, FreshItems, FreshOverlay, FreshRules, similar_with_fresh
from ordrec.v1 import recommender_pb2 as pb
from tests.conftest import wait_until
from tests.fresh_planted import PlantedTastes, planted_tastes

TOP = 10
RATERS = 30


@pytest.fixture(scope="module")
def tastes() -> PlantedTastes:
    return planted_tastes(seed=0)


@pytest.fixture(scope="module")
def indices(tastes) -> dict[str, RecommenderIndex]:
    """DCR and COE versions of the planted groups, each item listed with its block ("g0".."g2",
    "g-1" for a blockbuster) in a "group" attribute."""
    from ordrec.trainer.models.coe import COE
    from ordrec.trainer.models.dcr import DCR

    built = {}
    for kind, model in (
        ("dcr", DCR(n_components=8, max_iter=30, random_state=0)),
        ("coe", COE(random_state=0)),
    ):
        artifact = model.fit(tastes.training).to_artifact()
        groups = [[f"g{tastes.block_of[item]}"] for item in artifact.ids["items"].ids]
        arrays, meta = encode_item_attributes(
            [{"name": "group", "type": "categorical", "values": groups}], len(groups)
        )
        artifact.arrays.update(arrays)
        artifact.attributes[ATTRIBUTES_KEY] = meta
        built[kind] = build_index(artifact)
    return built


def fresh_item(index: RecommenderIndex, ratings: dict[str, float]) -> FreshOverlay:
    """The overlay of one fresh item "NEW" rated ``ratings`` (user id -> rating)."""
    evidence = FreshEvidence(None, known=lambda item: False)
    evidence.add_entries({"user": u, "item": "NEW", "value": repr(v)} for u, v in ratings.items())
    overlay = FreshItems(evidence).overlay(index)
    assert overlay is not None and overlay.ids == ["NEW"]
    return overlay


def unseen_scores(index: RecommenderIndex, user: str) -> np.ndarray:
    row = index.users.row(user)
    scores = index.score_users(np.array([row]))[0].astype(np.float64)
    scores[index.seen(row)] = -np.inf
    return scores


def fresh_ranks(index: RecommenderIndex, overlay: FreshOverlay, users: list[str]) -> np.ndarray:
    """The fresh item's rank among each user's unseen items (1: first)."""
    ranks = []
    for user in users:
        fresh = float(index.score_factors(index.user_vector(index.users.row(user)), overlay.factors)[0])
        ranks.append(1 + int((unseen_scores(index, user) > fresh).sum()))
    return np.array(ranks)


def reach_of_fresh(index: RecommenderIndex, overlay: FreshOverlay, users: list[str]) -> float:
    """The share of ``users`` with the fresh item in their top ``TOP`` (their seen items excluded)."""
    return float(np.mean(fresh_ranks(index, overlay, users) <= TOP))


def reach_of_trained(index: RecommenderIndex, item: str, users: list[str]) -> float:
    """The share of ``users`` who did not rate ``item`` with it in their top ``TOP``."""
    row, hits, asked = index.items.row(item), 0, 0
    for user in users:
        scores = unseen_scores(index, user)
        if np.isfinite(scores[row]):
            asked += 1
            hits += int((scores > scores[row]).sum()) < TOP
    return hits / max(asked, 1)


def liked_by(users: list[str], seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    return {u: float(v) for u, v in zip(users, rng.integers(4, 6, len(users)))}


@pytest.mark.parametrize("model", ["dcr", "coe"])
def test_a_fresh_item_one_group_likes_reaches_that_group_and_not_the_rest(tastes, indices, model):
    index = indices[model]
    group = tastes.users_of(0)
    overlay = fresh_item(index, liked_by(group[:RATERS], seed=1))
    own = reach_of_fresh(index, overlay, group[RATERS:])
    rest = tastes.users_of(1) + tastes.users_of(2)
    others = reach_of_fresh(index, overlay, rest)
    # The group's trained items have about as many raters (12 of 40 items by each of 100 users).
    trained = max(reach_of_trained(index, i, rest) for i, b in tastes.block_of.items() if b == 0)
    assert own >= 0.5, own
    assert others <= trained + 0.02, (others, trained)


@pytest.mark.parametrize("model", ["dcr", "coe"])
def test_similar_items_of_a_fresh_item_are_its_raters_favourites(tastes, indices, model):
    index = indices[model]
    overlay = fresh_item(index, liked_by(tastes.users_of(0)[:RATERS], seed=1))
    rows, _ = similar_with_fresh(
        index, overlay, np.array([overlay.base]), 5, exclude=None, eligible=None, rules=FreshRules((), None)
    )
    blocks = [tastes.block_of[index.items.ids[r]] for r in rows.tolist()]
    assert blocks.count(0) >= 4, blocks


@pytest.mark.parametrize("model", ["dcr", "coe"])
def test_a_fresh_item_a_group_rated_low_does_not_reach_it(tastes, indices, model):
    index = indices[model]
    group = tastes.users_of(1)
    overlay = fresh_item(index, {u: 1.0 for u in group[:RATERS]})
    assert reach_of_fresh(index, overlay, group[RATERS:]) <= 0.02


@pytest.mark.parametrize("model", ["dcr", "coe"])
def test_a_fresh_item_known_by_its_attributes_goes_to_those_who_like_items_sharing_them(
    tastes, indices, model
):
    """Nobody rated it yet; the attributes file lists it in group 0: it sits among group 0's
    items and reaches the rest no more than a trained item of that group (COE used to place it
    at the plain centroid, in the middle of the map near every user)."""
    index = indices[model]
    table = ItemAttributeTable(categorical={"group": {"NEW": ["g0"]}})
    overlay = FreshItems(FreshEvidence(None, known=lambda item: False), attributes=table).overlay(index)
    assert overlay is not None and overlay.ids == ["NEW"]
    rest = tastes.users_of(1) + tastes.users_of(2)
    trained = max(reach_of_trained(index, i, rest) for i, b in tastes.block_of.items() if b == 0)
    assert reach_of_fresh(index, overlay, rest) <= trained + 0.02
    own = np.median(fresh_ranks(index, overlay, tastes.users_of(0)))
    others = np.median(fresh_ranks(index, overlay, rest))
    assert own * 3 <= others, (own, others)
    rows, _ = similar_with_fresh(
        index, overlay, np.array([overlay.base]), 5, exclude=None, eligible=None, rules=FreshRules((), None)
    )
    assert [tastes.block_of[index.items.ids[r]] for r in rows.tolist()].count(0) >= 2


# ---------------------------------------------------------- through a real server and redis-server
def _top_ids(stub, user: str, model: str) -> list[str]:
    reply = stub.Recommend(pb.RecommendRequest(model=model, user_ids=[user], n=TOP), timeout=10)
    return [item.id for item in reply.results[0].items]


def _reach(stub, model: str, item: str, users: list[str]) -> float:
    return float(np.mean([item in _top_ids(stub, user, model) for user in users]))


@pytest.mark.redis
@pytest.mark.parametrize("model", ["dcr", "coe"])
def test_through_a_real_server_a_groups_new_favourite_reaches_that_group_only(
    tastes, model, redis_server, tmp_path
):
    """Ratings recorded with RecordInteractions for two new items (one group's favourite,
    another group's dud) reach a real server through redis-server: the favourite lands in its
    group's lists, reaches the other groups no more than the group's own trained items do, and
    the dud stays out of its raters' group."""
    import grpc
    import redis

    from ordrec.service.storage.registry import Registry
    from ordrec.tools.process import ServerProcess
    from ordrec.trainer.models.coe import COE
    from ordrec.trainer.models.dcr import DCR
    from ordrec.v1 import recommender_pb2_grpc

    estimator = DCR(n_components=8, max_iter=30, random_state=0) if model == "dcr" else COE(random_state=0)
    Registry(tmp_path / "registry").publish(model, estimator.fit(tastes.training).to_artifact())
    redis.Redis.from_url(redis_server.url).flushall()
    fans, others = tastes.users_of(0), tastes.users_of(1) + tastes.users_of(2)
    dud_raters = tastes.users_of(1)[:RATERS]
    flags = (*redis_server.serve_flags, "--poll-interval", "0", "--fresh-interval", "0.1")
    with (
        ServerProcess(tmp_path / "registry", *flags) as server,
        grpc.insecure_channel(server.target) as channel,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        for user, value in liked_by(fans[:RATERS], seed=1).items():
            stub.RecordInteractions(
                pb.RecordInteractionsRequest(
                    user_id=user, model=model, interactions=[pb.Interaction(item_id="FAVOURITE", value=value)]
                ),
                timeout=10,
            )
        for user in dud_raters:
            stub.RecordInteractions(
                pb.RecordInteractionsRequest(
                    user_id=user, model=model, interactions=[pb.Interaction(item_id="DUD", value=1.0)]
                ),
                timeout=10,
            )
        listed = lambda: {m.name: m for m in stub.ListModels(pb.ListModelsRequest(), timeout=10).models}  # noqa: E731
        assert wait_until(lambda: listed()[model].sizes["fresh_items"] == 2, 15.0)
        held_out_fans, rest = fans[RATERS:], others[::4]
        own_items = [item for item, block in tastes.block_of.items() if block == 0]
        trained_reach = max(_reach(stub, model, item, rest) for item in own_items[:10])
        assert _reach(stub, model, "FAVOURITE", held_out_fans) >= 0.3
        assert _reach(stub, model, "FAVOURITE", rest) <= trained_reach + 0.05
        assert _reach(stub, model, "DUD", tastes.users_of(1)[RATERS:]) <= 0.05
