"""Model selection for RTF: grouping triples into posts, the leave-one-post-out split, popularity
lists and the pop-mix weight, shared by :class:`RTFGridSearch` (dims and reg chosen on validation
posts) and the paper's protocol (``ordrec.trainer.reproduce.rtf``), so both carve, score and
choose the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ordrec.service.indices.models.rtf import RTFIndex
from ordrec.service.indices.topk import top_k
from ordrec.service.storage.artifact import Artifact
from ordrec.trainer.data.types import TagAssignments
from ordrec.trainer.models.base import Interval, validate_params
from ordrec.trainer.models.ranking import f1, per_list_f1, precision_recall
from ordrec.trainer.models.selection import grid_points, significant_gain

if TYPE_CHECKING:
    from ordrec.trainer.models.rtf import RTF
    from ordrec.trainer.models.rtf_stopping import EarlyStoppedRTF

MAX_N = 10
MIX_GRID = tuple(round(0.1 * k, 1) for k in range(11))
# Validation carves use their own stream, never the one that drew the test split.
VALIDATION_SEED_OFFSET = 10_000


def group_posts(user: np.ndarray, item: np.ndarray, tag: np.ndarray):
    """Group tag assignments into posts.

    Returns ``(post_user, post_item, tag_indptr, tags)``: posts sorted by
    (user, item), each post's distinct tags sorted in
    ``tags[tag_indptr[p]:tag_indptr[p+1]]``. Duplicate triples count once.
    """
    user = np.asarray(user, dtype=np.int64)
    item = np.asarray(item, dtype=np.int64)
    tag = np.asarray(tag, dtype=np.int64)
    if user.size == 0:
        empty = np.empty(0, np.int32)
        return empty, empty, np.zeros(1, np.int64), empty
    order = np.lexsort((tag, item, user))
    u, i, t = user[order], item[order], tag[order]
    dup = np.zeros(u.size, dtype=bool)
    dup[1:] = (u[1:] == u[:-1]) & (i[1:] == i[:-1]) & (t[1:] == t[:-1])
    u, i, t = u[~dup], i[~dup], t[~dup]
    starts = np.flatnonzero(np.r_[True, (u[1:] != u[:-1]) | (i[1:] != i[:-1])])
    indptr = np.r_[starts, u.size].astype(np.int64)
    return u[starts].astype(np.int32), i[starts].astype(np.int32), indptr, t.astype(np.int32)


def leave_one_post_out(data: TagAssignments, rng: np.random.Generator):
    """Per user, one random post into the held-out set.

    Returns ``(train, held)`` where ``train`` is a ``TagAssignments`` and
    ``held`` is ``(post_user, post_item, tag_indptr, tags)`` in ``data``'s rows.
    """
    post_user, post_item, indptr, tags = group_posts(data.user, data.item, data.tag)
    users, starts, counts = np.unique(post_user, return_index=True, return_counts=True)
    picks = starts + (rng.random(users.size) * counts).astype(np.int64)
    is_held = np.zeros(post_user.size, dtype=bool)
    is_held[picks] = True
    per_post = np.diff(indptr)
    entry_held = np.repeat(is_held, per_post)
    train = TagAssignments(
        data.users,
        data.items,
        data.tags,
        np.repeat(post_user, per_post)[~entry_held],
        np.repeat(post_item, per_post)[~entry_held],
        tags[~entry_held],
        data.source,
        tag_names=data.tag_names,
    )
    held_indptr = np.zeros(picks.size + 1, dtype=np.int64)
    held_indptr[1:] = np.cumsum(per_post[picks])
    held_tags = np.concatenate([tags[indptr[p] : indptr[p + 1]] for p in picks]) if picks.size else tags[:0]
    return train, (post_user[picks], post_item[picks], held_indptr, held_tags)


class HeldOutPosts:
    """Held-out posts translated into one index's rows (by external id)."""

    def __init__(self, data: TagAssignments, held, index: RTFIndex):
        post_user, post_item, indptr, tags = held
        self.user_rows = index.users.rows(data.users.externals(post_user))
        self.item_rows = index.items.rows(data.items.externals(post_item))
        # held-out tags in the index's tag rows; a tag the training set lost is a
        # certain miss (it stays in the recall denominator)
        self.truth = []
        self.known_truth = []
        for p in range(post_user.size):
            ext = data.tags.externals(tags[indptr[p] : indptr[p + 1]])
            rows = index.tags_ids.rows(ext)
            self.truth.append(np.where(rows >= 0, rows, -1 - np.arange(rows.size)))
            self.known_truth.append(rows[rows >= 0])
        self.item_ext = np.asarray(post_item)

    def __len__(self) -> int:
        return self.user_rows.size


def served_lists(index: RTFIndex, posts: HeldOutPosts, n: int = MAX_N) -> list[np.ndarray]:
    """Top-``n`` tag rows per post from ``RTFIndex.tags``, the code that answers the Tags RPC."""
    return [index.tags(int(u), int(i), n)[0] for u, i in zip(posts.user_rows, posts.item_rows)]


def popularity_lists(
    index: RTFIndex, posts: HeldOutPosts, kind: str, mix_weight: float = 0.5, n: int = MAX_N
) -> list[np.ndarray]:
    """Top-``n`` lists of a popularity baseline (``pop-global``, ``pop-item``, ``pop-user``,
    ``pop-mix``) from the index's popularity arrays.

    An unknown item or user gives that part no counts, so the list falls back
    on the global order (the tie-break every popularity score carries).
    ``mix_weight`` is the item's share in ``pop-mix`` (the user's is the rest).
    """
    lists = []
    for u, i in zip(posts.user_rows, posts.item_rows):
        if (kind == "pop-item" and i < 0) or (kind == "pop-user" and u < 0):
            scores = index.popular_scores("global")
        elif kind == "pop-mix" and (u < 0 or i < 0):
            scores = index.popular_scores(
                "item" if i >= 0 else "user" if u >= 0 else "global", int(u), int(i)
            )
        else:
            scores = index.popular_scores(kind.split("-")[1], int(u), int(i), mix_weight=mix_weight)
        lists.append(top_k(scores, n)[0])
    return lists


def mean_f1(lists: list[np.ndarray], truth: list[np.ndarray], max_n: int = MAX_N) -> float:
    """F1@1..max_n as the protocol reports it (of the averaged precision and recall), averaged over N."""
    return float(np.mean(f1(*precision_recall(lists, truth, max_n))))


def best_mix_weight(index: RTFIndex, posts: HeldOutPosts, grid: tuple[float, ...] = MIX_GRID) -> float:
    """The item weight of ``pop-mix`` with the best :func:`mean_f1` on ``posts``
    (ties: the weight nearest one half)."""
    score = {w: mean_f1(popularity_lists(index, posts, "pop-mix", w), posts.truth) for w in grid}
    return float(max(grid, key=lambda w: (score[w], -abs(w - 0.5))))


def validation_carve(data: TagAssignments, seed: int):
    """``leave_one_post_out`` of (compacted) training data on the validation stream of ``seed``:
    the protocol's ``pop-mix-val`` and :class:`RTFGridSearch` carve the same posts."""
    data = data.compact()
    fit_part, held = leave_one_post_out(data, np.random.default_rng(int(seed) + VALIDATION_SEED_OFFSET))
    return data, fit_part, held


def unfitted_copy(estimator: Any, settings: Mapping[str, Any]) -> Any:
    """An unfitted copy of ``estimator`` (an RTF, or a wrapper of one) whose RTF takes ``settings``."""
    params = estimator.get_params()
    if "estimator" in params:  # a wrapper: the same wrapper around a copy of its estimator
        return type(estimator)(**dict(params, estimator=unfitted_copy(params["estimator"], settings)))
    return type(estimator)(**params).set_params(**settings)


def kept_pass(fitted: Any) -> int:
    """The pass whose parameters a fitted RTF (or early-stopped one) holds."""
    return int(getattr(fitted, "best_epoch_", fitted.epochs_run_))


DEFAULT_GRID: dict[str, tuple] = {"n_components": (16, 64), "reg": (1e-4, 1e-3)}
SEARCH_CONSTRAINTS: dict[str, list] = {
    "margin": [Interval(Real, None, None)],
    "confidence": [Interval(Real, 0, None)],
}


class RTFGridSearch:
    """Choose an RTF's settings on validation posts, and serve ``pop-mix`` unless one clearly wins.

    One post per user is carved out of the training posts (:func:`validation_carve`);
    every point of ``param_grid`` is fitted on the rest with ``estimator``'s other
    settings and scored there through the serving index (per-post F1@1..10). The best
    is refitted on all the posts only if its paired gain over ``pop-mix`` (at its best
    item weight on the same posts) passes :func:`~ordrec.trainer.models.selection.significant_gain`;
    otherwise the fitted model serves ``pop-mix``. ``docs/rtf.md`` has the measurements.

    Parameters
    ----------
    estimator : RTF or EarlyStoppedRTF
        The settings every candidate shares (the RTF's ``random_state`` also seeds the carve);
        each candidate is an unfitted copy with the grid point's RTF parameters.
    param_grid : mapping of str to sequence, default {"n_components": (16, 64), "reg": (1e-4, 1e-3)}
        Candidate values per RTF parameter; every combination is a candidate (ties: the first).
    margin : float, default 0.0
        The validation gain over ``pop-mix`` the best candidate must exceed.
    confidence : float, default 2.0
        Standard errors of that gain it must exceed besides.
    """

    _parameter_constraints: ClassVar[dict[str, list]] = SEARCH_CONSTRAINTS

    def __init__(
        self,
        estimator: RTF | EarlyStoppedRTF,
        param_grid: Mapping[str, Sequence[Any]] | None = None,
        *,
        margin: float = 0.0,
        confidence: float = 2.0,
    ):
        self.estimator = estimator
        self.param_grid = dict(DEFAULT_GRID if param_grid is None else param_grid)
        self.margin = margin
        self.confidence = confidence

    def _validate_params(self) -> None:
        """A clear ValueError for an empty grid, an unknown parameter or a value RTF refuses."""
        if not self.param_grid or any(len(values) == 0 for values in self.param_grid.values()):
            raise ValueError(
                f"param_grid must give each parameter at least one value, got {self.param_grid!r}"
            )
        for point in self.candidates():
            self._candidate(point)._validate_params()
        validate_params(
            "RTFGridSearch", {"margin": self.margin, "confidence": self.confidence}, SEARCH_CONSTRAINTS
        )

    def planned_fits(self) -> int:
        """The fits a fit runs: every candidate on the carved posts, then the winner on all of them."""
        return len(self.candidates()) + 1

    def candidates(self) -> list[dict[str, Any]]:
        """Every point of the grid, in grid order (the last parameter varies fastest)."""
        return grid_points(self.param_grid)

    def _candidate(self, point: Mapping[str, Any]) -> Any:
        """An unfitted copy of ``estimator`` at one grid point (a number stays a plain int or float)."""
        settings = {
            k: int(v) if isinstance(v, Integral) else float(v) if isinstance(v, Real) else v
            for k, v in point.items()
        }
        return unfitted_copy(self.estimator, settings)

    def fit(self, data: TagAssignments) -> RTFGridSearch:
        """Score the grid on carved posts, then refit the winner on all of ``data`` or keep ``pop-mix``."""
        from ordrec.trainer.models.rtf import checked_tags

        self._validate_params()
        data = checked_tags(data)
        scored, popmix = self._score_grid(data)
        best = max(range(len(scored)), key=lambda k: scored[k][1].mean())  # ties: the first in grid order
        gain = significant_gain(
            scored[best][1] - popmix, margin=float(self.margin), confidence=float(self.confidence)
        )
        self.grid_scores_ = [
            dict(point, val_f1=float(per_post.mean()), best_epoch=epoch) for point, per_post, epoch in scored
        ]
        self.chosen_params_ = scored[best][0]
        self.grid_val_f1_ = (float(scored[best][1].mean()), float(popmix.mean()), gain.se)
        self.grid_kept_ = gain.kept
        winner = self._candidate(self.chosen_params_)
        self.best_estimator_ = winner.fit(data) if gain.kept else winner.fit_popularity_only(data)
        return self

    def _score_grid(self, data: TagAssignments) -> tuple[list[tuple[dict, np.ndarray, int]], np.ndarray]:
        """Each candidate's per-post F1 on the carved posts (and its kept pass), and ``pop-mix``'s
        at the item weight that scores best there (``mix_weight_``)."""
        data, fit_part, held = validation_carve(data, int(self.estimator.random_state))  # the RTF's seed
        scored = []
        for point in self.candidates():
            est = self._candidate(point).fit(fit_part)
            index = RTFIndex.from_artifact(est.to_artifact())
            posts = HeldOutPosts(data, held, index)  # every candidate has fit_part's id maps
            per_post = per_list_f1(served_lists(index, posts), posts.truth, MAX_N).mean(axis=1)
            scored.append((point, per_post, kept_pass(est)))
        self.mix_weight_ = best_mix_weight(index, posts)
        mix_lists = popularity_lists(index, posts, "pop-mix", self.mix_weight_)
        return scored, per_list_f1(mix_lists, posts.truth, MAX_N).mean(axis=1)

    def serves(self) -> str:
        """What the index answers Tags with: "rtf", or "pop-mix" when no candidate clearly won."""
        return self.best_estimator_.serves()

    def to_artifact(self) -> Artifact:
        """The served model's artifact, with the choice in its metrics and the grid in its attributes."""
        artifact = self.best_estimator_.to_artifact(mix_weight=self.mix_weight_)
        rtf_f1, mix_f1, se = self.grid_val_f1_
        artifact.metrics.update(
            {
                "grid_kept": float(self.grid_kept_),
                **{f"grid_{name}": float(value) for name, value in self.chosen_params_.items()},
                "val_f1_rtf": rtf_f1,
                "val_f1_pop_mix": mix_f1,
                "val_f1_gain_se": se,
            }
        )
        artifact.attributes["grid_search"] = {
            "param_grid": {k: list(v) for k, v in self.param_grid.items()},
            "margin": float(self.margin),
            "confidence": float(self.confidence),
        }
        return artifact
