"""Posts and held-out posts for RTF: grouping triples into posts, the leave-one-post-out split, popularity lists and the
pop-mix weight, shared by the estimator's validated choice (``RTF(grid_validation=True)``)
and the paper's protocol (``ordrec.trainer.reproduce.rtf``), so both carve, score and
choose the same way.
"""

from __future__ import annotations

import numpy as np

from ordrec.service.indices.models.rtf import RTFIndex
from ordrec.service.indices.topk import top_k
from ordrec.trainer.data.types import TagAssignments
from ordrec.trainer.models.ranking import f1, precision_recall

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
    the protocol's ``pop-mix-val`` and ``RTF(grid_validation=True)`` carve the same posts."""
    data = data.compact()
    fit_part, held = leave_one_post_out(data, np.random.default_rng(int(seed) + VALIDATION_SEED_OFFSET))
    return data, fit_part, held
