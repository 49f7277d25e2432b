"""Rating scales: ``low, low + step, ..., high``.

Shared by the trainer (which checks every rating it reads) and the service
(which checks values recorded by RecordInteractions against the scale a
model was trained on, stored in its manifest's ``attributes``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: ``Artifact.attributes`` key of a ratings model's scale: ``{"low", "high", "step"}``.
SCALE_ATTRIBUTE = "rating_scale"


def on_scale(value: float, low: float, high: float, step: float) -> bool:
    """Whether ``value`` is one of ``low, low + step, ..., high`` (NaN never is).

    Plain arithmetic, so the numba kernels compile this very function and
    agree with the per-line parser bit for bit.
    """
    if not (low <= value <= high):
        return False
    k = math.floor((value - low) / step + 0.5)
    return abs(value - (low + k * step)) <= 1e-9 * step


def scale_text(low: float, high: float, step: float) -> str:
    """``1..5``, ``0.5..5:0.5``: how job files and messages write a scale."""
    return f"{low:g}..{high:g}" + (f":{step:g}" if step != 1 else "")


def scale_problem(value: float, low: float, high: float, step: float) -> str | None:
    """Why ``value`` is not on the scale, or None when it is."""
    if on_scale(value, low, high, step):
        return None
    text = scale_text(low, high, step)
    if low <= value <= high:
        return f"is not on the rating scale {text} (steps of {step:g})"
    return f"is outside the rating scale {text}"


def stored_scale(attributes: Mapping[str, Any]) -> tuple[float, float, float] | None:
    """(low, high, step) from a model's attributes, or None when it was trained without one."""
    scale = attributes.get(SCALE_ATTRIBUTE)
    if not isinstance(scale, Mapping):
        return None
    try:
        return float(scale["low"]), float(scale["high"]), float(scale.get("step", 1.0))
    except (KeyError, TypeError, ValueError):
        return None
