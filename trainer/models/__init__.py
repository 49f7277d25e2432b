"""The estimators. Each built-in kind lives in ``trainer.models.<kind>`` (its
numba kernels beside it in ``trainer.models.<kind>_kernels``) and exposes
``Estimator``; the kinds are registered in :mod:`ordrec.service.indices.models.kinds`."""

from __future__ import annotations

from ordrec.service.indices.models import kinds
from ordrec.trainer.models.base import Estimator


def estimator_class(kind: str) -> type[Estimator]:
    """The estimator class of a registered kind (:class:`kinds.UnknownKind`, a ValueError, otherwise)."""
    return kinds.get(kind).estimator_class()
