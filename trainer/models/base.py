"""What every estimator shares: parameters, finiteness checks, progress."""
from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np

from ordrec.service.artifacts import Artifact


class Estimator:
    """Base class in the scikit-learn style.

    Hyperparameters are keyword arguments of ``__init__`` stored under the
    same names and nothing else happens there; ``fit(data)`` learns and
    returns ``self``; ``to_artifact()`` packs the fitted model (with its id
    maps) for the registry. ``input_shape`` names the data shape ``fit``
    takes: "ratings", "tags", "attributes" or "neighbors".
    """

    kind: ClassVar[str]
    input_shape: ClassVar[str]

    @classmethod
    def param_names(cls) -> list[str]:
        params = inspect.signature(cls.__init__).parameters.values()
        return [p.name for p in params if p.name != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def get_params(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.param_names()}

    def set_params(self, **params: Any) -> "Estimator":
        unknown = set(params) - set(self.param_names())
        if unknown:
            raise ValueError(f"{type(self).__name__} has no parameter(s) {sorted(unknown)};"
                             f" known: {self.param_names()}")
        for name, value in params.items():
            setattr(self, name, value)
        return self

    def fit(self, data) -> "Estimator":  # pragma: no cover - interface
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
