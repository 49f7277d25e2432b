"""What every RPC reads: the served models and the live state around them (seen items,
hidden items, forgotten users, trending, fresh items, online evaluation, the batcher), with
the look-ups several RPCs share. Built once per servicer; the RPC modules take it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from prometheus_client import Counter

from ordrec.service.errors import InvalidArgument
from ordrec.service.indices.rules import MAX_FILTER_CHARS, Eligible, FilterError, combine
from ordrec.service.live.forgotten import ForgottenUsers
from ordrec.service.live.fresh import FreshItems, FreshOverlay
from ordrec.service.live.hidden import HiddenState
from ordrec.service.live.online import NoOnlineEvaluation
from ordrec.service.live.seen import SeenStore
from ordrec.service.live.trending import TrendingIndex
from ordrec.service.metrics import Metrics
from ordrec.service.serving import validation
from ordrec.service.serving.batching import RecommendBatcher
from ordrec.service.serving.store import LoadedModel, ModelStore
from ordrec.service.storage.hidden_items import ALL_MODELS

_Value = TypeVar("_Value")


class PerVersion(Generic[_Value]):
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


@dataclass
class ServingState:
    """The servicer's state. ``seen`` already leaves forgotten users out (``ForgetfulSeen``)."""

    store: ModelStore
    metrics: Metrics
    limits: validation.Limits
    seen: SeenStore
    hidden: HiddenState | None = None
    hidden_mirror: object = None
    online: NoOnlineEvaluation = field(default_factory=NoOnlineEvaluation)
    # None: each call scores on its own (the path the batched one must equal, in tests).
    batcher: RecommendBatcher | None = None
    forgotten: ForgottenUsers | None = None
    forget_client: object = None
    trending: TrendingIndex | None = None
    fresh: FreshItems | None = None
    users_counters: PerVersion[Counter] = field(init=False)

    def __post_init__(self) -> None:
        metrics = self.metrics
        self.users_counters = PerVersion(
            lambda model: metrics.recommended_users.labels(model.name, model.version)
        )

    @property
    def trending_name(self) -> str:
        return self.trending.name if self.trending else ""

    def model(self, name: str, rpc_name: str) -> LoadedModel:
        return self.store.resolve(validation.model_name(name), rpc_name)

    def is_forgotten(self, user_id: str) -> bool:
        return self.forgotten is not None and self.forgotten.contains(user_id)

    def fresh_overlay(self, index) -> FreshOverlay | None:
        """The version's fresh items (``service/live/fresh.py``), None without any."""
        return self.fresh.overlay(index) if self.fresh is not None else None

    def rules_stale(self) -> bool:
        return bool(self.hidden and self.hidden.stale)

    def hidden_ids(self, model: LoadedModel) -> tuple[frozenset[str], frozenset[str]]:
        """The ids hidden for every model and for ``model`` (fresh items are matched by id)."""
        sets = self.hidden.sets() if self.hidden else {}
        return sets.get(ALL_MODELS, frozenset()), sets.get(model.name, frozenset())

    def eligible(self, model: LoadedModel, text: str) -> Eligible | None:
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

    def batches(self, index) -> bool:
        """Whether the version's known users are scored with concurrent calls' (its scoring pass
        is dear enough: ``service/serving/batching.py``)."""
        return self.batcher is not None and index.scoring_work() >= self.batcher.min_work

    def score_known(self, index, rows, n, excludes, candidates, eligible, context) -> list:
        """The index's answers for users it knows: batched with concurrent calls when the
        version batches, else scored on this call's own thread."""
        batcher = self.batcher
        if batcher is None or not self.batches(index):
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
