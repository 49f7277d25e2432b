"""DCR's and COE's ``solver`` settings (``base.Settings`` groups), as objects, dicts of some
fields or None, and as the flat names a job table writes."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.trainer.models.coe import COE, COESolver
from ordrec.trainer.models.dcr import DCR, DCRSolver
from ordrec.trainer.models.pipeline import configure

DCR_SOLVERS = st.builds(
    DCRSolver,
    learning_rate_decay=st.floats(0, 10),
    unrated_power=st.floats(0, 1),
    dtype=st.sampled_from(["float32", "float64"]),
)
COE_SOLVERS = st.builds(
    COESolver,
    learning_rate_final_ratio=st.floats(0, 1),
    steps_per_epoch=st.integers(0, 10**6),
    type_a_share=st.none() | st.floats(0, 1),
    group_power=st.floats(-2, 2),
    unrated_power=st.floats(0, 2),
)


@settings(max_examples=40, deadline=None)
@given(st.one_of(DCR_SOLVERS, COE_SOLVERS))
def test_a_solver_round_trips_through_its_dict_and_its_flat_names(solver):
    cls = type(solver)
    estimator = DCR if cls is DCRSolver else COE
    assert cls.of(solver) is solver
    assert cls.of(asdict(solver)) == solver
    flat = dict(asdict(solver), n_components=3)
    assert estimator.nest_flat(flat) == {"n_components": 3, "solver": solver}
    assert estimator.from_flat(**flat).solver_settings() == solver


def test_a_dict_sets_some_fields_and_none_is_the_defaults():
    assert DCRSolver.of(None) == DCRSolver()
    assert DCRSolver.of({"dtype": "float64"}) == DCRSolver(dtype="float64")
    assert COESolver.of({"type_a_share": None}).type_a_share is None
    assert DCR(solver={"unrated_power": 0.0}).solver_settings() == DCRSolver(unrated_power=0.0)
    assert COE().solver_settings() == COESolver()
    assert DCR.nest_flat({"n_components": 3}) == {"n_components": 3}  # nothing flat: unchanged
    with pytest.raises(dataclasses.FrozenInstanceError):
        DCRSolver().dtype = "float64"  # type: ignore[misc]


@pytest.mark.parametrize(
    "cls,given,name",
    [
        (DCRSolver, {"dtype": "int8"}, "dtype"),
        (DCRSolver, {"learning_rate_decay": float("inf")}, "learning_rate_decay"),
        (DCRSolver, {"unrated_power": True}, "unrated_power"),
        (DCRSolver, {"lr_decay": 0.1}, "lr_decay"),
        (DCRSolver, "fast", "solver"),
        (DCRSolver, ["dtype"], "solver"),
        (COESolver, {"steps_per_epoch": 1.5}, "steps_per_epoch"),
        (COESolver, {"type_a_share": "half"}, "type_a_share"),
        (COESolver, {"group_power": float("nan")}, "group_power"),
        (COESolver, 7, "solver"),
    ],
)
def test_a_bad_solver_is_refused_by_name(cls, given, name):
    with pytest.raises(ValueError, match=name):
        cls.of(given, "DCR", "solver")


def test_a_flat_field_beside_a_bad_solver_names_the_solver():
    with pytest.raises(ValueError, match="solver"):
        configure("dcr", {"solver": "fast", "dtype": "float64"})
    with pytest.raises(ValueError, match="solver"):
        configure("coe", {"solver": 3, "group_power": 0.0})
