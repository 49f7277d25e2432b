"""reproduce topn on interaction logs: the time split, implicit relevance, the references
tuned on validation only, and the job gate's split key."""

from __future__ import annotations

import dataclasses
import json
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.indices.models.dcr import DCRIndex
from ordrec.trainer.cli import main
from ordrec.trainer.data.readers import read_input
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.evaluation import holdout
from ordrec.trainer.evaluation.holdout import split_ratings
from ordrec.trainer.evaluation.topn import TopN
from ordrec.trainer.job import EXIT_FAILED, EXIT_PUBLISHED, load_job, run_job
from ordrec.trainer.models.dcr import DCR
from ordrec.trainer.reproduce import topn
from tests.generated import make_ratings
from tests.test_topn import picked_by_taste


def interactions(user, item, strength, time=None, n_users=None, n_items=None) -> Ratings:
    """:func:`make_ratings` read as interactions (each strength a count of rows)."""
    made = make_ratings(user, item, strength, n_users, n_items)
    stamps = None if time is None else np.asarray(time, np.int64)
    return dataclasses.replace(made, time=stamps, feedback="implicit", strength="rows")


def write_log(path, seed=0, n_users=80) -> str:
    """A click log ``user,item,timestamp``: each user picks items of their own group over time."""
    data = picked_by_taste(seed=seed, n_users=n_users)
    stamps = np.random.default_rng(seed).integers(1_000, 2_000, len(data))
    rows = (f"u{u},i{i},{t}\n" for u, i, t in zip(data.user, data.item, stamps))
    path.write_text("user,item,timestamp\n" + "".join(rows))
    return str(path)


# ------------------------------------------------------------------ time split
@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=15), min_size=1, max_size=6),
    st.floats(0.05, 0.95),
    st.integers(0, 2**31 - 1),
)
def test_the_time_split_holds_out_exactly_each_users_latest_share(times_per_user, fraction, seed):
    user = np.repeat(np.arange(len(times_per_user)), [len(t) for t in times_per_user])
    time = np.concatenate([np.asarray(t) for t in times_per_user])
    data = interactions(user, np.arange(user.size), np.ones(user.size), time, n_items=user.size)
    train, test = split_ratings(data, fraction, seed, by="time")
    assert sorted(np.r_[train.item, test.item].tolist()) == list(range(user.size))  # a partition
    for u, stamps in enumerate(times_per_user):
        n = len(stamps)
        assert (test.user == u).sum() == min(int(np.floor(fraction * n + 0.5)), n - 1)
        held, kept = test.time[test.user == u], train.time[train.user == u]
        assert held.size == 0 or held.min() >= kept.max()  # nothing kept is later than a held-out one


def test_the_time_split_is_refused_without_timestamps(tmp_path):
    data = interactions([0, 0, 1, 1], [0, 1, 0, 1], [1, 1, 1, 1])
    with pytest.raises(ValueError, match="no timestamps"):
        split_ratings(data, 0.5, 0, by="time")
    path = tmp_path / "clicks.csv"
    path.write_text("user,item\n" + "".join(f"u{u},i{i}\n" for u in range(5) for i in range(4)))
    with pytest.raises(SystemExit, match="--split time: .* has no timestamps"):
        main(["reproduce", "topn", "--data", str(path), "--feedback", "implicit", "--split", "time"])


# ------------------------------------------------------------------ relevance
def test_every_held_out_interaction_is_relevant_whatever_its_strength():
    test = interactions([0, 0, 0, 1], [1, 2, 3, 4], [1, 2, 9, 1], n_items=5)
    truth = TopN.from_ratings(test, 4.0)
    assert truth.users.tolist() == [0, 1]
    assert truth.relevant(0).tolist() == [1, 2, 3] and truth.relevant(1).tolist() == [4]
    explicit = Ratings(test.users, test.items, test.user, test.item, test.rating)
    assert TopN.from_ratings(explicit, 4.0).relevant(0).tolist() == [3]  # ratings keep the threshold


def test_dcr_fits_and_serves_interactions_of_one_strength():
    data = picked_by_taste(seed=4)
    clicks = Ratings(data.users, data.items, data.user, data.item, np.full(len(data), 3.0, np.float32))
    index = DCRIndex.from_artifact(DCR(n_components=4, max_iter=5).fit(clicks).to_artifact())
    assert index.unrated_level and index.levels.tolist() == [2.0, 3.0]  # not picked, picked
    found, _ = index.recommend(0, 5, exclude=index.seen(0))
    assert found.size == 5 and not np.isin(found, index.seen(0)).any()


# ------------------------------------------------------------------ references
def test_coordinate_search_finds_a_separable_best_scoring_each_setting_once():
    grid = topn.Grid({"a": (1, 2, 3, 4), "b": (0.1, 1.0, 10.0), "c": (5, 6)}, {"a": 1, "b": 0.1, "c": 5})
    calls = []

    def score(setting):
        calls.append(tuple(setting.values()))
        return -abs(setting["a"] - 3) - abs(np.log10(setting["b"]) - 0) - (setting["c"] == 5)

    best, fitted = topn.coordinate_search(grid, score)
    assert best == {"a": 3, "b": 1.0, "c": 6}
    assert fitted == len(calls) == len(set(calls)) < grid.size == 24


@pytest.mark.parametrize(("name", "grid"), [("als", topn.ALS_GRID), ("bpr", topn.BPR_GRID)])
def test_implicit_references_are_tuned_on_validation_and_never_see_the_test_part(
    tmp_path, monkeypatch, name, grid
):
    given, settings_fitted = [], []

    def fake_reference(train, seed, **setting):
        given.append({(int(u), int(i)) for u, i in zip(train.user, train.item)})
        settings_fitted.append(setting)
        rng = np.random.default_rng(zlib.crc32(repr(setting).encode()))  # a score for each setting
        scores = rng.random(train.n_items)
        return lambda users: np.tile(scores, (users.size, 1))

    monkeypatch.setattr(topn, f"{name}_scores", fake_reference)
    monkeypatch.setattr(topn, "implicit_available", lambda: True)
    path = write_log(tmp_path / "clicks.csv")
    argv = ["reproduce", "topn", "--data", path, "--feedback", "implicit", "--split", "time"]
    out = tmp_path / "rows.json"
    argv += ["--runs", "1", "--models", "", "--references", name, "--json", str(out), "--quiet"]
    assert main(argv) == 0
    split = topn.make_split(read_input("ratings", path, feedback="implicit"), 0.2, 0.0, 0, "time")
    held_out = set(zip(split.test.user.tolist(), split.test.item.tolist()))
    training = set(zip(split.train.user.tolist(), split.train.item.tolist()))
    *tuning, final = given
    assert 1 < len(tuning) < grid.size
    assert final == training  # the chosen setting is refitted on the whole training part
    assert all(fit < training and not fit & held_out for fit in tuning)  # validation carved from it
    per_seed = [r for r in json.loads(out.read_text()) if "seed" in r["setting"]]
    assert per_seed and all(r["setting"]["chosen"] == settings_fitted[-1] for r in per_seed)


@pytest.mark.parametrize(
    ("grid", "axis", "toward", "old_end"),
    [
        (topn.ALS_GRID, "regularization", 1, 10.0),
        (topn.ALS_GRID, "alpha", -1, 1.0),
        (topn.ALS_GRID, "factors", -1, 32),
        (topn.ALS_GRID, "iterations", 1, 30),
        (topn.EASE_GRID, "l2", 1, 1000.0),
        (topn.EASE_GRID, "l2", -1, 50.0),
    ],
)
def test_the_reference_searches_walk_past_the_ends_the_choices_used_to_land_on(grid, axis, toward, old_end):
    """On Last.fm ALS chose 64 factors (then, on wider grids, 32), regularization 10, alpha 1
    and 60 iterations, and EASE l2 1000, each the end of its axis: a validation score that keeps
    rising that way must now be followed further than the old end of its axis."""
    best, _ = topn.coordinate_search(grid, lambda setting: toward * np.log(setting[axis]))
    assert best[axis] == (max if toward > 0 else min)(grid.axes[axis])
    assert toward * best[axis] > toward * old_end


@pytest.fixture
def recorded_als_fit(monkeypatch):
    """implicit's ALS with its fit replaced: records the confidences and the BLAS threads."""
    als = pytest.importorskip("implicit.cpu.als")
    threadpoolctl = pytest.importorskip("threadpoolctl")
    seen = {}

    def fit(self, user_items, show_progress=True, callback=None):
        seen["confidence"] = user_items.toarray()
        blas = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
        seen["blas_threads"] = set(blas)
        self.user_factors = np.zeros((user_items.shape[0], self.factors), np.float32)
        self.item_factors = np.zeros((user_items.shape[1], self.factors), np.float32)

    monkeypatch.setattr(als.AlternatingLeastSquares, "fit", fit)
    return seen


def test_als_confidence_is_one_plus_alpha_times_the_level_of_each_picked_pair(recorded_als_fit):
    # Rows in no particular order: each pair's level must reach its own cell.
    user, item, level = [2, 0, 1, 0, 2, 1], [0, 3, 1, 0, 2, 3], [5, 1, 4, 3, 2, 1]
    topn.als_scores(
        interactions(user, item, level), 0, factors=2, regularization=1.0, alpha=0.5, iterations=1
    )
    expected = np.ones((3, 4), np.float32)  # implicit reads 1 where nothing was picked
    expected[user, item] = 1.0 + 0.5 * np.asarray(level)
    picked = np.zeros((3, 4), bool)
    picked[user, item] = True
    np.testing.assert_allclose(recorded_als_fit["confidence"][picked], expected[picked])
    assert not recorded_als_fit["confidence"][~picked].any()
    ratings = make_ratings([0, 1], [1, 0], [5.0, 2.0])  # on star ratings every pick is level 1
    topn.als_scores(ratings, 0, factors=2, regularization=1.0, alpha=3.0, iterations=1)
    np.testing.assert_allclose(recorded_als_fit["confidence"], [[0.0, 4.0], [4.0, 0.0]])


def test_als_fits_under_one_blas_thread(recorded_als_fit):
    from threadpoolctl import threadpool_limits

    with threadpool_limits(2, "blas"):  # what a 2-core machine gives by default
        topn.als_scores(
            interactions([0, 1], [1, 0], [1, 1]), 0, factors=2, regularization=1.0, alpha=1.0, iterations=1
        )
    assert recorded_als_fit["blas_threads"] == {1}


def test_bpr_ranks_what_a_user_picks_above_the_other_groups_items():
    pytest.importorskip("implicit")
    data = picked_by_taste(seed=3)
    train, test = split_ratings(data, 0.25, 0)
    scores = topn.bpr_scores(train, 0, factors=8, learning_rate=0.05, regularization=0.01, iterations=60)
    users = np.unique(test.user)
    lists = topn.score_lists(scores(users), train, users, 10)
    own_group = (lists >= 4) & (lists % 2 == users[:, None] % 2)
    assert own_group.mean() > 0.9  # picks come from the user's own group (chance: about 0.5)
    assert not np.isin(lists, np.arange(4)).any()  # the decoys are seen by everyone: never served


# ------------------------------------------------------------------ end to end
def test_reproduce_topn_on_an_interaction_log_writes_rows_per_seed_and_split(tmp_path):
    path = write_log(tmp_path / "clicks.csv", n_users=60)
    out = tmp_path / "rows.json"
    argv = ["reproduce", "topn", "--data", path, "--feedback", "implicit", "--runs", "2", "--quiet"]
    argv += ["--split", "time", "--models", "dcr", "--references", "popularity,ease"]
    argv += ["--set", "dcr.n_components=4", "--set", "dcr.max_iter=10", "--json", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())
    recall = [r for r in rows if r["metric"] == "recall@10"]
    assert {r["method"] for r in recall} == {"dcr", "popularity", "ease"}
    assert all(r["setting"]["split"] == "time" and r["setting"]["feedback"] == "implicit" for r in rows)
    assert all(r["setting"]["threshold"] is None for r in rows)  # relevant: any held-out interaction
    summary = [r for r in recall if "seed" not in r["setting"]]
    assert len(summary) == 3 and all(r["runs"] == 2 for r in summary)
    assert sorted(
        r["setting"]["seed"] for r in recall if r["method"] == "dcr" and "seed" in r["setting"]
    ) == [0, 1]
    assert all(0.0 <= r["mean"] <= 1.0 for r in recall)
    per_seed = {r["method"]: r["setting"] for r in recall if r["setting"].get("seed") == 0}
    assert per_seed["ease"]["chosen"]["l2"] in topn.EASE_GRID.axes["l2"]  # what validation chose
    assert "chosen" not in per_seed["popularity"]


# ------------------------------------------------------------------ the job's gate
def gate_job(tmp_path, data: str, split: str):
    job = tmp_path / "job.toml"
    job.write_text(
        f"""[job]
name = "split"
registry = "{tmp_path / "reg"}"
[data.clicks]
path = "{data}"
feedback = "implicit"
[[models]]
name = "dcr"
kind = "dcr"
data = "clicks"
params = {{ n_components = 4, max_iter = 5 }}
gate = {{ split = "{split}", metric = "topn_recall_at_10", popularity_floor = false }}
"""
    )
    return job


def test_the_job_gate_holds_out_by_the_split_it_names(tmp_path, monkeypatch, capsys):
    used = []
    real_split = holdout.split

    def recording_split(data, fraction, seed, by="random"):
        used.append(by)
        return real_split(data, fraction, seed, by)

    monkeypatch.setattr(holdout, "split", recording_split)
    job = gate_job(tmp_path, write_log(tmp_path / "clicks.csv"), "time")
    assert load_job(job).models[0].gate.split == "time"
    # The gate's split; again on the levelled rows when the tuner chose the level mapping.
    assert run_job(job) == EXIT_PUBLISHED and used and set(used) == {"time"}
    untimed = tmp_path / "untimed.csv"
    untimed.write_text("user,item\n" + "".join(f"u{u},i{i}\n" for u in range(5) for i in range(4)))
    assert run_job(gate_job(tmp_path, str(untimed), "time")) == EXIT_FAILED
    assert "no timestamps" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"gate\.split: must be one of 'random', 'time'"):
        load_job(gate_job(tmp_path, str(untimed), "latest"))
