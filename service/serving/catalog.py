"""ListModels (what is served, with its sizes, metrics and split) and Tags (RTF's tag
recommendations)."""

from __future__ import annotations

from ordrec.service.serving import validation
from ordrec.service.serving.replies import add_scored
from ordrec.service.serving.state import ServingState
from ordrec.service.serving.store import LoadedModel
from ordrec.service.serving.trending_model import serves_trending
from ordrec.v1 import recommender_pb2 as pb

_FALLBACK = {
    "none": pb.FALLBACK_NONE,
    "popular_global": pb.FALLBACK_POPULAR_GLOBAL,
    "popular_item": pb.FALLBACK_POPULAR_ITEM,
    "popular_user": pb.FALLBACK_POPULAR_USER,
}


def tags(state: ServingState, request: pb.TagsRequest) -> pb.TagsResponse:
    """The tags a user would give an item, or the fallback's when the model cannot tell."""
    lim = state.limits
    model = state.model(request.model, "Tags")
    user = validation.one_id(request.user_id, "user_id", lim)
    model = state.store.for_user(model, user)
    index = model.index
    item = validation.one_id(request.item_id, "item_id", lim)
    n = validation.bounded(request.n, "n", 1, lim.max_n)
    user_row = -1 if state.is_forgotten(user) else index.users.row(user)
    rows, scores, fallback = index.tags(
        user_row, index.items.row(item), n, exclude_own=request.exclude_own_tags
    )
    if fallback != "none":
        state.metrics.fallbacks.labels(model.name, "Tags", fallback).inc()
    reply = pb.TagsResponse(fallback=_FALLBACK[fallback], model=model.name, model_version=model.version)
    add_scored(reply.tags, index.artifact.idmap("tags"), rows, scores)
    for tag, label in zip(reply.tags, index.tag_names(rows) or ()):
        tag.label = label
    return reply


def list_models(state: ServingState) -> pb.ListModelsResponse:
    """Every served model (and the trending one, where the server offers it)."""
    reply = pb.ListModelsResponse()
    for name, model in sorted(state.store.snapshot().items()):
        _add_model(state, reply, name, model)
    if serves_trending(state):
        reply.models.add(name=state.trending_name, kind="trending", rpcs=["Recommend"])
    return reply


def _add_model(state: ServingState, reply: pb.ListModelsResponse, name: str, model: LoadedModel) -> None:
    index = model.index
    info = reply.models.add(
        name=name,
        kind=model.kind,
        version=model.version,
        created_at=model.created_at,
        loaded_at=model.loaded_at,
        reason=model.reason,
        rpcs=sorted(index.rpcs),
        spaces=index.spaces(),
        index=getattr(index, "search", ""),
    )
    candidate = state.store.candidate(name)
    if candidate is not None:
        info.candidate_version, info.candidate_share = candidate.model.version, candidate.share
    info.sizes.update(index.sizes())
    overlay = state.fresh_overlay(index) if "Recommend" in index.rpcs else None
    if overlay is not None:  # items served before the next training (service/live/fresh.py)
        info.sizes["fresh_items"] = len(overlay)
    info.metrics.update({k: float(x) for k, x in index.artifact.metrics.items()})
