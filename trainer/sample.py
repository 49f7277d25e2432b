"""The built-in generated sample data ("embedded default").

Small data sets with *planted* structure, one per input shape, used by
``make demo``, the end-to-end tests and the shared contract tests. Everything
is pure numpy, seeded and fast (well under a second for the defaults), and
every generator can hand back the truth it planted so a test can check that a
model recovers it.

``write_samples(out_dir)`` writes the same data as files in formats the
readers in :mod:`trainer.data.readers` read back unchanged (same ids, same
order, same values); ``ordrec-train sample --out DIR`` calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.data.types import AttributeTable, NeighborLists, Ratings, TagAssignments

# Share of each rating value 1..5 in MovieLens 100K (6.1%, 11.4%, 27.1%, 34.2%,
# 21.2%); the planted thresholds reproduce it so the sample looks like the real
# data the models are tuned on.
_RATING_SHARES = np.array([0.0611, 0.1137, 0.27145, 0.34174, 0.21201])


def _names(prefix: str, n: int) -> list[str]:
    width = max(3, len(str(n)))
    return [f"{prefix}{i + 1:0{width}d}" for i in range(n)]


# ---------------------------------------------------------------- ratings
@dataclass
class PlantedRatings:
    """The truth behind :func:`planted_ratings`, indexed by the rows of the returned ``Ratings``.

    ``latent = user_factors @ item_factors.T`` is the noiseless ordinal score;
    a rating is ``1 + #{thresholds < latent + noise}``.
    """

    user_factors: np.ndarray  # (n_users, rank) float64
    item_factors: np.ndarray  # (n_items, rank) float64
    thresholds: np.ndarray  # (4,) increasing
    noise: float  # standard deviation of the Gaussian noise added to the latent score

    def latent(self) -> np.ndarray:
        """Noiseless scores, ``(n_users, n_items)``; higher means a higher expected rating."""
        return self.user_factors @ self.item_factors.T

    def expected_rating(self) -> np.ndarray:
        """Noiseless ratings 1..5 (thresholded latent scores), ``(n_users, n_items)``."""
        return 1.0 + np.searchsorted(self.thresholds, self.latent(), side="left").astype(np.float64)


def planted_ratings_with_truth(
    n_users: int = 300,
    n_items: int = 200,
    rank: int = 3,
    per_user: tuple[int, int] = (20, 60),
    seed: int = 0,
    noise: float = 0.35,
) -> tuple[Ratings, PlantedRatings]:
    """Ratings 1..5 from a planted low-rank ordinal model, and the truth.

    Users and items get Gaussian factors; the latent score ``u . v`` plus
    Gaussian noise is cut at four thresholds (quantiles of the latent scores
    chosen to match MovieLens' rating shares). Each user rates a random subset
    of ``per_user[0]..per_user[1]`` items, drawn with a Zipf-like popularity
    bias so that popularity baselines have something to find.

    Ids are ``u001``.. and ``i001``..; the id maps are in order of first
    appearance in the returned observation order (user-major), exactly as a
    reader numbers them when it reads the same triples from a file.
    """
    rng = np.random.default_rng(seed)
    lo, hi = per_user
    if not (1 <= lo <= hi <= n_items):
        raise ValueError(f"per_user must satisfy 1 <= lo <= hi <= n_items, got {per_user}")
    # Scale so the latent score has unit variance whatever the rank.
    user_factors = rng.normal(0.0, 1.0, (n_users, rank)) / np.sqrt(rank)
    item_factors = rng.normal(0.0, 1.0, (n_items, rank))
    item_factors[:, 0] += 0.5  # a shared "quality" direction, so item means differ
    latent = user_factors @ item_factors.T
    noise_sd = noise * float(latent.std())
    thresholds = np.quantile(latent, np.cumsum(_RATING_SHARES)[:-1])

    popularity = 1.0 / np.arange(1, n_items + 1) ** 0.8
    popularity = popularity[rng.permutation(n_items)]
    popularity /= popularity.sum()

    users, items = [], []
    for u in range(n_users):
        count = int(rng.integers(lo, hi + 1))
        chosen = rng.choice(n_items, size=count, replace=False, p=popularity)
        users.append(np.full(count, u, dtype=np.int64))
        items.append(chosen)
    user = np.concatenate(users)
    item = np.concatenate(items)
    observed = latent[user, item] + rng.normal(0.0, noise_sd, user.size)
    rating = (1 + np.searchsorted(thresholds, observed, side="left")).astype(np.float32)

    user_names, item_names = _names("u", n_users), _names("i", n_items)
    user_map, user_rows = IdMap.from_values(user_names[u] for u in user)
    item_map, item_rows = IdMap.from_values(item_names[i] for i in item)
    # Reorder the truth to the id maps' rows.
    user_order = np.array([int(x[1:]) - 1 for x in user_map.ids])
    item_order = np.array([int(x[1:]) - 1 for x in item_map.ids])
    data = Ratings(user_map, item_map, user_rows, item_rows, rating, source="sample:ratings")
    truth = PlantedRatings(user_factors[user_order], item_factors[item_order], thresholds, noise_sd)
    return data, truth


def planted_ratings(
    n_users: int = 300,
    n_items: int = 200,
    rank: int = 3,
    per_user: tuple[int, int] = (20, 60),
    seed: int = 0,
) -> Ratings:
    """Ratings 1..5 from a planted low-rank ordinal model (see :func:`planted_ratings_with_truth`)."""
    return planted_ratings_with_truth(n_users, n_items, rank, per_user, seed)[0]


# ---------------------------------------------------------------- tags
@dataclass
class PlantedTags:
    """The truth behind :func:`planted_tags`, indexed by the rows of the returned ``TagAssignments``.

    ``score(u, i, t) = user_factors[u] . tag_user_factors[t] + item_factors[i] . tag_item_factors[t]``
    (a pairwise-interaction low-rank tensor); each post carries its highest
    scoring tags after Gumbel noise.
    """

    user_factors: np.ndarray
    item_factors: np.ndarray
    tag_user_factors: np.ndarray
    tag_item_factors: np.ndarray

    def scores(self, user_row: int, item_row: int) -> np.ndarray:
        """Noiseless score of every tag for the post ``(user_row, item_row)``."""
        return (
            self.tag_user_factors @ self.user_factors[user_row]
            + self.tag_item_factors @ self.item_factors[item_row]
        )


def planted_tags_with_truth(
    n_users: int = 120,
    n_items: int = 150,
    n_tags: int = 50,
    rank: int = 4,
    posts_per_user: tuple[int, int] = (8, 20),
    tags_per_post: tuple[int, int] = (1, 4),
    seed: int = 0,
    noise: float = 0.5,
) -> tuple[TagAssignments, PlantedTags]:
    """Tag assignments from a planted low-rank tensor, and the truth.

    Each user makes ``posts_per_user`` posts on distinct random items; each post
    gets ``tags_per_post`` distinct tags, the top ones of the planted score plus
    Gumbel noise of scale ``noise``. Ids are ``u001``, ``i001``, ``t01``..;
    id maps are in first-appearance order of the returned triples.
    """
    rng = np.random.default_rng(seed)
    uf = rng.normal(0.0, 1.0, (n_users, rank))
    itf = rng.normal(0.0, 1.0, (n_items, rank))
    tuf = rng.normal(0.0, 1.0, (n_tags, rank)) / np.sqrt(rank)
    tif = rng.normal(0.0, 1.0, (n_tags, rank)) / np.sqrt(rank)
    # A few tags are popular overall (as on Last.fm: "rock", "pop"...).
    tif[:, 0] += np.linspace(1.0, -1.0, n_tags)[rng.permutation(n_tags)]
    itf[:, 0] = np.abs(itf[:, 0])

    users: list[int] = []
    items: list[int] = []
    tags: list[int] = []
    for u in range(n_users):
        n_posts = int(rng.integers(posts_per_user[0], posts_per_user[1] + 1))
        for i in rng.choice(n_items, size=min(n_posts, n_items), replace=False):
            score = tuf @ uf[u] + tif @ itf[i] + rng.gumbel(0.0, noise, n_tags)
            count = int(rng.integers(tags_per_post[0], tags_per_post[1] + 1))
            top = np.argsort(-score, kind="stable")[:count]
            users.extend([u] * count)
            items.extend([int(i)] * count)
            tags.extend(int(t) for t in top)

    user_names, item_names, tag_names = _names("u", n_users), _names("i", n_items), _names("t", n_tags)
    user_map, user_rows = IdMap.from_values(user_names[u] for u in users)
    item_map, item_rows = IdMap.from_values(item_names[i] for i in items)
    tag_map, tag_rows = IdMap.from_values(tag_names[t] for t in tags)
    order = lambda ids: np.array([int(x[1:]) - 1 for x in ids])  # noqa: E731
    data = TagAssignments(user_map, item_map, tag_map, user_rows, item_rows, tag_rows, source="sample:tags")
    truth = PlantedTags(
        uf[order(user_map.ids)], itf[order(item_map.ids)], tuf[order(tag_map.ids)], tif[order(tag_map.ids)]
    )
    return data, truth


def planted_tags(
    n_users: int = 120,
    n_items: int = 150,
    n_tags: int = 50,
    rank: int = 4,
    seed: int = 0,
) -> TagAssignments:
    """Tag assignments from a planted low-rank tensor (see :func:`planted_tags_with_truth`)."""
    return planted_tags_with_truth(n_users, n_items, n_tags, rank, seed=seed)[0]


# ---------------------------------------------------------------- attributes
@dataclass
class PlantedAttributes:
    """The truth behind :func:`planted_attributes`.

    ``points`` are the objects' latent 2-D positions, ``group`` their latent
    class; ``related`` lists the pairs of aspects generated from the same latent
    quantity (so a multi-aspect model should place them close together).
    """

    points: np.ndarray  # (n_objects, 2)
    group: np.ndarray  # (n_objects,) int
    related: list[tuple[str, str]]


_ASPECT_NAMES = ["kind", "legs", "size", "weight", "habitat", "colour"]


def _bin(x: np.ndarray, n: int) -> np.ndarray:
    return np.searchsorted(np.quantile(x, np.linspace(0, 1, n + 1)[1:-1]), x)


def planted_attributes_with_truth(
    n_objects: int = 80,
    n_groups: int = 4,
    seed: int = 0,
) -> tuple[AttributeTable, PlantedAttributes]:
    """A Zoo-like table: objects with six categorical aspects, and the truth.

    Objects have a latent class (``kind``) and a latent 2-D position. ``legs``
    follows the class (with 10% noise), so ``kind`` and ``legs`` are related;
    ``size`` and ``weight`` are both bins of the first coordinate (``weight``
    with noise), so they are related too; ``habitat`` bins the second
    coordinate; ``colour`` is independent of everything. Values are strings,
    listed per attribute in sorted order. No value is missing.
    """
    rng = np.random.default_rng(seed)
    group = rng.integers(0, n_groups, n_objects)
    centres = rng.normal(0.0, 2.0, (n_groups, 2))
    points = centres[group] + rng.normal(0.0, 1.0, (n_objects, 2))
    legs_of_group = np.array([0, 2, 4, 6, 8, 5])[np.arange(n_groups) % 6]
    legs = legs_of_group[group]
    flip = rng.random(n_objects) < 0.1
    legs[flip] = rng.choice(legs_of_group, int(flip.sum()))
    size = _bin(points[:, 0], 3)
    weight = _bin(points[:, 0] + rng.normal(0.0, 0.5, n_objects), 3)
    habitat = _bin(points[:, 1], 3)
    colour = rng.integers(0, 3, n_objects)

    columns = [
        np.array([f"k{g + 1}" for g in group]),
        np.array([str(x) for x in legs]),
        np.array(["small", "medium", "large"])[size],
        np.array(["light", "average", "heavy"])[weight],
        np.array(["land", "shore", "water"])[habitat],
        np.array(["brown", "green", "grey"])[colour],
    ]
    values, codes = [], np.empty((n_objects, len(columns)), dtype=np.int32)
    for a, column in enumerate(columns):
        names, inverse = np.unique(column, return_inverse=True)
        values.append([str(x) for x in names])
        codes[:, a] = inverse
    objects = IdMap(_names("o", n_objects))
    data = AttributeTable(objects, list(_ASPECT_NAMES), codes, values, source="sample:attributes")
    truth = PlantedAttributes(points, group, [("kind", "legs"), ("size", "weight")])
    return data, truth


def planted_attributes(n_objects: int = 80, n_groups: int = 4, seed: int = 0) -> AttributeTable:
    """A Zoo-like attribute table with correlated aspects (see :func:`planted_attributes_with_truth`)."""
    return planted_attributes_with_truth(n_objects, n_groups, seed)[0]


# ---------------------------------------------------------------- neighbours
def planted_neighbors(
    n: int = 300, k: int = 10, seed: int = 0, n_clusters: int = 5
) -> tuple[NeighborLists, np.ndarray]:
    """Points in 2-D Gaussian clusters and their exact directed k-NN lists.

    Returns the lists (ranks 1..k, rank 1 nearest, ties broken by row; labels
    = cluster) and the ``(n, 2)`` points, which are the truth a KNNSCAL
    embedding should recover up to similarity. Vertex ids are ``v001``..; the
    id map is in first-appearance order of the (source, neighbor) columns, as
    the reader numbers it.
    """
    if not 1 <= k < n:
        raise ValueError(f"need 1 <= k < n, got k={k}, n={n}")
    rng = np.random.default_rng(seed)
    cluster = rng.integers(0, n_clusters, n)
    centres = rng.normal(0.0, 4.0, (n_clusters, 2))
    points = centres[cluster] + rng.normal(0.0, 1.0, (n, 2))
    d2 = ((points[:, None, :] - points[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    nearest = np.argsort(d2, axis=1, kind="stable")[:, :k]
    source = np.repeat(np.arange(n), k)
    neighbor = nearest.ravel()
    rank = np.tile(np.arange(1, k + 1, dtype=np.int32), n)

    names = _names("v", n)
    interleaved = np.empty(2 * source.size, dtype=np.int64)
    interleaved[0::2], interleaved[1::2] = source, neighbor
    vertices, rows = IdMap.from_values(names[v] for v in interleaved)
    order = np.array([int(x[1:]) - 1 for x in vertices.ids])
    data = NeighborLists(
        vertices,
        rows[0::2].copy(),
        rows[1::2].copy(),
        rank,
        path="sample:neighbors",
        labels=cluster[order].astype(np.int32),
    )
    return data, points[order]


# ---------------------------------------------------------------- files
def write_samples(out_dir, seed: int = 0) -> list[Path]:
    """Write the sample data sets to ``out_dir`` and return the paths written.

    - ``ratings.data``: MovieLens 100K ``u.data`` format (tab, ``user item rating timestamp``, no header)
    - ``items.txt``: ``item id|title`` lines (display names for maps)
    - ``tags.csv``: ``user,item,tag`` with header
    - ``attributes.csv``: ``object,<aspect>...`` with header
    - ``neighbors.csv``: ``source,neighbor,rank`` with header
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    ratings = planted_ratings(seed=seed)
    rng = np.random.default_rng(seed)
    stamps = 880_000_000 + np.sort(rng.integers(0, 10_000_000, len(ratings)))
    users, items = ratings.users.ids, ratings.items.ids
    path = out / "ratings.data"
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for u, i, r, s in zip(ratings.user, ratings.item, ratings.rating, stamps):
            f.write(f"{users[u]}\t{items[i]}\t{int(r)}\t{s}\n")
    paths.append(path)

    path = out / "items.txt"
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for external in items:
            f.write(f"{external}|Sample item {int(external[1:])}\n")
    paths.append(path)

    tags = planted_tags(seed=seed)
    path = out / "tags.csv"
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("user,item,tag\n")
        for u, i, t in zip(tags.user, tags.item, tags.tag):
            f.write(f"{tags.users.ids[u]},{tags.items.ids[i]},{tags.tags.ids[t]}\n")
    paths.append(path)

    table = planted_attributes(seed=seed)
    path = out / "attributes.csv"
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(",".join(["object", *table.attributes]) + "\n")
        for o, external in enumerate(table.objects.ids):
            cells = [table.values[a][c] if c >= 0 else "?" for a, c in enumerate(table.codes[o])]
            f.write(",".join([external, *cells]) + "\n")
    paths.append(path)

    lists, _ = planted_neighbors(seed=seed)
    path = out / "neighbors.csv"
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("source,neighbor,rank\n")
        ids = lists.vertices.ids
        for s, nb, r in zip(lists.source, lists.neighbor, lists.rank):
            f.write(f"{ids[s]},{ids[nb]},{r}\n")
    paths.append(path)
    return paths
