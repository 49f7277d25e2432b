"""Users with a long history (issue 45 item 3): their exclusions push the answer deep into the
ranking, where the index's breadth and codes were not calibrated; the build measures how many
exclusions the index still answers as well as an ordinary user, and the exact pass answers more."""

from __future__ import annotations

import numpy as np
import pytest

from ordrec.service.indices import ann
from ordrec.service.storage.artifact import SearchIndex

N_ITEMS, DIM, CALIBRATION_USERS = 20_000, 32, 200
# Below MAX_EXCLUDED_FRACTION (the index is asked): a long history, and one the graph answers.
HEAVY = (int(0.045 * N_ITEMS), 100)
STRUCTURES = {"ivf": {"structure": "ivf"}, "hnsw": {"structure": "hnsw", "M": 12, "ef_construction": 40}}


def planted(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(items, users): clustered directions, item norms heavy-tailed inside the unit ball."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(64, DIM))
    items = centers[rng.integers(0, 64, N_ITEMS)] + rng.normal(size=(N_ITEMS, DIM))
    items *= np.clip(rng.beta(2.0, 3.0, (N_ITEMS, 1)) * 1.6, 0.05, 1.0) / np.linalg.norm(
        items, axis=1, keepdims=True
    )
    users = centers[rng.integers(0, 64, 2 * CALIBRATION_USERS)] + 1.5 * rng.normal(
        size=(2 * CALIBRATION_USERS, DIM)
    )
    return items.astype(np.float32), users.astype(np.float32)


@pytest.fixture(scope="module", params=sorted(STRUCTURES))
def built(request, tmp_path_factory):
    """The index calibrated on the first users (their 20 history items excluded, as served),
    opened; the other users are the measured ones."""
    items, users = planted()
    rng = np.random.default_rng(1)
    history = [rng.choice(N_ITEMS, 20, replace=False) for _ in range(CALIBRATION_USERS)]
    params = ann.build_params(STRUCTURES[request.param])
    path = tmp_path_factory.mktemp("heavy") / "items.index"
    library = ann.write_index(items, path, params, ann.Queries(users[:CALIBRATION_USERS], history))
    return (
        ann.AnnSearch.open(SearchIndex(library, params, path=path), items),
        items,
        users[CALIBRATION_USERS:],
    )


def heavy_exclusions(items: np.ndarray, user: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Half the user's own exact best items, half random (as bench_catalog's heavy users)."""
    best = np.argsort(-(items @ user), kind="stable")[: count // 2]
    return np.unique(np.concatenate([best, rng.choice(N_ITEMS, count - best.size, replace=False)]))


def served_or_exact(search: ann.AnnSearch, items: np.ndarray, user: np.ndarray, exclude: np.ndarray):
    """What Recommend returns: the index's answer, or the exact pass's when the index declines."""
    found = search.search(user, 10, exclude)
    if found is not None:
        return found[0]
    scores = items @ user
    scores[exclude] = -np.inf
    return np.argsort(-scores, kind="stable")[:10]


@pytest.mark.parametrize("count", HEAVY)
def test_a_heavy_user_gets_the_recall_an_ordinary_user_gets(built, count):
    search, items, users = built
    rng = np.random.default_rng(2)
    hits = 0
    for user in users[:60]:
        exclude = heavy_exclusions(items, user, count, rng)
        scores = items @ user
        scores[exclude] = -np.inf
        truth = np.argsort(-scores, kind="stable")[:10]
        served = served_or_exact(search, items, user, exclude)
        assert not np.isin(served, exclude).any() and served.size == 10
        hits += np.intersect1d(served, truth).size
    assert hits / (10 * 60) >= search.params["recall_target"]


def test_the_build_records_how_many_exclusions_the_index_answers(built):
    search, items, users = built
    most, covered = search.params["max_excluded"], search.params["calibrated_excluded"]
    assert covered == 20  # the calibration users' histories: their breadth's calibration measured those
    assert most in [covered, *ann.exclusion_ladder(N_ITEMS, covered)] and search.max_excluded == most
    floor = min(search.params["recall_target"], search.params.get("calibrated_recall", 1.0))
    # within one standard error of the floor over the measured users' answers
    users_measured = min(ann.EXCLUSION_CALIBRATION_QUERIES, CALIBRATION_USERS)
    assert search.params["max_excluded_recall"] >= floor - np.sqrt(
        floor * (1 - floor) / (10 * users_measured)
    )
    user = users[0]
    best = np.argsort(-(items @ user), kind="stable")
    assert search.search(user, 10, best[: most + 1]) is None  # one deeper: the exact pass answers
    assert search.search(user, 10, best[:most]) is not None
    # as many exclusions that do not outrank the answer: the index answers them
    assert search.search(user, 10, best[-(most + 1) :]) is not None
    assert f"exact above {most:,} exclusions" in ann.describe_choice(search.library, search.params)
    # a breadth per step up to max_excluded, widening with the depth the exclusions reach
    steps, breadths = zip(*search.params["excluded_breadths"]) if most > covered else ((), ())
    assert list(steps) == [e for e in ann.exclusion_ladder(N_ITEMS, covered) if e <= most]
    assert list(breadths) == sorted(breadths) and all(b >= search.breadth for b in breadths)


def test_an_index_built_without_users_keeps_the_fraction_rule(tmp_path):
    items, _ = planted()
    params = ann.build_params({"structure": "ivf", "nlist": 64, "nprobe": 8})
    path = tmp_path / "items.index"
    library = ann.write_index(items, path, params)
    search = ann.AnnSearch.open(SearchIndex(library, params, path=path), items)
    assert "max_excluded" not in params and search.max_excluded == int(ann.MAX_EXCLUDED_FRACTION * N_ITEMS)


@pytest.mark.parametrize(
    "bad",
    [{"max_excluded": -1}, {"max_excluded": 2.5}, {"max_excluded": True}, {"excluded_breadths": [[16]]}],
)
def test_bad_exclusion_calibration_figures_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        ann.build_params({"structure": "ivf", **bad})


class CountedSearches:
    """The faiss index, its searches counted."""

    def __init__(self, index) -> None:
        self.index, self.searches = index, 0

    def search(self, *args, **kwargs):
        self.searches += 1
        return self.index.search(*args, **kwargs)


def test_a_history_of_the_users_best_goes_to_the_exact_pass_after_one_search(built):
    # Issue 45 item 3: widening a search the history crowds until it finds enough would cost more
    # than the exact pass it ends in.
    search, items, users = built
    counted = CountedSearches(search.index)
    found = type(search)(
        counted, search.n_items, search.breadth, search.params, search.item_vectors, search.item_rows
    )
    best = np.argsort(-(items @ users[1]), kind="stable")[: HEAVY[0]]
    assert found.search(users[1], 10, best) is None
    assert counted.searches == 1
