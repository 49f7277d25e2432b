"""DCR serving index: one matrix product, exclusion, candidates, batch, distributions, bad artifacts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ordrec.service.indices.models import build_index, index_class
from ordrec.service.indices.models.dcr import DCRIndex, level_weights, monotone_distribution, relevance_values
from ordrec.service.storage.artifact import Artifact, ArtifactError
from ordrec.service.storage.idmap import IdMap


def artifact(n_users=7, n_items=11, rank=3, levels=(1, 2, 3, 4, 5), relevance="linear", seed=0, **over):
    rng = np.random.default_rng(seed)
    L = len(levels) - 1
    U = rng.normal(size=(n_users, L, rank))
    V = rng.normal(size=(n_items, L, rank))
    U /= np.maximum(1, np.linalg.norm(U, axis=2, keepdims=True))
    V /= np.maximum(1, np.linalg.norm(V, axis=2, keepdims=True))
    seen = [rng.choice(n_items, 3, replace=False) for _ in range(n_users)]
    arrays = {
        "user_factors": U.reshape(n_users, -1).astype(np.float32),
        "item_factors": V.reshape(n_items, -1).astype(np.float32),
        "seen_indptr": np.arange(0, 3 * n_users + 1, 3, dtype=np.int64),
        "seen_indices": np.concatenate(seen).astype(np.int32),
        "item_popularity": rng.random(n_items).astype(np.float32),
    }
    arrays.update(over.pop("arrays", {}))
    attributes = {"levels": [float(x) for x in levels], "relevance": relevance, "rank": rank}
    attributes.update(over.pop("attributes", {}))
    return Artifact(
        "dcr",
        arrays,
        {
            "users": IdMap([f"u{i}" for i in range(n_users)]),
            "items": IdMap([f"i{i}" for i in range(n_items)]),
        },
        attributes=attributes,
        **over,
    )


def brute_force_sc(index: DCRIndex, u: int) -> np.ndarray:
    """Eq. 4 evaluated level by level, the slow way."""
    f = relevance_values(index.levels, index.relevance)
    p_ge = index.level_probabilities(u, np.arange(len(index.items)))
    return f[0] + p_ge @ np.diff(f)


@pytest.mark.parametrize("relevance", ["linear", "log", "exp"])
def test_score_is_eq4_as_one_product(relevance):
    index = DCRIndex.from_artifact(artifact(relevance=relevance))
    for u in range(len(index.users)):
        np.testing.assert_allclose(index.score_users(np.array([u]))[0], brute_force_sc(index, u), rtol=1e-5)
        items = np.array([4, 0, 9])
        np.testing.assert_allclose(index.score_items(u, items), brute_force_sc(index, u)[items], rtol=1e-5)
    assert index.score_users(np.arange(3)).dtype == np.float32


def test_weights_for_the_three_relevance_functions():
    levels = np.array([1.0, 2.0, 3.0])
    c, offset = level_weights(levels, "linear")
    np.testing.assert_allclose(c, [0.5, 0.5])
    assert offset == pytest.approx(2.0)  # P = 1/2 everywhere gives the middle of the scale
    c, _ = level_weights(levels, "log")
    np.testing.assert_allclose(c, np.diff(np.log(levels)) / 2)
    c, _ = level_weights(levels, "exp")
    np.testing.assert_allclose(c, np.diff(np.exp(levels)) / 2)
    with pytest.raises(ValueError):
        relevance_values(np.array([0.0, 1.0]), "log")


def test_recommend_is_the_exact_top_n_and_honours_exclude_and_candidates():
    index = build_index(artifact(n_items=40))
    scores = index.score_users(np.array([2]))[0]
    rows, values = index.recommend(2, 5)
    assert rows.tolist() == np.argsort(-scores, kind="stable")[:5].tolist()
    np.testing.assert_allclose(values, scores[rows])
    seen = index.seen(2)
    rows, _ = index.recommend(2, 40, exclude=seen)
    assert not set(rows.tolist()) & set(seen.tolist()) and rows.size == 40 - seen.size
    cands = np.array([3, 17, 25, 8])
    rows, _ = index.recommend(2, 2, candidates=cands)
    assert rows.tolist() == cands[np.argsort(-scores[cands], kind="stable")[:2]].tolist()


def test_batch_equals_single_calls():
    index = DCRIndex.from_artifact(artifact(n_items=30))
    users = np.array([0, 3, 3, 6])
    excludes = [index.seen(int(u)) for u in users]
    batch = index.recommend_many(users, 4, excludes=excludes)
    for u, ex, (rows, vals) in zip(users, excludes, batch):
        r, v = index.recommend(int(u), 4, exclude=ex)
        assert rows.tolist() == r.tolist()
        np.testing.assert_allclose(vals, v, rtol=1e-6)


def test_distribution_rows_are_distributions_and_eq3_when_monotone():
    index = DCRIndex.from_artifact(artifact())
    dist = index.distribution(1, np.arange(11))
    assert dist.shape == (11, 5)
    assert np.all(dist >= 0) and np.allclose(dist.sum(axis=1), 1, atol=1e-6)
    p = np.array([[0.9, 0.6, 0.3, 0.1]])
    np.testing.assert_allclose(monotone_distribution(p), [[0.1, 0.3, 0.3, 0.2, 0.1]], atol=1e-6)


@settings(max_examples=50, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 9)), elements=st.floats(-0.5, 1.5)))
def test_monotone_distribution_is_always_a_distribution(p_ge):
    dist = monotone_distribution(p_ge)
    assert dist.shape == (p_ge.shape[0], p_ge.shape[1] + 1)
    assert np.all(dist >= -1e-7)
    np.testing.assert_allclose(dist.sum(axis=1), 1.0, atol=1e-6)
    sorted_p = -np.sort(-np.clip(p_ge, 0, 1), axis=1)
    if np.array_equal(sorted_p, np.clip(p_ge, 0, 1)):  # already monotone: plain Eq. 3
        full = np.concatenate([np.ones((p_ge.shape[0], 1)), sorted_p, np.zeros((p_ge.shape[0], 1))], axis=1)
        np.testing.assert_allclose(dist, full[:, :-1] - full[:, 1:], atol=1e-6)


def test_popularity_fallback_and_registry_of_kinds():
    index = index_class("dcr").from_artifact(artifact(n_items=12))
    rows, _ = index.popular(3)
    assert rows.tolist() == np.argsort(-index.popularity, kind="stable")[:3].tolist()


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(arrays={"user_factors": np.zeros((7, 5), np.float32)}), "do not match"),
        (dict(arrays={"item_factors": np.full((11, 12), np.nan, np.float32)}), "NaN"),
        (dict(attributes={"levels": [3.0, 2.0, 1.0]}), "increasing"),
        (dict(attributes={"levels": [5.0]}), "increasing"),
        (dict(attributes={"relevance": "cubic"}), "relevance"),
        (dict(attributes={"rank": "x"}), "attribute"),
    ],
)
def test_bad_artifacts_are_refused_with_a_clear_error(change, match):
    with pytest.raises(ArtifactError, match=match):
        DCRIndex.from_artifact(artifact(**change))


def test_wrong_kind_is_refused():
    a = artifact()
    a.kind = "coe"
    with pytest.raises(ArtifactError, match="expected kind"):
        DCRIndex.from_artifact(a)
