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

from ordrec.service.indices.models import build_index
from ordrec.service.indices.models.base import RecommenderIndex
from ordrec.service.live.fresh import FreshEvidence, FreshItems, FreshOverlay, FreshRules, similar_with_fresh
from tests.fresh_planted import PlantedTastes, planted_tastes

TOP = 10
RATERS = 30


@pytest.fixture(scope="module")
def tastes() -> PlantedTastes:
    return planted_tastes(seed=0)


@pytest.fixture(scope="module")
def indices(tastes) -> dict[str, RecommenderIndex]:
    from ordrec.trainer.models.coe import COE
    from ordrec.trainer.models.dcr import DCR

    return {
        "dcr": build_index(
            DCR(n_components=8, max_iter=30, random_state=0).fit(tastes.training).to_artifact()
        ),
        "coe": build_index(COE(random_state=0).fit(tastes.training).to_artifact()),
    }


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


def reach_of_fresh(index: RecommenderIndex, overlay: FreshOverlay, users: list[str]) -> float:
    """The share of ``users`` with the fresh item in their top ``TOP`` (their seen items excluded)."""
    hits = 0
    for user in users:
        fresh = float(index.score_factors(index.user_vector(index.users.row(user)), overlay.factors)[0])
        hits += int((unseen_scores(index, user) > fresh).sum()) < TOP
    return hits / len(users)


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
