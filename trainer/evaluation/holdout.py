"""Generic held-out metrics for the cron job's quality gate (``trainer.job``).

These are *not* the papers' protocols (those live in
``trainer/reproduce/<kind>.py``); they are one cheap, seeded measure per data
family that ``ordrec-train run`` computes on every run so that a new version can
be compared with the live one. Every metric scores through the serving index
(``service.indices.models.index_class(kind).from_artifact(estimator.to_artifact())``)
using only the interfaces of :mod:`service.indices.models.base` (``RecommenderIndex``,
``MapIndex``/``PointSet``) and the RTF index's ``tags``, so the figures come
from the code that answers queries.

Families, by the estimator's ``input_shape``:

``ratings`` (DCR, COE)
    Split: per user, ``round(fraction * n_u)`` random ratings are held out
    (never all of them; users with one rating keep it).
    ``ndcg_at_10``: the user's held-out items ranked by ``score_items``,
    NDCG@10 with gain ``2^r - 1`` (the DCR paper's measure, Hu & Li 2017,
    Section 5.1), averaged over users whose held-out items carry at least two
    distinct ratings (with one rating value every order has NDCG 1, which
    would only dilute the gate). ``hit_rate_at_10``: share of users with a
    held-out item for whom at least one of them is in ``recommend(user, 10,
    exclude=seen)``, the top 10 of all items they had not rated in training.
    ``topn_recall_at_10``: recall@10 of the held-out *liked* items (the top two
    rating values of the data, 4 and 5 on 1..5) in that top 10 (``reproduce
    topn``'s measure), and ``popularity_recall_at_10`` the same of the most-rated
    training items: the job refuses a version below popularity on it.
``tags`` (RTF)
    Split: for a ``fraction`` share of the users with at least two posts, one
    random post (all its tags) is held out: leave-one-post-out.
    ``precision_at_5``/``recall_at_5`` averaged over held-out posts from
    ``tags(user, item, 5)`` (fallbacks included, as served), ``f1_at_5`` =
    their harmonic mean (the F1 of Rendle et al. 2009, Section 5.1).
``attributes`` (SCORE)
    Split: a ``fraction`` of the known (object, aspect) cells is masked
    (set missing) for training. ``triplet_accuracy``: for each held-out cell
    (o, t) with value v, up to 20 seeded pairs (j, k) with j sharing v on t
    and k holding another value (both known in training); the share with
    ``d_t(o, j) < d_t(o, k)`` on aspect t's map (ties count one half).
``neighbors`` (KNNSCAL)
    Split: the whole ranked list of a ``fraction`` of the source vertices is
    held out (the vertex stays on the map through the lists that name it).
    ``recall_at_10``: overlap of the list's first ``m = min(10, len)``
    neighbours with the ``m`` map neighbours from ``neighbors``.
    ``order_agreement``: share of pairs in the held-out list whose rank order
    the map distances keep (ties one half).

Every metric is higher-is-better and in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ordrec.service.indices.models.base import MapIndex, RecommenderIndex
from ordrec.service.indices.topk import top_k
from ordrec.trainer.data.splits import SPLITS as SPLITS  # where the callers of the gate find it
from ordrec.trainer.data.splits import split_ratings
from ordrec.trainer.data.types import AttributeTable, NeighborLists, Ratings, TagAssignments
from ordrec.trainer.evaluation.metrics import f1, mean_or_nan, ndcg, order_agreement
from ordrec.trainer.models.ranking import liked_threshold, served_recall_values

#: metric names each family computes; the first is the default gate metric
METRICS: dict[str, tuple[str, ...]] = {
    "ratings": ("ndcg_at_10", "hit_rate_at_10", "topn_recall_at_10", "popularity_recall_at_10"),
    "tags": ("f1_at_5", "precision_at_5", "recall_at_5"),
    "attributes": ("triplet_accuracy",),
    "neighbors": ("recall_at_10", "order_agreement"),
}
TRIPLETS_PER_CELL = 20


def default_metric(shape: str) -> str:
    return METRICS[shape][0]


@dataclass
class HeldOutCells:
    """Masked cells of an attribute table: ``table`` is the training table
    (held-out cells set to -1); ``obj``/``asp`` the cells; ``value`` their true codes."""

    table: AttributeTable
    obj: np.ndarray
    asp: np.ndarray
    value: np.ndarray

    def __len__(self) -> int:
        return int(self.obj.size)


# ------------------------------------------------------------------ splits
def split_tags(data: TagAssignments, fraction: float, seed: int) -> tuple[TagAssignments, TagAssignments]:
    """Leave-one-post-out for a ``fraction`` share of the users with two or more posts."""
    rng = np.random.default_rng(seed)
    n_items = max(len(data.items), 1)
    post_key = data.user.astype(np.int64) * n_items + data.item.astype(np.int64)
    posts, post_of = np.unique(post_key, return_inverse=True)
    post_user = posts // n_items
    users, first, n_posts = np.unique(post_user, return_index=True, return_counts=True)
    eligible = np.flatnonzero(n_posts >= 2)
    n_pick = int(np.floor(fraction * eligible.size + 0.5))
    if eligible.size and fraction > 0:
        n_pick = max(n_pick, 1)
    chosen = rng.permutation(eligible)[:n_pick]
    # posts are sorted by user, so a user's posts are posts[first:first + n_posts]
    picked = first[chosen] + (rng.random(chosen.size) * n_posts[chosen]).astype(np.int64)
    held = np.zeros(posts.size, dtype=bool)
    held[picked] = True
    test = held[post_of]
    return data.subset(~test), data.subset(test)


def split_attributes(data: AttributeTable, fraction: float, seed: int) -> tuple[AttributeTable, HeldOutCells]:
    """Mask a ``fraction`` of the known cells for training."""
    rng = np.random.default_rng(seed)
    codes = np.asarray(data.codes)
    obj, asp = np.nonzero(codes >= 0)
    n_test = min(int(np.floor(fraction * obj.size + 0.5)), max(obj.size - 1, 0))
    pick = np.sort(rng.permutation(obj.size)[:n_test])
    obj, asp = obj[pick], asp[pick]
    train_codes = codes.copy()
    train_codes[obj, asp] = -1
    train = AttributeTable(
        data.objects,
        list(data.attributes),
        train_codes.astype(np.int32),
        [list(v) for v in data.values],
        data.source,
        labels=data.labels,
    )
    return train, HeldOutCells(train, obj, asp, codes[obj, asp])


def split_neighbors(data: NeighborLists, fraction: float, seed: int) -> tuple[NeighborLists, NeighborLists]:
    """Hold out the whole ranked list of a ``fraction`` of the source vertices."""
    rng = np.random.default_rng(seed)
    sources = np.unique(data.source)
    n_test = min(int(np.floor(fraction * sources.size + 0.5)), max(sources.size - 1, 0))
    held = np.zeros(len(data.vertices), dtype=bool)
    held[rng.permutation(sources)[:n_test]] = True
    test = held[data.source]

    def part(mask):
        return NeighborLists(
            data.vertices,
            data.source[mask],
            data.neighbor[mask],
            data.rank[mask],
            data.path,
            labels=data.labels,
        )

    return part(~test), part(test)


def split(data, fraction: float, seed: int, by: str = "random"):
    """``(train, test)`` for any input shape; seeded, so a run is reproducible. ``by="time"``
    (ratings only) holds out each user's latest ratings."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout fraction must be in (0, 1), got {fraction}")
    if isinstance(data, Ratings):
        return split_ratings(data, fraction, seed, by)
    if by != "random":
        raise ValueError(f"a {by} split is for ratings, not {type(data).__name__}")
    for cls, func in (
        (TagAssignments, split_tags),
        (AttributeTable, split_attributes),
        (NeighborLists, split_neighbors),
    ):
        if isinstance(data, cls):
            return func(data, fraction, seed)
    raise TypeError(f"no holdout split for {type(data).__name__}")


# ----------------------------------------------------------------- metrics
def evaluate_ratings(index: RecommenderIndex, test: Ratings, k: int = 10) -> dict[str, float]:
    """NDCG@k over each user's held-out items and hit rate@k over all unseen items."""
    user_rows = index.users.rows(test.users.ids)[test.user]
    item_rows = index.items.rows(test.items.ids)[test.item]
    known = (user_rows >= 0) & (item_rows >= 0)
    u, i, r = user_rows[known], item_rows[known], np.asarray(test.rating, np.float64)[known]
    order = np.argsort(u, kind="stable")
    u, i, r = u[order], i[order], r[order]
    bounds = np.r_[0, np.flatnonzero(np.diff(u)) + 1, u.size] if u.size else np.array([0])
    ndcgs, hits = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        user, items, ratings = int(u[lo]), i[lo:hi], r[lo:hi]
        if items.size >= 2 and np.unique(ratings).size >= 2:
            scores = np.asarray(index.score_items(user, items), dtype=np.float64)
            ndcgs.append(ndcg(ratings[np.argsort(-scores, kind="stable")], k))
        top, _ = index.recommend(user, k, exclude=index.seen(user))
        hits.append(bool(np.isin(items, top).any()))
    served = Ratings(index.users, index.items, u, i, r.astype(np.float32))
    return {
        f"ndcg_at_{k}": mean_or_nan(ndcgs),
        f"hit_rate_at_{k}": mean_or_nan(hits),
        **topn_figures(index, served, liked_threshold(test.rating), k),
        "ndcg_users": float(len(ndcgs)),
        "hit_rate_users": float(len(hits)),
        "unknown_share": float(1.0 - known.mean()) if known.size else 0.0,
    }


class PopularityLists:
    """The most-rated training items as a top-N list, excluding each user's own (the reference)."""

    def __init__(self, index: RecommenderIndex):
        self.seen = index.seen
        self.counts = np.bincount(index.seen_indices, minlength=len(index.items)).astype(np.float32)
        self.counts.flags.writeable = False  # every user's list reads the same counts

    def recommend_many(self, user_rows: np.ndarray, n: int, *, excludes: list) -> list:
        return [top_k(self.counts, n, exclude) for exclude in excludes]


def topn_figures(index: RecommenderIndex, test: Ratings, threshold: float, k: int = 10) -> dict[str, float]:
    """Served recall@k of the liked held-out items (rows of ``index``), beside popularity's."""
    return {
        f"topn_recall_at_{k}": mean_or_nan(served_recall_values(index, test, threshold, k)),
        f"popularity_recall_at_{k}": mean_or_nan(
            served_recall_values(PopularityLists(index), test, threshold, k)
        ),
    }


def evaluate_tags(index, test: TagAssignments, k: int = 5) -> dict[str, float]:
    """Precision, recall and F1 at ``k`` of the served ``tags`` on held-out posts."""
    user_rows = index.users.rows(test.users.ids)[test.user]
    item_rows = index.items.rows(test.items.ids)[test.item]
    tag_rows = index.tags_ids.rows(test.tags.ids)[test.tag]
    key = test.user.astype(np.int64) * max(len(test.items), 1) + test.item.astype(np.int64)
    posts, first, post_of = np.unique(key, return_index=True, return_inverse=True)
    precision, recall, fallbacks = [], [], 0
    for post in range(posts.size):
        truth = tag_rows[post_of == post]
        rows, _, fallback = index.tags(int(user_rows[first[post]]), int(item_rows[first[post]]), k)
        fallbacks += fallback != "none"
        hit = np.isin(rows, truth[truth >= 0]).sum()
        precision.append(hit / max(rows.size, 1))
        recall.append(hit / truth.size)
    if not precision:
        nan = float("nan")
        return {f"precision_at_{k}": nan, f"recall_at_{k}": nan, f"f1_at_{k}": nan, "posts": 0.0}
    p, r = float(np.mean(precision)), float(np.mean(recall))
    return {
        f"precision_at_{k}": p,
        f"recall_at_{k}": r,
        f"f1_at_{k}": float(f1(p, r)),
        "posts": float(posts.size),
        "fallback_share": fallbacks / posts.size,
    }


def evaluate_attributes(
    index: MapIndex, test: HeldOutCells, seed: int = 0, per_cell: int = TRIPLETS_PER_CELL
) -> dict[str, float]:
    """Triplet preservation of held-out cells on their aspect's map."""
    rng = np.random.default_rng([seed, 1])
    train = test.table
    correct, total = 0.0, 0
    maps: dict[int, tuple] = {}
    for o, t, v in zip(test.obj, test.asp, test.value):
        if t not in maps:
            points = index.point_set(train.attributes[t], "objects")
            maps[t] = points, points.ids.rows(train.objects.ids)  # data row -> map row
        points, rows = maps[t]
        column = train.codes[:, t]
        same = np.flatnonzero((column == v) & (rows >= 0))
        same = same[same != o]
        other = np.flatnonzero((column >= 0) & (column != v) & (rows >= 0))
        if same.size == 0 or other.size == 0 or rows[o] < 0:
            continue
        j = rows[rng.choice(same, per_cell)]
        kk = rows[rng.choice(other, per_cell)]
        x = points.coords[rows[o]]
        d_j = np.linalg.norm(points.coords[j] - x, axis=1)
        d_k = np.linalg.norm(points.coords[kk] - x, axis=1)
        correct += float(np.sum(d_j < d_k) + 0.5 * np.sum(d_j == d_k))
        total += per_cell
    return {"triplet_accuracy": correct / total if total else float("nan"), "triplets": float(total)}


def evaluate_neighbors(index: MapIndex, test: NeighborLists, k: int = 10) -> dict[str, float]:
    """Recall@k and pairwise order agreement of held-out ranked lists on the map."""
    entity = index.default_entity
    points = index.point_set("", entity)
    rows = points.ids.rows(test.vertices.ids)
    order = np.lexsort((test.rank, test.source))
    src, nb = test.source[order], test.neighbor[order]
    bounds = np.r_[0, np.flatnonzero(np.diff(src)) + 1, src.size] if src.size else np.array([0])
    recalls, agree, pairs = [], 0.0, 0
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        s = rows[src[lo]]
        listed = rows[nb[lo:hi]]
        listed = listed[listed >= 0]
        if s < 0 or listed.size == 0:
            continue
        m = min(k, listed.size)
        found, _ = index.neighbors("", entity, int(s), entity, m)
        recalls.append(np.isin(listed[:m], found).sum() / m)
        agreeing, listed_pairs = order_agreement(
            np.linalg.norm(points.coords[listed] - points.coords[s], axis=1)
        )
        agree += agreeing
        pairs += listed_pairs
    return {
        f"recall_at_{k}": mean_or_nan(recalls),
        "order_agreement": agree / pairs if pairs else float("nan"),
        "lists": float(len(recalls)),
    }


def evaluate(index, test, seed: int = 0) -> dict[str, float]:
    """The family's metrics (see the module docstring) of ``index`` on ``test``."""
    if isinstance(test, Ratings):
        return evaluate_ratings(index, test)
    if isinstance(test, TagAssignments):
        return evaluate_tags(index, test)
    if isinstance(test, HeldOutCells):
        return evaluate_attributes(index, test, seed)
    if isinstance(test, NeighborLists):
        return evaluate_neighbors(index, test)
    raise TypeError(f"no held-out metric for {type(test).__name__}")
