"""The shared model-selection pieces: the significant-gain rule, early stopping, the standard
error and the one-standard-error choice, grid points and the search over them, and named
random streams."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordrec.trainer.models.selection import (
    EarlyStopping,
    ValidatedGrid,
    best_mean_index,
    grid_points,
    one_standard_error_choice,
    significant_gain,
    standard_error,
    stream,
)


def test_gain_is_kept_only_above_margin_plus_confidence_times_se():
    gain = np.array([0.1, 0.3, 0.2, 0.2])
    se = np.std(gain, ddof=1) / 2
    assert significant_gain(gain, margin=0.0, confidence=1.0).kept
    assert not significant_gain(gain, margin=0.2 - se + 1e-9, confidence=1.0).kept
    verdict = significant_gain(gain, margin=0.01, confidence=0.0)
    assert verdict.kept and verdict.mean == pytest.approx(0.2) and verdict.se == pytest.approx(se)


def test_one_unit_or_none_is_never_significant():
    assert not significant_gain(np.array([5.0]), margin=0.0, confidence=1.0).kept
    assert not significant_gain(np.array([]), margin=0.0, confidence=0.0).kept


@given(st.lists(st.floats(-1, 1), min_size=2, max_size=30), st.floats(0, 0.5), st.floats(0, 3))
def test_gain_rule_matches_its_definition(values, margin, confidence):
    gain = np.array(values)
    se = np.std(gain, ddof=1) / np.sqrt(gain.size)
    assert significant_gain(gain, margin=margin, confidence=confidence).kept == (
        gain.mean() > margin + confidence * se
    )


def test_early_stopping_tracks_each_level_and_waits_for_all():
    stop = EarlyStopping([0.0, 0.0], patience=2)
    assert list(stop.update(1, [1.0, 1.0])) == [True, True]
    assert list(stop.update(2, [0.5, 2.0])) == [False, True]
    assert not stop.update(3, [0.5, 1.0]).any() and not stop.should_stop  # level 1 improved at 2
    stop.update(4, [0.0, 0.0])
    assert stop.should_stop and list(stop.best_epochs) == [1, 2] and list(stop.best) == [1.0, 2.0]


def test_relative_tolerance_ignores_creeping_gains_and_min_epochs_holds():
    stop = EarlyStopping(-100.0, patience=1, tol=0.01, relative=True, min_epochs=3)
    assert not stop.update(1, -99.5)[0]  # within 1 % of the best
    assert stop.update(2, -98.0)[0]
    stop.update(3, -98.0)
    assert stop.should_stop and stop.stale == 1
    with pytest.raises(ValueError, match="expected 1 scores"):
        stop.update(4, [1.0, 2.0])


def test_standard_error_is_the_sample_deviation_over_root_n_and_says_when_undefined():
    values = np.array([1.0, 2.0, 4.0, 7.0])
    assert standard_error(values) == pytest.approx(np.std(values, ddof=1) / 2)
    assert np.isnan(standard_error(np.array([3.0])))
    assert standard_error(np.array([]), undefined=0.0) == 0.0


def test_grid_points_vary_the_last_name_fastest():
    points = grid_points({"reg": (0.1, 0.2), "n_components": (8, 16, 32)})
    assert len(points) == 6 and points[0] == {"reg": 0.1, "n_components": 8}
    assert [p["n_components"] for p in points[:3]] == [8, 16, 32] and points[3]["reg"] == 0.2
    assert grid_points({}) == [{}]


def test_named_streams_are_reproducible_and_independent_of_the_seed_and_of_each_other():
    draw = lambda rng: rng.random(5)  # noqa: E731
    np.testing.assert_array_equal(draw(stream(3, "refinement")), draw(stream(3, "refinement")))
    others = [stream(3, "early_stopping"), stream(4, "refinement"), np.random.default_rng(3)]
    for other in others:
        assert not np.array_equal(draw(stream(3, "refinement")), draw(other))


def test_validated_grid_keeps_the_first_best_point_and_records_every_point():
    def evaluate(params):
        score = -abs(params["lr"] - 3) - params["reg"]  # best at lr 3, reg 0; lr 2 and 4 tie
        return score, dict(params, chosen=True), f"model {params['lr']}"

    grid = ValidatedGrid(evaluate, {"lr": (5, 4, 3, 2), "reg": (0, 1)}).fit({"rank": 4})
    assert grid.best_params_ == {"rank": 4, "lr": 3, "reg": 0, "chosen": True}
    assert grid.best_model_ == "model 3" and grid.best_score_ == 0
    assert [r["params"]["lr"] for r in grid.cv_results_] == [5, 5, 4, 4, 3, 3, 2, 2]
    tied = ValidatedGrid(evaluate, {"lr": (4, 2), "reg": (0,)}).fit()
    assert tied.best_params_["lr"] == 4  # a tie keeps the first
    nothing = ValidatedGrid(lambda p: (float("nan"), p, None), {"lr": (0.1,)}).fit({"rank": 2})
    assert nothing.best_params_ == {"rank": 2} and nothing.best_model_ is None


def test_one_standard_error_choice_is_the_first_candidate_within_one_paired_se_of_the_best():
    rng = np.random.default_rng(0)
    noise = rng.normal(size=200)
    simple = 0.70 + noise
    spread = rng.normal(size=200)
    best = simple + 0.02 + 0.5 * (spread - spread.mean())  # 0.02 higher, but a noisy difference
    clear = simple + 1.0  # far above: nothing simpler is within one SE of it
    values = [simple, best]
    diff = best - simple
    within = diff.mean() <= np.std(diff, ddof=1) / np.sqrt(diff.size)
    assert one_standard_error_choice(values) == (0 if within else 1)
    assert within  # the case this test is about: the simpler candidate is kept
    assert one_standard_error_choice([simple, clear]) == 1
    assert one_standard_error_choice([best, simple]) == 0  # the best itself comes first
    assert best_mean_index([simple, best, best.copy()]) == 1
