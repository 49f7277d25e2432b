"""RTF serving index: fast path vs the full sum, user cache, fallbacks, own-tag exclusion."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.indices.models import build_index, index_class
from ordrec.service.indices.models.rtf import RTFIndex
from ordrec.service.storage.artifact import Artifact, ArtifactError
from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.models import rtf_kernels as K
from ordrec.trainer.models.rtf import RTF
from ordrec.trainer.sample import planted_tags


@pytest.fixture(scope="module")
def fitted():
    data = planted_tags(n_users=40, n_items=30, n_tags=25, seed=3)
    est = RTF(n_components=(4, 5, 6), max_iter=4, random_state=0, verbose=False).fit(data)
    return data, est, est.to_artifact()


def test_index_class_and_rpcs(fitted):
    assert index_class("rtf") is RTFIndex
    assert RTFIndex.rpcs == frozenset({"Tags"})
    index = build_index(fitted[2])  # smoke-tested
    assert index.sizes()["tags"] == 25


def test_fast_path_equals_full_sum(fitted):
    _, est, artifact = fitted
    index = RTFIndex.from_artifact(artifact)
    for u, i in [(0, 0), (7, 3), (39, 29)]:
        naive = K.naive_tag_scores(
            index.core.astype(np.float64),
            index.user_factors[u].astype(np.float64),
            index.item_factors[i].astype(np.float64),
            index.tag_factors.astype(np.float64),
        )
        np.testing.assert_allclose(index.scores(u, i), naive, rtol=1e-4, atol=1e-6)
        batch = index.score_posts(np.array([u]), np.array([i]))[0]
        np.testing.assert_allclose(batch, naive, rtol=1e-4, atol=1e-6)
        rows, scores, fallback = index.tags(u, i, 5)
        assert fallback == "none"
        assert rows.tolist() == np.argsort(-naive, kind="stable")[:5].tolist()


def test_user_cache_is_bounded_and_warm_answers_match(fitted):
    index = RTFIndex(fitted[2], cache_users=3)
    cold = [index.tags(u, 1, 6) for u in range(8)]
    assert len(index.cache) == 3
    assert index.cache.misses == 8
    warm = [index.tags(u, 1, 6) for u in range(5, 8)]
    assert index.cache.hits == 3
    for (r1, s1, _), (r2, s2, _) in zip(cold[5:], warm):
        assert r1.tolist() == r2.tolist()
        np.testing.assert_array_equal(s1, s2)
    # scores handed out must not alias the cached matrix
    rows, scores, _ = index.tags(7, 1, 6)
    scores[:] = -1
    assert index.tags(7, 1, 6)[1].tolist() == warm[-1][1].tolist()


def test_cache_is_thread_safe(fitted):
    index = RTFIndex(fitted[2], cache_users=4)
    want = {(u, i): index.tags(u, i, 5)[0].tolist() for u in range(12) for i in range(0, 30, 7)}
    index.cache.clear()
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(300):
            u, i = int(rng.integers(12)), int(rng.choice(range(0, 30, 7)))
            if index.tags(u, i, 5)[0].tolist() != want[(u, i)]:
                errors.append((u, i))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(index.cache) <= 4


def test_fallbacks_follow_popularity(fitted):
    data, est, artifact = fitted
    index = RTFIndex.from_artifact(artifact)
    # unknown user: the item's most used tags first, by training counts
    item = 2
    rows, scores, fallback = index.tags(-1, item, 3)
    assert fallback == "popular_item"
    lo, hi = index.item_tag_indptr[item], index.item_tag_indptr[item + 1]
    counts = dict(zip(index.item_tag_indices[lo:hi].tolist(), index.item_tag_counts[lo:hi].tolist()))
    assert counts[int(rows[0])] == max(counts.values())
    assert np.all(np.diff(scores) <= 0)
    rows, _, fallback = index.tags(4, -1, 3)
    assert fallback == "popular_user"
    rows, scores, fallback = index.tags(-1, -1, 3)
    assert fallback == "popular_global"
    assert rows[0] == int(np.argmax(index.tag_popularity))
    # a list is always full when enough tags exist (item lists are topped up by global order)
    assert index.tags(-1, item, 20)[0].size == 20


def test_popularity_arrays_count_training_posts(fitted):
    data, est, artifact = fitted
    index = RTFIndex.from_artifact(artifact)
    compact = data.compact()
    trip = {(int(u), int(i), int(t)) for u, i, t in zip(compact.user, compact.item, compact.tag)}
    want = np.zeros(len(compact.tags))
    for _, _, t in trip:
        want[t] += 1
    np.testing.assert_array_equal(index.tag_popularity, want)
    user = 5
    lo, hi = index.user_tag_indptr[user], index.user_tag_indptr[user + 1]
    got = dict(zip(index.user_tag_indices[lo:hi].tolist(), index.user_tag_counts[lo:hi].tolist()))
    mine = {}
    for u, _, t in trip:
        if u == user:
            mine[t] = mine.get(t, 0) + 1
    assert got == mine


def test_exclude_own_tags_removes_exactly_the_training_post(fitted):
    data, est, artifact = fitted
    index = RTFIndex.from_artifact(artifact)
    compact = data.compact()
    u, i = int(compact.user[0]), int(compact.item[0])
    own = sorted(
        {int(t) for uu, ii, t in zip(compact.user, compact.item, compact.tag) if uu == u and ii == i}
    )
    assert index.own_tags(u, i).tolist() == own
    n = len(index.tags_ids)
    rows, _, _ = index.tags(u, i, n, exclude_own=True)
    assert set(rows.tolist()) == set(range(n)) - set(own)
    assert index.tags(u, i, n)[0].size == n
    # a pair without a training post has no own tags
    seen_items = {int(ii) for uu, ii in zip(compact.user, compact.item) if uu == u}
    other = next(x for x in range(len(index.items)) if x not in seen_items)
    assert index.own_tags(u, other).size == 0


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 40), u=st.integers(-1, 39), i=st.integers(-1, 29), exclude=st.booleans())
def test_tags_answer_properties(fitted, n, u, i, exclude):
    index = RTFIndex.from_artifact(fitted[2])
    rows, scores, fallback = index.tags(u, i, n, exclude_own=exclude)
    n_tags = len(index.tags_ids)
    assert (
        fallback
        == {
            (True, True): "none",
            (False, True): "popular_item",
            (True, False): "popular_user",
            (False, False): "popular_global",
        }[(u >= 0, i >= 0)]
    )
    excluded = index.own_tags(u, i).size if (exclude and u >= 0 and i >= 0) else 0
    assert rows.size == min(n, n_tags - excluded)
    assert len(set(rows.tolist())) == rows.size
    assert np.all((rows >= 0) & (rows < n_tags))
    assert np.all(np.isfinite(scores)) and np.all(np.diff(scores) <= 0)


def test_corrupt_artifacts_are_refused(fitted):
    artifact = fitted[2]
    arrays = dict(artifact.arrays)
    arrays["tag_factors"] = arrays["tag_factors"][:-1]
    with pytest.raises(ArtifactError, match="tag_factors"):
        RTFIndex.from_artifact(Artifact("rtf", arrays, artifact.ids))
    arrays = dict(artifact.arrays)
    bad = arrays["core"].copy()
    bad[0, 0, 0] = np.nan
    arrays["core"] = bad
    with pytest.raises(ArtifactError, match="NaN"):
        RTFIndex.from_artifact(Artifact("rtf", arrays, artifact.ids))
    arrays = dict(artifact.arrays)
    tags = arrays["post_tags"].copy()
    tags[0] = 10_000
    arrays["post_tags"] = tags
    with pytest.raises(ArtifactError, match="post_tags"):
        RTFIndex.from_artifact(Artifact("rtf", arrays, artifact.ids))
    with pytest.raises(ArtifactError, match="kind"):
        RTFIndex.from_artifact(Artifact("dcr", artifact.arrays, artifact.ids))


def test_tag_names_absent_means_none(fitted):
    index = RTFIndex.from_artifact(fitted[2])
    assert index.tag_names([0]) is None
    assert isinstance(index.tags_ids, IdMap)
