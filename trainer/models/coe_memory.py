"""The predicted peak memory of a COE fit and its artifact (``ModelKind.memory``).

The terms are the arrays ``COE.fit`` allocates (``coe.py``): the per-rating values and their
two sorted CSRs (by user, by item), the rated-over-unrated draw's sorted seen items, the
float64 coordinates and their float32 copies, with the larger of the phases' temporaries.
"""

from __future__ import annotations

from ordrec.trainer.data.types import Ratings
from ordrec.trainer.models.coe import COE
from ordrec.trainer.models.memory import KERNEL_RUNTIME, MARGIN, MemoryPrediction, kernel_threads_reserve

# Bytes a rating of each phase's temporaries: the per-user z-scores (float64 columns and
# masks), a lexsort (its int64 order and keys), the unrated draw's owner columns and masks.
NORMALISE_PER_RATING = 48
SORT_PER_RATING = 24
UNRATED_PER_RATING = 56


def predicted_memory(estimator: COE, data: Ratings) -> MemoryPrediction:
    """The peak memory of ``estimator.fit(data)`` and its artifact, above what the process holds."""
    n, users, items = len(data), data.n_users, data.n_items
    k = int(estimator.n_components)
    coords = (users + items) * k * 8
    # Both CSRs: int64 pointers, int32 members, float32 values; per-group counts and their sums.
    triples = 8 * (users + items + 2) + 16 * n + 16 * (users + items + 2)
    unrated = float(estimator.unrated_share) > 0
    phases = {
        "the triples": 4 * n + triples + max(NORMALISE_PER_RATING, SORT_PER_RATING) * n,
        "the unrated draw": triples + (UNRATED_PER_RATING * n if unrated else 0),
        "the fit": triples + 4 * n + coords + coords // 2,
        "writing the artifact": coords // 2 + 8 * (users + 1) + (4 + SORT_PER_RATING) * n,
    }
    largest = max(phases, key=lambda name: phases[name])
    peak = int(phases[largest] * (1 + MARGIN)) + KERNEL_RUNTIME
    return MemoryPrediction(
        peak=peak,
        shape=f"{users:,} users x {items:,} items, {n:,} ratings, {k:,} dimensions",
        remedies="use fewer dimensions (n_components)",
        parts={"the coordinates": coords, f"other arrays ({largest})": peak - coords},
        reserved=kernel_threads_reserve(),
        phases=phases,
    )
