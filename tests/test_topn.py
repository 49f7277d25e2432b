"""Top-N: the unrated sampler, the top-N-aware DCR on planted data, the metrics and the protocol."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.indices.models.dcr import DCRIndex
from ordrec.service.storage.registry import Registry
from ordrec.trainer.cli import main
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.evaluation.holdout import split_ratings
from ordrec.trainer.evaluation.topn import TopN, topn_metrics
from ordrec.trainer.job import EXIT_PUBLISHED, EXIT_REJECTED, run_job
from ordrec.trainer.models.dcr import DCR, PAPER_PARAMS
from ordrec.trainer.models.dcr_kernels import with_unrated
from ordrec.trainer.models.ranking import served_recall_values
from tests.generated import make_ratings

ratings = make_ratings


def picked_by_taste(seed=0, n_users=120, n_items=80, per_user=12) -> Ratings:
    """Users pick items of their own group (of two; some more often than others) and like them
    at random; four decoys everyone rated low are the most rated items. What a user picks is
    planted, and it is neither the popular items nor told by the ratings."""
    rng = np.random.default_rng(seed)
    decoys = np.arange(4)
    groups = [np.flatnonzero((np.arange(n_items) % 2 == g) & (np.arange(n_items) >= 4)) for g in (0, 1)]
    users, items, values = [], [], []
    for u in range(n_users):
        weights = 1.0 / (1.0 + np.arange(groups[u % 2].size))
        picks = rng.choice(groups[u % 2], per_user, replace=False, p=weights / weights.sum())
        users += [u] * (picks.size + decoys.size)
        items += picks.tolist() + decoys.tolist()
        values += rng.integers(3, 6, picks.size).tolist() + rng.integers(1, 3, decoys.size).tolist()
    return ratings(users, items, values, n_users, n_items)


# ------------------------------------------------------------------ sampler
@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 29), max_size=12, unique=True), min_size=1, max_size=8),
    st.floats(0.0, 3.0),
    st.integers(0, 2**31 - 2),
)
def test_with_unrated_keeps_the_ratings_and_adds_only_unrated_items(segments, share, seed):
    n_items = 30
    indptr = np.r_[0, np.cumsum([len(s) for s in segments])].astype(np.int64)
    items = np.concatenate([np.sort(s) for s in segments] + [np.zeros(0)]).astype(np.int32)
    levels = np.random.default_rng(seed).integers(1, 6, items.size).astype(np.int32)
    cdf = np.cumsum(np.random.default_rng(seed + 1).random(n_items) + 0.01)
    want = share * np.diff(indptr).astype(np.float64)
    out_ptr, out_items, out_levels = with_unrated(indptr, items, levels, want, cdf, seed)
    assert out_ptr[0] == 0 and out_ptr[-1] == out_items.size == out_levels.size
    for u, segment in enumerate(segments):
        got, lv = out_items[out_ptr[u] : out_ptr[u + 1]], out_levels[out_ptr[u] : out_ptr[u + 1]]
        rated = np.sort(segment)
        np.testing.assert_array_equal(got[: rated.size], rated)  # the ratings, levels unchanged
        np.testing.assert_array_equal(lv[: rated.size], levels[indptr[u] : indptr[u + 1]])
        drawn = got[rated.size :]
        assert np.all(lv[rated.size :] == 0) and not np.isin(drawn, rated).any()
        assert drawn.size <= int(np.ceil(share * rated.size))


def test_with_unrated_draws_share_per_rating_in_proportion_to_the_weights():
    n_users, per_user, n_items = 400, 5, 50
    indptr = np.arange(0, n_users * per_user + 1, per_user, dtype=np.int64)
    items = np.tile(np.arange(per_user, dtype=np.int32), n_users)  # everyone rated items 0..4
    weights = np.r_[np.zeros(per_user), np.arange(1, n_items - per_user + 1)].astype(float)
    want = 1.5 * np.diff(indptr).astype(np.float64)
    _, out_items, out_levels = with_unrated(indptr, items, np.ones_like(items), want, np.cumsum(weights), 7)
    drawn = out_items[out_levels == 0]
    assert abs(drawn.size - 1.5 * items.size) < 0.05 * items.size
    freq = np.bincount(drawn, minlength=n_items)[per_user:] / drawn.size
    np.testing.assert_allclose(freq, weights[per_user:] / weights.sum(), atol=0.01)


# ------------------------------------------------------------------- models
def test_top_n_dcr_finds_what_users_pick_where_the_paper_dcr_does_not():
    data = picked_by_taste()
    train, test = split_ratings(data, 0.25, seed=0)
    liked = float(np.unique(data.rating)[-2])
    found = {}
    for name, params in (("top-n", {}), ("paper", PAPER_PARAMS)):
        model = DCR(**dict(params, n_components=8, random_state=0)).fit(train)
        found[name] = served_recall_values(DCRIndex.from_artifact(model.to_artifact()), test, liked).mean()
    counts = np.bincount(train.item, minlength=train.n_items)
    popular = np.argsort(-counts)[:10]
    truth = TopN.from_ratings(test, liked)
    popularity = np.mean(
        [
            np.isin(popular, truth.relevant(k)).sum() / min(10, truth.relevant(k).size)
            for k in range(truth.users.size)
        ]
    )
    assert found["top-n"] > popularity + 0.1 and found["top-n"] > found["paper"] + 0.1


def test_top_n_dcr_serves_a_rating_distribution_over_the_rating_values():
    data = picked_by_taste(seed=1)
    index = DCRIndex.from_artifact(DCR(n_components=4, max_iter=5).fit(data).to_artifact())
    assert index.unrated_level and index.rating_levels.tolist() == [1, 2, 3, 4, 5]
    dist = index.distribution(0, np.arange(6))
    assert dist.shape == (6, index.rating_levels.size) and np.allclose(dist.sum(axis=1), 1.0, atol=1e-5)
    # the unknown-user fallback of the top-N model is what was picked most
    np.testing.assert_array_equal(index.popularity, np.bincount(data.item, minlength=data.n_items))


def test_paper_params_fit_the_paper_model():
    data = picked_by_taste(seed=2)
    model = DCR(**dict(PAPER_PARAMS, max_iter=3)).fit(data)
    assert model.levels_.tolist() == np.unique(data.rating).tolist()
    assert model.to_artifact().attributes["unrated_level"] is False


# ------------------------------------------------------------------ metrics
def test_topn_metrics_count_hits_over_min_n_relevant():
    test = ratings([0, 0, 0, 1, 1], [1, 2, 3, 4, 5], [5, 4, 2, 5, 5], 2, 10)
    train = ratings([0, 1, 1], [0, 0, 6], [3, 3, 3], 2, 10)
    truth = TopN.from_ratings(test, 4.0)
    assert truth.users.tolist() == [0, 1] and truth.relevant(0).tolist() == [1, 2]
    lists = np.full((2, 20), -1)
    lists[0, :3] = [9, 2, 8]  # one of user 0's two liked items, at rank 2
    lists[1, 12] = 5  # user 1's liked item 5, past the top 10
    got = topn_metrics(lists, truth, train)
    assert got["recall@10"] == pytest.approx((1 / 2 + 0) / 2)
    assert got["recall@20"] == pytest.approx((1 / 2 + 1 / 2) / 2)
    ideal0 = 1 + 1 / np.log2(3)
    assert got["ndcg@10"] == pytest.approx((1 / np.log2(3) / ideal0 + 0) / 2)
    assert got["coverage@10"] == pytest.approx(3 / 10)
    assert got["popular_share@10"] == 0.0  # item 0, the most rated, is not recommended


# ----------------------------------------------------------------- protocol
def test_reproduce_topn_writes_rows_for_models_and_references(tmp_path):
    data = picked_by_taste(seed=3, n_users=60)
    path = tmp_path / "ratings.tsv"
    path.write_text(
        "".join(f"{u + 1}\t{i + 1}\t{int(r)}\t0\n" for u, i, r in zip(data.user, data.item, data.rating))
    )
    out = tmp_path / "rows.json"
    argv = ["reproduce", "topn", "--data", str(path), "--format", "ml-100k", "--runs", "2", "--quiet"]
    argv += ["--models", "dcr,dcr_paper", "--references", "popularity,ease", "--fold-in", "0.2"]
    argv += ["--set", "dcr.n_components=8", "--set", "dcr.max_iter=20", "--json", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())
    methods = {r["method"] for r in rows}
    assert {"dcr", "dcr_paper", "popularity", "ease", "dcr (fold-in, new users)"} <= methods
    recall = {r["method"]: r for r in rows if r["metric"] == "recall@10" and "seed" not in r["setting"]}
    assert {r["setting"]["seed"] for r in rows if r["method"] == "dcr" and "seed" in r["setting"]} == {0, 1}
    assert all(r["runs"] == 2 for r in recall.values())
    assert recall["dcr"]["mean"] > recall["popularity"]["mean"]


def test_reproduce_topn_names_a_bad_set(tmp_path, capsys):
    path = tmp_path / "r.tsv"
    path.write_text("1\t1\t5\t0\n1\t2\t3\t0\n")
    with pytest.raises(SystemExit, match="not in --models"):
        main(
            [
                "reproduce",
                "topn",
                "--data",
                str(path),
                "--format",
                "ml-100k",
                "--models",
                "dcr",
                "--set",
                "coe.x=3",
            ]
        )


# ---------------------------------------------------------------- job gate
def popular_picks(path, seed=0, n_users=300, n_items=500, per_user=10) -> None:
    """Users pick mostly the popular items (Zipf) and rate them 4 (or 3); the rare items they
    rate 5. The paper's DCR fills the top with the rare items; what users pick is popular."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / (1.0 + np.arange(n_items))
    lines = []
    for u in range(n_users):
        for i in rng.choice(n_items, per_user, replace=False, p=weights / weights.sum()):
            rating = 5 if i >= 100 else rng.choice([3, 4], p=[0.2, 0.8])
            lines.append(f"{u + 1}\t{i + 1}\t{rating}\t0\n")
    path.write_text("".join(lines))


def taste_picks(path, seed=0, n_users=300, n_items=500, per_user=10, groups=5) -> None:
    """Five taste groups: a user picks mostly (Zipf-like) from the group's own fifth of the
    catalogue and rates those 5, the rest at random and rated 2-3: what a user likes is
    personal, so a recommender must beat popularity here."""
    rng = np.random.default_rng(seed)
    block = n_items // groups
    zipf = 1.0 / (1.0 + np.arange(block))
    lines = []
    for u in range(n_users):
        own = (u % groups) * block + np.arange(block)
        odds = np.full(n_items, 0.2 / n_items)
        odds[own] += 0.8 * zipf / zipf.sum()
        for i in rng.choice(n_items, per_user, replace=False, p=odds / odds.sum()):
            rating = 5 if i in own else rng.choice([2, 3])
            lines.append(f"{u + 1}\t{i + 1}\t{rating}\t0\n")
    path.write_text("".join(lines))


def ratings_job(tmp_path, ratings, params: str, gate: str = "{}"):
    """A job named "floor" training one DCR on the ``ratings`` file (ML-100K's format) into
    ``tmp_path / "reg"``."""
    job = tmp_path / "job.toml"
    job.write_text(
        f"""[job]
name = "floor"
registry = "{tmp_path / "reg"}"
[data.ratings]
path = "{ratings}"
format = "ml-100k"
[[models]]
name = "dcr"
kind = "dcr"
data = "ratings"
params = {{ {params} }}
gate = {gate}
"""
    )
    return job


def popular_picks_job(tmp_path, params: str, gate: str = "{}", picks=popular_picks):
    """:func:`ratings_job` on ``picks`` data (:func:`popular_picks`)."""
    picks(tmp_path / "r.data")
    return ratings_job(tmp_path, tmp_path / "r.data", params, gate)


@pytest.mark.parametrize("floor", [True, False])
def test_job_refuses_a_recommender_below_popularity(tmp_path, capsys, floor):
    # the paper's DCR orders by the rating it predicts: the rare items first
    job = popular_picks_job(
        tmp_path, "unrated_share = 0.0, n_components = 4", f"{{ popularity_floor = {str(floor).lower()} }}"
    )
    code = run_job(job)
    log = capsys.readouterr().err
    assert "topn_recall_at_10" in log and "< popularity's" in log
    if floor:
        assert code == EXIT_REJECTED and "result=rejected" in log
        assert not (tmp_path / "reg").exists() or Registry(tmp_path / "reg").versions("dcr") == []
    else:
        assert code == EXIT_PUBLISHED and "published anyway" in log
        published = Registry(tmp_path / "reg").load("dcr")
        assert published.attributes["trained_by"] == "job floor"  # the status page's "trained by"
        metrics = published.metrics
        assert metrics["holdout_topn_recall_at_10"] < metrics["holdout_popularity_recall_at_10"]


def test_job_publishes_the_top_n_dcr_above_popularity(tmp_path):
    assert run_job(popular_picks_job(tmp_path, "n_components = 8", picks=taste_picks)) == EXIT_PUBLISHED
    metrics = Registry(tmp_path / "reg").load("dcr").metrics
    assert metrics["holdout_topn_recall_at_10"] >= metrics["holdout_popularity_recall_at_10"]


@pytest.mark.parametrize("kind", ["dcr", "coe"])
def test_a_new_user_folds_in_from_interactions_without_ratings(kind):
    from ordrec.service.indices.models import kinds

    data = picked_by_taste(seed=4)
    params = {"dcr": dict(n_components=8), "coe": dict(n_components=8, max_iter=30)}[kind]
    estimator = kinds.get(kind).estimator_class()(**params, random_state=0).fit(data)
    index = kinds.get(kind).index_class().from_artifact(estimator.to_artifact())
    assert index.folds_in_picks
    picked = np.arange(4, 40, 2)  # group 0's items: a new user of group 0 who rated none of them
    found, _ = index.recommend_for(index.fold_in(picked, np.full(picked.size, np.nan)), 10, exclude=picked)
    tasted = found[found >= 4]  # past the four decoys everyone rated (COE keeps them near everyone)
    assert tasted.size >= 5 and np.mean(tasted % 2 == 0) >= 0.9  # the rest of group 0


def test_log_relevance_is_refused_before_fitting_when_not_rated_sits_at_zero():
    with pytest.raises(ValueError, match="relevance='log'.*not rated"):
        DCR(relevance="log", max_iter=1).fit(picked_by_taste(seed=5))
    DCR(**PAPER_PARAMS, relevance="log", max_iter=1).fit(picked_by_taste(seed=5))  # the paper's: fine
