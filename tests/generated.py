"""Small generated rating sets that many tests share."""

from __future__ import annotations

import numpy as np

from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.data.types import Ratings


def make_ratings(user, item, rating, n_users=None, n_items=None) -> Ratings:
    """Ratings over users ``u0..`` and items ``i0..`` (sizes from the largest index unless given)."""
    user = np.asarray(user, dtype=np.int32)
    item = np.asarray(item, dtype=np.int32)
    return Ratings(
        IdMap([f"u{k}" for k in range(n_users or int(user.max()) + 1)]),
        IdMap([f"i{k}" for k in range(n_items or int(item.max()) + 1)]),
        user,
        item,
        np.asarray(rating, dtype=np.float32),
    )


def random_ratings(rng, n_users=30, n_items=25, per_user=10, levels=5) -> Ratings:
    """``per_user`` distinct items per user, each rated uniformly in ``1..levels`` (``rng`` or a seed)."""
    rng = np.random.default_rng(rng)
    user, item = [], []
    for u in range(n_users):
        item += list(rng.choice(n_items, size=per_user, replace=False))
        user += [u] * per_user
    return make_ratings(user, item, rng.integers(1, levels + 1, size=len(user)), n_users, n_items)


def write_plays(path, n_users=40, n_items=50, per_user=14, seed=0, timestamps=False) -> str:
    """``user,item,plays`` at ``path``: each user plays items of their own half of the catalogue,
    the favourites many times (a geometric number of plays); ``timestamps``: and a ``timestamp``
    column, each user's rows a second apart."""
    rng = np.random.default_rng(seed)
    lines = ["user,item,plays,timestamp\n" if timestamps else "user,item,plays\n"]
    for u in range(n_users):
        items = (u % 2) * (n_items // 2) + rng.choice(n_items // 2, per_user, replace=False)
        when = [f",{1_600_000_000 + k}" if timestamps else "" for k in range(per_user)]
        lines += [f"u{u},i{i},{p}{t}\n" for i, p, t in zip(items, rng.geometric(0.3, per_user), when)]
    path.write_text("".join(lines))
    return str(path)
