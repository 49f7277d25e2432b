"""The hidden-items RPCs: HideItems, UnhideItems and ListHidden (``service/live/hidden.py``)."""

from __future__ import annotations

import bisect
import logging

from ordrec.service.errors import FailedPrecondition, NotFound
from ordrec.service.live.hidden import HiddenState
from ordrec.service.serving import validation
from ordrec.service.serving.state import ServingState
from ordrec.service.storage.hidden_items import ALL_MODELS
from ordrec.v1 import recommender_pb2 as pb

log = logging.getLogger("ordrec.service")


def _scope(state: ServingState, name: str) -> str:
    """The scope a request names: every model, or one the registry has."""
    if name in ("", ALL_MODELS):
        return ALL_MODELS
    name = validation.model_name(name)
    if not state.store.registry.has_model(name):
        raise NotFound(f"no model {name!r} in the registry")
    return name


def _hidden_state(state: ServingState) -> HiddenState:
    if state.hidden is None:
        raise FailedPrecondition("this server keeps no hidden items")
    return state.hidden


def _unknown(state: ServingState, scope: str, ids: list[str]) -> int:
    """How many ids no served version of the scope knows (kept hidden all the same)."""
    maps = [
        m.index.items
        for n, m in state.store.snapshot().items()
        if hasattr(m.index, "items") and scope in (ALL_MODELS, n)
    ]
    return sum(1 for i in ids if not any(i in items for items in maps))


def change_hidden(state: ServingState, request: pb.HideItemsRequest, hide: bool) -> pb.HideItemsResponse:
    """Hide (or unhide) items for one model or every model."""
    lim = state.limits
    hidden = _hidden_state(state)
    scope = _scope(state, request.model)
    ids = validation.stored_ids(request.item_ids, "item_ids", lim, lim.max_candidates, min_count=1)
    changed = hidden.change(scope, ids, hide, mirror=state.hidden_mirror)
    total = len(hidden.sets().get(scope, ()))
    log.info("%s %d item(s) for %s (%d changed)", "hid" if hide else "unhid", len(ids), scope, changed)
    return pb.HideItemsResponse(
        changed=changed, unknown=_unknown(state, scope, ids) if hide else 0, total=total, model=scope
    )


def list_hidden(state: ServingState, request: pb.ListHiddenRequest) -> pb.ListHiddenResponse:
    """The hidden ids of each scope asked, a page from ``after_item_id`` on."""
    hidden = _hidden_state(state)
    sets = hidden.sets()
    if request.model in ("", ALL_MODELS):
        scopes = sorted(sets) if not request.model else [ALL_MODELS]
    else:
        scopes = [ALL_MODELS, _scope(state, request.model)]
    reply = pb.ListHiddenResponse(rules_stale=hidden.stale)
    after = request.after_item_id
    for scope in scopes:
        ids = sorted(sets.get(scope, ()))
        start = bisect.bisect_right(ids, after) if after else 0
        reply.scopes.add(model=scope, item_ids=ids[start : start + state.limits.max_ids], count=len(ids))
    return reply
