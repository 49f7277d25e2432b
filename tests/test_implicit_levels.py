"""How implicit strengths become the levels the models fit: the three mappings, their choice on
validation in ``reproduce topn``, COE's strength-weighted triples, and a version trained on a
mapping serving Recommend, SimilarItems and explanations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.config import Limits
from ordrec.service.live.seen import SeenStore
from ordrec.service.metrics import Metrics
from ordrec.service.serving.servicer import RecommenderServicer
from ordrec.service.serving.store import ModelStore
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.registry import Registry
from ordrec.trainer.cli import main
from ordrec.trainer.data.interactions import (
    LEVEL_SCHEMES,
    LEVELS_ATTRIBUTE,
    LevelMapping,
    ordinal_levels,
    strength_levels,
)
from ordrec.trainer.data.readers import read_input
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.models.coe import COE, TripleSource
from ordrec.trainer.reproduce import topn
from ordrec.v1 import recommender_pb2 as pb
from tests.generated import write_plays
from tests.servicer_fakes import NoDeadlineContext


def implicit(user, strength, n_users=None) -> Ratings:
    user = np.asarray(user, dtype=np.int32)
    n_users = n_users or int(user.max()) + 1
    return Ratings(
        IdMap([f"u{k}" for k in range(n_users)]),
        IdMap([f"i{k}" for k in range(user.size)]),
        user,
        np.arange(user.size, dtype=np.int32),
        np.asarray(strength, dtype=np.float32),
        feedback="implicit",
        strength="plays",
    )


# ------------------------------------------------------------------ the mappings
@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(1, 300), min_size=1, max_size=12),  # one user's play counts
        min_size=1,
        max_size=5,
    ),
    st.sampled_from(LEVEL_SCHEMES),
    st.integers(1, 8),
)
def test_every_mapping_is_monotone_within_a_user_in_range_and_equal_on_ties(per_user, scheme, n):
    user = np.repeat(np.arange(len(per_user)), [len(s) for s in per_user])
    strength = np.concatenate([np.asarray(s, dtype=np.float32) for s in per_user])
    levels = strength_levels(implicit(user, strength), LevelMapping(scheme, n))
    assert levels.min() >= 1 and levels.max() <= n and np.all(levels == np.round(levels))
    for u in range(len(per_user)):
        s, lv = strength[user == u], levels[user == u]
        stronger, weaker = np.nonzero(s[:, None] > s[None, :])
        assert np.all(lv[stronger] >= lv[weaker])
        first, second = np.nonzero(s[:, None] == s[None, :])
        assert np.all(lv[first] == lv[second])


def test_log_bins_and_repeats_read_the_strength_itself():
    data = implicit([0] * 7, [1, 2, 3, 4, 7, 8, 1000])
    assert strength_levels(data, LevelMapping("log", 4)).tolist() == [1, 2, 2, 3, 3, 4, 4]
    assert strength_levels(data, LevelMapping("repeat", 2)).tolist() == [1, 2, 2, 2, 2, 2, 2]
    assert strength_levels(data, LevelMapping("repeat", 3)).tolist() == [1, 2, 3, 3, 3, 3, 3]
    mapped = ordinal_levels(data, LevelMapping.parse("log:4"))
    assert mapped.levels == "log:4" and mapped.strength == "levels of plays"
    assert ordinal_levels(mapped, LevelMapping("repeat", 2)) is mapped  # mapped once only


@pytest.mark.parametrize("text", ["median:3", "log:0", "log:x", "repeat:99"])
def test_an_unknown_scheme_or_level_count_is_refused_naming_the_choices(text):
    with pytest.raises(ValueError, match="quantile"):
        LevelMapping.parse(text)


def test_mappings_that_order_the_data_alike_are_fitted_once():
    ones = implicit([0, 0, 1, 1], [1, 1, 1, 1])  # one strength: every mapping gives one level
    assert topn.distinct_mappings(ones, topn.LEVEL_GRID) == (topn.LEVEL_GRID[0],)
    varied = implicit([0, 0, 0, 0], [1, 2, 3, 40])
    assert len(topn.distinct_mappings(varied, topn.LEVEL_GRID)) > 1


# ------------------------------------------------------------------ chosen on validation
def test_levels_are_chosen_on_validation_and_never_see_the_test_part(tmp_path, monkeypatch):
    fitted: list[set] = []
    real_fit = topn.fit_index

    def recording_fit(kind, params, data, seed):
        fitted.append((params, {(int(u), int(i)) for u, i in zip(data.user, data.item)}))
        return real_fit(kind, params, data, seed)

    monkeypatch.setattr(topn, "fit_index", recording_fit)
    path = write_plays(tmp_path / "plays.csv")
    out = tmp_path / "rows.json"
    argv = ["reproduce", "topn", "--data", path, "--feedback", "implicit", "--runs", "1", "--quiet"]
    argv += ["--models", "coe", "--references", "popularity", "--json", str(out)]
    assert main([*argv, "--set", "coe.max_iter=3", "--set", "coe.n_components=4"]) == 0
    split = topn.make_split(read_input("ratings", path, feedback="implicit"), 0.2, 0.0, 0, "random")
    held_out = set(zip(split.test.user.tolist(), split.test.item.tolist()))
    training = set(zip(split.train.user.tolist(), split.train.item.tolist()))
    *tuning, (final_params, final) = fitted
    assert len(tuning) >= 2 and {"strength_power"} <= set(final_params)  # a search, COE's weight in it
    assert final == training
    assert all(pairs < training and not pairs & held_out for _, pairs in tuning)
    rows = json.loads(out.read_text())
    chosen = [r["setting"]["levels"] for r in rows if r["method"] == "coe" and "seed" in r["setting"]]
    assert chosen and LevelMapping.parse(chosen[0].split()[0]).scheme in LEVEL_SCHEMES


def test_given_levels_are_used_without_a_search(tmp_path, monkeypatch):
    searched = []
    monkeypatch.setattr(topn, "choose_levels", lambda *a, **k: searched.append(a))
    path = write_plays(tmp_path / "plays.csv")
    argv = ["reproduce", "topn", "--data", path, "--feedback", "implicit", "--runs", "1", "--quiet"]
    argv += ["--models", "coe", "--references", "", "--levels", "repeat:2", "--set", "coe.max_iter=2"]
    assert main(argv) == 0 and searched == []


# ------------------------------------------------------------------ COE's weighted triples
def test_coe_draws_a_stronger_interaction_as_the_nearer_item_in_proportion_to_its_level():
    # user 0: item 0 at level 1, item 1 at level 3; user 1: item 2 at level 4; items 3-5 unpicked
    user, item = np.array([0, 0, 1], np.int32), np.array([0, 1, 2], np.int32)
    level = np.array([1.0, 3.0, 4.0], np.float32)
    source = TripleSource.build(user, item, level, 2, 6, strength=level)
    for power, expected in ((0.0, [1, 1, 1]), (1.0, [1, 3, 4]), (2.0, [1, 9, 16])):
        kind, _, near, _ = source.sample(40_000, 1.0, 5, p_unrated=1.0, strength_power=power)
        assert np.all(kind == 2)
        share = np.bincount(near, minlength=3)[:3] / near.size
        assert share == pytest.approx(np.asarray(expected) / np.sum(expected), abs=0.01)


def test_coe_strength_power_is_a_declared_non_negative_setting():
    data = implicit([0, 0, 1], [1, 3, 2], n_users=2)
    with pytest.raises(ValueError, match="strength_power"):
        COE(solver={"strength_power": -1.0}, max_iter=1).fit(data)
    weighted = COE(solver={"strength_power": 1.0}, max_iter=2, n_components=2).fit(data)
    plain = COE(solver={"strength_power": 0.0}, max_iter=2, n_components=2).fit(data)
    assert not np.allclose(weighted.user_coords_, plain.user_coords_)  # the weighting changes the fit


# ------------------------------------------------------------------ a version on levels serves
@pytest.mark.parametrize("kind", ["dcr", "coe"])
def test_a_version_fitted_on_log_levels_records_them_and_serves_explanations_from_the_strongest(
    kind, tmp_path
):
    path = write_plays(tmp_path / "plays.csv", seed=3)
    registry = tmp_path / "reg"
    argv = ["train", kind, "--data", path, "--registry", str(registry), "--levels", "log:3"]
    assert main([*argv, "--set", "n_components=4", "--set", "max_iter=3"]) == 0
    artifact = Registry(registry).load(kind)
    assert artifact.attributes[LEVELS_ATTRIBUTE] == {"scheme": "log", "levels": 3, "strength": "plays"}
    store = ModelStore(Registry(registry), Metrics())
    store.refresh()
    handler = RecommenderServicer(store, Metrics(), Limits(), SeenStore())
    rows = [line.split(",") for line in Path(path).read_text().split()[1:]]
    plays = {(u, i): int(p) for u, i, p in rows}
    for user in ("u0", "u1", "u2"):
        own = {i: p for (u, i), p in plays.items() if u == user}
        levels = {i: min(3, 1 + int(np.log2(p))) for i, p in own.items()}
        request = pb.RecommendRequest(model=kind, user_ids=[user], n=10, explain=3)
        items = handler.Recommend(request, NoDeadlineContext()).results[0].items
        assert len(items) == 10 and not {it.id for it in items} & set(own)
        reasons = [why for it in items for why in it.explanations]
        assert reasons, "recommendations are explained"
        mean_level = np.mean(list(levels.values()))
        for why in reasons:
            assert why.rating == levels[why.id] >= mean_level  # the user's strongest interactions
    similar = handler.SimilarItems(
        pb.SimilarItemsRequest(model=kind, item_ids=["i0"], n=5), NoDeadlineContext()
    )
    assert len(similar.items) == 5 and "i0" not in {s.id for s in similar.items}


def test_with_the_settings_tuner_the_levels_are_its_choice_not_a_search_around_it(tmp_path, monkeypatch):
    # The tuner searches the mapping with its other settings: a level search around it would fit
    # the whole tuner once per mapping. New users are folded in through the mapping it chose.
    searched = []
    monkeypatch.setattr(topn, "choose_levels", lambda *a, **k: searched.append(a))
    path = write_plays(tmp_path / "plays.csv")
    out = tmp_path / "rows.json"
    argv = ["reproduce", "topn", "--data", path, "--feedback", "implicit", "--runs", "1", "--quiet"]
    argv += ["--models", "dcr", "--references", "popularity", "--fold-in", "0.2", "--json", str(out)]
    argv += ["--set", "dcr.tune=true", "--set", "dcr.tune_min_users=0", "--set", "dcr.max_iter=3"]
    assert main(argv) == 0
    assert searched == []
    methods = {r["method"] for r in json.loads(out.read_text())}
    assert {"dcr", "dcr (fold-in, new users)"} <= methods, methods
