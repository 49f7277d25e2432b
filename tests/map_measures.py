"""How well a fitted KNNSCAL map keeps its graph's order, for tests of the fit."""

from __future__ import annotations

from ordrec.trainer.models import knnscal_kernels as K


def order_agreement(X, est) -> float:
    """The share of the graph's ranked pairs whose order the coordinates ``X`` keep."""
    indptr, col, rnk = est.graph_
    agree, pairs = K.order_counts(X, indptr, col, rnk, est.q_)
    return agree / pairs
