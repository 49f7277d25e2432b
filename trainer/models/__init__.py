"""The five models. Each lives in ``trainer.models.<kind>`` (its numba kernels
beside it in ``trainer.models._<kind>_kernels``) and exposes ``Estimator``."""
from __future__ import annotations

import importlib

from ordrec.trainer.models.base import Estimator

KINDS = ("dcr", "coe", "rtf", "score", "knnscal")


def estimator_class(kind: str) -> type[Estimator]:
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r} (known: {', '.join(KINDS)})")
    return importlib.import_module(f"ordrec.trainer.models.{kind}").Estimator
