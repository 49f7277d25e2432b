"""The pieces of model selection every training loop and every validated choice share:
early stopping on a validation score, and the rule that keeps a candidate only when its
gain over the reference is clearly more than noise."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Gain:
    """A candidate's per-unit gain over a reference (per user, per post) and the verdict."""

    mean: float
    se: float
    kept: bool


def significant_gain(gain: np.ndarray, *, margin: float, confidence: float) -> Gain:
    """Keep the candidate only if its mean gain beats ``margin + confidence x SE``
    (the standard error of the mean over units; infinite for fewer than two units)."""
    gain = np.asarray(gain, dtype=np.float64)
    if gain.size == 0:
        return Gain(float("nan"), float("inf"), False)
    se = float(np.std(gain, ddof=1) / np.sqrt(gain.size)) if gain.size > 1 else float("inf")
    mean = float(gain.mean())
    return Gain(mean, se, bool(mean > float(margin) + float(confidence) * se))


class EarlyStopping:
    """Validation scores (higher is better) per track, e.g. one per ordinal level.

    A track improves when its score beats its best by more than ``tol`` (relative to the
    best's magnitude when ``relative``, else absolute); ``update`` says which tracks
    improved, so the caller snapshots them. Training may stop once every track has gone
    ``patience`` epochs without improving and at least ``min_epochs`` have run.
    """

    def __init__(
        self,
        start: np.ndarray | float,
        *,
        patience: int,
        tol: float = 0.0,
        relative: bool = False,
        min_epochs: int = 0,
    ):
        if patience < 0:
            raise ValueError(f"patience must be >= 0, got {patience}")
        self.best = np.atleast_1d(np.asarray(start, dtype=np.float64)).copy()
        self.best_epochs = np.zeros(self.best.size, dtype=np.int64)
        self.patience, self.tol, self.relative, self.min_epochs = (
            int(patience),
            float(tol),
            relative,
            int(min_epochs),
        )
        self.epoch = 0

    def update(self, epoch: int, scores: np.ndarray | float) -> np.ndarray:
        """Record the scores after ``epoch``; a boolean mask of the tracks that improved."""
        scores = np.atleast_1d(np.asarray(scores, dtype=np.float64))
        if scores.shape != self.best.shape:
            raise ValueError(f"expected {self.best.size} scores, got {scores.size}")
        margin = self.tol * np.abs(self.best) if self.relative else self.tol
        improved = scores > self.best + margin
        self.best = np.where(improved, scores, self.best)
        self.best_epochs = np.where(improved, epoch, self.best_epochs)
        self.epoch = int(epoch)
        return improved

    def restart(self, epoch: int) -> None:
        """Patience starts again at ``epoch`` (e.g. after a learning-rate drop)."""
        self.best_epochs[:] = epoch

    @property
    def stale(self) -> int:
        """Epochs since the most recently improved track improved."""
        return int(self.epoch - self.best_epochs.max())

    @property
    def should_stop(self) -> bool:
        return self.epoch >= self.min_epochs and bool(np.all(self.epoch - self.best_epochs >= self.patience))
