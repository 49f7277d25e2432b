"""COE: Collaborative Ordinal Embedding (Le & Lauw, SDM 2016).

Users and items get coordinates in one D-dimensional Euclidean space so that
a user is nearer the items the user prefers (type-A triples ``<u, i, j>``)
and nearer than other users to the items the user likes more than they do
(type-B triples ``<u, v, i>``). See ``docs/coe.md`` and
``docs/algorithms.md`` section 1.

Triples are drawn on the fly from compact rating arrays (``TripleSource``):
memory is O(ratings), never O(triples).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from numbers import Integral, Real
from typing import ClassVar

import numpy as np

from ordrec.service.storage.artifact import Artifact
from ordrec.trainer.data.triples import ExplicitTriples
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.models import coe_kernels
from ordrec.trainer.models.base import Estimator, Interval, Options, Settings, check_finite
from ordrec.trainer.progress import Progress

FUNCTIONS = {"sigmoid": coe_kernels.SIGMOID, "gompertz": coe_kernels.GOMPERTZ}
SOURCES = ("ratings", "cooccurrence")


def grouped(group: np.ndarray, member: np.ndarray, values: np.ndarray, n_groups: int):
    """CSR of ``(member, value)`` by ``group``, values sorted inside each group.

    Returns ``indptr`` (int64, n_groups + 1), members (int32), values
    (float32) and the permutation applied (int64), so callers can carry
    other per-rating columns along.
    """
    order = np.lexsort((values, group))
    indptr = np.zeros(n_groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(group, minlength=n_groups), out=indptr[1:])
    return (
        indptr,
        np.ascontiguousarray(member[order], dtype=np.int32),
        np.ascontiguousarray(values[order], dtype=np.float32),
        order,
    )


def normalise(ratings: Ratings, source: str) -> np.ndarray:
    """The per-rating values triples are formed from (float32, rating order).

    ``ratings``: z-score within each user (Section 5, after Ekstrand et al.),
    so ratings are comparable across users for type B. ``cooccurrence``:
    each user's counts divided by the user's total (Section 5: normalised
    term frequency).
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    if not np.all(np.isfinite(ratings.rating)):
        # NaN never ties with itself: it would make triples out of nothing
        raise ValueError("ratings hold NaN or infinite values")
    n_users = ratings.n_users
    if source == "cooccurrence":
        totals = np.bincount(ratings.user, weights=ratings.rating, minlength=n_users)
        if np.any(ratings.rating < 0):
            raise ValueError("co-occurrence counts must be non-negative")
        return (ratings.rating / np.maximum(totals[ratings.user], 1e-300)).astype(np.float32)
    mean, std = user_moments(ratings.user, ratings.rating, n_users)
    return zscore(ratings.user, ratings.rating, mean, std)


def user_moments(user: np.ndarray, rating: np.ndarray, n_users: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-user mean and (population) standard deviation of the ratings."""
    count = np.maximum(np.bincount(user, minlength=n_users), 1)
    mean = np.bincount(user, weights=rating, minlength=n_users) / count
    var = np.bincount(user, weights=(rating - mean[user]) ** 2, minlength=n_users) / count
    return mean, np.sqrt(var)


def zscore(user: np.ndarray, rating: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """z-scores with the given per-user moments; a user with std 0 gets all zeros (all ties)."""
    sd = std[user]
    z = np.where(sd > 0, (rating - mean[user]) / np.where(sd > 0, sd, 1.0), 0.0)
    return z.astype(np.float32)


@dataclass
class TripleSource:
    """All triples of a rating set, held as two sorted CSRs and per-group counts.

    ``a_*``: grouped by user (members are items) -> type-A triples.
    ``b_*``: grouped by item (members are users) -> type-B triples.
    ``*_count``: triples per group (int64), counted from the sorted values
    with tie arithmetic. Memory is O(ratings + users + items).
    """

    a_indptr: np.ndarray
    a_items: np.ndarray
    a_values: np.ndarray
    a_count: np.ndarray
    b_indptr: np.ndarray
    b_users: np.ndarray
    b_values: np.ndarray
    b_count: np.ndarray
    #: Each rating's strength (the input value, rows as ``a_items``; empty when not given):
    #: what ``strength_power`` weighs the rated item of a rated-over-unrated triple by.
    a_strength: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    @classmethod
    def build(
        cls,
        user: np.ndarray,
        item: np.ndarray,
        values: np.ndarray,
        n_users: int,
        n_items: int,
        strength: np.ndarray | None = None,
    ) -> TripleSource:
        a_indptr, a_items, a_values, a_order = grouped(user, item, values, n_users)
        b_indptr, b_users, b_values, _ = grouped(item, user, values, n_items)
        a_strength = np.zeros(0, np.float32) if strength is None else strength[a_order].astype(np.float32)
        return cls(
            a_indptr,
            a_items,
            a_values,
            coe_kernels.group_triple_counts(a_indptr, a_values),
            b_indptr,
            b_users,
            b_values,
            coe_kernels.group_triple_counts(b_indptr, b_values),
            a_strength,
        )

    @property
    def n_type_a(self) -> int:
        return int(self.a_count.sum())

    @property
    def n_type_b(self) -> int:
        return int(self.b_count.sum())

    def nbytes(self) -> int:
        return sum(getattr(self, f).nbytes for f in self.__dataclass_fields__)

    @staticmethod
    def _cumulative(count: np.ndarray, power: float) -> np.ndarray:
        weight = count.astype(np.float64)
        if power != 1.0:
            weight = np.where(count > 0, weight**power, 0.0)
        cum = np.zeros(count.shape[0] + 1)
        np.cumsum(weight, out=cum[1:])
        return cum

    def arrays(self, group_power: float = 1.0):
        """Kernel arguments; groups drawn with weight count**group_power (1: uniform over triples)."""
        return (
            self.a_indptr,
            self.a_items,
            self.a_values,
            self._cumulative(self.a_count, group_power),
            self.b_indptr,
            self.b_users,
            self.b_values,
            self._cumulative(self.b_count, group_power),
        )

    def picked_weights(self, strength_power: float) -> np.ndarray | None:
        """Each rating's weight as the rated item of a rated-over-unrated triple (rows as
        ``a_items``): strength ** ``strength_power``; None for 0 (every rating alike)."""
        if strength_power == 0:
            return None
        if self.a_strength.shape[0] != self.a_items.shape[0]:
            raise ValueError("strength_power > 0 needs triples built with the ratings' strengths")
        if np.any(self.a_strength <= 0):
            raise ValueError("strength_power > 0 needs positive ratings (strengths or levels)")
        return self.a_strength.astype(np.float64) ** float(strength_power)

    def picked_cum(self, strength_power: float) -> np.ndarray:
        """Prefix sums of :meth:`picked_weights` (length ratings + 1), empty for uniform draws."""
        weight = self.picked_weights(strength_power)
        if weight is None:
            return np.zeros(0)
        cum = np.zeros(weight.shape[0] + 1)
        np.cumsum(weight, out=cum[1:])
        return cum

    def unrated_arrays(
        self, power: float, strength_power: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Kernel arguments of rated-over-unrated draws: ``(user_cum, seen, item_cum)``.

        ``seen``: each user's items sorted by id (membership by binary search),
        rows as in ``a_indptr``. ``item_cum``: prefix sums of the weights
        (ratings per item) ** power, the distribution unrated items are drawn
        from. ``user_cum``: prefix sums of the users' rating counts (a draw is
        uniform over the ratings; with ``strength_power``, their summed
        :meth:`picked_weights`), 0 for a user who rated every item of
        positive weight, so a draw always finds an unrated item.
        """
        n_users, n_items = self.a_indptr.shape[0] - 1, self.b_indptr.shape[0] - 1
        counts = np.diff(self.a_indptr)
        owner = np.repeat(np.arange(n_users), counts)
        order = np.lexsort((self.a_items, owner))
        seen = np.ascontiguousarray(self.a_items[order], dtype=np.int32)
        weight = np.diff(self.b_indptr).astype(np.float64) ** float(power)
        item_cum = np.zeros(n_items + 1)
        np.cumsum(weight, out=item_cum[1:])
        owner = owner[order]
        distinct = np.ones(seen.shape[0], dtype=bool)
        distinct[1:] = (seen[1:] != seen[:-1]) | (owner[1:] != owner[:-1])
        rated_positive = np.bincount(owner[distinct & (weight[seen] > 0)], minlength=n_users)
        eligible = rated_positive < np.count_nonzero(weight > 0)
        picked = self.picked_cum(strength_power)
        weight_of_user = (
            counts if picked.size == 0 else picked[self.a_indptr[1:]] - picked[self.a_indptr[:-1]]
        )
        user_cum = np.zeros(n_users + 1)
        np.cumsum(np.where(eligible, weight_of_user, 0).astype(np.float64), out=user_cum[1:])
        return user_cum, seen, item_cum

    def sample(
        self,
        n: int,
        p_a: float,
        seed: int,
        group_power: float = 1.0,
        p_unrated: float = 0.0,
        unrated_power: float = 0.0,
        strength_power: float = 0.0,
    ):
        """``n`` triples drawn exactly as training draws them: (kind, first, second, third).

        Kind 2 marks a rated-over-unrated triple (probability ``p_unrated``).
        """
        unrated = (*self.unrated_arrays(unrated_power, strength_power), self.picked_cum(strength_power))
        return coe_kernels.sample_triples(self.arrays(group_power), n, p_a, seed, p_unrated, unrated)


@dataclass(frozen=True)
class COESolver(Settings):
    """How a COE fit runs, not what it fits: the learning rate's decay, the steps per epoch and
    how triples are drawn (docs/coe.md has the measurements behind the defaults).

    Parameters
    ----------
    learning_rate_final_ratio : float, default 0.01
        Learning rate at the end of training, as a fraction of ``learning_rate``; it decays
        linearly across all steps (a decaying rate, Algorithm 1).
    steps_per_epoch : int, default 0
        Triples drawn per epoch; 0 means one per observed rating.
    type_a_share : float or None, default 1.0
        Among the paper's triples, the probability that a step draws a type-A one. None draws
        uniformly over the whole triple set (T_A / (T_A + T_B)), as the paper does; 1 (type A
        only) is the top-N default.
    group_power : float, default 1.0
        Users (type A) and items (type B) are drawn with weight (their number of triples) **
        group_power, then one of their triples uniformly. 1 is the paper's uniform draw over
        the triple set; below 1 small groups get more steps (a deviation, see docs/coe.md).
    unrated_power : float, default 0.0
        Exponent on item popularity (training ratings per item) for drawing the unrated item of
        a rated-over-unrated triple: 0 draws uniformly over the catalogue, 1 proportionally to
        rating counts.
    strength_power : float, default 0.0
        How much a stronger interaction's "nearer than an item not picked" constraint counts:
        the rated item of a rated-over-unrated triple is drawn with weight rating **
        strength_power (on implicit data its strength level), so its share of the objective
        grows with the strength; 0 weighs every rating alike (docs/coe.md, implicit data).
    """

    learning_rate_final_ratio: float = 0.01
    steps_per_epoch: int = 0
    type_a_share: float | None = 1.0
    group_power: float = 1.0
    unrated_power: float = 0.0
    strength_power: float = 0.0

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "learning_rate_final_ratio": [Interval(Real, 0, None)],
        "steps_per_epoch": [Interval(Integral, 0, None)],
        "type_a_share": [None, Interval(Real, 0, 1)],
        "group_power": [Interval(Real, None, None)],
        "unrated_power": [Interval(Real, 0, None)],
        "strength_power": [Interval(Real, 0, None)],
    }


class COE(Estimator):
    """Collaborative Ordinal Embedding, fitted by stochastic gradient ascent.

    The defaults are the top-N settings Recommend serves (64-D, type-A and
    rated-over-unrated triples, chosen on a validation split, docs/coe.md
    "Top-N"); the paper's 2-D map objective is ``n_components=2,
    unrated_share=0`` with ``solver=COESolver(type_a_share=None)``
    (``ordrec-train reproduce coe`` passes its settings explicitly).

    Parameters
    ----------
    n_components : int, default 64
        D, the dimension of the shared space (2 or 3 for maps, as in the
        paper; 64 for top-N recommendation).
    function : {"sigmoid", "gompertz"}, default "sigmoid"
        Triple probability: COE-S (Eq. 3.2) or COE-G (Eq. 3.3, a = 1, b = ln 2).
    lam : float, default 3.0
        lambda, the slope of the sigmoid (COE-S).
    alpha : float, default 1.0
        alpha, the rate of the Gompertz function (COE-G).
    reg : float, default 0.01
        L2 weight from the N(0, gamma^2 I) priors (gamma = beta, Section 3.3).
    learning_rate : float, default 0.1
        Initial learning rate epsilon.
    max_iter : int, default 120
        Number of epochs; finiteness is checked after each.
    unrated_share : float, default 0.8
        Probability that a step draws a rated-over-unrated triple ``<u, i, j>``
        instead of one of the paper's triples: i is one of u's ratings drawn
        uniformly over all ratings, j an item u did not rate, drawn afresh at
        every step (``solver.unrated_power``). It teaches the map which items
        a user would pick at all, which the top-N question needs; 0 is the
        paper's objective (docs/coe.md, Top-N). Ignored when fitting an
        explicit triples file (no ratings tell rated from unrated).
    source : {"ratings", "cooccurrence"}, default "ratings"
        How the values triples compare are made from the input: per-user
        z-scores of ratings, or per-user normalised co-occurrence counts.
    init_std : float, default 0.1
        Standard deviation of the initial coordinates.
    solver : COESolver, dict or None, default None
        How the fit runs (learning-rate decay, steps per epoch, how triples
        are drawn); a dict sets some fields, None the defaults.
    random_state : int, default 0
        Seeds the initialisation and the triple draws.
    verbose : bool, default False
        Progress line on stderr.
    """

    kind = "coe"
    input_shape = "ratings"
    nested_settings: ClassVar[dict[str, type[Settings]]] = {"solver": COESolver}

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "n_components": [Interval(Integral, 1, None)],
        "function": [Options(str, set(FUNCTIONS))],
        "lam": [Interval(Real, None, None)],
        "alpha": [Interval(Real, None, None)],
        "reg": [Interval(Real, 0, None)],
        "learning_rate": [Interval(Real, 0, None, closed="neither")],
        "max_iter": [Interval(Integral, 1, None)],
        "unrated_share": [Interval(Real, 0, 1)],
        "source": [Options(str, set(SOURCES))],
        "init_std": [Interval(Real, 0, None)],
        "solver": [None, COESolver, dict],
        "random_state": [Interval(Integral, 0, None)],
        "verbose": ["boolean"],
    }

    def __init__(
        self,
        *,
        n_components: int = 64,
        function: str = "sigmoid",
        lam: float = 3.0,
        alpha: float = 1.0,
        reg: float = 0.01,
        learning_rate: float = 0.1,
        max_iter: int = 120,
        unrated_share: float = 0.8,
        source: str = "ratings",
        init_std: float = 0.1,
        solver: COESolver | dict | None = None,
        random_state: int = 0,
        verbose: bool = False,
    ):
        self.n_components = n_components
        self.function = function
        self.lam = lam
        self.alpha = alpha
        self.reg = reg
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.unrated_share = unrated_share
        self.source = source
        self.init_std = init_std
        self.solver = solver
        self.random_state = random_state
        self.verbose = verbose

    def solver_settings(self) -> COESolver:
        """The ``solver`` parameter as a :class:`COESolver`."""
        return self.settings("solver")

    @property
    def scale(self) -> float:
        return float(self.lam if self.function == "sigmoid" else self.alpha)

    def fit(self, data: Ratings | ExplicitTriples) -> COE:
        """Fit on ratings (or co-occurrence counts) with triples drawn on the fly,
        or on an explicit triples file's :class:`ExplicitTriples` (drawn uniformly)."""
        self._validate_params()
        if isinstance(data, ExplicitTriples):
            return self.fit_explicit(data)
        values = normalise(data, self.source)
        triples = TripleSource.build(data.user, data.item, values, data.n_users, data.n_items, data.rating)
        return self.fit_triples(data, triples)

    def fit_triples(self, data: Ratings, triples: TripleSource) -> COE:
        """Fit from a prepared :class:`TripleSource` (the evaluation reuses one per split)."""
        self._validate_params()
        solver = self.solver_settings()
        self.users_, self.items_ = data.users, data.items
        self.n_type_a_, self.n_type_b_ = triples.n_type_a, triples.n_type_b
        p_unrated = float(self.unrated_share)
        if self.n_type_a_ + self.n_type_b_ == 0:
            if p_unrated == 0:
                raise ValueError("the data hold no triple: every user and item rates all its items alike")
            p_unrated = 1.0  # only rated-over-unrated triples exist
        unrated = self._unrated_arrays(
            triples, p_unrated, float(solver.unrated_power), float(solver.strength_power)
        )
        p_a = (
            self.n_type_a_ / (self.n_type_a_ + self.n_type_b_)
            if solver.type_a_share is None
            else float(solver.type_a_share)
        )
        rng = np.random.default_rng(self.random_state)
        X = rng.normal(0.0, self.init_std, (data.n_users, int(self.n_components)))
        Y = rng.normal(0.0, self.init_std, (data.n_items, int(self.n_components)))
        steps = int(solver.steps_per_epoch) or max(len(data), 1)
        total = steps * int(self.max_iter)
        lr_end = self.learning_rate * solver.learning_rate_final_ratio
        func = FUNCTIONS[self.function]
        arrays = triples.arrays(float(solver.group_power))
        self.log_likelihood_ = []
        with Progress("COE", self.max_iter, enabled=self.verbose) as bar:
            for epoch in range(int(self.max_iter)):
                # linear decay from learning_rate to learning_rate * learning_rate_final_ratio over all steps
                lr0 = self.learning_rate + (lr_end - self.learning_rate) * (epoch * steps / total)
                lr1 = self.learning_rate + (lr_end - self.learning_rate) * ((epoch + 1) * steps / total)
                ll = coe_kernels.sga_epoch(
                    X,
                    Y,
                    arrays,
                    steps,
                    p_a,
                    func,
                    self.scale,
                    float(self.reg),
                    lr0,
                    lr1,
                    int(self.random_state) * 1_000_003 + epoch,
                    p_unrated,
                    unrated,
                )
                check_finite(epoch, user_coords=X, item_coords=Y)
                self.log_likelihood_.append(float(ll))
                bar.update(1, lnP=ll)
        self.user_coords_ = X.astype(np.float32)
        self.item_coords_ = Y.astype(np.float32)
        self.steps_ = total
        self._seen = (data.user, data.item, data.rating)
        self._fingerprint = data.fingerprint()
        return self

    @staticmethod
    def _unrated_arrays(triples: TripleSource, p_unrated: float, power: float, strength_power: float):
        """The kernel's unrated-draw arrays, or typed placeholders when no step draws one."""
        if p_unrated == 0:
            return np.zeros(1), np.zeros(0, dtype=np.int32), np.zeros(1), np.zeros(0)
        user_cum, seen, item_cum = triples.unrated_arrays(power, strength_power)
        if user_cum[-1] == 0:
            raise ValueError("unrated_share > 0 needs a user with an unrated item of positive weight")
        return user_cum, seen, item_cum, triples.picked_cum(strength_power)

    def fit_explicit(self, triples: ExplicitTriples) -> COE:
        """Fit on given triples; each step draws one of them uniformly."""
        self._validate_params()
        if len(triples) == 0:
            raise ValueError("no triples to fit")
        self.users_, self.items_ = triples.users, triples.items
        self.n_type_a_ = int(np.count_nonzero(triples.kind == 0))
        self.n_type_b_ = len(triples) - self.n_type_a_
        rng = np.random.default_rng(self.random_state)
        X = rng.normal(0.0, self.init_std, (triples.n_users, int(self.n_components)))
        Y = rng.normal(0.0, self.init_std, (triples.n_items, int(self.n_components)))
        solver = self.solver_settings()
        steps = int(solver.steps_per_epoch) or len(triples)
        total = steps * int(self.max_iter)
        lr_end = self.learning_rate * solver.learning_rate_final_ratio
        self.log_likelihood_ = []
        with Progress("COE", self.max_iter, enabled=self.verbose) as bar:
            for epoch in range(int(self.max_iter)):
                lr0 = self.learning_rate + (lr_end - self.learning_rate) * (epoch * steps / total)
                lr1 = self.learning_rate + (lr_end - self.learning_rate) * ((epoch + 1) * steps / total)
                coe_kernels.sga_explicit(
                    X,
                    Y,
                    triples.kind,
                    triples.first,
                    triples.second,
                    triples.third,
                    steps,
                    FUNCTIONS[self.function],
                    self.scale,
                    float(self.reg),
                    lr0,
                    lr1,
                    int(self.random_state) * 1_000_003 + epoch,
                )
                check_finite(epoch, user_coords=X, item_coords=Y)
                bar.update(1)
        self.user_coords_ = X.astype(np.float32)
        self.item_coords_ = Y.astype(np.float32)
        self.steps_ = total
        user, item = triples.user_item_pairs()
        self._seen = (user, item, None)
        self._fingerprint = triples.fingerprint()
        return self

    # ------------------------------------------------------------- artifact
    def _recorded_params(self) -> dict:
        """The settings a manifest records, under the flat names a job table writes (the
        solver's fields among them; the service reads ``unrated_share``)."""
        params = {k: v for k, v in self.get_params().items() if k not in ("verbose", "solver")}
        return dict(params, **asdict(self.solver_settings()))

    def to_artifact(self) -> Artifact:
        """Arrays ``user_coords``, ``item_coords``, ``seen_indptr``, ``seen_indices``, ``seen_ratings``
        (when the ratings are known), ``item_popularity``."""
        if not hasattr(self, "user_coords_"):
            raise ValueError("fit the model before packing it")
        user, item, rating = self._seen
        n_users, n_items = len(self.users_), len(self.items_)
        order = np.lexsort((item, user))
        # The ratings, for the server's explanations (from the items a user liked), when known.
        ratings = {} if rating is None else {"seen_ratings": np.asarray(rating, dtype=np.float32)[order]}
        seen_indptr = np.zeros(n_users + 1, dtype=np.int64)
        np.cumsum(np.bincount(user, minlength=n_users), out=seen_indptr[1:])
        popularity = np.bincount(item, minlength=n_items).astype(np.float32)
        return Artifact(
            kind=self.kind,
            arrays={
                "user_coords": self.user_coords_,
                "item_coords": self.item_coords_,
                "seen_indptr": seen_indptr,
                "seen_indices": item[order].astype(np.int32),
                **ratings,
                "item_popularity": popularity,
            },
            ids={"users": self.users_, "items": self.items_},
            hyperparameters=self._recorded_params(),
            attributes={
                "type_a_triples": self.n_type_a_,
                "type_b_triples": self.n_type_b_,
                "steps": self.steps_,
            },
            data_fingerprint=self._fingerprint,
        )
