"""Planted data for fresh items (``service/live/fresh.py``), shared by ``tests/test_fresh.py`` and
``benchmarks/bench_fresh.py``.

Users fall into groups; each group likes its own block of items (rated 4-5) and dislikes a
few others (1-2). The last ``new_per_group`` items of every block are withheld from training:
they are the fresh items. About half of the known users' interactions with them are recorded
after training (what RecordInteractions would write), the rest are held out: a good answer
serves each user the fresh items of their own group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.data.types import Ratings

Event = tuple[str, str, float]  # (user id, item id, rating)


@dataclass(frozen=True)
class PlantedFresh:
    """Training ratings without the fresh items, the recorded and the held-out interactions
    with them, and each fresh item's and user's group."""

    training: Ratings
    fresh_ids: list[str]
    recorded: list[Event]
    held_out: list[Event]
    group_of: dict[str, int]  # user id or item id -> group

    def recorded_by(self, user: str) -> list[str]:
        return [item for u, item, _ in self.recorded if u == user]

    def liked_held_out(self) -> list[Event]:
        """The held-out interactions a recommender should catch: ratings of 4 and 5."""
        return [event for event in self.held_out if event[2] >= 4]


def planted_fresh(
    seed: int = 0, groups: int = 3, users_per_group: int = 100, block: int = 50, new_per_group: int = 10
) -> PlantedFresh:
    rng = np.random.default_rng(seed)
    n_items = groups * block
    fresh = {g * block + k for g in range(groups) for k in range(block - new_per_group, block)}
    group_of = {f"i{i}": i // block for i in range(n_items)}
    users, items, values = [], [], []
    recorded: list[Event] = []
    held_out: list[Event] = []
    for u in range(groups * users_per_group):
        g, user = u // users_per_group, f"u{u}"
        group_of[user] = g
        own = np.arange(g * block, (g + 1) * block)
        liked = rng.choice(own, 16, replace=False)
        disliked = rng.choice(np.setdiff1d(np.arange(n_items), own), 6, replace=False)
        ratings = np.concatenate([rng.integers(4, 6, 16), rng.integers(1, 3, 6)]).astype(np.float32)
        for item, value in zip(np.concatenate([liked, disliked]).tolist(), ratings.tolist()):
            if item in fresh:
                (recorded if rng.random() < 0.5 else held_out).append((user, f"i{item}", value))
            else:
                users.append(u)
                items.append(item)
                values.append(value)
    trained = sorted(set(range(n_items)) - fresh)
    column = {item: k for k, item in enumerate(trained)}
    training = Ratings(
        IdMap([f"u{u}" for u in range(groups * users_per_group)]),
        IdMap([f"i{i}" for i in trained]),
        np.array(users, dtype=np.int32),
        np.array([column[i] for i in items], dtype=np.int32),
        np.array(values, dtype=np.float32),
    )
    return PlantedFresh(training, [f"i{i}" for i in sorted(fresh)], recorded, held_out, group_of)


def stream_entries(events: list[Event]) -> list[dict[str, str]]:
    """Events as the fields RecordInteractions writes to the events stream."""
    return [{"user": user, "item": item, "value": repr(float(value))} for user, item, value in events]


def caught(planted: PlantedFresh, recommend: Callable[[str, int], list[str]], n: int) -> float:
    """The share of the liked held-out interactions with fresh items whose item is in the
    user's top ``n`` (``recommend(user, n)``: item ids, the user's recorded items excluded)."""
    events = planted.liked_held_out()
    answers: dict[str, set[str]] = {}
    hits = 0
    for user, item, _ in events:
        if user not in answers:
            answers[user] = set(recommend(user, n))
        hits += item in answers[user]
    return hits / len(events)


@dataclass(frozen=True)
class PlantedTastes:
    """Training ratings of taste groups that also share a liking for a few blockbusters (what
    makes every user's factors alike in one direction, popularity), and each user's group."""

    training: Ratings
    group_of: dict[str, int]  # user id -> group
    block_of: dict[str, int]  # trained item id -> its group's block (-1: a blockbuster)

    def users_of(self, group: int) -> list[str]:
        return [user for user, g in self.group_of.items() if g == group]


def planted_tastes(
    seed: int = 0, groups: int = 3, users_per_group: int = 100, block: int = 40, blockbusters: int = 10
) -> PlantedTastes:
    """Each user rates 12 items of their group's block 4-5, 8 of the blockbusters 4-5 and 5
    items of other blocks 1-2."""
    rng = np.random.default_rng(seed)
    n_items = groups * block + blockbusters
    users, items, values = [], [], []
    group_of = {}
    for u in range(groups * users_per_group):
        g = u // users_per_group
        group_of[f"u{u}"] = g
        own = rng.choice(np.arange(g * block, (g + 1) * block), 12, replace=False)
        popular = rng.choice(np.arange(groups * block, n_items), 8, replace=False)
        others = np.setdiff1d(np.arange(groups * block), np.arange(g * block, (g + 1) * block))
        disliked = rng.choice(others, 5, replace=False)
        rated = np.concatenate([own, popular, disliked])
        users += [u] * rated.size
        items += rated.tolist()
        values += np.concatenate([rng.integers(4, 6, 20), rng.integers(1, 3, 5)]).tolist()
    block_of = {f"i{i}": (i // block if i < groups * block else -1) for i in range(n_items)}
    training = Ratings(
        IdMap(list(group_of)),
        IdMap([f"i{i}" for i in range(n_items)]),
        np.array(users, dtype=np.int32),
        np.array(items, dtype=np.int32),
        np.array(values, dtype=np.float32),
    )
    return PlantedTastes(training, group_of, block_of)
