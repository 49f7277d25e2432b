"""The predicted peak memory of a DCR fit, its wrappers and its artifact (``ModelKind.memory``).

Every term is an array the fit allocates (``dcr.py``, ``dcr_kernels.py``), sized from the
data's shape: users, items, ratings, rating levels, dimensions, the factors' type, the unrated
share and order, and the wrappers that fit again on hold-outs. Arrays alive at the same time
add up; phases that follow one another (the CSR's sort, the epochs, the hold-outs, the
artifact) take the larger. The factors are counted whole: the user factors are mapped for
every user, and ``RLIMIT_AS`` counts the mapping even where no page is written.
docs/dcr.md "Memory before a fit" compares the prediction with measured peaks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ordrec.service.indices.ann import ANN_MIN_ITEMS
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.models.dcr import DCR, DCRVariants, EarlyStoppedDCR, PairwiseDCR, ValidatedRefinement
from ordrec.trainer.models.dcr_kernels import LEVEL_CHUNK, ROW_BLOCK, distinct_values, level_dtype
from ordrec.trainer.models.memory import KERNEL_RUNTIME, MARGIN, MemoryPrediction, kernel_threads_reserve
from ordrec.trainer.models.ranking import SCORE_BATCH

# A score in a scoring batch on the validation hold-outs: float32 and the top-k selection's
# int64 position.
SCORE_BYTES = 4 + 8
# The approximate item index a catalogue of ANN_MIN_ITEMS or more publishes: its float32 copy
# of the item factors plus the HNSW graph's links (32 neighbours a node at 4 B, both layers' lists).
ANN_LINKS_PER_ITEM = 2 * 32 * 4


@dataclass(frozen=True)
class DCRShape:
    """What sizes a DCR fit's arrays."""

    users: int
    items: int
    values: int  # rating values (distinct in the data, or the given levels)
    learned: int  # learned levels: the values plus "not rated" when top-N-aware, less one
    rank: int
    factor_bytes: int  # 4 (float32) or 8 (float64) while training
    share: float  # unrated_share
    by_user: bool  # variant order "user" (the default)
    marginal: bool  # init="marginal"

    @classmethod
    def of(cls, model: DCR, data: Ratings, variants: DCRVariants) -> DCRShape:
        """The shape of ``model`` fitted on ``data`` (its levels counted as the fit counts them)."""
        levels = model.levels
        if levels is None:
            values = distinct_values(data.rating).size
        else:
            values = (
                len([x for x in levels.split(",") if x.strip()]) if isinstance(levels, str) else len(levels)
            )
        share = float(model.unrated_share)
        return cls(
            users=data.n_users,
            items=data.n_items,
            values=values,
            learned=max(values + (share > 0) - 1, 1),
            rank=int(model.n_components),
            factor_bytes=np.dtype(model.solver_settings().dtype).itemsize,
            share=share,
            by_user=variants.order == "user",
            marginal=model.init == "marginal",
        )

    @property
    def level_bytes(self) -> int:
        return level_dtype(self.values).itemsize

    def factors(self, itemsize: int | None = None) -> int:
        """Both factor arrays, ``(users + items) x levels x rank``."""
        return (self.users + self.items) * self.learned * self.rank * (itemsize or self.factor_bytes)

    def index_bytes(self, ratings: int) -> int:
        """An index array over ``ratings`` rows (int32 below 2**31)."""
        return 4 if ratings < 2**31 else 8

    def draw_length(self, ratings: int) -> int:
        """Entries of an epoch's training CSR: the ratings and the unrated draws' capacity."""
        return ratings + math.ceil(self.share * ratings) + (self.users if self.share > 0 else 0)


def held_after_fit(shape: DCRShape, ratings: int) -> int:
    """What a fitted model holds: the factors, the seen CSR, the item counts and fallback."""
    return shape.factors() + _seen_csr(shape, ratings) + shape.items * (8 + 4)


def _seen_csr(shape: DCRShape, ratings: int) -> int:
    """``seen_indptr_`` (int64), ``seen_indices_`` (int32) and ``seen_levels_``."""
    return 8 * (shape.users + 1) + (4 + shape.level_bytes) * ratings


def _epoch_arrays(shape: DCRShape, ratings: int) -> int:
    """What the epochs add (and the pairwise passes, one after the other): the training CSR of
    a draw with unrated items (or the shuffled copy of the seen CSR), the visiting order, the
    users' unrated counts, the item weights."""
    length = shape.draw_length(ratings)
    if shape.share > 0:
        arrays = 8 * (shape.users + 1) + (4 + shape.level_bytes) * length + 8 * shape.users + 16 * shape.items
    else:
        arrays = (4 + shape.level_bytes) * ratings if shape.by_user else 0
    # "user": a permutation of the active users; "random": each entry's user, a permutation of
    # the entries and its int64 copy, or the pairwise draw's owner column.
    return arrays + (8 * shape.users if shape.by_user else 24 * length)


def _initial_arrays(shape: DCRShape) -> int:
    """The start's temporaries: a block of float64 normal draws; ``init="marginal"`` squares
    every user factor once (a factor-sized temporary of the user array, the larger one)."""
    block = 8 * min(ROW_BLOCK, max(shape.users, shape.items)) * shape.learned * shape.rank
    squares = max(shape.users, shape.items) * shape.learned * shape.rank * shape.factor_bytes
    return block + (squares if shape.marginal else 0)


def fit_peak(shape: DCRShape, ratings: int, snapshots: bool = False) -> int:
    """The peak of one ``DCR.fit`` (and an in-place pairwise refinement) on ``ratings`` ratings.

    Held throughout: each rating's level, the seen CSR, the item counts. Before the factors
    exist, the CSR's counting sort (two index arrays) and the level chunks; then the factors
    with the larger of the start's temporaries and the epochs' arrays. ``snapshots``: a fit
    with a validation set keeps a second set of factors (each level's best epoch).
    """
    held = shape.level_bytes * ratings + _seen_csr(shape, ratings) + shape.items * (8 + 8 + 4)
    sort = 2 * shape.index_bytes(ratings) * ratings + 64 * min(ratings, LEVEL_CHUNK)
    factors = shape.factors() * (2 if snapshots else 1)
    return held + max(sort, factors + max(_initial_arrays(shape), _epoch_arrays(shape, ratings)))


def artifact_bytes(shape: DCRShape, ratings: int, ann_min_items: int) -> int:
    """The artifact ``to_artifact`` writes beside the model: float32 factors, the seen CSR
    (int64 pointers, int32 items) and, for a large catalogue, the approximate item index."""
    arrays = shape.factors(4) + 8 * (shape.users + 1) + 4 * ratings
    per_item = shape.learned * shape.rank * 4 + ANN_LINKS_PER_ITEM
    return arrays + (shape.items * per_item if shape.items >= ann_min_items else 0)


def _validated_folds(shape: DCRShape, ratings: int, wrapper: ValidatedRefinement) -> int:
    """A hold-out of :class:`ValidatedRefinement`: its kept and held-out row indices, the
    fit's part of the ratings (12 B a rating), then the fold's fit or its scoring (a batch of
    at most SCORE_BATCH scores, fewer when fewer users are scored)."""
    fit_part = ratings - int(float(wrapper.fraction) * ratings)
    rows = shape.index_bytes(ratings) * ratings + 12 * fit_part
    scored = shape.users if wrapper.max_users is None else min(shape.users, int(wrapper.max_users))
    scoring = SCORE_BYTES * min(SCORE_BATCH, scored * shape.items)
    return rows + max(fit_peak(shape, fit_part), held_after_fit(shape, fit_part) + scoring)


def _early_stopping_folds(shape: DCRShape, ratings: int, fraction: float) -> int:
    """A hold-out of :class:`EarlyStoppedDCR`: both parts of the ratings, the validation
    part's int64 rows and levels, a fit that snapshots every level's best factors."""
    held_out = int(fraction * ratings)
    validation = (16 + shape.level_bytes) * held_out
    return 12 * ratings + validation + fit_peak(shape, ratings - held_out, snapshots=True)


def _unwrapped(estimator) -> list:
    """``estimator`` and the estimators it wraps, outermost first, down to the DCR."""
    chain = [estimator]
    while not isinstance(chain[-1], DCR):
        chain.append(chain[-1].estimator)
    return chain


def predicted_memory(estimator, data: Ratings, ann_min_items: int = ANN_MIN_ITEMS) -> MemoryPrediction:
    """The peak memory of fitting ``estimator`` (a DCR or its wrappers, as ``configure`` builds
    them) on ``data`` and writing its artifact, above what the process holds before the fit."""
    chain = _unwrapped(estimator)
    model: DCR = chain[-1]
    shape = DCRShape.of(model, data, DCRVariants())
    n = len(data)
    phases = {
        "the fit": fit_peak(shape, n),
        "writing the artifact": held_after_fit(shape, n) + artifact_bytes(shape, n, ann_min_items),
    }
    for wrapper in chain[:-1]:
        if isinstance(wrapper, ValidatedRefinement):
            phases["the refinement's hold-outs"] = _validated_folds(shape, n, wrapper)
        elif isinstance(wrapper, EarlyStoppedDCR):
            phases["the early stopping's hold-outs"] = _early_stopping_folds(
                shape, n, float(wrapper.fraction)
            )
        else:
            assert isinstance(wrapper, PairwiseDCR)  # refines in place: the fit's own arrays
    largest = max(phases, key=lambda name: phases[name])
    peak = int(phases[largest] * (1 + MARGIN)) + KERNEL_RUNTIME
    return MemoryPrediction(
        peak=peak,
        shape=(
            f"{shape.users:,} users x {shape.items:,} items, {n:,} ratings, {shape.learned:,} learned"
            f" levels x {shape.rank:,} dimensions ({shape.values:,} rating values)"
        ),
        remedies=(
            "use fewer dimensions (n_components) or fewer rating levels (a rating column of a few"
            " distinct values), or fit on a cluster (--cluster, a job's cluster key)"
        ),
        parts={
            "the factors": shape.factors(),
            f"other arrays ({largest})": peak - shape.factors(),
        },
        reserved=kernel_threads_reserve(),
        phases=phases,
    )
