"""Per-user hold-outs of ratings: each user's share held out at random or, given timestamps,
their latest. The cron job's gate, ``reproduce topn`` and the settings tuner carve the same way."""

from __future__ import annotations

import numpy as np

from ordrec.trainer.data.types import Ratings

#: How a ratings split picks each user's held-out share: at random, or the latest by time.
SPLITS = ("random", "time")


def _rounded_share(counts: np.ndarray, fraction: float) -> np.ndarray:
    """``round(fraction * n)`` per group, at most ``n - 1`` (something stays for training)."""
    return np.minimum(np.floor(fraction * counts + 0.5).astype(np.int64), np.maximum(counts - 1, 0))


def _within_group_position(
    group: np.ndarray, rng: np.random.Generator, latest_first: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A random order inside each group (or, given times, latest first with ties in random
    order): returns ``order`` (group-major) and each ordered element's position in its group."""
    keys = (rng.random(group.size),) if latest_first is None else (rng.random(group.size), -latest_first)
    order = np.lexsort((*keys, group))
    g = group[order]
    starts = np.r_[0, np.flatnonzero(np.diff(g)) + 1]
    first = np.repeat(starts, np.diff(np.r_[starts, g.size]))
    return order, np.arange(g.size) - first


def split_ratings(
    data: Ratings, fraction: float, seed: int | np.random.Generator, by: str = "random"
) -> tuple[Ratings, Ratings]:
    """Per-user holdout of ``round(fraction * n_u)`` ratings of each user (same id maps):
    random ones (``by="random"``), or the user's latest by timestamp (``by="time"``, ties
    broken at random; data without timestamps is refused). ``seed``: a seed, or a named
    stream of one (a wrapper's own draws)."""
    if by not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {by!r}")
    if by == "time" and data.time is None:
        raise ValueError(
            f"a time split holds out each user's latest ratings, but {data.source or 'the data'}"
            " has no timestamps (a timestamp column, or a MovieLens file); use the random split"
        )
    rng = np.random.default_rng(seed)
    user = np.asarray(data.user, dtype=np.int64)
    counts = np.bincount(user, minlength=data.n_users)
    n_test = _rounded_share(counts, fraction)
    order, pos = _within_group_position(user, rng, data.time if by == "time" else None)
    test = np.zeros(user.size, dtype=bool)
    test[order] = pos < n_test[user[order]]
    return data.subset(~test), data.subset(test)
