"""Recommend as a sequence of stages, run over the users one version answers.

A request is planned per version (:class:`VersionGroup`: its candidates, rules and fresh
items) and each user's answer (:class:`Answer`) goes through the stages the request needs
(:func:`plan`), in this order:

1. candidates and exclusions (:func:`exclusions`): the user's row, what to skip;
2. scoring: the users the version knows (:func:`score_known`: exact, batched or through the
   approximate item index, as the index decides), then those it folds in (:func:`fold_in`);
3. fallbacks (:func:`fall_back`): trending, topped up from popularity (``fallbacks.py``);
4. the fresh-item merge (:func:`merge_fresh_items`, ``service/live/fresh.py``);
5. re-ranking (:func:`rerank`): diversity and per-attribute caps (``service/indices/diversity.py``);
6. the reply's items (:func:`write_items`), then decoration: explanations (:func:`explain`)
   and rating distributions (:func:`distributions`);
7. sampling for online evaluation (:func:`sample`).

A stage reaches a model through what its index declares (``item_similarity``,
``rating_distribution``, ``folds_in``), never through its kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ordrec.service.errors import InvalidArgument
from ordrec.service.indices.diversity import Diversify, settings_from_request
from ordrec.service.indices.diversity import rerank as rerank_pool
from ordrec.service.indices.explain import explained, liked_history
from ordrec.service.indices.models.base import recorded_values, usable_evidence
from ordrec.service.indices.rules import Eligible, FilterError
from ordrec.service.indices.similar import item_vectors
from ordrec.service.live.fresh import FreshOverlay, FreshRules, fresh_top, merge_fresh
from ordrec.service.serving.fallbacks import ColdStart, Sourced
from ordrec.service.serving.replies import add_explanations, add_ranked, add_sourced, known_rows
from ordrec.service.serving.state import ServingState
from ordrec.service.serving.store import LoadedModel
from ordrec.v1 import recommender_pb2 as pb

_FALLBACK_LABEL = {pb.FALLBACK_TRENDING: "trending", pb.FALLBACK_POPULAR_GLOBAL: "popular_global"}


class RecommendCall(NamedTuple):
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


class VersionGroup(NamedTuple):
    """The users of one Recommend request that one version answers (positions in the
    request), with the request's candidates and rules resolved for that version."""

    model: LoadedModel
    positions: list[int]
    candidates: np.ndarray | None
    eligible: Eligible | None
    fresh: FreshOverlay | None = None


def diversify_settings(request) -> Diversify:
    """The request's ``diversity`` and ``max_per_attribute``, checked."""
    cap = request.max_per_attribute
    return settings_from_request(
        request.diversity, cap.attribute, cap.max, request.HasField("max_per_attribute")
    )


def check_cap(index, settings: Diversify) -> None:
    """Refuse, before any work, a ``max_per_attribute`` on an attribute the version has not got."""
    cap = settings.cap
    if cap is not None and cap.attribute not in index.item_attributes.columns:
        raise InvalidArgument(
            f"max_per_attribute.attribute: no item attribute {cap.attribute[:80]!r}"
            f" (this version has: {index.item_attributes.describe()})"
        )


def diversified(index, pool, n: int, settings: Diversify, fresh: FreshOverlay | None = None):
    """``n`` of the pool re-ranked for diversity; a cap on an unknown attribute is INVALID_ARGUMENT."""
    try:
        if fresh is None:
            return rerank_pool(index, pool, n, settings)
        return rerank_pool(index, pool, n, settings, fresh.factors, fresh.attributes.values)
    except FilterError as exc:
        raise InvalidArgument(str(exc)) from None


def user_exclusions(
    index, user_row: int, recent_ids: list[str] | None, exclude_seen: bool, excluded: np.ndarray | None = None
):
    """Item rows one user's answer must skip: seen (training and recorded) and ``exclude_item_ids``."""
    parts = []
    if excluded is not None:
        parts.append(excluded[excluded >= 0])
    if exclude_seen and user_row >= 0:
        parts.append(index.seen(int(user_row)))
    if exclude_seen and recent_ids:
        parts.append(known_rows(index.items, recent_ids))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class Answer:
    """One user's answer as it goes through the stages (a plain class with slots: one per user
    per call)."""

    __slots__ = (
        "user_id",
        "row",
        "exclude",
        "result",
        "vector",
        "evidence",
        "rows",
        "scores",
        "sourced",
        "fresh",
    )

    def __init__(self, user_id: str, row: int, exclude: np.ndarray | None, result):
        self.user_id, self.row, self.exclude, self.result = user_id, row, exclude, result
        self.vector: np.ndarray | None = None  # a fold-in's (or, with fresh items, the user's own)
        self.evidence: dict[str, str] | None = None  # a user the version has not seen: what they recorded
        self.rows: np.ndarray | None = None
        self.scores: np.ndarray | None = None
        self.sourced: Sourced | None = None  # a fallback answer's sources
        self.fresh: FreshOverlay | None = None  # the version's fresh items, for a placed user

    @property
    def placed(self) -> bool:
        """Whether the model places the user (trained or folded in): what fresh items,
        explanations and distributions need."""
        return self.row >= 0 or self.vector is not None


@dataclass
class GroupRun:
    """One version's share of a request, as the stages read it."""

    state: ServingState
    group: VersionGroup
    call: RecommendCall
    recent: dict[str, list[str]]
    ratings: dict[str, dict[str, str]]
    context: Any
    user_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # set by exclusions

    @property
    def model(self) -> LoadedModel:
        return self.group.model

    @property
    def index(self):
        return self.group.model.index


Stage = Callable[[GroupRun, list[Answer]], None]


def exclusions(run: GroupRun, user_ids: list[str], results: list) -> list[Answer]:
    """Candidates and exclusions: each user's row (a forgotten user's is -1, unknown) and the
    item rows their answer must skip."""
    index, call = run.index, run.call
    user_rows = index.users.rows(user_ids)
    if run.state.forgotten is not None:
        user_rows = run.state.forgotten.unknown(user_ids, user_rows)
    run.user_rows = user_rows
    excluded = index.items.rows(call.exclude_ids) if call.exclude_ids else None
    answers = []
    for uid, row, result in zip(user_ids, user_rows.tolist(), results):
        result.model_version = run.model.version
        exclude = user_exclusions(index, row, run.recent.get(uid), call.exclude_seen, excluded)
        answers.append(Answer(uid, row, exclude, result))
    return answers


def score_known(run: GroupRun, answers: list[Answer]) -> None:
    """Scoring of the users the version knows, in one pass (with concurrent calls' users where
    the version batches)."""
    user_rows, group = run.user_rows, run.group
    known = np.flatnonzero(user_rows >= 0)
    if not known.size:
        return
    every = known.size == len(answers)  # the usual case: every user known, no gathering
    excludes = [a.exclude for a in answers] if every else [answers[i].exclude for i in known]
    found = run.state.score_known(
        run.index,
        user_rows if every else user_rows[known],
        run.call.fetch_n,
        excludes,
        group.candidates,
        group.eligible,
        run.context,
    )
    for i, ranked in zip(known.tolist(), found):
        answers[i].rows, answers[i].scores = ranked[:2]


def _recorded(run: GroupRun, user_id: str) -> dict[str, str]:
    """What a user the version has not seen recorded: item id -> rating text, and where the
    version folds in picks (top-N models) the items recorded without a rating as ""."""
    recorded = dict(run.ratings.get(user_id, {}))
    if run.index.folds_in_picks:
        recorded.update({item: "" for item in run.recent.get(user_id, ()) if item not in recorded})
    return recorded


def fold_in(run: GroupRun, answers: list[Answer]) -> None:
    """Scoring of the users the version has not seen from what they recorded (the index's
    ``fold_in`` vector); those with nothing usable are left to the fallbacks."""
    index, group, model = run.index, run.group, run.model
    for answer in answers:
        if answer.row >= 0:
            continue
        answer.evidence = _recorded(run, answer.user_id) or None
        if answer.evidence is None:
            continue
        usable = usable_evidence(
            index, index.items.rows(list(answer.evidence)), list(answer.evidence.values())
        )
        answer.vector = None if usable is None else index.fold_in(*usable)
        if answer.vector is None:
            continue
        answer.rows, answer.scores = index.recommend_for(
            answer.vector,
            run.call.fetch_n,
            exclude=answer.exclude,
            candidates=group.candidates,
            eligible=group.eligible,
        )[:2]
        answer.result.folded_in = True
        run.state.metrics.folded_in.labels(model.name, model.version).inc()


def fall_back(run: GroupRun, answers: list[Answer]) -> None:
    """Fallbacks for users the model cannot place: trending, topped up from popularity
    (``fallbacks.py``; trending is read once, for the first such user)."""
    cold = None
    model = run.model
    for answer in answers:
        if answer.rows is not None:
            continue
        cold = cold or ColdStart(run.state.trending, run.index, run.group.candidates, run.group.eligible)
        answer.sourced = cold.answer(run.call.fetch_n, answer.exclude)
        answer.rows, answer.scores = answer.sourced.rows, answer.sourced.scores
        answer.result.fallback = answer.sourced.first_source()
        run.state.metrics.fallbacks.labels(
            model.name, "Recommend", _FALLBACK_LABEL[answer.result.fallback]
        ).inc()


def fresh_rules(run: GroupRun, recent_ids: list[str] | None) -> FreshRules:
    """What a user's fresh items must honour: hidden items, exclusions, their recorded
    items, the candidate list and the filter (on the values the item-attributes file gives)."""
    call = run.call
    blocked = (
        *run.state.hidden_ids(run.model),
        call.exclude_ids,
        (recent_ids or ()) if call.exclude_seen else (),
    )
    return FreshRules(blocked, call.candidate_ids or None, call.filter)


def merge_fresh_items(run: GroupRun, answers: list[Answer]) -> None:
    """The fresh-item merge: a placed user's best fresh items join their list
    (``service/live/fresh.py``); fallback answers never hold fresh items (no user vector)."""
    index, fresh, n = run.index, run.group.fresh, run.call.fetch_n
    for answer in answers:
        if not answer.placed:
            continue
        answer.fresh = fresh
        if answer.vector is None:
            answer.vector = index.user_vector(answer.row)
        found = fresh_top(index, fresh, answer.vector, n, fresh_rules(run, run.recent.get(answer.user_id)))
        answer.rows, answer.scores = merge_fresh((answer.rows, answer.scores), found, n)


def rerank(run: GroupRun, answers: list[Answer]) -> None:
    """Re-ranking of each pool for diversity and per-attribute caps, to ``n`` items."""
    for answer in answers:
        pool = (answer.rows, answer.scores)
        answer.rows, answer.scores = diversified(
            run.index, pool, run.call.n, run.call.diversify, answer.fresh
        )


def write_items(run: GroupRun, answers: list[Answer]) -> None:
    """The reply's items: ids and scores, flagged as fresh or with their fallback source."""
    items = run.index.items
    for answer in answers:
        if answer.sourced is not None:
            add_sourced(answer.result.items, items, answer.rows, answer.scores, answer.sourced)
        else:
            add_ranked(answer.result.items, items, answer.fresh, answer.rows, answer.scores)


def explaining_history(
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


def explain(run: GroupRun, answers: list[Answer]) -> None:
    """Decoration: each placed user's items with the history items that explain them."""
    index = run.index
    for answer in answers:
        if not answer.placed:
            continue
        history, rating_of = explaining_history(index, answer.row, answer.evidence)
        fresh = None if answer.fresh is None else answer.fresh.factors
        reasons = explained(index, answer.rows, history, run.call.explain, fresh)
        add_explanations(answer.result.items, index.items, reasons, rating_of)


def _distribution(index, vector: np.ndarray, rows: np.ndarray, fresh: FreshOverlay | None) -> np.ndarray:
    """The rating distribution of a user vector over ``rows`` (fresh items' from their vectors)."""
    model = index.rating_distribution()
    if fresh is None or not (rows >= fresh.base).any():
        return model.distribution_for(vector, rows)
    return model.distribution_of_factors(vector, item_vectors(index, rows, fresh.factors))


def distributions(run: GroupRun, answers: list[Answer]) -> None:
    """Decoration: each placed user's rating distribution of every item."""
    index = run.index
    for answer in answers:
        rows = answer.rows
        if not answer.placed or rows is None:  # rows: every placed user's are scored by now
            continue
        if answer.vector is None:
            dist = index.rating_distribution().distribution(answer.row, rows)
        else:
            dist = _distribution(index, answer.vector, rows, answer.fresh)
        for item, probs in zip(answer.result.items, dist):
            item.rating_distribution.extend(probs.tolist())


def sample(run: GroupRun, answers: list[Answer]) -> None:
    """Sampling for online evaluation: the answers a sampled user was shown."""
    online, model = run.state.online, run.model
    for answer in answers:
        if online.wants_sample():
            online.sample(
                model.name, model.version, answer.user_id, [item.id for item in answer.result.items]
            )


def plan(call: RecommendCall, group: VersionGroup) -> tuple[Stage, ...]:
    """The stages a request needs, in order, after :func:`exclusions`."""
    stages: list[Stage] = [score_known, fold_in, fall_back]
    if group.fresh is not None:
        stages.append(merge_fresh_items)
    if call.diversify.active:
        stages.append(rerank)
    stages.append(write_items)
    if call.explain:
        stages.append(explain)
    if call.with_distribution:
        stages.append(distributions)
    stages.append(sample)
    return tuple(stages)


def run_group(run: GroupRun, user_ids: list[str], results: list) -> None:
    """Fill ``results`` (one per user, in order) with the group's version's answers."""
    answers = exclusions(run, user_ids, results)
    run.state.users_counters.get(run.model).inc(len(user_ids))
    for stage in plan(run.call, run.group):
        stage(run, answers)
