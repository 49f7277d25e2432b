"""The Recommend RPC: a request becomes a plan (its users grouped by the version that answers
them, each group refused before any work when it cannot be answered or its reply would not
fit), the plan runs through the stages (``stages.py``), and the reply goes back as a message
or, for the plain request, as the wire bytes written in one kernel (``wire.py``)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from prometheus_client import Counter

from ordrec.service.errors import FailedPrecondition, InvalidArgument
from ordrec.service.indices.explain import explain_count
from ordrec.service.serving import validation
from ordrec.service.serving.replies import NO_ROWS, known_or_fresh_rows, known_rows, rows_or_not_found
from ordrec.service.serving.stages import (
    GroupRun,
    RecommendCall,
    VersionGroup,
    check_cap,
    diversify_settings,
    run_group,
    user_exclusions,
)
from ordrec.service.serving.state import PerVersion, ServingState
from ordrec.service.serving.store import LoadedModel
from ordrec.service.serving.trending_model import is_trending_model, recommend_trending
from ordrec.service.serving.wire import WirePlan, encode_reply, scored_reply
from ordrec.v1 import recommender_pb2 as pb


class PlainVersion(NamedTuple):
    """One version's share of every plain reply: how to write it, the users counter's child,
    and whether the largest plain reply fits the message limit (else each is checked)."""

    plan: WirePlan
    users: Counter
    always_fits: bool
    batches: bool  # its known users are scored through the batcher (``ServingState.batches``)


def is_plain(request: pb.RecommendRequest) -> bool:
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


def call_from_request(request: pb.RecommendRequest, lim: validation.Limits) -> RecommendCall:
    """What the request asks, checked field by field."""
    return RecommendCall(
        n=validation.bounded(request.n, "n", 1, lim.max_n),
        candidate_ids=validation.id_list(
            request.candidate_item_ids, "candidate_item_ids", lim, lim.max_candidates
        ),
        exclude_ids=validation.id_list(request.exclude_item_ids, "exclude_item_ids", lim, lim.max_candidates),
        exclude_seen=request.exclude_seen if request.HasField("exclude_seen") else True,
        with_distribution=request.with_distribution,
        filter=request.filter,
        explain=explain_count(request.explain),
        diversify=diversify_settings(request),
    )


def check_reply_fits(
    lim: validation.Limits, users: list[str], answerable: int, n: int, n_levels: int, id_bytes: int
) -> None:
    """Refuse, before any work, ``n`` items for each of ``users`` (``answerable`` of them
    at most, ids of up to ``id_bytes``) when the reply could exceed the message limit."""
    validation.check_reply_fits(
        validation.recommend_reply_bytes(users, answerable, id_bytes, n_levels),
        f"{len(users)} user_ids x n={n}{' with_distribution' if n_levels else ''}",
        lim,
    )


class Recommender:
    """Answers Recommend requests over the serving state."""

    def __init__(self, state: ServingState):
        self.state = state
        self.plain_versions = PerVersion(self._plain_version)

    def answer(self, request: pb.RecommendRequest, context) -> pb.RecommendResponse | bytes:
        """The reply: wire bytes for the plain request the straight line answers, else a message."""
        state, lim = self.state, self.state.limits
        if is_trending_model(state, request.model):
            return recommend_trending(state, request)
        live = state.model(request.model, "Recommend")
        requested = request.user_ids
        if len(requested) == 1 and is_plain(request):  # id_list's check of one id, without its list
            reply = self.plain(
                live, validation.one_id(requested[0], "an entry of user_ids", lim), request, context
            )
            if reply is not None:
                return reply
        user_ids = validation.id_list(requested, "user_ids", lim, lim.max_batch, min_count=1)
        call = call_from_request(request, lim)
        groups = [
            self.group(model, call, positions, user_ids) for model, positions in self._split(live, user_ids)
        ]
        return self._run(live, call, groups, user_ids, context)

    def _split(self, live: LoadedModel, user_ids: list[str]) -> list[tuple[LoadedModel, list[int]]]:
        """The request's users by the version that answers them (positions in the request): a
        split sends each user to one version, always the same (``store.for_user``)."""
        store = self.state.store
        if store.candidate(live.name) is None:  # no split: every user to the live version
            return [(live, list(range(len(user_ids))))]
        by_version: dict[str, tuple[LoadedModel, list[int]]] = {}
        for position, uid in enumerate(user_ids):
            model = store.for_user(live, uid)
            by_version.setdefault(model.version, (model, []))[1].append(position)
        return list(by_version.values())

    def _run(
        self, live: LoadedModel, call: RecommendCall, groups: list[VersionGroup], user_ids: list[str], context
    ) -> pb.RecommendResponse:
        """Every group through its stages, into one reply."""
        state = self.state
        newcomers = _fold_in_candidates(groups, user_ids)
        # A newcomer's recorded items are fold-in evidence too (picks), even without exclude_seen.
        recent, ratings, degraded = state.seen.lookup(user_ids if call.exclude_seen else newcomers, newcomers)
        reply = pb.RecommendResponse(
            model=live.name,
            model_version=groups[0].model.version if len(groups) == 1 else live.version,
            seen_filter_degraded=degraded and call.exclude_seen,
            rules_stale=state.rules_stale(),
        )
        results = [reply.results.add(user_id=uid) for uid in user_ids]
        for group in groups:
            run = GroupRun(state, group, call, recent, ratings, context)
            run_group(run, [user_ids[p] for p in group.positions], [results[p] for p in group.positions])
        if call.with_distribution:
            reply.levels.extend(float(x) for x in live.index.rating_distribution().rating_levels)
        return reply

    def group(
        self, model: LoadedModel, call: RecommendCall, positions: list[int], user_ids: list[str]
    ) -> VersionGroup:
        """The users one version answers, with its view of the request; refuses, before any
        work, a request it cannot answer or whose reply would not fit."""
        index, state = model.index, self.state
        fresh = state.fresh_overlay(index)
        candidates = None
        if call.candidate_ids:
            candidates = (
                rows_or_not_found(index.items, call.candidate_ids, "candidate item ids")
                if fresh is None
                else known_or_fresh_rows(index.items, fresh, call.candidate_ids)
            )
        eligible = state.eligible(model, call.filter)
        distribution = index.rating_distribution() if call.with_distribution else None
        if call.with_distribution and distribution is None:
            raise FailedPrecondition(f"model {model.name!r} ({model.kind}) has no rating distribution")
        n_levels = 0 if distribution is None else len(distribution.rating_levels)
        answerable = len(candidates) if candidates is not None else len(index.items)
        id_bytes = index.items.max_bytes
        if fresh is not None:
            answerable, id_bytes = answerable + len(fresh), max(id_bytes, fresh.max_bytes)
        users = [user_ids[p] for p in positions]
        check_reply_fits(state.limits, users, min(call.n, answerable), call.n, n_levels, id_bytes)
        check_cap(index, call.diversify)
        if call.explain:
            validation.check_reply_fits(
                len(users) * call.n * call.explain * validation.scored_id_bytes(id_bytes, 1),
                f"{len(users)} user_ids x n={call.n} x explain={call.explain}",
                state.limits,
            )
        return VersionGroup(model, positions, candidates, eligible, fresh)

    # ------------------------------------------------------- the plain request
    def plain(self, live: LoadedModel, user_id: str, request: pb.RecommendRequest, context) -> bytes | None:
        """The usual request (one user the live version knows, nothing but ``n`` and
        ``exclude_seen``) in a straight line: the general path's reply, as wire bytes, without
        its grouping, fold-in and per-feature stages or a reply message (``wire.py``). None when
        the general path must answer (a split is open, the version has fresh items, or the user
        is unknown or forgotten)."""
        state = self.state
        n = validation.bounded(request.n, "n", 1, state.limits.max_n)
        index = live.index
        row = index.users.row(user_id)
        if row < 0 or state.store.candidate(live.name) is not None:
            return None
        if state.fresh is not None and state.fresh.overlay(index) is not None:
            return None
        if state.is_forgotten(user_id):
            return None
        version = self.plain_versions.get(live)
        if not version.always_fits:
            check_reply_fits(state.limits, [user_id], min(n, len(index.items)), n, 0, index.items.max_bytes)
        exclude_seen = request.exclude_seen if request.HasField("exclude_seen") else True
        reply = self._plain_reply(live, version, row, user_id, n, exclude_seen, context)
        version.users.inc(1)
        if state.online.wants_sample():
            items = pb.RecommendResponse.FromString(reply).results[0].items
            state.online.sample(live.name, live.version, user_id, [item.id for item in items])
        return reply

    def _plain_reply(
        self,
        live: LoadedModel,
        version: PlainVersion,
        row: int,
        user_id: str,
        n: int,
        exclude_seen: bool,
        context,
    ) -> bytes:
        """The plain reply's bytes: one kernel from the user's row where the index offers its
        product, else the index's answer encoded."""
        state, index = self.state, live.index
        eligible = state.hidden.mask(live.name, index.items) if state.hidden else None
        recent, _, degraded = state.seen.lookup([user_id] if exclude_seen else (), ())
        recorded, plan = recent.get(user_id), version.plan
        degraded, stale = degraded and exclude_seen, state.rules_stale()
        product = None if version.batches else index.lone_user_product(n, eligible)
        if product is not None:
            return scored_reply(
                plan,
                product,
                row,
                n,
                index.seen(row) if exclude_seen else NO_ROWS,
                known_rows(index.items, recorded) if exclude_seen and recorded else None,
                None if eligible is None else eligible.blocked,
                degraded,
                stale,
            )
        exclude = user_exclusions(index, row, recorded, exclude_seen)
        rows, scores = state.score_known(index, np.array([row]), n, [exclude], None, eligible, context)[0]
        return encode_reply(plan, row, rows, scores, degraded, stale)

    def _plain_version(self, model: LoadedModel) -> PlainVersion:
        """What the version's plain replies share (:meth:`plain`), built on its first."""
        index, lim = model.index, self.state.limits
        try:  # the largest plain reply: max_n items for the longest user id
            largest = min(lim.max_n, len(index.items))
            check_reply_fits(lim, ["x" * index.users.max_bytes], largest, largest, 0, index.items.max_bytes)
        except InvalidArgument:
            always_fits = False
        else:
            always_fits = True
        return PlainVersion(
            WirePlan(index.items, index.users, model.name, model.version),
            self.state.users_counters.get(model),
            always_fits,
            self.state.batches(index),
        )


def _fold_in_candidates(groups: list[VersionGroup], user_ids: list[str]) -> list[str]:
    """The users whose recorded ratings Recommend reads: those the version answering
    them has not seen, when its kind folds in."""
    return [
        user_ids[p]
        for group in groups
        if group.model.index.folds_in
        for p in group.positions
        if group.model.index.users.row(user_ids[p]) < 0
    ]
