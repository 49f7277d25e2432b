"""Write the issue-45 training shape: sparse ratings over a million items, with planted structure.

    .venv/bin/python benchmarks/sparse_ratings.py /tmp/sparse.csv [--users 100000] [--items 1000000]
        [--per-user 20] [--seed 0]

Every user rates ``--per-user`` distinct items and every item is rated the same number of times
(``users * per_user / items``: twice at the default shape). Users and items fall into groups of
the same proportions (a group's users rate only its items, as a shop's customers keep to a few
departments), and within a group a rating 1..5 comes from a rank-8 taste shared by the group plus
each user's and item's own part and noise, so a model has both which items and how well to learn.
Output: CSV with a ``user,item,rating`` header, ids as strings ``u<n>`` / ``i<n>``, in user order.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

# Users and items per group; the group sizes divide the defaults evenly.
GROUPS = 100
TASTE_RANK = 8
# Shares of the ratings 1..5 (skewed high, as star ratings are).
RATING_SHARES = (0.06, 0.10, 0.22, 0.34, 0.28)


def grouped_pairs(n_users: int, n_items: int, per_user: int, rng: np.random.Generator):
    """(user, item) pairs: each user ``per_user`` distinct items of its group, each item rated
    ``n_users * per_user // n_items`` times. Users and items are group-major (group g holds a
    contiguous block of each)."""
    users_per, items_per = n_users // GROUPS, n_items // GROUPS
    times = users_per * per_user // items_per
    whole = users_per * GROUPS == n_users and items_per * GROUPS == n_items
    if not whole or times * items_per != users_per * per_user or items_per % per_user:
        raise SystemExit(
            f"--users and --items must be multiples of {GROUPS}, users x per-user a multiple of"
            " items, and a group's items a multiple of per-user"
        )
    # Per group: ``times`` permutations of its items dealt in turn, per_user slots to a user; a
    # user's slots lie inside one permutation (items_per is a multiple of per_user), so distinct.
    user, item = [], []
    for group in range(GROUPS):
        slots = np.concatenate([rng.permutation(items_per) for _ in range(times)])
        user.append(group * users_per + np.repeat(np.arange(users_per), per_user))
        item.append(group * items_per + slots)
    return np.concatenate(user), np.concatenate(item)


def planted_values(user: np.ndarray, item: np.ndarray, n_users: int, n_items: int, rng) -> np.ndarray:
    """Ratings 1..5: the group's taste (rank 8) of user and item, their own biases and noise,
    cut at the quantiles of :data:`RATING_SHARES`."""
    taste_u = rng.normal(size=(n_users, TASTE_RANK)).astype(np.float32)
    taste_i = rng.normal(size=(n_items, TASTE_RANK)).astype(np.float32)
    x = np.einsum("nk,nk->n", taste_u[user], taste_i[item]) / np.sqrt(TASTE_RANK)
    x += 0.7 * rng.normal(size=n_items).astype(np.float32)[item]  # item quality
    x += 0.4 * rng.normal(size=n_users).astype(np.float32)[user]  # user leniency
    x += 0.5 * rng.normal(size=user.size).astype(np.float32)
    cuts = np.quantile(x, np.cumsum(RATING_SHARES)[:-1])
    return (np.digitize(x, cuts) + 1).astype(np.int8)


def write_csv(path: str, user: np.ndarray, item: np.ndarray, rating: np.ndarray) -> None:
    """One ``u<user>,i<item>,<rating>`` line per rating, written in blocks."""
    with open(path, "w") as out:
        out.write("user,item,rating\n")
        for start in range(0, user.size, 1 << 18):
            stop = start + (1 << 18)
            lines = [
                f"u{u},i{i},{r}" for u, i, r in zip(user[start:stop], item[start:stop], rating[start:stop])
            ]
            out.write("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path", help="CSV file to write (e.g. under /tmp: never into the repository)")
    p.add_argument("--users", type=int, default=100_000)
    p.add_argument("--items", type=int, default=1_000_000)
    p.add_argument("--per-user", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    user, item = grouped_pairs(args.users, args.items, args.per_user, rng)
    rating = planted_values(user, item, args.users, args.items, rng)
    write_csv(args.path, user, item, rating)
    counts = np.bincount(item, minlength=args.items)
    print(
        f"{user.size:,} ratings by {args.users:,} users over {args.items:,} items (each rated"
        f" {counts.min()}-{counts.max()} times) written to {args.path} in {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
