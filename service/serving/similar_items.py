"""The SimilarItems RPC: the basket's rows (trained or fresh), the pool of items most similar
in the model's own geometry (``service/indices/similar.py``, fresh items merged by
``service/live/fresh.py``), re-ranked for diversity like Recommend's (``stages.py``)."""

from __future__ import annotations

import numpy as np

from ordrec.service.errors import NotFound
from ordrec.service.indices.similar import MAX_BASKET
from ordrec.service.live.fresh import FreshOverlay, FreshRules, similar_with_fresh
from ordrec.service.serving import validation
from ordrec.service.serving.replies import add_ranked, merged_rows
from ordrec.service.serving.stages import check_cap, diversified, diversify_settings
from ordrec.service.serving.state import ServingState
from ordrec.service.serving.store import LoadedModel
from ordrec.v1 import recommender_pb2 as pb


def _basket(
    state: ServingState, model: LoadedModel, fresh: FreshOverlay | None, query_ids: list[str], n: int
) -> tuple[np.ndarray, list[str]]:
    """The basket's rows (-1 for unknown ids) and its unknown ids; refuses a reply that could
    not fit and a basket of nothing known."""
    items = model.index.items
    rows = items.rows(query_ids) if fresh is None else merged_rows(items, fresh, query_ids)
    unknown = [i for i, r in zip(query_ids, rows) if r < 0]
    id_bytes = items.max_bytes if fresh is None else max(items.max_bytes, fresh.max_bytes)
    validation.check_reply_fits(
        n * validation.scored_id_bytes(id_bytes) + sum(len(u.encode("utf-8")) + 8 for u in unknown),
        f"n={n}",
        state.limits,
    )
    if len(unknown) == len(query_ids):
        raise NotFound(f"none of item_ids is known to model {model.name!r} (first: {query_ids[0][:80]!r})")
    return rows, unknown


def similar_items(state: ServingState, request: pb.SimilarItemsRequest) -> pb.SimilarItemsResponse:
    """The ``n`` items most similar to the basket, never one of it, an excluded or a hidden one."""
    lim = state.limits
    model = state.model(request.model, "SimilarItems")
    index = model.index
    query_ids = validation.id_list(request.item_ids, "item_ids", lim, MAX_BASKET, min_count=1)
    n = validation.bounded(request.n, "n", 1, lim.max_n)
    exclude_ids = validation.id_list(request.exclude_item_ids, "exclude_item_ids", lim, lim.max_candidates)
    settings = diversify_settings(request)
    check_cap(index, settings)
    fresh = state.fresh_overlay(index)
    rows, unknown = _basket(state, model, fresh, query_ids, n)
    excluded = index.items.rows(exclude_ids) if exclude_ids else None
    pool = similar_with_fresh(
        index,
        fresh,
        rows[rows >= 0],
        settings.pool_size(n),
        exclude=None if excluded is None else excluded[excluded >= 0],
        eligible=state.eligible(model, request.filter),
        rules=FreshRules((*state.hidden_ids(model), exclude_ids), None, request.filter),
    )
    found, scores = diversified(index, pool, n, settings, fresh)
    reply = pb.SimilarItemsResponse(
        model=model.name,
        model_version=model.version,
        rules_stale=state.rules_stale(),
        unknown_item_ids=unknown,
    )
    add_ranked(reply.items, index.items, fresh, found, scores)
    return reply
