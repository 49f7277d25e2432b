"""The pieces of model selection every training loop and every validated choice share:
early stopping on a validation score, the rule that keeps a candidate only when its gain
over the reference is clearly more than noise, the standard error behind that rule and
Breiman's one-standard-error choice, the points of a grid and the search over them on
validation, and each wrapper's own named random stream."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np

from ordrec.trainer.models.base import Interval, Settings


@dataclass(frozen=True)
class Gain:
    """A candidate's per-unit gain over a reference (per user, per post) and the verdict."""

    mean: float
    se: float
    kept: bool


def stream(random_state: int, name: str) -> np.random.Generator:
    """The random stream named ``name`` of seed ``random_state``: independent of the seed's
    own stream (``default_rng(random_state)``, the estimator's) and of every other name, so a
    wrapper's draws (hold-outs, refinement passes) never shift another's."""
    key = zlib.crc32(name.encode("utf-8"))
    return np.random.default_rng(np.random.SeedSequence(int(random_state), spawn_key=(key,)))


def standard_error(values: np.ndarray, *, undefined: float = float("nan")) -> float:
    """The standard error of the mean of ``values`` (sample deviation over sqrt(n)); with fewer
    than two values it is not defined and ``undefined`` is returned."""
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2:
        return float(undefined)
    return float(np.std(values, ddof=1) / np.sqrt(values.size))


def grid_points(grid: Mapping[str, Sequence]) -> list[dict]:
    """Every point of ``grid`` (name -> candidate values) as a dict, in grid order: the last
    name varies fastest."""
    names = list(grid)
    return [dict(zip(names, values)) for values in itertools.product(*grid.values())]


def best_mean_index(values: Sequence[np.ndarray]) -> int:
    """The candidate whose per-unit values have the highest mean (ties: the first)."""
    return max(range(len(values)), key=lambda j: values[j].mean())


def one_standard_error_choice(values: Sequence[np.ndarray]) -> int:
    """Breiman's one-standard-error rule over candidates listed simplest first, each scored per
    unit (per user) on the same units: the first whose mean is within one standard error of the
    best mean, the error being that of its paired differences to the best."""
    best = best_mean_index(values)
    for index, candidate in enumerate(values):
        diff = values[best] - candidate
        if diff.mean() <= standard_error(diff, undefined=0.0):
            return index
    return best


class ValidatedGrid:
    """The point of a grid with the best validation score, as scikit-learn's GridSearchCV with one
    split chosen by the caller and no refit.

    Parameters
    ----------
    evaluate : callable
        ``evaluate(params) -> (score, chosen, model)``: a point's validation score (higher is
        better), the parameters it stands for (e.g. with the epochs its validation chose) and
        the fitted model.
    grid : mapping of str to sequence
        Candidate values per name, tried in :func:`grid_points` order over ``fit``'s ``base``.

    Attributes
    ----------
    best_params_, best_score_, best_model_
        The first point with the highest score (its ``chosen`` parameters).
    cv_results_ : list of dict
        Every point in order: its ``params`` (chosen) and ``score``.
    """

    def __init__(self, evaluate: Callable[[dict], tuple[float, dict, Any]], grid: Mapping[str, Sequence]):
        self.evaluate = evaluate
        self.grid = grid

    def fit(self, base: Mapping[str, Any] | None = None) -> ValidatedGrid:
        """Evaluate every point over ``base``; keep the first best."""
        self.cv_results_: list[dict] = []
        self.best_score_, self.best_params_, self.best_model_ = -np.inf, dict(base or {}), None
        for point in grid_points(self.grid):
            score, chosen, model = self.evaluate({**(base or {}), **point})
            self.cv_results_.append({"params": chosen, "score": score})
            if score > self.best_score_:
                self.best_score_, self.best_params_, self.best_model_ = score, chosen, model
        return self


def planned_fits(estimator: Any) -> int:
    """How many times fitting ``estimator`` fits the model inside it: once for an estimator, more
    for a wrapper that fits on hold-outs first (its ``planned_fits``)."""
    return int(getattr(estimator, "planned_fits", lambda: 1)())


def significant_gain(gain: np.ndarray, *, margin: float, confidence: float) -> Gain:
    """Keep the candidate only if its mean gain beats ``margin + confidence x SE``
    (the standard error of the mean over units; infinite for fewer than two units)."""
    gain = np.asarray(gain, dtype=np.float64)
    if gain.size == 0:
        return Gain(float("nan"), float("inf"), False)
    se = standard_error(gain, undefined=float("inf"))
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


@dataclass(frozen=True)
class PlateauStopping(Settings):
    """When a pass-by-pass fit stops on a plateau of its validation score, and which pass it
    keeps (RTF's ``early_stopping``; the patience and tolerance run through :class:`EarlyStopping`).

    Parameters
    ----------
    validation_posts : int, default 1200
        Training posts held out to stop early on a plateau of their AUC (one per user with
        two or more posts, then further rounds up to 5% of the posts); 0 trains on everything
        for ``max_iter`` passes.
    patience : int, default 5
        Passes without a gain of more than ``val_tol`` before the plateau.
    min_iter : int, default 10
        Never stop early before this many passes.
    val_tol : float, default 1e-4
        The least gain of the (smoothed) validation AUC over its best that counts, in AUC (DCR's
        ``val_tol`` is the same rule on a log-likelihood, measured relative to its magnitude).
    smoothing : int, default 1
        Stop on the moving average of the last ``smoothing`` scores (1: the raw value).
    keep_within : float or None, default None
        None: keep the pass of the last ``val_tol`` gain; a number: the latest pass whose
        criterion is within it of the highest seen.
    learning_rate_drops : int, default 0
        At a plateau with drops left, restore the best pass, scale the learning rate by
        ``learning_rate_drop_factor`` and go on; the next plateau stops.
    learning_rate_drop_factor : float, default 0.5
        Multiplier of the learning rate at each drop, in (0, 1).
    """

    validation_posts: int = 1200
    patience: int = 5
    min_iter: int = 10
    val_tol: float = 1e-4
    smoothing: int = 1
    keep_within: float | None = None
    learning_rate_drops: int = 0
    learning_rate_drop_factor: float = 0.5

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "validation_posts": [Interval(Integral, 0, None)],
        "patience": [Interval(Integral, 0, None)],
        "min_iter": [Interval(Integral, 0, None)],
        "val_tol": [Interval(Real, None, None)],
        "smoothing": [Interval(Integral, 1, None)],
        "keep_within": [None, Interval(Real, 0, None)],
        "learning_rate_drops": [Interval(Integral, 0, None)],
        "learning_rate_drop_factor": [Interval(Real, 0, 1, closed="neither")],
    }
