"""COE's top-N training: rated-over-unrated triples (their draws, their gradient step), the
paper's path left unchanged, and planted taste groups recovered above popularity."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from ordrec.service.indices.models.coe import COEIndex
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.evaluation.holdout import split_ratings
from ordrec.trainer.models import coe_kernels as K
from ordrec.trainer.models.coe import COE, COESolver, TripleSource, normalise
from tests.generated import make_ratings, random_ratings

PAPER = dict(unrated_share=0.0, solver=COESolver(type_a_share=None))


def source_of(data: Ratings) -> TripleSource:
    return TripleSource.build(data.user, data.item, normalise(data, "ratings"), data.n_users, data.n_items)


# ------------------------------------------------------------------ the draws
def test_unrated_draws_follow_ratings_and_popularity_power():
    """Users in proportion to their ratings (a user who rated everything never), the rated
    item uniformly among theirs, the unrated one with weight popularity ** power among
    the items the user did not rate (an item nobody rated has weight 0 for power > 0)."""
    rng = np.random.default_rng(0)
    n_users, n_items = 8, 10  # item 9 is rated by nobody
    user, item = [], []
    for u in range(n_users):
        k = n_items - 1 if u == 0 else int(rng.integers(2, 7))  # user 0 rated every rated item
        item += list(rng.choice(n_items - 1, size=k, replace=False))
        user += [u] * k
    data = make_ratings(user, item, rng.integers(1, 6, size=len(user)), n_users, n_items)
    source = source_of(data)
    rated = {(int(u), int(i)) for u, i in zip(data.user, data.item)}
    popularity = np.bincount(data.item, minlength=n_items).astype(float)
    for power in (0.5, 0.0):
        weight = popularity**power
        n = 200_000
        kind, first, second, third = source.sample(n, 0.5, 7, p_unrated=1.0, unrated_power=power)
        assert np.all(kind == 2)
        assert all((int(u), int(i)) in rated for u, i in zip(first, second))
        assert not any((int(u), int(j)) in rated for u, j in zip(first, third))
        # the exact probability of every (user, rated item, unrated item) cell
        eligible = [
            u for u in range(n_users) if any((u, j) not in rated and weight[j] > 0 for j in range(n_items))
        ]
        assert 0 not in eligible if power > 0 else 0 in eligible
        n_eligible = sum(int(np.sum(data.user == u)) for u in eligible)
        counts = {}
        for t in zip(first, second, third):
            counts[tuple(map(int, t))] = counts.get(tuple(map(int, t)), 0) + 1
        expected = {}
        for u in eligible:
            unrated = [j for j in range(n_items) if (u, j) not in rated]
            total = sum(weight[j] for j in unrated)
            for i in data.item[data.user == u]:
                for j in unrated:
                    if weight[j] > 0:
                        expected[(u, int(i), j)] = n / n_eligible * weight[j] / total
        assert set(counts) <= set(expected)
        for cell, mean in expected.items():
            assert abs(counts.get(cell, 0) - mean) < 5 * np.sqrt(mean) + 1, (power, cell)


def test_unrated_share_is_the_share_of_rated_over_unrated_draws():
    source = source_of(random_ratings(1, n_users=20, n_items=15, per_user=8))
    n = 100_000
    kind = source.sample(n, 0.5, 3, p_unrated=0.3, unrated_power=0.5)[0]
    share = np.mean(kind == 2)
    assert abs(share - 0.3) < 5 * np.sqrt(0.3 * 0.7 / n)
    assert set(np.unique(kind)) == {0, 1, 2}


# ----------------------------------------------------------- the gradient step
@pytest.mark.parametrize("func", [K.SIGMOID, K.GOMPERTZ])
def test_an_unrated_step_follows_the_finite_difference_gradient(func):
    """One user rated item 0 of two, so the only rated-over-unrated triple is <u0, i0, i1>; one
    kernel step must move x_u, y_0 and y_1 by lr * (d ln P / d point - reg * point), with the
    derivative taken by central differences of ln P(|x_u - y_1| - |x_u - y_0|)."""
    rng = np.random.default_rng(4 + func)
    data = make_ratings([0, 1], [0, 0], [5, 3], n_users=2, n_items=2)  # user 1 rated item 0 too
    source = source_of(data)
    assert source.n_type_a + source.n_type_b == 0  # one rating each: z-scores 0, no paper triple
    user_cum, seen, item_cum = source.unrated_arrays(0.0)
    dim, scale, lr, reg, h = 3, 2.0, 1e-3, 0.05, 1e-6
    for _ in range(5):
        X = rng.normal(size=(2, dim))
        Y = rng.normal(size=(2, dim))
        for user in (0, 1):
            only = np.zeros_like(user_cum)
            only[user + 1 :] = 1.0  # draw this user only
            X2, Y2 = X.copy(), Y.copy()
            unrated = (only, seen, item_cum, np.zeros(0))  # rated items drawn uniformly
            K.sga_epoch(X2, Y2, source.arrays(), 1, 0.5, func, scale, reg, lr, lr, 0, 1.0, unrated)
            for M, M2, r in ((X, X2, user), (Y, Y2, 0), (Y, Y2, 1)):
                for k in range(dim):
                    old = M[r, k]
                    M[r, k] = old + h
                    up = K.triple_log_prob(X, Y, 0, user, 0, 1, func, scale)
                    M[r, k] = old - h
                    down = K.triple_log_prob(X, Y, 0, user, 0, 1, func, scale)
                    M[r, k] = old
                    slope = (up - down) / (2 * h)
                    assert M2[r, k] - M[r, k] == pytest.approx(
                        lr * (slope - reg * M[r, k]), rel=1e-5, abs=1e-11
                    )
            other = 1 - user
            np.testing.assert_array_equal(X2[other], X[other])  # nothing else moves


# ------------------------------------------------------------- the paper's path
def test_paper_path_is_unchanged_by_the_unrated_draws():
    """With unrated_share=0 the kernel spends no random number on unrated triples: the draws
    and a fit are those of the code before them (values recorded with commit c6bafd2)."""
    data = random_ratings(5, n_users=20, n_items=15, per_user=8)
    draws = np.stack(source_of(data).sample(2000, 0.5, 3, 0.5)).astype(np.int64)
    assert (
        hashlib.sha256(draws.tobytes()).hexdigest()
        == "9ac7f5ee9b1b303f6e1beff59bee7fcc0821c38d43eb7547e8ae3a3a8cac38fb"
    )
    params = dict(
        PAPER, n_components=2, lam=4.0, max_iter=3, solver=COESolver(type_a_share=None, group_power=0.0)
    )
    model = COE(**params).fit(data)
    np.testing.assert_allclose(
        model.user_coords_[:3],
        [[0.2331986, 0.3099703], [0.3528084, -0.389975], [0.4910589, 0.205378]],
        rtol=1e-6,
        atol=1e-7,
    )
    other_power = COE(
        **dict(params, solver=COESolver(type_a_share=None, group_power=0.0, unrated_power=1.0))
    ).fit(data)
    np.testing.assert_array_equal(other_power.item_coords_, model.item_coords_)


# ------------------------------------------------------------------ estimator
def test_parameter_checks_and_degenerate_data():
    data = random_ratings(2, n_users=20, n_items=15, per_user=8)
    for bad in (dict(unrated_share=1.5), dict(unrated_share=-0.1), dict(solver={"unrated_power": -1.0})):
        with pytest.raises(ValueError, match=next(iter(bad)) if "solver" not in bad else "unrated_power"):
            COE(**bad).fit(data)
    # every user rated every item: no unrated item to draw
    full = make_ratings(np.repeat([0, 1], 3), np.tile([0, 1, 2], 2), [1, 2, 3, 3, 2, 1], 2, 3)
    with pytest.raises(ValueError, match="unrated item"):
        COE(max_iter=1).fit(full)
    COE(**PAPER, max_iter=1).fit(full)  # the paper's objective still fits it
    # all ratings tied: no paper triple, but rated-over-unrated ones exist
    ties = make_ratings([0, 0, 1], [0, 1, 1], [3, 3, 3], 2, 4)
    model = COE(max_iter=2).fit(ties)
    assert np.all(np.isfinite(model.user_coords_))
    with pytest.raises(ValueError, match="no triple"):
        COE(**PAPER, max_iter=1).fit(ties)


# ------------------------------------------------------------- planted top-N
def planted_taste_groups(seed: int, n_users=240, n_items=120, n_groups=4, per_user=20):
    """Each user belongs to a taste group (a quarter of the catalogue): three quarters of the
    items they rate come from it (rated 4-5), the rest from anywhere by popularity (rated
    1-3). Popularity is Zipf-like over the whole catalogue, so it knows no group."""
    rng = np.random.default_rng(seed)
    group_of_item = rng.permutation(np.arange(n_items) % n_groups)
    popularity = 1.0 / np.arange(1, n_items + 1) ** 0.7
    popularity = popularity[rng.permutation(n_items)]
    user, item, rating = [], [], []
    for u in range(n_users):
        own = np.flatnonzero(group_of_item == u % n_groups)
        liked = rng.choice(
            own, size=per_user * 3 // 4, replace=False, p=popularity[own] / popularity[own].sum()
        )
        rest = np.setdiff1d(np.arange(n_items), liked)
        other = rng.choice(
            rest, size=per_user - liked.size, replace=False, p=popularity[rest] / popularity[rest].sum()
        )
        item += list(liked) + list(other)
        rating += list(rng.integers(4, 6, liked.size)) + list(
            np.where(group_of_item[other] == u % n_groups, 4, rng.integers(1, 4, other.size))
        )
        user += [u] * per_user
    return make_ratings(user, item, rating, n_users, n_items)


def recall_at_10(index: COEIndex | None, popularity: np.ndarray, train: Ratings, test: Ratings) -> float:
    """Mean over users of liked held-out items (>= 4) in the top 10 served (training items excluded)."""
    recalls = []
    for u in range(train.n_users):
        liked = test.item[(test.user == u) & (test.rating >= 4)]
        if liked.size == 0:
            continue
        seen = train.item[train.user == u]
        if index is None:
            ranked = [i for i in np.argsort(-popularity, kind="stable") if i not in seen][:10]
        else:
            ranked = index.recommend(u, 10, exclude=index.seen(u))[0]
        recalls.append(np.isin(ranked, liked).sum() / min(10, liked.size))
    return float(np.mean(recalls))


def test_top_n_coe_puts_held_out_liked_items_above_popularity():
    data = planted_taste_groups(seed=3)
    train, test = split_ratings(data, 0.2, seed=0)
    popularity = np.bincount(train.item, minlength=train.n_items).astype(float)
    pop = recall_at_10(None, popularity, train, test)
    served = COEIndex.from_artifact(COE(random_state=1).fit(train).to_artifact())  # the defaults
    topn = recall_at_10(served, popularity, train, test)
    paper = COEIndex.from_artifact(COE(**PAPER, n_components=2, random_state=1).fit(train).to_artifact())
    paper_recall = recall_at_10(paper, popularity, train, test)
    assert topn > pop + 0.2, (topn, pop)
    assert topn > paper_recall, (topn, paper_recall)
