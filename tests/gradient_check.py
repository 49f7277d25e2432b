"""Central finite differences against an analytic gradient, for the models' kernels."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np


def assert_gradient(
    loss: Callable[[np.ndarray], float],
    X: np.ndarray,
    grad: np.ndarray,
    rows: Iterable[int],
    rel: float,
    h: float = 1e-6,
) -> None:
    """``grad[i, c]`` equals the central difference of ``loss`` at ``X`` for every given row and
    every column, within ``rel`` relative to max(1, |difference|)."""
    for i in rows:
        for c in range(X.shape[1]):
            up, down = X.copy(), X.copy()
            up[i, c] += h
            down[i, c] -= h
            numeric = (loss(up) - loss(down)) / (2 * h)
            assert abs(numeric - grad[i, c]) < rel * max(1.0, abs(numeric)), (i, c, numeric, grad[i, c])
