"""RTF trainer: gradient of the whole objective, SGD step, planted recovery, artifact."""

from __future__ import annotations

import numpy as np
import pytest

from ordrec.service.indices.models.rtf import RTFIndex
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.registry import Registry
from ordrec.trainer.data.types import TagAssignments
from ordrec.trainer.models import estimator_class
from ordrec.trainer.models import rtf_kernels as K
from ordrec.trainer.models.pipeline import configure
from ordrec.trainer.models.rtf import RTF, STOP, Posts, group_posts, sgd_passes
from ordrec.trainer.models.rtf_stopping import EXTRA_VALIDATION_SHARE, EarlyStoppedRTF, validation_mask
from ordrec.trainer.sample import planted_tags_with_truth


def _tiny_problem(seed=0, dims=(3, 4, 2), n_users=4, n_items=3, n_tags=6, std=0.7):
    rng = np.random.default_rng(seed)
    C = rng.normal(0, std, dims)
    U = rng.normal(0, std, (n_users, dims[0]))
    I = rng.normal(0, std, (n_items, dims[1]))
    T = rng.normal(0, std, (n_tags, dims[2]))
    # posts with 1..3 tags; user 0 and item 0 appear in several posts
    posts = [(0, 0, [1]), (0, 2, [0, 3, 5]), (1, 0, [2, 4]), (3, 1, [0]), (2, 0, [5, 1])]
    user = np.array([u for u, i, ts in posts for _ in ts])
    item = np.array([i for u, i, ts in posts for _ in ts])
    tag = np.array([t for u, i, ts in posts for t in ts])
    return (C, U, I, T), group_posts(user, item, tag)


def _objective_numpy(C, U, I, T, post_user, post_item, indptr, tags, reg, reg_core, reg_tags):
    """The objective written independently of the kernels, by the full Eq. 4 sum."""
    total = 0.0
    for p in range(post_user.size):
        u, i = post_user[p], post_item[p]
        y = np.einsum("abc,a,b,tc->t", C, U[u], I[i], T)
        pos = tags[indptr[p] : indptr[p + 1]]
        neg = np.setdiff1d(np.arange(T.shape[0]), pos)
        d = y[pos][:, None] - y[neg][None, :]
        total += np.mean(1.0 / (1.0 + np.exp(-d)))
        total -= (
            reg_core * np.sum(C**2) + reg * (np.sum(U[u] ** 2) + np.sum(I[i] ** 2)) + reg_tags * np.sum(T**2)
        )
    return total


def test_objective_matches_independent_formula():
    params, posts = _tiny_problem()
    want = _objective_numpy(*params, *posts, 0.01, 0.02, 0.03)
    got = K.objective(*params, *posts, 0.01, 0.02, 0.03)
    assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("regs", [(0.0, 0.0, 0.0), (0.03, 0.05, 0.02)])
def test_gradient_of_whole_objective_by_finite_differences(regs):
    params, posts = _tiny_problem(seed=1)
    grads = K.gradient(*params, *posts, *regs)
    eps = 1e-6
    for name, param, grad in zip("CUIT", params, grads):
        flat = param.reshape(-1)
        numeric = np.empty(flat.size)
        for k in range(flat.size):
            old = flat[k]
            flat[k] = old + eps
            up = K.objective(*params, *posts, *regs)
            flat[k] = old - eps
            down = K.objective(*params, *posts, *regs)
            flat[k] = old
            numeric[k] = (up - down) / (2 * eps)
        np.testing.assert_allclose(grad.reshape(-1), numeric, rtol=1e-5, atol=1e-8, err_msg=name)
        assert np.abs(grad).max() > 1e-4, f"gradient of {name} is trivially zero"


def test_one_sgd_step_is_an_ascent_step_along_the_gradient():
    """sgd_epoch on one post moves every parameter by exactly lr * gradient."""
    params, (pu, pi, indptr, tags) = _tiny_problem(seed=2)
    regs, lr = (0.02, 0.03, 0.01), 1e-3
    for p in range(pu.size):
        one = (
            pu[p : p + 1],
            pi[p : p + 1],
            np.array([0, indptr[p + 1] - indptr[p]]),
            tags[indptr[p] : indptr[p + 1]],
        )
        before = [x.copy() for x in params]
        grads = K.gradient(*before, *one, *regs)
        after = [x.copy() for x in params]
        K.sgd_epoch(*after, *one, np.array([0]), lr, *regs)
        for name, b, a, g in zip("CUIT", before, after, grads):
            np.testing.assert_allclose((a - b) / lr, g, rtol=1e-9, atol=1e-12, err_msg=name)


def test_sgd_epoch_raises_the_objective():
    params, posts = _tiny_problem(seed=3, std=0.3)
    start = K.objective(*params, *posts, 1e-4, 1e-4, 1e-4)
    order = np.arange(posts[0].size)
    for _ in range(30):
        K.sgd_epoch(*params, *posts, order, 0.3, 1e-4, 1e-4, 1e-4)
    assert K.objective(*params, *posts, 1e-4, 1e-4, 1e-4) > start + 0.5


def test_posts_auc_counts_pairs_with_ties_as_half():
    rng = np.random.default_rng(4)
    scores = rng.integers(0, 4, size=(30, 9)).astype(np.float64)  # many ties
    lengths = rng.integers(1, 4, size=30)
    tags = np.concatenate([rng.choice(9, size=n, replace=False) for n in lengths])
    indptr = np.r_[0, np.cumsum(lengths)]
    got = RTF.posts_auc(scores, indptr, tags)
    for p in range(30):
        pos = tags[indptr[p] : indptr[p + 1]]
        neg = np.setdiff1d(np.arange(9), pos)
        d = scores[p, pos][:, None] - scores[p, neg][None, :]
        assert got[p] == pytest.approx(np.mean((d > 0) + 0.5 * (d == 0)))


def test_group_posts_dedupes_and_sorts():
    pu, pi, indptr, tags = group_posts(
        np.array([2, 0, 2, 0, 2]), np.array([1, 5, 1, 5, 0]), np.array([3, 1, 3, 0, 4])
    )
    assert pu.tolist() == [0, 2, 2] and pi.tolist() == [5, 0, 1]
    assert [tags[indptr[p] : indptr[p + 1]].tolist() for p in range(3)] == [[0, 1], [4], [3]]


def _split_planted(seed=0):
    data, truth = planted_tags_with_truth(
        n_users=120, n_items=80, n_tags=30, rank=3, posts_per_user=(10, 16), tags_per_post=(2, 4), seed=seed
    )
    post_user, post_item, indptr, tags = group_posts(data.user, data.item, data.tag)
    rng = np.random.default_rng(seed)
    test = np.zeros(post_user.size, dtype=bool)
    test[rng.choice(post_user.size, size=150, replace=False)] = True
    per = np.diff(indptr)
    mask = ~np.repeat(test, per)
    return data, truth, data.subset(mask), (post_user[test], post_item[test])


def _planted_tucker(seed=0, n_users=60, n_items=50, n_tags=25, k=3, posts_per_user=10, tags_per_post=3):
    """Posts whose tags are the top ones of a known rank-(k,k,k) Tucker tensor.

    The core is random, so the tensor has a genuine three-way interaction:
    which tags a user puts on an item is not the sum of the user's and the
    item's habits, and popularity cannot recover it.
    """
    rng = np.random.default_rng(seed)
    C = rng.normal(size=(k, k, k))
    U, I, T = rng.normal(size=(n_users, k)), rng.normal(size=(n_items, k)), rng.normal(size=(n_tags, k))
    truth = lambda u, i: np.einsum("abc,a,b,tc->t", C, U[u], I[i], T)  # noqa: E731
    rows = []
    for u in range(n_users):
        for i in rng.choice(n_items, size=posts_per_user, replace=False):
            rows += [(u, i, t) for t in np.argsort(-truth(u, i))[:tags_per_post]]
    user, item, tag = (np.array(x, dtype=np.int32) for x in zip(*rows))
    data = TagAssignments(
        IdMap([f"u{x}" for x in range(n_users)]),
        IdMap([f"i{x}" for x in range(n_items)]),
        IdMap([f"t{x}" for x in range(n_tags)]),
        user,
        item,
        tag,
        source="planted",
    )
    return data, truth


def test_recovers_planted_tensor_ranking():
    """On held-out posts (user and item seen, post not), RTF ranks the planted
    top-3 tags first: AUC of those tags under the model's scores, where chance
    is 0.5 and the planted tensor itself gets 1; popularity is the bar to clear."""
    data, truth = _planted_tucker()
    post_user, post_item, indptr, tags = group_posts(data.user, data.item, data.tag)
    rng = np.random.default_rng(0)
    test = np.zeros(post_user.size, dtype=bool)
    test[rng.choice(post_user.size, size=60, replace=False)] = True
    train = data.subset(~np.repeat(test, np.diff(indptr)))
    est = _stopped(
        n_components=6,
        learning_rate=1.0,
        init_std=0.3,
        max_iter=80,
        validation_posts=30,
        patience=10,
        random_state=0,
        verbose=False,
    ).fit(train)
    index = RTFIndex.from_artifact(est.to_artifact())
    model_auc, pop_auc = [], []
    for u, i in zip(post_user[test], post_item[test]):
        ur, ir = index.users.row(f"u{u}"), index.items.row(f"i{i}")
        if ur < 0 or ir < 0:
            continue
        best = index.tags_ids.rows([f"t{t}" for t in np.argsort(-truth(u, i))[:3]])
        if np.any(best < 0):
            continue
        indptr1 = np.array([0, 3])
        model_auc.append(RTF.posts_auc(index.scores(ur, ir)[None, :], indptr1, best)[0])
        pop_auc.append(RTF.posts_auc(index.popular_scores("mix", ur, ir)[None, :], indptr1, best)[0])
    assert len(model_auc) > 40
    model_auc, pop_auc = np.mean(model_auc), np.mean(pop_auc)
    assert model_auc > 0.9, model_auc
    assert model_auc > pop_auc + 0.05, (model_auc, pop_auc)
    # training AUC is reported per epoch and rises
    assert est.history_[-1]["train_auc"] > est.history_[0]["train_auc"] + 0.2


def test_early_stopping_keeps_the_best_epoch():
    data, truth, train, _ = _split_planted(seed=1)
    est = _stopped(
        n_components=4,
        learning_rate=1.0,
        init_std=0.3,
        max_iter=200,
        validation_posts=30,
        patience=3,
        min_iter=5,
        val_tol=1e-3,
        smoothing=1,
        random_state=1,
        verbose=False,
    ).fit(train)
    assert est.epochs_run_ < 200
    best = max(h["val_auc"] for h in est.history_)
    assert est.to_artifact().metrics["validation_auc"] == pytest.approx(best)
    assert est.epochs_run_ - est.best_epoch_ >= 3


def test_smoothed_early_stopping_keeps_the_peak_of_the_moving_average():
    data, truth, train, _ = _split_planted(seed=1)
    window = 4
    est = _stopped(
        n_components=4,
        learning_rate=1.0,
        init_std=0.3,
        max_iter=200,
        validation_posts=30,
        patience=3,
        min_iter=5,
        val_tol=1e-3,
        smoothing=window,
        random_state=1,
        verbose=False,
    ).fit(train)
    raw = np.array([h["val_auc"] for h in est.history_])
    moving = np.array([raw[max(0, e - window + 1) : e + 1].mean() for e in range(raw.size)])
    np.testing.assert_allclose([h["val_auc_smoothed"] for h in est.history_], moving)
    # the kept pass is the first whose moving average beat every earlier one by val_tol
    best, kept = -np.inf, 0
    for e, m in enumerate(moving, start=1):
        if m > best + 1e-3:
            best, kept = m, e
    assert est.best_epoch_ == kept
    assert est.epochs_run_ < 200 and est.epochs_run_ - kept >= 3


@pytest.mark.parametrize("n_val,n_posts", [(5, 120), (40, 120), (75, 2000), (1000, 2000), (1000, 120)])
def test_validation_split_never_takes_a_users_last_post(n_val, n_posts):
    rng = np.random.default_rng(n_val)
    post_user = np.sort(rng.integers(0, 30, size=n_posts)).astype(np.int32)
    mask = validation_mask(post_user, n_val, np.random.default_rng(0))
    counts = np.bincount(post_user, minlength=30)
    held = np.bincount(post_user[mask], minlength=30)
    assert np.all(counts[counts > 0] - held[counts > 0] >= 1)
    first_round = min(n_val, int((counts >= 2).sum()))
    cap = max(first_round, int(EXTRA_VALIDATION_SHARE * post_user.size))
    assert mask.sum() == min(n_val, cap, int(np.maximum(counts - 1, 0).sum()))
    # spread as evenly as the histories allow: nobody gives a second post while
    # an eligible user has given none
    if n_val <= int((counts >= 2).sum()):
        assert held.max() <= 1


def test_divergence_is_reported():
    data, truth, train, _ = _split_planted(seed=2)
    with pytest.raises(FloatingPointError, match="diverged"):
        RTF(n_components=4, learning_rate=1e30, init_std=1.0, max_iter=5, verbose=False).fit(train)


def test_seed_makes_training_reproducible():
    data, truth, train, _ = _split_planted(seed=3)
    a = RTF(n_components=3, max_iter=3, random_state=7, verbose=False).fit(train)
    b = RTF(n_components=3, max_iter=3, random_state=7, verbose=False).fit(train)
    np.testing.assert_array_equal(a.core_, b.core_)
    np.testing.assert_array_equal(a.tag_factors_, b.tag_factors_)


def test_lr_decay_scales_later_passes():
    # pass e steps with learning_rate / (1 + lr_decay (e - 1)): with a huge decay
    # every pass after the first barely moves the parameters, without it they move
    data, truth, train, _ = _split_planted(seed=5)
    kw = dict(n_components=3, learning_rate=0.5, max_iter=1, random_state=3, verbose=False)
    one = RTF(**kw).fit(train)
    frozen = RTF(**{**kw, "max_iter": 4, "learning_rate_decay": 1e9}).fit(train)
    moving = RTF(**{**kw, "max_iter": 4}).fit(train)
    assert np.abs(frozen.core_ - one.core_).max() < 1e-6
    assert np.abs(frozen.tag_factors_ - one.tag_factors_).max() < 1e-6
    assert np.abs(moving.core_ - one.core_).max() > 1e-3
    with pytest.raises(ValueError, match="learning_rate_decay"):
        RTF(learning_rate_decay=-0.1, verbose=False).fit(train)


def test_estimator_contract_and_registry_round_trip(tmp_path):
    assert estimator_class("rtf") is RTF
    assert RTF.kind == "rtf" and RTF.input_shape == "tags"
    assert RTF(n_components=5).get_params()["n_components"] == 5
    data, truth, train, _ = _split_planted(seed=4)
    train.tag_names = [f"name {t} ä" for t in range(len(train.tags))]
    est = RTF(n_components=(3, 4, 5), max_iter=3, random_state=0, verbose=False).fit(train)
    artifact = est.to_artifact()
    assert artifact.arrays["core"].shape == (3, 4, 5)
    registry = Registry(tmp_path)
    version = registry.publish("rtf", artifact)
    loaded = registry.load("rtf", version)
    assert loaded.hyperparameters["n_components"] == [3, 4, 5]
    a, b = RTFIndex.from_artifact(artifact), RTFIndex.from_artifact(loaded)
    b.smoke()
    for u, i in [(0, 0), (3, 7), (-1, 2), (5, -1), (-1, -1)]:
        ra, sa, fa = a.tags(u, i, 7, exclude_own=True)
        rb, sb, fb = b.tags(u, i, 7, exclude_own=True)
        assert fa == fb and ra.tolist() == rb.tolist()
        np.testing.assert_array_equal(sa, sb)
    names = b.tag_names([0, 1])
    used = np.unique(train.tag)  # compact() keeps used tags in order
    assert names == [train.tag_names[used[0]], train.tag_names[used[1]]]


def test_rejects_wrong_input():
    with pytest.raises(ValueError, match="n_components"):
        RTF(n_components=(2, 3), verbose=False).fit(_split_planted()[2])
    with pytest.raises(TypeError):
        RTF(verbose=False).fit("not data")
    one_tag = TagAssignments(
        IdMap(["u"]),
        IdMap(["i"]),
        IdMap(["t"]),
        np.array([0], np.int32),
        np.array([0], np.int32),
        np.array([0], np.int32),
    )
    with pytest.raises(ValueError, match="two distinct tags"):
        RTF(verbose=False).fit(one_tag)


def test_plateau_lr_drop_restarts_from_the_best_pass_at_a_smaller_rate(monkeypatch):
    from ordrec.trainer.models import rtf_kernels as K

    data, truth, train, _ = _split_planted(seed=1)
    kw = dict(
        n_components=4,
        learning_rate=1.0,
        init_std=0.3,
        max_iter=200,
        validation_posts=30,
        patience=3,
        min_iter=5,
        val_tol=1e-3,
        smoothing=1,
        random_state=1,
        verbose=False,
    )
    plain = _stopped(**kw).fit(train)
    # record the core each pass starts from and the core each pass ends with
    starts, ends, real = [], [], K.sgd_epoch

    def spy(C, *rest):
        starts.append(C.copy())
        out = real(C, *rest)
        ends.append(C.copy())
        return out

    monkeypatch.setattr(K, "sgd_epoch", spy)
    dropped = _stopped(**kw, learning_rate_drops=2, learning_rate_drop_factor=0.25).fit(train)
    lrs = np.array([h["lr"] for h in dropped.history_])
    # identical until the first plateau, then at most two drops by the factor
    n = plain.epochs_run_
    assert [h["val_auc"] for h in dropped.history_[:n]] == [h["val_auc"] for h in plain.history_]
    assert np.all(lrs[:n] == 1.0) and dropped.epochs_run_ > n
    assert np.all(np.diff(lrs) <= 0) and set(lrs) <= {1.0, 0.25, 0.0625} and lrs[-1] < 1.0
    # the first pass after a drop starts from the parameters of the best pass so far
    # (val_tol rule), not from where the plateau left them
    best, kept = -np.inf, 0
    for e, h in enumerate(dropped.history_[:n], start=1):
        if h["val_auc"] > best + 1e-3:
            best, kept = h["val_auc"], e
    np.testing.assert_array_equal(starts[n], ends[kept - 1])
    assert not np.array_equal(starts[n], ends[n - 1])
    with pytest.raises(ValueError, match="learning_rate_drop_factor"):
        EarlyStoppedRTF(RTF(verbose=False), learning_rate_drop_factor=1.0).fit(train)


def test_keep_within_keeps_the_latest_pass_of_the_plateau():
    data, truth, train, _ = _split_planted(seed=1)
    window = 4
    kw = dict(
        n_components=4,
        learning_rate=1.0,
        init_std=0.3,
        max_iter=200,
        validation_posts=30,
        patience=3,
        min_iter=5,
        val_tol=1e-3,
        smoothing=window,
        random_state=1,
        verbose=False,
    )
    first = _stopped(**kw).fit(train)
    eps = 2e-3
    cores = []
    latest = _stopped(**kw, keep_within=eps).fit(
        train, on_epoch=lambda e, est, rec: cores.append(est.core_.copy())
    )
    # same training and the same stop; only the kept pass differs
    assert [h["val_auc"] for h in latest.history_] == [h["val_auc"] for h in first.history_]
    moving = np.array([h["val_auc_smoothed"] for h in latest.history_])
    expect = max(e for e, m in enumerate(moving, start=1) if m >= moving.max() - eps)
    assert latest.best_epoch_ == expect >= first.best_epoch_
    assert latest.to_artifact().metrics["validation_auc"] == latest.history_[expect - 1]["val_auc"]
    np.testing.assert_array_equal(latest.estimator_.core_, cores[expect - 1])
    # a tolerance wider than any swing keeps the last pass run
    wide = _stopped(**kw, keep_within=1.0).fit(train)
    assert wide.best_epoch_ == wide.epochs_run_
    with pytest.raises(ValueError, match="keep_within"):
        EarlyStoppedRTF(RTF(verbose=False), keep_within=-1.0).fit(train)


def _stopped(**flat) -> EarlyStoppedRTF:
    """RTF and its early stopping, built from flat settings as a job builds them."""
    return configure("rtf", flat).estimator


STOPPING = dict(n_components=4, learning_rate=1.0, init_std=0.3, max_iter=200, random_state=1, verbose=False)
PLATEAU = dict(validation_posts=30, patience=3, min_iter=5, val_tol=1e-3)


def test_the_wrapper_keeps_the_factors_of_the_kept_pass_and_stops_after_patience():
    """The plateau rule (the last pass that gains ``val_tol``; stop ``patience`` passes later, not
    before ``min_iter``), and the kept factors are those of that pass: RTF alone, given the same
    held-out posts and the seed's stream after drawing them, reaches them in that many passes."""
    data, _, train, _ = _split_planted(seed=1)
    est = _stopped(**STOPPING, **PLATEAU).fit(train)
    vals = [h["val_auc"] for h in est.history_]
    gains = [e for e in range(1, len(vals) + 1) if vals[e - 1] > max([-np.inf] + vals[: e - 1]) + 1e-3]
    assert est.best_epoch_ == gains[-1] < est.epochs_run_ == len(vals) < 200
    assert len(vals) == max(est.best_epoch_ + 3, 5)  # stopped by patience (min_iter 5), not before
    data = train.compact()
    rng = np.random.default_rng(STOPPING["random_state"])
    held_out = validation_mask(group_posts(data.user, data.item, data.tag)[0], 30, rng)
    alone = RTF(**dict(STOPPING, max_iter=est.best_epoch_)).fit(data, held_out=held_out, rng=rng)
    for name in ("core_", "user_factors_", "item_factors_", "tag_factors_"):
        np.testing.assert_array_equal(getattr(est.estimator_, name), getattr(alone, name))
    metrics = est.to_artifact().metrics
    assert metrics["best_epoch"] == est.best_epoch_ and metrics["epochs"] == est.epochs_run_


def test_rtf_alone_runs_max_iter_passes_and_stops_only_when_its_hook_says():
    """No hold-out and no plateau inside ``RTF.fit``: where the early-stopped fit stops, RTF
    alone runs every pass it is given, on every post; its hook may stop it."""
    data, _, train, _ = _split_planted(seed=1)
    stopped = _stopped(**STOPPING, **PLATEAU).fit(train)
    assert stopped.epochs_run_ < 60
    alone = RTF(**dict(STOPPING, max_iter=60)).fit(train)
    assert alone.epochs_run_ == len(alone.history_) == 60
    assert not any("val_auc" in h for h in alone.history_)
    assert alone.to_artifact().metrics["best_epoch"] == 60
    hooked = RTF(**dict(STOPPING, max_iter=60)).fit(
        train, on_epoch=lambda e, est, rec: STOP if e == 4 else None
    )
    assert hooked.epochs_run_ == 4


def test_sgd_passes_scale_the_learning_rate_as_the_hook_asks():
    data, _, train, _ = _split_planted(seed=1)
    data = train.compact()
    posts = Posts(*group_posts(data.user, data.item, data.tag))
    rng = np.random.default_rng(0)
    shapes = [(4, 4, 4), (len(data.users), 4), (len(data.items), 4), (len(data.tags), 4)]
    factors = tuple(rng.normal(0.0, 0.3, size=s) for s in shapes)
    history = sgd_passes(
        factors,
        posts,
        np.arange(posts.user.size),
        rng,
        learning_rate=1.0,
        learning_rate_decay=0.0,
        regs=(1e-3, 0.0, 0.0),
        max_iter=6,
        on_pass=lambda epoch, record: 0.5 if epoch == 2 else None,
    )
    assert [h["lr"] for h in history] == [1.0, 1.0, 0.5, 0.5, 0.5, 0.5]


def test_a_learning_rate_drop_restarts_patience_from_the_best_pass():
    data, _, train, _ = _split_planted(seed=1)
    once = _stopped(**STOPPING, **PLATEAU).fit(train)
    dropped = _stopped(**STOPPING, **PLATEAU, learning_rate_drops=1).fit(train)
    first_stop = len(once.history_)
    assert first_stop < 200
    assert dropped.history_[:first_stop] == once.history_  # the same passes up to the plateau
    assert len(dropped.history_) >= first_stop + 3  # a fresh patience after the drop
    assert dropped.history_[first_stop]["lr"] == pytest.approx(0.5 * dropped.history_[0]["lr"])
