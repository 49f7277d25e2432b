"""The EASE reference of ``reproduce topn``: the textbook scores, at the cost of the picked items."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from ordrec.trainer.data.types import Ratings
from ordrec.trainer.reproduce import topn
from tests.generated import make_ratings


def picks_of_a_share(seed: int, n_users: int, n_items: int, picked: int, per_user: int) -> Ratings:
    """Each user picks ``per_user`` of the first ``picked`` items, some of them twice (a strength
    of 2); the rest of the catalogue is never picked."""
    rng = np.random.default_rng(seed)
    user = np.repeat(np.arange(n_users), per_user)
    item = np.concatenate([rng.choice(picked, per_user, replace=False) for _ in range(n_users)])
    return make_ratings(user, item, rng.integers(1, 3, user.size), n_users, n_items)


def textbook_ease(train: Ratings, l2: float, users: np.ndarray) -> np.ndarray:
    """Steck (2019) over the whole catalogue: B = I - P / diag(P), P = (X'X + l2 I)^-1."""
    x = np.zeros((train.n_users, train.n_items))
    x[train.user, train.item] = 1.0
    p = np.linalg.inv(x.T @ x + l2 * np.eye(train.n_items))
    b = np.eye(train.n_items) - p / np.diag(p)
    return x[users] @ b


@pytest.mark.parametrize("l2", [0.5, 50.0, 1000.0])
@pytest.mark.parametrize("n_users", [30, 60])  # fewer users than picked items, and more
def test_ease_scores_equal_the_textbook_formula_with_never_picked_items(l2, n_users):
    train = picks_of_a_share(seed=int(l2), n_users=n_users, n_items=90, picked=50, per_user=8)
    users = np.arange(0, n_users, 3)
    scores = topn.ease_scores(train, l2)(users)
    assert scores.shape == (users.size, 90)
    assert np.allclose(scores, textbook_ease(train, l2, users), rtol=1e-9, atol=1e-12)
    assert not scores[:, 50:].any()  # an item nobody picked scores 0


def test_ease_never_holds_a_catalogue_square_matrix_for_items_nobody_picked():
    n_items = 3000
    train = picks_of_a_share(seed=1, n_users=40, n_items=n_items, picked=100, per_user=10)
    tracemalloc.start()
    try:
        topn.ease_scores(train, 200.0)(np.arange(40))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < n_items * n_items * 8 / 4  # a quarter of one dense float64 items x items matrix


@pytest.mark.parametrize("n_users", [30, 400])  # fewer users than picked items, and more
def test_ease_inverts_the_smaller_of_users_and_picked_items(monkeypatch, n_users):
    train = picks_of_a_share(seed=2, n_users=n_users, n_items=500, picked=100, per_user=10)
    side = min(n_users, np.unique(train.item).size)
    inverted = []
    inverse = np.linalg.inv

    def recording_inverse(a):
        inverted.append(a.shape)
        return inverse(a)

    monkeypatch.setattr(np.linalg, "inv", recording_inverse)
    topn.ease_scores(train, 100.0)
    assert inverted == [(side, side)]
