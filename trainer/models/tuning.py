"""The few settings that matter, chosen on a validation split of the data a fit is given, within
a time budget: :class:`SettingsTuner` wraps a kind's fit pipeline as GridSearchCV wraps an
estimator (``tune`` in ``pipeline.WRAPPERS``; on by default for ``ordrec-train train`` and the
cron job, off in the ``reproduce`` protocols).

The search is coordinate ascent from the estimator's own settings: those are fitted first (on all
the data, the model kept when nothing beats them), then each axis of :func:`search_space` in turn
is moved to its best value on validation with the others held; a candidate replaces the best
only when its paired per-user gain is clear of the split's noise. A candidate is scored by served
recall@10 (:func:`~ordrec.trainer.models.ranking.served_recall_values`, the measure of
``reproduce topn``): its top 10 of all items a user did not train on, through the kind's serving
index, against the user's held-out items (liked ones on ratings, every one on interactions).
"""

from __future__ import annotations

import copy
import time
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np

from ordrec.service.constraints import Interval, Options, validate_params
from ordrec.service.indices.models import kinds
from ordrec.service.storage.artifact import Artifact
from ordrec.trainer.data.interactions import (
    LEVEL_GRID,
    LEVELS_ATTRIBUTE,
    LevelMapping,
    distinct_mappings,
    ordinal_levels,
)
from ordrec.trainer.data.splits import SPLITS, split_ratings
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.models.base import Estimator
from ordrec.trainer.models.memory import FitTooLarge, check_fit_memory
from ordrec.trainer.models.ranking import liked_threshold, served_recall_values
from ordrec.trainer.models.selection import planned_fits, significant_gain, stream

#: Each kind's axes: the estimator parameters searched, each value a multiple of the given one.
AXES: dict[str, dict[str, tuple[float, ...]]] = {
    # Up to four times the epochs: on interaction logs DCR's validation recall still rose from 100
    # to 400 (docs/dcr.md, "Epochs on interaction logs").
    "dcr": {
        "n_components": (1.0, 0.5, 2.0),
        "unrated_share": (1.0, 0.5, 2.0),
        "max_iter": (1.0, 0.5, 2.0, 4.0),
    },
    # COE's epochs: twice its 120 gained on interaction logs' random split and lost a little on the
    # time split (docs/dcr.md, "Epochs on interaction logs"), so the data decides.
    "coe": {"n_components": (1.0, 0.5, 2.0), "max_iter": (1.0, 0.5, 2.0)},
}
#: Wrappers inside which ``max_iter`` does not set the epochs (they are chosen on validation).
_EPOCHS_CHOSEN_BY = ("EarlyStoppedDCR",)
_RECALL_AT = 10


def _mean(values: np.ndarray | None) -> float | None:
    return float(values.mean()) if values is not None and values.size else None


def _relevant_from(held_out: Ratings) -> float:
    """The least held-out rating that counts as relevant: any interaction, a liked rating."""
    return -np.inf if held_out.implicit else liked_threshold(held_out.rating)


def _validated_users(held_out: Ratings) -> int:
    """Users with at least one relevant held-out row (those validation recall is averaged over)."""
    return int(np.unique(held_out.user[held_out.rating >= _relevant_from(held_out)]).size)


def innermost(estimator: Any) -> Estimator:
    """The estimator inside ``estimator``'s wrappers (the one holding the model's parameters)."""
    while not isinstance(estimator, Estimator):
        estimator = estimator.estimator
    return estimator


def _wrappers(estimator: Any) -> list[str]:
    names = []
    while not isinstance(estimator, Estimator):
        names.append(type(estimator).__name__)
        estimator = estimator.estimator
    return names


def _around(value: Any, factors: tuple[float, ...]) -> tuple:
    """``value`` times each factor (integers stay integers, at least 1), duplicates dropped."""
    scaled = [max(1, int(round(value * f))) if isinstance(value, int) else float(value) * f for f in factors]
    return tuple(dict.fromkeys(scaled))


def search_space(estimator: Any, data: Ratings, keep: tuple[str, ...] = ()) -> dict[str, tuple]:
    """The axes searched for ``estimator`` on ``data``, each starting at the given value: the
    kind's :data:`AXES` (``max_iter`` only where it sets the epochs) and, on interactions not yet
    mapped to levels, the level mapping (:data:`LEVEL_GRID`); none of the settings in ``keep``."""
    model = innermost(estimator)
    # Early stopping chooses the epochs, and a tolerance may stop before max_iter.
    epochs_chosen = any(name in _EPOCHS_CHOSEN_BY for name in _wrappers(estimator))
    epochs_chosen = epochs_chosen or bool(model.get_params().get("tol", 0))
    space = {
        name: _around(model.get_params()[name], factors)
        for name, factors in AXES.get(model.kind, {}).items()
        if not (name == "max_iter" and epochs_chosen) and name not in keep
    }
    if data.implicit and not data.levels:  # mappings ordering the data alike are tried once
        space["levels"] = distinct_mappings(data, LEVEL_GRID)
    return space


def relative_cost(params: dict[str, Any], defaults: dict[str, Any]) -> float:
    """A fit's predicted seconds relative to the defaults' on the same rows: linear in the
    dimensions and epochs, and in the rows a pass visits (ratings and their unrated draws)."""
    cost = 1.0
    for name in ("n_components", "max_iter"):
        if name in params:
            cost *= float(params[name]) / max(float(defaults[name]), 1e-12)
    if "unrated_share" in params:
        cost *= (1.0 + float(params["unrated_share"])) / (1.0 + float(defaults["unrated_share"]))
    return cost


class SettingsTuner:
    """A kind's settings chosen on validation within a time budget, wrapping its fit pipeline.

    The estimator's own settings are fitted first, on all of ``data``, and timed. When the budget
    leaves room for more, a share of each user's rows is held out (``split``, drawn from
    ``stream(random_state, "tuning")``), the defaults and then, by coordinate ascent over
    :func:`search_space`, each neighbouring candidate are fitted on the rest and scored by served
    recall@10 on the held-out rows; a candidate replaces the best only when its per-user gain
    passes :func:`~ordrec.trainer.models.selection.significant_gain` (``confidence`` standard
    errors). The best is refitted on all of ``data`` unless it is the defaults, whose fit is
    kept. A candidate is tried only when its predicted fit and refit (the slowest seconds per
    fit seen so far, scaled by :func:`relative_cost` and the rows) fit in what is left of the
    budget, and only when its memory fits the machine.

    Parameters
    ----------
    estimator : estimator or wrapper
        The fit pipeline (a DCR, COE, or a wrapper of one); candidates are copies of it with
        the innermost estimator's parameters changed.
    budget_seconds : float, default 600.0
        Wall-clock seconds the whole fit may take; with too little for a second fit the defaults
        are kept (``outcome_`` says so).
    validation_fraction : float, default 0.2
        Share of each user's rows held out to score candidates on.
    split : {"random", "time"}, default "random"
        Which rows are held out: random ones, or each user's latest (needs timestamps).
    keep : sequence of str, default ()
        Settings kept as given, never searched (a job keeps those its table gives).
    confidence : float, default 2.0
        A candidate replaces the best only when its per-user gain in validation recall@10
        exceeds this many standard errors (0: any gain).
    min_users : int, default 500
        Users with a relevant held-out row the validation needs; with fewer, only a gain of
        several points could be told from noise, so the defaults are kept without the search's
        fits (a small catalogue's nightly job, a test fixture).

    Attributes
    ----------
    best_params_ : dict
        The chosen value of every axis (a ``levels`` mapping as text).
    best_estimator_ : estimator
        The fitted pipeline served (its parameters the chosen ones).
    best_score_ : float or None
        Validation recall@10 of the chosen settings (None when no validation ran).
    cv_results_ : dict of lists
        One column per field (``params``, ``validation_recall_at_10``, ``seconds``, ``status``),
        one entry per candidate considered, the defaults first.
    outcome_ : str
        What was done, e.g. ``"kept defaults: budget"`` or ``"chose n_components=100"``.
    elapsed_ : float
        Seconds the whole fit took.
    seconds_per_fit_ : float
        The budget's cost model: seconds of a fit of the given settings on all the data, the
        slowest rate seen (:meth:`observe`).
    """

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "budget_seconds": [Interval(Real, 0, None)],
        "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
        "split": [Options(str, set(SPLITS))],
        "keep": [list, tuple],
        "confidence": [Interval(Real, 0, None)],
        "min_users": [Interval(Integral, 0, None)],
    }
    #: Each fit's memory is checked before it runs (a larger candidate is skipped, not fatal).
    checks_each_fit = True

    def __init__(
        self,
        estimator: Any,
        *,
        budget_seconds: float = 600.0,
        validation_fraction: float = 0.2,
        split: str = "random",
        keep: tuple[str, ...] | list[str] = (),
        confidence: float = 2.0,
        min_users: int = 500,
    ):
        self.estimator = estimator
        self.min_users = min_users
        self.keep = keep
        self.confidence = confidence
        self.budget_seconds = budget_seconds
        self.validation_fraction = validation_fraction
        self.split = split

    def _validate_params(self) -> None:
        settings = {name: getattr(self, name) for name in self._parameter_constraints}
        validate_params(type(self).__name__, settings, self._parameter_constraints)

    def planned_fits(self) -> int:
        """At most: the defaults on all the data and on the fit part, each other value of each
        axis (levels aside), and one refit."""
        values = sum(len(v) - 1 for v in AXES.get(innermost(self.estimator).kind, {}).values())
        return planned_fits(self.estimator) * (values + 3)

    # ------------------------------------------------------------ fitting
    def fit(self, data: Ratings) -> SettingsTuner:
        """Fit the defaults on ``data``, search within the budget, keep or refit the best."""
        self._validate_params()
        self._started = time.perf_counter()
        # Only ratings and interactions have rows to hold out (not COE's similarity triples).
        ratings = isinstance(data, Ratings)
        self.strength_ = data.strength if ratings and data.implicit else None
        space = search_space(self.estimator, data, tuple(self.keep)) if ratings else {}
        defaults = {axis: values[0] for axis, values in space.items()}
        self._results: list[dict[str, Any]] = []
        self._defaults, self._rows, self.seconds_per_fit_ = defaults, max(len(data), 1), 0.0
        model, seconds = self._fit(defaults, data)
        self.observe(defaults, len(data), seconds)
        self._record(defaults, None, seconds, "fitted on all the data")
        self.best_params_, self.best_estimator_ = defaults, model
        self.best_score_: float | None = None
        best = self._search(space, defaults, data)
        if best != defaults:
            self.best_estimator_, seconds = self._fit(best, data)
            self._record(best, self.best_score_, seconds, "refitted on all the data")
        self.best_params_ = best
        self.elapsed_ = time.perf_counter() - self._started
        self.cv_results_ = {field: [row[field] for row in self._results] for field in self._results[0]}
        return self

    def _search(self, space: dict[str, tuple], defaults: dict, data: Ratings) -> dict:
        """Coordinate ascent on a validation split of ``data``; the best settings found."""
        others = [{**defaults, axis: v} for axis, values in space.items() for v in values[1:]]
        if not others:
            self.outcome_ = "kept defaults: nothing to tune"
            return defaults
        fit_part, held_out = split_ratings(
            data, float(self.validation_fraction), stream(self._seed(), "tuning"), self.split
        )
        users = _validated_users(held_out)
        if users < int(self.min_users):
            self.outcome_ = f"kept defaults: {users} users to validate on (min_users {self.min_users})"
            return defaults
        share = len(fit_part) / self._rows
        predicted = self._predicted
        cheapest = min(predicted(c, share) + predicted(c, 1.0) for c in others)
        if predicted(defaults, share) + cheapest > self._left():
            self.outcome_ = "kept defaults: budget (no room for a second fit)"
            return defaults
        best, best_recalls = defaults, self._score(defaults, fit_part, held_out)
        self.best_score_ = _mean(best_recalls)
        for axis, values in space.items():
            for value in values[1:]:
                candidate = {**best, axis: value}
                if any(row["params"] == candidate for row in self._results):
                    continue
                refit = max(predicted(candidate, 1.0), predicted(best, 1.0) if best != defaults else 0.0)
                if predicted(candidate, share) + refit > self._left():
                    self._record(candidate, None, 0.0, "skipped: budget")
                    continue
                recalls = self._score(candidate, fit_part, held_out)
                if self._beats(recalls, best_recalls):
                    best, best_recalls, self.best_score_ = candidate, recalls, _mean(recalls)
        self.outcome_ = (
            "kept defaults: none better on validation"
            if best == defaults
            else "chose " + " ".join(f"{k}={v}" for k, v in best.items() if v != defaults[k])
        )
        return best

    def _beats(self, values: np.ndarray | None, best: np.ndarray | None) -> bool:
        """Whether a candidate's per-user recalls beat the best's: a paired gain above
        ``confidence`` standard errors (a gain within the noise of one split keeps the best)."""
        if values is None or values.size == 0:
            return False
        if best is None or best.size == 0:
            return True
        gain = significant_gain(values - best, margin=0.0, confidence=float(self.confidence))
        return gain.kept

    def _score(self, params: dict, fit_part: Ratings, held_out: Ratings) -> np.ndarray | None:
        """Per-user validation recall@10 of ``params`` fitted on ``fit_part`` (None: skipped
        for memory)."""
        started = time.perf_counter()
        try:
            model, _ = self._fit(params, fit_part)
        except FitTooLarge:
            self._record(params, None, 0.0, "skipped: memory")
            return None
        index = kinds.get(innermost(model).kind).index_class().from_artifact(model.to_artifact())
        values = served_recall_values(index, held_out, _relevant_from(held_out), _RECALL_AT)
        seconds = time.perf_counter() - started
        self.observe(params, len(fit_part), seconds)
        self._record(params, _mean(values), seconds, "scored on validation")
        return values

    def observe(self, params: dict, rows: int, seconds: float) -> None:
        """Learn the seconds per fit from one more (the slowest rate seen: a loaded machine
        slows every later fit too)."""
        units = rows / self._rows * relative_cost(params, self._defaults)
        self.seconds_per_fit_ = max(self.seconds_per_fit_, seconds / max(units, 1e-12))

    def _predicted(self, params: dict, rows_share: float) -> float:
        """Predicted seconds of fitting (and scoring) ``params`` on ``rows_share`` of the data."""
        return self.seconds_per_fit_ * rows_share * relative_cost(params, self._defaults)

    def _fit(self, params: dict, data: Ratings) -> tuple[Any, float]:
        """A copy of the pipeline with ``params`` fitted on ``data`` (levelled by ``params``'s
        mapping on raw interactions), and its seconds. Another candidate's memory is checked first
        (a too large one is skipped); the defaults' is the pipeline's to check, or not to
        (``--no-memory-check``)."""
        candidate = copy.deepcopy(self.estimator)
        innermost(candidate).set_params(**{k: v for k, v in params.items() if k != "levels"})
        if "levels" in params:
            data = ordinal_levels(data, LevelMapping.parse(params["levels"]))
        if params != self._defaults:
            check_fit_memory(innermost(candidate).kind, candidate, data)
        started = time.perf_counter()
        candidate.fit(data)
        return candidate, time.perf_counter() - started

    def _seed(self) -> int:
        return int(innermost(self.estimator).get_params().get("random_state", 0))

    def _left(self) -> float:
        return float(self.budget_seconds) - (time.perf_counter() - self._started)

    def _record(self, params: dict, score: float | None, seconds: float, status: str) -> None:
        self._results.append(
            {"params": dict(params), "validation_recall_at_10": score, "seconds": seconds, "status": status}
        )

    # ------------------------------------------------------------ publishing
    def record(self) -> dict[str, Any]:
        """What a version's manifest records of the choice (``hyperparameters["tuning"]``)."""
        rows = [dict(zip(self.cv_results_, values)) for values in zip(*self.cv_results_.values())]
        return {
            "chosen": dict(self.best_params_),
            "outcome": self.outcome_,
            "validation_recall_at_10": self.best_score_,
            "budget_seconds": float(self.budget_seconds),
            "elapsed_seconds": round(self.elapsed_, 3),
            "validation_fraction": float(self.validation_fraction),
            "split": self.split,
            "candidates": [dict(row, seconds=round(row["seconds"], 3)) for row in rows],
        }

    def to_artifact(self, **serving) -> Artifact:
        """The chosen model's artifact (the kind's serving choices), recording the choice."""
        artifact = self.best_estimator_.to_artifact(**serving)
        artifact.hyperparameters["tuning"] = self.record()
        if "levels" in self.best_params_:  # the tuner mapped the strengths itself
            mapping = LevelMapping.parse(self.best_params_["levels"])
            artifact.attributes[LEVELS_ATTRIBUTE] = mapping.as_attribute(self.strength_)
        return artifact


def describe_tuning(record: dict[str, Any]) -> str:
    """One line of a version's tuning record (``ordrec-train versions``, the fit log)."""
    scored = [c for c in record["candidates"] if c["status"] == "scored on validation"]
    recall = record.get("validation_recall_at_10")
    figure = f", validation recall@10 {recall:.4f}" if recall is not None else ""
    return (
        f"tuning: {record['outcome']} ({len(scored)} scored{figure};"
        f" {record['elapsed_seconds']:.0f}s of {record['budget_seconds']:.0f}s)"
    )


def chosen_levels(estimator: Any) -> LevelMapping | None:
    """The level mapping a fitted tuner chose for raw interactions (None: it chose none, or
    ``estimator`` is no tuner): the data the served model was fitted on is levelled by it."""
    levels = estimator.best_params_.get("levels") if isinstance(estimator, SettingsTuner) else None
    return None if levels is None else LevelMapping.parse(levels)
