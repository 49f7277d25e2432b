"""The settings tuner: what it fits on, what it keeps, its budget, and what a version records."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ordrec.service.storage.registry import Registry
from ordrec.trainer.cli import main
from ordrec.trainer.data.interactions import LEVELS_ATTRIBUTE, LevelMapping
from ordrec.trainer.data.readers import read_input
from ordrec.trainer.data.splits import split_ratings
from ordrec.trainer.models.coe import COE
from ordrec.trainer.models.dcr import DCR
from ordrec.trainer.models.pipeline import configure
from ordrec.trainer.models.selection import stream
from ordrec.trainer.models.tuning import SettingsTuner, search_space
from tests.generated import make_ratings, random_ratings, write_plays


def grouped(seed=0, groups=6, users_per_group=15, block=12, per_user=8):
    """Each group of users rates items of its own block only: one dimension cannot tell six
    groups apart, two can."""
    rng = np.random.default_rng(seed)
    user, item = [], []
    for g in range(groups):
        for k in range(users_per_group):
            item += list(g * block + rng.choice(block, per_user, replace=False))
            user += [g * users_per_group + k] * per_user
    return make_ratings(user, item, rng.integers(3, 6, len(user)), groups * users_per_group, groups * block)


def pairs(data) -> set[tuple[int, int]]:
    return set(zip(data.user.tolist(), data.item.tolist()))


@pytest.fixture
def fits(monkeypatch) -> list[set]:
    """The (user, item) pairs of every DCR fit, in order."""
    seen: list[set] = []
    real_fit = DCR.fit

    def recording_fit(self, data, *args, **kwargs):
        seen.append(pairs(data))
        return real_fit(self, data, *args, **kwargs)

    monkeypatch.setattr(DCR, "fit", recording_fit)
    return seen


def test_the_tuner_fits_only_on_the_data_it_is_given_and_validates_on_its_own_stream(fits):
    data = random_ratings(1, n_users=40, n_items=30, per_user=12)
    given, outside = split_ratings(data, 0.25, 5)
    tuner = SettingsTuner(
        DCR(n_components=2, max_iter=3, random_state=7), budget_seconds=300, min_users=0
    ).fit(given)
    fit_part, _ = split_ratings(given, 0.2, stream(7, "tuning"))
    assert len(fits) >= 3 and fits[0] == pairs(given)  # the defaults, on all it was given
    refit = fits[-1] if tuner.cv_results_["status"][-1] == "refitted on all the data" else None
    on_validation = fits[1:-1] if refit is not None else fits[1:]
    assert all(seen == pairs(fit_part) for seen in on_validation)
    assert all(not seen & pairs(outside) for seen in fits)


def test_the_defaults_come_first_and_are_kept_when_nothing_beats_them(fits):
    # Every user rated 9 of 10 items: each held-out pair is among the 3 unseen items, so every
    # candidate finds all of them (recall 1) and none beats the defaults.
    rng = np.random.default_rng(0)
    user = np.repeat(np.arange(20), 9)
    item = np.concatenate([np.sort(rng.choice(10, 9, replace=False)) for _ in range(20)])
    data = make_ratings(user, item, rng.integers(1, 6, user.size), 20, 10)
    tuner = SettingsTuner(
        DCR(n_components=3, max_iter=4, unrated_share=0.5), budget_seconds=300, min_users=0
    ).fit(data)
    results = tuner.cv_results_
    assert results["params"][0] == {"n_components": 3, "unrated_share": 0.5, "max_iter": 4}
    scored = [s for s in results["validation_recall_at_10"] if s is not None]
    assert len(scored) > 2 and set(scored) == {1.0}
    assert tuner.best_params_ == results["params"][0]
    assert tuner.outcome_ == "kept defaults: none better on validation"
    assert "refitted on all the data" not in results["status"]
    assert tuner.best_estimator_.n_components == 3


@pytest.mark.parametrize("estimator", [DCR(n_components=1, max_iter=10), COE(n_components=1, max_iter=10)])
def test_more_dimensions_are_chosen_where_the_data_needs_them(estimator):
    tuner = SettingsTuner(estimator, budget_seconds=300, min_users=0).fit(grouped())
    assert tuner.best_params_["n_components"] == 2
    one, two = tuner.cv_results_["validation_recall_at_10"][1:3]  # the defaults, then 2 dimensions
    assert two > one
    assert tuner.best_estimator_.n_components == 2  # refitted on all the data with them


def test_a_budget_too_small_for_a_second_fit_fits_once_and_keeps_the_defaults(fits):
    tuner = SettingsTuner(DCR(n_components=2, max_iter=3), budget_seconds=0.0, min_users=0).fit(grouped())
    assert len(fits) == 1 and len(tuner.cv_results_["params"]) == 1
    assert tuner.outcome_.startswith("kept defaults: budget")
    assert tuner.best_params_ == {"n_components": 2, "unrated_share": 1.0, "max_iter": 3}
    assert tuner.record()["budget_seconds"] == 0.0 and tuner.elapsed_ > 0


def test_a_candidate_predicted_beyond_the_budget_is_skipped(fits, monkeypatch):
    # Every fit of the defaults on all the data is taken to cost 10 s (a fixed rate, not the
    # machine's): with 30 s the cheaper neighbours fit (n_components=2: 4 s on the fit part plus
    # a 5 s refit), twice the dimensions (16 s + 20 s) is predicted beyond what is left and never fitted.
    monkeypatch.setattr(
        SettingsTuner, "observe", lambda self, params, rows, seconds: setattr(self, "seconds_per_fit_", 10.0)
    )
    tuner = SettingsTuner(DCR(n_components=4, max_iter=20), budget_seconds=30, min_users=0).fit(grouped())
    status = dict(zip(map(str, tuner.cv_results_["params"]), tuner.cv_results_["status"]))
    doubled = str({"n_components": 8, "unrated_share": 1.0, "max_iter": 20})
    halved = str({"n_components": 2, "unrated_share": 1.0, "max_iter": 20})
    assert status[doubled] == "skipped: budget"
    assert status[halved] == "scored on validation"
    assert len(fits) == sum(not s.startswith("skipped") for s in tuner.cv_results_["status"])


def test_the_manifest_records_the_choice(tmp_path):
    pipeline = configure(
        "dcr",
        {"tune": True, "n_components": 1, "max_iter": 10, "tune_budget_seconds": 300, "tune_min_users": 0},
    )
    artifact = pipeline.fit(grouped()).to_artifact()
    Registry(tmp_path).publish("m", artifact)
    stored = Registry(tmp_path).load("m").hyperparameters
    tuning = stored["tuning"]
    assert stored["tune"] is True and stored["tune_budget_seconds"] == 300
    assert tuning["chosen"]["n_components"] == stored["n_components"] == 2
    assert tuning["budget_seconds"] == 300 and 0 < tuning["elapsed_seconds"] <= 300
    first = tuning["candidates"][0]
    assert first["params"] == {"n_components": 1, "unrated_share": 1.0, "max_iter": 10}
    assert {"validation_recall_at_10", "seconds", "status"} <= set(first)


def test_train_tunes_by_default_and_versions_prints_the_choice(sample_dir, tmp_path, capsys):
    data = str(sample_dir / "ratings.data")
    flags = [
        "--set",
        "max_iter=2",
        "--set",
        "n_components=2",
        "--set",
        "tune_budget_seconds=120",
        "--set",
        "tune_min_users=0",
    ]
    assert main(["train", "dcr", "--data", data, "--registry", str(tmp_path), *flags]) == 0
    artifact = Registry(tmp_path).load("dcr")
    assert artifact.hyperparameters["tune"] is True
    candidates = artifact.hyperparameters["tuning"]["candidates"]
    assert len(candidates) > 1  # the unrated share was searched
    # the settings given are kept as given, never searched
    assert not any({"n_components", "max_iter"} & set(c["params"]) for c in candidates)
    assert artifact.hyperparameters["n_components"] == 2
    capsys.readouterr()
    assert main(["registry", "versions", "--registry", str(tmp_path)]) == 0
    assert "tuning: " in capsys.readouterr().out


def test_tune_false_publishes_the_model_of_a_plain_fit(sample_dir, tmp_path):
    data = str(sample_dir / "ratings.data")
    flags = ["--set", "max_iter=2", "--set", "n_components=2", "--set", "tune=false"]
    assert main(["train", "dcr", "--data", data, "--registry", str(tmp_path), *flags]) == 0
    published = Registry(tmp_path).load("dcr")
    plain = configure("dcr", {"max_iter": 2, "n_components": 2, "random_state": 0})
    expected = plain.fit(read_input("ratings", data)).to_artifact()
    assert published.arrays.keys() == expected.arrays.keys()
    for key, array in expected.arrays.items():
        np.testing.assert_array_equal(published.arrays[key], array, err_msg=key)
    assert published.hyperparameters["tune"] is False and "tuning" not in published.hyperparameters


@pytest.mark.parametrize("gate", [[], ["--gate"]])
def test_train_on_interactions_chooses_the_levels_and_records_them(tmp_path, gate):
    data = write_plays(tmp_path / "plays.csv")
    flags = [
        "--feedback",
        "implicit",
        "--set",
        "max_iter=30",
        "--set",
        "n_components=4",
        "--set",
        "tune_min_users=0",
        *gate,
    ]
    assert main(["train", "coe", "--data", data, "--registry", str(tmp_path / "reg"), *flags]) == 0
    artifact = Registry(tmp_path / "reg").load("coe")
    tuning = artifact.hyperparameters["tuning"]
    assert tuning["candidates"][0]["params"]["levels"] == "quantile:5"  # the default mapping first
    chosen = LevelMapping.parse(tuning["chosen"]["levels"])
    recorded = artifact.attributes[LEVELS_ATTRIBUTE]
    assert (recorded["scheme"], recorded["levels"], recorded["strength"]) == (
        chosen.scheme,
        chosen.levels,
        "plays",
    )


def test_a_gain_within_the_noise_of_the_split_keeps_the_defaults():
    # The same clear gain as above: kept at any usual confidence, refused when asked for more
    # standard errors than any gain on 90 users can reach.
    strict = SettingsTuner(
        COE(n_components=1, max_iter=10), budget_seconds=300, confidence=1e6, min_users=0
    ).fit(grouped())
    assert strict.best_params_ == {"n_components": 1, "max_iter": 10}
    assert strict.outcome_ == "kept defaults: none better on validation"
    one, two = strict.cv_results_["validation_recall_at_10"][1:3]
    assert two > one  # it scored better, but not clearly enough


def test_too_few_users_to_validate_on_keep_the_defaults_without_the_search(fits):
    # 90 users: a clear gain (two dimensions over one, above) is not looked for below min_users.
    tuner = SettingsTuner(DCR(n_components=1, max_iter=10), budget_seconds=300, min_users=91).fit(grouped())
    assert len(fits) == 1 and tuner.best_params_["n_components"] == 1
    assert re.fullmatch(r"kept defaults: \d+ users to validate on \(min_users 91\)", tuner.outcome_)


def test_reproduce_topn_says_what_the_tuner_chose(tmp_path, capsys):
    data = write_plays(tmp_path / "plays.csv")
    argv = ["reproduce", "topn", "--data", data, "--feedback", "implicit", "--runs", "1", "--models", "dcr"]
    argv += ["--references", "popularity", "--set", "dcr.tune=true", "--set", "dcr.tune_min_users=0"]
    assert main([*argv, "--set", "dcr.max_iter=3", "--set", "dcr.tune_budget_seconds=30"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("run 1/1 dcr:")]
    assert len(lines) == 1 and "; tuning: " in lines[0], lines


@pytest.mark.parametrize("split", ["random", "time"])
def test_a_job_tunes_on_the_split_its_gate_measures(tmp_path, split):
    from ordrec.trainer.job import load_job
    from tests.test_job import VALID, write_job

    text = VALID.replace("seed = 7 }", f'seed = 7, split = "{split}" }}')
    (model,) = load_job(write_job(tmp_path, text)).models
    assert model.gate.split == split and model.pipeline().estimator.split == split
    given = load_job(
        write_job(tmp_path, text.replace("n_components = 4", 'n_components = 4, tune_split = "random"'))
    )
    assert given.models[0].pipeline().estimator.split == "random"  # a table's own choice stands


@pytest.mark.parametrize("split", ["random", "time"])
def test_reproduce_topn_tunes_on_a_validation_split_carved_like_its_test_split(tmp_path, monkeypatch, split):
    splits = []
    real_fit = SettingsTuner.fit

    def recording_fit(self, data, *args, **kwargs):
        splits.append(self.split)
        return real_fit(self, data, *args, **kwargs)

    monkeypatch.setattr(SettingsTuner, "fit", recording_fit)
    data = write_plays(tmp_path / "plays.csv", timestamps=True)
    argv = ["reproduce", "topn", "--data", data, "--feedback", "implicit", "--runs", "1", "--models", "dcr"]
    argv += ["--references", "popularity", "--split", split, "--set", "dcr.tune=true"]
    assert main([*argv, "--set", "dcr.max_iter=3", "--set", "dcr.tune_budget_seconds=0"]) == 0
    assert splits and set(splits) == {split}  # every fit the run makes (levels chosen first)


def test_dcr_epochs_are_searched_up_to_four_times_the_given_and_coe_twice():
    # On interaction logs DCR's validation recall still rose from 100 to 400 epochs, COE's at twice
    # its epochs on one split and not the other (docs/dcr.md).
    assert search_space(DCR(max_iter=10), grouped())["max_iter"] == (10, 5, 20, 40)
    assert search_space(COE(max_iter=10), grouped())["max_iter"] == (10, 5, 20)
