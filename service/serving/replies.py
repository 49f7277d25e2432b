"""External ids to rows and ranked rows to reply entries, shared by the RPC modules."""

from __future__ import annotations

import numpy as np

from ordrec.service.errors import NotFound
from ordrec.service.indices.explain import Explained
from ordrec.service.live.fresh import FreshOverlay
from ordrec.service.serving.fallbacks import Sourced
from ordrec.service.storage.idmap import IdMap

NO_ROWS = np.zeros(0, dtype=np.int64)
NO_ROWS.flags.writeable = False  # shared by every call: nothing may write to it


def known_rows(ids: IdMap, externals: list[str]) -> np.ndarray:
    """Rows of the ids the map knows (unknown ones left out)."""
    rows = ids.rows(externals)
    return rows[rows >= 0]


def rows_or_not_found(ids: IdMap, externals: list[str], what: str) -> np.ndarray:
    """Rows of ``externals``; NotFound naming the first few the map does not know."""
    rows = ids.rows(externals)
    missing = [e for e, r in zip(externals, rows) if r < 0]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise NotFound(f"unknown {what}: {shown}{more}")
    return rows


def known_or_fresh_rows(ids: IdMap, fresh: FreshOverlay, externals: list[str]) -> np.ndarray:
    """Rows of the trained items of a candidate list; NotFound for an id neither trained nor fresh."""
    rows = ids.rows(externals)
    fresh_ids = set(fresh.ids)
    missing = [e for e, r in zip(externals, rows) if r < 0 and e not in fresh_ids]
    if missing:
        rows_or_not_found(ids, missing, "candidate item ids")
    return rows[rows >= 0]


def merged_rows(ids: IdMap, fresh: FreshOverlay, externals: list[str]) -> np.ndarray:
    """Rows of trained items, ``fresh.base + j`` of fresh item ``j``, -1 for ids that are neither."""
    rows = ids.rows(externals)
    for position in np.flatnonzero(rows < 0).tolist():
        found = fresh.position.get(externals[position])
        if found is not None:
            rows[position] = fresh.base + found
    return rows


def add_scored(container, ids: IdMap, rows: np.ndarray, scores: np.ndarray) -> None:
    """Append (id, score) entries to a repeated ScoredId field in place (no
    temporary messages to copy: this runs on every request)."""
    add, externals = container.add, ids.ids
    for row, score in zip(rows.tolist(), scores.tolist()):
        add(id=externals[row], score=score)


def add_scored_fresh(
    container, ids: IdMap, fresh: FreshOverlay, rows: np.ndarray, scores: np.ndarray
) -> None:
    """:func:`add_scored` for answers holding fresh items (rows past the version's), flagged."""
    add = container.add
    for row, external, score in zip(rows.tolist(), fresh.external(rows, ids.ids), scores.tolist()):
        add(id=external, score=score, fresh=row >= fresh.base)


def add_ranked(
    container, ids: IdMap, fresh: FreshOverlay | None, rows: np.ndarray, scores: np.ndarray
) -> None:
    """:func:`add_scored`, or :func:`add_scored_fresh` when the version has fresh items."""
    if fresh is None:
        add_scored(container, ids, rows, scores)
    else:
        add_scored_fresh(container, ids, fresh, rows, scores)


def add_sourced(container, ids: IdMap, rows: np.ndarray, scores: np.ndarray, sourced: Sourced) -> None:
    """:func:`add_scored` for a fallback answer, each item flagged with its source (trending or
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


def add_explanations(items, ids: IdMap, reasons: Explained, rating_of: dict[int, float]) -> None:
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
