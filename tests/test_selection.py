"""The shared model-selection pieces: the significant-gain rule, early stopping, the standard
error, grid points and named random streams."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordrec.trainer.models.selection import (
    EarlyStopping,
    grid_points,
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
