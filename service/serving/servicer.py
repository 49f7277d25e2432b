"""The gRPC handlers: validate, look up, score, build the reply.

Handlers stay thin; the scoring lives in the model indices. Errors become
status codes in one place, :func:`rpc`: a :class:`ServiceError` carries its
code and a message for the caller; anything else is logged with its stack
and answered INTERNAL without one.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

import grpc
import numpy as np
import redis
from google.protobuf.message import DecodeError
from prometheus_client import Counter

from ordrec.service.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    ServiceError,
    Unavailable,
)
from ordrec.service.indices.diversity import Diversify, rerank, settings_from_request
from ordrec.service.indices.explain import Explained, explain_count, explained, liked_history
from ordrec.service.indices.models.base import recorded_values, usable_evidence
from ordrec.service.indices.rules import MAX_FILTER_CHARS, Eligible, FilterError, combine
from ordrec.service.indices.similar import MAX_BASKET, item_vectors
from ordrec.service.live.erasure import erase_user
from ordrec.service.live.forgotten import ForgetfulSeen, ForgottenUsers
from ordrec.service.live.fresh import (
    FreshItems,
    FreshOverlay,
    FreshRules,
    fresh_top,
    merge_fresh,
    similar_with_fresh,
)
from ordrec.service.live.hidden import HiddenState
from ordrec.service.live.online import NoOnlineEvaluation
from ordrec.service.live.seen import Recorded, SeenStore
from ordrec.service.live.trending import Trending, TrendingIndex, check_model_request
from ordrec.service.metrics import Metrics
from ordrec.service.serving import validation as v
from ordrec.service.serving.batching import RecommendBatcher
from ordrec.service.serving.fallbacks import ColdStart, Sourced
from ordrec.service.serving.store import LoadedModel, ModelStore
from ordrec.service.serving.wire import WirePlan, encode_reply, scored_reply
from ordrec.service.storage.artifact import ArtifactError
from ordrec.service.storage.hidden_items import ALL_MODELS
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.objectstore import RegistryUnavailable
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc

log = logging.getLogger("ordrec.service")

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
_FALLBACK = {
    "none": pb.FALLBACK_NONE,
    "popular_global": pb.FALLBACK_POPULAR_GLOBAL,
    "popular_item": pb.FALLBACK_POPULAR_ITEM,
    "popular_user": pb.FALLBACK_POPULAR_USER,
}


_FALLBACK_LABEL = {pb.FALLBACK_TRENDING: "trending", pb.FALLBACK_POPULAR_GLOBAL: "popular_global"}


class Undecodable:
    """Stands in for a request whose bytes are not a valid message of its type."""

    def __init__(self, type_name: str, error: str):
        self.type_name, self.error = type_name, error


def lenient_deserializer(message_class) -> Callable[[bytes], object]:
    """``FromString`` that returns :class:`Undecodable` instead of raising, so a
    garbled request is answered INVALID_ARGUMENT by :func:`rpc` rather than
    grpcio's generic INTERNAL."""

    def deserialize(data: bytes):
        try:
            return message_class.FromString(data)
        except DecodeError as exc:
            return Undecodable(message_class.DESCRIPTOR.full_name, str(exc))

    return deserialize


def _check_request(request, context) -> None:
    if isinstance(request, Undecodable):
        raise InvalidArgument(f"request is not a valid {request.type_name} message ({request.error})")
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise DeadlineExceeded("the call's deadline passed before it was handled")


def _fitting(reply, limits: v.Limits):
    """``reply``, or ResourceExhausted when it is over the send limit: the status then
    comes from here (and is counted), not from grpcio failing the send afterwards."""
    size = len(reply) if isinstance(reply, bytes) else reply.ByteSize()
    if size > limits.max_message_bytes:
        raise ResourceExhausted(
            f"the reply is {size:,} bytes, over the {limits.max_message_bytes:,}-byte"
            " message limit: ask for less"
        )
    return reply


def rpc(method: Callable) -> Callable:
    """Map exceptions to status codes: the only place that does."""

    @functools.wraps(method)
    def unary(self, request, context):
        try:
            _check_request(request, context)
            return _fitting(method(self, request, context), self.limits)
        except ServiceError as exc:
            context.abort(exc.code, str(exc))
        except Exception:  # noqa: BLE001
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, "internal error (logged on the server)")

    @functools.wraps(method)
    def stream(self, request, context):
        try:
            _check_request(request, context)
            for reply in method(self, request, context):
                yield _fitting(reply, self.limits)
        except ServiceError as exc:
            context.abort(exc.code, str(exc))
        except Exception:  # noqa: BLE001
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, "internal error (logged on the server)")

    return stream if inspect.isgeneratorfunction(method) else unary


def _add_scored(container, ids: IdMap, rows: np.ndarray, scores: np.ndarray) -> None:
    """Append (id, score) entries to a repeated ScoredId field in place (no
    temporary messages to copy: this runs on every request)."""
    add, externals = container.add, ids.ids
    for row, score in zip(rows.tolist(), scores.tolist()):
        add(id=externals[row], score=score)


_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_ROWS.flags.writeable = False  # shared by every call: nothing may write to it


def _known_rows(ids: IdMap, externals: list[str]) -> np.ndarray:
    """Rows of the ids the map knows (unknown ones left out)."""
    rows = ids.rows(externals)
    return rows[rows >= 0]


_Value = TypeVar("_Value")


class _PerVersion(Generic[_Value]):
    """Values built once per loaded model version (a metric's child, a reply plan): a few
    versions per model are served at a time, so old versions' entries go in bulk."""

    def __init__(self, build: Callable[[LoadedModel], _Value]):
        self.build = build
        self._values: dict[tuple[str, str, int], _Value] = {}

    def get(self, model: LoadedModel) -> _Value:
        key = (model.name, model.version, id(model.index))
        value = self._values.get(key)
        if value is None:
            value = self.build(model)
            values = dict(self._values) if len(self._values) < 64 else {}
            values[key] = value
            self._values = values  # replaced whole, like the store's mapping
        return value


class _PlainVersion(NamedTuple):
    """One version's share of every plain reply: how to write it, the users counter's child,
    and whether the largest plain reply fits the message limit (else each is checked)."""

    plan: WirePlan
    users: Counter
    always_fits: bool
    batches: bool  # its known users are scored through the batcher (``_batches``)


def _plain(request: pb.RecommendRequest) -> bool:
    """Whether a Recommend request asks for nothing but ``n`` items (and ``exclude_seen``):
    no candidates, exclusions, filter, distribution, explanations or diversity."""
    return not (
        request.candidate_item_ids
        or request.exclude_item_ids
        or request.filter
        or request.with_distribution
        or request.explain
        or request.diversity
        or request.HasField("max_per_attribute")
    )


def _diversify_settings(request) -> Diversify:
    """The request's ``diversity`` and ``max_per_attribute``, checked."""
    cap = request.max_per_attribute
    return settings_from_request(
        request.diversity, cap.attribute, cap.max, request.HasField("max_per_attribute")
    )


def _diversified(index, pool, n: int, settings: Diversify, fresh: FreshOverlay | None = None):
    """``n`` of the pool re-ranked for diversity; a cap on an unknown attribute is INVALID_ARGUMENT."""
    try:
        if fresh is None:
            return rerank(index, pool, n, settings)
        return rerank(index, pool, n, settings, fresh.factors, fresh.attributes.values)
    except FilterError as exc:
        raise InvalidArgument(str(exc)) from None


def _check_cap(index, settings: Diversify) -> None:
    """Refuse, before any work, a ``max_per_attribute`` on an attribute the version has not got."""
    cap = settings.cap
    if cap is not None and cap.attribute not in index.item_attributes.columns:
        raise InvalidArgument(
            f"max_per_attribute.attribute: no item attribute {cap.attribute[:80]!r}"
            f" (this version has: {index.item_attributes.describe()})"
        )


def _explaining_history(
    index, user_row: int, recorded: dict[str, str] | None
) -> tuple[np.ndarray, dict[int, float]]:
    """The history items that may explain a user's results (``explain.liked_history``: the
    training items, or a folded-in user's recorded ones), and row -> the user's rating of each."""
    if recorded is None:
        rows, ratings = liked_history(index.seen(user_row), index.seen_rated(user_row))
    else:
        all_rows = index.items.rows(list(recorded))
        known = all_rows >= 0
        rows, ratings = liked_history(all_rows[known], recorded_values(list(recorded.values()))[known])
    return rows, ({} if ratings is None else dict(zip(rows.tolist(), ratings.tolist())))


def _add_scored_fresh(
    container, ids: IdMap, fresh: FreshOverlay, rows: np.ndarray, scores: np.ndarray
) -> None:
    """:func:`_add_scored` for answers holding fresh items (rows past the version's), flagged."""
    add = container.add
    for row, external, score in zip(rows.tolist(), fresh.external(rows, ids.ids), scores.tolist()):
        add(id=external, score=score, fresh=row >= fresh.base)


def _add_explanations(items, ids: IdMap, reasons: Explained, rating_of: dict[int, float]) -> None:
    """Attach each result's reasons (``service/indices/explain.py``) as ``ScoredId.explanations``,
    each with the user's rating of it where ``rating_of`` has one."""
    externals = ids.ids
    for item, rows, shares, sims in zip(
        items, reasons.rows.tolist(), reasons.shares.tolist(), reasons.similarities.tolist()
    ):
        add = item.explanations.add
        for row, share, sim in zip(rows, shares, sims):
            if row >= 0:
                why = add(id=externals[row], share=share, similarity=sim)
                rating = rating_of.get(row)
                if rating is not None and np.isfinite(rating):
                    why.rating = rating


def _add_sourced(container, ids: IdMap, rows: np.ndarray, scores: np.ndarray, sourced: Sourced) -> None:
    """:func:`_add_scored` for a fallback answer, each item flagged with its source (trending or
    popularity; looked up by row, since re-ranking may have reordered them)."""
    add, externals = container.add, ids.ids
    if len(sourced.spans) == 1:  # the usual case: one source, one flag for every item
        flag = sourced.spans[0][0]
        for row, score in zip(rows.tolist(), scores.tolist()):
            add(id=externals[row], score=score, fallback=flag)
        return
    source_of = sourced.source_of()
    for row, score in zip(rows.tolist(), scores.tolist()):
        add(id=externals[row], score=score, fallback=source_of[row])


class _RecommendCall(NamedTuple):
    """What a Recommend request asks, validated once for every version that answers it (a
    named tuple: built on every call, several times cheaper than a frozen dataclass)."""

    n: int
    candidate_ids: list[str]
    exclude_ids: list[str]
    exclude_seen: bool
    with_distribution: bool
    filter: str
    explain: int = 0
    diversify: Diversify = Diversify()

    @property
    def fetch_n(self) -> int:
        """Items each user's ranking asks the index for: a pool when diversity re-ranks it."""
        return self.diversify.pool_size(self.n)


class _VersionGroup(NamedTuple):
    """The users of one Recommend request that one version answers (positions in the
    request), with the request's candidates and rules resolved for that version."""

    model: LoadedModel
    positions: list[int]
    candidates: np.ndarray | None
    eligible: Eligible | None
    fresh: FreshOverlay | None = None


def _known_or_fresh_rows(ids: IdMap, fresh: FreshOverlay, externals: list[str]) -> np.ndarray:
    """Rows of the trained items of a candidate list; NotFound for an id neither trained nor fresh."""
    rows = ids.rows(externals)
    fresh_ids = set(fresh.ids)
    missing = [e for e, r in zip(externals, rows) if r < 0 and e not in fresh_ids]
    if missing:
        _rows_or_not_found(ids, missing, "candidate item ids")
    return rows[rows >= 0]


def _merged_rows(ids: IdMap, fresh: FreshOverlay, externals: list[str]) -> np.ndarray:
    """Rows of trained items, ``fresh.base + j`` of fresh item ``j``, -1 for ids that are neither."""
    rows = ids.rows(externals)
    for position in np.flatnonzero(rows < 0).tolist():
        found = fresh.position.get(externals[position])
        if found is not None:
            rows[position] = fresh.base + found
    return rows


def _distribution(index, vector: np.ndarray, rows: np.ndarray, fresh: FreshOverlay | None) -> np.ndarray:
    """The rating distribution of a user vector over ``rows`` (fresh items' from their factors)."""
    if fresh is None or not (rows >= fresh.base).any():
        return index.distribution_for(vector, rows)
    return index.distribution_of_factors(vector, item_vectors(index, rows, fresh.factors))


def _rows_or_not_found(ids: IdMap, externals: list[str], what: str) -> np.ndarray:
    rows = ids.rows(externals)
    missing = [e for e, r in zip(externals, rows) if r < 0]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise NotFound(f"unknown {what}: {shown}{more}")
    return rows


class RecommenderServicer(recommender_pb2_grpc.RecommenderServicer):
    def __init__(
        self,
        store: ModelStore,
        metrics: Metrics,
        limits: v.Limits,
        seen: SeenStore,
        hidden: HiddenState | None = None,
        hidden_mirror=None,
        online: NoOnlineEvaluation | None = None,
        batcher: RecommendBatcher | None = None,
        forgotten: ForgottenUsers | None = None,
        forget_client=None,
        trending: TrendingIndex | None = None,
        fresh: FreshItems | None = None,
    ):
        self.store, self.metrics, self.limits = store, metrics, limits
        # A forgotten user's recorded items are neither excluded nor folded in, on every transport.
        self.seen = ForgetfulSeen(seen, forgotten) if forgotten is not None else seen
        self.hidden, self.hidden_mirror = hidden, hidden_mirror
        self.online = online or NoOnlineEvaluation()
        # None: each call scores on its own (the path the batched one must equal, in tests).
        self.batcher = batcher
        self._users_counters = _PerVersion(
            lambda model: metrics.recommended_users.labels(model.name, model.version)
        )
        self._plain_versions = _PerVersion(self._plain_version)
        # Forgotten users are answered as unknown; ForgetUser erases through forget_client (Redis).
        self.forgotten, self.forget_client = forgotten, forget_client
        # Trending (service/live/trending.py): unknown users' fallback, and a model name of its own.
        self.trending = trending
        self.trending_name = trending.name if trending else ""
        # Items the served versions were not trained on, folded in from recorded ratings.
        self.fresh = fresh

    def _model(self, name: str, rpc_name: str) -> LoadedModel:
        return self.store.resolve(v.model_name(name), rpc_name)

    # ------------------------------------------------------------ Recommend
    @rpc
    def Recommend(self, request: pb.RecommendRequest, context) -> pb.RecommendResponse:
        reply = self._recommend(request, context)
        return pb.RecommendResponse.FromString(reply) if isinstance(reply, bytes) else reply

    @rpc
    def recommend_wire(self, request: pb.RecommendRequest, context) -> bytes:
        """Recommend answered as the bytes grpcio sends (``add_to_server`` registers it without
        a reply serialiser): the plain request's are written without a message (``wire.py``)."""
        reply = self._recommend(request, context)
        return reply if isinstance(reply, bytes) else reply.SerializeToString()

    def _recommend(self, request: pb.RecommendRequest, context) -> pb.RecommendResponse | bytes:
        lim = self.limits
        if self._is_trending_model(request.model):
            return self._recommend_trending(request)
        live = self._model(request.model, "Recommend")
        requested = request.user_ids
        if len(requested) == 1 and _plain(request):  # id_list's check of one id, without its list
            reply = self._recommend_plain(
                live, v.one_id(requested[0], "an entry of user_ids", lim), request, context
            )
            if reply is not None:
                return reply
        user_ids = v.id_list(requested, "user_ids", lim, lim.max_batch, min_count=1)
        call = _RecommendCall(
            n=v.bounded(request.n, "n", 1, lim.max_n),
            candidate_ids=v.id_list(
                request.candidate_item_ids, "candidate_item_ids", lim, lim.max_candidates
            ),
            exclude_ids=v.id_list(request.exclude_item_ids, "exclude_item_ids", lim, lim.max_candidates),
            exclude_seen=request.exclude_seen if request.HasField("exclude_seen") else True,
            with_distribution=request.with_distribution,
            filter=request.filter,
            explain=explain_count(request.explain),
            diversify=_diversify_settings(request),
        )
        # A split sends each user to one version, always the same (store.for_user).
        by_version: dict[str, tuple[LoadedModel, list[int]]] = {}
        if self.store.candidate(live.name) is None:  # no split: every user to the live version
            by_version[live.version] = (live, list(range(len(user_ids))))
        for position, uid in enumerate(user_ids if not by_version else ()):
            model = self.store.for_user(live, uid)
            by_version.setdefault(model.version, (model, []))[1].append(position)
        groups = [self._group(model, call, positions, user_ids) for model, positions in by_version.values()]
        newcomers = self._fold_in_candidates(groups, user_ids)
        # A newcomer's recorded items are fold-in evidence too (picks), even without exclude_seen.
        recent, ratings, degraded = self.seen.lookup(user_ids if call.exclude_seen else newcomers, newcomers)
        reply = pb.RecommendResponse(
            model=live.name,
            model_version=groups[0].model.version if len(groups) == 1 else live.version,
            seen_filter_degraded=degraded and call.exclude_seen,
            rules_stale=self._rules_stale(),
        )
        results = [reply.results.add(user_id=uid) for uid in user_ids]
        for group in groups:
            self._recommend_group(
                group,
                call,
                [user_ids[p] for p in group.positions],
                [results[p] for p in group.positions],
                recent,
                ratings,
                context,
            )
        if call.with_distribution:
            reply.levels.extend(float(x) for x in live.index.rating_levels)
        return reply

    def _recommend_plain(
        self, live: LoadedModel, user_id: str, request: pb.RecommendRequest, context
    ) -> bytes | None:
        """The usual request (one user the live version knows, nothing but ``n`` and
        ``exclude_seen``) in a straight line: the general path's reply, as wire bytes, without
        its grouping, fold-in and per-feature steps or a reply message (``wire.py``). None when
        the general path must answer (a split is open, the version has fresh items, or the user
        is unknown or forgotten)."""
        n = v.bounded(request.n, "n", 1, self.limits.max_n)
        index = live.index
        row = index.users.row(user_id)
        if row < 0 or self.store.candidate(live.name) is not None:
            return None
        if self.fresh is not None and self.fresh.overlay(index) is not None:
            return None
        if self._forgotten(user_id):
            return None
        version = self._plain_versions.get(live)
        if not version.always_fits:
            self._check_reply_fits([user_id], min(n, len(index.items)), n, 0, index.items.max_bytes)
        eligible = self.hidden.mask(live.name, index.items) if self.hidden else None
        exclude_seen = request.exclude_seen if request.HasField("exclude_seen") else True
        recent, _, degraded = self.seen.lookup([user_id] if exclude_seen else (), ())
        recorded, plan = recent.get(user_id), version.plan
        degraded, stale = degraded and exclude_seen, self._rules_stale()
        product = None if version.batches else index.lone_user_product(n, eligible)
        if product is not None:  # one kernel from the user's row to the reply's bytes
            reply = scored_reply(
                plan,
                product,
                row,
                n,
                index.seen(row) if exclude_seen else _NO_ROWS,
                _known_rows(index.items, recorded) if exclude_seen and recorded else None,
                None if eligible is None else eligible.blocked,
                degraded,
                stale,
            )
        else:
            exclude = self._exclusions(index, row, recorded, exclude_seen)
            rows, scores = self._score_known(index, np.array([row]), n, [exclude], None, eligible, context)[0]
            reply = encode_reply(plan, row, rows, scores, degraded, stale)
        version.users.inc(1)
        if self.online.wants_sample():
            items = pb.RecommendResponse.FromString(reply).results[0].items
            self.online.sample(live.name, live.version, user_id, [item.id for item in items])
        return reply

    def _plain_version(self, model: LoadedModel) -> _PlainVersion:
        """What the version's plain replies share (``_recommend_plain``), built on its first."""
        index = model.index
        try:  # the largest plain reply: max_n items for the longest user id
            largest = min(self.limits.max_n, len(index.items))
            self._check_reply_fits(["x" * index.users.max_bytes], largest, largest, 0, index.items.max_bytes)
        except InvalidArgument:
            always_fits = False
        else:
            always_fits = True
        return _PlainVersion(
            WirePlan(index.items, index.users, model.name, model.version),
            self._users_counters.get(model),
            always_fits,
            self._batches(index),
        )

    def _check_reply_fits(
        self, users: list[str], answerable: int, n: int, n_levels: int, id_bytes: int
    ) -> None:
        """Refuse, before any work, ``n`` items for each of ``users`` (``answerable`` of them
        at most, ids of up to ``id_bytes``) when the reply could exceed the message limit."""
        v.check_reply_fits(
            v.recommend_reply_bytes(users, answerable, id_bytes, n_levels),
            f"{len(users)} user_ids x n={n}{' with_distribution' if n_levels else ''}",
            self.limits,
        )

    def _group(self, model: LoadedModel, call: _RecommendCall, positions: list[int], user_ids: list[str]):
        """The users one version answers, with its view of the request; refuses, before any
        work, a request it cannot answer or whose reply would not fit."""
        index, lim = model.index, self.limits
        fresh = self.fresh.overlay(index) if self.fresh is not None else None
        candidates = None
        if call.candidate_ids:
            candidates = (
                _rows_or_not_found(index.items, call.candidate_ids, "candidate item ids")
                if fresh is None
                else _known_or_fresh_rows(index.items, fresh, call.candidate_ids)
            )
        eligible = self._eligible(model, call.filter)
        if call.with_distribution and not hasattr(index, "distribution"):
            raise FailedPrecondition(f"model {model.name!r} ({model.kind}) has no rating distribution")
        n_levels = len(index.rating_levels) if call.with_distribution else 0
        answerable = len(candidates) if candidates is not None else len(index.items)
        id_bytes = index.items.max_bytes
        if fresh is not None:
            answerable, id_bytes = answerable + len(fresh), max(id_bytes, fresh.max_bytes)
        users = [user_ids[p] for p in positions]
        self._check_reply_fits(users, min(call.n, answerable), call.n, n_levels, id_bytes)
        _check_cap(index, call.diversify)
        if call.explain:
            v.check_reply_fits(
                len(users) * call.n * call.explain * v.scored_id_bytes(id_bytes, 1),
                f"{len(users)} user_ids x n={call.n} x explain={call.explain}",
                lim,
            )
        return _VersionGroup(model, positions, candidates, eligible, fresh)

    def _recommend_group(
        self,
        group: _VersionGroup,
        call: _RecommendCall,
        user_ids: list[str],
        results: list,
        recent: dict[str, list[str]],
        ratings: dict[str, dict[str, str]],
        context,
    ) -> None:
        """Fill ``results`` (one per user, in order) with the group's version's answers."""
        model, candidates, eligible = group.model, group.candidates, group.eligible
        index, n = model.index, call.fetch_n
        user_rows = index.users.rows(user_ids)
        if self.forgotten is not None:
            user_rows = self.forgotten.unknown(user_ids, user_rows)
        excluded = index.items.rows(call.exclude_ids) if call.exclude_ids else None
        excludes = [
            self._exclusions(index, row, recent.get(uid), call.exclude_seen, excluded)
            for uid, row in zip(user_ids, user_rows)
        ]
        ranked: list
        if (user_rows >= 0).all():  # the usual case: every user known, no gathering
            ranked = self._score_known(index, user_rows, n, excludes, candidates, eligible, context)
        else:
            known = np.flatnonzero(user_rows >= 0)
            ranked = [None] * len(user_ids)
            if known.size:
                answers = self._score_known(
                    index, user_rows[known], n, [excludes[i] for i in known], candidates, eligible, context
                )
                for row, answer in zip(known.tolist(), answers):
                    ranked[row] = answer
        evidence = self._fold_in_evidence(index, user_ids, user_rows, ratings, recent)
        folded = self._fold_in(index, evidence)
        cold = None  # built for the first user with nothing to fold in (most calls have none)
        m = self.metrics
        self._users_counters.get(model).inc(len(user_ids))
        for i, (uid, result) in enumerate(zip(user_ids, results)):
            result.model_version = model.version
            vector, sourced = folded.get(uid), None
            if vector is not None:
                ranked[i] = index.recommend_for(
                    vector, n, exclude=excludes[i], candidates=candidates, eligible=eligible
                )
                result.folded_in = True
                m.folded_in.labels(model.name, model.version).inc()
            elif ranked[i] is None:  # trending, topped up to n from popularity (fallbacks.py)
                cold = cold or ColdStart(self.trending, index, candidates, eligible)
                ranked[i] = sourced = cold.answer(n, excludes[i])
                result.fallback = sourced.first_source()
                m.fallbacks.labels(model.name, "Recommend", _FALLBACK_LABEL[result.fallback]).inc()
            rows, scores = ranked[i][:2]
            fresh = group.fresh if user_rows[i] >= 0 or vector is not None else None
            if fresh is not None:  # service/live/fresh.py: only versions with fresh items come here
                vector = index.user_vector(int(user_rows[i])) if vector is None else vector
                rules = self._fresh_rules(model, call, recent.get(uid))
                rows, scores = merge_fresh((rows, scores), fresh_top(index, fresh, vector, n, rules), n)
            # --- request features (service/indices/diversity.py, service/indices/explain.py)
            if call.diversify.active:
                rows, scores = _diversified(index, (rows, scores), call.n, call.diversify, fresh)
            if sourced is not None:  # a fallback answer: never fresh items (no user vector)
                _add_sourced(result.items, index.items, rows, scores, sourced)
            elif fresh is None:
                _add_scored(result.items, index.items, rows, scores)
            else:
                _add_scored_fresh(result.items, index.items, fresh, rows, scores)
            if call.explain and (user_rows[i] >= 0 or vector is not None):
                history, rating_of = _explaining_history(index, int(user_rows[i]), evidence.get(uid))
                reasons = explained(
                    index, rows, history, call.explain, None if fresh is None else fresh.factors
                )
                _add_explanations(result.items, index.items, reasons, rating_of)
            # ---
            if call.with_distribution and (user_rows[i] >= 0 or vector is not None):
                dist = (
                    index.distribution(int(user_rows[i]), rows)
                    if vector is None
                    else _distribution(index, vector, rows, fresh)
                )
                for item, probs in zip(result.items, dist):
                    item.rating_distribution.extend(probs.tolist())
            if self.online.wants_sample():
                self.online.sample(model.name, model.version, uid, [item.id for item in result.items])

    def _hidden_ids(self, model: LoadedModel) -> tuple[frozenset[str], frozenset[str]]:
        """The ids hidden for every model and for ``model`` (fresh items are matched by id)."""
        sets = self.hidden.sets() if self.hidden else {}
        return sets.get(ALL_MODELS, frozenset()), sets.get(model.name, frozenset())

    def _fresh_rules(
        self, model: LoadedModel, call: _RecommendCall, recent_ids: list[str] | None
    ) -> FreshRules:
        """What a user's fresh items must honour: hidden items, exclusions, their recorded
        items, the candidate list and the filter (on the values the item-attributes file gives)."""
        blocked = (
            *self._hidden_ids(model),
            call.exclude_ids,
            (recent_ids or ()) if call.exclude_seen else (),
        )
        return FreshRules(blocked, call.candidate_ids or None, call.filter)

    def _batches(self, index) -> bool:
        """Whether the version's known users are scored with concurrent calls' (its scoring pass
        is dear enough: ``service/serving/batching.py``)."""
        return self.batcher is not None and index.scoring_work() >= self.batcher.min_work

    def _score_known(self, index, rows, n, excludes, candidates, eligible, context) -> list:
        """The index's answers for users it knows: batched with concurrent calls when the
        version batches, else scored on this call's own thread."""
        batcher = self.batcher
        if batcher is None or not self._batches(index):
            return index.recommend_many(rows, n, excludes=excludes, candidates=candidates, eligible=eligible)
        remaining = context.time_remaining()
        return batcher.recommend(
            index,
            rows,
            n,
            excludes=excludes,
            candidates=candidates,
            eligible=eligible,
            deadline=None if remaining is None else time.monotonic() + remaining,
        )

    @staticmethod
    def _fold_in_candidates(groups: list[_VersionGroup], user_ids: list[str]) -> list[str]:
        """The users whose recorded ratings Recommend reads: those the version answering
        them has not seen, when its kind folds in."""
        return [
            user_ids[p]
            for group in groups
            if group.model.index.folds_in
            for p in group.positions
            if group.model.index.users.row(user_ids[p]) < 0
        ]

    @staticmethod
    def _fold_in_evidence(index, user_ids, user_rows, ratings, recent) -> dict[str, dict[str, str]]:
        """What each user the version has not seen recorded: item id -> rating text, and where
        the version folds in picks (top-N models) the items recorded without a rating as ""."""
        evidence = {}
        for uid, row in zip(user_ids, user_rows):
            if row >= 0:
                continue
            recorded = dict(ratings.get(uid, {}))
            if index.folds_in_picks:
                recorded.update({item: "" for item in recent.get(uid, ()) if item not in recorded})
            if recorded:
                evidence[uid] = recorded
        return evidence

    @staticmethod
    def _fold_in(index, ratings: dict[str, dict[str, str]]) -> dict[str, np.ndarray]:
        """The :meth:`fold_in` vectors of users from their recorded ratings of items the
        version knows, and their picks without a rating where it takes them (NaN values;
        users with neither get the popularity list)."""
        vectors = {}
        for uid, rated in ratings.items():
            evidence = usable_evidence(index, index.items.rows(list(rated)), list(rated.values()))
            if evidence is not None:
                vectors[uid] = index.fold_in(*evidence)
        return vectors

    @staticmethod
    def _exclusions(
        index,
        user_row: int,
        recent_ids: list[str] | None,
        exclude_seen: bool,
        excluded: np.ndarray | None = None,
    ):
        """Item rows one user's answer must skip: seen (training and recorded) and ``exclude_item_ids``."""
        parts = []
        if excluded is not None:
            parts.append(excluded[excluded >= 0])
        if exclude_seen and user_row >= 0:
            parts.append(index.seen(int(user_row)))
        if exclude_seen and recent_ids:
            parts.append(_known_rows(index.items, recent_ids))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _eligible(self, model: LoadedModel, text: str) -> Eligible | None:
        """Hidden items and the request's filter as one mask (``service/indices/rules.py``)."""
        filtered = None
        if text:
            if len(text) > MAX_FILTER_CHARS:
                raise InvalidArgument(
                    f"filter is {len(text)} characters long; the limit is {MAX_FILTER_CHARS}"
                )
            try:
                filtered = model.index.item_attributes.eligible(text)
            except FilterError as exc:
                raise InvalidArgument(str(exc)) from None
        hidden = self.hidden.mask(model.name, model.index.items) if self.hidden else None
        return combine(hidden, filtered)

    def _rules_stale(self) -> bool:
        return bool(self.hidden and self.hidden.stale)

    # ----------------------------------------------------------------- Tags
    @rpc
    def Tags(self, request: pb.TagsRequest, context) -> pb.TagsResponse:
        lim = self.limits
        model = self._model(request.model, "Tags")
        user = v.one_id(request.user_id, "user_id", lim)
        model = self.store.for_user(model, user)
        index = model.index
        item = v.one_id(request.item_id, "item_id", lim)
        n = v.bounded(request.n, "n", 1, lim.max_n)
        user_row = -1 if self._forgotten(user) else index.users.row(user)
        rows, scores, fallback = index.tags(
            user_row, index.items.row(item), n, exclude_own=request.exclude_own_tags
        )
        if fallback != "none":
            self.metrics.fallbacks.labels(model.name, "Tags", fallback).inc()
        reply = pb.TagsResponse(fallback=_FALLBACK[fallback], model=model.name, model_version=model.version)
        _add_scored(reply.tags, index.artifact.idmap("tags"), rows, scores)
        for tag, label in zip(reply.tags, index.tag_names(rows) or ()):
            tag.label = label
        return reply

    # ------------------------------------------------------------ Neighbors
    def _space(self, model: LoadedModel, space: str) -> str:
        spaces = model.index.spaces()
        if space and space not in spaces:
            listed = ", ".join(spaces[:20]) or "none (leave it empty)"
            raise NotFound(f"model {model.name!r} has no space {space[:80]!r}; spaces: {listed}")
        if not space and spaces:
            raise InvalidArgument(f"model {model.name!r} needs a 'space': one of {', '.join(spaces[:20])}")
        return space

    @staticmethod
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

    @rpc
    def Neighbors(self, request: pb.NeighborsRequest, context) -> pb.NeighborsResponse:
        lim = self.limits
        model = self._model(request.model, "Neighbors")
        index = model.index
        query_id = v.one_id(request.id, "id", lim)
        k = v.bounded(request.k, "k", 1, lim.max_k)
        # Aspects live on the sphere (space ""), whatever aspect map was named.
        space = "" if request.from_entity == pb.ENTITY_ASPECT else self._space(model, request.space)
        source = self._entity(model, space, request.from_entity)
        target = self._entity(model, space, request.to_entity or request.from_entity)
        target_ids = index.maps[space][target].ids
        v.check_reply_fits(k * v.scored_id_bytes(target_ids.max_bytes), f"k={k}", lim)
        source_ids = index.maps[space][source].ids
        row = source_ids.row(query_id)
        if row < 0 or (source == "users" and self._forgotten(query_id)):
            raise NotFound(f"unknown {source[:-1]} id {query_id[:80]!r}")
        hidden = None
        if self.hidden and target in ("items", "objects"):  # hidden items never come back as neighbours
            hidden = self.hidden.hidden_rows(model.name, target_ids)
        if target == "users" and self.forgotten is not None and self.forgotten.digests():
            hidden = self.forgotten.rows(target_ids)  # nor forgotten users
        rows, scores = index.neighbors(space, source, row, target, k, hidden=hidden)
        reply = pb.NeighborsResponse(
            model=model.name, model_version=model.version, rules_stale=self._rules_stale()
        )
        _add_scored(reply.neighbors, index.maps[space][target].ids, rows, scores)
        return reply

    # ---------------------------------------------------------- Coordinates
    @rpc
    def Coordinates(self, request: pb.CoordinatesRequest, context):
        lim = self.limits
        model = self._model(request.model, "Coordinates")
        space = "" if request.entity == pb.ENTITY_ASPECT else self._space(model, request.space)
        entity = self._entity(model, space, request.entity)
        points = model.index.maps[space][entity]
        ids = v.id_list(request.ids, "ids", lim, lim.max_ids)
        page = v.bounded(request.page_size or 1000, "page_size", 1, lim.max_page_size)
        v.check_reply_fits(
            page * v.scored_id_bytes(points.ids.max_bytes, points.dim),
            f"page_size={page} at {points.dim} dimensions",
            lim,
        )
        rows = _rows_or_not_found(points.ids, ids, f"{entity} ids") if ids else np.arange(len(points.ids))
        if entity == "users" and self.forgotten is not None and self.forgotten.digests():
            rows = rows[~np.isin(rows, self.forgotten.rows(points.ids))]  # forgotten users are not on the map
        wire_entity = _SPACE_ENTITY[entity]
        for start in range(0, max(rows.size, 1), page):
            if not context.is_active():  # the client went away or its deadline passed
                return
            chunk = rows[start : start + page]
            reply = pb.CoordinatesResponse(dim=points.dim, model=model.name, model_version=model.version)
            for r, coords in zip(chunk, points.coords[chunk]):
                reply.points.add(id=points.ids.external(int(r)), entity=wire_entity, coords=coords.tolist())
            yield reply

    # ---------------------------------------------------------------- Place
    @rpc
    def Place(self, request: pb.PlaceRequest, context) -> pb.PlaceResponse:
        lim = self.limits
        model = self._model(request.model, "Place")
        index = model.index
        ranked = v.id_list(request.ranked_neighbor_ids, "ranked_neighbor_ids", lim, lim.max_ids, min_count=1)
        if len(set(ranked)) != len(ranked):
            raise InvalidArgument("ranked_neighbor_ids repeats an id")
        k = v.bounded(request.k, "k", 0, lim.max_k)
        points = index.maps[""][index.default_entity]
        v.check_reply_fits(k * v.scored_id_bytes(points.ids.max_bytes), f"k={k}", lim)
        rows = _rows_or_not_found(points.ids, ranked, "neighbour ids")
        coords = index.place(rows)
        reply = pb.PlaceResponse(
            coords=np.asarray(coords).tolist(), model=model.name, model_version=model.version
        )
        if k:
            near, scores = points.nearest(np.asarray(coords, dtype=np.float64), k)
            _add_scored(reply.neighbors, points.ids, near, scores)
        return reply

    # --------------------------------------------------- RecordInteractions
    @rpc
    def RecordInteractions(self, request: pb.RecordInteractionsRequest, context):
        lim = self.limits
        user = v.stored_id(request.user_id, "user_id", lim)
        v.stored_ids(request.item_ids, "item_ids", lim, lim.max_ids)
        count = len(request.item_ids) + len(request.interactions)
        if not 1 <= count <= lim.max_ids:
            raise InvalidArgument(
                f"item_ids and interactions must hold between 1 and {lim.max_ids} items together, got {count}"
            )
        interactions = self._interactions(request, time.time())
        if self._forgotten(user):
            return pb.RecordInteractionsResponse(recorded=0, forgotten=True)
        recorded = self.seen.record(user, interactions)
        self.online.observe(user, [i.item for i in interactions])
        return pb.RecordInteractionsResponse(recorded=recorded)

    def _interactions(self, request: pb.RecordInteractionsRequest, now: float) -> list[Recorded]:
        """The request's items, values checked against the model's rating scale.

        Unknown users and items are kept: they are the next training's new ids.
        """
        lim = self.limits
        valued = any(i.HasField("value") for i in request.interactions)
        # A value is a rating on one model's scale; the event names that model for the trainer.
        model = self._model(request.model, "Recommend") if valued or request.model else None
        name = model.name if model else None
        recorded = [Recorded(item, now, model=name) for item in request.item_ids]
        for position, interaction in enumerate(request.interactions):
            where = f"interactions[{position}]"
            item = v.stored_id(interaction.item_id, f"{where}.item_id", lim)
            value = interaction.value if interaction.HasField("value") else None
            if value is not None:
                assert model is not None  # resolved above whenever a value is given
                v.rating(value, f"{where} (item {item[:80]!r})", model.name, model.index.artifact.attributes)
            ts = interaction.timestamp if interaction.HasField("timestamp") else now
            v.timestamp(ts, f"{where}.timestamp")
            recorded.append(Recorded(item, ts, value, name))
        return recorded

    # ------------------------------------------------------------- Trending
    def _is_trending_model(self, name: str) -> bool:
        """Whether ``name`` asks for the trending model (a registry model of that name wins)."""
        return (
            self.trending is not None
            and bool(self.trending_name)
            and name == self.trending_name
            and name not in self.store.snapshot()
        )

    def _recommend_trending(self, request: pb.RecommendRequest) -> pb.RecommendResponse:
        """Every user gets the trending items, minus exclusions, recorded items and hidden ones."""
        lim = self.limits
        user_ids = v.id_list(request.user_ids, "user_ids", lim, lim.max_batch, min_count=1)
        n = v.bounded(request.n, "n", 1, lim.max_n)
        candidates = set(v.id_list(request.candidate_item_ids, "candidate_item_ids", lim, lim.max_candidates))
        excluded = set(v.id_list(request.exclude_item_ids, "exclude_item_ids", lim, lim.max_candidates))
        check_model_request(request)
        exclude_seen = request.exclude_seen if request.HasField("exclude_seen") else True
        excluded |= self.hidden.sets().get(ALL_MODELS, set()) if self.hidden else set()
        recent, _, degraded = self.seen.lookup(user_ids if exclude_seen else [])
        current = self._trending_now()
        reply = pb.RecommendResponse(model=self.trending_name, seen_filter_degraded=degraded and exclude_seen)
        for uid in user_ids:
            result = reply.results.add(user_id=uid)
            recorded = set(recent.get(uid, ()))
            for item, score in zip(current.item_ids, current.scores.tolist()):
                if len(result.items) == n:
                    break
                if item not in excluded and item not in recorded and (not candidates or item in candidates):
                    result.items.add(id=item, score=score)
        return reply

    def _trending_now(self) -> Trending:
        """The trending list; UNAVAILABLE when it is empty because Redis cannot be read (an
        empty list must mean that nothing is trending, not that nobody could look)."""
        assert self.trending is not None  # _is_trending_model checked it
        current = self.trending.current()
        if not len(current) and not self._trending_reachable():
            raise Unavailable("the trending model reads Redis, which is unreachable; retry later")
        return current

    def _trending_reachable(self) -> bool:
        """Whether trending's Redis answers (asked only when the list is empty: a ping)."""
        index = self.trending
        if index is None or index.client is None or not index.healthy():
            return False
        try:
            index.client.ping()
        except redis.RedisError:
            return False
        return True

    # ----------------------------------------------------------- ListModels
    @rpc
    def ListModels(self, request: pb.ListModelsRequest, context) -> pb.ListModelsResponse:
        reply = pb.ListModelsResponse()
        for name, model in sorted(self.store.snapshot().items()):
            artifact = model.index.artifact
            info = reply.models.add(
                name=name,
                kind=model.kind,
                version=model.version,
                created_at=model.created_at,
                loaded_at=model.loaded_at,
                reason=model.reason,
                rpcs=sorted(model.index.rpcs),
                spaces=model.index.spaces(),
                index=getattr(model.index, "search", ""),
            )
            candidate = self.store.candidate(name)
            if candidate is not None:
                info.candidate_version, info.candidate_share = candidate.model.version, candidate.share
            info.sizes.update(model.index.sizes())
            overlay = (
                self.fresh.overlay(model.index)
                if self.fresh is not None and "Recommend" in model.index.rpcs
                else None
            )
            if overlay is not None:  # items served before the next training (service/live/fresh.py)
                info.sizes["fresh_items"] = len(overlay)
            info.metrics.update({k: float(x) for k, x in artifact.metrics.items()})
        if (
            self.trending is not None
            and self.trending_name
            and self.trending_name not in self.store.snapshot()
        ):
            reply.models.add(name=self.trending_name, kind="trending", rpcs=["Recommend"])
        return reply

    # ---------------------------------------------------------- hidden items
    def _scope(self, name: str) -> str:
        if name in ("", ALL_MODELS):
            return ALL_MODELS
        name = v.model_name(name)
        if not self.store.registry.has_model(name):
            raise NotFound(f"no model {name!r} in the registry")
        return name

    def _hidden_state(self) -> HiddenState:
        if self.hidden is None:
            raise FailedPrecondition("this server keeps no hidden items")
        return self.hidden

    def _unknown(self, scope: str, ids: list[str]) -> int:
        """How many ids no served version of the scope knows (kept hidden all the same)."""
        maps = [
            m.index.items
            for n, m in self.store.snapshot().items()
            if hasattr(m.index, "items") and scope in (ALL_MODELS, n)
        ]
        return sum(1 for i in ids if not any(i in items for items in maps))

    def _change_hidden(self, request: pb.HideItemsRequest, hide: bool) -> pb.HideItemsResponse:
        lim = self.limits
        state = self._hidden_state()
        scope = self._scope(request.model)
        ids = v.stored_ids(request.item_ids, "item_ids", lim, lim.max_candidates, min_count=1)
        changed = state.change(scope, ids, hide, mirror=self.hidden_mirror)
        total = len(state.sets().get(scope, ()))
        log.info("%s %d item(s) for %s (%d changed)", "hid" if hide else "unhid", len(ids), scope, changed)
        return pb.HideItemsResponse(
            changed=changed, unknown=self._unknown(scope, ids) if hide else 0, total=total, model=scope
        )

    @rpc
    def HideItems(self, request: pb.HideItemsRequest, context) -> pb.HideItemsResponse:
        return self._change_hidden(request, hide=True)

    @rpc
    def UnhideItems(self, request: pb.HideItemsRequest, context) -> pb.HideItemsResponse:
        return self._change_hidden(request, hide=False)

    @rpc
    def ListHidden(self, request: pb.ListHiddenRequest, context) -> pb.ListHiddenResponse:
        state = self._hidden_state()
        sets = state.sets()
        if request.model in ("", ALL_MODELS):
            scopes = sorted(sets) if not request.model else [ALL_MODELS]
        else:
            scopes = [ALL_MODELS, self._scope(request.model)]
        reply = pb.ListHiddenResponse(rules_stale=state.stale)
        after = request.after_item_id
        for scope in scopes:
            ids = sorted(sets.get(scope, ()))
            start = bisect.bisect_right(ids, after) if after else 0
            reply.scopes.add(model=scope, item_ids=ids[start : start + self.limits.max_ids], count=len(ids))
        return reply

    # --------------------------------------------------------- SimilarItems
    @rpc
    def SimilarItems(self, request: pb.SimilarItemsRequest, context) -> pb.SimilarItemsResponse:
        lim = self.limits
        model = self._model(request.model, "SimilarItems")
        index = model.index
        query_ids = v.id_list(request.item_ids, "item_ids", lim, MAX_BASKET, min_count=1)
        n = v.bounded(request.n, "n", 1, lim.max_n)
        exclude_ids = v.id_list(request.exclude_item_ids, "exclude_item_ids", lim, lim.max_candidates)
        settings = _diversify_settings(request)
        _check_cap(index, settings)
        fresh = self.fresh.overlay(index) if self.fresh is not None else None
        rows = index.items.rows(query_ids) if fresh is None else _merged_rows(index.items, fresh, query_ids)
        unknown = [i for i, r in zip(query_ids, rows) if r < 0]
        id_bytes = index.items.max_bytes if fresh is None else max(index.items.max_bytes, fresh.max_bytes)
        v.check_reply_fits(
            n * v.scored_id_bytes(id_bytes) + sum(len(u.encode("utf-8")) + 8 for u in unknown),
            f"n={n}",
            lim,
        )
        if len(unknown) == len(query_ids):
            raise NotFound(
                f"none of item_ids is known to model {model.name!r} (first: {query_ids[0][:80]!r})"
            )
        excluded = index.items.rows(exclude_ids) if exclude_ids else None
        pool = similar_with_fresh(
            index,
            fresh,
            rows[rows >= 0],
            settings.pool_size(n),
            exclude=None if excluded is None else excluded[excluded >= 0],
            eligible=self._eligible(model, request.filter),
            rules=FreshRules((*self._hidden_ids(model), exclude_ids), None, request.filter),
        )
        found, scores = _diversified(index, pool, n, settings, fresh)
        reply = pb.SimilarItemsResponse(
            model=model.name,
            model_version=model.version,
            rules_stale=self._rules_stale(),
            unknown_item_ids=unknown,
        )
        if fresh is None:
            _add_scored(reply.items, index.items, found, scores)
        else:
            _add_scored_fresh(reply.items, index.items, fresh, found, scores)
        return reply

    # ------------------------------------------------------------ ForgetUser
    def _forgotten(self, user_id: str) -> bool:
        return self.forgotten is not None and self.forgotten.contains(user_id)

    @rpc
    def ForgetUser(self, request: pb.ForgetUserRequest, context) -> pb.ForgetUserResponse:
        user = v.one_id(request.user_id, "user_id", self.limits)
        reason = v.note(request.reason, "reason")
        if self.forgotten is None:
            raise FailedPrecondition("this server keeps no FORGOTTEN list")
        try:
            report = erase_user(user, self.store.registry, self.forget_client)
        except redis.RedisError as exc:
            raise Unavailable(f"Redis is unreachable, the erasure is incomplete (ask again): {exc}") from None
        except RegistryUnavailable as exc:
            raise Unavailable(
                f"the registry is unreachable, the erasure is incomplete (ask again): {exc}"
            ) from None
        except (OSError, ArtifactError) as exc:
            raise FailedPrecondition(f"cannot write the registry, the erasure is incomplete: {exc}") from None
        self.forgotten.refresh()
        log.info(
            "forgot user digest=%s reason=%r stream_entries=%d versions_removed=%d pending=%d",
            report.user_digest,
            reason,
            report.stream_entries,
            len(report.versions_removed),
            len(report.versions_pending),
        )
        return pb.ForgetUserResponse(**dataclasses.asdict(report))


def add_to_server(servicer: RecommenderServicer, server) -> None:
    """Register every RPC of the service descriptor with lenient request decoding, by path (grpcio
    then finds a call's handler in its C core), and as a generic handler too, as generated code
    does. ``server``: a ``grpc.Server`` or what stands in for one (``GuardedRegistration``)."""
    service = pb.DESCRIPTOR.services_by_name["Recommender"]
    handlers = {}
    for method in service.methods:
        factory = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        # Recommend's handler returns the reply's bytes itself (the plain request's, written
        # without a message: service/serving/wire.py), so grpcio sends them as they are.
        wire = method.name == "Recommend"
        handlers[method.name] = factory(
            servicer.recommend_wire if wire else getattr(servicer, method.name),
            request_deserializer=lenient_deserializer(getattr(pb, method.input_type.name)),
            response_serializer=None if wire else getattr(pb, method.output_type.name).SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
