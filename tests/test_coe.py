"""COE: gradients, triple counting and sampling, exact accuracy counting, planted geometry,
serving index and registry round trip. Real-data checks are marked slow."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.indices.models import index_class
from ordrec.service.indices.models.coe import COEIndex
from ordrec.service.storage.registry import Registry
from ordrec.trainer.models import coe_kernels as K
from ordrec.trainer.models import estimator_class
from ordrec.trainer.models.coe import COE, COESolver, TripleSource, normalise
from ordrec.trainer.reproduce import coe as protocol
from tests.conftest import data_file
from tests.generated import make_ratings, random_ratings

# The paper's objective (the estimator defaults are the top-N settings, docs/coe.md).
PAPER = dict(unrated_share=0.0, solver=COESolver(type_a_share=None))


def brute_triples(user, item, values):
    """Every type-A and type-B triple by enumeration (tiny data only)."""
    a, b = set(), set()
    n = len(user)
    for p, q in itertools.product(range(n), range(n)):
        if values[p] <= values[q]:
            continue
        if user[p] == user[q]:
            a.add((int(user[p]), int(item[p]), int(item[q])))
        if item[p] == item[q]:
            b.add((int(user[p]), int(user[q]), int(item[p])))
    return a, b


# ----------------------------------------------------------------- gradients
@pytest.mark.parametrize("func", [K.SIGMOID, K.GOMPERTZ])
@pytest.mark.parametrize("kind", [0, 1])
@pytest.mark.parametrize("dim", [2, 3])
def test_gradient_matches_finite_differences(func, kind, dim):
    rng = np.random.default_rng(10 * func + 3 * kind + dim)
    for _ in range(5):
        X = rng.normal(size=(4, dim))
        Y = rng.normal(size=(5, dim))
        a, b, c = (0, 1, 2) if kind == 0 else (0, 1, 2)  # A: <u0, i1, i2>; B: <u0, u1, i2>
        scale = rng.uniform(0.5, 3.0)
        grad = K.triple_gradient(X, Y, kind, a, b, c, func, scale)
        points = [(X, a), (Y, b), (Y, c)] if kind == 0 else [(X, a), (X, b), (Y, c)]
        h = 1e-6
        for row, (M, r) in enumerate(points):
            for k in range(dim):
                old = M[r, k]
                M[r, k] = old + h
                up = K.triple_log_prob(X, Y, kind, a, b, c, func, scale)
                M[r, k] = old - h
                down = K.triple_log_prob(X, Y, kind, a, b, c, func, scale)
                M[r, k] = old
                assert grad[row, k] == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("func", [K.SIGMOID, K.GOMPERTZ])
def test_probability_is_one_half_at_zero_margin_and_rises(func):
    X = np.array([[0.0, 0.0]])
    Y = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    assert np.exp(K.triple_log_prob(X, Y, 0, 0, 0, 1, func, 2.0)) == pytest.approx(0.5)
    # i nearer than j: more likely than 1/2; reversed: less
    assert np.exp(K.triple_log_prob(X, Y, 0, 0, 0, 2, func, 2.0)) > 0.5
    assert np.exp(K.triple_log_prob(X, Y, 0, 0, 2, 0, func, 2.0)) < 0.5


def test_zero_distance_is_guarded():
    X = np.zeros((2, 2))
    Y = np.zeros((2, 2))
    for kind in (0, 1):
        assert np.all(np.isfinite(K.triple_gradient(X, Y, kind, 0, 1, 1 - kind, K.SIGMOID, 1.0)))


def test_one_step_moves_along_the_gradient_with_the_prior():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(2, 2))
    Y = rng.normal(size=(2, 2))
    lr, reg = 1e-3, 0.1
    for kind, triple in ((0, (0, 0, 1)), (1, (0, 1, 1))):
        grad = K.triple_gradient(X, Y, kind, *triple, K.GOMPERTZ, 1.5)
        X2, Y2 = X.copy(), Y.copy()
        arr = lambda v: np.array([v], dtype=np.int64)  # noqa: E731
        K.sga_explicit(
            X2,
            Y2,
            arr(kind),
            arr(triple[0]),
            arr(triple[1]),
            arr(triple[2]),
            1,
            K.GOMPERTZ,
            1.5,
            reg,
            lr,
            lr,
            0,
        )
        points = (
            [(X, X2, triple[0]), (Y, Y2, triple[1]), (Y, Y2, triple[2])]
            if kind == 0
            else [(X, X2, triple[0]), (X, X2, triple[1]), (Y, Y2, triple[2])]
        )
        for row, (before, after, r) in enumerate(points):
            np.testing.assert_allclose(after[r], before[r] + lr * (grad[row] - reg * before[r]))


# ------------------------------------------------------ counting and sampling
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_triple_counts_match_enumeration(seed):
    rng = np.random.default_rng(seed)
    data = random_ratings(rng, n_users=6, n_items=7, per_user=int(rng.integers(1, 7)), levels=3)
    values = normalise(data, "ratings")
    source = TripleSource.build(data.user, data.item, values, data.n_users, data.n_items)
    a, b = brute_triples(data.user, data.item, values)
    assert source.n_type_a == len(a)
    assert source.n_type_b == len(b)


def test_sampler_is_uniform_over_the_triple_set_and_orients_triples():
    rng = np.random.default_rng(5)
    data = random_ratings(rng, n_users=5, n_items=6, per_user=4, levels=3)
    values = normalise(data, "ratings")
    source = TripleSource.build(data.user, data.item, values, data.n_users, data.n_items)
    a, b = brute_triples(data.user, data.item, values)
    everything = [(0,) + t for t in sorted(a)] + [(1,) + t for t in sorted(b)]
    n = 200_000
    kind, first, second, third = source.sample(n, len(a) / (len(a) + len(b)), seed=3)
    drawn = {}
    for t in zip(kind, first, second, third):
        drawn[tuple(int(x) for x in t)] = drawn.get(tuple(int(x) for x in t), 0) + 1
    assert set(drawn) == set(everything)  # every draw is a true, correctly oriented triple
    expected = n / len(everything)
    counts = np.array([drawn[t] for t in everything])
    # each count is Binomial(n, 1/T): 5 standard deviations
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))


def test_memory_does_not_grow_with_the_number_of_triples():
    rng = np.random.default_rng(2)
    few = random_ratings(rng, 40, 30, 12, levels=2)  # many ties, few triples
    many = make_ratings(few.user, few.item, rng.normal(size=len(few)))  # no ties
    s_few = TripleSource.build(few.user, few.item, few.rating, few.n_users, few.n_items)
    s_many = TripleSource.build(many.user, many.item, many.rating, many.n_users, many.n_items)
    assert s_many.n_type_a + s_many.n_type_b > 1.5 * (s_few.n_type_a + s_few.n_type_b)
    assert s_many.nbytes() == s_few.nbytes()


def test_normalise_sources():
    data = make_ratings([0, 0, 0, 1, 1], [0, 1, 2, 0, 1], [1, 3, 5, 4, 4])
    z = normalise(data, "ratings")
    np.testing.assert_allclose(z[:3], [-np.sqrt(1.5), 0, np.sqrt(1.5)], rtol=1e-6)
    np.testing.assert_allclose(z[3:], [0, 0])  # std 0: all ties, no type-A triple
    f = normalise(data, "cooccurrence")
    np.testing.assert_allclose(f, [1 / 9, 3 / 9, 5 / 9, 0.5, 0.5], rtol=1e-6)
    with pytest.raises(ValueError):
        normalise(data, "nonsense")
    data.rating[0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        normalise(data, "ratings")


# ------------------------------------------------------------ exact accuracy
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_concordant_pairs_match_enumeration(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 12, size=4)
    indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    values = rng.integers(0, 4, size=indptr[-1]).astype(np.float32)
    dist = rng.integers(0, 5, size=indptr[-1]).astype(np.float64)  # ties in distance too
    pairs, correct = K.concordant_pairs(indptr, values, dist)
    for g in range(4):
        s, e = indptr[g], indptr[g + 1]
        p = c = 0
        for k, l in itertools.product(range(s, e), range(s, e)):
            if values[k] > values[l]:
                p += 1
                c += dist[k] < dist[l]
        assert (pairs[g], correct[g]) == (p, c)


def test_protocol_metrics_match_enumeration():
    rng = np.random.default_rng(7)
    data = random_ratings(rng, n_users=8, n_items=9, per_user=6, levels=5)
    observed = protocol.split_per_user(data.user, data.n_users, 0.8, rng)
    values = protocol.protocol_values(data, observed)
    dist = rng.random(len(data))
    got = protocol.evaluate_distances(data, values, observed, dist)
    d = {(int(u), int(i)): dist[r] for r, (u, i) in enumerate(zip(data.user, data.item))}
    obs = {(int(u), int(i)) for u, i, o in zip(data.user, data.item, observed) if o}
    a, b = brute_triples(data.user, data.item, values)

    def accuracy(triples, group_of, pairs_of, keep):
        per = {}
        for t in triples:
            near, far = pairs_of(t)
            if keep(near, far):
                hits = per.setdefault(group_of(t), [0, 0])
                hits[0] += 1
                hits[1] += d[near] < d[far]
        return np.mean([h / n for n, h in per.values()])

    a_pairs = lambda t: ((t[0], t[1]), (t[0], t[2]))  # noqa: E731
    b_pairs = lambda t: ((t[0], t[2]), (t[1], t[2]))  # noqa: E731
    both = lambda x, y: x in obs and y in obs  # noqa: E731
    hidden = lambda x, y: not (x in obs and y in obs)  # noqa: E731
    assert got["preservation_a"] == pytest.approx(accuracy(a, lambda t: t[0], a_pairs, both))
    assert got["prediction_a"] == pytest.approx(accuracy(a, lambda t: t[0], a_pairs, hidden))
    assert got["preservation_b"] == pytest.approx(accuracy(b, lambda t: t[2], b_pairs, both))
    assert got["prediction_b"] == pytest.approx(accuracy(b, lambda t: t[2], b_pairs, hidden))
    # 1-NN for users: the rating of the nearest rated item, averaged over users
    nn = [data.rating[data.user == u][np.argmin(dist[data.user == u])] for u in range(data.n_users)]
    assert got["knn1_users"] == pytest.approx(np.mean(nn))


def test_split_and_filter():
    rng = np.random.default_rng(0)
    data = random_ratings(rng, n_users=12, n_items=40, per_user=20)
    mask = protocol.split_per_user(data.user, data.n_users, 0.8, rng)
    assert np.all(np.bincount(data.user[mask], minlength=12) == 16)
    # a user with 19 ratings goes; items rated fewer than 4 times go
    extra = make_ratings(
        np.r_[data.user, [12] * 19], np.r_[data.item, np.arange(19)], np.r_[data.rating, np.ones(19)], 13, 40
    )
    kept = protocol.paper_filter(extra)
    assert "u12" not in kept.users
    assert np.bincount(kept.item).min() >= 4


# ------------------------------------------------------------ planted geometry
def test_planted_geometry_is_recovered():
    """Users and items drawn in 2-D; every user rates 30 items by closeness (value = -distance)."""
    rng = np.random.default_rng(11)
    n_users, n_items, per_user = 80, 60, 30
    Xt = rng.uniform(-1, 1, (n_users, 2))
    Yt = rng.uniform(-1, 1, (n_items, 2))
    user = np.repeat(np.arange(n_users), per_user)
    item = np.concatenate([rng.choice(n_items, per_user, replace=False) for _ in range(n_users)])
    values = -np.linalg.norm(Xt[user] - Yt[item], axis=1)
    data = make_ratings(user, item, values, n_users, n_items)
    triples = TripleSource.build(data.user, data.item, values.astype(np.float32), n_users, n_items)
    paper_2d = dict(PAPER, n_components=2, function="sigmoid", lam=4.0, reg=0.0, learning_rate=0.1)
    model = COE(**paper_2d, max_iter=60, random_state=0)
    model.fit_triples(data, triples)
    index = COEIndex.from_artifact(model.to_artifact())
    metrics = protocol.evaluate_index(index, data, values.astype(np.float32), np.ones(len(data), bool))
    assert metrics["preservation_a"] > 0.95
    assert metrics["preservation_b"] > 0.95
    # and the random floor is near one half, so the bar means something
    noise = protocol.evaluate_distances(
        data, values.astype(np.float32), np.ones(len(data), bool), rng.random(len(data))
    )
    assert noise["preservation_h"] < 0.6


# ------------------------------------------------------------------ estimator
def test_estimator_contract_and_determinism():
    assert estimator_class("coe") is COE
    rng = np.random.default_rng(3)
    data = random_ratings(rng)
    params = dict(max_iter=3, random_state=4, function="gompertz")
    m1 = COE(**params).fit(data)
    m2 = COE(**params).fit(data)
    np.testing.assert_array_equal(m1.user_coords_, m2.user_coords_)
    assert COE(**params).get_params()["function"] == "gompertz"
    art = m1.to_artifact()
    assert set(art.arrays) == {
        "user_coords",
        "item_coords",
        "seen_indptr",
        "seen_indices",
        "seen_ratings",
        "item_popularity",
    }
    assert set(art.ids) == {"users", "items"}


def test_divergence_is_reported():
    data = random_ratings(np.random.default_rng(0))
    with pytest.raises(FloatingPointError):
        COE(learning_rate=1e6, reg=1.0, max_iter=2).fit(data)


def test_cooccurrence_source_fits():
    rng = np.random.default_rng(9)
    data = random_ratings(rng)
    data.rating[:] = rng.integers(1, 50, size=len(data))
    model = COE(source="cooccurrence", max_iter=2, n_components=3).fit(data)
    assert model.user_coords_.shape == (data.n_users, 3)


# ------------------------------------------------------------------- serving
@pytest.fixture(scope="module")
def fitted():
    data = random_ratings(np.random.default_rng(21), n_users=40, n_items=60, per_user=12)
    return data, COE(max_iter=5, random_state=1).fit(data)


def test_index_contract(fitted):
    _, model = fitted
    index = index_class("coe").from_artifact(model.to_artifact())
    assert index.rpcs == frozenset({"Recommend", "SimilarItems", "Neighbors", "Coordinates"})
    index.smoke()
    scores = index.score_users(np.array([0, 3]))
    assert scores.shape == (2, 60) and scores.dtype == np.float32
    np.testing.assert_allclose(scores[1, [5, 7]], index.score_items(3, np.array([5, 7])), rtol=1e-6)
    assert np.all(scores <= 0)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 39), st.integers(1, 70), st.booleans())
def test_recommend_through_the_tree_equals_brute_force(fitted, user, n, exclude_seen):
    _, model = fitted
    index = COEIndex.from_artifact(model.to_artifact())
    exclude = index.seen(user) if exclude_seen else None
    rows, scores = index.recommend(user, n, exclude=exclude)
    brute = index.score_users(np.array([user]))[0].astype(np.float64)
    if exclude is not None:
        brute[exclude] = -np.inf
    expected = np.sort(brute[np.isfinite(brute)])[::-1][:n]
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    assert len(set(rows.tolist())) == rows.size
    if exclude is not None:
        assert not np.isin(rows, exclude).any()
        # unsorted, repeated exclusions give the same answer
        messy = np.concatenate([exclude[::-1], exclude[:3]])
        np.testing.assert_array_equal(index.recommend(user, n, exclude=messy)[0], rows)
    # candidates path ranks only the candidates
    cand = np.arange(0, 60, 3)
    rows_c, _ = index.recommend(user, 5, candidates=cand)
    assert np.isin(rows_c, cand).all()


def test_index_refuses_inconsistent_artifacts(fitted):
    from ordrec.service.storage.artifact import ArtifactError

    _, model = fitted
    art = model.to_artifact()
    dim = art.arrays["user_coords"].shape[1]
    bad = dict(art.arrays, item_coords=np.zeros((60, dim + 1), np.float32))
    with pytest.raises(ArtifactError, match="dimension"):
        COEIndex.from_artifact(type(art)(art.kind, bad, art.ids))
    bad = dict(art.arrays, user_coords=np.full((40, dim), np.nan, np.float32))
    with pytest.raises(ArtifactError, match="NaN"):
        COEIndex.from_artifact(type(art)(art.kind, bad, art.ids))


def test_neighbors_between_entities(fitted):
    _, model = fitted
    index = COEIndex.from_artifact(model.to_artifact())
    rows, scores = index.neighbors("", "items", 4, "users", 3)  # who would like item 4
    d = np.linalg.norm(index.user_coords - index.item_coords[4], axis=1)
    np.testing.assert_array_equal(rows, np.argsort(d)[:3])
    np.testing.assert_allclose(scores, -np.sort(d)[:3], rtol=1e-5)
    rows, _ = index.neighbors("", "users", 2, "users", 5)
    assert 2 not in rows and rows.size == 5


def test_registry_round_trip(fitted, tmp_path):
    _, model = fitted
    registry = Registry(tmp_path)
    version = registry.publish("coe", model.to_artifact())
    loaded = registry.load("coe")
    assert loaded.version == version
    a = COEIndex.from_artifact(model.to_artifact())
    b = COEIndex.from_artifact(loaded)
    b.smoke()
    for user in range(5):
        np.testing.assert_array_equal(
            a.recommend(user, 10, exclude=a.seen(user))[0], b.recommend(user, 10, exclude=b.seen(user))[0]
        )
    np.testing.assert_array_equal(b.item_coords, model.item_coords_.astype(np.float64))


# ------------------------------------------------------------------ real data
@pytest.mark.slow
def test_ml100k_meets_table3_targets():
    path = data_file("ml-100k", "u.data")
    data = protocol.paper_filter(protocol.read_whitespace_ratings(str(path)))
    assert (data.n_users, data.n_items, len(data)) == (943, 1413, 99543)
    rng = np.random.default_rng([0, 0])
    observed = protocol.split_per_user(data.user, data.n_users, 0.8, rng)
    values = protocol.protocol_values(data, observed)
    for function in ("sigmoid", "gompertz"):
        params = dict(protocol.DEFAULTS[function], function=function, n_components=2)
        metrics, _ = protocol.fit_and_evaluate(params, data, values, observed)
        assert metrics["preservation_h"] >= 0.696, (function, metrics)
        assert metrics["prediction_h"] >= 0.614, (function, metrics)


# ------------------------------------------------------------- explicit triples
def test_explicit_triples_file(tmp_path):
    from ordrec.trainer.data.triples import read_triples
    from ordrec.trainer.data.types import DataError

    # planted 1-D line: users and items at positions; triples from true distances
    rng = np.random.default_rng(4)
    xu, yi = rng.uniform(-1, 1, 12), rng.uniform(-1, 1, 15)
    lines = ["# planted triples"]
    for _ in range(3000):
        if rng.random() < 0.5:
            u, i, j = int(rng.integers(12)), *map(int, rng.choice(15, 2, replace=False))
            if abs(xu[u] - yi[i]) > abs(xu[u] - yi[j]):
                i, j = j, i
            lines.append(f"A\tu{u}\ti{i}\ti{j}")
        else:
            (u, v), i = map(int, rng.choice(12, 2, replace=False)), int(rng.integers(15))
            if abs(xu[u] - yi[i]) > abs(xu[v] - yi[i]):
                u, v = v, u
            lines.append(f"B u{u} u{v} i{i}  # comment")
    path = tmp_path / "t.tsv"
    path.write_text("\n".join(lines) + "\n")
    triples = read_triples(str(path))
    assert len(triples) == 3000 and triples.n_users == 12 and triples.n_items == 15
    model = COE(n_components=2, lam=4.0, reg=0.0, max_iter=30, random_state=0).fit(triples)
    X, Y = model.user_coords_, model.item_coords_
    a = triples.kind == 0
    d = lambda P, p, Q, q: np.linalg.norm(P[p] - Q[q], axis=1)  # noqa: E731
    ok_a = d(X, triples.first[a], Y, triples.second[a]) < d(X, triples.first[a], Y, triples.third[a])
    ok_b = d(X, triples.first[~a], Y, triples.third[~a]) < d(X, triples.second[~a], Y, triples.third[~a])
    assert ok_a.mean() > 0.95 and ok_b.mean() > 0.95
    COEIndex.from_artifact(model.to_artifact()).smoke()

    bad = tmp_path / "bad.tsv"
    bad.write_text("A u1 i1 i2\nC u1 i1 i2\nA u1 i3\n")
    with pytest.raises(DataError, match=":2:"):
        read_triples(str(bad))
    assert read_triples(str(bad), skip_bad_lines=True).skipped_lines == 2
