"""DCR / Pairwise DCR trainer: gradients, projection, planted structure, scales, round trip."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ordrec.service.indices.models.dcr import DCRIndex, level_weights
from ordrec.service.storage.registry import Registry
from ordrec.trainer.data.types import DataError
from ordrec.trainer.evaluation.metrics import ndcg_at_k
from ordrec.trainer.models import estimator_class
from ordrec.trainer.models.dcr import (
    DCR,
    PAPER_PARAMS,
    DCRSolver,
    DCRVariants,
    PairwiseDCR,
    ValidatedRefinement,
    lazy_zeros,
    rating_levels,
    user_csr,
)
from ordrec.trainer.models.dcr_kernels import (
    pairwise_epoch_by_user,
    pairwise_loss,
    pairwise_step,
    pointwise_epoch,
    pointwise_epoch_by_user,
    pointwise_objective,
    pointwise_step,
    project,
    shuffle_segments,
)
from ordrec.trainer.reproduce.dcr import fit_dcr, fixed_scorer, item_means, per_user_split
from tests.generated import make_ratings

# These tests hold the paper's DCR (the estimator's defaults are the top-N model's).
PaperDCR = functools.partial(DCR, **PAPER_PARAMS)


def planted(seed=0, n_users=120, n_items=80, per_user=40, rank=3, values=(1, 2, 3, 4, 5)):
    """Ratings from a low-rank latent preference cut at quantiles into ordered levels.

    Item effects are absent, so an item's mean rating carries (almost) no
    information about one user's order: only personal structure ranks well.
    """
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(n_users, rank))
    B = rng.normal(size=(n_items, rank))
    latent = A @ B.T
    user = np.repeat(np.arange(n_users), per_user)
    item = np.concatenate([rng.choice(n_items, per_user, replace=False) for _ in range(n_users)])
    x = latent[user, item] + 0.1 * rng.normal(size=user.size)
    cuts = np.quantile(x, np.linspace(0, 1, len(values) + 1)[1:-1])
    rating = np.asarray(values, dtype=np.float64)[np.digitize(x, cuts)]
    return make_ratings(user, item, rating, n_users, n_items)


# ------------------------------------------------------------ gradients
def numeric_grad(fn, x, eps=1e-6):
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        hi = fn()
        x[idx] = old - eps
        lo = fn()
        x[idx] = old
        g[idx] = (hi - lo) / (2 * eps)
    return g


@pytest.mark.parametrize("label", [0, 1])
@pytest.mark.parametrize("seed", range(3))
def test_pointwise_step_is_the_objective_gradient(label, seed):
    rng = np.random.default_rng(seed)
    u = rng.normal(size=6) * 0.3
    v = rng.normal(size=6) * 0.3
    reg = 0.05
    gu = numeric_grad(lambda: pointwise_objective(u, v, label, reg), u)
    gv = numeric_grad(lambda: pointwise_objective(u, v, label, reg), v)
    u2, v2 = u.copy(), v.copy()
    lr = 1e-3
    pointwise_step(u2, v2, label, lr, reg, 1e-9, 0)  # floor far below P: the exact gradient
    np.testing.assert_allclose((u2 - u) / lr, gu, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose((v2 - v) / lr, gv, rtol=1e-5, atol=1e-7)


def test_pointwise_step_floor_keeps_steps_finite_and_pushes_toward_the_label():
    u = np.array([1.0, 0.0])
    v = np.array([-1.0, 0.0])  # P(r >= t) = 0 exactly: log P = -inf
    p_before = 0.5 * (u @ v + 1)
    pointwise_step(u, v, 1, 1e-3, 0.0, 1e-3, 0)
    assert np.all(np.isfinite(u)) and np.all(np.isfinite(v))
    assert 0.5 * (u @ v + 1) > p_before


def test_pointwise_step_keeps_frozen_user_coordinates():
    u = np.array([0.7, 0.1, -0.2])
    v = np.array([0.3, 0.2, 0.1])
    pointwise_step(u, v, 1, 0.1, 0.01, 1e-3, 1)
    assert u[0] == 0.7


@pytest.mark.parametrize("seed", range(3))
def test_pairwise_step_is_the_loss_gradient(seed):
    rng = np.random.default_rng(seed)
    L, f = 4, 5
    u, vi, vj = (rng.normal(size=(L, f)) * 0.4 for _ in range(3))
    c = level_weights(np.arange(1, L + 2, dtype=float), "linear")[0]
    lam = 0.01
    loss = lambda: pairwise_loss(u, vi, vj, c, lam)  # noqa: E731
    grads = [numeric_grad(loss, x) for x in (u, vi, vj)]
    moved = [x.copy() for x in (u, vi, vj)]
    lr = 1e-3
    reported = pairwise_step(moved[0], moved[1], moved[2], c, lr, lam, 0)
    assert reported == pytest.approx(loss())
    for before, after, g in zip((u, vi, vj), moved, grads):
        np.testing.assert_allclose((before - after) / lr, g, rtol=1e-5, atol=1e-7)


def test_pairwise_loss_is_stable_for_large_margins():
    L, f = 2, 2
    u = np.full((L, f), 1.0)
    vi = np.full((L, f), 400.0)
    vj = -vi
    c = np.array([0.5, 0.5])
    assert np.isfinite(pairwise_loss(u, vi, vj, c, 0.0))
    assert np.isfinite(pairwise_loss(u, vj, vi, c, 0.0))


@settings(deadline=None)  # the first example may include numba's compilation
@given(st.lists(st.floats(-10, 10), min_size=1, max_size=8), st.floats(0.1, 2.0))
def test_project_ball_is_the_euclidean_projection(values, radius):
    x = np.array(values)
    y = x.copy()
    project(y, 0, radius, False)
    norm = np.linalg.norm(x)
    if norm <= radius:
        np.testing.assert_array_equal(y, x)
    else:
        assert np.linalg.norm(y) == pytest.approx(radius)
        np.testing.assert_allclose(y * norm / radius, x, rtol=1e-9, atol=1e-12)


@settings(deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.floats(0.05, 3.0),
    st.sampled_from([0, 1]),
    st.booleans(),
    st.sampled_from([0, 1]),
)
def test_projecting_step_is_the_bare_step_then_the_projection(seed, scale, u_fixed, sphere, label):
    """The epochs' fused step (norms from inner products, projection in the
    update pass) equals the gradient step followed by an explicit projection."""
    rng = np.random.default_rng(seed)
    u, v = rng.normal(size=7) * scale / np.sqrt(7), rng.normal(size=7) * scale / np.sqrt(7)
    radius = 0.8 if u_fixed else 1.0
    bare_u, bare_v, fused_u, fused_v = u.copy(), v.copy(), u.copy(), v.copy()
    q1, nu1, nv1 = pointwise_step(bare_u, bare_v, label, 0.3, 0.01, 1e-3, u_fixed)
    assert nu1 == pytest.approx(np.sum(bare_u[u_fixed:] ** 2), rel=1e-9, abs=1e-12)
    assert nv1 == pytest.approx(np.sum(bare_v**2), rel=1e-9, abs=1e-12)
    project(bare_u, u_fixed, radius, sphere)
    project(bare_v, 0, 1.0, sphere)
    q2, nu2, nv2 = pointwise_step(fused_u, fused_v, label, 0.3, 0.01, 1e-3, u_fixed, radius, sphere)
    assert (q2, nu2, nv2) == pytest.approx((q1, nu1, nv1), rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(fused_u, bare_u, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fused_v, bare_v, rtol=1e-9, atol=1e-12)
    assert fused_u[:u_fixed].tolist() == u[:u_fixed].tolist()


@settings(deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(0.05, 3.0), st.sampled_from([0, 1]), st.booleans())
def test_projecting_pairwise_step_is_the_bare_step_then_the_projection(seed, scale, u_fixed, sphere):
    rng = np.random.default_rng(seed)
    L, f = 3, 6
    u, vi, vj = (rng.normal(size=(L, f)) * scale / np.sqrt(f) for _ in range(3))
    c = level_weights(np.arange(1, L + 2, dtype=float), "linear")[0]
    radius = 0.8 if u_fixed else 1.0
    bare = [x.copy() for x in (u, vi, vj)]
    fused = [x.copy() for x in (u, vi, vj)]
    loss_bare = pairwise_step(*bare, c, 0.5, 0.01, u_fixed)
    for t in range(L):
        project(bare[0][t], u_fixed, radius, sphere)
        project(bare[1][t], 0, 1.0, sphere)
        project(bare[2][t], 0, 1.0, sphere)
    loss_fused = pairwise_step(*fused, c, 0.5, 0.01, u_fixed, radius, sphere)
    assert loss_fused == pytest.approx(loss_bare, rel=1e-12)
    for want, got in zip(bare, fused):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert fused[0][:, :u_fixed].tolist() == u[:, :u_fixed].tolist()


def test_epoch_trains_only_the_levels_it_is_given():
    rng = np.random.default_rng(3)
    n_users, n_items, L, f = 10, 8, 4, 5
    user, item = rng.integers(0, n_users, 60), rng.integers(0, n_items, 60)
    indptr, items, levels = user_csr(n_users, user, item, rng.integers(0, L + 1, 60).astype(np.int32))
    U0, V0 = rng.normal(0, 0.3, (n_users, L, f)), rng.normal(0, 0.3, (n_items, L, f))
    order = rng.permutation(np.flatnonzero(np.diff(indptr) > 0))
    args = (0.1, 0.01, 1e-3, 0, 1.0, False)
    U_all, V_all, U_some, V_some = U0.copy(), V0.copy(), U0.copy(), V0.copy()
    ll_all, _ = pointwise_epoch_by_user(U_all, V_all, indptr, items, levels, order, *args, np.arange(L))
    ll_some, _ = pointwise_epoch_by_user(
        U_some, V_some, indptr, items, levels, order, *args, np.array([1, 3])
    )
    for t in (1, 3):
        np.testing.assert_array_equal(U_some[:, t], U_all[:, t])
        np.testing.assert_array_equal(V_some[:, t], V_all[:, t])
        assert ll_some[t] == ll_all[t]
    for t in (0, 2):
        np.testing.assert_array_equal(U_some[:, t], U0[:, t])
        np.testing.assert_array_equal(V_some[:, t], V0[:, t])
        assert ll_some[t] == 0.0


def test_float32_training_follows_the_float64_fit():
    """float32 factors (the default) change rounding, not the fit."""
    data = planted(2)
    params = dict(n_components=6, learning_rate=0.05, max_iter=15, tol=0.0, random_state=1)
    single, double = (
        PaperDCR(**params).fit(data),
        PaperDCR(solver=DCRSolver(dtype="float64"), **params).fit(data),
    )
    assert single.U_.dtype == np.float32 and double.U_.dtype == np.float64
    np.testing.assert_allclose(single.U_, double.U_, atol=1e-4)
    np.testing.assert_allclose(single.V_, double.V_, atol=1e-4)
    assert single.loglik_ == pytest.approx(double.loglik_, rel=1e-4)


def test_lazy_zeros_are_writable_zeros():
    x = lazy_zeros((5, 3, 2), np.float32)
    assert x.shape == (5, 3, 2) and x.dtype == np.float32 and not x.any()
    x[2, 1] = 1.5
    assert x.sum() == 3.0
    assert lazy_zeros((0, 4), np.float64).shape == (0, 4)


# ------------------------------------------------------------ training
@settings(max_examples=6, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from([0.0, 0.6]),
    st.sampled_from(["ball", "sphere"]),
    st.sampled_from(["float32", "float64"]),
)
@example(
    seed=178, bias=0.6, projection="sphere", dtype="float32"
)  # |U| = 1 + 10 float32 eps, found by hypothesis
def test_factors_stay_in_the_unit_ball(seed, bias, projection, dtype):
    data = planted(seed, n_users=20, n_items=15, per_user=8)
    pointwise = PaperDCR(
        n_components=4, max_iter=3, learning_rate=0.5, random_state=seed, solver=DCRSolver(dtype=dtype)
    )
    variants = DCRVariants(item_bias=bias, projection=projection)
    model = PairwiseDCR(pointwise, max_iter=2, learning_rate=0.5).fit(data, variants=variants).best_estimator_
    # The steps rescale by a norm predicted from float32 inner products, whose terms cancel when the
    # step is large: up to 43 float32 eps (5.1e-6) over 800 fits of this test's settings. An
    # unprojected step leaves by about 3 % (|u'|^2 = c^2 + 2cb u.v + b^2, b = lr g >= 0.25).
    rounding = 1e-4 if dtype == "float32" else 1e-9
    assert np.all(np.linalg.norm(model.U_, axis=2) <= 1 + rounding)
    assert np.all(np.linalg.norm(model.V_, axis=2) <= 1 + rounding)
    if bias:
        assert np.all(model.U_[:, :, 0] == bias)


@pytest.mark.parametrize("order", ["user", "random"])
def test_planted_low_rank_order_is_recovered(order):
    data = planted(1)
    rng = np.random.default_rng(0)
    train, test = per_user_split(data, 30, rng)
    model = PaperDCR(n_components=8, max_iter=60, learning_rate=0.05, random_state=0).fit(
        train, variants=DCRVariants(order=order)
    )
    index = DCRIndex.from_artifact(model.to_artifact())
    dcr = ndcg_at_k(index.score_items, test)
    random = ndcg_at_k(fixed_scorer(rng.random(data.n_items)), test)
    mean = ndcg_at_k(fixed_scorer(item_means(train, 5.0)), test)
    # the planted order is personal: DCR must beat both non-personal rankings clearly
    assert dcr > mean + 0.05 and dcr > random + 0.05, (dcr, mean, random)
    # and its scores must correlate with the planted preference on held-out pairs
    A_order = []
    for u in range(data.n_users):
        rows = test.item[test.user == u]
        if rows.size > 2:
            r = test.rating[test.user == u]
            s = index.score_items(u, rows.astype(np.int64))
            A_order.append(np.corrcoef(np.argsort(np.argsort(r)), np.argsort(np.argsort(s)))[0, 1])
    assert np.nanmean(A_order) > 0.3


@pytest.mark.parametrize("order", ["user", "random"])
def test_pairwise_refinement_lowers_the_pairwise_loss_on_training_pairs(order):
    data = planted(2, n_users=60, n_items=40, per_user=20)
    model = PaperDCR(n_components=6, max_iter=10, learning_rate=0.05, random_state=3).fit(
        data, variants=DCRVariants(order=order)
    )

    def mean_pair_loss(m):
        c, _ = level_weights(m.levels_, m.relevance)
        total, count = 0.0, 0
        for u in range(data.n_users):
            lo, hi = m.seen_indptr_[u], m.seen_indptr_[u + 1]
            its, lv = m.seen_indices_[lo:hi], m.seen_levels_[lo:hi]
            for a in range(its.size):
                for b in range(its.size):
                    if lv[a] > lv[b]:
                        total += pairwise_loss(m.U_[u], m.V_[its[a]], m.V_[its[b]], c, 0.0)
                        count += 1
        return total / count

    refined = PairwiseDCR(model, max_iter=10, learning_rate=0.05, reg=0.0).refined(model)
    assert mean_pair_loss(refined) < mean_pair_loss(model) - 0.01
    # the DCR fit it started from is untouched
    assert not np.shares_memory(refined.U_, model.U_)


def test_pairwise_by_user_draws_each_users_share_of_pairs():
    """With every user's ratings on distinct levels no draw fails: a user with
    n_u >= 2 ratings gets exactly round(pairs_per_rating * n_u) steps."""
    n_u = np.array([2, 3, 4, 1, 5])
    indptr = np.concatenate([[0], np.cumsum(n_u)]).astype(np.int64)
    items = np.arange(indptr[-1], dtype=np.int64)
    levels = np.concatenate([np.arange(k) for k in n_u]).astype(np.int32)
    rng = np.random.default_rng(0)
    U, V = rng.normal(0, 0.3, (5, 2, 3)), rng.normal(0, 0.3, (items.size, 2, 3))
    c = np.array([0.5, 0.5])
    U3 = U[3].copy()
    _, taken = pairwise_epoch_by_user(
        U, V, indptr, items, levels, c, np.array([4, 0, 2, 1]), 2.0, 0.05, 0.0, 0, 1.0, False, 1
    )
    assert taken == 2 * (2 + 3 + 4 + 5)
    np.testing.assert_array_equal(U[3], U3)  # not in the order (and one rating): untouched
    assert np.all(np.linalg.norm(U, axis=2) <= 1 + 1e-12) and np.all(np.linalg.norm(V, axis=2) <= 1 + 1e-12)


def test_same_seed_same_model_other_seed_other_model():
    data = planted(3, n_users=30, n_items=20, per_user=10)
    a = (
        PairwiseDCR(PaperDCR(n_components=4, max_iter=3, random_state=5), max_iter=2)
        .fit(data)
        .best_estimator_
    )
    b = (
        PairwiseDCR(PaperDCR(n_components=4, max_iter=3, random_state=5), max_iter=2)
        .fit(data)
        .best_estimator_
    )
    c = PaperDCR(n_components=4, max_iter=3, random_state=6).fit(data)
    np.testing.assert_array_equal(a.U_, b.U_)
    np.testing.assert_array_equal(a.V_, b.V_)
    assert not np.array_equal(a.U_[:, :, :], c.U_)


@pytest.mark.parametrize("order", ["user", "random"])
def test_divergence_is_reported_with_the_epoch(order):
    data = planted(4, n_users=10, n_items=10, per_user=5)
    with pytest.raises(FloatingPointError, match="epoch 0"):
        # finite but absurd: lr * reg overflows, the projection turns inf into NaN
        PaperDCR(n_components=2, max_iter=2, learning_rate=1e300, reg=1e300).fit(
            data, variants=DCRVariants(order=order)
        )


# ------------------------------------------------------------ rating order, stopping rule
@pytest.mark.parametrize("u_fixed,radius,sphere", [(0, 1.0, False), (1, 0.7, False), (0, 1.0, True)])
def test_user_grouped_epoch_takes_the_steps_of_the_same_global_order(u_fixed, radius, sphere):
    """The grouped kernel is the plain epoch in another order, not another algorithm."""
    rng = np.random.default_rng(0)
    n_users, n_items, L, f = 12, 9, 3, 5
    user = rng.integers(0, n_users, 80)
    item = rng.integers(0, n_items, 80)
    level = rng.integers(0, L + 1, 80).astype(np.int32)
    indptr, items, levels = user_csr(n_users, user, item, level)
    owner = np.repeat(np.arange(n_users), np.diff(indptr))
    user_order = rng.permutation(np.flatnonzero(np.diff(indptr) > 0))
    global_order = np.concatenate([np.arange(indptr[u], indptr[u + 1]) for u in user_order]).astype(np.int64)
    U0, V0 = rng.normal(0, 0.4, (n_users, L, f)), rng.normal(0, 0.4, (n_items, L, f))
    U1, V1, U2, V2 = U0.copy(), V0.copy(), U0.copy(), V0.copy()
    args = (0.1, 0.01, 1e-3, u_fixed, radius, sphere, np.arange(L))
    ll1 = pointwise_epoch(U1, V1, owner, items, levels, global_order, *args)
    ll2, norms = pointwise_epoch_by_user(U2, V2, indptr, items, levels, user_order, *args)
    np.testing.assert_allclose(U2, U1, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(V2, V1, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ll2, ll1, rtol=1e-12)
    assert np.all(np.isfinite(norms)) and np.all(norms > 0)
    assert not np.allclose(U2, U0)


def test_shuffle_segments_permutes_within_each_user_only():
    rng = np.random.default_rng(1)
    indptr = np.array([0, 5, 5, 12, 13, 30], dtype=np.int64)
    items = rng.integers(0, 50, 30).astype(np.int64)
    levels = rng.integers(0, 5, 30).astype(np.int32)
    a_items, a_levels = items.copy(), levels.copy()
    shuffle_segments(indptr, a_items, a_levels, 7)
    for lo, hi in zip(indptr[:-1], indptr[1:]):
        before = sorted(zip(items[lo:hi], levels[lo:hi]))
        after = sorted(zip(a_items[lo:hi], a_levels[lo:hi]))
        assert before == after  # same (item, level) pairs in every segment
    assert not np.array_equal(a_items, items)
    b_items, b_levels = items.copy(), levels.copy()
    shuffle_segments(indptr, b_items, b_levels, 7)
    np.testing.assert_array_equal(a_items, b_items)


def test_stopping_rule_stops_at_the_first_small_gain():
    data = planted(5, n_users=60, n_items=40, per_user=20)
    full = PaperDCR(n_components=4, max_iter=80, tol=0.0, random_state=2).fit(data)
    assert full.epochs_run_ == 80 and len(full.loglik_history_) == 80
    tol = 0.01
    early = PaperDCR(n_components=4, max_iter=80, tol=tol, random_state=2).fit(data)
    h = np.asarray(early.loglik_history_)
    assert 2 <= early.epochs_run_ < 80 and h.size == early.epochs_run_
    gains = np.diff(h) / np.abs(h[1:])
    assert gains[-1] < tol and np.all(gains[:-1] >= tol)
    # the same seed takes the same steps until the stop
    np.testing.assert_allclose(h, full.loglik_history_[: h.size])
    assert early.to_artifact().metrics["epochs_run"] == early.epochs_run_


def test_users_and_items_without_training_ratings_are_served_at_one_half():
    data = make_ratings([0, 0, 1, 1, 2], [0, 1, 1, 2, 0], [1, 5, 4, 2, 3], n_users=5, n_items=4)
    model = PaperDCR(n_components=3, max_iter=5, random_state=0).fit(data)
    assert np.all(model.U_[3:] == 0) and np.all(model.V_[3] == 0)
    assert np.any(model.U_[:3] != 0)


@pytest.mark.parametrize(
    "bad",
    [
        dict(relevance="cubic"),
        dict(n_components=0),
        dict(item_bias=1.0),
        dict(learning_rate=float("nan")),
        dict(projection="cube"),
        dict(patience=0),
        dict(order="zigzag"),
        dict(tol=-1.0),
        dict(dtype="float16"),
        dict(pairwise=True, pairwise_max_iter=-1),
    ],
)
def test_bad_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        fit_dcr(bad, planted(0, n_users=5, n_items=5, per_user=3))  # DCR parameters or variants


# ------------------------------------------------------------ rating scales
def test_half_star_scale_maps_to_ten_ordered_levels():
    values = np.arange(1, 11) * 0.5
    levels, index = rating_levels(np.array([0.5, 5.0, 2.5, 3.0]), values)
    assert levels.tolist() == values.tolist()
    assert index.tolist() == [0, 9, 4, 5]
    data = planted(5, n_users=40, n_items=30, per_user=15, values=tuple(values))
    model = PaperDCR(n_components=4, max_iter=5, random_state=0).fit(data)
    assert model.levels_.tolist() == values.tolist()
    index = DCRIndex.from_artifact(model.to_artifact())
    items = np.arange(data.n_items)
    dist = index.distribution(0, items)
    assert dist.shape == (data.n_items, 10)
    scores = index.score_items(0, items)
    assert np.all(scores >= 0.5 - 1e-5) and np.all(scores <= 5.0 + 1e-5)
    # Eq. 2 = Eq. 4: SC is the expectation of f(r) under the *unclipped* Eq. 3 differences
    p_ge = index.level_probabilities(0, items)
    full = np.concatenate([np.ones((items.size, 1)), p_ge, np.zeros((items.size, 1))], axis=1)
    np.testing.assert_allclose(scores, (full[:, :-1] - full[:, 1:]) @ values, rtol=1e-5)


def test_explicit_levels_keep_unused_values_and_reject_strangers():
    levels, index = rating_levels(np.array([2.0, 3.0]), "1,2,3,4")
    assert levels.tolist() == [1, 2, 3, 4] and index.tolist() == [1, 2]
    with pytest.raises(DataError, match="not one of the levels"):
        rating_levels(np.array([2.0, 3.5]), [1, 2, 3, 4])
    with pytest.raises(DataError, match="two distinct"):
        rating_levels(np.array([4.0, 4.0]))


# ------------------------------------------------------------ artifact
def test_registry_round_trip_serves_the_same_scores(tmp_path):
    data = planted(6, n_users=30, n_items=25, per_user=10)
    model = PairwiseDCR(estimator_class("dcr")(n_components=3, max_iter=4, random_state=1), max_iter=2)
    model.fit(data)
    artifact = model.to_artifact(item_shrinkage=3.0)
    registry = Registry(tmp_path)
    registry.publish("pairwise_dcr", artifact)
    loaded = registry.load("pairwise_dcr")
    a, b = DCRIndex.from_artifact(artifact), DCRIndex.from_artifact(loaded)
    b.smoke()
    users = np.arange(data.n_users)
    np.testing.assert_array_equal(a.score_users(users), b.score_users(users))
    # the default (top-N) model scores "not rated" as the level below the lowest rating
    assert loaded.attributes["levels"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert loaded.attributes["unrated_level"] is True and b.rating_levels.tolist() == [1, 2, 3, 4, 5]
    assert loaded.attributes["relevance"] == "linear"
    assert loaded.attributes["pairwise"] is True
    # seen items are each user's training items
    for u in range(data.n_users):
        assert set(b.seen(u).tolist()) == set(data.item[data.user == u].tolist())


def test_item_shrinkage_scales_rare_items_toward_one_half():
    data = make_ratings([0, 0, 1, 1, 2], [0, 1, 0, 1, 1], [5, 1, 4, 2, 5], 3, 3)
    model = PaperDCR(n_components=2, max_iter=5, random_state=0).fit(data)
    plain = model.to_artifact().arrays["item_factors"]
    shrunk = model.to_artifact(item_shrinkage=2.0).arrays["item_factors"]
    counts = np.array([2, 3, 0])
    np.testing.assert_allclose(shrunk, plain * (counts / (counts + 2.0))[:, None], rtol=1e-6)
    assert np.all(plain[2] == 0)  # an item without training ratings carries no evidence


@pytest.mark.parametrize(
    "serving,name",
    [
        (dict(item_shrinkage=-1.0), "item_shrinkage"),
        (dict(ann_min_items=0), "ann_min_items"),
        (dict(ann_params="hnsw"), "ann_params"),
        (dict(ann_params={"efSearch": 3}), "efSearch"),
    ],
)
def test_bad_serving_choices_are_refused_by_name(serving, name):
    model = PaperDCR(n_components=2, max_iter=1).fit(planted(0, n_users=5, n_items=5, per_user=3))
    with pytest.raises(ValueError, match=name):
        model.to_artifact(**serving)


POINTWISE = dict(n_components=6, max_iter=30, learning_rate=0.05, random_state=0)


def test_a_refinement_that_hurts_on_validation_is_dropped():
    """A refinement forced far off (a huge step and penalty) loses on the hold-outs: the
    fit keeps the pointwise factors, exactly those of the same fit without refinement."""
    data = planted(4, n_users=80, n_items=50, per_user=24)
    hurt = dict(learning_rate=50.0, reg=5.0, max_iter=5)
    validated = ValidatedRefinement(PairwiseDCR(PaperDCR(**POINTWISE), **hurt)).fit(data)
    model = validated.best_estimator_
    assert validated.kept_ is False
    point, pair, se = validated.val_scores_
    assert pair < point
    plain = PaperDCR(**POINTWISE).fit(data)
    np.testing.assert_array_equal(model.U_, plain.U_)
    np.testing.assert_array_equal(model.V_, plain.V_)
    artifact = validated.to_artifact()
    assert artifact.metrics["pairwise_kept"] == 0.0 and "train_pairwise_loss" not in artifact.metrics
    assert artifact.attributes["pairwise_kept"] is False and artifact.attributes["pairwise"] is True
    # the same decision after the fit, as the protocol takes it
    chosen = ValidatedRefinement(PairwiseDCR(plain, **hurt)).refine(plain, data)
    assert chosen.kept_ is False and chosen.to_artifact().attributes["pairwise"] is True
    assert chosen.best_estimator_ is plain
    # without validation (the refinement alone) it is applied regardless
    forced = PairwiseDCR(PaperDCR(**POINTWISE), **hurt).fit(data)
    assert forced.to_artifact().attributes["pairwise_kept"] is True
    assert not np.array_equal(forced.best_estimator_.U_, plain.U_)


def test_a_refinement_that_helps_on_validation_is_kept():
    """From an under-trained pointwise fit (one small step), a sound refinement raises
    validation NDCG@10 and is kept."""
    data = planted(5, n_users=80, n_items=50, per_user=24)
    params = dict(POINTWISE, max_iter=1, learning_rate=0.001)
    sound = dict(learning_rate=0.1, max_iter=20, reg=0.0)
    validated = ValidatedRefinement(PairwiseDCR(PaperDCR(**params), **sound)).fit(data)
    model = validated.best_estimator_
    point, pair, se = validated.val_scores_
    assert validated.kept_ is True and pair > point + 2 * se
    plain = PaperDCR(**params).fit(data)
    assert not np.array_equal(model.U_, plain.U_)
    # kept: exactly the refinement alone, on its own random stream
    np.testing.assert_array_equal(
        model.U_, PairwiseDCR(PaperDCR(**params), **sound).fit(data).best_estimator_.U_
    )
    artifact = validated.to_artifact()
    assert artifact.metrics["pairwise_kept"] == 1.0 and np.isfinite(artifact.metrics["train_pairwise_loss"])
    assert artifact.metrics["val_ndcg@10_pairwise"] == pair
    chosen = ValidatedRefinement(PairwiseDCR(plain, **sound)).refine(plain, data)
    assert chosen.kept_ is True
    np.testing.assert_array_equal(chosen.best_estimator_.U_, PairwiseDCR(plain, **sound).refined(plain).U_)


def test_a_plain_fit_records_no_refinement_and_the_refinement_records_its_own_results():
    data = planted(6, n_users=20, n_items=15, per_user=8)
    plain = PaperDCR(n_components=3, max_iter=2).fit(data)
    recorded = plain.to_artifact()
    assert recorded.attributes["pairwise"] is False and "train_pairwise_loss" not in recorded.metrics
    refinement = PairwiseDCR(PaperDCR(n_components=3, max_iter=2), max_iter=3, pairs_per_epoch=0.5).fit(data)
    refined = refinement.to_artifact()
    assert (
        refined.attributes["pairwise"] is True and refined.metrics["train_pairwise_loss"] == refinement.loss_
    )
    # the wrapper keeps its results: the DCR it serves carries none of them and packs as pointwise
    served = refinement.best_estimator_
    assert not [name for name in vars(served) if name.startswith(("pairwise", "_rng"))]
    assert served.to_artifact().attributes["pairwise"] is False
    # a refined copy leaves the pointwise model it came from as it was
    copy = refinement.refined(plain)
    assert not np.array_equal(copy.U_, plain.U_) and plain.to_artifact().attributes["pairwise"] is False


@pytest.mark.parametrize(
    "bad", [dict(learning_rate=-1.0), dict(reg=float("nan")), dict(max_iter=2.5), dict(pairs_per_epoch=True)]
)
def test_pairwise_dcr_refuses_bad_settings_by_name(bad):
    data = planted(6, n_users=20, n_items=15, per_user=8)
    with pytest.raises(ValueError, match=repr(next(iter(bad)))):
        PairwiseDCR(PaperDCR(n_components=3, max_iter=2), **bad).fit(data)
    with pytest.raises(ValueError, match="fit the model"):
        PairwiseDCR(PaperDCR()).refined(PaperDCR())


@pytest.mark.parametrize(
    "solver,name",
    [({"dtype": "float16"}, "dtype"), ({"unrated_power": 1.5}, "unrated_power"), ({"decay": 0.1}, "decay")],
)
def test_a_bad_solver_is_refused_by_name(solver, name):
    with pytest.raises(ValueError, match=name):
        DCR(n_components=2, max_iter=1, solver=solver).fit(planted(0, n_users=5, n_items=5, per_user=3))


def test_validated_refinement_needs_the_fitted_ratings():
    data = planted(6, n_users=20, n_items=15, per_user=8)
    model = PaperDCR(n_components=3, max_iter=2).fit(data)
    with pytest.raises(ValueError, match="fitted on"):
        ValidatedRefinement(PairwiseDCR(model)).refine(model, planted(7, n_users=20, n_items=15, per_user=8))


@pytest.mark.parametrize(
    "bad",
    [
        dict(folds=0),
        dict(fraction=1.0),
        dict(margin=-0.1),
        dict(confidence=True),
        dict(max_users=0),
        dict(max_users=2.5),
        dict(max_users="all"),
    ],
)
def test_validated_refinement_refuses_bad_settings_by_name(bad):
    data = planted(6, n_users=20, n_items=15, per_user=8)
    with pytest.raises(ValueError, match=repr(next(iter(bad)))):
        ValidatedRefinement(PairwiseDCR(PaperDCR(n_components=3, max_iter=2)), **bad).fit(data)
