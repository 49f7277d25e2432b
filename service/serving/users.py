"""The RPCs about one user's data: RecordInteractions and ForgetUser."""

from __future__ import annotations

import dataclasses
import logging
import time

import redis

from ordrec.service.errors import FailedPrecondition, InvalidArgument, Unavailable
from ordrec.service.live.erasure import erase_user
from ordrec.service.live.seen import Recorded
from ordrec.service.serving import validation
from ordrec.service.serving.state import ServingState
from ordrec.service.storage.artifact import ArtifactError
from ordrec.service.storage.objectstore import RegistryUnavailable
from ordrec.v1 import recommender_pb2 as pb

log = logging.getLogger("ordrec.service")


def record_interactions(
    state: ServingState, request: pb.RecordInteractionsRequest
) -> pb.RecordInteractionsResponse:
    """Keep a user's interactions (nothing of a forgotten user's) for exclusion, fold-in and training."""
    lim = state.limits
    user = validation.stored_id(request.user_id, "user_id", lim)
    validation.stored_ids(request.item_ids, "item_ids", lim, lim.max_ids)
    count = len(request.item_ids) + len(request.interactions)
    if not 1 <= count <= lim.max_ids:
        raise InvalidArgument(
            f"item_ids and interactions must hold between 1 and {lim.max_ids} items together, got {count}"
        )
    interactions = _interactions(state, request, time.time())
    if state.is_forgotten(user):
        return pb.RecordInteractionsResponse(recorded=0, forgotten=True)
    recorded = state.seen.record(user, interactions)
    state.online.observe(user, [i.item for i in interactions])
    return pb.RecordInteractionsResponse(recorded=recorded)


def _interactions(state: ServingState, request: pb.RecordInteractionsRequest, now: float) -> list[Recorded]:
    """The request's items, values checked against the model's rating scale.

    Unknown users and items are kept: they are the next training's new ids.
    """
    lim = state.limits
    valued = any(i.HasField("value") for i in request.interactions)
    # A value is a rating on one model's scale; the event names that model for the trainer.
    model = state.model(request.model, "Recommend") if valued or request.model else None
    name = model.name if model else None
    recorded = [Recorded(item, now, model=name) for item in request.item_ids]
    for position, interaction in enumerate(request.interactions):
        where = f"interactions[{position}]"
        item = validation.stored_id(interaction.item_id, f"{where}.item_id", lim)
        value = interaction.value if interaction.HasField("value") else None
        if value is not None:
            assert model is not None  # resolved above whenever a value is given
            validation.rating(
                value, f"{where} (item {item[:80]!r})", model.name, model.index.artifact.attributes
            )
        ts = interaction.timestamp if interaction.HasField("timestamp") else now
        validation.timestamp(ts, f"{where}.timestamp")
        recorded.append(Recorded(item, ts, value, name))
    return recorded


def forget_user(state: ServingState, request: pb.ForgetUserRequest) -> pb.ForgetUserResponse:
    """Erase a user everywhere the server can reach (``service/live/erasure.py``); ask again when incomplete."""
    user = validation.one_id(request.user_id, "user_id", state.limits)
    reason = validation.note(request.reason, "reason")
    if state.forgotten is None:
        raise FailedPrecondition("this server keeps no FORGOTTEN list")
    try:
        report = erase_user(user, state.store.registry, state.forget_client)
    except redis.RedisError as exc:
        raise Unavailable(f"Redis is unreachable, the erasure is incomplete (ask again): {exc}") from None
    except RegistryUnavailable as exc:
        raise Unavailable(
            f"the registry is unreachable, the erasure is incomplete (ask again): {exc}"
        ) from None
    except (OSError, ArtifactError) as exc:
        raise FailedPrecondition(f"cannot write the registry, the erasure is incomplete: {exc}") from None
    state.forgotten.refresh()
    log.info(
        "forgot user digest=%s reason=%r stream_entries=%d versions_removed=%d pending=%d",
        report.user_digest,
        reason,
        report.stream_entries,
        len(report.versions_removed),
        len(report.versions_pending),
    )
    return pb.ForgetUserResponse(**dataclasses.asdict(report))
