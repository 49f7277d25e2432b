"""A job table's or ``train --set``'s flat settings become the estimator, its model-selection
wrappers and the artifact's serving choices (trainer/models/pipeline.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.trainer.cli import main
from ordrec.trainer.models import pipeline
from ordrec.trainer.models.coe import COE, COESolver
from ordrec.trainer.models.dcr import (
    DCR,
    DCRSolver,
    DCRVariants,
    EarlyStoppedDCR,
    PairwiseDCR,
    ValidatedRefinement,
    ValidationStopping,
    validation_split,
)
from ordrec.trainer.models.knnscal_selection import served_settings
from ordrec.trainer.models.pipeline import Wrapper, accepted_params, configure
from tests.test_dcr import planted


def test_dcr_takes_its_parameters_its_model_selection_and_its_serving_choices_by_flat_name():
    names = accepted_params("dcr")
    assert set(DCR.param_names()) < set(names)
    assert {"early_stopping", "val_tol", "pairwise_validation", "ann_min_items", "item_shrinkage"} <= set(
        names
    )
    assert {"pairwise", "pairwise_learning_rate", "pairs_per_epoch", "learning_rate_decay", "dtype"} <= set(
        names
    )
    tuning = [
        "tune",
        "tune_budget_seconds",
        "tune_validation_fraction",
        "tune_split",
        "tune_keep",
        "tune_confidence",
        "tune_min_users",
    ]
    assert accepted_params("coe") == COE.param_names() + list(COESolver.field_names()) + tuning


def test_the_solver_fields_given_flat_become_the_solver_and_are_recorded_flat():
    dcr = configure("dcr", {"dtype": "float64", "unrated_power": 0.2, "n_components": 2, "max_iter": 1})
    assert dcr.estimator.solver == DCRSolver(unrated_power=0.2, dtype="float64")
    # a flat field wins over the same field of a given solver dict
    both = configure("dcr", {"solver": {"dtype": "float64", "learning_rate_decay": 0.5}, "dtype": "float32"})
    assert both.estimator.solver == DCRSolver(learning_rate_decay=0.5, dtype="float32")
    coe = configure("coe", {"group_power": 0.5, "type_a_share": None, "n_components": 2, "max_iter": 1})
    assert coe.estimator.solver == COESolver(group_power=0.5, type_a_share=None)
    data = planted(3, n_users=20, n_items=15, per_user=8)
    recorded = dcr.fit(data).to_artifact().hyperparameters
    assert (recorded["dtype"], recorded["unrated_power"], recorded["learning_rate_decay"]) == (
        "float64",
        0.2,
        0.02,
    )
    assert "solver" not in recorded and recorded["pairwise"] is False
    recorded = coe.fit(data).to_artifact().hyperparameters
    assert (recorded["group_power"], recorded["type_a_share"], recorded["steps_per_epoch"]) == (0.5, None, 0)
    assert "solver" not in recorded


def test_the_pairwise_settings_given_flat_become_the_refinement_and_are_recorded_flat():
    flat = {
        "pairwise_learning_rate": 0.03,
        "pairwise_reg": 0.01,
        "pairwise_max_iter": 2,
        "pairs_per_epoch": 0.5,
    }
    always = configure(
        "dcr", {"pairwise": True, "pairwise_validation": False, "n_components": 2, "max_iter": 1, **flat}
    )
    assert isinstance(always.estimator, PairwiseDCR)
    assert always.estimator.settings() == {
        "learning_rate": 0.03,
        "reg": 0.01,
        "max_iter": 2,
        "pairs_per_epoch": 0.5,
    }
    artifact = always.fit(planted(3, n_users=20, n_items=15, per_user=8)).to_artifact()
    assert artifact.attributes["pairwise"] is True and artifact.hyperparameters["pairwise"] is True
    assert {name: artifact.hyperparameters[name] for name in flat} == flat


def test_the_pipeline_passes_research_options_to_the_estimators_fit_and_names_the_served_model():
    """What the paper protocol fits (variants, a validation set, the stopping rule) goes through
    the pipeline's fit, with the refinement on its own stream, as a DCR refined by hand."""
    data = planted(4, n_users=30, n_items=20, per_user=10)
    fit, val = validation_split(data, np.random.default_rng(1))
    options = dict(
        variants=DCRVariants(order="random", item_bias=0.5), stopping=ValidationStopping(patience=2)
    )
    flat = {"n_components": 3, "max_iter": 6, "pairwise": True, "pairwise_validation": False}
    pipe = configure("dcr", dict(flat, pairwise_max_iter=2)).fit(fit, validation=val, **options)
    by_hand = DCR(n_components=3, max_iter=6).fit(fit, validation=val, **options)
    PairwiseDCR(by_hand, max_iter=2).refine_fitted(by_hand)
    served = pipe.best_estimator_
    assert served is pipe.estimator.best_estimator_ and served.variants_.order == "random"
    assert served.best_epochs_ == by_hand.best_epochs_
    np.testing.assert_array_equal(served.U_, by_hand.U_)
    np.testing.assert_array_equal(served.V_, by_hand.V_)
    plain = configure("dcr", {"n_components": 3, "max_iter": 2}).fit(
        fit, variants=DCRVariants(level_epochs=[1, 0, 2, 1, 1])
    )
    assert plain.best_estimator_ is plain.estimator and plain.estimator.best_epochs_ == [1, 0, 2, 1, 1]


def test_the_flat_settings_build_the_wrappers():
    plain = configure("dcr", {"n_components": 4})
    assert type(plain.estimator) is DCR and plain.serving == {} and plain.selection == ()
    refined = configure("dcr", {"pairwise": True, "pairwise_margin": 0.01, "validation_folds": 2})
    assert isinstance(refined.estimator, ValidatedRefinement)
    assert (refined.estimator.margin, refined.estimator.folds) == (0.01, 2)
    assert refined.estimator.max_users == 100_000  # the default sample of scored users
    every = configure("dcr", {"pairwise": True, "pairwise_validation_max_users": None})
    assert every.estimator.max_users is None
    assert configure("dcr", {"pairwise": True, "pairwise_validation_max_users": 50}).estimator.max_users == 50
    assert isinstance(refined.estimator.estimator, PairwiseDCR)
    always = configure("dcr", {"pairwise": True, "pairwise_validation": False})
    assert type(always.estimator) is PairwiseDCR and type(always.estimator.estimator) is DCR
    stopped = configure("dcr", {"early_stopping": True, "val_tol": 0.01, "patience": 3, "pairwise": True})
    assert isinstance(stopped.estimator, EarlyStoppedDCR)
    assert isinstance(stopped.estimator.estimator, ValidatedRefinement)
    assert stopped.estimator.model is stopped.estimator.estimator.estimator.estimator
    assert (stopped.estimator.stopping.patience, stopped.estimator.stopping.tol) == (3, 0.01)
    assert stopped.selection == ("pairwise", "early_stopping")
    served = configure("dcr", {"ann_min_items": 5, "item_shrinkage": 2.0})
    assert served.serving == {"ann_min_items": 5, "item_shrinkage": 2.0}


def test_the_serving_choices_reach_the_artifact():
    data = planted(3, n_users=20, n_items=15, per_user=8)
    shrunk = configure("dcr", {"n_components": 2, "max_iter": 2, "item_shrinkage": 2.0}).fit(data)
    plain = DCR(n_components=2, max_iter=2).fit(data)
    counts = np.bincount(data.item, minlength=data.n_items)
    np.testing.assert_allclose(
        shrunk.to_artifact().arrays["item_factors"],
        plain.to_artifact().arrays["item_factors"] * (counts / (counts + 2.0))[:, None],
        rtol=1e-6,
    )
    assert shrunk.to_artifact().hyperparameters["item_shrinkage"] == 2.0
    stopped = configure("dcr", {"n_components": 2, "max_iter": 2, "early_stopping": True, "val_tol": 0.01})
    recorded = stopped.fit(data).to_artifact().hyperparameters
    assert (
        recorded["early_stopping"] is True and recorded["val_tol"] == 0.01 and recorded["n_components"] == 2
    )


@pytest.mark.parametrize(
    "params,name",
    [
        ({"rank": 3}, "rank"),
        ({"validation_folds": 0}, "validation_folds"),
        ({"early_stopping": "yes"}, "early_stopping"),
        ({"pairwise_confidence": -1.0}, "pairwise_confidence"),
        ({"pairwise_validation_max_users": 0}, "pairwise_validation_max_users"),
        ({"pairwise_validation_max_users": "all"}, "pairwise_validation_max_users"),
        ({"ann_min_items": 0}, "ann_min_items"),
        ({"ann_params": "hnsw"}, "ann_params"),
        ({"ann_params": {"efSearch": 3}}, "efSearch"),
        ({"n_components": 0}, "n_components"),
        ({"dtype": "float16"}, "dtype"),
        ({"unrated_power": 2.0}, "unrated_power"),
        ({"learning_rate_decay": -1.0}, "learning_rate_decay"),
        ({"solver": {"steps": 3}}, "steps"),
        ({"pairwise": "yes"}, "pairwise"),
        ({"pairwise_max_iter": -1}, "pairwise_max_iter"),
        ({"pairs_per_epoch": "many"}, "pairs_per_epoch"),
    ],
)
def test_a_bad_or_unknown_setting_is_refused_by_name_before_any_fitting(params, name):
    with pytest.raises(ValueError, match=name):
        configure("dcr", params).fit(planted(0, n_users=5, n_items=5, per_user=3))


@pytest.mark.parametrize(
    "params,name",
    [
        ({"group_power": "x"}, "group_power"),
        ({"type_a_share": 1.5}, "type_a_share"),
        ({"steps_per_epoch": -1}, "steps_per_epoch"),
        ({"solver": {"dtype": "float64"}}, "dtype"),
        ({"solver": "fast"}, "solver"),
    ],
)
def test_a_bad_coe_setting_is_refused_by_name_before_any_fitting(params, name):
    with pytest.raises(ValueError, match=name):
        configure("coe", params).fit(planted(0, n_users=5, n_items=5, per_user=3))


def test_model_selection_never_reaches_a_cluster():
    for option in ("pairwise", "early_stopping"):
        with pytest.raises(ValueError, match=f"{option}=True"):
            configure("dcr", {option: True}).fit_on_cluster(planted(0), "local:1")


@settings(max_examples=30, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "n_components": st.integers(1, 64),
            "learning_rate": st.floats(0.001, 1.0),
            "pairwise": st.booleans(),
            "pairwise_max_iter": st.integers(0, 50),
            "dtype": st.sampled_from(["float32", "float64"]),
            "unrated_power": st.floats(0.0, 1.0),
            "early_stopping": st.booleans(),
            "validation_folds": st.integers(1, 5),
            "pairwise_validation": st.booleans(),
            "ann_min_items": st.integers(1, 10**6),
        },
    )
)
def test_the_model_keeps_exactly_the_model_parameters_given(params):
    configured = configure("dcr", params)
    estimator = configured.estimator
    while not isinstance(estimator, DCR):
        estimator = estimator.estimator
    model_params = {k: v for k, v in params.items() if k in DCR.param_names()}
    solver = {k: v for k, v in params.items() if k in DCRSolver.field_names()}
    assert estimator.get_params() == dict(
        DCR().get_params(), **model_params, solver=DCRSolver(**solver) if solver else None
    )
    refinement = (
        configured.estimator.estimator
        if isinstance(configured.estimator, EarlyStoppedDCR)
        else configured.estimator
    )
    if isinstance(refinement, ValidatedRefinement):
        refinement = refinement.estimator
    assert isinstance(refinement, PairwiseDCR) == bool(params.get("pairwise"))
    if params.get("pairwise"):
        assert refinement.max_iter == params.get("pairwise_max_iter", 20)
    assert ("early_stopping" in configured.selection) == bool(params.get("early_stopping"))


def test_the_old_name_of_a_renamed_setting_still_works_and_says_so():
    with pytest.warns(FutureWarning, match="pairwise_validation_max_users"):
        old = configure("dcr", {"pairwise": True, "pairwise_validation_users": 50})
    assert old.estimator.max_users == 50
    assert "pairwise_validation_users" not in accepted_params("dcr")


def test_the_old_knnscal_names_still_reach_their_settings():
    old = {
        "ne_starts": 2,
        "ne_rank_decay": 3.0,
        "refinement": "always",
        "hop2_fraction": 0.1,
        "cmds_max_n": 9,
    }
    with pytest.warns(FutureWarning, match="neighbor_embedding_starts"):
        search = configure("knnscal", dict(old, ne_exact_max_n=7)).estimator.estimator
    model = served_settings(search)
    assert (search.n_starts, search.rank_decay, model.two_hop_fraction) == (2, 3.0, 0.1)
    solver = model.solver_settings()
    assert (search.estimator.keep_iterations, solver.classical_mds_max_n, solver.exact_max_n) == (
        "always",
        9,
        7,
    )
    with pytest.warns(FutureWarning, match="classical_mds_max_n"):  # inside a solver table too
        table = served_settings(configure("knnscal", {"solver": {"cmds_max_n": 9}}).estimator)
    assert table.solver_settings().classical_mds_max_n == 9


def test_the_fit_says_how_many_fits_of_the_estimator_it_runs():
    assert configure("dcr", {}).describe() == "dcr: 1 fit of the estimator"
    # pairwise: 3 hold-outs for the validation of the refinement, then the fit on all the ratings
    assert configure("dcr", {"pairwise": True}).describe() == "dcr with pairwise: 4 fits of the estimator"
    both = configure("dcr", {"pairwise": True, "early_stopping": True})
    assert both.describe() == "dcr with pairwise, early_stopping: 7 fits of the estimator"
    assert configure("dcr", {"pairwise": True, "pairwise_validation": False}).planned_fits() == 1
    assert configure("rtf", {"grid_validation": True, "grid_reg": [0.1]}).planned_fits() == 3


def test_the_manifest_records_every_switch_and_the_settings_of_the_wrappers_that_ran():
    plain = configure("dcr", {"n_components": 2})
    assert plain.recorded == {
        "pairwise": False,
        "pairwise_validation": False,
        "early_stopping": False,
        "tune": False,
    }
    refined = configure("dcr", {"pairwise": True, "pairwise_max_iter": 3}).recorded
    assert refined["pairwise"] is refined["pairwise_validation"] is True
    assert (refined["pairwise_max_iter"], refined["pairwise_learning_rate"], refined["validation_folds"]) == (
        3,
        0.01,
        3,
    )


def test_a_wrapper_row_is_all_a_new_model_selection_needs(monkeypatch):
    """One more row of the table: its switch and setting are accepted, checked by name, wrap the
    estimator when on and are recorded; nothing else lists them."""

    class Doubled:
        _parameter_constraints = {"times": [int]}

        def __init__(self, estimator, *, times: int = 2):
            self.estimator, self.times = estimator, times

    row = Wrapper("doubled", Doubled, {"doubled_times": "times"}, (Doubled,))
    monkeypatch.setitem(pipeline.WRAPPERS, "coe", (row,))
    assert accepted_params("coe")[-2:] == ["doubled", "doubled_times"]
    wrapped = configure("coe", {"doubled": True, "n_components": 2})
    assert isinstance(wrapped.estimator, Doubled) and wrapped.estimator.times == 2
    assert isinstance(wrapped.estimator.estimator, COE) and wrapped.selection == ("doubled",)
    assert wrapped.recorded == {"doubled": True, "doubled_times": 2}
    assert type(configure("coe", {"doubled_times": 3}).estimator) is COE
    with pytest.raises(ValueError, match="doubled_times"):
        configure("coe", {"doubled": True, "doubled_times": "x"})


def test_train_logs_the_fits_a_pairwise_fit_runs(sample_dir, tmp_path, capsys):
    flags = ["--set", "pairwise=true", "--set", "validation_folds=2", "--set", "max_iter=1"]
    flags += ["--set", "n_components=2", "--set", "pairwise_max_iter=1", "--set", "tune=false"]
    data = str(sample_dir / "ratings.data")
    assert main(["train", "dcr", "--data", data, "--registry", str(tmp_path), *flags]) == 0
    assert "fit: dcr with pairwise: 3 fits of the estimator" in capsys.readouterr().err
