"""The estimator conventions shared by every kind: keyword-only parameters, one
declared constraint per parameter, and a ValueError naming parameter, value and rule."""

from __future__ import annotations

import inspect
from numbers import Integral, Real

import numpy as np
import pytest

from ordrec.service.indices.models import kinds
from ordrec.trainer.models import estimator_class
from ordrec.trainer.models.base import Interval, Options, validate_params
from ordrec.trainer.models.dcr import DCR, DCRVariants

BUILTIN = ("dcr", "coe", "rtf", "score", "knnscal")


@pytest.mark.parametrize("kind", BUILTIN)
def test_parameters_are_keyword_only_declared_and_named_alike(kind):
    cls = estimator_class(kind)
    params = inspect.signature(cls.__init__).parameters
    assert all(p.kind is p.KEYWORD_ONLY for name, p in params.items() if name != "self")
    with pytest.raises(TypeError):
        cls(2)  # no positional hyperparameters
    assert set(cls._parameter_constraints) == set(cls.param_names())
    names = set(cls.param_names())
    assert "random_state" in names and "seed" not in names
    assert not names & {"rank", "dim", "dims", "epochs", "iterations", "lr", "lr_final", "lr_decay"}
    cls()._validate_params()  # the defaults satisfy the constraints


def test_same_thing_same_name():
    for kind in ("dcr", "coe", "rtf", "knnscal", "score"):
        assert "n_components" in estimator_class(kind).param_names()
    for kind in BUILTIN:
        assert "max_iter" in estimator_class(kind).param_names()
    for kind in ("dcr", "coe", "rtf", "score"):
        assert "learning_rate" in estimator_class(kind).param_names()


@pytest.mark.parametrize(
    "kind,name,value",
    [
        ("dcr", "n_components", 0),
        ("dcr", "relevance", "cubic"),
        ("dcr", "learning_rate", float("nan")),
        ("coe", "max_iter", 0),
        ("coe", "function", "tanh"),
        ("rtf", "learning_rate_decay", -0.5),
        ("score", "delta_init", 1.5),
        ("knnscal", "init", "newton"),
        ("knnscal", "n_components", True),
    ],
)
def test_a_bad_value_names_the_parameter_the_value_and_the_rule(kind, name, value):
    cls = estimator_class(kind)
    with pytest.raises(ValueError) as error:
        cls.from_flat(**{name: value})._validate_params()
    message = str(error.value)
    assert repr(name) in message and repr(value) in message and "must be" in message


def test_interval_and_options():
    assert Interval(Integral, 1, None).allows(3) and not Interval(Integral, 1, None).allows(0)
    assert not Interval(Integral, 0, None).allows(True)  # a bool is not a count
    assert Interval(Integral, 0, None).allows(np.int64(4)) and not Interval(Integral, 0, None).allows(2.0)
    assert not Interval(Real, 0, None).allows(float("inf")) and not Interval(Real, 0, None).allows(
        float("nan")
    )
    half_open = Interval(Real, 0, 1, closed="left")
    assert half_open.allows(0.0) and not half_open.allows(1.0)
    assert str(half_open) == "a finite number in [0, 1)"
    assert str(Options(str, {"b", "a"})) == "one of 'a', 'b'"
    with pytest.raises(
        ValueError, match=r"the 'x' parameter of T must be None or an int in \[1, inf\); got 0"
    ):
        validate_params("T", {"x": 0}, {"x": [None, Interval(Integral, 1, None)]})
    with pytest.raises(TypeError, match="declares no constraint"):
        validate_params("T", {"y": 0}, {})


def test_dcr_keeps_its_variants_out_of_its_constructor():
    names = set(DCR.param_names())
    assert not names & set(DCRVariants.field_names())
    assert len(names) < 31
    params, variants = DCRVariants.split({"n_components": 3, "order": "random", "item_bias": 0.5})
    assert params == {"n_components": 3} and variants == DCRVariants(order="random", item_bias=0.5)
    assert variants.changed() == {"order": "random", "item_bias": 0.5}
    with pytest.raises(ValueError, match="'projection'"):
        DCRVariants(projection="cube").validate()
    with pytest.raises(ValueError, match="item_bias needs n_components >= 2"):
        DCR(n_components=1)._validate_params(DCRVariants(item_bias=0.5))


def test_indices_have_distinct_names():
    names = {kinds.get(kind).index_class().__name__ for kind in BUILTIN}
    assert names == {"DCRIndex", "COEIndex", "RTFIndex", "SCOREIndex", "KNNSCALIndex"}
