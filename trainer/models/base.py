"""What every estimator shares: parameters and their constraints, finiteness checks, progress."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, TypeVar

import numpy as np

from ordrec.service.constraints import Interval, Options, validate_params
from ordrec.service.storage.artifact import Artifact

__all__ = ["Estimator", "Interval", "Options", "Settings", "check_finite", "validate_params"]


S = TypeVar("S", bound="Settings")
E = TypeVar("E", bound="Estimator")


@dataclass(frozen=True)
class Settings:
    """A group of settings one estimator parameter takes (``solver=``, ``early_stopping=``):
    a frozen dataclass whose fields are checked against ``_parameter_constraints`` (as an
    estimator's parameters are) when it is made."""

    _parameter_constraints: ClassVar[dict[str, list]] = {}

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field (a ValueError names the bad one); subclasses add cross-field checks."""
        validate_params(type(self).__name__, asdict(self), self._parameter_constraints)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls: type[S], given: S | Mapping[str, Any] | None, owner: str = "", param: str = "") -> S:
        """The settings from a parameter's value: itself, a dict of some fields, or None (the defaults)."""
        if isinstance(given, Mapping):
            unknown = set(given) - set(cls.field_names())
            if unknown:
                raise ValueError(f"the {param!r} parameter of {owner} has no field(s) {sorted(unknown)}")
            return cls(**given)
        if given is None:
            return cls()
        if isinstance(given, cls):
            return given
        raise ValueError(
            f"the {param!r} parameter of {owner} must be a {cls.__name__}, a dict or None; got {given!r}"
        )


class Estimator:
    """Base class in the scikit-learn style.

    Hyperparameters are keyword-only arguments of ``__init__`` stored under
    the same names and nothing else happens there; each is declared in the
    class's ``_parameter_constraints`` (parameter name -> list of allowed
    forms: an :class:`Interval`, :class:`Options`, a type, "boolean" or
    ``None``; a value must match one of them), which ``fit`` checks through
    :meth:`_validate_params` before anything else. ``fit(data)`` learns and
    returns ``self``; ``to_artifact()`` packs the fitted model (with its id
    maps) for the registry. ``input_shape`` names the data shape ``fit``
    takes: "ratings", "tags", "attributes" or "neighbors".

    The same thing has the same name across the estimators:
    ``n_components`` (the embedding size), ``max_iter`` (epochs, passes or
    outer iterations at most), ``learning_rate`` and its derived names
    (``learning_rate_decay``, ``learning_rate_final``, ...), ``random_state``
    (an int seed).
    """

    kind: ClassVar[str]
    input_shape: ClassVar[str]
    _parameter_constraints: ClassVar[dict[str, list]] = {}
    # Parameters that take a Settings group (RTF's ``early_stopping``): job tables and command
    # lines give its fields flat, under their own names (``patience = 20``).
    nested_settings: ClassVar[dict[str, type[Settings]]] = {}

    @classmethod
    def param_names(cls) -> list[str]:
        params = inspect.signature(cls.__init__).parameters.values()
        return [
            p.name for p in params if p.name != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]

    def get_params(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.param_names()}

    def set_params(self, **params: Any) -> Estimator:
        unknown = set(params) - set(self.param_names())
        if unknown:
            raise ValueError(
                f"{type(self).__name__} has no parameter(s) {sorted(unknown)}; known: {self.param_names()}"
            )
        for name, value in params.items():
            setattr(self, name, value)
        return self

    @classmethod
    def flat_param_names(cls) -> list[str]:
        """The parameters with each settings group replaced by its fields, in constructor order."""
        nested = cls.nested_settings
        return [
            f
            for name in cls.param_names()
            for f in (nested[name].field_names() if name in nested else [name])
        ]

    @classmethod
    def flat_constraints(cls) -> dict[str, list]:
        """The constraints of :meth:`flat_param_names`."""
        merged = dict(cls._parameter_constraints)
        for settings in cls.nested_settings.values():
            merged.update(settings._parameter_constraints)
        return {name: merged[name] for name in cls.flat_param_names()}

    def flat_params(self) -> dict[str, Any]:
        """``get_params`` with each settings group given as its fields (what the manifest records)."""
        params: dict[str, Any] = {}
        for name, value in self.get_params().items():
            settings = self.nested_settings.get(name)
            params.update({name: value} if settings is None else asdict(self.settings(name)))
        return params

    def settings(self, name: str) -> Any:
        """The settings group of parameter ``name`` (a dict or None resolved to its class)."""
        return self.nested_settings[name].of(getattr(self, name), type(self).__name__, name)

    @classmethod
    def nest_flat(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with the fields of each settings group given by name (``patience=20``)
        moved into the group, over the group itself when that is given too."""
        params = dict(params)
        for name, settings in cls.nested_settings.items():
            flat = {field: params.pop(field) for field in settings.field_names() if field in params}
            if flat or name in params:  # checked now: a bad field fails before any fitting
                given = asdict(settings.of(params.get(name), cls.__name__, name))
                params[name] = settings.of(dict(given, **flat), cls.__name__, name)
        return params

    @classmethod
    def from_flat(cls: type[E], **params: Any) -> E:
        """The estimator from flat settings (:meth:`nest_flat`)."""
        return cls(**cls.nest_flat(params))

    def _validate_params(self) -> None:
        """Check every parameter against ``_parameter_constraints``: a ValueError names the
        parameter, its value and what is allowed. Cross-parameter checks follow in each
        estimator's own ``_validate_params``."""
        validate_params(type(self).__name__, self.get_params(), self._parameter_constraints)
        for name in self.nested_settings:
            self.settings(name)

    def fit(self, data) -> Estimator:  # pragma: no cover - interface
        raise NotImplementedError

    def to_artifact(self) -> Artifact:  # pragma: no cover - interface
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"


def check_finite(epoch: int, **arrays: np.ndarray) -> None:
    """Fail loudly when training diverged, naming the epoch and the array."""
    for name, array in arrays.items():
        if not np.all(np.isfinite(array)):
            raise FloatingPointError(
                f"training diverged at epoch {epoch}: {name} holds NaN or infinite values"
                " (lower the learning rate or raise the regularisation)"
            )
