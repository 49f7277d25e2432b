"""Top-k selection and id maps: property tests against plain numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ordrec.service.indices import topk
from ordrec.service.indices.models.base import PointSet
from ordrec.service.indices.topk import affine_scores, nearest_brute_force, top_k, top_k_rows
from ordrec.service.storage.idmap import IdMap

scores_strategy = hnp.arrays(
    np.float32,
    st.integers(0, 300),
    elements=st.one_of(st.floats(-1e6, 1e6, width=32), st.just(float("-inf"))),
)


def reference_top_k(scores, k):
    finite = [i for i in range(scores.size) if scores[i] > -np.inf]
    order = sorted(finite, key=lambda i: (-scores[i], i))  # ties: lower index first
    return np.array(order[:k], dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(scores=scores_strategy, k=st.integers(1, 200))
def test_top_k_matches_a_stable_sort(scores, k):
    rows, values = top_k(scores, k)
    expected = reference_top_k(scores, k)
    np.testing.assert_array_equal(rows, expected)
    np.testing.assert_array_equal(values, scores[expected])


def test_top_k_skips_nan_and_excluded():
    scores = np.array([np.nan, 1.0, -np.inf, 3.0], np.float32)
    rows, values = top_k(scores, 10)
    assert rows.tolist() == [3, 1]


def test_top_k_of_nothing():
    rows, values = top_k(np.empty(0, np.float32), 5)
    assert rows.size == 0 and values.size == 0


@given(st.lists(st.text(min_size=1, max_size=8), max_size=50))
def test_idmap_from_values_round_trips(values):
    ids, rows = IdMap.from_values(values)
    assert rows.dtype == np.int32
    assert ids.externals(rows) == values
    assert len(ids) == len(set(values))
    assert all(ids.row(v) == r for v, r in zip(values, rows))
    assert ids.row("\0never") == -1


def test_idmap_refuses_duplicates():
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        IdMap(["a", "b", "a"])


@settings(max_examples=100, deadline=None)
@given(scores=scores_strategy, k=st.integers(1, 20), data=st.data())
def test_top_k_exclude_is_minus_infinity(scores, k, data):
    exclude = np.array(
        data.draw(st.lists(st.integers(0, max(scores.size - 1, 0)), max_size=10)) if scores.size else [],
        dtype=np.int64,
    )
    masked = scores.copy()
    masked[exclude] = -np.inf
    expected = reference_top_k(masked, k)
    rows, values = top_k(scores.copy(), k, exclude)
    np.testing.assert_array_equal(rows, expected)


@pytest.mark.parametrize("shape", [(50, 7), (3000, 800)])  # below and above the hold-the-GIL cut-off
def test_affine_scores_is_matrix_vector_plus_offset(shape):
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal(shape).astype(np.float32)
    vector = rng.standard_normal(shape[1]).astype(np.float32)
    got = affine_scores(matrix, vector, 1.5)
    assert got.dtype == np.float32 and got.shape == (shape[0],)
    np.testing.assert_allclose(got, matrix.astype(np.float64) @ vector + 1.5, rtol=1e-4, atol=1e-4)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 200), dim=st.integers(1, 4), k=st.integers(1, 15), seed=st.integers(0, 2**16))
def test_brute_force_and_kd_tree_nearest_agree(n, dim, k, seed):
    rng = np.random.default_rng(seed)
    coords = rng.standard_normal((n, dim))
    point = rng.standard_normal(dim)
    exclude = np.unique(rng.integers(0, n, size=min(3, n)))
    points = PointSet(IdMap([str(i) for i in range(n)]), coords)
    brute_rows, brute = nearest_brute_force(coords, point, k, exclude)
    tree_rows, tree = PointSet.nearest_kd_tree(points, point, k, exclude)
    dist = np.sqrt(((coords - point) ** 2).sum(axis=1))
    dist[exclude] = np.inf
    expected = np.sort(dist)[: min(k, n - exclude.size)]
    np.testing.assert_allclose(-brute, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(-tree, expected, rtol=1e-5, atol=1e-6)
    assert not set(brute_rows.tolist()) & set(exclude.tolist())
    assert not set(tree_rows.tolist()) & set(exclude.tolist())


def test_warm_up_compiles_what_read_only_artifacts_need():
    """Memory-mapped factors are read-only arrays, a type of their own to numba: warm_up must
    compile those kernels too, or the first request (or the server's start) compiles them."""
    topk.warm_up()
    compiled = topk.compiled_signatures()
    assert sum(compiled.values()) > 0  # warm_up compiled (or loaded) the kernels

    def read_only(array):
        array.flags.writeable = False
        return array

    matrix = read_only(np.ones((3, 2), np.float32))
    affine_scores(matrix, np.ones(2, np.float32))
    affine_scores(matrix, read_only(np.ones(2, np.float32)))
    affine_scores(np.ones((3, 2), np.float32), read_only(np.ones(2, np.float32)))
    nearest_brute_force(read_only(np.ones((3, 2))), read_only(np.ones(2)), 1)
    nearest_brute_force(read_only(np.ones((3, 2))), np.ones(2), 1)
    top_k(np.ones(3, np.float32), 1, exclude=read_only(np.zeros(1, np.int64)))
    top_k_rows(np.ones((2, 3), np.float32), np.ones(2, np.int64), read_only(np.zeros(3, bool)))
    assert topk.compiled_signatures() == compiled
