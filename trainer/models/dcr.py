"""DCR and Pairwise DCR: Decoupled Collaborative Ranking (Hu & Li, WWW 2017).

Ratings on S ordered values ``l_1 < ... < l_S`` are decoupled into S binary
problems; problem ``t`` labels a rating 1 when ``r >= l_t`` (level 1 is all
ones, so only t = 2..S are learned). Each level has its own low-rank factors
with bounded norms (Eq. 1):

    P(r_ui >= l_t) = (U_u^t . V_i^t + 1) / 2,   |U_u^t| <= 1, |V_i^t| <= 1

fitted by stochastic gradient ascent on the level's log-likelihood with a
projection onto the unit ball after every update; levels are independent and
train in parallel threads. Items are ranked by (Eq. 4)

    SC_ui = f(l_1) + sum_t (f(l_t) - f(l_{t-1})) P(r_ui >= l_t)

with the relevance function ``f`` linear (default), log or exp.

Pairwise DCR (:class:`PairwiseDCR`, wrapping a DCR; Section 4, Eq. 5-7,
Algorithm 1) starts from the DCR factors and minimises the logistic loss
``log(1 + exp(-(SC_ui - SC_uj)))`` over ordered rating pairs of each user plus
``lambda * sum |U|^2 + |V|^2`` by stochastic gradient steps with the same
projection. Pairs are sampled on the fly inside the kernel, never enumerated.

Named variants beyond the paper (:class:`DCRVariants`,
off by default, so ``DCR().fit(data)`` is the paper's):
``item_bias=s > 0`` freezes the first coordinate of every user vector at
``s`` (the rest projected onto the ball of radius ``sqrt(1 - s^2)``, so
``|U_u^t| <= 1`` still holds); the first item coordinate then acts as a
per-level item bias ``s * V_i0^t`` that every user shares, which the
unconstrained factors have to learn from scratch in plain DCR.
A serving choice of ``to_artifact``, ``item_shrinkage=beta > 0``, serves each
item's factors scaled by ``n_i / (n_i + beta)`` (``n_i`` its training
ratings): an item seen once would otherwise sit on the ball's boundary and
rank as confidently as a well-known one; training is unchanged.

Starting point and stopping (choices the paper leaves open; the model,
objective and SGA steps are the paper's either way): ``init="marginal"``
starts every level at its damped item marginals instead of small random
factors, and ``fit(data, validation=...)`` stops each level at the epoch of
its best validation log-likelihood (``best_epochs_``, reusable as variants
``level_epochs`` for a refit on all the ratings; :class:`EarlyStoppedDCR`
does both). Why: with a few ratings per user, the coordinates of ``U_u^t`` that the user's ratings never push
keep their random initial values, which add user-specific noise to every
item's score; and SGA from a random start must first grow the shared
item-effect direction that an item mean gets for free.
"""

from __future__ import annotations

import copy
import errno
import mmap
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np

from ordrec.service.indices.ann import ANN_MIN_ITEMS, CALIBRATION_QUERIES, Queries, build_params, item_index
from ordrec.service.indices.models.dcr import RELEVANCE, DCRIndex, level_weights
from ordrec.service.storage.artifact import Artifact
from ordrec.trainer.data.types import DataError, Ratings
from ordrec.trainer.models.base import Estimator, Interval, Options, Settings, check_finite, validate_params
from ordrec.trainer.models.dcr_kernels import (
    UnratedSampler,
    check_rows_finite,
    held_out_rows,
    normal_rows,
    pairwise_epoch,
    pairwise_epoch_by_user,
    pointwise_epoch,
    pointwise_epoch_by_user,
    pointwise_loglik,
    rating_levels,
    shuffle_segments,
    user_csr,
)
from ordrec.trainer.models.ranking import ndcg_values, served_recall_values
from ordrec.trainer.models.selection import EarlyStopping, Gain, planned_fits, significant_gain, stream
from ordrec.trainer.progress import Progress

# The paper's DCR where the defaults differ (they are the top-N model's): what `reproduce dcr`
# and the `_paper` rows of `reproduce topn` fit.
PAPER_PARAMS = {
    "unrated_share": 0.0,
    "n_components": 20,
    "tol": 0.002,
    # A start far from zero: from near zero the first epochs gain little, and `tol` would stop there.
    "init_std": 0.1,
}


def unrated_levels(values: np.ndarray) -> np.ndarray:
    """The rating values with "not rated" prepended one step below the lowest (0 on 1..5; a
    single value, such as interactions of one strength, a step of 1 below it)."""
    step = float(np.min(np.diff(values))) if values.size > 1 else 1.0
    return np.r_[values[0] - step, values]


def lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Zeros whose pages cost nothing until written.

    ``np.zeros`` asks for transparent huge pages on large arrays, so writing a
    few scattered rows faults in and zeroes every 2 MB page around them. A
    protocol split keeps the whole user id map, so the rows with training
    ratings are scattered; an anonymous mapping of 4 KB pages only pays for
    the pages those rows touch. The mapping is private: reading a page never
    written maps the kernel's zero page (a shared one would allocate it), so a
    pass over every user's factors, as the serving index's mean takes when a
    validation scores the model, does not make 10^7 users' factors resident.
    """
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype)
    try:
        pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    except OSError as exc:  # ENOMEM: refused as np.zeros refuses, not as a file error
        if exc.errno != errno.ENOMEM:
            raise
        raise MemoryError(f"cannot map {nbytes:,} bytes for an array of shape {shape}") from None
    return np.frombuffer(pages, dtype=dtype).reshape(shape)


def _int_list(values) -> list[int]:
    """``level_epochs`` as a list of ints (``--set`` may pass "3,5,2,4")."""
    if isinstance(values, str):
        values = [x for x in values.split(",") if x.strip()]
    return [int(x) for x in values]


def validation_split(
    train: Ratings, rng: np.random.Generator, fraction: float = 0.25, minimum: int = 2
) -> tuple[Ratings, Ratings]:
    """Hold out ``max(minimum, fraction * n_u)`` of each user's training ratings."""
    kept, held = held_out_rows(train.user, train.n_users, rng, fraction, minimum)
    return train.subset(kept), train.subset(held)


def holdouts(
    train: Ratings, rng: np.random.Generator, folds: int, fraction: float = 0.25
) -> list[tuple[Ratings, Ratings]]:
    """``folds`` (at least one) ``validation_split`` hold-outs of ``train``, drawn in turn from ``rng``."""
    return list(each_holdout(train, rng, folds, fraction))


def each_holdout(
    train: Ratings, rng: np.random.Generator, folds: int, fraction: float = 0.25
) -> Iterator[tuple[Ratings, Ratings]]:
    """:func:`holdouts` one at a time (the same draws), so only one fold's copy is held."""
    for _ in range(max(1, int(folds))):
        yield validation_split(train, rng, fraction)


def median_level_epochs(epochs: list) -> list[int]:
    """Each level's median over the folds' validation-stopped epoch counts."""
    return [int(e) for e in np.median(np.array(epochs), axis=0).round()]


def stopped_level_epochs(
    params: dict,
    data: Ratings,
    rng: np.random.Generator,
    folds: int,
    fraction: float = 0.25,
    variants: DCRVariants | None = None,
    stopping: ValidationStopping | None = None,
) -> list[int]:
    """Per-level epoch counts for a refit on ``data``: each level's median over ``folds``
    hold-outs (``holdouts``) of the epoch where DCR(**params) early-stopped on it by
    ``stopping`` (fitted with ``variants``; its ``level_epochs`` are ignored)."""
    variants = replace(variants or DCRVariants(), level_epochs=None)
    epochs = [
        DCR(**params).fit(fit, validation=val, variants=variants, stopping=stopping).best_epochs_
        for fit, val in each_holdout(data, rng, folds, fraction)
    ]
    return median_level_epochs(epochs)


@dataclass(frozen=True)
class ValidationStopping(Settings):
    """How a fit with a validation set stops each level: a level improves when its validation
    log-likelihood rises by more than ``tol`` relative to its best so far, and training stops
    once no level has improved for ``patience`` epochs.

    ``tol`` is the flat name ``val_tol``, which means the same for every kind: the least rise of
    the validation criterion over its best so far that counts as progress. A log-likelihood
    grows with the hold-out, so DCR measures the rise relative to its magnitude (default 0: any
    rise); RTF's AUC is already a share, so it measures it in AUC (default 1e-4)."""

    patience: int = 5
    tol: float = 0.0

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "patience": [Interval(Integral, 1, None)],
        "tol": [Interval(Real, 0, None)],
    }


class _LevelStopper:
    """Per-level epoch counts: chosen on validation, or given (``level_epochs``).

    Level ``t``'s factors are the slices ``U[:, t]``, ``V[:, t]``; levels are
    independent problems, so each can stop at its own epoch while the others
    train on. Given counts: a level leaves ``levels_to_train`` once its count
    is reached. Validation: every level trains until all have stalled (one
    :class:`EarlyStopping` track per level), and each keeps a copy of its
    slices at its best epoch, put back at the end.
    """

    def __init__(
        self,
        model: DCR,
        U: np.ndarray,
        V: np.ndarray,
        active: np.ndarray,
        data: Ratings,
        validation: Ratings | None,
        level_epochs,
        stopping: ValidationStopping,
    ):
        self.U, self.V, self.L = U, V, U.shape[1]
        # Snapshots hold only the users with training ratings: the other rows never change,
        # and a protocol split keeps every user of the id map, many times the active ones.
        self.active = active
        self.fixed = _int_list(level_epochs) if level_epochs is not None else None
        self.stopping = validation is not None or self.fixed is not None
        self.epochs = int(model.max_iter)
        self.tracks: EarlyStopping | None = None
        self.saved: list = [None] * self.L
        if self.fixed is not None:
            if validation is not None:
                raise ValueError("give either level_epochs or validation, not both")
            if len(self.fixed) != self.L:
                raise ValueError(
                    f"level_epochs needs one count per learned level ({self.L}), got {self.fixed}"
                )
            self.epochs = max(self.fixed)
        elif validation is not None:
            if validation.n_users != data.n_users or validation.n_items != data.n_items:
                raise ValueError("validation ratings must share the training id maps")
            _, level = rating_levels(validation.rating, model.levels_, validation.source)
            self.v_user = validation.user.astype(np.int64)
            self.v_item = validation.item.astype(np.int64)
            self.v_level = level
            start = pointwise_loglik(U, V, self.v_user, self.v_item, level)
            # A gain counts only above tol (relative): a likelihood that creeps up by a hair
            # per epoch would otherwise keep a level training for every epoch.
            self.tracks = EarlyStopping(start, patience=stopping.patience, tol=stopping.tol, relative=True)
            self.history = [[float(x) for x in start]]
            for t in range(self.L):
                self._save(t)
        model.best_epochs_ = self.best_epochs
        self.model = model

    @property
    def best_epochs(self) -> list[int] | None:
        """Each level's epoch count: the given ones, the best so far on validation, or None."""
        if self.fixed is not None:
            return list(self.fixed)
        if self.tracks is not None:
            return [int(e) for e in self.tracks.best_epochs]
        return None

    def _save(self, t: int) -> None:
        self.saved[t] = (self.U[self.active, t], self.V[:, t].copy())

    def levels_to_train(self, epoch: int) -> np.ndarray:
        """The levels that take epoch ``epoch`` (0-based)."""
        if self.fixed is None:
            return np.arange(self.L, dtype=np.int64)
        return np.array([t for t in range(self.L) if self.fixed[t] > epoch], dtype=np.int64)

    def after_epoch(self, epoch: int) -> bool:
        """Record level snapshots after ``epoch`` epochs; True when training can stop."""
        if self.tracks is None:
            return False
        ll = pointwise_loglik(self.U, self.V, self.v_user, self.v_item, self.v_level)
        self.history.append([float(x) for x in ll])
        for t in np.flatnonzero(self.tracks.update(epoch, ll)):
            self._save(int(t))
        return self.tracks.should_stop

    def restore(self) -> None:
        if not self.stopping:
            return
        for t in range(self.L):
            if self.saved[t] is not None:
                self.U[self.active, t], self.V[:, t] = self.saved[t]
        self.model.best_epochs_ = self.best_epochs
        if self.tracks is not None:
            self.model.validation_loglik_ = [float(x) for x in self.tracks.best]
            # Per-level validation log-likelihood after every epoch (row 0: the start).
            self.model.validation_history_ = np.array(self.history)


@dataclass(frozen=True)
class DCRVariants(Settings):
    """Variants of DCR's model and fit that the paper protocol compares (not constructor
    parameters): some change the served model (``item_bias``, ``popularity_shrinkage``), so
    the artifact records them.

    ``DCR()`` is the paper's model with the defaults here; the protocol
    (``trainer/reproduce/dcr.py``) passes other values to
    ``DCR.fit(data, variants=DCRVariants(...))``. The fitted model keeps
    them as ``variants_`` (the refinement and ``to_artifact`` read them there),
    and a manifest records the ones that differ from these defaults under
    its ``research`` hyperparameter (the artifact's name for them, kept).

    Attributes
    ----------
    order : {"user", "random"}
        Order of the SGA steps within an epoch. "user" (default): users in a
        fresh random order, each user's ratings together in a fresh random
        order (``U_u`` stays in cache for the user's ratings, so an epoch
        costs less CPU); "random": a fresh random permutation of all ratings. Same
        steps, same objective; only the visiting order differs. The pairwise
        refinement likewise draws each user's pairs in a row ("user":
        exactly ``pairs_per_epoch * n_u`` draws for a user with ``n_u``
        ratings) or draws the first rating of every pair uniformly
        ("random": the same weighting in expectation).
    projection : {"ball", "sphere"}
        "ball" (default) projects onto ``|x| <= 1`` (the constraint of Eq. 1);
        "sphere" rescales every updated vector to norm 1, the paper's literal
        ``U <- U / |U|``.
    prob_floor : float, default 1e-3
        ``1/P`` in the gradient is capped at ``1/prob_floor`` (P reaches 0 on
        the ball's boundary).
    item_bias : float, default 0.0
        0 is the paper's DCR; ``s`` in (0, 1) freezes the first user
        coordinate at ``s`` (a per-level item bias, the DCR-bias variant, see
        the module docstring).
    popularity_shrinkage : float, default 10.0
        Shrinkage ``beta`` of the damped item mean stored as ``item_popularity``
        (the unknown-user fallback): ``(sum r + beta * mean) / (count + beta)``.
    init_shrinkage : float, default 10.0
        ``beta`` of the damped marginals of ``init="marginal"``.
    level_epochs : list of int or str, optional
        Epochs per learned level (level ``t`` is frozen after
        ``level_epochs[t]``; 0 keeps its initial factors); overrides
        ``max_iter`` and ``tol``. ``fit(data, validation=...)`` chooses them
        (``best_epochs_``); the protocol refits on all the ratings with them.
        A string "3,5,2,4" is read as a list.
    """

    order: str = "user"
    projection: str = "ball"
    prob_floor: float = 1e-3
    item_bias: float = 0.0
    popularity_shrinkage: float = 10.0
    init_shrinkage: float = 10.0
    level_epochs: Any = None

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "order": [Options(str, {"user", "random"})],
        "projection": [Options(str, {"ball", "sphere"})],
        "prob_floor": [Interval(Real, 0, None, closed="left")],
        "item_bias": [Interval(Real, 0, 1, closed="left")],
        "popularity_shrinkage": [Interval(Real, 0, None, closed="left")],
        "init_shrinkage": [Interval(Real, 0, None, closed="left")],
        "level_epochs": [None, list, tuple, str],
    }

    @classmethod
    def split(cls, params: dict) -> tuple[dict, DCRVariants]:
        """A mixed dict of DCR parameters and variants as (DCR's, the options)."""
        names = set(cls.field_names())
        return (
            {k: v for k, v in params.items() if k not in names},
            cls(**{k: v for k, v in params.items() if k in names}),
        )

    def validate(self) -> None:
        super().validate()
        if self.level_epochs is not None and any(int(e) < 0 for e in _int_list(self.level_epochs)):
            raise ValueError("level_epochs must be non-negative epoch counts")

    def changed(self) -> dict:
        """The options that differ from the defaults (what a manifest records)."""
        default = DCRVariants()
        return {k: v for k, v in asdict(self).items() if v != getattr(default, k)}


@dataclass(frozen=True)
class DCRSolver(Settings):
    """How a DCR fit runs, not what it fits: the learning rate's decay, how unrated items are
    drawn, and the factors' float type while training.

    Parameters
    ----------
    learning_rate_decay : float, default 0.02
        Epoch ``e`` steps with ``learning_rate / (1 + learning_rate_decay * e)`` (the pairwise
        refinement's passes likewise).
    unrated_power : float, default 0.5
        Unrated items are drawn with probability proportional to their training rating count
        to this power (0: uniform); used when ``unrated_share > 0``.
    dtype : {"float32", "float64"}, default "float32"
        Type of the factors while training (float32 halves the memory traffic and doubles the
        SIMD lanes of the SGA steps); the artifact is float32 either way.
    """

    learning_rate_decay: float = 0.02
    unrated_power: float = 0.5
    dtype: str = "float32"

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "learning_rate_decay": [Interval(Real, 0, None)],
        "unrated_power": [Interval(Real, 0, 1)],
        "dtype": [Options(str, {"float32", "float64"})],
    }


class DCR(Estimator):
    """Decoupled Collaborative Ranking (pointwise; :class:`PairwiseDCR` refines it pairwise).

    The defaults are the top-N-aware model that Recommend serves ("not rated"
    as the lowest level, docs/dcr.md "Top-N"); ``unrated_share=0`` is the
    paper's, which ``reproduce dcr`` fits. The variants the paper protocol
    compares are :class:`DCRVariants`, how a fit runs is ``solver``
    (:class:`DCRSolver`), model selection wraps the estimator
    (:class:`EarlyStoppedDCR`, :class:`ValidatedRefinement`), and the item
    index is a choice of :meth:`to_artifact`.

    Parameters
    ----------
    n_components : int, default 50
        Dimension of each level's factors (paper: 20 pointwise, 40 in Table 2).
    unrated_share : float, default 1.0
        Top-N awareness: "not rated" becomes an ordinal level below the
        lowest rating, and every epoch each user's ratings are joined by
        ``unrated_share`` freshly drawn unrated items per rating at that
        level (the pairwise refinement then also orders rated over unrated).
        0 is the paper's DCR, which orders only the items a user rated.
    levels : list of float or str, optional
        The ordered rating values; default the distinct values in the data.
    relevance : {"linear", "log", "exp"}, default "linear"
        ``f`` in Eq. 2/4 (paper recommends linear).
    learning_rate : float, default 0.05
        Initial SGA learning rate (paper: one of 0.05 ... 0.01).
    reg : float, default 0.001
        L2 weight per example (paper: 0.01 or 0.001).
    max_iter : int, default 100
        Passes over the ratings (every level sees every rating once a pass);
        the most passes when ``tol > 0``.
    init_std : float, default 0.001
        Standard deviation of the random initial factors. Small, so that an item with
        few ratings ends where its raters pull it, not where its draw put it (docs/dcr.md).
    tol : float, default 0.0
        Stop before ``max_iter`` once an epoch raises the training
        log-likelihood per rating by less than ``tol`` relative to its value
        (0: always run ``max_iter``). ``epochs_run_`` records the epochs done.
    init : {"random", "marginal"}, default "random"
        "random": zero-mean normal factors of standard deviation ``init_std``
        (the paper does not state its initialisation). "marginal" (ours):
        every level starts at its damped item marginals through one
        coordinate plus noise of ``init_std`` in the others (docs/dcr.md).
    solver : DCRSolver, dict or None, default None
        How the fit runs (learning-rate decay, how unrated items are drawn,
        the factors' float type); a dict sets some fields, None the defaults.
    random_state : int, default 0
        Seed of the initialisation, the rating order and the pair sampling.
    verbose : bool, default False
        Progress line on stderr.
    """

    kind = "dcr"
    input_shape = "ratings"
    nested_settings: ClassVar[dict[str, type[Settings]]] = {"solver": DCRSolver}

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "n_components": [Interval(Integral, 1, None)],
        "unrated_share": [Interval(Real, 0, None)],
        "levels": [None, list, tuple, str, np.ndarray],
        "relevance": [Options(str, set(RELEVANCE))],
        "learning_rate": [Interval(Real, 0, None)],
        "reg": [Interval(Real, 0, None)],
        "max_iter": [Interval(Integral, 0, None)],
        "init_std": [Interval(Real, 0, None)],
        "tol": [Interval(Real, 0, None)],
        "init": [Options(str, {"random", "marginal"})],
        "solver": [None, DCRSolver, dict],
        "random_state": [Interval(Integral, 0, None)],
        "verbose": ["boolean"],
    }

    def __init__(
        self,
        *,
        n_components: int = 50,
        unrated_share: float = 1.0,
        levels=None,
        relevance: str = "linear",
        learning_rate: float = 0.05,
        reg: float = 0.001,
        max_iter: int = 100,
        init_std: float = 0.001,
        tol: float = 0.0,
        init: str = "random",
        solver: DCRSolver | dict | None = None,
        random_state: int = 0,
        verbose: bool = False,
    ):
        self.n_components = n_components
        self.unrated_share = unrated_share
        self.levels = levels
        self.relevance = relevance
        self.learning_rate = learning_rate
        self.reg = reg
        self.max_iter = max_iter
        self.init_std = init_std
        self.tol = tol
        self.init = init
        self.solver = solver
        self.random_state = random_state
        self.verbose = verbose

    def solver_settings(self) -> DCRSolver:
        """The ``solver`` parameter as a :class:`DCRSolver`."""
        return self.settings("solver")

    # ------------------------------------------------------------ checks
    def _validate_params(self, variants: DCRVariants | None = None) -> None:
        super()._validate_params()
        if variants is not None:
            variants.validate()
            if variants.item_bias and int(self.n_components) < 2:
                raise ValueError("item_bias needs n_components >= 2 (one coordinate is the bias)")

    # ------------------------------------------------------------ fitting
    def fit(
        self,
        data: Ratings,
        validation: Ratings | None = None,
        *,
        variants: DCRVariants | None = None,
        stopping: ValidationStopping | None = None,
    ) -> DCR:
        """Fit the per-level factors (pointwise; :class:`PairwiseDCR` refines them).

        ``validation`` (ratings on the same id maps, e.g. a hold-out carved
        from the training ratings) turns on early stopping per level: after
        every epoch each level's validation log-likelihood is computed, each
        level keeps the factors of its best epoch (epoch 0 is the initial
        point), and training stops by the ``stopping`` rule (default
        :class:`ValidationStopping`) or at ``max_iter``. ``best_epochs_``
        records the chosen epoch of each level; pass it as variants
        ``level_epochs`` to refit on all the ratings for those counts
        (:class:`EarlyStoppedDCR` does both). The training-likelihood rule
        ``tol`` is not used then.

        ``variants`` (:class:`DCRVariants`; default: the paper's model) is kept as
        ``variants_``.
        """
        variants = DCRVariants() if variants is None else variants
        self._validate_params(variants)
        stopping = ValidationStopping() if stopping is None else stopping
        stopping.validate()
        self.variants_ = variants
        _require_ratings(data)
        user, item, level = self._index_ratings(data, validation)
        rng = np.random.default_rng(self.random_state)
        U, V, active, (u_fixed, u_radius) = self._initial_factors(rng, item, level)
        stopper = _LevelStopper(self, U, V, active, data, validation, variants.level_epochs, stopping)
        # Per level, the training log-likelihood of its last epoch; a level given 0 epochs
        # reports its starting point's.
        self.loglik_ = (
            pointwise_loglik(U, V, user, item, level)
            if 0 in (stopper.fixed or [])
            else np.full(U.shape[1], np.nan)
        )
        self.loglik_history_: list[float] = []
        _fit_pointwise(self, U, V, user, item, level, active, rng, stopper, u_fixed, u_radius)
        self.epochs_run_ = len(self.loglik_history_)
        stopper.restore()
        # Rows without training ratings were never updated.
        check_rows_finite(self.epochs_run_ - 1, "user_factors", U, active)
        check_finite(self.epochs_run_ - 1, item_factors=V)
        # Items (users) without training ratings keep no evidence: P = 1/2 at every level
        # (with the marginal init: the global per-level marginals they started from).
        if self.init != "marginal":
            V[self.item_counts_ == 0] = 0.0
        self.U_, self.V_ = U, V
        return self

    def _index_ratings(
        self, data: Ratings, validation: Ratings | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fit's levels, id maps, per-user training CSR, item counts and popularity fallback;
        each rating's user, item and 0-based level."""
        # Without given levels, a validation split's ratings count too: a value that only
        # held-out ratings have would otherwise be refused as unknown.
        levels = self.levels
        if levels is None and validation is not None:
            levels = np.union1d(data.rating, validation.rating)
        # Beside "not rated", one value (picked, as interactions of equal strength) is a contrast.
        self.levels_, level = rating_levels(
            data.rating, levels, data.source, fewest=1 if self._unrated else 2
        )
        if self._unrated:
            self.levels_, level = unrated_levels(self.levels_), level + 1
            if self.relevance == "log" and self.levels_[0] <= 0:
                raise ValueError(
                    f"relevance='log' needs positive values, and 'not rated' sits at {self.levels_[0]:g}"
                    " below the lowest rating: use 'linear' or 'exp', or unrated_share=0"
                )
        self.users_, self.items_ = data.users, data.items
        self.data_fingerprint_ = data.fingerprint()
        # The caller's int32 arrays, not copies: the fit holds no rating-sized index copy.
        user = np.asarray(data.user, dtype=np.int32)
        item = np.asarray(data.item, dtype=np.int32)
        self.seen_indptr_, self.seen_indices_, self.seen_levels_ = user_csr(data.n_users, user, item, level)
        self.item_counts_ = np.bincount(item, minlength=data.n_items)
        # The unknown-user fallback: what is picked most (top-N), or the damped mean rating (paper).
        self.item_popularity_ = (
            self.item_counts_.astype(np.float32) if self._unrated else self._damped_mean(data, data.n_items)
        )
        return user, item, level

    def _initial_factors(
        self, rng: np.random.Generator, item: np.ndarray, level: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, float]]:
        """The starting U and V, the users with training ratings, and the frozen user coordinates
        and radius of ``item_bias``."""
        n_users, n_items = self.seen_indptr_.size - 1, self.item_counts_.size
        L, f = self.levels_.size - 1, int(self.n_components)
        # Random initial factors only for users and items with training ratings: the
        # others get no update and are served at zero (P = 1/2 at every level, no
        # evidence). Drawing 48k users' factors when a training subset has 10k users
        # costs more than a whole epoch.
        active = np.flatnonzero(np.diff(self.seen_indptr_) > 0)
        rated = np.flatnonzero(self.item_counts_ > 0)
        dtype = self.solver_settings().dtype
        U = lazy_zeros((n_users, L, f), dtype)
        V = np.zeros((n_items, L, f), dtype=dtype)
        normal_rows(U, active, rng, self.init_std)
        normal_rows(V, rated, rng, self.init_std)
        u_fixed, u_radius = self._bias_setup(U, V)
        if self.init == "marginal":
            self._marginal_init(U, V, item, level, active, u_fixed)
        return U, V, active, (u_fixed, u_radius)

    @property
    def _unrated(self) -> bool:
        return float(self.unrated_share) > 0.0

    def _unrated_sampler(self) -> UnratedSampler:
        """The training ratings joined, each epoch, by a fresh draw of unrated items at level 0."""
        weights = self.item_counts_.astype(np.float64) ** float(self.solver_settings().unrated_power)
        return UnratedSampler(
            self.seen_indptr_,
            self.seen_indices_,
            self.seen_levels_,
            float(self.unrated_share) * np.diff(self.seen_indptr_).astype(np.float64),
            np.cumsum(weights),
        )

    def _converged(self) -> bool:
        """The stopping rule: training log-likelihood per rating gained less than ``tol``
        (relative) in the last epoch. ``tol = 0`` runs all ``epochs``.

        The log-likelihood is the sum the epoch kernel accumulates before each
        step (no extra pass). It rises quickly, then creeps up as the factors
        fit the training ratings; the creep is where ranking quality stops
        improving, and it starts after more epochs when each user and item
        has fewer ratings (ML-100K, N = 10) than when it has many (Netflix).
        """
        h = self.loglik_history_
        if float(self.tol) <= 0.0 or len(h) < 2:
            return False
        return (h[-1] - h[-2]) < float(self.tol) * abs(h[-1])

    def _marginal_init(
        self,
        U: np.ndarray,
        V: np.ndarray,
        item: np.ndarray,
        level: np.ndarray,
        active: np.ndarray,
        u_fixed: int,
    ) -> None:
        """Start every level at the damped item-marginal model (``init="marginal"``; ours).

        Level ``t``'s item marginal ``p_it = (n_it + beta g_t) / (n_i + beta)``,
        ``n_it`` the item's training ratings ``>= l_t``, ``n_i`` all its
        ratings, ``g_t`` the global fraction ``>= l_t`` and ``beta =
        init_shrinkage``. Coordinate ``k0`` (the first free one: 0, or 1
        under ``item_bias``) of every user vector is set to ``a_u =
        sqrt(1 - |noise_u|^2)`` (so ``|U_u| = 1``) and that of every item
        vector to ``(2 p_it - 1) / mean(a)``, clipped into the ball; the other
        coordinates keep the random draw (``init_std``). Then ``U_u . V_i``
        is about ``2 p_it - 1`` and Eq. 1 gives ``P(r >= l_t) = p_it``: the
        fit starts at the damped item mean of every level and SGA only has
        to personalise it. The model and objective are the paper's; the
        starting point is not (the paper does not state its initialisation).
        Items without training ratings start (and stay) at ``g_t``.
        """
        n_items, L, f = V.shape
        k0 = u_fixed
        if k0 >= f:
            raise ValueError("init='marginal' needs a free coordinate (rank > 1 with item_bias)")
        beta = float(self.variants_.init_shrinkage)
        counts = np.bincount(item, minlength=n_items).astype(np.float64)
        radius = float(np.sqrt(1.0 - float(self.variants_.item_bias) ** 2)) if u_fixed else 1.0
        # The user coordinate: the rest of the vector's norm budget (|U_u| = radius).
        noise_u = np.sum(U[:, :, k0 + 1 :] ** 2, axis=2)
        a = np.sqrt(np.maximum(radius * radius - noise_u, 0.0))
        U[:, :, k0] = a
        a_mean = float(a[active].mean()) if active.size else radius
        for t in range(L):
            ge = (level >= t + 1).astype(np.float64)
            g = float(ge.mean())
            n_ge = np.bincount(item, weights=ge, minlength=n_items)
            p = np.where(counts + beta > 0, (n_ge + beta * g) / np.maximum(counts + beta, 1e-12), g)
            target = 2.0 * p - 1.0
            if u_fixed:
                # item_bias already contributes s * V_i0; leave the target to the free coordinate.
                target = target - float(self.variants_.item_bias) * V[:, t, 0]
            noise_v = np.sum(V[:, t, k0 + 1 :] ** 2, axis=1)
            room = np.sqrt(np.maximum(1.0 - noise_v - (V[:, t, 0] ** 2 if u_fixed else 0.0), 0.0))
            V[:, t, k0] = np.clip(target / a_mean, -room, room)
        # A large init_std can draw noise outside the ball on its own: project it back.
        for X, start, bound in ((U, k0, radius), (V, 0, 1.0)):
            norm = np.sqrt(np.sum(X[:, :, start:] ** 2, axis=2, keepdims=True))
            X[:, :, start:] /= np.maximum(norm / bound, 1.0)

    def _bias_setup(self, U: np.ndarray, V: np.ndarray) -> tuple[int, float]:
        s = float(self.variants_.item_bias)
        if s <= 0.0:
            return 0, 1.0
        U[:, :, 0] = s
        V[:, :, 0] = 0.0
        return 1, float(np.sqrt(1.0 - s * s))

    def _damped_mean(self, data: Ratings, n_items: int) -> np.ndarray:
        beta = float(self.variants_.popularity_shrinkage)
        mean = float(np.mean(data.rating))
        counts = np.bincount(data.item, minlength=n_items).astype(np.float64)
        sums = np.bincount(data.item, weights=data.rating.astype(np.float64), minlength=n_items)
        denom = counts + beta
        damped = np.where(denom > 0, (sums + beta * mean) / np.maximum(denom, 1e-12), mean)
        return damped.astype(np.float32)

    def validation_ndcg_values(self, validation: Ratings, k: int = 10) -> np.ndarray:
        """Per-user NDCG@k of ``validation`` (same id maps), scored by the serving index
        built from this model's artifact, as the protocols score (no approximate index)."""
        return ndcg_values(self._exact_index().score_items, validation, k)

    def validation_values(self, validation: Ratings, k: int = 10) -> np.ndarray:
        """The per-user validation measure of this model's objective: NDCG@k of the held-out
        order (the paper's DCR) or, top-N-aware, recall@k of the held-out liked items (the top
        two levels) among all items the user did not rate."""
        if not self._unrated:
            return self.validation_ndcg_values(validation, k)
        return served_recall_values(self._exact_index(), validation, float(self.levels_[-2]), k)

    def _exact_index(self) -> DCRIndex:
        """The serving index of this model, exact, over the model's own arrays (no copies: it
        is scored and dropped while the model is unchanged)."""
        return DCRIndex.from_artifact(self._packed(copy=False, ann_min_items=np.iinfo(np.int64).max))

    def _calibration_queries(self) -> Queries:
        """A seeded sample of the trained users as the server searches for them: factors with
        the level weights folded in, their training items excluded."""
        n_users, L, f = self.U_.shape
        rng = np.random.default_rng([int(self.random_state), 2])
        users = np.sort(rng.choice(n_users, min(n_users, CALIBRATION_QUERIES), replace=False))
        c, _ = level_weights(self.levels_, self.relevance)
        folded = self.U_[users].reshape(len(users), L * f) * np.repeat(c, f)[None, :]
        seen = [
            self.seen_indices_[self.seen_indptr_[u] : self.seen_indptr_[u + 1]].astype(np.int64)
            for u in users
        ]
        return Queries(folded.astype(np.float32), seen)

    def loglik(self, data: Ratings) -> np.ndarray:
        """Per-level log-likelihood of ``data`` (same id maps) under the fitted factors."""
        _, level = rating_levels(data.rating, self.levels_, data.source)
        return pointwise_loglik(
            self.U_, self.V_, data.user.astype(np.int64), data.item.astype(np.int64), level
        )

    # ------------------------------------------------------------ artifact
    def _recorded_params(self) -> dict[str, Any]:
        """The settings a manifest records, under the flat names a job table writes: the
        parameters, the solver's fields among them (a wrapper adds its own settings)."""
        params = {k: v for k, v in self.get_params().items() if k not in ("verbose", "solver")}
        params.update(asdict(self.solver_settings()))
        return params

    def _seen_ratings(self) -> np.ndarray:
        """Each training rating's value, aligned with ``seen_indices`` (NaN for "not rated"):
        the server explains recommendations from the items a user liked."""
        values = np.asarray(self.levels_, dtype=np.float32)[self.seen_levels_]
        if self._unrated:
            values[self.seen_levels_ == 0] = np.nan
        return values

    def to_artifact(
        self,
        *,
        item_shrinkage: float = 0.0,
        ann_min_items: int = ANN_MIN_ITEMS,
        ann_params: dict | None = None,
    ) -> Artifact:
        """The fitted model for the registry, with the serving choices made here.

        ``item_shrinkage`` (``beta >= 0``) serves each item's factors scaled by
        ``n_i / (n_i + beta)`` (``n_i`` its training ratings; the -shrunk variants).
        Catalogues of at least ``ann_min_items`` items get an approximate item index
        (``service/indices/ann.py``, ``docs/catalog.md``) of ``ann_params`` (``structure``
        ``"hnsw"`` or ``"ivf"`` and its settings); smaller ones are scored exactly.
        """
        return self._packed(
            copy=True, item_shrinkage=item_shrinkage, ann_min_items=ann_min_items, ann_params=ann_params
        )

    def _packed(
        self,
        *,
        copy: bool,
        item_shrinkage: float = 0.0,
        ann_min_items: int = ANN_MIN_ITEMS,
        ann_params: dict | None = None,
    ) -> Artifact:
        """:meth:`to_artifact`; ``copy=False`` lets the arrays share the model's memory (for an
        index used and dropped at once: the factors are then not held twice)."""
        if not hasattr(self, "U_"):
            raise ValueError("fit the model before packing it")
        check_serving(item_shrinkage, ann_min_items, ann_params)
        n_users, L, f = self.U_.shape
        params = self._recorded_params()
        if params["levels"] is not None:
            params["levels"] = [float(x) for x in (self.levels_[1:] if self._unrated else self.levels_)]
        if self.variants_.changed():
            params["research"] = self.variants_.changed()
        metrics = {f"train_loglik_level_{t + 2}": float(v) for t, v in enumerate(self.loglik_)}
        metrics["epochs_run"] = float(getattr(self, "epochs_run_", self.max_iter))
        # The epochs each level trained for, when they were given or chosen on validation.
        metrics.update(
            {
                f"epochs_level_{t + 2}": float(e)
                for t, e in enumerate(getattr(self, "best_epochs_", None) or [])
            }
        )
        item_factors = self.V_.reshape(self.V_.shape[0], L * f)
        beta = float(item_shrinkage)
        if beta > 0:
            params["item_shrinkage"] = beta
            counts = self.item_counts_.astype(np.float64)
            item_factors = item_factors * (counts / (counts + beta))[:, None]
        item_factors = item_factors.astype(np.float32, copy=copy)
        # A large catalogue gets an approximate item index, built when the version is published.
        indexes = (
            {"items": item_index(item_factors, ann_params, self._calibration_queries())}
            if item_factors.shape[0] >= int(ann_min_items)
            else {}
        )
        return Artifact(
            kind=self.kind,
            arrays={
                "user_factors": self.U_.reshape(n_users, L * f).astype(np.float32, copy=copy),
                "item_factors": item_factors,
                "seen_indptr": self.seen_indptr_.astype(np.int64, copy=copy),
                "seen_indices": self.seen_indices_.astype(np.int32, copy=copy),
                "seen_ratings": self._seen_ratings(),
                "item_popularity": self.item_popularity_,
            },
            ids={"users": self.users_, "items": self.items_},
            hyperparameters=params,
            metrics=metrics,
            attributes={
                "levels": [float(x) for x in self.levels_],
                "relevance": self.relevance,
                "rank": int(f),
                # The pointwise model; PairwiseDCR and ValidatedRefinement record their own.
                "pairwise": False,
                # levels[0] is "not rated": the served distribution is conditional on rating.
                "unrated_level": self._unrated,
                "pairwise_kept": False,
            },
            data_fingerprint=self.data_fingerprint_,
            indexes=indexes,
        )


def _fit_pointwise(
    model: DCR,
    U: np.ndarray,
    V: np.ndarray,
    user: np.ndarray,
    item: np.ndarray,
    level: np.ndarray,
    active: np.ndarray,
    rng: np.random.Generator,
    stopper: _LevelStopper,
    u_fixed: int,
    u_radius: float,
) -> None:
    """DCR's pointwise fit (Eq. 1 by projected SGA, levels in parallel): epochs over the
    ratings (joined by fresh unrated draws when top-N-aware) until the stopper or ``tol``
    says stop; records each epoch's training log-likelihood in ``model.loglik_history_``."""
    variants = model.variants_
    n_users = U.shape[0]
    # The arguments every epoch's SGA kernel shares: L2 weight, 1/P cap, projection.
    step = (float(model.reg), float(variants.prob_floor), u_fixed, u_radius, variants.projection == "sphere")
    by_user = variants.order == "user"
    if by_user and not model._unrated:
        # Working copies: shuffle_segments permutes them in place every epoch.
        indptr = model.seen_indptr_
        seg_items = model.seen_indices_.copy()
        seg_levels = model.seen_levels_.copy()
    sampler = model._unrated_sampler() if model._unrated else None
    decay = float(model.solver_settings().learning_rate_decay)
    with Progress("DCR", stopper.epochs, model.verbose) as bar:
        for epoch in range(stopper.epochs):
            lr = float(model.learning_rate) / (1.0 + decay * epoch)
            train = stopper.levels_to_train(epoch)
            if sampler is not None:
                indptr, seg_items, seg_levels = sampler.draw(int(rng.integers(2**31 - 1)))
                if not by_user:
                    user = np.repeat(np.arange(n_users, dtype=np.int64), np.diff(indptr))
                    item, level = seg_items, seg_levels
            if by_user:
                shuffle_segments(indptr, seg_items, seg_levels, int(rng.integers(2**31 - 1)))
                loglik, norms = pointwise_epoch_by_user(
                    U, V, indptr, seg_items, seg_levels, rng.permutation(active), lr, *step, train
                )
                # Every updated vector's norm passes through this sum, so a NaN anywhere
                # in the factors shows here without scanning U and V every epoch.
                check_finite(epoch, loglik=loglik, factor_norms=norms)
            else:
                order = rng.permutation(len(user)).astype(np.int64)
                loglik = pointwise_epoch(U, V, user, item, level, order, lr, *step, train)
                check_finite(epoch, user_factors=U, item_factors=V)
            # A frozen level keeps the likelihood of its last epoch.
            model.loglik_[train] = loglik[train]
            model.loglik_history_.append(float(model.loglik_.sum()) / len(seg_levels if by_user else level))
            bar.update(1, loglik=model.loglik_history_[-1])
            if stopper.after_epoch(epoch + 1) if stopper.stopping else model._converged():
                break


def refine_in_place(model: DCR, refinement: PairwiseDCR) -> float:
    """The fitted ``model`` refined in place by ``refinement``'s settings on the refinement's own
    random stream (``stream(random_state, "pairwise")``); the last pass's loss (NaN: no pass)."""
    refinement.settings()
    return _fit_pairwise(model, refinement, stream(int(model.random_state), "pairwise"))


def _fit_pairwise(model: DCR, refinement: PairwiseDCR, rng: np.random.Generator) -> float:
    """Pairwise DCR (Algorithm 1, Eq. 5-7) by projected SGD on ``model.U_``/``V_`` in place, pairs
    sampled on the fly (rated over unrated too when top-N-aware), with ``refinement``'s settings;
    the last pass's loss."""
    loss = float("nan")
    c, _ = level_weights(model.levels_, model.relevance)
    bias = float(model.variants_.item_bias)
    u_fixed, u_radius = (1, float(np.sqrt(1 - bias**2))) if bias else (0, 1.0)
    indptr, items, levels = model.seen_indptr_, model.seen_indices_, model.seen_levels_
    sampler = model._unrated_sampler() if model._unrated else None
    # The arguments every pass's kernel shares: lambda of Eq. 5, the frozen coordinates, projection.
    step = (float(refinement.reg), u_fixed, u_radius, model.variants_.projection == "sphere")
    active = np.flatnonzero(np.diff(model.seen_indptr_) > (0 if model._unrated else 1))
    U, V = model.U_, model.V_
    decay = float(model.solver_settings().learning_rate_decay)
    share = float(refinement.pairs_per_epoch)
    with Progress("Pairwise DCR", refinement.max_iter, model.verbose) as bar:
        for epoch in range(int(refinement.max_iter)):
            lr = float(refinement.learning_rate) / (1.0 + decay * epoch)
            if sampler is not None:  # rated over unrated pairs too, from a fresh draw
                indptr, items, levels = sampler.draw(int(rng.integers(2**31 - 1)))
            n_steps = int(round(share * items.size))
            if model.variants_.order == "user":
                # Pairs grouped by user: U_u stays in cache for the user's draws.
                order = rng.permutation(active)
                loss, _ = pairwise_epoch_by_user(
                    U, V, indptr, items, levels, c, order, share, lr, *step, int(rng.integers(2**31 - 1))
                )
            else:
                loss, _ = pairwise_epoch(
                    U, V, indptr, items, levels, c, n_steps, lr, *step, int(rng.integers(2**31 - 1))
                )
            # Users with fewer than 2 ratings draw no pairs, so their rows never change.
            check_rows_finite(epoch, "user_factors", U, active)
            check_finite(epoch, item_factors=V)
            bar.update(1, loss=float(loss))
    return float(loss)


def check_serving(item_shrinkage: float, ann_min_items: int, ann_params: dict | None) -> None:
    """The serving choices of :meth:`DCR.to_artifact`: a ValueError names a bad one."""
    validate_params(
        "DCR.to_artifact",
        {"item_shrinkage": item_shrinkage, "ann_min_items": ann_min_items, "ann_params": ann_params},
        SERVING_CONSTRAINTS,
    )
    build_params(ann_params)  # names an unknown or non-positive index parameter


SERVING_CONSTRAINTS: dict[str, list] = {
    "item_shrinkage": [Interval(Real, 0, None, closed="left")],
    "ann_min_items": [Interval(Integral, 1, None)],
    "ann_params": [None, dict],
}

# ``DCR.to_artifact``'s serving choices when not given.
SERVING_DEFAULTS: dict[str, Any] = {"item_shrinkage": 0.0, "ann_min_items": ANN_MIN_ITEMS, "ann_params": None}

HOLD_OUT_CONSTRAINTS: dict[str, list] = {
    "folds": [Interval(Integral, 1, None)],
    "fraction": [Interval(Real, 0, 1, closed="neither")],
}


def _pointwise_params(model: DCR) -> dict:
    """``model``'s parameters for a pointwise fit on a hold-out (no progress line)."""
    return dict(model.get_params(), verbose=False)


def record_refinement(
    artifact: Artifact, kept: bool, loss: float, scores: tuple[float, float, float] | None = None
) -> Artifact:
    """``artifact`` (the served DCR's) marked as a pairwise fit: whether the refinement was kept,
    its last pass's loss when it ran, and the validation figures it was judged by."""
    artifact.attributes.update(pairwise=True, pairwise_kept=bool(kept))
    artifact.metrics["pairwise_kept"] = float(kept)
    if kept and np.isfinite(loss):
        artifact.metrics["train_pairwise_loss"] = float(loss)
    if scores is not None:
        point, pair, se = scores
        artifact.metrics.update(
            {"val_ndcg@10_pointwise": point, "val_ndcg@10_pairwise": pair, "val_ndcg@10_gain_se": se}
        )
    return artifact


class PairwiseDCR:
    """Pairwise DCR (Section 4, Eq. 5-7, Algorithm 1): a DCR fitted pointwise, then refined by
    the pairwise logistic loss, wrapping a DCR as a Pipeline's last step follows the others.

    The refinement minimises ``log(1 + exp(-(SC_ui - SC_uj)))`` over ordered rating pairs of
    each user (rated over unrated too when the DCR is top-N-aware) plus ``reg * (|U|^2 +
    |V|^2)`` by projected SGD, pairs sampled on the fly from its own random stream
    (``stream(random_state, "pairwise")``), with the DCR solver's learning-rate decay. The
    served model is ``best_estimator_``; ``loss_`` is the last pass's loss.

    Parameters
    ----------
    estimator : DCR
        The pointwise model.
    learning_rate : float, default 0.01
        Step size of the refinement.
    reg : float, default 0.001
        lambda of Eq. 5.
    max_iter : int, default 20
        Passes of the refinement.
    pairs_per_epoch : float, default 1.0
        Sampled pairs per pass, as a multiple of the number of ratings.
    """

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "learning_rate": [Interval(Real, 0, None)],
        "reg": [Interval(Real, 0, None)],
        "max_iter": [Interval(Integral, 0, None)],
        "pairs_per_epoch": [Interval(Real, 0, None)],
    }
    best_estimator_: DCR
    loss_: float

    def __init__(
        self,
        estimator: DCR,
        *,
        learning_rate: float = 0.01,
        reg: float = 0.001,
        max_iter: int = 20,
        pairs_per_epoch: float = 1.0,
    ):
        self.estimator = estimator
        self.learning_rate = learning_rate
        self.reg = reg
        self.max_iter = max_iter
        self.pairs_per_epoch = pairs_per_epoch

    def settings(self) -> dict[str, Any]:
        """The refinement's settings (everything but the estimator), checked."""
        settings = {name: getattr(self, name) for name in self._parameter_constraints}
        validate_params(type(self).__name__, settings, self._parameter_constraints)
        return settings

    def planned_fits(self) -> int:
        """The pointwise fits a fit runs (the refinement continues the last)."""
        return planned_fits(self.estimator)

    def fit(self, data: Ratings, validation: Ratings | None = None, **fit_params: Any) -> PairwiseDCR:
        """Fit the pointwise DCR (``fit_params`` as ``DCR.fit`` takes them), then refine it in place."""
        self.settings()
        model = copy.copy(self.estimator).fit(data, validation, **fit_params)
        self.best_estimator_ = self.refine_fitted(model)
        return self

    def refine_fitted(self, model: DCR) -> DCR:
        """The freshly fitted ``model`` refined in place (its pointwise factors are not kept)."""
        self.loss_ = refine_in_place(model, self)
        return model

    def refined(self, model: DCR) -> DCR:
        """A refined copy of the fitted ``model`` (the DCR fit is not repeated; the same steps
        as :meth:`refine_fitted`)."""
        if not hasattr(model, "U_"):
            raise ValueError("fit the model before refining it")
        self.settings()
        other = copy.copy(model)
        other.U_, other.V_ = model.U_.copy(), model.V_.copy()
        return self.refine_fitted(other)

    def to_artifact(self, **serving) -> Artifact:
        """The refined model's artifact, with ``DCR.to_artifact``'s serving choices."""
        return record_refinement(self.best_estimator_.to_artifact(**serving), True, self.loss_)


def refinement_scores(
    model: DCR,
    data: Ratings,
    folds: int,
    fraction: float,
    refinement: PairwiseDCR,
    max_users: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-user validation values (``DCR.validation_values``) of the pointwise fit and of its
    ``refinement``, each user's averaged over ``folds`` hold-outs of ``data``.

    Every hold-out's pointwise fit has ``model``'s parameters and variants, for the
    epochs of ``model`` when it had per-level counts; the hold-outs have their own random
    stream (``stream(random_state, "pairwise_validation")``), so they shift neither the fit
    nor the refinement. Only the held-out ratings of :func:`scored_users` (at most
    ``max_users``; None: every user) are scored.
    """
    return _fold_scores(*_fold_settings(model), data, folds, fraction, refinement, max_users)


def _fold_settings(model: DCR) -> tuple[dict, DCRVariants]:
    """The parameters and variants of ``model``'s hold-out fits (its epochs when it
    had per-level counts)."""
    return _pointwise_params(model), replace(
        model.variants_, level_epochs=getattr(model, "best_epochs_", None)
    )


def scored_users(data: Ratings, seed: int, max_users: int | None) -> np.ndarray | None:
    """Which users' held-out ratings a validated refinement scores: None (all of them) when at
    most ``max_users`` users have ratings, else a flag per user for a seeded uniform sample of
    ``max_users`` of them (``stream(seed, "scored_users")``: the folds' draws are not shifted)."""
    counts = np.bincount(data.user, minlength=data.n_users)
    rated = np.flatnonzero(counts > 0)
    if max_users is None or rated.size <= int(max_users):
        return None
    chosen = np.zeros(data.n_users, dtype=np.bool_)
    chosen[stream(int(seed), "scored_users").choice(rated, int(max_users), replace=False)] = True
    return chosen


def _fold_scores(
    params: dict,
    variants: DCRVariants,
    data: Ratings,
    folds: int,
    fraction: float,
    refinement: PairwiseDCR,
    max_users: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`refinement_scores` for pointwise fits of DCR(**params) with ``variants`` (its
    ``level_epochs`` the counts to fit for): needs no fitted model, so it can run before one."""
    _require_ratings_to_hold_out(data, "pairwise_validation")
    rng = stream(int(params["random_state"]), "pairwise_validation")
    chosen = scored_users(data, int(params["random_state"]), max_users)
    pointwise, refined = [], []
    for _ in range(max(1, int(folds))):
        # validation_split's draws, kept as row indices until each part is needed: at any time
        # one fold's ratings are held once (the fit's part during its fit, then the held-out one).
        kept, held = held_out_rows(data.user, data.n_users, rng, fraction, 2)
        fit = data.subset(kept)
        del kept
        point = DCR(**params).fit(fit, variants=variants)
        del fit
        if chosen is not None:
            held = held[chosen[data.user[held]]]
        val = data.subset(held)
        del held
        pointwise.append(point.validation_values(val))
        # Refined in place (the steps of PairwiseDCR.refined): the pointwise factors are
        # scored already, so no second copy of them is made.
        refine_in_place(point, refinement)
        refined.append(point.validation_values(val))
        del point, val  # the next fold's split and fit need not sit beside this one's
    if len({v.size for v in pointwise}) == 1:
        # Every fold holds out ratings of the same users: average each user's over folds.
        return np.mean(pointwise, axis=0), np.mean(refined, axis=0)
    # A user without gain in some fold (e.g. a rating of 0): pair within folds.
    return np.concatenate(pointwise), np.concatenate(refined)


class _HoldOutSelection:
    """A model-selection wrapper: its ``estimator`` and the ``folds`` hold-outs of ``fraction``
    of each user's ratings (at least 2) its choice is made on."""

    _parameter_constraints: ClassVar[dict[str, list]] = HOLD_OUT_CONSTRAINTS

    def __init__(self, estimator: Any, folds: int, fraction: float):
        self.estimator = estimator
        self.folds = folds
        self.fraction = fraction

    def _validate_params(self) -> None:
        """Every setting against the class's constraints (a ValueError names the bad one)."""
        params = {k: getattr(self, k) for k in self._parameter_constraints}
        validate_params(type(self).__name__, params, self._parameter_constraints)

    def planned_fits(self) -> int:
        """The fits a fit runs: one per hold-out, then the estimator's on all the ratings."""
        return int(self.folds) + planned_fits(self.estimator)


class ValidatedRefinement(_HoldOutSelection):
    """Pairwise DCR kept only where it wins on validation, wrapping a :class:`PairwiseDCR` as
    GridSearchCV wraps an estimator.

    The pointwise DCR is fitted on all the ratings; ``folds`` times, ``fraction`` of each
    user's ratings (at least 2) are held out, the pointwise model fitted on the rest is
    refined, and both are scored on the held-out ratings through the serving index
    (:func:`refinement_scores`). The refinement is kept only if its gain beats ``margin +
    confidence x SE`` (:func:`~ordrec.trainer.models.selection.significant_gain`); otherwise
    the pointwise model is served. After ``fit``: ``best_estimator_`` (the served DCR),
    ``kept_``, and ``val_scores_`` (pointwise, refined, standard error of the gain).

    Parameters
    ----------
    estimator : PairwiseDCR
        The refinement and, as its estimator, the pointwise model.
    folds : int, default 3
        Hold-outs the refinement must win on.
    fraction : float, default 0.25
        Share of each user's ratings held out (at least 2).
    margin : float, default 0.0
        The validation gain the refinement must exceed to be kept.
    confidence : float, default 2.0
        Standard errors of the gain it must exceed besides (0: any gain above the margin).
    max_users : int or None, default 100_000
        The most users whose held-out ratings are scored (each scoring ranks all items for a
        user): with more users with ratings, a seeded uniform sample of this many
        (:func:`scored_users`), the same in every fold; None scores every user. The sample
        leaves the expected gain as it is and widens its standard error by about
        ``sqrt(users / max_users)`` (docs/dcr.md "Memory at scale").
    """

    _parameter_constraints: ClassVar[dict[str, list]] = {
        **HOLD_OUT_CONSTRAINTS,
        "margin": [Interval(Real, 0, None)],
        "confidence": [Interval(Real, 0, None)],
        "max_users": [None, Interval(Integral, 1, None)],
    }
    estimator: PairwiseDCR
    best_estimator_: DCR
    kept_: bool
    val_scores_: tuple[float, float, float]

    def __init__(
        self,
        estimator: PairwiseDCR,
        *,
        folds: int = 3,
        fraction: float = 0.25,
        margin: float = 0.0,
        confidence: float = 2.0,
        max_users: int | None = 100_000,
    ):
        super().__init__(estimator, folds, fraction)
        self.margin = margin
        self.confidence = confidence
        self.max_users = max_users

    def decide(self, model: DCR, data: Ratings) -> tuple[Gain, tuple[float, float, float]]:
        """Whether refining the fitted ``model`` wins on hold-outs of ``data``; the verdict and
        (pointwise, refined, SE of the gain) as the artifact records."""
        self._validate_params()
        return self._decide(*_fold_settings(model), data)

    def _decide(
        self, params: dict, variants: DCRVariants, data: Ratings
    ) -> tuple[Gain, tuple[float, float, float]]:
        """:meth:`decide` for pointwise fits of DCR(**params) with ``variants``."""
        point, pair = _fold_scores(
            params, variants, data, int(self.folds), float(self.fraction), self.estimator, self.max_users
        )
        gain = significant_gain(pair - point, margin=float(self.margin), confidence=float(self.confidence))
        return gain, (float(point.mean()), float(pair.mean()), gain.se)

    def fit(self, data: Ratings, validation: Ratings | None = None, **fit_params: Any) -> ValidatedRefinement:
        """Fit the pointwise DCR (``fit_params`` as ``DCR.fit`` takes them), then refine it if
        that wins; the served model is ``best_estimator_``.

        Without ``validation`` the hold-outs run first (their streams are their own, so the
        result is the same): the full fit's factors and a fold's are never held at once.
        """
        self._validate_params()
        self.estimator.settings()
        pointwise = copy.copy(self.estimator.estimator)
        if validation is None:
            variants = fit_params.get("variants") or DCRVariants()
            pointwise._validate_params(variants)
            _require_ratings(data)
            # The fit's epochs: the given per-level counts (best_epochs_ after the fit), or None.
            epochs = None if variants.level_epochs is None else _int_list(variants.level_epochs)
            gain, scores = self._decide(
                _pointwise_params(pointwise), replace(variants, level_epochs=epochs), data
            )
            model = pointwise.fit(data, **fit_params)
        else:  # the fold fits take the epochs the validation set chooses for the full fit
            model = pointwise.fit(data, validation, **fit_params)
            gain, scores = self.decide(model, data)
        return self._chose(self.estimator.refine_fitted(model) if gain.kept else model, gain, scores)

    def refine(self, model: DCR, data: Ratings) -> ValidatedRefinement:
        """Like :meth:`PairwiseDCR.refined`, but the refinement is kept only where it wins on
        hold-outs of ``data``, the ratings ``model`` was fitted on; ``best_estimator_`` is the
        refined copy or ``model`` itself (its pointwise factors, untouched)."""
        if not hasattr(model, "U_"):
            raise ValueError("fit the model before refining it")
        if data.fingerprint() != model.data_fingerprint_:
            raise ValueError("ValidatedRefinement.refine needs the ratings the model was fitted on")
        gain, scores = self.decide(model, data)
        return self._chose(self.estimator.refined(model) if gain.kept else model, gain, scores)

    def _chose(self, served: DCR, gain: Gain, scores: tuple[float, float, float]) -> ValidatedRefinement:
        self.best_estimator_, self.kept_, self.val_scores_ = served, gain.kept, scores
        return self

    def to_artifact(self, **serving) -> Artifact:
        """The served model's artifact (``DCR.to_artifact``'s serving choices), recording the
        decision and the figures it was made on."""
        loss = self.estimator.loss_ if self.kept_ else float("nan")
        return record_refinement(
            self.best_estimator_.to_artifact(**serving), self.kept_, loss, self.val_scores_
        )


class EarlyStoppedDCR(_HoldOutSelection):
    """DCR whose per-level epoch counts are chosen on validation, wrapping a DCR (or a
    :class:`PairwiseDCR` or :class:`ValidatedRefinement` of one) as GridSearchCV wraps an
    estimator.

    ``folds`` times, ``fraction`` of each user's ratings (at least 2) are held out (drawn from
    ``stream(random_state, "early_stopping")``) and every level of the pointwise model is
    early-stopped on them by the ``stopping`` rule; the estimator is then fitted on all the
    ratings for each level's median stopping epoch (``chosen_level_epochs_``) into
    ``estimator_``. Given variants' ``level_epochs`` are used as they are.

    Parameters
    ----------
    estimator : DCR, PairwiseDCR or ValidatedRefinement
        The model fitted on all the ratings.
    stopping : ValidationStopping, optional
        When a hold-out fit stops (default: ``ValidationStopping()``, patience 5, tol 0).
    folds : int, default 3
        Hold-outs the epochs are chosen on.
    fraction : float, default 0.25
        Share of each user's ratings held out (at least 2).
    """

    _parameter_constraints: ClassVar[dict[str, list]] = {
        **HOLD_OUT_CONSTRAINTS,
        "stopping": [None, ValidationStopping],
    }

    def __init__(
        self,
        estimator: DCR | PairwiseDCR | ValidatedRefinement,
        *,
        stopping: ValidationStopping | None = None,
        folds: int = 3,
        fraction: float = 0.25,
    ):
        super().__init__(estimator, folds, fraction)
        self.stopping = stopping

    @property
    def model(self) -> DCR:
        """The DCR whose parameters the hold-out fits take (inside any wrappers)."""
        inner = self.estimator
        while not isinstance(inner, DCR):
            inner = inner.estimator
        return inner

    @property
    def best_estimator_(self) -> DCR:
        """The served DCR (inside the fitted wrappers)."""
        fitted = self.estimator_
        return fitted if isinstance(fitted, DCR) else fitted.best_estimator_

    def fit(self, data: Ratings, *, variants: DCRVariants | None = None) -> EarlyStoppedDCR:
        """Choose the per-level epochs on hold-outs of ``data``, then fit on all of it."""
        self._validate_params()
        if self.stopping is not None:
            self.stopping.validate()
        variants = DCRVariants() if variants is None else variants
        model = self.model
        model._validate_params(variants)
        self.chosen_level_epochs_: list[int] | None = None
        if variants.level_epochs is None:
            _require_ratings_to_hold_out(data, "early_stopping")
            self.chosen_level_epochs_ = stopped_level_epochs(
                _pointwise_params(model),
                data,
                stream(int(model.random_state), "early_stopping"),
                int(self.folds),
                float(self.fraction),
                variants,
                self.stopping,
            )
            variants = replace(variants, level_epochs=self.chosen_level_epochs_)
        self.estimator_ = copy.copy(self.estimator).fit(data, variants=variants)
        return self

    def to_artifact(self, **serving) -> Artifact:
        """The fitted estimator's artifact (its per-level epochs among its metrics)."""
        return self.estimator_.to_artifact(**serving)


def _require_ratings(data: Ratings) -> None:
    """A fit needs at least one rating (a DataError naming the source otherwise)."""
    if len(data) == 0:
        raise DataError(data.source, None, "no ratings to train on")


def _require_ratings_to_hold_out(data: Ratings, option: str) -> None:
    """Every user holds out at least 2 ratings, so users with 2 or fewer leave nothing behind."""
    if not np.any(np.bincount(data.user, minlength=data.n_users) > 2):
        raise DataError(
            data.source,
            None,
            f"{option} holds out at least 2 ratings per user, and no"
            " user has more than 2: nothing would be left to train on",
        )
