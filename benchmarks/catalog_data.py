"""Generated catalogues with planted structure, shared by ``bench_catalog.py`` and its library comparison.

A trained DCR's factors are not isotropic noise: items fall into groups that
the same users like, the levels of one item agree (an item good enough for
"at least 4" is usually good enough for "at least 3"), and well-known items
sit near the unit ball's boundary while rarely rated ones stay near the
origin. Approximate search is much easier on noise than on such data (or
much harder, depending on the library), so recall is measured on this.
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from ordrec.service.storage.artifact import Artifact  # noqa: E402
from ordrec.service.storage.idmap import IdMap  # noqa: E402

# Six rating values: five learned levels, x rank 40 = the 200 folded dimensions of the issue.
LEVELS = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


def _unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def planted_factors(
    n: int, centers: np.ndarray, rng: np.random.Generator, spread: float, popularity_norm: bool
) -> np.ndarray:
    """``n`` rows of per-level factors drawn around the given cluster centres.

    Parameters
    ----------
    n : int
        Rows to draw.
    centers : ndarray, shape (clusters, levels, rank)
        Unit-norm per-level cluster centres.
    rng : numpy.random.Generator
    spread : float
        Noise norm relative to the centre (larger: looser clusters).
    popularity_norm : bool
        Item-like norms: a heavy tail of rows at the ball's boundary, most well inside.

    Returns
    -------
    ndarray, shape (n, levels * rank), float32
        Each level's block lies inside the unit ball, as DCR projects it.
    """
    clusters, levels, rank = centers.shape
    cluster = rng.integers(0, clusters, n)
    out = np.empty((n, levels, rank), np.float32)
    # Chunks keep the float64 temporaries small at a million rows.
    for start in range(0, n, 65536):
        stop = min(n, start + 65536)
        noise = rng.normal(size=(stop - start, levels, rank)) * (spread / np.sqrt(rank))
        block = _unit_rows(centers[cluster[start:stop]] + noise)
        if popularity_norm:
            norm = np.clip(rng.beta(2.0, 3.0, stop - start) * 1.6, 0.05, 1.0)
        else:
            norm = rng.uniform(0.6, 1.0, stop - start)
        out[start:stop] = block * norm[:, None, None]
    return out.reshape(n, levels * rank)


def planted_centers(clusters: int, levels: int, rank: int, rng: np.random.Generator) -> np.ndarray:
    """Cluster centres whose levels agree: one base direction per cluster, perturbed per level."""
    base = rng.normal(size=(clusters, 1, rank))
    return _unit_rows(base + 0.5 * rng.normal(size=(clusters, levels, rank)))


def planted_catalog(
    n_items: int, n_users: int, rank: int = 40, levels: int = 5, clusters: int = 512, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(user_factors, item_factors) of a DCR-shaped model with planted clusters, float32."""
    rng = np.random.default_rng(seed)
    centers = planted_centers(clusters, levels, rank, rng)
    items = planted_factors(n_items, centers, rng, spread=1.2, popularity_norm=True)
    users = planted_factors(n_users, centers, rng, spread=1.5, popularity_norm=False)
    return users, items


def folded_queries(users: np.ndarray, levels: np.ndarray = LEVELS) -> np.ndarray:
    """User factors with DCR's level weights folded in (what the serving index searches with)."""
    from ordrec.service.indices.models.dcr import level_weights

    c, _ = level_weights(levels, "linear")
    rank = users.shape[1] // c.size
    return np.ascontiguousarray(users * np.repeat(c, rank).astype(np.float32)[None, :])


def catalog_artifact(
    n_items: int, n_users: int, rank: int = 40, seen_per_user: int = 20, seed: int = 0
) -> Artifact:
    """A DCR artifact over a planted catalogue (6 rating values, so 5 learned levels x ``rank``)."""
    users, items = planted_catalog(n_items, n_users, rank=rank, seed=seed)
    rng = np.random.default_rng(seed + 1)
    seen = np.sort(rng.integers(0, n_items, (n_users, seen_per_user)), axis=1)
    seen_indptr = np.arange(0, n_users * seen_per_user + 1, seen_per_user, dtype=np.int64)
    return Artifact(
        kind="dcr",
        arrays={
            "user_factors": users,
            "item_factors": items,
            "seen_indptr": seen_indptr,
            "seen_indices": seen.reshape(-1).astype(np.int32),
            "item_popularity": rng.random(n_items, dtype=np.float32),
        },
        ids={
            "users": IdMap([f"u{i}" for i in range(n_users)]),
            "items": IdMap([f"i{i}" for i in range(n_items)]),
        },
        attributes={"levels": LEVELS.tolist(), "relevance": "linear", "rank": rank, "pairwise": False},
    )
