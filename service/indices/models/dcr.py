"""Serving index of DCR and Pairwise DCR (Hu & Li, WWW 2017).

The artifact holds, per user and per item, the per-level factors of the
``L = S - 1`` learned levels concatenated into one row: ``user_factors``
``(n_users, L * rank)`` and ``item_factors`` ``(n_items, L * rank)``. Its
attributes give ``levels`` (the ordered rating values), ``relevance``
("linear", "log" or "exp") and ``rank``.

The ranking score (Eq. 4 with Eq. 1) is

    SC_ui = f(l_1) + sum_{t=2..S} (f(l_t) - f(l_{t-1})) * (U_u^t . V_i^t + 1) / 2

which is affine in the per-level inner products. At load time the level
weights ``(f(l_t) - f(l_{t-1})) / 2`` are folded into the user side and the
constant goes into ``offset``, so one user's scores over all items are one
matrix-vector product (a batch of users one matrix product) and top-N is a
maximum-inner-product search followed by the shared numba top-k.

Both DCR and Pairwise DCR use this index (a refined model is usually
published under the name "pairwise_dcr"); the kind is "dcr" for both.

A version with an item index (``indexes["items"]``, published by the trainer
for catalogues of ``ann_min_items`` items or more) answers whole-catalogue
top-N from it (``service/indices/ann.py``); candidate lists, the per-item scores and
``distribution`` stay exact.
"""

from __future__ import annotations

import functools

import numpy as np

from ordrec.service.indices.models.base import Ranked, RecommenderIndex, check_finite
from ordrec.service.indices.models.capabilities import ItemSimilarity, RatingDistribution
from ordrec.service.indices.rules import Eligible
from ordrec.service.indices.topk import (
    COLUMN_MAJOR_MAX_SIZE,
    KERNEL_MAX_K,
    UserProduct,
    affine_rows,
    user_top_k,
)
from ordrec.service.storage.artifact import Artifact, ArtifactError
from ordrec.service.storage.mapped import row_blocks

RELEVANCE = ("linear", "log", "exp")
# Fold-in's pull toward the mean trained user, in ratings' worth: with a few ratings the
# directions they do not span keep the population's item effect instead of falling to 0.
FOLD_IN_PRIOR = 1.0
# A fresh item's pull toward the mean trained item over the whole user population, in ratings'
# worth: moving every user's score costs as much as this many ratings, so a few raters place the
# item along what sets them apart from other users, not along what all users share (popularity).
FRESH_ITEM_PRIOR = 20.0


def relevance_values(levels: np.ndarray, relevance: str) -> np.ndarray:
    """``f(l)`` for each ordered rating value ``l`` (Section 3.3.1).

    ``f`` is applied to the rating *values* (so with ``linear`` SC is the
    expected rating on the data's own scale, e.g. 0.5..5.0). ``log`` needs
    positive values.
    """
    levels = np.asarray(levels, dtype=np.float64)
    if relevance == "linear":
        return levels.copy()
    if relevance == "log":
        if np.any(levels <= 0):
            raise ValueError("relevance 'log' needs positive rating values")
        return np.log(levels)
    if relevance == "exp":
        return np.exp(levels)
    raise ValueError(f"unknown relevance {relevance!r} (known: {', '.join(RELEVANCE)})")


def level_weights(levels: np.ndarray, relevance: str) -> tuple[np.ndarray, float]:
    """Per-learned-level weights ``c_t = (f(l_t) - f(l_{t-1})) / 2`` and the constant.

    With them ``SC_ui = offset + sum_t c_t U_u^t . V_i^t`` where
    ``offset = f(l_1) + sum_t c_t``.
    """
    f = relevance_values(levels, relevance)
    c = np.diff(f) / 2.0
    return c, float(f[0] + c.sum())


def monotone_distribution(p_ge: np.ndarray) -> np.ndarray:
    """P(r = l) for each level from the learned ``P(r >= l_t)``, t = 2..S.

    Levels are fitted independently, so the learned ``P(r >= l_t)`` need not
    fall with ``t`` (and, on the ball boundary, may touch 0 or 1). We clip to
    [0, 1] and make the sequence non-increasing by averaging its running
    minimum (from the lowest level up) with its running maximum (from the top
    level down); both bounds are non-increasing, so their mean is, and it is
    the identity when the sequence already is monotone. Then (Eq. 3)
    ``P(r = l_t) = P(r >= l_t) - P(r >= l_{t+1})`` with ``P(r >= l_1) = 1``
    and ``P(r >= l_{S+1}) = 0``. Rows sum to 1 and are non-negative.
    """
    p = np.clip(p_ge, 0.0, 1.0)
    down = np.minimum.accumulate(p, axis=1)
    up = np.maximum.accumulate(p[:, ::-1], axis=1)[:, ::-1]
    mono = 0.5 * (down + up)
    m = p.shape[0]
    full = np.concatenate([np.ones((m, 1)), mono, np.zeros((m, 1))], axis=1)
    return (full[:, :-1] - full[:, 1:]).astype(np.float32)


class DCRIndex(RecommenderIndex):
    """Exact top-N by SC over all items (or given candidates)."""

    kind = "dcr"
    folds_in = True

    def __init__(self, artifact: Artifact):
        super().__init__(artifact)
        attrs = artifact.attributes
        try:
            self.levels = np.asarray(attrs["levels"], dtype=np.float64)
            self.relevance = str(attrs.get("relevance", "linear"))
            self.rank = int(attrs["rank"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{artifact.describe()}: bad or missing attribute ({exc})") from None
        # levels[0] is "not rated" in a top-N-aware version: scored, but not a rating to predict.
        self.unrated_level = bool(attrs.get("unrated_level", False))
        n_levels = self.levels.size - 1
        # Beside "not rated", one value (interactions of equal strength) is enough.
        if n_levels < 1 or np.any(np.diff(self.levels) <= 0):
            raise ArtifactError(f"{artifact.describe()}: levels must be >= 2 increasing values")
        try:
            c, offset = level_weights(self.levels, self.relevance)
        except ValueError as exc:
            raise ArtifactError(f"{artifact.describe()}: {exc}") from None
        width = n_levels * self.rank
        user = np.asarray(artifact.array("user_factors"), dtype=np.float32)
        item = np.asarray(artifact.array("item_factors"), dtype=np.float32)
        if user.shape != (len(self.users), width) or item.shape != (len(self.items), width):
            raise ArtifactError(
                f"{artifact.describe()}: factors {user.shape} / {item.shape} do not match"
                f" {len(self.users)} users, {len(self.items)} items, {n_levels} levels x rank {self.rank}"
            )
        self.n_levels = n_levels
        self.rating_levels = self.levels[1:] if self.unrated_level else self.levels
        # Interactions without a rating (NaN values) fold in as "picked" in a top-N-aware version.
        self.folds_in_picks = self.unrated_level
        self.weights = c
        self.offset = np.float32(offset)
        self._user_raw = user
        # The level weights fold into the user side, so scoring is a plain product. They are
        # folded per request rather than into a copy: at a million users a folded copy would
        # double the user factors' memory, for one row multiply a request.
        self._scale = np.repeat(c, self.rank).astype(np.float32)
        self._mean_user = _finite_column_mean("user_factors", user).reshape(n_levels, self.rank)
        self._frozen, self._radius = self._user_constraint(artifact)
        self.ann = self._open_ann(artifact, item)
        if self.ann is None:
            self._item = np.ascontiguousarray(item)
        else:
            self.search = self.ann.description
            # Exact scoring reads the float vectors the index re-scores with: a flat graph's own
            # copy (the version's file is then never paged in) or the version's file, mapped.
            self._item = self.ann.vectors()
        check_finite("item_factors", self._item)
        # Whole-catalogue scoring reads a column-major copy of a small catalogue's factors (a few
        # MB at most): the product then runs along items, about a quarter cheaper than along each
        # item's factors (docs/serving-cost.md). Every whole-catalogue score comes from it, so a
        # user's scores stay bitwise one user's, batched or alone.
        small = self.ann is None and self._item.size <= COLUMN_MAJOR_MAX_SIZE
        self._scored = np.asfortranarray(self._item) if small else self._item
        self._product = UserProduct(self._scored, self._user_raw, self._scale, self.offset)

    @property
    def item_factors(self) -> np.ndarray:
        """The item factors exact scoring reads, ``(n_items, levels x rank)`` float32."""
        return self._item

    @property
    def level_scale(self) -> np.ndarray:
        """Each factor column's level weight ``c_t`` (what the user side is multiplied by)."""
        return self._scale

    @functools.cached_property
    def root_level_scale(self) -> np.ndarray:
        """``sqrt(c_t)`` per factor column: item factors times it have the level-weighted inner
        product as their plain one (the cosine of diversity, ``service/indices/similar.py``)."""
        return np.sqrt(self._scale)

    def item_similarity(self) -> ItemSimilarity:
        """The level-weighted inner product of the item factors, searched through the item
        index where the version has one."""
        return ItemSimilarity(
            self._item, scale=self._scale, root_scale=self.root_level_scale, search=self.ann
        )

    def rating_distribution(self) -> RatingDistribution:
        return self

    @staticmethod
    def _open_ann(artifact: Artifact, item: np.ndarray):
        entry = artifact.indexes.get("items")
        if entry is None or entry.path is None:  # none, or an in-memory artifact not yet published
            return None
        from ordrec.service.indices.ann import AnnSearch  # imports faiss: only for versions that need it

        try:
            return AnnSearch.open(entry, item)
        except ArtifactError as exc:
            raise ArtifactError(f"{artifact.describe()}: {exc}") from None

    @staticmethod
    def _user_constraint(artifact: Artifact) -> tuple[int, float]:
        """Frozen leading user coordinates and the radius of the rest (the ``item_bias``
        research option freezes the first at ``s``, the rest in the ball of ``sqrt(1 - s^2)``)."""
        research = artifact.hyperparameters.get("research") or {}
        bias = float(research.get("item_bias", 0.0) or 0.0) if isinstance(research, dict) else 0.0
        return (1, float(np.sqrt(max(1.0 - bias * bias, 0.0)))) if bias > 0 else (0, 1.0)

    def fold_in(self, item_rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Raw user factors fitted to one user's ratings with the item factors fixed.

        Level ``t``'s target for ``u^t . v_i^t`` is ``2 [r_i >= l_t] - 1`` (since
        ``P(r >= l_t) = (u.v + 1) / 2``): a ridge regression per level toward the mean
        trained user (``FOLD_IN_PRIOR``), then the model's bound ``|u^t| <= 1``. In a
        top-N-aware version a NaN value is an interaction without a rating: "picked", a
        target of the "not rated" level only (see :attr:`folds_in_picks`).
        """
        rows = np.asarray(item_rows, dtype=np.int64)
        target, known = self._level_targets(np.asarray(values, dtype=np.float64))
        u = self._fold_levels(self._item[rows], target, known, self._mean_user, self._frozen, self._radius)
        return u.reshape(-1).astype(np.float32)

    def fold_in_item(self, user_rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Item factors of an item the version has not seen, from known users' ratings of it
        with the user factors fixed: :meth:`fold_in`'s mirror, with two differences that keep
        the item to its own audience. Each rating is read against the rater's own ratings
        (:meth:`relative_ratings`: above what they usually give pulls the item toward them,
        below pushes it away), and the regression toward the mean trained item also weighs
        how much the fit moves every user's score (``FRESH_ITEM_PRIOR`` ratings' worth of the
        population), so the raters' shared taste for popular items does not make it popular."""
        rows = np.asarray(user_rows, dtype=np.int64)
        target, known = self._level_targets(self.relative_ratings(rows, values))
        population = FRESH_ITEM_PRIOR * self.user_second_moment
        v = self._fold_levels(self._user_raw[rows], target, known, self.mean_item, 0, 1.0, population)
        return v.reshape(-1).astype(np.float32)

    def place_like_items(self, item_rows: np.ndarray) -> np.ndarray:
        """The mean of the items' factors: its products with every user are the items' mean, so
        its audience is theirs."""
        rows = np.asarray(item_rows, dtype=np.int64)
        return self._item[rows].astype(np.float64).mean(axis=0).astype(np.float32)

    @functools.cached_property
    def mean_item(self) -> np.ndarray:
        """The mean trained item's per-level factors, ``(levels, rank)`` float64 (fold-in's prior)."""
        return _finite_column_mean("item_factors", self._item).reshape(self.n_levels, self.rank)

    @functools.cached_property
    def user_second_moment(self) -> np.ndarray:
        """Per level, the trained users' mean ``u u^T``, ``(levels, rank, rank)`` float64: ``d^T M d``
        is the mean squared change of a user's level product when an item moves by ``d``."""
        L, f = self.n_levels, self.rank
        total = np.zeros((L, f, f), dtype=np.float64)
        for block in row_blocks(self._user_raw):
            u = block.reshape(-1, L, f).astype(np.float64).transpose(1, 0, 2)  # (levels, users, rank)
            total += u.transpose(0, 2, 1) @ u
        return total / max(1, len(self._user_raw))

    def _level_targets(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per rating and learned level, the target of ``u^t . v^t`` and whether it is known:
        ``2 [r >= l_t] - 1``, linear from -1 at ``l_{t-1}`` to +1 at ``l_t`` for a value between
        (a rating read relative to its rater); a NaN value is a pick, a known target (+1) of
        the "not rated" level only."""
        rated = np.isfinite(values)
        value = np.where(rated, values, self.levels[-1])[:, None]
        reached = np.clip((value - self.levels[None, :-1]) / np.diff(self.levels)[None, :], 0.0, 1.0)
        known = np.repeat(rated[:, None], self.n_levels, axis=1)
        known[:, 0] |= self.unrated_level
        return 2.0 * reached - 1.0, known

    def _fold_levels(
        self,
        other: np.ndarray,
        target: np.ndarray,
        known: np.ndarray,
        mean: np.ndarray,
        frozen: int,
        radius: float,
        penalty: np.ndarray | None = None,
    ) -> np.ndarray:
        """Per-level factors ``(levels, rank)`` fitted to ``target`` (one row per rating, where
        ``known``) against the fixed factors ``other`` of the other side: a ridge regression
        toward ``mean`` (plus ``penalty``, a per-level quadratic form on the move), the first
        ``frozen`` coordinates kept, the rest bounded by ``radius``."""
        L, f, k = self.n_levels, self.rank, frozen
        # Level-major (L, f, m) so the per-level products are batched matrix products.
        v = other.reshape(-1, L, f).transpose(1, 2, 0)
        v = v.astype(np.float64) * known.T[:, None, :]  # an unknown target adds nothing
        residual = (target.T - (mean[:, None, :] @ v)[:, 0, :]) * known.T  # (L, m)
        free = v[:, k:, :]
        gram = free @ free.transpose(0, 2, 1) + FOLD_IN_PRIOR * np.eye(f - k)
        if penalty is not None:
            gram += penalty[:, k:, k:]
        fitted = mean.copy()
        fitted[:, k:] += np.linalg.solve(gram, free @ residual[..., None])[..., 0]
        norms = np.linalg.norm(fitted[:, k:], axis=1, keepdims=True)
        fitted[:, k:] *= np.minimum(1.0, radius / np.maximum(norms, 1e-12))
        return fitted

    def score_factors(self, vector: np.ndarray, item_factors: np.ndarray) -> np.ndarray:
        """Scores of items given by their factors (fresh items, ``service/live/fresh.py``) for raw
        user factors: the formula of :meth:`score_vector`."""
        scores = np.asarray(item_factors, dtype=np.float32) @ (vector * self._scale)
        return (scores + self.offset).astype(np.float32)

    def user_vector(self, user_row: int) -> np.ndarray:
        """A trained user's raw factors (what :meth:`fold_in` gives a new user)."""
        return self._user_raw[int(user_row)]

    def folded(self, user_rows: np.ndarray | list[int]) -> np.ndarray:
        """User factors with the level weights folded in, shape ``(len(user_rows), width)``."""
        return self._user_raw[np.asarray(user_rows, dtype=np.int64)] * self._scale

    # ------------------------------------------------------------ scoring
    def score_users(self, user_rows: np.ndarray) -> np.ndarray:
        # One kernel for one user or a batch, so a batched call scores exactly as a lone one.
        return affine_rows(self._scored, self.folded(user_rows), self.offset)

    def score_items(self, user_row: int, item_rows: np.ndarray) -> np.ndarray:
        return self.score_vector(self._user_raw[int(user_row)], item_rows)

    def score_vector(self, vector: np.ndarray, item_rows: np.ndarray | None = None) -> np.ndarray:
        """Scores for raw user factors (a row of ``user_factors`` or a :meth:`fold_in`)."""
        folded = vector * self._scale
        if item_rows is None:
            # one pass holding the GIL when short (service/indices/topk.py), as for a row of the user factors
            return affine_rows(self._scored, folded.reshape(1, -1), self.offset)[0]
        scores = self._item[np.asarray(item_rows, dtype=np.int64)] @ folded
        scores += self.offset
        return scores

    # ---------------------------------------------------- approximate top-N
    def recommend(
        self,
        user_row: int,
        n: int,
        *,
        exclude: np.ndarray | None = None,
        candidates: np.ndarray | None = None,
        eligible: Eligible | None = None,
    ) -> Ranked:
        if not self._graph_answers(candidates, eligible):
            return self._recommend_scored(user_row, n, exclude, candidates, eligible)
        found = self._graph_search(self._user_raw[int(user_row)], n, exclude, eligible)
        if found is None:  # too many exclusions for the graph: score every item
            return self.recommend_exact(user_row, n, exclude=exclude, eligible=eligible)
        return found

    def _search_vector(self, vector, n, exclude, candidates, eligible) -> Ranked | None:
        if not self._graph_answers(candidates, eligible):
            return None
        return self._graph_search(vector, n, exclude, eligible)

    def _graph_search(
        self, vector: np.ndarray, n: int, exclude: np.ndarray | None, eligible: Eligible | None
    ) -> Ranked | None:
        """The item index's top-n for raw user factors; None when there are too many
        exclusions for the graph."""
        found = self.ann.search(vector * self._scale, n, exclude, eligible)
        if found is None:
            return None
        rows, products = found
        return rows, products + self.offset

    def recommend_many(
        self,
        user_rows: np.ndarray,
        n: int,
        *,
        excludes: list[np.ndarray | None],
        candidates: np.ndarray | None = None,
        eligible: Eligible | None = None,
    ) -> list[Ranked]:
        if len(user_rows) == 1:  # the usual call: one user, one fused kernel on the exact path
            return [
                self.recommend(
                    int(user_rows[0]), n, exclude=excludes[0], candidates=candidates, eligible=eligible
                )
            ]
        if not self._graph_answers(candidates, eligible):
            return super().recommend_many(
                user_rows, n, excludes=excludes, candidates=candidates, eligible=eligible
            )
        # One graph search per user: each has its own exclusions, which faiss takes per call.
        return [
            self.recommend(int(u), n, exclude=ex, eligible=eligible) for u, ex in zip(user_rows, excludes)
        ]

    def scoring_work(self) -> int:
        # The item index answers each user with a search of its own.
        return 0 if self.ann is not None else int(self._item.size)

    def _shares_pass(self, eligible: Eligible | None) -> bool:
        # The item index answers each user with a search of its own (faiss takes exclusions per
        # search).
        return self.ann is None and super()._shares_pass(eligible)

    def _graph_answers(self, candidates: np.ndarray | None, eligible: Eligible | None) -> bool:
        """Whether the item index answers: not for candidate lists, and not when the rules leave
        few items (scoring just those is cheaper than a graph walk that skips the rest)."""
        return self.ann is not None and candidates is None and (eligible is None or not eligible.sparse)

    def recommend_exact(
        self, user_row: int, n: int, *, exclude: np.ndarray | None = None, eligible: Eligible | None = None
    ) -> Ranked:
        """Top-N by scoring every item (what the index approximates)."""
        return self._recommend_scored(user_row, n, exclude, None, eligible)

    def lone_user_product(self, n: int, eligible: Eligible | None) -> UserProduct | None:
        # The exact whole-catalogue path of one user, where recommend() runs topk.user_top_k.
        if self.ann is not None or not self._fuses(n, None, eligible):
            return None
        return self._product

    def _fuses(self, n: int, candidates: np.ndarray | None, eligible: Eligible | None) -> bool:
        """Whether one user's exact answer is one ``topk.user_top_k`` call."""
        return candidates is None and 0 < n <= KERNEL_MAX_K and (eligible is None or not eligible.sparse)

    def _recommend_scored(
        self,
        user_row: int,
        n: int,
        exclude: np.ndarray | None,
        candidates: np.ndarray | None,
        eligible: Eligible | None,
    ) -> Ranked:
        """Exact top-N for one user: over the whole catalogue in one fused kernel (scale,
        product, exclusions, selection: ``topk.user_top_k``), else the shared path."""
        if self._fuses(n, candidates, eligible):
            blocked = None if eligible is None else eligible.blocked
            return user_top_k(
                self._scored, self._user_raw, int(user_row), self._scale, self.offset, n, exclude, blocked
            )
        return super().recommend(user_row, n, exclude=exclude, candidates=candidates, eligible=eligible)

    def level_probabilities(self, user_row: int, item_rows: np.ndarray) -> np.ndarray:
        """The learned ``P(r >= l_t)`` for t = 2..S of the rating values, shape
        ``(len(item_rows), S - 1)``, unclipped; given a rating in a top-N-aware version."""
        return self._level_probabilities(self._user_raw[int(user_row)], item_rows)

    def _level_probabilities(self, vector: np.ndarray, item_rows: np.ndarray) -> np.ndarray:
        return self._level_probabilities_of(vector, self._item[np.asarray(item_rows, dtype=np.int64)])

    def _level_probabilities_of(self, vector: np.ndarray, item_factors: np.ndarray) -> np.ndarray:
        u = vector.reshape(self.n_levels, self.rank)
        v = np.asarray(item_factors).reshape(-1, self.n_levels, self.rank)
        p = 0.5 * (np.einsum("mlk,lk->ml", v, u) + 1.0)
        if not self.unrated_level:
            return p
        # P(r >= l | rated) = P(r >= l) / P(rated): levels >= l are inside "rated".
        return p[:, 1:] / np.clip(p[:, :1], 1e-6, None)

    def distribution(self, user_row: int, item_rows: np.ndarray) -> np.ndarray:
        """``P(r = l)`` for every level, shape ``(len(item_rows), S)`` (see ``monotone_distribution``)."""
        return monotone_distribution(self.level_probabilities(user_row, item_rows))

    def distribution_for(self, vector: np.ndarray, item_rows: np.ndarray) -> np.ndarray:
        """:meth:`distribution` for raw user factors (a :meth:`fold_in`)."""
        return monotone_distribution(self._level_probabilities(vector, item_rows))

    def distribution_of_factors(self, vector: np.ndarray, item_factors: np.ndarray) -> np.ndarray:
        """:meth:`distribution_for` of items given by their factors (fresh items)."""
        return monotone_distribution(self._level_probabilities_of(vector, item_factors))

    def smoke(self) -> None:
        super().smoke()
        dist = self.distribution(0, np.arange(min(3, len(self.items))))
        if not (np.all(np.isfinite(dist)) and np.allclose(dist.sum(axis=1), 1.0, atol=1e-4)):
            raise ArtifactError(f"{self.artifact.describe()}: smoke distribution is not a distribution")


def _finite_column_mean(name: str, array: np.ndarray) -> np.ndarray:
    """The mean row (float64; zeros when there are none), failing on any NaN or infinity: one
    pass in blocks read from the file (:func:`row_blocks`), so a server's load leaves the user
    factors unmapped until requests need them."""
    total = np.zeros(array.shape[1], dtype=np.float64)
    for block in row_blocks(array):
        check_finite(name, block)
        total += block.sum(axis=0, dtype=np.float64)
    return total / max(1, len(array))
