"""What every model index offers the servicer and the trainer's evaluation.

An index is built once from a verified :class:`~service.storage.artifact.Artifact`
and is then read-only, so a request can use it from any thread without locks.
It works on dense row numbers; the servicer translates external ids.

Three families share this module:

- :class:`RecommenderIndex` (DCR, COE): ``recommend`` with one signature for
  every model, plus ``score_items`` used by evaluation;
- :class:`MapIndex` (COE, SCORE, KNNSCAL): ``neighbors`` and
  ``coordinates`` over named spaces and entity kinds, with KD-trees;
- the RTF index adds ``tags``; the KNNSCAL index adds ``place``.
"""

from __future__ import annotations

import abc
import functools
from typing import ClassVar

import numpy as np
from scipy.spatial import cKDTree

from ordrec.service.indices.models.capabilities import ItemSimilarity, RatingDistribution
from ordrec.service.indices.rules import Eligible, ItemAttributes
from ordrec.service.indices.topk import UserProduct, nearest_brute_force, top_k, top_k_rows
from ordrec.service.storage.artifact import Artifact, ArtifactError
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.mapped import row_blocks

# Maps up to this many points are searched by brute force instead of the KD-tree: about as
# cheap as the query at this size, and it keeps the GIL, which the query releases.
BRUTE_FORCE_MAX_POINTS = 8192

Ranked = tuple[np.ndarray, np.ndarray]  # (rows, scores), best first


class ModelIndex(abc.ABC):
    """Base of every model kind's in-memory index."""

    kind: ClassVar[str]
    rpcs: ClassVar[frozenset[str]]

    def __init__(self, artifact: Artifact):
        self.artifact = artifact

    @classmethod
    def from_artifact(cls, artifact: Artifact) -> ModelIndex:
        if artifact.kind != cls.kind:
            raise ArtifactError(f"{artifact.describe()}: expected kind {cls.kind!r}")
        return cls(artifact)

    @abc.abstractmethod
    def smoke(self) -> None:
        """Answer one query of each supported RPC; raise when the answer is wrong.

        Run after loading and before a version goes live: it warms up numba
        kernels and catches a version that verifies but cannot serve.
        """

    def sizes(self) -> dict[str, int]:
        return {space: len(ids) for space, ids in self.artifact.ids.items()}

    def spaces(self) -> list[str]:
        """Named sub-maps (SCORE aspects); empty for single-map models."""
        return []


def check_finite(name: str, array: np.ndarray, block_bytes: int = 1 << 24) -> None:
    """Fails on any NaN or infinity, reading ``array`` in blocks of rows (``service/storage/mapped.py``),
    so a large memory-mapped array needs no temporary of its own size and is not mapped in."""
    for block in row_blocks(array, block_bytes):
        if not np.all(np.isfinite(block)):
            raise ArtifactError(f"array {name!r} holds NaN or infinite values")


class RecommenderIndex(ModelIndex):
    """Top-N items for a user: the one ``recommend`` signature of every model."""

    rpcs = frozenset({"Recommend", "SimilarItems"})
    # What answers recommend() over the whole catalogue (ListModels, metrics): every
    # kind scores exactly unless it opens an approximate index (service/indices/ann.py).
    search: str = "exact"
    folds_in: ClassVar[bool] = False  # whether fold_in places users the version has not seen
    folds_in_picks: bool = False  # whether fold_in takes interactions without a rating (NaN values)

    def __init__(self, artifact: Artifact):
        super().__init__(artifact)
        self.users: IdMap = artifact.idmap("users")
        self.items: IdMap = artifact.idmap("items")
        self.seen_indptr = np.asarray(artifact.array("seen_indptr"), dtype=np.int64)
        # int64 ndarray once at load (not a memmap slice per request): it indexes score arrays.
        # Read-only: a request hands its user's slice to kernels and must not be able to write it.
        self.seen_indices = np.asarray(artifact.array("seen_indices"), dtype=np.int64).view()
        self.seen_indices.flags.writeable = False
        # The rating of each seen entry (NaN: none), for explanations; None in versions without it.
        self.seen_ratings = (
            np.asarray(artifact.array("seen_ratings"), dtype=np.float32)
            if "seen_ratings" in artifact.arrays
            else None
        )
        if self.seen_ratings is not None and self.seen_ratings.shape != self.seen_indices.shape:
            raise ArtifactError(f"{artifact.describe()}: seen_ratings does not match seen_indices")
        self.popularity = np.asarray(artifact.array("item_popularity"), dtype=np.float32)
        if self.seen_indptr.shape != (len(self.users) + 1,):
            raise ArtifactError(f"{artifact.describe()}: seen_indptr does not match the users")
        if self.popularity.shape != (len(self.items),):
            raise ArtifactError(f"{artifact.describe()}: item_popularity does not match the items")
        # Filters (service/indices/rules.py) are evaluated over these; a version without them has none.
        self.item_attributes = ItemAttributes.from_artifact(artifact, len(self.items))

    # ----------------------------------------------------- model-specific part
    @abc.abstractmethod
    def score_users(self, user_rows: np.ndarray) -> np.ndarray:
        """Scores of every item for each user, shape (len(user_rows), n_items), float32: a new
        array the caller owns (the batched path writes its exclusions into it)."""

    @abc.abstractmethod
    def score_items(self, user_row: int, item_rows: np.ndarray) -> np.ndarray:
        """Scores of the given items for one user (higher is better)."""

    # ------------------------------------------------------------- fold-in
    def fold_in(self, item_rows: np.ndarray, values: np.ndarray) -> np.ndarray | None:
        """The model's representation of a user it has not seen, from their ratings of
        ``item_rows`` with everything else fixed; None for kinds that cannot (they answer
        such users with :meth:`popular`)."""
        return None

    def score_vector(self, vector: np.ndarray, item_rows: np.ndarray | None = None) -> np.ndarray:
        """Scores of every item (or ``item_rows``) for a user given by a :meth:`fold_in` vector."""
        raise NotImplementedError(f"{self.kind} has no fold-in")

    def fold_in_item(self, user_rows: np.ndarray, values: np.ndarray) -> np.ndarray | None:
        """The model's representation of an item it has not seen, from known users' ratings of
        it (``service/live/fresh.py``); None for kinds that cannot."""
        return None

    def place_like_items(self, item_rows: np.ndarray) -> np.ndarray | None:
        """The representation of an item like the trained items ``item_rows`` (a fresh item
        known only by attribute values they share); None for kinds that cannot."""
        return None

    def score_factors(self, vector: np.ndarray, item_factors: np.ndarray) -> np.ndarray:
        """Scores of items given by :meth:`fold_in_item` representations for a user vector."""
        raise NotImplementedError(f"{self.kind} has no item fold-in")

    def user_vector(self, user_row: int) -> np.ndarray:
        """A trained user's representation, as :meth:`fold_in` gives a new one."""
        raise NotImplementedError(f"{self.kind} has no fold-in")

    def recommend_for(
        self,
        vector: np.ndarray,
        n: int,
        *,
        exclude: np.ndarray | None = None,
        candidates: np.ndarray | None = None,
        eligible: Eligible | None = None,
    ) -> Ranked:
        """:meth:`recommend` for a user given by a :meth:`fold_in` vector instead of a row."""
        found = self._search_vector(vector, n, exclude, candidates, eligible)
        if found is not None:
            return found
        candidates = self._eligible_candidates(candidates, eligible)
        if candidates is not None:
            return self._rank_candidates(self.score_vector(vector, candidates), candidates, n, exclude)
        return self._select(self.score_vector(vector), n, exclude, eligible)

    def _search_vector(
        self,
        vector: np.ndarray,
        n: int,
        exclude: np.ndarray | None,
        candidates: np.ndarray | None,
        eligible: Eligible | None,
    ) -> Ranked | None:
        """A kind's own search (an index) for :meth:`recommend_for`; None: score every item."""
        return None

    # ------------------------------------------------------------ capabilities
    def item_similarity(self) -> ItemSimilarity | None:
        """How this version's items compare (SimilarItems, explanations, diversity:
        ``service/indices/models/capabilities.py``); None: the kind offers no item similarity."""
        return None

    def rating_distribution(self) -> RatingDistribution | None:
        """What predicts ``P(r = l)`` for ``with_distribution``; None: the kind predicts none."""
        return None

    # ------------------------------------------------------------ shared part
    def seen(self, user_row: int) -> np.ndarray:
        """Item rows the user had in the training data."""
        return self.seen_indices[self.seen_indptr[user_row] : self.seen_indptr[user_row + 1]]

    def seen_rated(self, user_row: int) -> np.ndarray | None:
        """The user's ratings of :meth:`seen`'s items (NaN where none); None when the version
        kept no ratings."""
        if self.seen_ratings is None:
            return None
        return self.seen_ratings[self.seen_indptr[user_row] : self.seen_indptr[user_row + 1]]

    @functools.cached_property
    def mean_rating(self) -> float:
        """The mean of every kept training rating (NaN when the version kept none): the level a
        rater's own mean is moved to when a fresh item's ratings are read relative to it."""
        if self.seen_ratings is None:
            return float("nan")
        total, count = 0.0, 0
        for block in row_blocks(self.seen_ratings):
            rated = block[np.isfinite(block)]
            total, count = total + float(rated.sum(dtype=np.float64)), count + rated.size
        return total / count if count else float("nan")

    def relative_ratings(self, user_rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Ratings of a fresh item read against each rater's own training ratings: the value
        minus the rater's mean plus :attr:`mean_rating` (a 4 from someone who gives 4 to
        everything counts as an average rating); unchanged where the version kept no ratings
        of the rater."""
        values = np.asarray(values, dtype=np.float64)
        owner, _, rated = self.training_entries(user_rows)
        finite = np.isfinite(rated)
        counts = np.bincount(owner[finite], minlength=values.size)
        sums = np.bincount(owner[finite], weights=rated[finite], minlength=values.size)
        known = (counts > 0) & np.isfinite(self.mean_rating)
        own = np.divide(sums, counts, out=np.zeros(values.size), where=counts > 0)
        return np.where(known, values - own + self.mean_rating, values)

    def training_entries(self, user_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The users' training entries gathered in one pass: for each, its owner (a position in
        ``user_rows``), its item row and its rating (NaN where none or none kept)."""
        rows = np.asarray(user_rows, dtype=np.int64)
        starts = self.seen_indptr[rows]
        lengths = self.seen_indptr[rows + 1] - starts
        owner = np.repeat(np.arange(rows.size), lengths)
        offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        positions = np.repeat(starts, lengths) + offsets
        if self.seen_ratings is None:
            return owner, self.seen_indices[positions], np.full(positions.size, np.nan)
        return owner, self.seen_indices[positions], self.seen_ratings[positions].astype(np.float64)

    def rated_alike(self, user_rows: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each user's training items rated nearest their value, as (owner, item row) pairs:
        all their items for a NaN value (a pick) or when they have no rating kept."""
        owner, items, rated = self.training_entries(user_rows)
        wanted = np.asarray(values, dtype=np.float64)[owner]
        gap = np.where(np.isnan(wanted), 0.0, np.abs(np.where(np.isfinite(rated), rated, np.inf) - wanted))
        nearest = np.full(len(np.asarray(user_rows)), np.inf)
        np.minimum.at(nearest, owner, gap)
        keep = gap == nearest[owner]
        return owner[keep], items[keep]

    def items_rated_alike(self, user_row: int, value: float) -> np.ndarray:
        """One user's :meth:`rated_alike` items."""
        return self.rated_alike(np.array([user_row]), np.array([value]))[1]

    def recommend(
        self,
        user_row: int,
        n: int,
        *,
        exclude: np.ndarray | None = None,
        candidates: np.ndarray | None = None,
        eligible: Eligible | None = None,
    ) -> Ranked:
        """The ``n`` best items for ``user_row``.

        ``exclude`` holds item rows never to return; ``candidates``, when
        given, restricts the ranking to those item rows; ``eligible`` blocks
        hidden and filtered-out items (``service/indices/rules.py``). Masking happens
        before the top-k, so ``n`` items come back whenever ``n`` are eligible.
        """
        candidates = self._eligible_candidates(candidates, eligible)
        if candidates is not None:
            return self._rank_candidates(self.score_items(user_row, candidates), candidates, n, exclude)
        scores = self.score_users(np.array([user_row]))[0]
        return self._select(scores, n, exclude, eligible)

    def recommend_many(
        self,
        user_rows: np.ndarray,
        n: int,
        *,
        excludes: list[np.ndarray | None],
        candidates: np.ndarray | None = None,
        eligible: Eligible | None = None,
    ) -> list[Ranked]:
        """``recommend`` for several users, scored as one matrix product."""
        candidates = self._eligible_candidates(candidates, eligible)
        if candidates is not None:
            return [
                self.recommend(int(u), n, exclude=ex, candidates=candidates)
                for u, ex in zip(user_rows, excludes)
            ]
        scores = self.score_users(np.asarray(user_rows))
        return [self._select(row, n, ex, eligible) for row, ex in zip(scores, excludes)]

    def lone_user_product(self, n: int, eligible: Eligible | None) -> UserProduct | None:
        """The operands with which ``topk.user_top_k`` computes :meth:`recommend`'s answer for one
        user over the whole catalogue (``n`` items, these rules), or None when another way does."""
        return None

    def scoring_work(self) -> int:
        """Multiply-adds of one user's whole-catalogue scoring pass, which a batch shares: 0 for
        kinds that answer each user with a search of their own (nothing to share)."""
        return 0

    def _shares_pass(self, eligible: Eligible | None) -> bool:
        """Whether a user under these rules is ranked from the whole-catalogue scores (which a
        batch computes once), not by a search of its own or over the few eligible rows."""
        return self._eligible_candidates(None, eligible) is None

    def recommend_batch(
        self,
        user_rows: np.ndarray,
        ns: np.ndarray,
        excludes: list[np.ndarray | None],
        eligibles: list[Eligible | None],
    ) -> list[Ranked]:
        """Whole-catalogue :meth:`recommend` for several users, each with its own ``n``,
        exclusions and rules (users of concurrent calls, ``service/serving/batching.py``): one scoring
        pass, exclusions set in one step, one selection kernel per distinct rule set. Every
        answer is what :meth:`recommend` gives that user alone (users whose rules leave few
        items are ranked over those alone, as there)."""
        answers: list[Ranked] = [None] * len(eligibles)  # type: ignore[list-item]
        dense = []
        for b, eligible in enumerate(eligibles):
            if self._shares_pass(eligible):
                dense.append(b)
            else:
                answers[b] = self.recommend(
                    int(user_rows[b]), int(ns[b]), exclude=excludes[b], eligible=eligible
                )
        if not dense:
            return answers
        rows = np.asarray(user_rows, dtype=np.int64)
        every = len(dense) == len(eligibles)
        scores = self.score_users(rows if every else rows[dense])
        exclude_rows_in_place(scores, excludes if every else [excludes[b] for b in dense])
        found = select_by_rules(
            scores, np.asarray(ns)[dense], eligibles if every else [eligibles[b] for b in dense]
        )
        for b, answer in zip(dense, found):
            answers[b] = answer
        return answers

    def popular(
        self,
        n: int,
        *,
        exclude: np.ndarray | None = None,
        candidates: np.ndarray | None = None,
        eligible: Eligible | None = None,
    ) -> Ranked:
        """The cold-start answer: items by training popularity."""
        candidates = self._eligible_candidates(candidates, eligible)
        if candidates is not None:
            return self._rank_candidates(self.popularity[candidates], candidates, n, exclude)
        return self._select(self.popularity.copy(), n, exclude, eligible)

    @staticmethod
    def _eligible_candidates(candidates: np.ndarray | None, eligible: Eligible | None) -> np.ndarray | None:
        """The rows to score one by one, or None to score every item and mask.

        With a selective filter (few eligible items) scoring only those rows
        is cheaper than scoring all and masking most away.
        """
        if eligible is None:
            return candidates
        if candidates is not None:
            return eligible.filter_candidates(candidates)
        return eligible.rows if eligible.sparse else None

    @staticmethod
    def _select(
        scores: np.ndarray, n: int, exclude: np.ndarray | None, eligible: Eligible | None = None
    ) -> Ranked:
        # the mask is applied inside the top-k pass (service/indices/topk.py says why)
        return top_k(scores, n, exclude, None if eligible is None else eligible.blocked)

    @staticmethod
    def _rank_candidates(
        scores: np.ndarray, candidates: np.ndarray, n: int, exclude: np.ndarray | None
    ) -> Ranked:
        scores = np.array(scores, dtype=np.float32)
        if exclude is not None and exclude.size:  # dropped before scoring: nothing to rank
            kept = ~np.isin(candidates, exclude)
            scores, candidates = scores[kept], candidates[kept]
        order, values = top_k(scores, n)
        return candidates[order], values

    def smoke(self) -> None:
        rows, scores = self.recommend(0, min(10, len(self.items)))
        if rows.size == 0 and len(self.items) > self.seen(0).size:
            raise ArtifactError(f"{self.artifact.describe()}: smoke query returned nothing")
        if not np.all(np.isfinite(scores)):
            raise ArtifactError(f"{self.artifact.describe()}: smoke query returned non-finite scores")


def usable_evidence(
    index: RecommenderIndex, rows: np.ndarray, recorded: list[str]
) -> tuple[np.ndarray, np.ndarray] | None:
    """The rows and values a fold-in takes from recorded interactions (``recorded``: the rating
    text of each row; text that is no number is a pick, taken where the kind folds picks in):
    rows the version knows only; None when nothing is usable."""
    values = recorded_values(recorded)
    usable = (rows >= 0) & (np.isfinite(values) | index.folds_in_picks)
    return (rows[usable], values[usable]) if usable.any() else None


def recorded_values(recorded: list[str]) -> np.ndarray:
    """Recorded rating texts as numbers (NaN for a pick: text that is no number)."""
    return np.array([_recorded_value(text) for text in recorded], dtype=np.float64)


def _recorded_value(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def exclude_rows_in_place(scores: np.ndarray, excludes: list[np.ndarray | None]) -> None:
    """Set each row's excluded items to ``-inf`` in place, all rows in one assignment."""
    parts = [(b, ex) for b, ex in enumerate(excludes) if ex is not None and ex.size]
    if parts:
        rows = np.concatenate([np.full(ex.size, b, dtype=np.int64) for b, ex in parts])
        scores[rows, np.concatenate([ex for _, ex in parts])] = -np.inf


def select_by_rules(scores: np.ndarray, ns: np.ndarray, eligibles: list[Eligible | None]) -> list[Ranked]:
    """Each row's top ``ns[b]`` skipping what ``eligibles[b]`` blocks: one kernel call per
    distinct rule set (usually one: the hidden items, or none)."""
    ns = np.asarray(ns, dtype=np.int64)
    by_rules: dict[int, list[int]] = {}
    for b, eligible in enumerate(eligibles):
        by_rules.setdefault(id(eligible), []).append(b)
    answers: list[Ranked] = [None] * len(eligibles)  # type: ignore[list-item]
    for rows in by_rules.values():
        eligible = eligibles[rows[0]]
        picked = scores if len(rows) == len(eligibles) else scores[rows]
        found = top_k_rows(picked, ns[rows], None if eligible is None else eligible.blocked)
        for b, answer in zip(rows, found):
            answers[b] = answer
    return answers


class PointSet:
    """Coordinates of one kind of entity on one map, with a KD-tree over them."""

    def __init__(self, ids: IdMap, coords: np.ndarray):
        coords = np.ascontiguousarray(coords, dtype=np.float64)
        if coords.ndim != 2 or coords.shape[0] != len(ids):
            raise ArtifactError(f"coordinates of shape {coords.shape} do not match {len(ids)} ids")
        check_finite("coordinates", coords)
        self.ids = ids
        self.coords = coords
        self.tree = cKDTree(coords)

    @property
    def dim(self) -> int:
        return self.coords.shape[1]

    def nearest(self, point: np.ndarray, k: int, exclude: np.ndarray | None = None) -> Ranked:
        """The ``k`` nearest rows to ``point`` (skipping ``exclude``) with negative distances as scores.

        Small maps are searched by brute force: it costs about what a KD-tree
        query does, and unlike the query it keeps the GIL, so a busy server
        does not pay for handing the GIL over (``service/indices/topk.py``).
        """
        if len(self.ids) <= BRUTE_FORCE_MAX_POINTS:
            return nearest_brute_force(self.coords, point, k, exclude)
        return self.nearest_kd_tree(point, k, exclude)

    def nearest_kd_tree(self, point: np.ndarray, k: int, exclude: np.ndarray | None = None) -> Ranked:
        """:meth:`nearest` through the KD-tree (the path for large maps)."""
        if exclude is not None and exclude.size:
            exclude = np.asarray(exclude, dtype=np.int64)
            if exclude.size > 1 and np.any(exclude[1:] <= exclude[:-1]):
                exclude = np.unique(exclude)
        else:
            exclude = None
        # Query k plus as many as may be excluded, then drop the excluded by binary search
        # (cheaper than np.isin, which would dominate the call).
        want = min(k + (0 if exclude is None else exclude.size), len(self.ids))
        if k <= 0 or want == 0:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        dist, rows = self.tree.query(point, k=want)
        rows, dist = np.atleast_1d(rows), np.atleast_1d(dist)
        if exclude is not None:
            pos = np.minimum(np.searchsorted(exclude, rows), exclude.size - 1)
            keep = exclude[pos] != rows
            rows, dist = rows[keep], dist[keep]
        return rows[:k].astype(np.int64), (-dist[:k]).astype(np.float32)


class MapIndex(ModelIndex):
    """Models whose answer is a map: ``neighbors`` and ``coordinates``.

    Subclasses fill ``self.maps[space][entity] = PointSet(...)`` where space
    is "" for single-map models and entity is an id-space name ("users",
    "items", "objects", "aspects").
    """

    rpcs = frozenset({"Neighbors", "Coordinates"})
    default_entity: ClassVar[str] = "items"

    def __init__(self, artifact: Artifact):
        super().__init__(artifact)
        self.maps: dict[str, dict[str, PointSet]] = {}

    def point_set(self, space: str, entity: str) -> PointSet:
        """The points of ``entity`` on ``space``'s map; KeyError names what is missing."""
        try:
            by_entity = self.maps[space]
        except KeyError:
            raise KeyError(f"space {space!r}") from None
        try:
            return by_entity[entity]
        except KeyError:
            raise KeyError(f"entity {entity!r} on space {space!r}") from None

    def neighbors(
        self, space: str, from_entity: str, row: int, to_entity: str, k: int, hidden: np.ndarray | None = None
    ) -> Ranked:
        """The ``k`` entities of kind ``to_entity`` nearest to one of kind ``from_entity``.

        ``hidden`` holds target rows never to return (items an operator hid).
        """
        source = self.point_set(space, from_entity)
        target = self.point_set(space, to_entity)
        exclude = np.array([row]) if from_entity == to_entity else None
        if hidden is not None and hidden.size:
            exclude = hidden if exclude is None else np.concatenate([exclude, hidden])
        return target.nearest(source.coords[row], k, exclude)

    def smoke(self) -> None:
        for space, by_entity in self.maps.items():
            for entity, points in by_entity.items():
                if len(points.ids) >= 2:
                    rows, _ = self.neighbors(space, entity, 0, entity, 1)
                    if rows.size != 1 or rows[0] == 0:
                        raise ArtifactError(f"{self.artifact.describe()}: smoke neighbours query failed")
