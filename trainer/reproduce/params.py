"""Typed ``key=value`` settings from the command line (``--set``, sweep and reference settings),
and the flag scheme of the ``reproduce`` commands: one ``--name-with-dashes`` flag per estimator
parameter, named as the parameter (``--learning-rate`` sets ``learning_rate``), typed and checked
against the estimator's declared constraints."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from numbers import Integral
from typing import Any

from ordrec.trainer.models.base import Interval, Options, validate_params


def parse_value(text: str) -> Any:
    """A command-line value: a JSON scalar or list (``20``, ``0.05``, ``true``, ``[3,5]``), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_assignments(pairs: Sequence[str]) -> dict[str, Any]:
    """``["n_components=20", "learning_rate=0.05", "name=x"]`` -> typed dict (JSON scalars, else strings)."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--set expects key=value, got {pair!r}")
        params[key] = parse_value(text)
    return params


def flag_name(param: str) -> str:
    """The command-line flag of a parameter: ``learning_rate`` -> ``--learning-rate``."""
    return "--" + param.replace("_", "-")


def _boolean(text: str) -> bool:
    """``true``/``false`` (also 1/0, yes/no), as a flag's value."""
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _integer(text: str) -> int:
    """An int, as a flag's value (``20``; not ``20.5``)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _number(text: str) -> float:
    """A number, as a flag's value."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _converter(forms: Sequence[Any]) -> Callable[[str], Any]:
    """How a flag's text becomes a value for a parameter of these allowed forms: the first
    typed form decides (an int count, a number, a bool, a string option), else JSON or text."""
    for form in forms:
        if isinstance(form, Interval):
            return _integer if form.type is Integral else _number
        if form == "boolean":
            return _boolean
        if isinstance(form, Options) and all(isinstance(o, str) for o in form.options):
            return str
    return parse_value


def add_param_flags(
    parser: argparse.ArgumentParser,
    constraints: Mapping[str, Sequence[Any]],
    names: Iterable[str],
    helps: Mapping[str, str] | None = None,
    renamed: Mapping[str, str] | None = None,
) -> None:
    """A ``--name-with-dashes`` flag for each parameter in ``names`` (typed from its constraint,
    default None: "not given", so the protocol's own value stands); a parameter renamed
    (``renamed``: old -> new) also takes its old flag."""
    helps = helps or {}
    for name in names:
        forms = constraints[name]
        options = next((f.options for f in forms if isinstance(f, Options)), None)
        parser.add_argument(
            flag_name(name),
            *[flag_name(old) for old, new in (renamed or {}).items() if new == name],
            dest=name,
            type=_converter(forms),
            choices=options,
            default=None,
            metavar=None if options else name.upper(),
            help=helps.get(name, f"the {name} parameter"),
        )


def given_params(
    args: argparse.Namespace, owner: str, constraints: Mapping[str, Sequence[Any]], names: Iterable[str]
) -> dict[str, Any]:
    """The parameters among ``names`` given on the command line, checked against ``constraints``
    (a ValueError names the parameter, its value and the rule)."""
    given = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    validate_params(owner, given, dict(constraints))
    return given
