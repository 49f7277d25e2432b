"""The map RPCs (COE, SCORE, KNNSCAL): Neighbors, Coordinates and Place."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ordrec.service.errors import InvalidArgument, NotFound
from ordrec.service.serving import validation
from ordrec.service.serving.replies import add_scored, rows_or_not_found
from ordrec.service.serving.state import ServingState
from ordrec.service.serving.store import LoadedModel
from ordrec.v1 import recommender_pb2 as pb

_ENTITY_SPACE: dict[int, str] = {
    pb.ENTITY_ITEM: "items",
    pb.ENTITY_USER: "users",
    pb.ENTITY_ASPECT: "aspects",
}
_SPACE_ENTITY = {
    "items": pb.ENTITY_ITEM,
    "users": pb.ENTITY_USER,
    "aspects": pb.ENTITY_ASPECT,
    "objects": pb.ENTITY_ITEM,
}


def _space(model: LoadedModel, space: str) -> str:
    spaces = model.index.spaces()
    if space and space not in spaces:
        listed = ", ".join(spaces[:20]) or "none (leave it empty)"
        raise NotFound(f"model {model.name!r} has no space {space[:80]!r}; spaces: {listed}")
    if not space and spaces:
        raise InvalidArgument(f"model {model.name!r} needs a 'space': one of {', '.join(spaces[:20])}")
    return space


def _entity(model: LoadedModel, space: str, entity: int) -> str:
    index = model.index
    if entity and entity not in _ENTITY_SPACE:
        raise InvalidArgument(f"entity {entity} is not a known Entity value")
    name = _ENTITY_SPACE[entity] if entity else index.default_entity
    by_entity = index.maps.get(space, {})
    if name == "items" and "items" not in by_entity:
        name = index.default_entity  # ITEM means "object" on object maps
    if name not in by_entity:
        raise InvalidArgument(
            f"model {model.name!r} has no {pb.Entity.Name(entity) if entity else name} entities on this map"
            f" (it has {', '.join(sorted(by_entity))})"
        )
    return name


def neighbors(state: ServingState, request: pb.NeighborsRequest) -> pb.NeighborsResponse:
    """The ``k`` entities nearest to one on a map (hidden items and forgotten users never)."""
    lim = state.limits
    model = state.model(request.model, "Neighbors")
    index = model.index
    query_id = validation.one_id(request.id, "id", lim)
    k = validation.bounded(request.k, "k", 1, lim.max_k)
    # Aspects live on the sphere (space ""), whatever aspect map was named.
    space = "" if request.from_entity == pb.ENTITY_ASPECT else _space(model, request.space)
    source = _entity(model, space, request.from_entity)
    target = _entity(model, space, request.to_entity or request.from_entity)
    target_ids = index.maps[space][target].ids
    validation.check_reply_fits(k * validation.scored_id_bytes(target_ids.max_bytes), f"k={k}", lim)
    source_ids = index.maps[space][source].ids
    row = source_ids.row(query_id)
    if row < 0 or (source == "users" and state.is_forgotten(query_id)):
        raise NotFound(f"unknown {source[:-1]} id {query_id[:80]!r}")
    hidden = None
    if state.hidden and target in ("items", "objects"):  # hidden items never come back as neighbours
        hidden = state.hidden.hidden_rows(model.name, target_ids)
    if target == "users" and state.forgotten is not None and state.forgotten.digests():
        hidden = state.forgotten.rows(target_ids)  # nor forgotten users
    rows, scores = index.neighbors(space, source, row, target, k, hidden=hidden)
    reply = pb.NeighborsResponse(
        model=model.name, model_version=model.version, rules_stale=state.rules_stale()
    )
    add_scored(reply.neighbors, index.maps[space][target].ids, rows, scores)
    return reply


def coordinates(
    state: ServingState, request: pb.CoordinatesRequest, context
) -> Iterator[pb.CoordinatesResponse]:
    """Points of a map, a page per reply, until the client goes away."""
    lim = state.limits
    model = state.model(request.model, "Coordinates")
    space = "" if request.entity == pb.ENTITY_ASPECT else _space(model, request.space)
    entity = _entity(model, space, request.entity)
    points = model.index.maps[space][entity]
    ids = validation.id_list(request.ids, "ids", lim, lim.max_ids)
    page = validation.bounded(request.page_size or 1000, "page_size", 1, lim.max_page_size)
    validation.check_reply_fits(
        page * validation.scored_id_bytes(points.ids.max_bytes, points.dim),
        f"page_size={page} at {points.dim} dimensions",
        lim,
    )
    rows = rows_or_not_found(points.ids, ids, f"{entity} ids") if ids else np.arange(len(points.ids))
    if entity == "users" and state.forgotten is not None and state.forgotten.digests():
        rows = rows[~np.isin(rows, state.forgotten.rows(points.ids))]  # forgotten users are not on the map
    wire_entity = _SPACE_ENTITY[entity]
    for start in range(0, max(rows.size, 1), page):
        if not context.is_active():  # the client went away or its deadline passed
            return
        chunk = rows[start : start + page]
        reply = pb.CoordinatesResponse(dim=points.dim, model=model.name, model_version=model.version)
        for r, coords in zip(chunk, points.coords[chunk]):
            reply.points.add(id=points.ids.external(int(r)), entity=wire_entity, coords=coords.tolist())
        yield reply


def place(state: ServingState, request: pb.PlaceRequest) -> pb.PlaceResponse:
    """A new point placed on the map from its ranked neighbours, with its own nearest ``k``."""
    lim = state.limits
    model = state.model(request.model, "Place")
    index = model.index
    ranked = validation.id_list(
        request.ranked_neighbor_ids, "ranked_neighbor_ids", lim, lim.max_ids, min_count=1
    )
    if len(set(ranked)) != len(ranked):
        raise InvalidArgument("ranked_neighbor_ids repeats an id")
    k = validation.bounded(request.k, "k", 0, lim.max_k)
    points = index.maps[""][index.default_entity]
    validation.check_reply_fits(k * validation.scored_id_bytes(points.ids.max_bytes), f"k={k}", lim)
    rows = rows_or_not_found(points.ids, ranked, "neighbour ids")
    coords = index.place(rows)
    reply = pb.PlaceResponse(
        coords=np.asarray(coords).tolist(), model=model.name, model_version=model.version
    )
    if k:
        near, scores = points.nearest(np.asarray(coords, dtype=np.float64), k)
        add_scored(reply.neighbors, points.ids, near, scores)
    return reply
