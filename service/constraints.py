"""Declared settings and their checks, one mechanism for every part.

Estimators and their settings groups declare ``_parameter_constraints`` (name -> allowed forms);
job-file keys and server flags declare the same forms. A form is an :class:`Interval`, an
:class:`Options`, a :class:`Matches`, a :class:`ListOf`, a type, ``"boolean"`` or ``None``; a
value is allowed when one of its forms allows it.
"""

from __future__ import annotations

import argparse
import math
import numbers
import re
from collections.abc import Callable, Iterable
from typing import Any


class Interval:
    """Numbers of ``type`` (``numbers.Integral`` or ``numbers.Real``) between ``low`` and ``high``.

    ``None`` for a bound means unbounded on that side; ``closed`` is "both",
    "left", "right" or "neither". Booleans are not numbers here, and a real
    must be finite.
    """

    def __init__(self, type: type[Any], low: float | None, high: float | None, *, closed: str = "both"):
        if closed not in ("both", "left", "right", "neither"):
            raise ValueError(f"closed must be 'both', 'left', 'right' or 'neither', got {closed!r}")
        self.type, self.low, self.high, self.closed = type, low, high, closed

    def allows(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, self.type):
            return False
        if not math.isfinite(float(value)):
            return False
        below = self.low is not None and (
            value < self.low or (value == self.low and self.closed in ("right", "neither"))
        )
        above = self.high is not None and (  # numbers.Real declares only < and <=; value is finite
            not value <= self.high or (value == self.high and self.closed in ("left", "neither"))
        )
        return not (below or above)

    def __str__(self) -> str:
        kind = "an int" if self.type is numbers.Integral else "a finite number"
        left = "[" if self.closed in ("both", "left") and self.low is not None else "("
        right = "]" if self.closed in ("both", "right") and self.high is not None else ")"
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        return f"{kind} in {left}{low}, {high}{right}"


class Options:
    """One of a fixed set of values (of ``type``); ``options`` may be a function giving them,
    read when a value is checked (the registered model kinds)."""

    def __init__(self, type: type, options: Iterable | Callable[[], Iterable]):
        self.type, self._options = type, options

    @property
    def options(self) -> tuple:
        given = self._options() if callable(self._options) else self._options
        # A set is listed sorted, so the error message does not depend on hashing.
        return tuple(sorted(given, key=repr) if isinstance(given, (set, frozenset)) else given)

    def allows(self, value: Any) -> bool:
        return isinstance(value, self.type) and value in self.options

    def __str__(self) -> str:
        return "one of " + ", ".join(repr(o) for o in self.options)


class Matches:
    """A string the regular expression ``pattern`` matches from its start; ``what`` describes it."""

    def __init__(self, pattern: str, what: str):
        self.pattern, self.what = re.compile(pattern), what

    def allows(self, value: Any) -> bool:
        return isinstance(value, str) and self.pattern.match(value) is not None

    def __str__(self) -> str:
        return self.what


class ListOf:
    """A list of at least ``min_length`` values of ``type``."""

    def __init__(self, type: type, *, min_length: int = 0):
        self.type, self.min_length = type, min_length

    def allows(self, value: Any) -> bool:
        return (
            isinstance(value, list)
            and len(value) >= self.min_length
            and all(isinstance(v, self.type) for v in value)
        )

    def __str__(self) -> str:
        what = _TYPE_NAMES.get(self.type, self.type.__name__)
        return f"a non-empty list of {what}" if self.min_length else f"a list of {what}"


_TYPE_NAMES = {str: "strings", dict: "tables", int: "integers", float: "numbers"}


def _allows(constraint: Any, value: Any) -> bool:
    if constraint is None:
        return value is None
    if hasattr(constraint, "allows"):
        return constraint.allows(value)
    if constraint == "boolean":
        return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's, not imported here
    if isinstance(constraint, type):
        return isinstance(value, constraint) and not (
            constraint is not bool and isinstance(value, bool) and issubclass(constraint, numbers.Number)
        )
    raise TypeError(f"unknown parameter constraint {constraint!r}")


def _describe(constraint: Any) -> str:
    if constraint is None:
        return "None"
    if constraint == "boolean":
        return "a bool"
    if isinstance(constraint, type):
        return _A_TYPE.get(constraint, f"an instance of {constraint.__name__}")
    return str(constraint)


_A_TYPE = {str: "a string", int: "an int", float: "a float", dict: "a dict", list: "a list"}


def allowed(forms: Iterable[Any]) -> str:
    """What ``forms`` allow, in words: "None or an int in [1, inf)"."""
    return " or ".join(_describe(form) for form in forms)


def problem(value: Any, forms: list) -> str | None:
    """What is wrong with ``value`` under ``forms`` ("must be ..., got ..."), or None."""
    if any(_allows(form, value) for form in forms):
        return None
    return f"must be {allowed(forms)}, got {value!r}"


def flag(parse: Callable[[str], Any], *forms: Any) -> Callable[[str], Any]:
    """An argparse ``type``: the text parsed by ``parse`` (int, float, ...), then checked."""

    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed(forms)}, got {text!r}") from None
        wrong = problem(value, list(forms))
        if wrong:
            raise argparse.ArgumentTypeError(wrong)
        return value

    return convert


def validate_params(owner: str, params: dict[str, Any], constraints: dict[str, list]) -> None:
    """Check every value of ``params`` against ``constraints`` (name -> allowed forms, one of
    which must match): a ValueError names the parameter, its value and what is allowed."""
    for name, value in params.items():
        allowed_forms = constraints.get(name)
        if allowed_forms is None:
            raise TypeError(f"{owner} declares no constraint for its parameter {name!r}")
        if any(_allows(c, value) for c in allowed_forms):
            continue
        raise ValueError(f"the {name!r} parameter of {owner} must be {allowed(allowed_forms)}; got {value!r}")


# Forms many settings share, and the argparse types that check them.
AT_LEAST_ONE = Interval(numbers.Integral, 1, None)
AT_LEAST_ZERO = Interval(numbers.Integral, 0, None)
POSITIVE = Interval(numbers.Real, 0, None, closed="neither")
NOT_NEGATIVE = Interval(numbers.Real, 0, None)
FRACTION = Interval(numbers.Real, 0, 1)
AT_LEAST_ONE_FLAG = flag(int, AT_LEAST_ONE)
AT_LEAST_ZERO_FLAG = flag(int, AT_LEAST_ZERO)
SECONDS_FLAG = flag(float, POSITIVE)
NOT_NEGATIVE_SECONDS_FLAG = flag(float, NOT_NEGATIVE)
FRACTION_FLAG = flag(float, FRACTION)
