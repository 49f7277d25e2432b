"""Early stopping for RTF: hold out training posts and stop the passes on a plateau of their
AUC, keeping the pass the rule chooses. A wrapper around an :class:`~ordrec.trainer.models.rtf.RTF`,
the way ``EarlyStoppedDCR`` wraps a DCR; ``docs/rtf.md`` has the measurements behind its defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ordrec.service.indices.models.rtf import score_posts
from ordrec.service.storage.artifact import Artifact
from ordrec.trainer.data.types import TagAssignments
from ordrec.trainer.models.rtf import RTF, STOP, Factors, Posts, checked_tags, posts_auc
from ordrec.trainer.models.rtf_selection import group_posts
from ordrec.trainer.models.selection import EarlyStopping, PlateauStopping, planned_fits

# Beyond one post per user, the stopping set may take at most this share of
# all posts (Last.fm 10-core: 1,200 of ~32,000 training posts is 3.7%).
EXTRA_VALIDATION_SHARE = 0.05


def validation_mask(post_user: np.ndarray, n_val: int, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask of validation posts: one random post of up to ``n_val``
    random users who have at least two posts (so no user loses all).

    Further rounds take a second, third, ... post of random users while
    ``n_val`` is not reached, always leaving every user a training post, up to
    ``EXTRA_VALIDATION_SHARE`` of all posts beyond the first round.
    """
    mask = np.zeros(post_user.size, dtype=bool)
    if n_val <= 0 or post_user.size == 0:
        return mask
    users, starts, counts = np.unique(post_user, return_index=True, return_counts=True)
    eligible = np.flatnonzero(counts >= 2)
    chosen = rng.permutation(eligible)[:n_val]
    picks = starts[chosen] + (rng.random(chosen.size) * counts[chosen]).astype(np.int64)
    mask[picks] = True
    remaining = min(n_val, max(chosen.size, int(EXTRA_VALIDATION_SHARE * post_user.size))) - chosen.size
    taken = np.zeros(users.size, dtype=np.int64)
    taken[chosen] = 1
    while remaining > 0:
        # users that can give one more post and still keep one for training
        able = np.flatnonzero(counts - taken >= 2)
        if able.size == 0:
            break
        chosen = rng.permutation(able)[:remaining]
        for owner in chosen:
            free = starts[owner] + np.flatnonzero(~mask[starts[owner] : starts[owner] + counts[owner]])
            mask[free[int(rng.integers(free.size))]] = True
        taken[chosen] += 1
        remaining -= chosen.size
    return mask


def held_posts(posts: Posts, mask: np.ndarray) -> Posts:
    """The posts of ``mask`` alone."""
    rows = np.flatnonzero(mask)
    return Posts(posts.user[rows], posts.item[rows], *_subset_posts(posts.tag_indptr, posts.tags, rows))


def _subset_posts(tag_indptr: np.ndarray, tags: np.ndarray, rows: np.ndarray):
    """The (indptr, tags) CSR of a subset of posts, in ``rows`` order."""
    lengths = tag_indptr[rows + 1] - tag_indptr[rows]
    indptr = np.zeros(rows.size + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(lengths)
    out = np.empty(int(indptr[-1]), dtype=tags.dtype)
    for k, p in enumerate(rows):
        out[indptr[k] : indptr[k + 1]] = tags[tag_indptr[p] : tag_indptr[p + 1]]
    return indptr, out


def validation_auc(factors: Factors, held: Posts) -> float:
    """Mean exact AUC (``posts_auc``) of the ``held`` posts under ``factors``, by the serving code's scores."""
    C, U, I, T = factors
    scores = score_posts(C, U[held.user], I[held.item], T)
    return float(np.nanmean(posts_auc(scores, held.tag_indptr, held.tags)))


def _copy(factors: Factors) -> Factors:
    C, U, I, T = factors
    return C.copy(), U.copy(), I.copy(), T.copy()


def _live(model: RTF) -> Factors:
    return model.core_, model.user_factors_, model.item_factors_, model.tag_factors_


class _PlateauWatch:
    """The validation side of the passes: the smoothed criterion, early stopping on it
    (``EarlyStopping``), and the snapshots of the passes worth keeping."""

    def __init__(self, plateau: PlateauStopping, held: Posts):
        self.plateau, self.held = plateau, held
        self.stopper = EarlyStopping(
            -np.inf, patience=plateau.patience, tol=plateau.val_tol, min_epochs=plateau.min_iter
        )
        self.recent: list[float] = []
        self.best: tuple[int, Factors, list[float]] | None = None  # last pass that gained val_tol
        self.peak = -np.inf
        self.latest: tuple[int, Factors] | None = None  # latest pass within keep_within of the peak
        self.drops = 0

    def after_pass(self, epoch: int, model: RTF, record: dict[str, float]) -> float | None:
        """Score the pass on the held-out posts into ``record``; :data:`STOP` at a plateau with no
        drops left, the drop factor at one with drops left (the best pass restored), else None."""
        factors = _live(model)
        record["val_auc"] = validation_auc(factors, self.held)
        criterion = self.observe(epoch, record["val_auc"], factors)
        if self.plateau.smoothing > 1:
            record["val_auc_smoothed"] = criterion
        return None

    def verdict(self, epoch: int, model: RTF) -> float | None:
        """What the passes do next: go on (None), stop, or go on at a dropped learning rate."""
        if not self.stopper.should_stop:
            return None
        return self.plateau.learning_rate_drop_factor if self.drop_rate(epoch, _live(model)) else STOP

    def observe(self, epoch: int, val_auc: float, factors: Factors) -> float:
        """Record a pass's validation AUC; its criterion (the moving average over ``smoothing`` passes)."""
        self.recent = (self.recent + [val_auc])[-self.plateau.smoothing :]
        criterion = float(np.mean(self.recent))
        if self.stopper.update(epoch, criterion)[0]:
            self.best = (epoch, _copy(factors), list(self.recent))
        if self.plateau.keep_within is not None:
            self.peak = max(self.peak, criterion)
            if criterion >= self.peak - self.plateau.keep_within:
                self.latest = (epoch, _copy(factors))
        return criterion

    def drop_rate(self, epoch: int, factors: Factors) -> bool:
        """At a plateau with drops left: back to the best pass (the caller scales the rate); False: stop."""
        if self.drops >= self.plateau.learning_rate_drops or self.best is None:
            return False
        self.drops += 1
        for live, saved in zip(factors, self.best[1]):
            live[...] = saved
        self.recent = list(self.best[2])
        self.stopper.restart(epoch)
        return True

    def kept(self) -> tuple[int, Factors, tuple[int, Factors] | None] | None:
        """The pass to keep and its factors, and the default rule's pass when ``keep_within`` chose another."""
        if self.plateau.keep_within is not None and self.latest is not None:
            first = (self.best[0], self.best[1]) if self.best is not None else None
            return self.latest[0], self.latest[1], first
        if self.best is not None:
            return self.best[0], self.best[1], None
        return None


Hook = Callable[[int, RTF, dict], "float | None"]


class EarlyStoppedRTF:
    """RTF stopped on a plateau of held-out training posts' AUC, wrapping an :class:`RTF` as
    ``EarlyStoppedDCR`` wraps a DCR.

    ``validation_posts`` training posts are held out (:func:`validation_mask`, drawn from the
    seed's own stream before the estimator's initialisation, so a seeded fit is what it was
    when the rule lived inside ``RTF.fit``); after every pass their mean AUC is taken, and the
    passes stop once it has gained no more than ``val_tol`` for ``patience`` passes (after at
    least ``min_iter``). The fitted model ``estimator_`` holds the kept pass's parameters;
    the held-out posts stay in its artifact (serving sees every training post).

    Parameters
    ----------
    estimator : RTF
        The model's settings (a copy is fitted; ``max_iter`` caps the passes).
    validation_posts, patience, min_iter, val_tol, smoothing, keep_within : see below
    learning_rate_drops, learning_rate_drop_factor : see below
        The hold-out and the plateau rule, each as
        :class:`~ordrec.trainer.models.selection.PlateauStopping` documents it (defaults 1200, 5,
        10, 1e-4, 1, None, 0 and 0.5).

    Attributes
    ----------
    estimator_ : RTF
        The fitted model, at the kept pass.
    best_epoch_ : int
        The kept pass (the last one when nothing was held out or nothing gained).
    epochs_run_ : int
        Passes run.
    history_ : list of dict
        One record per pass: the estimator's (``train_auc``, ``smoothed_auc``, ``lr``) and
        ``val_auc`` (and ``val_auc_smoothed`` with ``smoothing`` > 1).
    first_plateau_ : (int, factors) or None
        With ``keep_within``: the pass (and its ``(C, U, I, T)``) the default rule would keep.
    """

    _parameter_constraints: ClassVar[dict[str, list]] = PlateauStopping._parameter_constraints

    def __init__(
        self,
        estimator: RTF,
        *,
        validation_posts: int = 1200,
        patience: int = 5,
        min_iter: int = 10,
        val_tol: float = 1e-4,
        smoothing: int = 1,
        keep_within: float | None = None,
        learning_rate_drops: int = 0,
        learning_rate_drop_factor: float = 0.5,
    ):
        self.estimator = estimator
        self.validation_posts = validation_posts
        self.patience = patience
        self.min_iter = min_iter
        self.val_tol = val_tol
        self.smoothing = smoothing
        self.keep_within = keep_within
        self.learning_rate_drops = learning_rate_drops
        self.learning_rate_drop_factor = learning_rate_drop_factor

    def get_params(self) -> dict[str, Any]:
        """The estimator and the rule's settings (``type(self)(**get_params())`` is an unfitted copy)."""
        return {"estimator": self.estimator, **self._settings()}

    def rule(self) -> PlateauStopping:
        """The settings as a :class:`PlateauStopping` (checked: a ValueError names a bad one)."""
        return PlateauStopping(**self._settings())

    def _settings(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in PlateauStopping.field_names()}

    def _validate_params(self) -> None:
        """The rule's settings and the estimator's parameters (a ValueError names a bad one)."""
        self.rule()
        self.estimator._validate_params()

    def planned_fits(self) -> int:
        """The fits a fit runs: the estimator's (the hold-out is part of the one fit)."""
        return planned_fits(self.estimator)

    @property
    def random_state(self) -> int:
        """The estimator's seed, which also draws the held-out posts."""
        return self.estimator.random_state

    def fit(self, data: TagAssignments, on_epoch: Hook | None = None) -> EarlyStoppedRTF:
        """Hold out posts of ``data``, fit a copy of the estimator on the rest until the plateau,
        and keep the chosen pass. ``on_epoch`` is called as ``RTF.fit`` calls it, the
        validation figures already in the record."""
        self._validate_params()
        data = checked_tags(data)
        model = type(self.estimator)(**self.estimator.get_params())
        rng = np.random.default_rng(model.random_state)  # the hold-out first, then the estimator's draws
        posts = Posts(*group_posts(data.user, data.item, data.tag))
        mask = validation_mask(posts.user, int(self.validation_posts), rng)
        watch = _PlateauWatch(self.rule(), held_posts(posts, mask)) if mask.any() else None
        model.fit(data, self._hook(watch, on_epoch), held_out=mask, rng=rng)
        self._keep(model, watch)
        return self

    @staticmethod
    def _hook(watch: _PlateauWatch | None, on_epoch: Hook | None) -> Hook | None:
        """The per-pass hook: the rule's scoring, then ``on_epoch``, then the rule's verdict."""
        if watch is None:
            return on_epoch

        def after_pass(epoch: int, model: RTF, record: dict) -> float | None:
            watch.after_pass(epoch, model, record)
            asked = None if on_epoch is None else on_epoch(epoch, model, record)
            verdict = watch.verdict(epoch, model)
            return asked if verdict is None else verdict

        return after_pass

    def _keep(self, model: RTF, watch: _PlateauWatch | None) -> None:
        """Put the kept pass's parameters back into ``model`` (unless it is the last pass)."""
        self.estimator_, self.history_, self.epochs_run_ = model, model.history_, model.epochs_run_
        self.best_epoch_, first = model.epochs_run_, None
        kept = None if watch is None else watch.kept()
        if kept is not None:
            self.best_epoch_, params, first = kept
            if self.best_epoch_ != model.epochs_run_:
                for live, saved in zip(_live(model), params):
                    live[...] = saved
        if self.keep_within is not None:  # the pass the default rule keeps, for side-by-side evaluation
            self.first_plateau_ = first

    def fit_popularity_only(self, data: TagAssignments) -> EarlyStoppedRTF:
        """No factors worth serving (``RTF.fit_popularity_only``): nothing is held out or run."""
        self.estimator_ = type(self.estimator)(**self.estimator.get_params()).fit_popularity_only(data)
        self.history_, self.best_epoch_, self.epochs_run_ = [], 0, 0
        return self

    def serves(self) -> str:
        """What the index answers Tags with ("rtf" or "pop-mix")."""
        return self.estimator_.serves()

    def to_artifact(self, **serving: Any) -> Artifact:
        """The fitted model's artifact (``RTF.to_artifact``'s serving choices), with the kept pass's
        training and validation AUC among its metrics."""
        artifact = self.estimator_.to_artifact(**serving)
        if self.history_:
            kept = next((h for h in self.history_ if h["epoch"] == self.best_epoch_), self.history_[-1])
            artifact.metrics.update(best_epoch=float(self.best_epoch_), train_auc=kept["train_auc"])
            if "val_auc" in kept:
                artifact.metrics["validation_auc"] = kept["val_auc"]
        return artifact
