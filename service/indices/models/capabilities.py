"""What a serving index offers the item features (SimilarItems, explanations, diversity,
rating distributions), declared by the index itself rather than read off its kind.

A recommender index answers :meth:`~ordrec.service.indices.models.base.RecommenderIndex.item_similarity`
with an :class:`ItemSimilarity` (or None: no item features) and
:meth:`~ordrec.service.indices.models.base.RecommenderIndex.rating_distribution` with a
:class:`RatingDistribution` (or None). Every recommender index keeps its users' training
history (``seen``, ``seen_rated``), which explanations read. A kind registered with one
``kinds.register`` call whose index declares these gets every feature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

# sim(i, j) = sum_d scale_d x_id x_jd: a level-weighted inner product (DCR), bounded for
# diversity as the cosine of the rows times sqrt(scale).
INNER_PRODUCT = "inner_product"
# sim(i, j) = -|x_i - x_j|: a map (COE), bounded for diversity as 1 - d / d_max over the pool.
DISTANCE = "distance"


@dataclass(frozen=True)
class ItemSimilarity:
    """How the items of a version compare with each other.

    ``vectors``: one row per trained item (float32 and C-contiguous for an inner product);
    ``measure``: :data:`INNER_PRODUCT` or :data:`DISTANCE`; ``scale``: the per-column weight
    of the inner product (None: 1) and ``root_scale`` its square root; ``search``: an
    approximate maximum-inner-product index over ``vectors`` (``service/indices/ann.py``)
    that answers weighted queries, or None.
    """

    vectors: np.ndarray
    measure: str = INNER_PRODUCT
    scale: np.ndarray | None = None
    root_scale: np.ndarray | None = None
    search: Any = None

    def __post_init__(self) -> None:
        if self.measure not in (INNER_PRODUCT, DISTANCE):
            raise ValueError(f"unknown similarity measure {self.measure!r}")

    @property
    def is_distance(self) -> bool:
        return self.measure == DISTANCE

    def weighted(self, vectors: np.ndarray) -> np.ndarray:
        """``vectors`` times the inner product's weights: their plain inner product with an
        item's vector is the similarity."""
        return vectors if self.scale is None else vectors * self.scale

    def rooted(self, vectors: np.ndarray) -> np.ndarray:
        """``vectors`` times the square root of the weights: the plain inner product of two
        such rows is the similarity (so their cosine is bounded)."""
        return vectors if self.root_scale is None else vectors * self.root_scale


class RatingDistribution(Protocol):
    """An index that predicts ``P(r = l)`` over its rating levels (``with_distribution``)."""

    rating_levels: np.ndarray

    def distribution(self, user_row: int, item_rows: np.ndarray) -> np.ndarray:
        """``(len(item_rows), len(rating_levels))`` probabilities for a trained user."""
        ...

    def distribution_for(self, vector: np.ndarray, item_rows: np.ndarray) -> np.ndarray:
        """The same for a user given by a fold-in vector."""
        ...

    def distribution_of_factors(self, vector: np.ndarray, item_factors: np.ndarray) -> np.ndarray:
        """The same for items given by their vectors (fresh items)."""
        ...
