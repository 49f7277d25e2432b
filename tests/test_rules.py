"""Business rules: the filter language, attribute arrays, and eligibility against exact scoring."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.indices.models import build_index
from ordrec.service.indices.rules import (
    Eligible,
    FilterError,
    combine,
    encode_item_attributes,
    hidden_mask,
    parse_filter,
)
from ordrec.service.storage.artifact import Artifact, ArtifactError
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.registry import Registry

GENRES = ["Action", "Comedy", "Drama", "Horror"]


def columns(n_items: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    year = rng.integers(1950, 2020, n_items).astype(float)
    year[::7] = np.nan  # some items have no year
    price = np.round(rng.uniform(1, 40, n_items), 2)
    genre = [sorted(set(rng.choice(GENRES, rng.integers(0, 3)).tolist())) for _ in range(n_items)]
    return [
        {"name": "year", "type": "numeric", "values": year},
        {"name": "price", "type": "numeric", "values": price},
        {"name": "genre", "type": "categorical", "values": genre},
    ]


def dcr_artifact(n_users=6, n_items=60, rank=3, seed=0) -> Artifact:
    rng = np.random.default_rng(seed)
    levels = (1.0, 2.0, 3.0, 4.0, 5.0)
    width = (len(levels) - 1) * rank
    cols = columns(n_items, seed)
    arrays, meta = encode_item_attributes(cols, n_items)
    arrays.update(
        {
            "user_factors": (rng.normal(size=(n_users, width)) / 3).astype(np.float32),
            "item_factors": (rng.normal(size=(n_items, width)) / 3).astype(np.float32),
            "seen_indptr": np.arange(0, 2 * n_users + 1, 2, dtype=np.int64),
            "seen_indices": rng.integers(0, n_items, 2 * n_users).astype(np.int32),
            "item_popularity": rng.random(n_items).astype(np.float32),
        }
    )
    return Artifact(
        "dcr",
        arrays,
        {
            "users": IdMap([f"u{i}" for i in range(n_users)]),
            "items": IdMap([f"i{i}" for i in range(n_items)]),
        },
        attributes={"levels": list(levels), "relevance": "linear", "rank": rank, "item_attributes": meta},
    )


@pytest.fixture(scope="module")
def index():
    return build_index(dcr_artifact())


@pytest.fixture(scope="module")
def cols():
    return columns(60)


# -------------------------------------------------------------------- parsing
def test_parse_the_documented_example():
    clauses = parse_filter('genre in ("Comedy","Drama") and year >= 1990 AND price between 5 and 20')
    assert [(c.name, c.op, c.values) for c in clauses] == [
        ("genre", "in", ("Comedy", "Drama")),
        ("year", ">=", (1990.0,)),
        ("price", "between", (5.0, 20.0)),
    ]
    assert clauses[2].text == "price between 5 and 20"


@pytest.mark.parametrize(
    "text, clause, why",
    [
        ('genre in ("Comedy" "Drama")', 'clause 1 (\'genre in ("Comedy" "Drama")\')', "expected ',' or ')'"),
        ("year >= 1990 and price >= cheap", "clause 2 ('price >= cheap')", "expected a number"),
        ("year >= 1990 and price between 20 and 5", "clause 2", "low end is above"),
        ("year >= 1990 price < 3", "clause 1", "expected 'and' or the end"),
        ('year > "new"', "clause 1", "takes a number"),
        ("and year > 3", "clause 1", "expected an attribute name"),
        ("year ~ 3", "clause 1", "expected in, not in"),
    ],
)
def test_syntax_errors_name_the_clause(text, clause, why):
    with pytest.raises(FilterError) as err:
        parse_filter(text)
    assert clause in str(err.value) and why in str(err.value)


def test_attribute_errors_name_the_clause(index):
    attrs = index.item_attributes
    with pytest.raises(FilterError, match=r"clause 2 \('colour = \"red\"'\): no item attribute 'colour'"):
        attrs.eligible('year > 1 and colour = "red"')
    with pytest.raises(FilterError, match=r"clause 1 .*categorical"):
        attrs.eligible("genre >= 3")
    with pytest.raises(FilterError, match=r"clause 1 .*numeric"):
        attrs.eligible('price in ("cheap")')


def test_filters_select_what_they_say(index, cols):
    year, price, genre = cols[0]["values"], cols[1]["values"], cols[2]["values"]
    attrs = index.item_attributes
    ok = ~attrs.eligible('genre in ("Comedy", "Drama") and year >= 1990').blocked
    want = np.array([bool({"Comedy", "Drama"} & set(g)) and y >= 1990 for g, y in zip(genre, year)])
    np.testing.assert_array_equal(ok, want)
    ok = ~attrs.eligible("price between 5 and 20").blocked
    np.testing.assert_array_equal(ok, (price >= 5) & (price <= 20))
    ok = ~attrs.eligible('genre not in ("Horror") and year != 2000').blocked
    np.testing.assert_array_equal(ok, np.array(["Horror" not in g for g in genre]) & ~(year == 2000))
    # a value this version does not know matches nothing (it may come with the next version)
    assert attrs.eligible('genre = "Western"').blocked.all()
    assert attrs.eligible('genre = "Western"') is attrs.eligible('genre = "Western"')  # cached


def test_a_version_with_broken_attribute_arrays_is_refused():
    art = dcr_artifact()
    arrays = dict(art.arrays)
    arrays["itemattr_2_codes"] = np.full_like(arrays["itemattr_2_codes"], 99)
    art.arrays = arrays
    with pytest.raises(ArtifactError, match="bad item attribute"):
        build_index(art)


def test_attributes_survive_the_registry(tmp_path):
    registry = Registry(tmp_path)
    registry.publish("dcr", dcr_artifact())
    loaded = build_index(registry.load("dcr"))
    fresh = build_index(dcr_artifact())
    text = 'genre in ("Drama") and price < 30'
    np.testing.assert_array_equal(
        loaded.item_attributes.eligible(text).blocked, fresh.item_attributes.eligible(text).blocked
    )


# ------------------------------------------------------- eligibility vs exact
FILTERS = [
    "",
    'genre in ("Comedy", "Drama")',
    "year >= 1990",
    "price between 5 and 20",
    'genre = "Horror" and price < 10',
    "year < 1960",
    'genre not in ("Action") and year >= 1980',
]


def exact_answer(index, user, n, blocked, exclude):
    """The reference: score everything, drop the ineligible, sort (lower row first on ties)."""
    scores = index.score_users(np.array([user]))[0].astype(np.float64)
    allowed = ~blocked
    allowed[exclude] = False
    rows = np.flatnonzero(allowed)
    order = np.lexsort((rows, -scores[rows]))
    return rows[order][:n]


@settings(max_examples=150, deadline=None)
@given(
    user=st.integers(0, 5),
    n=st.integers(1, 60),
    filter_text=st.sampled_from(FILTERS),
    hidden=st.sets(st.integers(0, 70), max_size=40),
    excluded=st.sets(st.integers(0, 59), max_size=20),
    batch=st.booleans(),
)
def test_no_returned_item_is_hidden_excluded_or_filtered_out(
    index, user, n, filter_text, hidden, excluded, batch
):
    ids = frozenset(f"i{h}" for h in hidden)  # i60.. are unknown to this version: ignored
    eligible = combine(
        hidden_mask(index.items, [ids]), index.item_attributes.eligible(filter_text) if filter_text else None
    )
    exclude = np.array(sorted(excluded), dtype=np.int64)
    if batch:
        rows, _ = index.recommend_many(
            np.array([user, user]), n, excludes=[exclude, exclude], eligible=eligible
        )[1]
    else:
        rows, _ = index.recommend(user, n, exclude=exclude, eligible=eligible)
    blocked = eligible.blocked.copy() if eligible is not None else np.zeros(len(index.items), bool)
    want = exact_answer(index, user, n, blocked, exclude)
    # n come back whenever n are eligible, and they are the exact best ones
    np.testing.assert_array_equal(rows, want)
    assert not set(rows.tolist()) & ({h for h in hidden if h < 60} | excluded)


def test_popular_and_candidates_obey_the_rules(index):
    eligible = index.item_attributes.eligible('genre in ("Comedy")')
    allowed = set(eligible.rows.tolist())
    rows, _ = index.popular(200, eligible=eligible)  # k above the kernel's: the sorting path
    assert set(rows.tolist()) == allowed
    candidates = np.arange(0, 60, 2)
    rows, _ = index.recommend(0, 60, candidates=candidates, eligible=eligible)
    assert set(rows.tolist()) == allowed & set(candidates.tolist())


def test_selective_filter_scores_only_the_eligible_rows(index):
    sparse = Eligible(np.arange(60) != 7)
    assert sparse.sparse
    rows, scores = index.recommend(0, 5, eligible=sparse)
    assert rows.tolist() == [7]
    np.testing.assert_allclose(scores, index.score_items(0, np.array([7])), rtol=1e-6)


# ---------------------------------------------------- the approximate item index
@pytest.fixture(scope="module")
def graph_served(tmp_path_factory):
    from tests.test_catalog import served_clustered

    return served_clustered(tmp_path_factory.mktemp("rules-catalog"))


@settings(max_examples=100, deadline=None)
@given(
    user=st.integers(0, 199),
    n=st.integers(1, 120),
    blocked_share=st.sampled_from([0.0, 0.01, 0.04, 0.5, 0.97]),
    seed=st.integers(0, 2**31),
)
def test_the_graph_path_honours_the_rules(graph_served, user, n, blocked_share, seed):
    served = graph_served
    n_items = len(served.items)
    rng = np.random.default_rng(seed)
    # block some of the user's own best items (the hard case for a walk) and some at random
    best, _ = served.recommend_exact(user, 20)
    blocked = rng.random(n_items) < blocked_share
    blocked[best[: int(20 * blocked_share) + 1]] = blocked_share > 0
    eligible = Eligible(blocked) if blocked.any() else None
    exclude = served.seen(user)
    rows, scores = served.recommend(user, n, exclude=exclude, eligible=eligible)
    allowed = ~blocked
    allowed[exclude] = False
    assert rows.size == min(n, int(allowed.sum()))
    assert allowed[rows].all()
    np.testing.assert_allclose(scores, served.score_items(user, rows), rtol=1e-5, atol=1e-5)
    assert np.all(np.diff(scores) <= 1e-6)


@pytest.mark.parametrize("share", [0.03, 0.5, 0.85])
def test_the_graph_path_stays_close_to_exact_with_hidden_items(graph_served, monkeypatch, share):
    served = graph_served
    rng = np.random.default_rng(1)
    eligible = Eligible(rng.random(len(served.items)) < share)
    exact_calls = []
    monkeypatch.setattr(
        served,
        "recommend_exact",
        lambda *a, **k: exact_calls.append(1) or type(served).recommend_exact(served, *a, **k),
    )
    hits = 0
    for user in range(100):
        rows, _ = served.recommend(user, 10, exclude=served.seen(user), eligible=eligible)
        assert not exact_calls  # the graph answered
        exact, _ = type(served).recommend_exact(
            served, user, 10, exclude=served.seen(user), eligible=eligible
        )
        hits += np.intersect1d(rows, exact).size
    assert hits / 1000 >= 0.9
