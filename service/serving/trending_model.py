"""The trending list served as a model of its own name (``service/live/trending.py``): every
user gets the trending items, minus exclusions, recorded items and hidden ones."""

from __future__ import annotations

import redis

from ordrec.service.errors import Unavailable
from ordrec.service.live.trending import Trending, check_model_request
from ordrec.service.serving import validation
from ordrec.service.serving.state import ServingState
from ordrec.service.storage.hidden_items import ALL_MODELS
from ordrec.v1 import recommender_pb2 as pb


def serves_trending(state: ServingState) -> bool:
    """Whether the server offers the trending model: it has a trending list and a name for it
    that no registry model takes."""
    return (
        state.trending is not None
        and bool(state.trending_name)
        and state.trending_name not in state.store.snapshot()
    )


def is_trending_model(state: ServingState, name: str) -> bool:
    """Whether ``name`` asks for the trending model (a registry model of that name wins)."""
    return serves_trending(state) and name == state.trending_name


def recommend_trending(state: ServingState, request: pb.RecommendRequest) -> pb.RecommendResponse:
    """Every user gets the trending items, minus exclusions, recorded items and hidden ones."""
    lim = state.limits
    user_ids = validation.id_list(request.user_ids, "user_ids", lim, lim.max_batch, min_count=1)
    n = validation.bounded(request.n, "n", 1, lim.max_n)
    candidates = set(
        validation.id_list(request.candidate_item_ids, "candidate_item_ids", lim, lim.max_candidates)
    )
    excluded = set(validation.id_list(request.exclude_item_ids, "exclude_item_ids", lim, lim.max_candidates))
    check_model_request(request)
    exclude_seen = request.exclude_seen if request.HasField("exclude_seen") else True
    excluded |= state.hidden.sets().get(ALL_MODELS, set()) if state.hidden else set()
    recent, _, degraded = state.seen.lookup(user_ids if exclude_seen else [])
    current = trending_now(state)
    reply = pb.RecommendResponse(model=state.trending_name, seen_filter_degraded=degraded and exclude_seen)
    for uid in user_ids:
        result = reply.results.add(user_id=uid)
        recorded = set(recent.get(uid, ()))
        for item, score in zip(current.item_ids, current.scores.tolist()):
            if len(result.items) == n:
                break
            if item not in excluded and item not in recorded and (not candidates or item in candidates):
                result.items.add(id=item, score=score)
    return reply


def trending_now(state: ServingState) -> Trending:
    """The trending list; UNAVAILABLE when it is empty because Redis cannot be read (an
    empty list must mean that nothing is trending, not that nobody could look)."""
    assert state.trending is not None  # is_trending_model checked it
    current = state.trending.current()
    if not len(current) and not _trending_reachable(state):
        raise Unavailable("the trending model reads Redis, which is unreachable; retry later")
    return current


def _trending_reachable(state: ServingState) -> bool:
    """Whether trending's Redis answers (asked only when the list is empty: a ping)."""
    index = state.trending
    if index is None or index.client is None or not index.healthy():
        return False
    try:
        index.client.ping()
    except redis.RedisError:
        return False
    return True
