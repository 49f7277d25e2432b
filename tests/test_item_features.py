"""Similar items, explanations and diversity at the index level: exact search against brute force
(hypothesis), the approximate item index honouring every rule, planted explanations, MMR."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.indices.diversity import (
    AttributeCap,
    Diversify,
    mmr_compiled,
    mmr_cosine,
    mmr_order,
    rerank,
)
from ordrec.service.indices.explain import explain, explained
from ordrec.service.indices.models import build_index
from ordrec.service.indices.rules import Eligible
from ordrec.service.indices.similar import (
    intra_list_diversity,
    pairwise_distances,
    pairwise_similarity,
    similar_items,
)
from ordrec.service.storage.artifact import Artifact
from ordrec.service.storage.idmap import IdMap
from tests.test_rules import dcr_artifact


def coe_artifact(n_users=5, n_items=60, seed=0, item_coords=None, seen=None) -> Artifact:
    rng = np.random.default_rng(seed)
    coords = rng.normal(size=(n_items, 2)) if item_coords is None else item_coords
    seen = seen if seen is not None else [rng.choice(n_items, 3, replace=False) for _ in range(n_users)]
    return Artifact(
        "coe",
        {
            "user_coords": rng.normal(size=(n_users, 2)),
            "item_coords": coords,
            "seen_indptr": np.concatenate([[0], np.cumsum([len(s) for s in seen])]).astype(np.int64),
            "seen_indices": np.concatenate(seen).astype(np.int32),
            "item_popularity": np.ones(len(coords), np.float32),
        },
        {
            "users": IdMap([f"u{i}" for i in range(n_users)]),
            "items": IdMap([f"i{i}" for i in range(len(coords))]),
        },
        hyperparameters={"dim": 2, "function": "sigmoid"},
    )


DCR = build_index(dcr_artifact())
COE = build_index(coe_artifact())


def brute_force_similarity(index, query: np.ndarray) -> np.ndarray:
    """The documented similarity, the slow way: level by level (DCR), point by point (COE)."""
    if index.kind == "dcr":
        L, rank = index.n_levels, index.rank
        v = index.item_factors.astype(np.float64).reshape(-1, L, rank)
        return np.array(
            [
                np.mean([sum(index.weights[t] * v[q, t] @ v[j, t] for t in range(L)) for q in query])
                for j in range(len(v))
            ]
        )
    x = index.item_coords
    return np.array([-np.mean([np.linalg.norm(x[j] - x[q]) for q in query]) for j in range(len(x))])


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["dcr", "coe"]),
    query=st.lists(st.integers(0, 59), min_size=1, max_size=4),
    n=st.integers(1, 70),
    excluded=st.lists(st.integers(0, 59), max_size=30),
    blocked_share=st.sampled_from([0.0, 0.1, 0.5, 0.95]),
    seed=st.integers(0, 2**31),
)
def test_similar_items_is_the_exact_top_n_with_every_rule(kind, query, n, excluded, blocked_share, seed):
    index = DCR if kind == "dcr" else COE
    rng = np.random.default_rng(seed)
    blocked = rng.random(60) < blocked_share
    eligible = Eligible(blocked.copy()) if blocked_share else None
    exclude = np.array(excluded, dtype=np.int64)
    rows, scores = similar_items(index, np.array(query), n, exclude=exclude, eligible=eligible)
    allowed = ~blocked
    allowed[exclude] = False
    allowed[query] = False
    expected = brute_force_similarity(index, np.unique(query))  # a basket is a set
    want = np.sort(expected[allowed])[::-1][:n]
    assert len(rows) == len(want) == min(n, int(allowed.sum()))
    assert allowed[rows].all(), "an excluded, blocked or query item came back"
    np.testing.assert_allclose(scores, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(scores, expected[rows], rtol=1e-4, atol=1e-5)


def test_filters_from_attributes_are_honoured():
    eligible = DCR.item_attributes.eligible('genre in ("Comedy") and year >= 1980')
    rows, _ = similar_items(DCR, np.array([3]), 60, eligible=eligible)
    assert rows.size == int((~eligible.blocked).sum()) - int(not eligible.blocked[3])
    assert not eligible.blocked[rows].any() and 3 not in rows


# ---------------------------------------------------- the approximate item index
@pytest.fixture(scope="module")
def graph_served(tmp_path_factory):
    from tests.test_catalog import served_clustered

    return served_clustered(tmp_path_factory.mktemp("similar-catalog"))


def exact_basket_scores(served, query) -> np.ndarray:
    factors = served.item_factors.astype(np.float64)
    return factors @ (factors[np.unique(query)].mean(axis=0) * served.level_scale)


@settings(max_examples=40, deadline=None)
@given(
    query=st.lists(st.integers(0, 9_999), min_size=1, max_size=3),
    n=st.integers(1, 50),
    blocked_share=st.sampled_from([0.0, 0.01, 0.3]),
    seed=st.integers(0, 2**31),
)
def test_the_item_index_honours_every_rule(graph_served, query, n, blocked_share, seed):
    served = graph_served
    n_items = len(served.items)
    query = [q % n_items for q in query]
    rng = np.random.default_rng(seed)
    blocked = rng.random(n_items) < blocked_share
    eligible = Eligible(blocked.copy()) if blocked_share else None
    exclude = rng.choice(n_items, 20, replace=False)
    rows, scores = similar_items(served, np.array(query), n, exclude=exclude, eligible=eligible)
    allowed = ~blocked
    allowed[exclude] = False
    allowed[query] = False
    assert len(rows) == n and allowed[rows].all()
    np.testing.assert_allclose(scores, exact_basket_scores(served, query)[rows], rtol=1e-3, atol=1e-4)


def test_the_item_index_finds_most_exact_neighbours(graph_served):
    served = graph_served
    rng = np.random.default_rng(1)
    recalls = []
    for q in rng.choice(len(served.items), 100, replace=False):
        rows, _ = similar_items(served, np.array([q]), 10)
        exact = exact_basket_scores(served, [q])
        exact[q] = -np.inf
        recalls.append(len(set(np.argsort(-exact)[:10].tolist()) & set(rows.tolist())) / 10)
    assert np.mean(recalls) >= 0.9, np.mean(recalls)


# ----------------------------------------------------------------- explanations
def planted_dcr(seed: int = 0):
    """Unit-norm item factors (per level); item 0 a copy of item 1, which only user 0 has seen."""
    art, history = planted_dcr_artifact(seed)
    return build_index(art), history


def planted_dcr_artifact(seed: int = 0) -> tuple[Artifact, np.ndarray]:
    """:func:`planted_dcr`'s artifact and the history of its users (every user's the same)."""
    rng = np.random.default_rng(seed)
    art = dcr_artifact(seed=seed)
    item = art.arrays["item_factors"].reshape(60, 4, 3).astype(np.float64)
    item /= np.linalg.norm(item, axis=2, keepdims=True)
    item[0] = item[1]
    user = item[1].reshape(1, -1).repeat(6, axis=0) * 0.9
    art.arrays["item_factors"] = item.reshape(60, -1).astype(np.float32)
    art.arrays["user_factors"] = user.astype(np.float32)
    history = np.concatenate([[1], rng.choice(np.arange(2, 60), 9, replace=False)])
    art.arrays["seen_indptr"] = np.array([0] + [10] * 6, dtype=np.int64)
    art.arrays["seen_indices"] = history.astype(np.int32)
    return art, history


@pytest.mark.parametrize("seed", range(5))
def test_dcr_names_the_planted_cause_first(seed):
    index, history = planted_dcr(seed)
    rows, _ = index.recommend(0, 5, exclude=index.seen(0))
    assert rows[0] == 0, "the copy of the user's history item is their best item"
    reasons = explain(index, rows, index.seen(0), 3)
    assert reasons[0][0].row == 1
    assert all(r.row in set(history.tolist()) for why in reasons for r in why)
    for why in reasons:
        shares = [r.share for r in why]
        assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-6
        assert all(0 < s <= 1 for s in shares)


def test_coe_names_the_nearest_rated_item_and_never_the_item_itself():
    rng = np.random.default_rng(3)
    coords = rng.normal(size=(40, 2)) * 5
    coords[0] = coords[7] + 0.01  # item 0 sits on history item 7
    index = build_index(coe_artifact(n_items=40, item_coords=coords, seen=[np.array([7, 20, 30, 0])] * 5))
    reasons = explain(index, np.array([0, 20]), index.seen(0), 2)
    assert reasons[0][0].row == 7 and reasons[0][0].share > 0.5
    assert 0 not in [r.row for r in reasons[0]] and 20 not in [r.row for r in reasons[1]]
    assert reasons[0][0].similarity == pytest.approx(-0.01 * np.sqrt(2), rel=1e-3)


def brute_force_reasons(
    index, vectors: np.ndarray, item_rows, history, k
) -> list[list[tuple[int, float, float]]]:
    """The documented explanation, the slow way: every (item, history item) weight in float64,
    sorted; (history row, share, similarity) of the ``k`` largest positive ones."""
    answer = []
    for item, q in zip(item_rows, vectors.astype(np.float64)):
        found = []
        for h in sorted(set(history)):
            if h == item:
                continue
            if index.kind == "dcr":
                sim = float(np.sum(index.weights.repeat(index.rank) * q * index.item_factors[h]))
                weight = max(sim, 0.0)
            else:
                sim = -float(np.linalg.norm(q - index.item_coords[h]))
                weight = 1.0 / (-sim + 1e-6)
            if weight > 0:
                found.append((h, weight, sim))
        total = sum(w for _, w, _ in found)
        found.sort(key=lambda f: -f[1])
        answer.append([(h, w / total, sim) for h, w, sim in found[:k]])
    return answer


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["dcr", "coe"]),
    items=st.lists(st.integers(0, 63), min_size=1, max_size=12),
    history=st.lists(st.integers(0, 59), max_size=40),
    k=st.integers(1, 6),
    seed=st.integers(0, 2**31),
)
def test_explanations_are_the_documented_weights(kind, items, history, k, seed):
    """The compiled kernel against the formula (docs/service.md, "Explanations"), for trained
    and fresh recommended items (rows 60-63), a history holding the item itself or repeats."""
    index = DCR if kind == "dcr" else COE
    trained = index.item_factors if kind == "dcr" else index.item_coords
    fresh = np.random.default_rng(seed).normal(scale=0.4, size=(4, trained.shape[1])).astype(trained.dtype)
    rows = np.array(items, dtype=np.int64)
    vectors = np.concatenate([trained, fresh])[rows]
    got = explained(index, rows, np.array(history, dtype=np.int64), k, fresh)
    want = brute_force_reasons(index, vectors, items, history, k)
    for i, expected in enumerate(want):
        named = [r for r in got.rows[i].tolist() if r >= 0]
        assert len(named) == len(expected) and len(set(named)) == len(named)
        assert got.rows[i, len(named) :].tolist() == [-1] * (k - len(named))
        np.testing.assert_allclose(
            got.shares[i, : len(named)], [e[1] for e in expected], rtol=1e-4, atol=1e-6
        )
        by_row = {
            h: (share, sim)
            for h, share, sim in brute_force_reasons(
                index, vectors[i : i + 1], items[i : i + 1], history, 60
            )[0]
        }
        for row, share, sim in zip(named, got.shares[i].tolist(), got.similarities[i].tolist()):
            assert row != items[i] and row in by_row  # a positive weight, never the item itself
            assert share == pytest.approx(by_row[row][0], rel=1e-4, abs=1e-6)
            assert sim == pytest.approx(by_row[row][1], rel=1e-4, abs=1e-5)


@settings(max_examples=100, deadline=None)
@given(size=st.integers(0, 30), dim=st.integers(1, 70), seed=st.integers(0, 2**31))
def test_pairwise_distances_are_euclidean(size, dim, seed):
    points = np.random.default_rng(seed).normal(size=(size, dim))
    expected = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=2)
    np.testing.assert_allclose(pairwise_distances(points), expected, rtol=1e-12, atol=1e-12)


def test_no_history_or_no_positive_weight_names_nothing():
    assert explain(DCR, np.array([1, 2]), np.array([], dtype=np.int64), 3) == [[], []]
    assert explain(DCR, np.array([1]), np.array([5]), 0) == [[]]


# -------------------------------------------------------------------- diversity
@settings(max_examples=200, deadline=None)
@given(scores=st.lists(st.floats(-5, 5), min_size=1, max_size=40), n=st.integers(1, 40))
def test_mmr_at_zero_keeps_the_models_order(scores, n):
    ordered = np.sort(np.array(scores))[::-1]
    sim = np.random.default_rng(0).random((len(scores), len(scores)))
    assert mmr_order(ordered, sim, 0.0, n) == list(range(min(n, len(scores))))


def test_rerank_at_zero_is_the_plain_top_n():
    pool = DCR.recommend(0, 25)
    rows, scores = rerank(DCR, pool, 5, Diversify(0.0))
    np.testing.assert_array_equal(rows, DCR.recommend(0, 5)[0])


def test_diversity_reaches_the_other_cluster():
    """Two tight clusters; the first ten by score all in cluster A: MMR brings in cluster B."""
    coords = np.concatenate([np.zeros((30, 2)) + [0, 0], np.zeros((30, 2)) + [10, 0]])
    coords += np.random.default_rng(0).normal(scale=0.1, size=coords.shape)
    index = build_index(coe_artifact(n_items=60, item_coords=coords, seen=[np.array([], int)] * 5))
    pool = (np.arange(50), np.linspace(1, 0, 50).astype(np.float32))  # A (0-29) ranks above B
    plain, _ = rerank(index, pool, 10, Diversify(0.0))
    diverse, _ = rerank(index, pool, 10, Diversify(0.5))
    assert (plain < 30).all() and (diverse >= 30).any()
    assert intra_list_diversity(index, diverse) > intra_list_diversity(index, plain)
    assert np.allclose(np.diag(pairwise_similarity(index, diverse)), 1.0)


@settings(max_examples=60, deadline=None)
@given(limit=st.integers(1, 4), weight=st.sampled_from([0.0, 0.3, 1.0]), user=st.integers(0, 5))
def test_the_attribute_cap_is_honoured(limit, weight, user):
    pool = DCR.recommend(user, 50)
    rows, _ = rerank(DCR, pool, 10, Diversify(weight, AttributeCap("genre", limit)))
    counts: dict = {}
    for values in DCR.item_attributes.item_values("genre", rows):
        for v in values:
            counts[v] = counts.get(v, 0) + 1
    assert max(counts.values(), default=0) <= limit
    assert len(set(rows.tolist())) == len(rows) and set(rows.tolist()) <= set(pool[0].tolist())


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 40),
    n=st.integers(1, 40),
    weight=st.floats(0, 1),
    seed=st.integers(0, 2**31),
)
def test_the_compiled_mmr_picks_what_the_reference_picks(size, n, weight, seed):
    rng = np.random.default_rng(seed)
    relevance = np.sort(rng.normal(size=size))[::-1]
    x = rng.normal(size=(size, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    similarity = x @ x.T
    picks = mmr_order(relevance, similarity, weight, n)
    assert mmr_compiled(relevance, similarity, weight, n).tolist() == picks
    # DCR's path: the cosines computed on the fly from the vectors, the same picks
    assert mmr_cosine(relevance, x, weight, n).tolist() == picks
