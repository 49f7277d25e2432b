"""Fresh items: items a served version was not trained on, served before the next training.

RecordInteractions writes every interaction to the ``ordrec:events`` stream
(``service/live/redis_state.py``). :class:`FreshEvidence` reads that stream on a timer, from where it
left off, and keeps what users recorded for items the loaded versions do not know: per item,
user id -> rating text ("" for an interaction without a rating), the latest per user. It is
bounded (:data:`MAX_FRESH_ITEMS` items, the least recently touched dropped first;
:data:`MAX_RATERS` users per item, the latest kept) and fails open: without Redis, or while it
is down, nothing is fresh and Recommend answers as before.

Per version, :class:`FreshItems` folds each fresh item in from the ratings of the users that
version knows, the item-side mirror of user fold-in (``fold_in_item`` of the DCR and COE
indices: per-level item factors solved against the fixed user factors; a point on COE's map
from the raters' points), each rating read against its rater's own ratings so the item goes
to the audience its raters stand for, not to everyone. The result, a :class:`FreshOverlay`, is cached per version and
rebuilt only for items whose evidence changed. Recommend scores the overlay with the version's
own formula and merges it with the index's top-k (``merge_fresh``).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import redis

from ordrec.service.indices.item_attributes import ItemAttributeTable
from ordrec.service.indices.models.base import Ranked, RecommenderIndex, usable_evidence
from ordrec.service.indices.rules import Eligible, FilterError, ItemAttributes
from ordrec.service.indices.similar import similar_items, similarities

log = logging.getLogger("ordrec.fresh")

EVENTS_STREAM = "ordrec:events"  # the stream RecordInteractions writes (service/live/redis_state.py)
MAX_FRESH_ITEMS = 1000
MAX_RATERS = 200
READ_BATCH = 5000  # stream entries per read; a refresh reads at most MAX_READS batches
MAX_READS = 20
DEFAULT_INTERVAL = 1.0


@dataclass(frozen=True)
class ItemEvidence:
    """What users recorded for one fresh item: user id -> rating text ("" without one), and a
    stamp that changes whenever it does (so a version's overlay rebuilds only this item)."""

    raters: dict[str, str]
    stamp: int


@dataclass(frozen=True)
class Evidence:
    """A consistent view of every fresh item's evidence; replaced whole on each change."""

    items: dict[str, ItemEvidence] = field(default_factory=dict)
    generation: int = 0


class FreshEvidence:
    """Reads the events stream incrementally and keeps the evidence for unknown items.

    ``known(item_id)`` says whether every loaded version knows an item (then it is not
    fresh). :meth:`refresh` reads what was added since the last call; :meth:`start` calls it
    every ``interval`` seconds on a daemon thread.
    """

    def __init__(
        self,
        client: redis.Redis | None,
        known: Callable[[str], bool],
        healthy: Callable[[], bool] = lambda: True,
        interval: float = DEFAULT_INTERVAL,
        max_items: int = MAX_FRESH_ITEMS,
        max_raters: int = MAX_RATERS,
    ):
        self.client, self.known, self.healthy = client, known, healthy
        self.interval, self.max_items, self.max_raters = interval, max_items, max_raters
        self._items: OrderedDict[str, OrderedDict[str, str]] = OrderedDict()
        self._stamps: dict[str, int] = {}
        self._cursor = "0-0"
        self._evidence = Evidence()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> Evidence:
        """The latest evidence (no Redis call: the timer refreshes it)."""
        return self._evidence

    def refresh(self) -> int:
        """Read the stream entries added since the last refresh; how many were read."""
        if self.client is None or not self.healthy():
            return 0
        read = 0
        changed = False
        try:
            for _ in range(MAX_READS):
                entries = cast(
                    list[tuple[str, dict[str, str]]],
                    self.client.xrange(EVENTS_STREAM, min=f"({self._cursor}", count=READ_BATCH) or [],
                )
                for entry_id, fields in entries:
                    self._cursor = entry_id
                    changed |= self._add(fields)
                read += len(entries)
                if len(entries) < READ_BATCH:
                    break
        except redis.RedisError as exc:
            log.debug("fresh items not refreshed: %s", exc)
        if changed:
            self._publish()
        return read

    def add_entries(self, entries: Iterable[dict[str, str]]) -> None:
        """Take events (fields ``user``, ``item`` and optionally ``value``, as in the stream)
        without Redis: what :meth:`refresh` does with what it reads (benchmarks, tests)."""
        changed = False
        for fields in entries:
            changed |= self._add(fields)
        if changed:
            self._publish()

    def _add(self, fields: dict[str, str]) -> bool:
        """Keep one stream entry when its item is fresh; whether the evidence changed."""
        item, user = fields.get("item"), fields.get("user")
        if not item or not user or (item not in self._items and self.known(item)):
            return False
        raters = self._items.get(item)
        if raters is None:
            raters = self._items[item] = OrderedDict()
            while len(self._items) > self.max_items:
                dropped, _ = self._items.popitem(last=False)
                self._stamps.pop(dropped, None)
        self._items.move_to_end(item)
        raters.pop(user, None)
        raters[user] = fields.get("value", "")
        while len(raters) > self.max_raters:
            raters.popitem(last=False)
        self._stamps[item] = self._stamps.get(item, 0) + 1
        return True

    def _publish(self) -> None:
        items = {i: ItemEvidence(dict(r), self._stamps[i]) for i, r in self._items.items()}
        self._evidence = Evidence(items, self._evidence.generation + 1)

    def forget_known(self) -> None:
        """Drop items every loaded version now knows (a new version was trained on them)."""
        stale = [item for item in self._items if self.known(item)]
        for item in stale:
            del self._items[item]
            self._stamps.pop(item, None)
        if stale:
            self._publish()

    def start(self) -> None:
        if self._thread is None and self.client is not None:
            self._thread = threading.Thread(target=self._run, name="ordrec-fresh-items", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
                self.forget_known()
            except Exception:  # noqa: BLE001 - the reader must survive anything
                log.exception("refreshing fresh items failed")
            self._stop.wait(self.interval)


@dataclass(frozen=True)
class FreshAttributes:
    """The fresh items' attribute values (from the newer item-attributes file) in the
    version's columns, so a request's filter is evaluated on them as on trained items."""

    values: ItemAttributes
    described: np.ndarray  # bool per fresh item: the file gives it a value in some column

    def allowed(self, text: str) -> np.ndarray:
        """The fresh items ``text`` lets through: described ones whose values pass (cached per
        overlay); FilterError as for the version's items."""
        return self.described & ~self.values.eligible(text).blocked


def fresh_attributes(
    version: ItemAttributes, table: ItemAttributeTable | None, ids: list[str]
) -> FreshAttributes:
    """The values ``table`` gives ``ids`` in each of the version's columns of the same type
    (a column the file lacks, or has with the other type, leaves them without values)."""
    columns: list[dict] = []
    described = np.zeros(len(ids), dtype=bool)
    for name, kind in version.column_types().items():
        if kind == "numeric":
            numbers = table.numeric.get(name, {}) if table is not None else {}
            values: list | np.ndarray = np.array([numbers.get(i, np.nan) for i in ids], dtype=np.float64)
            described |= ~np.isnan(values)
        else:
            lists = table.categorical.get(name, {}) if table is not None else {}
            values = [lists.get(i, []) for i in ids]
            described |= np.array([bool(v) for v in values], dtype=bool)
        columns.append({"name": name, "type": kind, "values": values})
    return FreshAttributes(ItemAttributes.from_columns(columns, len(ids)), described)


@dataclass(frozen=True)
class FreshOverlay:
    """A version's fresh items: ids and factors (DCR) or map points (COE); fresh item ``j`` is
    row ``base + j`` of the merged answers (``base``: the version's item count); their
    attribute values where the item-attributes file lists them."""

    ids: list[str]
    factors: np.ndarray
    base: int
    attributes: FreshAttributes

    @functools.cached_property
    def max_bytes(self) -> int:
        """The longest fresh id in UTF-8 bytes (the reply's size bound)."""
        return max((len(i.encode("utf-8")) for i in self.ids), default=0)

    def __len__(self) -> int:
        return len(self.ids)

    @functools.cached_property
    def position(self) -> dict[str, int]:
        """Fresh item id -> its position in ``ids``."""
        return {item: j for j, item in enumerate(self.ids)}

    def positions(self, item_ids: Collection[str]) -> list[int]:
        """Positions of those of ``item_ids`` that are fresh items (walking the shorter side:
        a hidden set may be large, the overlay too)."""
        if len(item_ids) <= len(self.ids):
            found = (self.position.get(item) for item in item_ids)
            return [j for j in found if j is not None]
        lookup = item_ids if isinstance(item_ids, (set, frozenset)) else set(item_ids)
        return [j for j, item in enumerate(self.ids) if item in lookup]

    def external(self, rows: np.ndarray, trained_ids: list[str]) -> list[str]:
        """External ids of merged rows (trained items and fresh ones)."""
        return [trained_ids[r] if r < self.base else self.ids[r - self.base] for r in rows.tolist()]


def _categorical_items(attributes: ItemAttributeTable | None) -> list[str]:
    """Items a file gives categorical values, in file order (what attribute-only fresh items
    can be placed by)."""
    if attributes is None:
        return []
    listed: dict[str, None] = {}
    for by_item in attributes.categorical.values():
        listed.update((item, None) for item, values in by_item.items() if values)
    return list(listed)


class FreshItems:
    """Per-version overlays of the fresh items, rebuilt from :class:`FreshEvidence` on change.

    ``unknown_users(user_ids, rows)`` marks users whose evidence must not count (forgotten
    users, ``service/live/forgotten.py``) by setting their row to -1; ``users_token()`` returns an
    object that changes when those users do (the FORGOTTEN list), which rebuilds every item.
    """

    def __init__(
        self,
        evidence: FreshEvidence,
        unknown_users: Callable[[list[str], np.ndarray], np.ndarray] | None = None,
        max_versions: int = 8,
        attributes: ItemAttributeTable | None = None,
        users_token: Callable[[], object] = lambda: None,
        on_built: Callable[[RecommenderIndex, int], None] = lambda index, count: None,
    ):
        self.users_token, self.on_built = users_token, on_built
        self.evidence, self.unknown_users, self.max_versions = evidence, unknown_users, max_versions
        # A newer item-attributes file: its items no version knows and nobody rated yet are
        # placed like the trained items sharing their attribute values (``place_like_items``).
        self.attributes = attributes
        self._listed = _categorical_items(attributes)
        self._lock = threading.Lock()
        # id(index) -> (index, (generation, users token), overlay or None, item -> (stamp, factors))
        self._built: dict[int, tuple[RecommenderIndex, tuple, FreshOverlay | None, dict]] = {}

    def overlay(self, index: RecommenderIndex) -> FreshOverlay | None:
        """The version's fresh items; None when it has none (or its kind does not fold items in)."""
        current = self.evidence.current()
        if not (current.items or self._listed) or not index.folds_in:
            return None
        token = self.users_token()
        built = self._built.get(id(index))
        if built is not None and built[0] is index and built[1] == (current.generation, token):
            return built[2]
        with self._lock:
            built = self._built.get(id(index))
            per_item = {}
            if built is not None and built[0] is index and built[1][1] is token:
                per_item = built[3]
            overlay, per_item = self._build(index, current, per_item)
            versions = dict(self._built) if len(self._built) < self.max_versions else {}
            versions[id(index)] = (index, (current.generation, token), overlay, per_item)
            self._built = versions
        self.on_built(index, 0 if overlay is None else len(overlay))
        return overlay

    def _build(self, index: RecommenderIndex, current: Evidence, previous: dict) -> tuple:
        """The overlay, reusing ``previous`` factors of items whose evidence did not change."""
        per_item: dict[str, tuple[int, np.ndarray | None]] = {}
        for item, found in current.items.items():
            if index.items.row(item) >= 0:
                continue  # this version was trained on it
            before = previous.get(item)
            factors = (
                before[1] if before is not None and before[0] == found.stamp else self._fold(index, found)
            )
            if factors is None and self.attributes is not None:  # no rater the version knows
                factors = self._by_attributes(index, item)
            per_item[item] = (found.stamp, factors)
        for item in self._listed:
            if item not in per_item and len(per_item) < self.evidence.max_items and index.items.row(item) < 0:
                before = previous.get(item)
                per_item[item] = (-1, before[1] if before is not None else self._by_attributes(index, item))
        usable = [(item, f) for item, (_, f) in per_item.items() if f is not None]
        if not usable:
            return None, per_item
        ids = [item for item, _ in usable]
        attributes = fresh_attributes(index.item_attributes, self.attributes, ids)
        return FreshOverlay(ids, np.stack([f for _, f in usable]), len(index.items), attributes), per_item

    def _by_attributes(self, index: RecommenderIndex, item: str) -> np.ndarray | None:
        """The version's representation of an item like those sharing the item's categorical
        values (a value of each of its attributes, ``place_like_items``); None when none does."""
        assert self.attributes is not None
        clauses = []
        for name, by_item in self.attributes.categorical.items():
            values = [v for v in by_item.get(item, ()) if '"' not in v]
            if values and name in index.item_attributes.columns:
                clauses.append(f"{name} in (" + ", ".join(f'"{v}"' for v in values) + ")")
        if not clauses:
            return None
        try:
            rows = np.flatnonzero(index.item_attributes.allowed(" and ".join(clauses)))
        except FilterError:
            return None  # a value the version's attributes cannot take
        if rows.size == 0:
            return None
        return index.place_like_items(rows)

    def _fold(self, index: RecommenderIndex, found: ItemEvidence) -> np.ndarray | None:
        """One item's factors from the raters the version knows; None when there are none."""
        users = list(found.raters)
        rows = index.users.rows(users)
        if self.unknown_users is not None:
            rows = self.unknown_users(users, rows)
        evidence = usable_evidence(index, rows, [found.raters[u] for u in users])
        return None if evidence is None else index.fold_in_item(*evidence)


@dataclass(frozen=True)
class FreshRules:
    """Which fresh items one user may get: ids never to return (hidden, excluded, recorded),
    the candidate list when given, and the request's filter ("" for none)."""

    blocked_ids: tuple[Collection[str], ...]
    candidate_ids: Collection[str] | None
    filter: str = ""


def allowed_fresh(overlay: FreshOverlay, rules: FreshRules) -> np.ndarray:
    """Which fresh items ``rules`` let through, a bool per overlay item (a filter passes only
    fresh items with attribute values that pass it)."""
    allowed = overlay.attributes.allowed(rules.filter) if rules.filter else np.ones(len(overlay), dtype=bool)
    if rules.candidate_ids is not None and allowed.any():
        listed = np.zeros(len(overlay), dtype=bool)
        listed[overlay.positions(rules.candidate_ids)] = True
        allowed &= listed
    for ids in rules.blocked_ids:
        if ids and allowed.any():
            allowed[overlay.positions(ids)] = False
    return allowed


def _best(overlay: FreshOverlay, positions: np.ndarray, scores: np.ndarray, n: int) -> Ranked:
    """The ``n`` best of ``positions`` by ``scores`` (one per position) as merged rows, best
    first (the earlier fresh item among equals)."""
    order = np.argsort(-scores, kind="stable")[:n]
    return positions[order] + overlay.base, scores[order].astype(np.float32)


def fresh_top(
    index: RecommenderIndex, overlay: FreshOverlay, vector: np.ndarray, n: int, rules: FreshRules
) -> Ranked:
    """The user's ``n`` best eligible fresh items as merged rows and scores, best first."""
    positions = np.flatnonzero(allowed_fresh(overlay, rules))
    if positions.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    return _best(overlay, positions, index.score_factors(vector, overlay.factors)[positions], n)


def fresh_similar(
    index: RecommenderIndex, overlay: FreshOverlay, query_rows: np.ndarray, n: int, rules: FreshRules
) -> Ranked:
    """The ``n`` eligible fresh items most similar to the basket ``query_rows`` (merged rows:
    trained or fresh items, a set: repeats count once; never one of them), by the similarity
    of ``similar_items``."""
    allowed = allowed_fresh(overlay, rules)
    query_rows = np.unique(np.asarray(query_rows, dtype=np.int64))
    allowed[query_rows[query_rows >= overlay.base] - overlay.base] = False
    positions = np.flatnonzero(allowed)
    if positions.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    scores = similarities(index, query_rows, positions + overlay.base, overlay.factors)
    return _best(overlay, positions, scores, n)


def similar_with_fresh(
    index: RecommenderIndex,
    overlay: FreshOverlay | None,
    query_rows: np.ndarray,
    n: int,
    *,
    exclude: np.ndarray | None,
    eligible: Eligible | None,
    rules: FreshRules,
) -> Ranked:
    """SimilarItems' answer over trained and fresh items: ``similar_items`` (trained rows:
    ``exclude`` and ``eligible``) merged by score with :func:`fresh_similar` (fresh items:
    ``rules``); query rows may be fresh items (merged rows)."""
    factors = None if overlay is None else overlay.factors
    trained = similar_items(index, query_rows, n, exclude=exclude, eligible=eligible, fresh=factors)
    if overlay is None:
        return trained
    return merge_fresh(trained, fresh_similar(index, overlay, query_rows, n, rules), n)


def merge_fresh(trained: Ranked, fresh: Ranked, n: int) -> Ranked:
    """The ``n`` best of two ranked lists by score (the trained item first among equals)."""
    if fresh[0].size == 0:
        return trained
    rows = np.concatenate([trained[0], fresh[0]])
    scores = np.concatenate([np.asarray(trained[1], np.float32), np.asarray(fresh[1], np.float32)])
    order = np.argsort(-scores, kind="stable")[:n]
    return rows[order], scores[order]


def known_to_all(indices: Callable[[], list[RecommenderIndex]]) -> Callable[[str], bool]:
    """``known(item)`` for :class:`FreshEvidence`: whether every loaded recommender version
    knows the item (True when none is loaded: nothing to serve it to)."""

    def known(item: str) -> bool:
        loaded = indices()
        return all(index.items.row(item) >= 0 for index in loaded)

    return known
