"""Top-k selection and id maps: property tests against plain numpy."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ordrec.service.indices import topk
from ordrec.service.indices.models.base import PointSet
from ordrec.service.indices.topk import (
    KERNEL_MAX_K,
    affine_rows,
    affine_scores,
    nearest_brute_force,
    top_k,
    top_k_rows,
    user_top_k,
)
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


@settings(max_examples=300, deadline=None)
@given(scores=scores_strategy, k=st.integers(1, 200), data=st.data())
def test_top_k_leaves_out_excluded_and_blocked_rows_and_writes_nothing(scores, k, data):
    """Exclusions in any order, repeated, with or without a mask, below and above the kernel's
    k: the answer is the sort's of the rest, and no argument changes (callers pass shared arrays,
    e.g. the gate's popularity counts, which an in-place exclusion once wiped out)."""
    rows_drawn = (
        st.lists(st.integers(0, max(scores.size - 1, 0)), max_size=10) if scores.size else st.just([])
    )
    exclude = np.array(data.draw(rows_drawn), dtype=np.int64)
    blocked = data.draw(st.one_of(st.none(), hnp.arrays(np.bool_, scores.size)))
    masked = scores.copy()
    masked[exclude] = -np.inf
    if blocked is not None:
        masked[blocked] = -np.inf
    arguments = [scores, exclude] + ([] if blocked is None else [blocked])
    before = [a.copy() for a in arguments]
    rows, values = top_k(scores, k, exclude, blocked)
    np.testing.assert_array_equal(rows, reference_top_k(masked, k))
    np.testing.assert_array_equal(values, scores[rows])
    for after, was in zip(arguments, before):
        np.testing.assert_array_equal(after, was)


def test_top_k_takes_read_only_scores_with_exclusions():
    scores = np.array([3.0, 2.0, 1.0, 0.5], np.float32)
    scores.flags.writeable = False
    rows, _ = top_k(scores, 2, np.array([0], np.int64), np.array([False, True, False, False]))
    assert rows.tolist() == [2, 3]


@pytest.mark.parametrize("shape", [(50, 7), (3000, 800)])  # below and above the hold-the-GIL cut-off
def test_affine_scores_is_matrix_vector_plus_offset(shape):
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal(shape).astype(np.float32)
    vector = rng.standard_normal(shape[1]).astype(np.float32)
    got = affine_scores(matrix, vector, 1.5)
    assert got.dtype == np.float32 and got.shape == (shape[0],)
    np.testing.assert_allclose(got, matrix.astype(np.float64) @ vector + 1.5, rtol=1e-4, atol=1e-4)


def _three_step_top_k(matrix, users, row, scale, offset, k, exclude, blocked):
    """What the fused kernel replaces: scale, product, exclusions and selection apart."""
    scores = affine_rows(matrix, (users[row] * scale).reshape(1, -1), offset)[0]
    return top_k(scores, k, exclude, blocked)


@settings(max_examples=150, deadline=None)
@given(
    n_items=st.integers(0, 700),  # past a 256-row block of the product
    width=st.integers(1, 24),
    k=st.integers(1, KERNEL_MAX_K),
    seed=st.integers(0, 2**16),
    n_excluded=st.integers(0, 40),
    blocked_share=st.sampled_from([None, 0.0, 0.3, 0.9, 1.0]),
    ties=st.booleans(),
)
def test_user_top_k_is_the_three_steps_bitwise(n_items, width, k, seed, n_excluded, blocked_share, ties):
    """The one-user kernel returns the very rows and scores (bitwise, ties lower row first)
    that scaling, scoring, excluding and selecting one after the other do."""
    rng = np.random.default_rng(seed)
    matrix = rng.standard_normal((n_items, width)).astype(np.float32)
    if ties and n_items:  # repeated item rows: equal scores, where the order is the tie rule's
        matrix = matrix[rng.integers(0, n_items // 4 + 1, n_items)]
    users = rng.standard_normal((3, width)).astype(np.float32)
    scale = rng.uniform(0.1, 2.0, width).astype(np.float32)
    exclude = rng.integers(0, n_items, n_excluded).astype(np.int64) if n_items else np.zeros(0, np.int64)
    blocked = None if blocked_share is None else rng.random(n_items) < blocked_share
    got = user_top_k(matrix, users, 1, scale, 0.25, k, exclude, blocked)
    expected = _three_step_top_k(matrix, users, 1, scale, 0.25, k, exclude, blocked)
    np.testing.assert_array_equal(got[0], expected[0])
    assert got[1].tobytes() == expected[1].tobytes()
    assert not set(got[0].tolist()) & set(exclude.tolist())


def test_user_top_k_on_a_catalogue_long_enough_to_release_the_gil():
    """Above the hold-the-GIL cut-off the releasing kernel answers, with the same result."""
    rng = np.random.default_rng(3)
    matrix = rng.standard_normal((20_000, 128)).astype(np.float32)  # 2.56 M > 2^21 multiply-adds
    users = rng.standard_normal((2, 128)).astype(np.float32)
    scale = np.ones(128, np.float32)
    exclude = np.arange(0, 20_000, 7, dtype=np.int64)
    got = user_top_k(matrix, users, 0, scale, -1.0, 50, exclude)
    expected = _three_step_top_k(matrix, users, 0, scale, -1.0, 50, exclude, None)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


@pytest.mark.parametrize("k", [0, KERNEL_MAX_K + 1])
def test_user_top_k_refuses_a_k_its_buffer_does_not_hold(k):
    with pytest.raises(ValueError, match="selects 1..128"):
        user_top_k(
            np.ones((3, 2), np.float32), np.ones((1, 2), np.float32), 0, np.ones(2, np.float32), 0.0, k
        )


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


_FUSED_THEN_PLAIN = """
import numpy as np
from ordrec.service.indices.topk import top_k, user_top_k
matrix = np.arange(8, dtype=np.float32).reshape(4, 2)
rows, _ = user_top_k(matrix, np.ones((1, 2), np.float32), 0, np.ones(2, np.float32), 0.0, 4, exclude=np.array([0, 3]))
assert sorted(rows.tolist()) == [1, 2], rows
rows, scores = top_k(np.array([-np.inf, 1.0], np.float32), 2)
assert rows.tolist() == [1] and np.isfinite(scores).all(), (rows, scores)
"""


def test_excluded_rows_never_come_back_after_the_fused_kernel_compiled_first(tmp_path):
    """The fused one-user kernel compiled first (a fresh numba cache) must leave the selection
    kernels honouring -inf: excluded rows never return, even when fewer than k remain."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _FUSED_THEN_PLAIN], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
