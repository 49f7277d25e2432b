"""DCR: the item-marginal initialisation and per-level early stopping on validation."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ordrec.service.indices.models.dcr import DCRIndex
from ordrec.trainer.data.types import DataError
from ordrec.trainer.models.dcr import (
    DCR,
    PAPER_PARAMS,
    DCRSolver,
    DCRVariants,
    EarlyStoppedDCR,
    PairwiseDCR,
    ValidationStopping,
    holdouts,
    rating_levels,
)
from ordrec.trainer.models.dcr_kernels import pointwise_loglik
from ordrec.trainer.models.selection import stream
from ordrec.trainer.reproduce.dcr import (
    fit_dcr,
    fixed_scorer,
    item_means,
    ndcg_at_k,
    per_user_split,
    tune,
    validation_split,
)
from tests.generated import make_ratings
from tests.test_dcr import planted

# These tests hold the paper's DCR (the estimator's defaults are the top-N model's).
PaperDCR = functools.partial(DCR, **PAPER_PARAMS)


def with_item_effects(seed=0, n_users=80, n_items=50, per_user=25):
    """Ratings driven by an item quality plus a weak personal term."""
    rng = np.random.default_rng(seed)
    quality = rng.normal(size=n_items)
    A, B = rng.normal(size=(n_users, 2)), rng.normal(size=(n_items, 2))
    user = np.repeat(np.arange(n_users), per_user)
    item = np.concatenate([rng.choice(n_items, per_user, replace=False) for _ in range(n_users)])
    x = 1.5 * quality[item] + 0.5 * np.sum(A[user] * B[item], axis=1) + 0.5 * rng.normal(size=user.size)
    rating = 1 + np.digitize(x, np.quantile(x, [0.1, 0.25, 0.55, 0.8]))
    return make_ratings(user, item, rating, n_users, n_items)


def damped_marginals(data, beta):
    levels, level = rating_levels(data.rating)
    counts = np.bincount(data.item, minlength=data.n_items).astype(float)
    out = []
    for t in range(1, levels.size):
        ge = (level >= t).astype(float)
        g = ge.mean()
        n_ge = np.bincount(data.item, weights=ge, minlength=data.n_items)
        out.append((n_ge + beta * g) / (counts + beta))
    return np.stack(out, axis=1)  # (n_items, L)


@pytest.mark.parametrize("beta", [0.0, 4.0])
@pytest.mark.parametrize("bias", [0.0, 0.5])
def test_marginal_init_starts_every_level_at_the_damped_item_marginals(beta, bias):
    data = with_item_effects(1)
    # one item nobody rated: it starts at the global marginal
    data = make_ratings(data.user, data.item, data.rating, data.n_users, data.n_items + 1)
    # float64 factors: the check is to 1e-9, below float32's resolution
    model = PaperDCR(
        n_components=5,
        max_iter=0,
        init="marginal",
        init_std=0.0,
        solver=DCRSolver(dtype="float64"),
        random_state=0,
    ).fit(data, variants=DCRVariants(init_shrinkage=beta, item_bias=bias))
    want = damped_marginals(data, beta if beta > 0 else 1e-12)
    # 2P - 1 = U.V lives in the free coordinates' ball: radius sqrt(1 - s^2) under item_bias
    radius = np.sqrt(1 - bias**2)
    want = (np.clip(2 * want - 1, -radius, radius) + 1) / 2
    p = (np.einsum("ulf,ilf->uil", model.U_, model.V_) + 1) / 2
    for u in (0, 7, data.n_users - 1):
        np.testing.assert_allclose(p[u], want, atol=1e-9)
    if bias == 0:
        assert np.allclose(p[0], damped_marginals(data, beta if beta > 0 else 1e-12), atol=1e-9)


def test_marginal_init_keeps_factors_in_the_ball():
    data = with_item_effects(2)
    for std in (0.0, 0.05, 0.3):
        model = PaperDCR(n_components=6, max_iter=0, init="marginal", init_std=std, random_state=1).fit(data)
        assert np.all(np.linalg.norm(model.U_, axis=2) <= 1 + 1e-9)
        assert np.all(np.linalg.norm(model.V_, axis=2) <= 1 + 1e-9)


def stopped_fit(data_seed: int, seed: int, epochs: int):
    """A marginal-start fit run for ``epochs`` with validation stopping that never
    gives up early; returns it, its fit part, its parameters and the validation
    labels as (users, items, levels)."""
    fit, val = validation_split(with_item_effects(data_seed), np.random.default_rng(0))
    params = dict(
        n_components=4,
        learning_rate=0.05,
        init="marginal",
        init_std=0.05,
        max_iter=epochs,
        tol=0.0,
        random_state=seed,
    )
    model = PaperDCR(**params).fit(fit, validation=val, stopping=ValidationStopping(patience=epochs))
    _, level = rating_levels(val.rating, model.levels_)
    return model, fit, val, params, (val.user.astype(np.int64), val.item.astype(np.int64), level)


def test_validation_stopping_keeps_each_levels_best_epoch():
    stopped, fit, _, params, (u, i, level) = stopped_fit(3, seed=3, epochs=25)
    # the trajectory: a fit of e epochs takes the first e steps of the longer one (same seed)
    trajectory = [PaperDCR(**dict(params, max_iter=e)).fit(fit) for e in range(26)]
    ll = np.array([pointwise_loglik(m.U_, m.V_, u, i, level) for m in trajectory])
    assert stopped.best_epochs_ == ll.argmax(axis=0).tolist()
    np.testing.assert_allclose(stopped.validation_loglik_, ll.max(axis=0))
    for t, e in enumerate(stopped.best_epochs_):
        np.testing.assert_array_equal(stopped.U_[:, t], trajectory[e].U_[:, t])
        np.testing.assert_array_equal(stopped.V_[:, t], trajectory[e].V_[:, t])


def test_patience_stops_once_no_level_improves():
    data = with_item_effects(4)
    fit, val = validation_split(data, np.random.default_rng(1))
    model = PaperDCR(
        n_components=4,
        learning_rate=0.1,
        init="marginal",
        init_std=0.05,
        max_iter=200,
        random_state=0,
    ).fit(fit, validation=val, stopping=ValidationStopping(patience=3))
    assert model.epochs_run_ < 200
    assert model.epochs_run_ == max(model.best_epochs_) + 3


def test_level_epochs_refit_takes_the_same_steps_as_the_stopped_fit():
    data = with_item_effects(5)
    fit, val = validation_split(data, np.random.default_rng(2))
    params = dict(
        n_components=4, learning_rate=0.05, init="marginal", init_std=0.05, max_iter=40, random_state=4
    )
    stopped = PaperDCR(**params).fit(fit, validation=val)
    again = PaperDCR(**params).fit(fit, variants=DCRVariants(level_epochs=stopped.best_epochs_))
    assert again.best_epochs_ == stopped.best_epochs_
    np.testing.assert_array_equal(again.U_, stopped.U_)
    np.testing.assert_array_equal(again.V_, stopped.V_)
    # the counts also travel as a string (ordrec-train train --set level_epochs=...)
    text = fit_dcr(dict(params, level_epochs=",".join(map(str, stopped.best_epochs_))), fit)
    np.testing.assert_array_equal(text.U_, stopped.U_)


def test_validation_stopping_still_learns_planted_personal_structure():
    # No item effect: the marginal start ranks no better than chance, so the
    # stopped fit has to train the levels to recover the planted order.
    data = planted(1)
    rng = np.random.default_rng(0)
    train, test = per_user_split(data, 30, rng)
    fit, val = validation_split(train, np.random.default_rng(1))
    params = dict(
        n_components=8, learning_rate=0.05, init="marginal", init_std=0.05, max_iter=60, random_state=0
    )
    stopped = PaperDCR(**params).fit(fit, validation=val)
    assert min(stopped.best_epochs_) > 0
    model = fit_dcr(dict(params, level_epochs=stopped.best_epochs_), train)
    dcr = ndcg_at_k(DCRIndex.from_artifact(model.to_artifact()).score_items, test)
    mean = ndcg_at_k(fixed_scorer(item_means(train, 5.0)), test)
    assert dcr > mean + 0.05, (dcr, mean)


def test_tune_with_validation_stopping_returns_level_epochs():
    data = with_item_effects(6)
    base = dict(n_components=3, max_iter=15, init="marginal", init_std=0.05, random_state=0)
    best, pair = tune(
        data,
        np.random.default_rng(0),
        base,
        {"learning_rate": (0.05, 0.02)},
        {"pairwise_learning_rate": (0.01,)},
        lambda msg: None,
        stop="validation",
    )
    assert best["learning_rate"] in (0.05, 0.02) and len(best["level_epochs"]) == 4
    assert pair == {"pairwise_learning_rate": 0.01}


@pytest.mark.parametrize(
    "bad",
    [
        dict(init="zeros"),
        dict(patience=0),
        dict(level_epochs=[1, -1, 2, 3]),
        dict(init_shrinkage=-1.0),
        dict(val_tol=-0.1),
    ],
)
def test_bad_init_and_stopping_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        fit_dcr(bad, with_item_effects(0, n_users=10, n_items=8, per_user=5))  # parameters or variants


def test_early_stopping_is_the_median_of_the_held_out_stops_then_a_refit_on_everything():
    data = planted(1)
    params = dict(
        n_components=8,
        learning_rate=0.05,
        init="marginal",
        init_std=0.05,
        max_iter=40,
        random_state=3,
    )
    rule = ValidationStopping(patience=3)
    stopped = EarlyStoppedDCR(PairwiseDCR(PaperDCR(**params), max_iter=2), folds=3, stopping=rule)
    model = stopped.fit(data).best_estimator_
    # by hand: the same hold-outs (early stopping's own stream), each level's median stop, the refit
    stops = [
        PaperDCR(**params).fit(fit, validation=val, stopping=ValidationStopping(patience=3)).best_epochs_
        for fit, val in holdouts(data, stream(3, "early_stopping"), 3)
    ]
    want = [int(e) for e in np.median(np.array(stops), axis=0).round()]
    assert stopped.chosen_level_epochs_ == want == model.best_epochs_
    metrics = model.to_artifact().metrics
    assert [metrics[f"epochs_level_{t}"] for t in (2, 3, 4, 5)] == want
    assert len({tuple(s) for s in stops}) > 1  # the folds disagree, so the median matters
    by_hand = fit_dcr(dict(params, level_epochs=want, pairwise=True, pairwise_max_iter=2), data)
    np.testing.assert_array_equal(model.U_, by_hand.U_)
    np.testing.assert_array_equal(model.V_, by_hand.V_)
    # given counts take precedence
    given = EarlyStoppedDCR(PaperDCR(**params)).fit(data, variants=DCRVariants(level_epochs=[1, 1, 1, 1]))
    assert given.chosen_level_epochs_ is None and given.best_estimator_.best_epochs_ == [1, 1, 1, 1]
    # a rating value only one rating has, likely held out by some fold: the folds still fit every level
    rng = np.random.default_rng(0)
    user, item = np.repeat(np.arange(30), 6), np.tile(np.arange(6), 30)
    rating = rng.integers(2, 5, user.size)
    rating[0] = 5
    rare = EarlyStoppedDCR(PaperDCR(n_components=2, max_iter=3, random_state=0)).fit(
        make_ratings(user, item, rating)
    )
    assert len(rare.chosen_level_epochs_) == 3
    with pytest.raises(DataError, match="early_stopping holds out at least 2 ratings per user"):
        EarlyStoppedDCR(PaperDCR(n_components=2)).fit(
            make_ratings([0, 0, 1, 1, 2], [0, 1, 1, 2, 0], [5, 3, 4, 2, 1])
        )


@pytest.mark.parametrize(
    "bad,name",
    [
        (lambda: dict(folds=0), "folds"),
        (lambda: dict(fraction=1.0), "fraction"),
        (lambda: dict(stopping=ValidationStopping(patience=0)), "patience"),
        (lambda: dict(stopping=ValidationStopping(tol=-1.0)), "tol"),
        (lambda: dict(stopping=5), "stopping"),
    ],
)
def test_early_stopped_dcr_refuses_bad_settings_by_name(bad, name):
    with pytest.raises(ValueError, match=repr(name)):
        EarlyStoppedDCR(PaperDCR(n_components=2), **bad()).fit(
            with_item_effects(0, n_users=10, n_items=8, per_user=5)
        )


def test_level_epochs_of_the_wrong_length_or_with_validation_are_refused():
    data = with_item_effects(7)
    fit, val = validation_split(data, np.random.default_rng(0))
    with pytest.raises(ValueError, match="one count per learned level"):
        fit_dcr(dict(n_components=3, level_epochs=[1, 2]), fit)
    with pytest.raises(ValueError, match="not both"):
        fit_dcr(dict(n_components=3, level_epochs=[1, 2, 3, 4]), fit, val)


def _stopping_rule(history, val_tol, patience):
    """The rule written out over a recorded per-level validation history."""
    best, epochs = history[0].copy(), [0] * history.shape[1]
    for e in range(1, len(history)):
        for t in range(history.shape[1]):
            if history[e, t] > best[t] + val_tol * abs(best[t]):
                best[t], epochs[t] = history[e, t], e
        if all(e - b >= patience for b in epochs):
            return epochs, e
    return epochs, len(history) - 1


def test_validation_history_is_the_trajectorys_loglik_and_val_tol_applies_the_rule():
    full, fit, val, params, (u, i, level) = stopped_fit(8, seed=5, epochs=30)
    for e in (0, 7, 30):
        np.testing.assert_allclose(
            full.validation_history_[e],
            pointwise_loglik(
                *(lambda m: (m.U_, m.V_))(PaperDCR(**dict(params, max_iter=e)).fit(fit)), u, i, level
            ),
        )
    for val_tol in (0.0, 0.002, 0.02):
        rule = ValidationStopping(patience=3, tol=val_tol)
        model = PaperDCR(**params).fit(fit, validation=val, stopping=rule)
        epochs, stop = _stopping_rule(full.validation_history_, val_tol, 3)
        assert model.best_epochs_ == epochs
        assert model.epochs_run_ == stop
    # a tolerance nothing can clear keeps every level at its start
    none = PaperDCR(**params).fit(fit, validation=val, stopping=ValidationStopping(patience=2, tol=10.0))
    assert none.best_epochs_ == [0, 0, 0, 0] and none.epochs_run_ == 2


# ------------------------------------------------------------ the default start on sparse items
def grouped_sparse(groups=10, users_per=100, items_per=1000, per_user=20, seed=0):
    """Users and items in groups (a group's users rate only its items), every item rated twice,
    ratings drawn at random: which items a user picked is the only signal. Also each item's group."""
    rng = np.random.default_rng(seed)
    times = users_per * per_user // items_per
    user = np.concatenate([g * users_per + np.repeat(np.arange(users_per), per_user) for g in range(groups)])
    item = np.concatenate(
        [
            g * items_per + np.concatenate([rng.permutation(items_per) for _ in range(times)])
            for g in range(groups)
        ]
    )
    rating = rng.integers(1, 6, size=user.size).astype(np.float64)
    data = make_ratings(user, item, rating, groups * users_per, groups * items_per)
    return data, np.repeat(np.arange(groups), items_per)


def own_group_share(model: DCR, group: np.ndarray) -> float:
    """Share of items whose factors are nearest (inner product) their own group's mean."""
    V = model.V_.reshape(model.V_.shape[0], -1)
    means = np.stack([V[group == g].mean(axis=0) for g in range(int(group.max()) + 1)])
    return float(np.mean((V @ means.T).argmax(axis=1) == group))


def test_items_rated_twice_end_near_their_raters_from_the_default_start():
    data, group = grouped_sparse()
    default = own_group_share(DCR(n_components=8).fit(data), group)
    large_start = own_group_share(DCR(n_components=8, init_std=0.1).fit(data), group)
    # Two ratings move an item little: from a large start it keeps much of its random draw.
    assert default > 0.8 and default > large_start + 0.15, (default, large_start)
