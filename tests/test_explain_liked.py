"""Explanations come from the items a user liked: planted histories where a disliked item is the
closest to the recommended one (the old answer named it first), through the in-process servicer."""

from __future__ import annotations

import numpy as np
import pytest

from ordrec.service.config import Limits
from ordrec.service.indices.explain import liked_history
from ordrec.service.live.seen import SeenStore
from ordrec.service.metrics import Metrics
from ordrec.service.serving.servicer import RecommenderServicer
from ordrec.service.serving.store import ModelStore
from ordrec.service.storage.artifact import Artifact
from ordrec.service.storage.registry import Registry
from ordrec.trainer.models.coe import COE
from ordrec.trainer.models.dcr import DCR
from ordrec.v1 import recommender_pb2 as pb
from tests.generated import random_ratings
from tests.servicer_fakes import NoDeadlineContext
from tests.test_item_features import coe_artifact, planted_dcr_artifact


def test_liked_history_keeps_ratings_at_or_above_the_users_mean_and_unrated_interactions():
    rows = np.arange(6)
    kept, ratings = liked_history(rows, np.array([1.0, 5.0, 3.0, 4.0, np.nan, 2.0]))  # mean 3
    assert kept.tolist() == [1, 2, 3, 4]
    assert ratings is not None and ratings[:3].tolist() == [5.0, 3.0, 4.0] and np.isnan(ratings[3])
    equal, _ = liked_history(rows[:3], np.full(3, 0.1, np.float32))  # all equal: all liked
    assert equal.tolist() == [0, 1, 2]
    everything, none = liked_history(rows, None)  # a version that kept no ratings
    assert everything.tolist() == rows.tolist() and none is None
    clicks, _ = liked_history(rows, np.full(6, np.nan))  # interactions without a rating
    assert clicks.tolist() == rows.tolist()


def _planted(kind: str) -> tuple[Artifact, str, str]:
    """An artifact whose user u0 rated 1 the history item nearest a recommended item (and the
    rest of their history 5), with that recommended item's and the disliked item's ids."""
    if kind == "dcr":
        art, history = planted_dcr_artifact(3)  # item 0 a copy of item 1, user 0's history
        ratings = np.where(history == 1, 1.0, 5.0)
        recommended, disliked = "i0", "i1"
    else:
        coords = np.random.default_rng(3).normal(size=(40, 2)) * 5
        coords[0] = coords[7] + 0.01  # item 0 sits on history item 7
        history = np.array([5, 7, 20, 30])
        art = coe_artifact(n_items=40, item_coords=coords, seen=[history] * 5)
        ratings = np.tile(np.where(history == 7, 1.0, 5.0), 5)
        recommended, disliked = "i0", "i7"
    art.arrays["seen_ratings"] = np.resize(ratings, art.arrays["seen_indices"].shape).astype(np.float32)
    return art, recommended, disliked


@pytest.mark.parametrize("kind", ["dcr", "coe"])
def test_a_disliked_item_never_explains_even_when_it_is_the_closest(kind, tmp_path):
    art, recommended, disliked = _planted(kind)
    registry = Registry(tmp_path)
    registry.publish(kind, art)
    store = ModelStore(registry, Metrics())
    store.refresh()
    handler = RecommenderServicer(store, Metrics(), Limits(), SeenStore())
    request = pb.RecommendRequest(model=kind, user_ids=["u0"], n=len(art.ids["items"]), explain=3)
    items = handler.Recommend(request, NoDeadlineContext()).results[0].items
    explained = {item.id: item.explanations for item in items}
    assert recommended in explained and explained[recommended], "the planted item is explained"
    named = [why for reasons in explained.values() for why in reasons]
    assert named and disliked not in {why.id for why in named}
    assert all(why.HasField("rating") and why.rating == 5.0 for why in named)  # the rating, on the wire


@pytest.mark.parametrize("estimator", [DCR(max_iter=2, random_state=0), COE(max_iter=2, random_state=0)])
def test_the_trainer_keeps_each_training_rating_beside_its_history_item(estimator):
    data = random_ratings(np.random.default_rng(5))
    art = estimator.fit(data).to_artifact()
    indptr, items, ratings = (art.arrays[k] for k in ("seen_indptr", "seen_indices", "seen_ratings"))
    given = {(int(u), int(i)): float(r) for u, i, r in zip(data.user, data.item, data.rating)}
    for user in range(len(data.users)):
        span = slice(indptr[user], indptr[user + 1])
        assert {(user, int(i)): float(r) for i, r in zip(items[span], ratings[span])} == {
            key: value for key, value in given.items() if key[0] == user
        }
