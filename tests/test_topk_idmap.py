"""Top-k selection and id maps: property tests against plain numpy."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from service.idmap import IdMap
from service.topk import top_k

scores_strategy = hnp.arrays(
    np.float32, st.integers(0, 300),
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
