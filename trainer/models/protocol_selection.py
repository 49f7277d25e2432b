"""Model selection of the DCR paper protocol (``ordrec-train reproduce dcr``, Hu & Li 2017):
the starting point and rank chosen among candidates on hold-outs of the training ratings,
each candidate's epochs early-stopped per level on every hold-out. The lr x reg grid on one
validation split is :class:`~ordrec.trainer.models.selection.ValidatedGrid`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ordrec.trainer.data.types import Ratings
from ordrec.trainer.models.base import Options, validate_params
from ordrec.trainer.models.dcr import DCR, HOLD_OUT_CONSTRAINTS, holdouts, median_level_epochs
from ordrec.trainer.models.selection import best_mean_index, one_standard_error_choice

# The protocol's estimator: flat settings, ratings and a validation set -> the fitted DCR.
FitOnHoldout = Callable[[dict, Ratings, Ratings], DCR]
# Per-user validation values of a fitted model on held-out ratings (higher is better).
Scoring = Callable[[DCR, Ratings], np.ndarray]


class OneStandardErrorChoice:
    """A candidate chosen on ``folds`` hold-outs of the training ratings, by its mean validation
    score or by Breiman's one-standard-error rule, wrapping the protocol's fit as GridSearchCV
    wraps an estimator.

    Every candidate (``fit``'s ``base`` with one of ``candidates``) is fitted on each hold-out's
    rest, early-stopped per level on the held-out ratings, and scored per user on them; the
    values are pooled over the hold-outs, which are the same for every candidate.

    Parameters
    ----------
    fit_candidate : callable
        ``fit_candidate(params, ratings, validation)``: the DCR fitted with per-level early
        stopping (the estimator this choice wraps).
    candidates : sequence of dict
        The settings to choose from, simplest first (the one-SE rule leans towards the first).
    scoring : callable or dict of str to callable
        ``scoring(model, held_out)``: per-user validation values (e.g. NDCG@10 per user). A
        dict scores every fitted model by each scorer (as GridSearchCV's multi-metric
        scoring); the first one chooses.
    folds : int, default 3
        Hold-outs (``holdouts``: a quarter of each user's ratings, at least 2).
    rule : {"best", "one-se"}, default "best"
        The best mean (ties: the first), or the first candidate within one standard error of it
        (:func:`~ordrec.trainer.models.selection.one_standard_error_choice`).
    random_state : numpy.random.Generator
        The stream the hold-outs are drawn from (the protocol's per-run validation stream).

    Attributes
    ----------
    best_index_ : int
    best_params_ : dict
        The chosen candidate over ``base``, with ``level_epochs``: each level's median
        validation-stopped epoch over the hold-outs, for the refit on all the ratings.
    cv_results_ : list of dict
        Per candidate: ``params`` (as ``best_params_``), ``mean_score`` (the choosing scorer's),
        ``mean_scores`` (every scorer's, by name), ``level_epochs``.
    """

    _parameter_constraints = {
        "folds": HOLD_OUT_CONSTRAINTS["folds"],
        "rule": [Options(str, {"best", "one-se"})],
    }

    def __init__(
        self,
        fit_candidate: FitOnHoldout,
        candidates: Sequence[dict],
        scoring: Scoring | Mapping[str, Scoring],
        *,
        folds: int = 3,
        rule: str = "best",
        random_state: np.random.Generator,
    ):
        self.fit_candidate = fit_candidate
        self.candidates = candidates
        self.scoring = scoring
        self.folds = folds
        self.rule = rule
        self.random_state = random_state

    def fit(self, data: Ratings, base: dict | None = None) -> OneStandardErrorChoice:
        """Score every candidate over ``base`` on hold-outs of ``data``; choose by the rule."""
        validate_params(
            type(self).__name__, {"folds": self.folds, "rule": self.rule}, self._parameter_constraints
        )
        splits = holdouts(data, self.random_state, self.folds)
        self.cv_results_: list[dict[str, Any]] = []
        values = []
        for choice in self.candidates:
            params = dict(base or {}, **choice)
            scores, level_epochs = self._on_holdouts(params, splits)
            values.append(next(iter(scores.values())))  # the first scorer chooses
            self.cv_results_.append(
                {
                    "params": dict(params, level_epochs=level_epochs),
                    "mean_score": values[-1].mean(),
                    "mean_scores": {name: v.mean() for name, v in scores.items()},
                    "level_epochs": level_epochs,
                }
            )
        choose = best_mean_index if self.rule == "best" else one_standard_error_choice
        self.best_index_ = choose(values)
        self.best_params_ = self.cv_results_[self.best_index_]["params"]
        return self

    def _on_holdouts(self, params: dict, splits: list) -> tuple[dict[str, np.ndarray], list[int]]:
        """One candidate fitted on every hold-out: each scorer's per-user values pooled over the
        hold-outs, and each level's median stopping epoch."""
        scorers = self.scoring if isinstance(self.scoring, Mapping) else {"score": self.scoring}
        pooled: dict[str, list] = {name: [] for name in scorers}
        epochs = []
        for fit, val in splits:
            model = self.fit_candidate(params, fit, val)
            for name, scorer in scorers.items():
                pooled[name].append(scorer(model, val))
            epochs.append(model.best_epochs_)
        return {name: np.concatenate(parts) for name, parts in pooled.items()}, median_level_epochs(epochs)
