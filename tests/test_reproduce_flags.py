"""The reproduce commands' flag scheme: a flag per parameter, named as the parameter, typed and
checked against the estimator's declared constraints."""

from __future__ import annotations

import argparse
from numbers import Integral, Real

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordrec.trainer.models.base import Interval, Options
from ordrec.trainer.reproduce.params import add_param_flags, flag_name, given_params

CONSTRAINTS = {
    "n_components": [Interval(Integral, 1, None)],
    "learning_rate": [Interval(Real, 0, None)],
    "init": [Options(str, {"random", "marginal"})],
    "pairwise": ["boolean"],
    "levels": [None, list, str],
}


def _parse(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_param_flags(parser, CONSTRAINTS, CONSTRAINTS)
    return given_params(parser.parse_args(argv), "T", CONSTRAINTS, CONSTRAINTS)


def test_flags_are_the_parameter_names_typed_by_their_constraints():
    assert flag_name("learning_rate") == "--learning-rate"
    given = _parse(
        ["--n-components", "20", "--learning-rate", "0.05", "--init", "marginal", "--pairwise", "true"]
    )
    assert given == {"n_components": 20, "learning_rate": 0.05, "init": "marginal", "pairwise": True}
    assert isinstance(given["n_components"], int) and isinstance(given["learning_rate"], float)
    assert _parse(["--levels", "[1, 2, 3]"]) == {"levels": [1, 2, 3]}


def test_flags_not_given_are_left_to_the_protocol():
    assert _parse([]) == {}


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--n-components", "0"], "'n_components'"),
        (["--learning-rate", "nan"], "'learning_rate'"),
    ],
)
def test_a_value_outside_the_constraint_names_the_parameter(argv, needle):
    with pytest.raises(ValueError, match=needle):
        _parse(argv)


@pytest.mark.parametrize("argv", [["--n-components", "2.5"], ["--pairwise", "maybe"], ["--init", "zeros"]])
def test_a_wrong_type_or_an_unknown_option_is_refused(argv):
    with pytest.raises(argparse.ArgumentError):
        _parse(argv)


def test_an_old_flag_name_is_refused(capsys):
    with pytest.raises(SystemExit):
        _parse(["--lr", "0.1"])
    assert "unrecognized arguments: --lr" in capsys.readouterr().err


@given(st.integers(min_value=1, max_value=10**9), st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_any_allowed_value_round_trips_through_its_flag(n, rate):
    assert _parse(["--n-components", str(n), "--learning-rate", repr(rate)]) == {
        "n_components": n,
        "learning_rate": rate,
    }


@pytest.mark.parametrize(
    "protocol,old,new",
    [
        ("dcr", "--rank", "--n-components"),
        ("dcr", "--lr", "--learning-rate"),
        ("coe", "--dim", "--n-components"),
    ],
)
def test_reproduce_refuses_a_retired_flag_instead_of_reading_it_as_a_prefix(
    tmp_path, capsys, protocol, old, new
):
    from ordrec.trainer.cli import main

    data = tmp_path / "u.data"
    data.write_text("1\t1\t5\t0\n")
    with pytest.raises(SystemExit) as exit_:
        main(["reproduce", protocol, "--data", str(data), old, "3"])
    assert exit_.value.code == 2 and f"unrecognized arguments: {old}" in capsys.readouterr().err
