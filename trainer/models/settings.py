"""How a fit runs, as one settings object per estimator (``solver=...``), in the scikit-learn
spirit: the constructor keeps the model's own hyperparameters, the optimiser's schedule and
sampling details sit together in a frozen dataclass whose fields keep their flat names (a job
table still writes ``learning_rate_decay = 0.05``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, TypeVar

from ordrec.trainer.models.base import validate_params

S = TypeVar("S", bound="FitSettings")


@dataclass(frozen=True)
class FitSettings:
    """Base of an estimator's ``solver`` settings: every field is checked against
    ``_field_constraints`` when made (a ValueError names the field, its value and the rule)."""

    _field_constraints: ClassVar[dict[str, list]] = {}

    def __post_init__(self) -> None:
        validate_params(type(self).__name__, asdict(self), self._field_constraints)

    @classmethod
    def names(cls) -> list[str]:
        """The fields, which are also their flat names in job tables and commands."""
        return [f.name for f in fields(cls)]

    @classmethod
    def of(cls: type[S], given: object) -> S:
        """The settings of a ``solver`` parameter: itself, a dict of some fields, or None (the defaults)."""
        if isinstance(given, cls):
            return given
        if given is None:
            return cls()
        if not isinstance(given, Mapping):
            raise ValueError(
                f"the 'solver' parameter must be a {cls.__name__}, a dict or None; got {given!r}"
            )
        unknown = set(given) - set(cls.names())
        if unknown:
            raise ValueError(f"{cls.__name__} has no field(s) {sorted(unknown)}; known: {cls.names()}")
        return cls(**given)

    @classmethod
    def merged(cls: type[S], params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with any of this class's fields given flat (``dtype="float64"``) moved into
        its ``solver`` entry, over what that entry already held."""
        flat = {name: params.pop(name) for name in cls.names() if name in params}
        if flat:
            params["solver"] = cls(**dict(asdict(cls.of(params.get("solver"))), **flat))
        return params
