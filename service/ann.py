"""Approximate maximum-inner-product search for large catalogues.

DCR's serving index folds the level weights into the user side, so its top-N
is a maximum-inner-product search over the item factors. Exact search reads
every item once per request; above ``ann_min_items`` items the trainer also
publishes a graph index (faiss ``IndexHNSWFlat`` with the inner-product metric)
inside the version, and the server answers from it. Why faiss and these
parameters: ``docs/catalog.md`` (the measured library comparison).

The file is written with ``faiss.write_index`` and opened with
``faiss.read_index(path, IO_FLAG_MMAP_IFC)``: the vectors stay in the
memory-mapped file (shared between the server's processes through the page
cache), only the graph is read into memory, and nothing is unpickled.

Semantics match exact scoring: excluded items are filtered inside the graph
search (faiss's ID selector), never returned, and the search breadth grows
by their number (they crowd the user's best region); when the search comes back
with fewer than ``n`` eligible items the breadth grows, and past a bound the
caller's exact path answers, so ``n`` results come back whenever ``n``
eligible items exist. Hidden and filtered-out items (``service/rules.py``)
are skipped the same way, through a bitmap selector joined with the
exclusions; being spread over the catalogue rather than crowded near the
user, they widen the walk by the inverse of the eligible share.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ordrec.service.artifacts import ArtifactError, SearchIndex
from ordrec.service.rules import Eligible

LIBRARY = "faiss-hnsw-ip"

# Catalogues below this many items are scored exactly: there the exact pass stays within the
# latency budget and close to the graph search, needs no build and is never approximate
# (docs/catalog.md has the crossover measurements; MovieLens and Netflix sizes stay exact).
ANN_MIN_ITEMS = 30_000
# Graph degree and build breadth (M, efConstruction) and the search breadth (efSearch).
# On the planted 10^6-item catalogue ef_search 64 already reaches recall@10 0.99; 128 keeps
# a margin for harder factors (those trained on sparse data are: docs/catalog.md).
DEFAULT_PARAMS = {"M": 32, "ef_construction": 128, "ef_search": 128}
# The search breadth grows by this factor when a filtered search finds too few items ...
_GROWTH = 4
# ... up to this breadth; wider walks cost about what the exact pass does (docs/catalog.md).
_MAX_EF = 4096
# Exclusions above this fraction of the catalogue go straight to the exact pass: a graph
# search that must skip most of what it visits degrades towards a full scan anyway.
MAX_EXCLUDED_FRACTION = 0.05
# Down to this share of eligible items a filtered walk keeps its breadth (service/ann.py, search).
ELIGIBLE_SHARE_NOT_WIDENED = 0.5
# Below this share of eligible items (hidden or filtered out: service/rules.py) the caller
# scores the eligible rows exactly; the graph walk would visit mostly blocked ones.
MIN_ELIGIBLE_FRACTION = 0.1

Ranked = tuple[np.ndarray, np.ndarray]


def _faiss():
    # Imported on first use: a server without a large catalogue never loads faiss.
    import faiss

    return faiss


def build_params(params: dict[str, Any] | None = None) -> dict[str, int]:
    """Defaults overridden by ``params``; unknown names are an error."""
    merged = dict(DEFAULT_PARAMS)
    for key, value in (params or {}).items():
        if key not in DEFAULT_PARAMS:
            raise ValueError(f"unknown index parameter {key!r} (known: {', '.join(DEFAULT_PARAMS)})")
        merged[key] = int(value)
    for key, value in merged.items():
        if value < 1:
            raise ValueError(f"index parameter {key} must be >= 1, got {value}")
    return merged


def write_index(vectors: np.ndarray, path: Path, params: dict[str, int]) -> None:
    """Build the graph over ``vectors`` (rows are ids) and write it to ``path``.

    Parameters
    ----------
    vectors : ndarray, shape (n, d)
        Item factors; converted to C-contiguous float32.
    path : Path
        Where to write (faiss's own format, no pickle).
    params : dict
        ``M`` and ``ef_construction`` (see :data:`DEFAULT_PARAMS`).
    """
    faiss = _faiss()
    # Build on every core unless OMP_NUM_THREADS says otherwise; set explicitly because opening
    # an index for serving (AnnSearch.open) sets this process's faiss to one thread.
    faiss.omp_set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 0) or os.cpu_count() or 1)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    index = faiss.IndexHNSWFlat(vectors.shape[1], int(params["M"]), faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = int(params["ef_construction"])
    index.add(vectors)
    faiss.write_index(index, str(path))


def item_index(item_factors: np.ndarray, params: dict[str, Any] | None = None) -> SearchIndex:
    """The artifact entry for an item index, built when the version is published."""
    merged = build_params(params)
    return SearchIndex(
        library=LIBRARY, params=merged, write=lambda path: write_index(item_factors, path, merged)
    )


@dataclass
class AnnSearch:
    """An opened item index answering top-N by inner product with exclusions.

    Read-only once opened, like every serving index: ``search`` allocates its
    own parameters per call, so threads share it without locks.
    """

    index: Any
    n_items: int
    ef_search: int
    description: str

    @classmethod
    def open(cls, entry: SearchIndex, n_items: int, dim: int) -> AnnSearch:
        """Open a verified index file (memory-mapped) and check it matches the item factors."""
        if entry.library != LIBRARY:
            raise ArtifactError(f"index library {entry.library!r} is not {LIBRARY!r}")
        if entry.path is None:
            raise ArtifactError("index has no file (not published)")
        faiss = _faiss()
        try:
            index = faiss.read_index(str(entry.path), faiss.IO_FLAG_MMAP_IFC)
        except RuntimeError as exc:
            raise ArtifactError(f"{entry.path}: not a faiss index: {str(exc).splitlines()[0]}") from None
        if not isinstance(index, faiss.IndexHNSWFlat) or index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise ArtifactError(f"{entry.path}: not an inner-product HNSW index")
        if index.ntotal != n_items or index.d != dim:
            raise ArtifactError(
                f"{entry.path}: indexes {index.ntotal} x {index.d}, the items are {n_items} x {dim}"
            )
        # One thread per search (a request is one query; the server's processes are pinned
        # one per core), also where OMP_NUM_THREADS is not set, as in the trainer's evaluation.
        faiss.omp_set_num_threads(1)
        try:
            params = build_params(entry.params)
        except ValueError as exc:
            raise ArtifactError(f"{entry.path}: {exc}") from None
        ef = params["ef_search"]
        return cls(index, n_items, ef, f"{LIBRARY} M={params['M']} ef_search={ef}")

    def vectors(self) -> np.ndarray:
        """The indexed item vectors, read-only, shape ``(n_items, d)``: a view of the index's own
        memory-mapped storage, so the server holds the item factors once, not twice. Valid as long
        as this object lives."""
        faiss = _faiss()
        storage = faiss.downcast_index(self.index.storage)
        n, d = storage.ntotal, storage.d
        view = faiss.rev_swig_ptr(storage.get_xb(), n * d).reshape(n, d)
        view.flags.writeable = False
        return view

    def search(
        self, query: np.ndarray, n: int, exclude: np.ndarray | None, eligible: Eligible | None = None
    ) -> Ranked | None:
        """The ``n`` best item rows for ``query`` with their inner products, best first.

        Parameters
        ----------
        query : ndarray, shape (d,)
            Folded user vector, float32.
        n : int
            Results wanted.
        exclude : ndarray of int or None
            Item rows never to return (any order, repeats allowed).
        eligible : Eligible or None
            Hidden and filtered-out items (``service/rules.py``), skipped inside
            the walk through a bitmap selector, like ``exclude``.

        Returns
        -------
        (rows, products) or None
            ``min(n, eligible)`` rows and their inner products; None when the graph
            cannot give that many eligible items cheaply and the caller should score
            every item.
        """
        faiss = _faiss()
        if exclude is not None and exclude.size:
            exclude = np.unique(exclude)
        excluded = 0 if exclude is None else exclude.size
        blocked = 0 if eligible is None else eligible.blocked_rows.size
        also_excluded = excluded  # excluded rows that are not blocked anyway
        if eligible is not None and blocked and exclude is not None and excluded:
            also_excluded = int((~eligible.blocked[exclude]).sum())
        left = self.n_items - blocked - also_excluded
        want = min(n, left)
        if want <= 0:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        if excluded > MAX_EXCLUDED_FRACTION * self.n_items or left < MIN_ELIGIBLE_FRACTION * self.n_items:
            return None
        query = np.ascontiguousarray(query, dtype=np.float32).reshape(1, -1)
        params = faiss.SearchParametersHNSW()
        if excluded or blocked:
            # faiss holds raw pointers: these locals keep every selector alive through the searches.
            selectors = _selectors(faiss, exclude, eligible)
            params.sel = selectors[-1]
        # Excluded items are mostly the user's own best (the training items the model fits), so
        # a filtered walk must step over them: widen it by their number, as over-fetching would.
        # Blocked items (hidden, filtered out) are spread over the catalogue instead: the walk
        # meets about one eligible item per 1/share visited. While at least half are eligible
        # the walk's breadth already holds enough of them (recall unchanged, docs/catalog.md);
        # below that it widens so the eligible candidates stay at half the breadth.
        share = left / self.n_items
        widen = max(1.0, ELIGIBLE_SHARE_NOT_WIDENED / share)
        ef = min(max(int((self.ef_search + excluded) * widen), want), _MAX_EF)
        while ef <= _MAX_EF:
            params.efSearch = ef
            scores, rows = self.index.search(query, want, params=params)
            rows, scores = rows[0], scores[0]
            if (rows >= 0).all():  # faiss pads with -1 when the walk found fewer eligible items
                return rows.astype(np.int64), scores.astype(np.float32)
            ef *= _GROWTH
        return None


def _selectors(faiss, exclude: np.ndarray | None, eligible: Eligible | None) -> list:
    """Selectors of the rows a walk may return, the last one the one to use (the others, and the
    bitmap it points into, are kept alive with it).

    With rules, one bitmap of the allowed rows with this request's exclusions cleared: a
    single selector test per visited node (an Or of a bitmap and a hash set, behind a Not,
    measured +12 % on a plain walk with 10^3 hidden items).
    """
    if eligible is None or not eligible.blocked_rows.size:
        batch = faiss.IDSelectorBatch(np.ascontiguousarray(exclude, dtype=np.int64))
        return [batch, faiss.IDSelectorNot(batch)]
    bits = eligible.allowed_bits
    if exclude is not None and exclude.size:
        bits = bits.copy()
        np.bitwise_and.at(bits, exclude >> 3, ~np.left_shift(np.uint8(1), (exclude & 7).astype(np.uint8)))
    return [bits, faiss.IDSelectorBitmap(eligible.blocked.size, faiss.swig_ptr(bits))]
