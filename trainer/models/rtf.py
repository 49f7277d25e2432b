"""RTF: Ranking with Tensor Factorization for tag recommendation.

Rendle, Balby Marinho, Nanopoulos, Schmidt-Thieme, "Learning Optimal Ranking
with Tensor Factorization for Tag Recommendation", KDD 2009
(``/work/shared/papers/rtf-rendle-kdd2009.txt``; the working form is
``docs/algorithms.md`` section 2, whose equations we follow because the
paper's text is garbled; ``tests/test_rtf.py`` checks the gradient of the
whole objective by finite differences).

- Model (Eq. 3-4): a Tucker decomposition, core ``C`` (kU x kI x kT) and
  factor matrices ``U``, ``I``, ``T``; ``y(u,i,t) = C x1 U[u] x2 I[i] x3 T[t]``.
- Data interpretation (Section 3.2, "post-based ranking"): only observed posts
  (u, i) carry information; inside a post its tags rank above all other tags;
  unobserved posts are missing values, never negatives.
- Criterion (Eq. 7-8): per post, the smoothed AUC over (t+, t-) pairs, minus
  L2 terms with separate weights for the core (``reg_core``) and the factors
  (``reg``).
- Learning (Fig. 5, Section 4.4.2): stochastic gradient ascent, one step per
  post, with the fast gradient through ``q`` and ``v``
  (``trainer.models.rtf_kernels``).

Serving uses ``service.indices.models.rtf.RTFIndex`` on the artifact this writes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from scipy.stats import rankdata

from ordrec.service.indices.models.rtf import RTFIndex, score_posts
from ordrec.service.storage.artifact import Artifact
from ordrec.trainer.data.types import DataError, TagAssignments
from ordrec.trainer.models import rtf_kernels as K
from ordrec.trainer.models.base import Estimator, Interval, Options, check_finite
from ordrec.trainer.models.ranking import per_list_f1
from ordrec.trainer.models.rtf_selection import (
    MAX_N,
    HeldOutPosts,
    best_mix_weight,
    group_posts,
    popularity_lists,
    served_lists,
    validation_carve,
)
from ordrec.trainer.progress import Progress

# Beyond one post per user, the stopping set may take at most this share of
# all posts (Last.fm 10-core: 1,200 of ~32,000 training posts is 3.7%).
EXTRA_VALIDATION_SHARE = 0.05


def _csr_top_lists(owner: np.ndarray, tag: np.ndarray, n_owners: int, n_tags: int, top: int):
    """Per owner (user or item), its tags by number of posts, most used first, at most ``top``.

    ``owner`` and ``tag`` are one entry per (post, tag). Ties go to the lower
    tag row so lists are deterministic.
    """
    key = owner.astype(np.int64) * n_tags + tag.astype(np.int64)
    uniq, counts = np.unique(key, return_counts=True)
    own, tg = uniq // n_tags, uniq % n_tags
    order = np.lexsort((tg, -counts, own))
    own, tg, counts = own[order], tg[order], counts[order]
    # rank of each entry inside its owner's list, to truncate at ``top``
    first = np.searchsorted(own, own, side="left")
    keep = (np.arange(own.size) - first) < top
    own, tg, counts = own[keep], tg[keep], counts[keep]
    indptr = np.zeros(n_owners + 1, dtype=np.int64)
    np.add.at(indptr, own + 1, 1)
    return np.cumsum(indptr), tg.astype(np.int32), counts.astype(np.float32)


def _encode_names(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Tag display names as UTF-8 bytes plus offsets (arrays only, no object dtype)."""
    encoded = [name.encode("utf-8") for name in names]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in encoded])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets


class RTF(Estimator):
    """Tucker-model tag recommender trained for per-post ranking.

    Parameters
    ----------
    n_components : int or sequence of 3 ints, default 64
        ``(kU, kI, kT)``; one int means the same for all three (the paper's
        "RTF 8" ... "RTF 64").
    learning_rate : float, default 0.5
        Step size ``alpha`` of Fig. 5. The paper used 0.1 on Last.fm with
        600 passes, more than a shared 2-core machine can afford. On a
        validation split of the HetRec Last.fm 10-core *training* posts
        (never the test set; ``docs/changelog.md``, RTF), RTF-64 at 0.5 reached a higher
        validation AUC and F1 than at 1.0 (which over-fits within ~15 passes)
        in at most 60 passes; 2.0 and 5.0 collapse into saturated sigmoids.
    learning_rate_decay : float, default 0.0
        Pass ``e`` (from 1) steps with ``learning_rate / (1 + learning_rate_decay (e - 1))``;
        0 keeps the rate constant (the paper's Fig. 5).
    reg, reg_core : float
        ``gamma`` (factors) and ``gamma_C`` (core) of Eq. 8 (paper: 1e-6 on
        Last.fm, 1e-5 on BibSonomy, for all of U, I, T and C). The defaults
        (1e-3 on U and I, 0 on C and T) won on a validation split of the
        Last.fm 10-core *training* posts (``docs/changelog.md``, RTF): every post shrinks
        all tag rows and the core, so any gamma there that keeps U and I in
        check flattens the tag scores and costs top-N precision.
    reg_tags : float or None
        ``gamma_T``, the L2 weight of the tag factors; None means ``reg`` (the
        paper's single factor weight). Every post shrinks every tag row, so
        on the same scale this acts about |posts| / |posts per user| times
        harder than ``reg`` does on a user row.
    max_iter : int, default 100
        Maximum passes over the posts (paper: 600 on Last.fm).
    init_std : float
        Standard deviation of the normal initialisation of every parameter.
    validation_posts : int
        Hold out up to this many training posts (one per user with at least
        two posts, then further rounds, never a user's last post, at most 5%
        of the posts beyond the first round) to stop early on a plateau of
        their AUC; 0 trains on everything for ``max_iter`` passes. 1,200
        (2 per user on the Last.fm 10-core) gave a smooth criterion on
        tuning curves where 500 moved by ~1e-3 a pass (``docs/changelog.md``, RTF).
    patience : int
        Stop after this many passes without a gain of the (smoothed)
        validation AUC of more than ``val_tol``; the best parameters seen
        are kept.
    min_iter : int, default 10
        Never stop early before this many passes: from a small random start
        the validation AUC sits near 0.5 for a few passes (the gradient of a
        three-way product is cubic in the initial scale), which is no plateau.
    val_tol : float, default 1e-4
        The least gain of the validation AUC (absolute) that counts; DCR's
        ``val_tol`` is the same threshold on its validation likelihood.
    keep_within : float or None
        Which pass of the plateau to keep. None (the default): the pass where
        the criterion last gained ``val_tol`` (the first pass of the
        plateau). A number ``eps``: the *latest* pass whose criterion is
        within ``eps`` of the highest seen. The validation AUC cannot tell the
        passes of a plateau apart, while the top of the lists keeps
        sharpening along it (F1@N rose for 60+ passes after the AUC peak on
        tuning curves, ``docs/changelog.md``, RTF), so the latest is the better tie-break.
    learning_rate_drops : int, default 0
        Plateau learning-rate drops before stopping: when ``patience`` runs
        out and drops remain, the parameters of the best pass are restored,
        the learning rate is multiplied by ``learning_rate_drop_factor`` and training
        goes on; the next plateau (at the last rate) stops. 0 (the default)
        stops at the first plateau. A constant rate keeps SGD noisy around
        the validation-AUC peak; a smaller rate from the peak refines it.
    learning_rate_drop_factor : float, default 0.5
        Multiplier of the learning rate at each plateau drop, in (0, 1).
    smoothing : int
        Stop on the moving average of the last ``smoothing`` validation AUCs
        instead of the raw value (1: the raw value). The AUC of a few hundred
        held-out posts moves by ~1e-3 from pass to pass at a constant learning
        rate, so a raw plateau can come long before the model has converged;
        the parameters kept are those of the pass where the smoothed value
        peaked. ``reproduce`` uses 8 (chosen on tuning curves of validation
        posts, ``docs/changelog.md``, RTF); the default stays 1 because from a small
        random start the AUC can sit at chance for 10+ passes (small data,
        small dims), where an average stops rising and patience runs out
        before learning starts.
    grid_validation : bool, default False
        Choose ``n_components`` and ``reg`` on validation posts instead of
        taking them as given, and keep RTF only where it clearly beats the
        popularity mix. One post of every user is carved out of the
        training posts (``rtf_selection.validation_carve``, the carve of the
        protocol's ``pop-mix-val``); every candidate of ``grid_n_components``
        x ``grid_reg`` is fitted on the rest (with this estimator's other
        settings, its own early stopping included) and scored on the carved
        posts through the serving index, by F1@1..10 averaged over N (each
        post's F1 on its own). ``pop-mix`` is scored on the same posts at its
        item weight chosen there (``best_mix_weight``). The best candidate is
        refitted on all the posts only if its gain over ``pop-mix`` exceeds
        ``grid_margin + grid_confidence * SE`` (SE: the standard error of the
        paired per-post gain); otherwise the artifact serves ``pop-mix`` at
        the chosen weight (``RTFIndex`` answers Tags with it) and no RTF is
        refitted. A hard choice rather than a blend: both sides are models
        the index already serves, and a blend would need a weight on a
        score scale that differs between fits. ``grid_kept_`` records the
        decision, ``grid_val_f1_`` the two validation figures and the SE,
        ``grid_scores_`` every candidate, ``mix_weight_`` the weight.
        ``n_components`` and ``reg`` are then ignored.
    grid_n_components : sequence of int, default (16, 64)
        Candidate dims (each the same for U, I, T): a small and the
        largest of the paper's, since which wins depends on the data
        (RTF-16 lost to pop-mix on a small held-out set where RTF-64 tied).
    grid_reg : sequence of float, default (1e-4, 1e-3)
        Candidate ``reg`` (L2 on U and I): the default and a tenth of it.
    grid_margin : float, default 0.0
        The validation gain over ``pop-mix`` RTF must exceed to be served.
    grid_confidence : float, default 2.0
        Standard errors of the gain it must exceed besides: the best of
        several candidates is chosen on the same posts, and a gain within
        the noise of ~600 posts is not taken as one.
    popular_top : int
        Length of the per-user and per-item popular-tag lists shipped for
        cold start.
    dtype : str
        "float32" (fast, the default) or "float64" (for tests).
    random_state : int, default 0
        Seeds the initialisation, the validation hold-out and the SGD order.
    verbose : bool, default True
        Progress bar with training and validation AUC on stderr.
    """

    kind = "rtf"
    input_shape = "tags"

    _parameter_constraints: ClassVar[dict[str, list]] = {
        "n_components": [Interval(Integral, 1, None), list, tuple, str],
        "learning_rate": [Interval(Real, 0, None, closed="neither")],
        "learning_rate_decay": [Interval(Real, 0, None)],
        "reg": [Interval(Real, 0, None)],
        "reg_core": [Interval(Real, 0, None)],
        "reg_tags": [None, Interval(Real, 0, None)],
        "max_iter": [Interval(Integral, 1, None)],
        "init_std": [Interval(Real, 0, None)],
        "validation_posts": [Interval(Integral, 0, None)],
        "patience": [Interval(Integral, 0, None)],
        "min_iter": [Interval(Integral, 0, None)],
        "val_tol": [Interval(Real, None, None)],
        "smoothing": [Interval(Integral, 1, None)],
        "keep_within": [None, Interval(Real, 0, None)],
        "learning_rate_drops": [Interval(Integral, 0, None)],
        "learning_rate_drop_factor": [Interval(Real, 0, 1, closed="neither")],
        "grid_validation": ["boolean"],
        "grid_n_components": [list, tuple],
        "grid_reg": [list, tuple],
        "grid_margin": [Interval(Real, None, None)],
        "grid_confidence": [Interval(Real, 0, None)],
        "popular_top": [Interval(Integral, 0, None)],
        "dtype": [Options(str, {"float32", "float64"})],
        "random_state": [Interval(Integral, 0, None)],
        "verbose": ["boolean"],
    }

    def __init__(
        self,
        *,
        n_components: Any = 64,
        learning_rate: float = 0.5,
        learning_rate_decay: float = 0.0,
        reg: float = 1e-3,
        reg_core: float = 0.0,
        reg_tags: float | None = 0.0,
        max_iter: int = 100,
        init_std: float = 0.1,
        validation_posts: int = 1200,
        patience: int = 5,
        min_iter: int = 10,
        val_tol: float = 1e-4,
        smoothing: int = 1,
        keep_within: float | None = None,
        learning_rate_drops: int = 0,
        learning_rate_drop_factor: float = 0.5,
        grid_validation: bool = False,
        grid_n_components: tuple[int, ...] = (16, 64),
        grid_reg: tuple[float, ...] = (1e-4, 1e-3),
        grid_margin: float = 0.0,
        grid_confidence: float = 2.0,
        popular_top: int = 200,
        dtype: str = "float32",
        random_state: int = 0,
        verbose: bool = True,
    ):
        self.n_components = n_components
        self.learning_rate = learning_rate
        self.learning_rate_decay = learning_rate_decay
        self.reg = reg
        self.reg_core = reg_core
        self.reg_tags = reg_tags
        self.max_iter = max_iter
        self.init_std = init_std
        self.validation_posts = validation_posts
        self.patience = patience
        self.min_iter = min_iter
        self.val_tol = val_tol
        self.smoothing = smoothing
        self.keep_within = keep_within
        self.learning_rate_drops = learning_rate_drops
        self.learning_rate_drop_factor = learning_rate_drop_factor
        self.grid_validation = grid_validation
        self.grid_n_components = grid_n_components
        self.grid_reg = grid_reg
        self.grid_margin = grid_margin
        self.grid_confidence = grid_confidence
        self.popular_top = popular_top
        self.dtype = dtype
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------- helpers
    def _dims(self) -> tuple[int, int, int]:
        dims = self.n_components
        if isinstance(dims, str):
            dims = [int(x) for x in dims.split(",")]
        if np.isscalar(dims):
            dims = [int(dims)] * 3
        dims = tuple(int(x) for x in dims)
        if len(dims) != 3 or min(dims) < 1:
            raise ValueError(
                f"n_components must be a positive int or three positive ints, got {self.n_components!r}"
            )
        return dims

    def _reg_tags(self) -> float:
        return float(self.reg if self.reg_tags is None else self.reg_tags)

    def _validate_params(self) -> None:
        super()._validate_params()
        self._dims()  # an int, or three positive ints (a list, a tuple or "kU,kI,kT")
        if self.grid_validation:
            dims, regs = list(self.grid_n_components), list(self.grid_reg)
            if not dims or not all(
                isinstance(d, Integral) and not isinstance(d, bool) and d >= 1 for d in dims
            ):
                raise ValueError(f"grid_n_components must be positive ints, got {self.grid_n_components!r}")
            if not regs or not all(isinstance(r, Real) and np.isfinite(r) and r >= 0 for r in regs):
                raise ValueError(f"grid_reg must be non-negative numbers, got {self.grid_reg!r}")

    @staticmethod
    def _split_validation(post_user: np.ndarray, n_val: int, rng: np.random.Generator) -> np.ndarray:
        """Boolean mask of validation posts: one random post of up to ``n_val``
        random users who have at least two posts (so no user loses all).

        When ``n_val`` exceeds the number of such users, further rounds take a
        second, third, ... random post of random users, always leaving every
        user at least one training post: a larger validation set makes the
        stopping criterion less noisy without emptying anyone's history.
        Those further rounds stop at ``EXTRA_VALIDATION_SHARE`` of all posts,
        so on a small data set the default does not eat the training set.
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

    @staticmethod
    def posts_auc(scores: np.ndarray, tag_indptr: np.ndarray, tags: np.ndarray) -> np.ndarray:
        """Per post, the exact AUC of its score vector: the fraction of (t+, t-)
        pairs ranked correctly, ties counting one half (paper Eq. 6)."""
        out = np.full(scores.shape[0], np.nan)
        n_tags = scores.shape[1]
        # average ranks count ties as one half (Mann-Whitney U)
        ranks = rankdata(scores, axis=1) if scores.size else scores
        for p in range(scores.shape[0]):
            pos = tags[tag_indptr[p] : tag_indptr[p + 1]]
            n_pos, n_neg = pos.size, n_tags - pos.size
            if n_pos == 0 or n_neg == 0:
                continue
            u_stat = ranks[p, pos].sum() - n_pos * (n_pos + 1) / 2.0
            out[p] = u_stat / (n_pos * n_neg)
        return out

    def _scores(self, post_user: np.ndarray, post_item: np.ndarray) -> np.ndarray:
        """Tag scores of the given posts from the current parameters, by the
        serving code's batched fast path (``T @ q``)."""
        return score_posts(
            self.core_, self.user_factors_[post_user], self.item_factors_[post_item], self.tag_factors_
        )

    # ---------------------------------------------------------------- fit
    def fit(self, data: TagAssignments, on_epoch: Callable[[int, RTF, dict], None] | None = None) -> RTF:
        """Learn ``C, U, I, T`` by per-post stochastic gradient ascent (Fig. 5).

        Parameters
        ----------
        data : TagAssignments
            (user, item, tag) triples; users, items and tags without any
            triple are dropped (they would keep their random initialisation).
        on_epoch : callable, optional
            Called as ``on_epoch(epoch, self, record)`` after every pass, with
            the current parameters in ``core_``, ``user_factors_``, ...
            (live arrays: copy what you keep) and the ids in ``users_``,
            ``items_``, ``tags_``. For tuning curves (``benchmarks/tune_rtf.py``);
            training does not depend on it. With ``grid_validation``, only
            the refit on all the posts calls it.
        """
        self._validate_params()
        if not isinstance(data, TagAssignments):
            raise TypeError(f"RTF needs TagAssignments, got {type(data).__name__}")
        if len(data) == 0:
            raise DataError(data.source, None, "no tag assignments to train on")
        data = data.compact()
        if len(data.tags) < 2:
            raise DataError(data.source, None, "need at least two distinct tags to rank")
        if self.grid_validation:
            return self._fit_on_validation(data, on_epoch)
        return self._fit_factors(data, on_epoch)

    # ------------------------------------------------------ grid validation
    def _candidate(self, n_components: int, reg: float) -> RTF:
        """An unfitted RTF with this one's settings at one grid point."""
        return RTF(
            **dict(self.get_params(), n_components=int(n_components), reg=float(reg), grid_validation=False)
        )

    def _fit_on_validation(self, data: TagAssignments, on_epoch) -> RTF:
        """``grid_validation``: choose on carved posts, then refit the winner on all the
        posts, or serve ``pop-mix`` when no candidate clearly beats it."""
        candidates, popmix = self._score_grid(data)
        best = max(candidates, key=lambda c: c["val_f1"])  # ties: the first in grid order
        gain = best.pop("per_post") - popmix
        for other in candidates:
            other.pop("per_post", None)
        se = float(np.std(gain, ddof=1) / np.sqrt(gain.size)) if gain.size > 1 else float("inf")
        self.grid_scores_ = candidates
        self.grid_val_f1_ = (best["val_f1"], float(popmix.mean()), se)
        self.grid_kept_ = bool(gain.mean() > float(self.grid_margin) + float(self.grid_confidence) * se)
        self.chosen_params_ = {"n_components": best["n_components"], "reg": best["reg"]}
        if not self.grid_kept_:
            self._keep_popularity_only(data)
            return self
        fitted = self._candidate(best["n_components"], best["reg"])._fit_factors(data, on_epoch)
        self.__dict__.update({k: v for k, v in vars(fitted).items() if k.endswith("_")})
        return self

    def _score_grid(self, data: TagAssignments) -> tuple[list[dict], np.ndarray]:
        """Every candidate fitted on the carved training data and scored on the carved posts
        (per-post F1 averaged over N = 1..10), and ``pop-mix`` at its best weight there."""
        data, fit_part, held = validation_carve(data, int(self.random_state))
        candidates: list[dict] = []
        for dims, reg in itertools.product(self.grid_n_components, self.grid_reg):
            est = self._candidate(dims, reg).fit(fit_part)
            index = RTFIndex.from_artifact(est.to_artifact())
            posts = HeldOutPosts(data, held, index)  # every candidate has fit_part's id maps
            per_post = per_list_f1(served_lists(index, posts), posts.truth, MAX_N).mean(axis=1)
            candidates.append(
                {
                    "n_components": int(dims),
                    "reg": float(reg),
                    "val_f1": float(per_post.mean()),
                    "best_epoch": int(est.best_epoch_),
                    "per_post": per_post,
                }
            )
        self.mix_weight_ = best_mix_weight(index, posts)
        mix_lists = popularity_lists(index, posts, "pop-mix", self.mix_weight_)
        return candidates, per_list_f1(mix_lists, posts.truth, MAX_N).mean(axis=1)

    def _keep_popularity_only(self, data: TagAssignments) -> None:
        """The fallback: no factors worth serving; a 1 x 1 x 1 zero model keeps the artifact's
        shape, and ``serves`` tells the index to answer with ``pop-mix``."""
        self.core_ = np.zeros((1, 1, 1), dtype=np.float32)
        self.user_factors_ = np.zeros((len(data.users), 1), dtype=np.float32)
        self.item_factors_ = np.zeros((len(data.items), 1), dtype=np.float32)
        self.tag_factors_ = np.zeros((len(data.tags), 1), dtype=np.float32)
        self.users_, self.items_, self.tags_ = data.users, data.items, data.tags
        self.history_, self.best_epoch_, self.epochs_run_ = [], 0, 0
        self._keep_posts(data, *group_posts(data.user, data.item, data.tag))

    def serves(self) -> str:
        """What the index answers Tags with: "rtf", or "pop-mix" after a ``grid_validation`` fallback."""
        return "pop-mix" if getattr(self, "grid_kept_", None) is False else "rtf"

    # ---------------------------------------------------------- factors
    def _fit_factors(self, data: TagAssignments, on_epoch) -> RTF:
        """The fit at ``n_components`` and ``reg`` on compacted ``data``."""
        kU, kI, kT = self._dims()
        dtype = np.dtype(self.dtype)
        rng = np.random.default_rng(self.random_state)
        n_users, n_items, n_tags = len(data.users), len(data.items), len(data.tags)

        post_user, post_item, tag_indptr, tags = group_posts(data.user, data.item, data.tag)
        val = self._split_validation(post_user, int(self.validation_posts), rng)
        train_idx = np.flatnonzero(~val)
        val_idx = np.flatnonzero(val)
        val_indptr, val_tags = _subset_posts(tag_indptr, tags, val_idx)

        std = float(self.init_std)
        C = rng.normal(0.0, std, size=(kU, kI, kT)).astype(dtype)
        U = rng.normal(0.0, std, size=(n_users, kU)).astype(dtype)
        I = rng.normal(0.0, std, size=(n_items, kI)).astype(dtype)
        T = rng.normal(0.0, std, size=(n_tags, kT)).astype(dtype)
        self.core_, self.user_factors_, self.item_factors_, self.tag_factors_ = C, U, I, T
        self.users_, self.items_, self.tags_ = data.users, data.items, data.tags

        best = (-np.inf, 0, None, [])  # (smoothed val auc, epoch, parameters, window then)
        peak, kept = -np.inf, (0, None)  # highest criterion; latest pass within keep_within of it
        history: list[dict[str, float]] = []
        recent: list[float] = []
        window = int(self.smoothing)
        stale = 0
        drops = 0
        # the rate of pass e is base / (1 + learning_rate_decay (e - 1)); each plateau drop scales base
        base_lr = float(self.learning_rate)
        label = f"RTF-{kU}" if kU == kI == kT else f"RTF-{kU}x{kI}x{kT}"
        with Progress(label, total=int(self.max_iter), enabled=bool(self.verbose)) as bar:
            for epoch in range(1, int(self.max_iter) + 1):
                order = rng.permutation(train_idx)
                lr = base_lr / (1.0 + float(self.learning_rate_decay) * (epoch - 1))
                smooth, train_auc = K.sgd_epoch(
                    C,
                    U,
                    I,
                    T,
                    post_user,
                    post_item,
                    tag_indptr,
                    tags,
                    order,
                    lr,
                    float(self.reg),
                    float(self.reg_core),
                    self._reg_tags(),
                )
                check_finite(epoch, core=C, user_factors=U, item_factors=I, tag_factors=T)
                record = {"epoch": epoch, "train_auc": float(train_auc), "smoothed_auc": float(smooth)}
                if int(self.learning_rate_drops):
                    record["lr"] = lr
                if val_idx.size:
                    scores = self._scores(post_user[val_idx], post_item[val_idx])
                    val_auc = float(np.nanmean(self.posts_auc(scores, val_indptr, val_tags)))
                    record["val_auc"] = val_auc
                    recent = (recent + [val_auc])[-window:]
                    criterion = float(np.mean(recent))
                    if window > 1:
                        record["val_auc_smoothed"] = criterion
                    if criterion > best[0] + float(self.val_tol):
                        best = (criterion, epoch, (C.copy(), U.copy(), I.copy(), T.copy()), list(recent))
                        stale = 0
                    else:
                        stale += 1
                    if self.keep_within is not None:
                        peak = max(peak, criterion)
                        if criterion >= peak - float(self.keep_within):
                            kept = (epoch, (C.copy(), U.copy(), I.copy(), T.copy()))
                history.append(record)
                if on_epoch is not None:
                    on_epoch(epoch, self, record)
                bar.update(1, **{k: v for k, v in record.items() if k not in ("epoch", "lr")})
                if val_idx.size and stale >= int(self.patience) and epoch >= int(self.min_iter):
                    if drops >= int(self.learning_rate_drops):
                        break
                    # plateau with drops left: back to the best pass, smaller steps from there
                    drops += 1
                    base_lr *= float(self.learning_rate_drop_factor)
                    for live, saved in zip((C, U, I, T), best[2]):
                        live[...] = saved
                    recent = list(best[3])
                    stale = 0
        if self.keep_within is not None and kept[1] is not None:
            # the pass the default rule would have kept, for side-by-side evaluation
            self.first_plateau_ = (best[1], best[2]) if best[2] is not None else None
            best = (peak, kept[0], kept[1], [])
        if best[2] is not None and best[1] != history[-1]["epoch"]:
            C, U, I, T = best[2]
            self.core_, self.user_factors_, self.item_factors_, self.tag_factors_ = C, U, I, T
        self.history_ = history
        self.best_epoch_ = best[1] if best[2] is not None else history[-1]["epoch"]
        self.epochs_run_ = history[-1]["epoch"]
        self._keep_posts(data, post_user, post_item, tag_indptr, tags)
        return self

    def _keep_posts(self, data: TagAssignments, post_user, post_item, tag_indptr, tags) -> None:
        """What serving needs besides the factors: popularity for cold start, own tags."""
        self.tag_names_ = data.tag_names
        self.post_user_, self.post_item_ = post_user, post_item
        self.tag_indptr_, self.tags_in_posts_ = tag_indptr, tags
        self.source_ = data.source
        self.fingerprint_ = data.fingerprint()

    # ------------------------------------------------------------ artifact
    def _artifact_metrics(self) -> dict[str, float]:
        """Training figures of the kept pass, and the ``grid_validation`` choice."""
        metrics = {"epochs": float(self.epochs_run_), "best_epoch": float(self.best_epoch_)}
        if self.history_:
            best = next((h for h in self.history_ if h["epoch"] == self.best_epoch_), self.history_[-1])
            metrics["train_auc"] = best["train_auc"]
            if "val_auc" in best:
                metrics["validation_auc"] = best["val_auc"]
        if getattr(self, "grid_val_f1_", None) is not None:
            rtf_f1, mix_f1, se = self.grid_val_f1_
            metrics.update(
                {
                    "grid_kept": float(self.grid_kept_),
                    "grid_n_components": float(self.chosen_params_["n_components"]),
                    "grid_reg": float(self.chosen_params_["reg"]),
                    "val_f1_rtf": rtf_f1,
                    "val_f1_pop_mix": mix_f1,
                    "val_f1_gain_se": se,
                }
            )
        return metrics

    def to_artifact(self) -> Artifact:
        """Pack factors, popularity lists and training posts for ``service.indices.models.rtf``."""
        if not hasattr(self, "core_"):
            raise RuntimeError("fit the model before exporting it")
        n_users, n_items, n_tags = len(self.users_), len(self.items_), len(self.tags_)
        per_post = np.diff(self.tag_indptr_)
        entry_user = np.repeat(self.post_user_, per_post)
        entry_item = np.repeat(self.post_item_, per_post)
        tag_pop = np.bincount(self.tags_in_posts_, minlength=n_tags).astype(np.float32)
        top = int(self.popular_top)
        u_ptr, u_tags, u_counts = _csr_top_lists(entry_user, self.tags_in_posts_, n_users, n_tags, top)
        i_ptr, i_tags, i_counts = _csr_top_lists(entry_item, self.tags_in_posts_, n_items, n_tags, top)
        # posts are sorted by (user, item): a user's posts are one slice
        post_indptr = np.zeros(n_users + 1, dtype=np.int64)
        np.add.at(post_indptr, self.post_user_.astype(np.int64) + 1, 1)
        arrays = {
            "core": np.ascontiguousarray(self.core_, dtype=np.float32),
            "user_factors": np.ascontiguousarray(self.user_factors_, dtype=np.float32),
            "item_factors": np.ascontiguousarray(self.item_factors_, dtype=np.float32),
            "tag_factors": np.ascontiguousarray(self.tag_factors_, dtype=np.float32),
            "tag_popularity": tag_pop,
            "user_tag_indptr": u_ptr,
            "user_tag_indices": u_tags,
            "user_tag_counts": u_counts,
            "item_tag_indptr": i_ptr,
            "item_tag_indices": i_tags,
            "item_tag_counts": i_counts,
            "post_indptr": np.cumsum(post_indptr),
            "post_items": self.post_item_.astype(np.int32),
            "post_tag_indptr": self.tag_indptr_.astype(np.int64),
            "post_tags": self.tags_in_posts_.astype(np.int32),
        }
        if self.tag_names_ is not None:
            arrays["tag_name_bytes"], arrays["tag_name_offsets"] = _encode_names(list(self.tag_names_))
        metrics = self._artifact_metrics()
        kU, kI, kT = self.core_.shape
        return Artifact(
            kind=self.kind,
            arrays=arrays,
            ids={"users": self.users_, "items": self.items_, "tags": self.tags_},
            hyperparameters=self.get_params(),
            metrics=metrics,
            attributes={
                "dims": [kU, kI, kT],
                "posts": int(self.post_user_.size),
                "tag_assignments": int(self.tags_in_posts_.size),
                "source": self.source_,
                # "pop-mix": grid_validation found no RTF that clearly beats it; the index serves it
                "serves": self.serves(),
                "mix_weight": float(getattr(self, "mix_weight_", 0.5)),
                "wire_tag_ids": "external tag ids of the data (tag names, when the data "
                "has them, are in tag_name_bytes/offsets)",
            },
            data_fingerprint=self.fingerprint_,
        )


def _subset_posts(tag_indptr: np.ndarray, tags: np.ndarray, rows: np.ndarray):
    """The (indptr, tags) CSR of a subset of posts, in ``rows`` order."""
    lengths = tag_indptr[rows + 1] - tag_indptr[rows]
    indptr = np.zeros(rows.size + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(lengths)
    out = np.empty(int(indptr[-1]), dtype=tags.dtype)
    for k, p in enumerate(rows):
        out[indptr[k] : indptr[k + 1]] = tags[tag_indptr[p] : tag_indptr[p + 1]]
    return indptr, out


Estimator = RTF
