"""RTF: Ranking with Tensor Factorization for tag recommendation.

Rendle, Balby Marinho, Nanopoulos, Schmidt-Thieme, "Learning Optimal Ranking
with Tensor Factorization for Tag Recommendation", KDD 2009
(the working form is ``docs/algorithms.md`` section 2, whose equations we follow because the
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
  (``trainer.models.rtf_kernels``), in :func:`sgd_passes`; the estimator
  :class:`RTF` is a thin shell over it and runs ``max_iter`` passes. Stopping on a
  plateau of held-out posts' AUC is the wrapper
  :class:`~ordrec.trainer.models.rtf_stopping.EarlyStoppedRTF`; choosing dims and ``reg`` on
  validation posts is :class:`~ordrec.trainer.models.rtf_selection.RTFGridSearch`.

Serving uses ``service.indices.models.rtf.RTFIndex`` on the artifact this writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from scipy.stats import rankdata

from ordrec.service.storage.artifact import Artifact
from ordrec.trainer.data.types import DataError, TagAssignments
from ordrec.trainer.models import rtf_kernels
from ordrec.trainer.models.base import Estimator, Interval, Options, check_finite
from ordrec.trainer.models.rtf_selection import group_posts
from ordrec.trainer.progress import Progress

# What a per-pass hook returns to end the passes (any other number scales the learning rate).
STOP = 0.0


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


Factors = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""``(C, U, I, T)``: the core and the user, item and tag factor matrices."""


@dataclass(frozen=True)
class Posts:
    """Training posts grouped as ``group_posts`` returns them: each post's user and item,
    and its distinct tags in ``tags[tag_indptr[p]:tag_indptr[p+1]]``."""

    user: np.ndarray
    item: np.ndarray
    tag_indptr: np.ndarray
    tags: np.ndarray


PassHook = Callable[[int, dict[str, float]], "float | None"]
"""Called after every pass as ``hook(epoch, record)``; it may add figures to ``record`` (they are
shown and kept) and return :data:`STOP`, or a factor for the learning rate from the next pass on
(None: go on as is)."""


def sgd_passes(
    factors: Factors,
    posts: Posts,
    trained: np.ndarray,
    rng: np.random.Generator,
    *,
    learning_rate: float,
    learning_rate_decay: float,
    regs: tuple[float, float, float],
    max_iter: int,
    label: str = "RTF",
    verbose: bool = False,
    on_pass: PassHook | None = None,
) -> list[dict[str, float]]:
    """Per-post stochastic gradient ascent (Fig. 5) on ``factors`` in place, on the posts of rows
    ``trained``, for ``max_iter`` passes or until ``on_pass`` returns :data:`STOP`; one record per
    pass. ``regs`` is ``(reg, reg_core, reg_tags)``."""
    history: list[dict[str, float]] = []
    base_lr = float(learning_rate)  # pass e steps with base / (1 + decay (e - 1)); a hook may scale base
    with Progress(label, total=int(max_iter), enabled=bool(verbose)) as bar:
        for epoch in range(1, int(max_iter) + 1):
            lr = base_lr / (1.0 + float(learning_rate_decay) * (epoch - 1))
            smooth, train_auc = rtf_kernels.sgd_epoch(
                *factors,
                posts.user,
                posts.item,
                posts.tag_indptr,
                posts.tags,
                rng.permutation(trained),
                lr,
                *regs,
            )
            C, U, I, T = factors
            check_finite(epoch, core=C, user_factors=U, item_factors=I, tag_factors=T)
            record = {"epoch": epoch, "train_auc": float(train_auc), "smoothed_auc": float(smooth), "lr": lr}
            history.append(record)
            scale = None if on_pass is None else on_pass(epoch, record)
            bar.update(1, **{k: v for k, v in record.items() if k not in ("epoch", "lr")})
            if scale == STOP:
                break
            base_lr *= 1.0 if scale is None else float(scale)
    return history


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


def checked_tags(data: TagAssignments) -> TagAssignments:
    """``data`` compacted, or a clear error when RTF cannot train on it."""
    if not isinstance(data, TagAssignments):
        raise TypeError(f"RTF needs TagAssignments, got {type(data).__name__}")
    if len(data) == 0:
        raise DataError(data.source, None, "no tag assignments to train on")
    data = data.compact()
    if len(data.tags) < 2:
        raise DataError(data.source, None, "need at least two distinct tags to rank")
    return data


class RTF(Estimator):
    """Tucker-model tag recommender trained for per-post ranking (Rendle et al., KDD 2009).

    A fit runs ``max_iter`` passes over the posts it is given. Measurements behind the defaults
    are in ``docs/rtf.md``; stopping on a plateau of held-out posts' AUC is
    :class:`~ordrec.trainer.models.rtf_stopping.EarlyStoppedRTF` (on by default in
    ``ordrec-train`` and jobs), choosing ``n_components`` and ``reg`` on validation posts is
    :class:`~ordrec.trainer.models.rtf_selection.RTFGridSearch`.

    Parameters
    ----------
    n_components : int or sequence of 3 ints, default 64
        ``(kU, kI, kT)``; one int means the same for all three (the paper's "RTF 8" ... "RTF 64").
    learning_rate : float, default 0.5
        Step size ``alpha`` of Fig. 5.
    learning_rate_decay : float, default 0.0
        Pass ``e`` (from 1) steps with ``learning_rate / (1 + learning_rate_decay (e - 1))``.
    reg : float, default 1e-3
        ``gamma``, the L2 weight of the user and item factors (Eq. 8).
    reg_core : float, default 0.0
        ``gamma_C``, the L2 weight of the core.
    reg_tags : float or None, default 0.0
        ``gamma_T``, the L2 weight of the tag factors; None means ``reg``.
    max_iter : int, default 100
        Passes over the posts (a hook given to ``fit`` may stop sooner).
    init_std : float, default 0.1
        Standard deviation of the normal initialisation of every parameter.
    popular_top : int, default 200
        Length of the per-user and per-item popular-tag lists shipped for cold start.
    dtype : {"float32", "float64"}, default "float32"
        Floating type of the training arrays (float64 for tests).
    random_state : int, default 0
        Seeds the initialisation and the SGD order.
    verbose : bool, default True
        Progress bar with the training AUC (and what a hook adds) on stderr.
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
        self.popular_top = popular_top
        self.dtype = dtype
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------- helpers
    def dims(self) -> tuple[int, int, int]:
        """``(kU, kI, kT)`` from ``n_components`` (an int, three ints, or "kU,kI,kT")."""
        given: Any = self.n_components
        if isinstance(given, str):
            given = [int(x) for x in given.split(",")]
        if isinstance(given, Integral):
            given = [int(given)] * 3
        dims = tuple(int(x) for x in given)
        if len(dims) != 3 or min(dims) < 1:
            raise ValueError(
                f"n_components must be a positive int or three positive ints, got {self.n_components!r}"
            )
        return dims[0], dims[1], dims[2]

    def _validate_params(self) -> None:
        super()._validate_params()
        self.dims()

    posts_auc = staticmethod(posts_auc)

    # ---------------------------------------------------------------- fit
    def fit(
        self,
        data: TagAssignments,
        on_epoch: Callable[[int, RTF, dict], float | None] | None = None,
        *,
        held_out: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
    ) -> RTF:
        """Learn ``C, U, I, T`` by per-post stochastic gradient ascent (Fig. 5) for ``max_iter`` passes.

        Parameters
        ----------
        data : TagAssignments
            (user, item, tag) triples; users, items and tags without any triple are dropped.
        on_epoch : callable, optional
            Called as ``on_epoch(epoch, self, record)`` after every pass, with the live
            parameters in ``core_``, ``user_factors_``, ... (copy what you keep); it may add
            figures to ``record`` and return :data:`STOP` or a learning-rate factor (:data:`PassHook`).
        held_out : bool array over the posts of ``data`` (in :func:`group_posts` order), optional
            Posts the passes skip (a wrapper's validation posts); they stay in the artifact.
        rng : numpy Generator, optional
            What the initialisation and the pass order draw from (default:
            ``default_rng(random_state)``); a wrapper that drew ``held_out`` from that stream
            passes it on, so the seeded fit stays what it was.
        """
        self._validate_params()
        data = checked_tags(data)
        dims, dtype = self.dims(), np.dtype(self.dtype)
        rng = np.random.default_rng(self.random_state) if rng is None else rng
        posts = Posts(*group_posts(data.user, data.item, data.tag))
        trained = np.arange(posts.user.size) if held_out is None else np.flatnonzero(~held_out)
        shapes = [dims, (len(data.users), dims[0]), (len(data.items), dims[1]), (len(data.tags), dims[2])]
        C, U, I, T = (rng.normal(0.0, float(self.init_std), size=s).astype(dtype) for s in shapes)
        self.core_, self.user_factors_, self.item_factors_, self.tag_factors_ = C, U, I, T
        self.users_, self.items_, self.tags_ = data.users, data.items, data.tags
        kU, kI, kT = dims
        self.history_ = sgd_passes(
            (C, U, I, T),
            posts,
            trained,
            rng,
            learning_rate=float(self.learning_rate),
            learning_rate_decay=float(self.learning_rate_decay),
            regs=(
                float(self.reg),
                float(self.reg_core),
                float(self.reg if self.reg_tags is None else self.reg_tags),
            ),
            max_iter=int(self.max_iter),
            label=f"RTF-{kU}" if kU == kI == kT else f"RTF-{kU}x{kI}x{kT}",
            verbose=bool(self.verbose),
            on_pass=None if on_epoch is None else lambda epoch, record: on_epoch(epoch, self, record),
        )
        self.epochs_run_ = int(self.history_[-1]["epoch"])
        self.serves_ = "rtf"
        self._keep_posts(data, posts)
        return self

    def fit_popularity_only(self, data: TagAssignments) -> RTF:
        """No factors worth serving: a 1 x 1 x 1 zero model keeps the artifact's shape, and the
        index answers Tags with ``pop-mix`` (what :class:`RTFGridSearch` falls back to)."""
        data = checked_tags(data)
        self.core_ = np.zeros((1, 1, 1), dtype=np.float32)
        self.user_factors_ = np.zeros((len(data.users), 1), dtype=np.float32)
        self.item_factors_ = np.zeros((len(data.items), 1), dtype=np.float32)
        self.tag_factors_ = np.zeros((len(data.tags), 1), dtype=np.float32)
        self.users_, self.items_, self.tags_ = data.users, data.items, data.tags
        self.history_, self.epochs_run_ = [], 0
        self.serves_ = "pop-mix"
        self._keep_posts(data, Posts(*group_posts(data.user, data.item, data.tag)))
        return self

    def serves(self) -> str:
        """What the index answers Tags with: "rtf", or "pop-mix" after :meth:`fit_popularity_only`."""
        return getattr(self, "serves_", "rtf")

    def _keep_posts(self, data: TagAssignments, posts: Posts) -> None:
        """What serving needs besides the factors: popularity for cold start, own tags."""
        self.tag_names_ = data.tag_names
        self.post_user_, self.post_item_ = posts.user, posts.item
        self.tag_indptr_, self.tags_in_posts_ = posts.tag_indptr, posts.tags
        self.source_ = data.source
        self.fingerprint_ = data.fingerprint()

    # ------------------------------------------------------------ artifact
    def _artifact_metrics(self) -> dict[str, float]:
        """Training figures of the last pass, whose parameters it holds (``best_epoch``: that pass)."""
        metrics = {"epochs": float(self.epochs_run_), "best_epoch": float(self.epochs_run_)}
        if self.history_:
            metrics["train_auc"] = self.history_[-1]["train_auc"]
        return metrics

    def to_artifact(self, mix_weight: float = 0.5) -> Artifact:
        """Pack factors, popularity lists and training posts for ``service.indices.models.rtf``;
        ``mix_weight`` is the item's share in the ``pop-mix`` the index may serve."""
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
        kU, kI, kT = self.core_.shape
        return Artifact(
            kind=self.kind,
            arrays=arrays,
            ids={"users": self.users_, "items": self.items_, "tags": self.tags_},
            hyperparameters=self.flat_params(),
            metrics=self._artifact_metrics(),
            attributes={
                "dims": [kU, kI, kT],
                "posts": int(self.post_user_.size),
                "tag_assignments": int(self.tags_in_posts_.size),
                "source": self.source_,
                # "pop-mix": a grid search found no RTF that clearly beats it; the index serves it
                "serves": self.serves(),
                "mix_weight": float(mix_weight),
                "wire_tag_ids": "external tag ids of the data (tag names, when the data "
                "has them, are in tag_name_bytes/offsets)",
            },
            data_fingerprint=self.fingerprint_,
        )
