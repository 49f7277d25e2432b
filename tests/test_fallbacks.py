"""The unknown user's answer: trending topped up to n from training popularity, every rule
honoured by both sources, each item flagged with its source (against a brute-force answer)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.indices.rules import Eligible
from ordrec.service.live.trending import Trending
from ordrec.service.serving.fallbacks import ColdStart, topped_up
from ordrec.v1 import recommender_pb2 as pb
from tests.test_item_features import DCR

N_ITEMS = len(DCR.items)


class FixedTrending:
    """Stands in for the trending reader: a fixed list of item ids (some the version lacks)."""

    def __init__(self, ids: list[str]):
        self.trending = Trending(ids, np.arange(len(ids), 0, -1).astype(np.float32))

    def current_rows(self, items):
        return self.trending, items.rows(self.trending.item_ids)


def brute_force(trending: list[str], n: int, allowed: set[int]) -> list[tuple[int, int]]:
    """(row, source) the slow way: allowed trending rows in order, then the most popular others."""
    rows = [DCR.items.row(i) for i in trending]
    chosen = [(r, pb.FALLBACK_TRENDING) for r in rows if r in allowed][:n]
    taken = {r for r, _ in chosen}
    by_popularity = sorted(allowed - taken, key=lambda r: (-DCR.popularity[r], r))
    return chosen + [(r, pb.FALLBACK_POPULAR_GLOBAL) for r in by_popularity[: n - len(chosen)]]


@settings(max_examples=150, deadline=None)
@given(
    trending=st.lists(st.integers(0, N_ITEMS + 5), unique=True, max_size=15),
    n=st.integers(1, N_ITEMS + 5),
    exclude=st.lists(st.integers(0, N_ITEMS - 1), max_size=20),
    candidates=st.none() | st.lists(st.integers(0, N_ITEMS - 1), unique=True, min_size=1, max_size=30),
    blocked_share=st.sampled_from([0.0, 0.3, 0.9]),
    seed=st.integers(0, 2**31),
)
def test_trending_is_topped_up_to_n_under_every_rule(trending, n, exclude, candidates, blocked_share, seed):
    ids = [f"i{k}" if k < N_ITEMS else f"unknown-{k}" for k in trending]
    blocked = np.random.default_rng(seed).random(N_ITEMS) < blocked_share
    eligible = Eligible(blocked) if blocked.any() else None
    cand = None if candidates is None else np.array(sorted(candidates), dtype=np.int64)
    excluded = np.array(exclude, dtype=np.int64) if exclude else None
    got = ColdStart(FixedTrending(ids), DCR, cand, eligible).answer(n, excluded)  # type: ignore[arg-type]
    allowed = set(range(N_ITEMS)) - set(exclude) - set(np.flatnonzero(blocked).tolist())
    if candidates is not None:
        allowed &= set(candidates)
    want = brute_force(ids, n, allowed)
    assert len(got.rows) == min(n, len(allowed))  # n whenever n items are eligible
    source_of = got.source_of()
    assert [(r, source_of[r]) for r in got.rows.tolist()] == want  # the popularities have no ties
    assert got.first_source() == (want[0][1] if want else pb.FALLBACK_POPULAR_GLOBAL)


def test_without_trending_the_list_is_popularity_and_sources_are_asked_only_for_what_is_missing():
    asked = []

    def source(flag, rows):
        def answer(k, exclude):
            asked.append((flag, k, None if exclude is None else sorted(exclude.tolist())))
            return rows[:k], np.ones(min(k, rows.size), np.float32)

        return flag, answer

    got = topped_up(5, np.array([9]), [source(1, np.array([3, 4])), source(2, np.array([7, 8, 6, 5]))])
    assert got.rows.tolist() == [3, 4, 7, 8, 6] and got.spans == ((1, 2), (2, 3))
    assert asked == [(1, 5, [9]), (2, 3, [3, 4, 9])]
    alone = ColdStart(None, DCR, None, None).answer(4, None)
    assert alone.spans == ((pb.FALLBACK_POPULAR_GLOBAL, 4),)
    assert alone.rows.tolist() == DCR.popular(4)[0].tolist()
