"""Approximate maximum-inner-product search for large catalogues.

DCR's serving index folds the level weights into the user side, so its top-N
is a maximum-inner-product search over the item factors. Exact search reads
every item once per request; above ``ann_min_items`` items the trainer also
publishes a graph index (faiss HNSW with the inner-product metric) inside the
version, and the server answers from it. Why faiss and these parameters:
``docs/catalog.md`` (the measured library comparison).

The graph's vectors are stored as 8-bit scalar codes (``storage="sq8"``, a
quarter of the float bytes): the walk compares codes, and its best
``RERANK_FACTOR * n`` candidates are re-scored exactly from the version's float
item factors, which stay in their memory-mapped file and are read row by row.
``storage="flat"`` keeps float vectors in the graph (then exact scoring reads
them there). The search breadth ``ef_search`` is calibrated when the index is
built: the smallest breadth of :data:`EF_LADDER` whose recall@10 against exact
scoring, measured on the model's own users as served, reaches
``recall_target``; the manifest keeps the breadth and the recall it measured.

The file is written with ``faiss.write_index`` and opened with
``faiss.read_index(path, IO_FLAG_MMAP_IFC)``: the codes stay in the
memory-mapped file (shared between the server's processes through the page
cache), only the graph is read into memory, and nothing is unpickled.

Semantics match exact scoring: excluded items are filtered inside the graph
search (faiss's ID selector), never returned, and the search breadth grows
by their number (they crowd the user's best region). A user with more
exclusions than the calibration's users had (a long history) is searched as
they were, then the excluded items scoring above that answer say how deep the
exclusions push it: the search is repeated at the breadth the build measured
for that depth (``excluded_breadths``: the calibration users with their own
best items excluded, doubling from 16), or, deeper than ``max_excluded`` (where
no breadth held the recall of an ordinary user, or one cost more than scoring
every item), the caller's exact pass answers. When the search comes back
with fewer than ``n`` eligible items the breadth grows, and past a bound the
caller's exact path answers, so ``n`` results come back whenever ``n``
eligible items exist. Hidden and filtered-out items (``service/indices/rules.py``)
are skipped the same way, through a bitmap selector joined with the
exclusions; being spread over the catalogue rather than crowded near the
user, they widen the walk by the inverse of the eligible share.

``structure="ivf"`` builds an inverted file instead (faiss
``IndexIVFPQFastScan``: ``nlist`` k-means lists, 4-bit product codes of two
dimensions each, scanned with SIMD lookup tables). Its codes are an eighth of
the float bytes, so the server holds them in memory and re-scores ``rerank``
x n candidates (plus two per exclusion) from the version's mapped float factors;
``nprobe``, the lists scanned, is calibrated like ``ef_search`` and grows the
same way when a filtered scan finds too few items. Which to use: measured in
``docs/catalog.md``.

``structure="auto"`` (the default when no structure's own parameter is given) lets the
version's factors decide: both structures are built and calibrated at publish, and the
one with the lower CPU per query at its calibrated breadth among those reaching
``recall_target`` is kept (the higher recall when neither does); the manifest's params
record both (``compared``: breadth, recall, microseconds per query), which ``ordrec-train
versions`` prints. The inverted file is built first (seconds, its k-means trained on a sample);
the graph only when a build over a sample of the items predicts it finishes within what is left
of ``budget_seconds`` (at 10^6 items its build alone takes minutes). Each structure's seconds, and
a skipped one's prediction, are recorded in ``compared``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ordrec.service.indices.rules import Eligible
from ordrec.service.indices.topk import top_k
from ordrec.service.storage.artifact import ArtifactError, SearchIndex
from ordrec.service.storage.mapped import FileRows

LIBRARY = "faiss-hnsw-ip"
IVF_LIBRARY = "faiss-ivf-ip"

# Catalogues below this many items are scored exactly: there the exact pass stays within the
# latency budget and close to the graph search, needs no build and is never approximate
# (docs/catalog.md has the crossover measurements; MovieLens and Netflix sizes stay exact).
ANN_MIN_ITEMS = 30_000
# Graph degree and build breadth (M, efConstruction), the search breadth (efSearch: "auto"
# calibrates it at build time to reach recall_target), and how the graph stores its vectors.
DEFAULT_PARAMS: dict[str, Any] = {
    "structure": "hnsw",
    "M": 32,
    "ef_construction": 128,
    "ef_search": "auto",
    "storage": "sq8",
    "recall_target": 0.97,
}
STORAGES = ("flat", "sq8")
# The inverted file's lists ("auto": about 4 sqrt(n), a power of two, at least 39 training
# items per list as faiss's k-means wants), the lists scanned (calibrated like ef_search), and
# how many times n candidates its codes choose for the exact re-score.
IVF_DEFAULT_PARAMS: dict[str, Any] = {
    "structure": "ivf",
    "nlist": "auto",
    "nprobe": "auto",
    "rerank": 10,
    "recall_target": 0.97,
}
# ``structure="auto"``: build both structures at publish, calibrate each on the version's own
# users, keep the cheaper (CPU per query at its calibrated breadth) that reaches recall_target
# (the higher recall when neither does); the manifest records both (``compared``). The default
# when no structure is named and no structure's own parameter is given.
AUTO = "auto"
# ``budget_seconds``: the wall time the "auto" build may take (both structures built, calibrated
# and compared); the graph is skipped when its predicted build does not fit in what is left.
AUTO_DEFAULT_PARAMS: dict[str, Any] = {"structure": AUTO, "recall_target": 0.97, "budget_seconds": 120.0}
# "auto" builds the inverted file first (its build is short and predictable), then the graph if it fits.
AUTO_BUILD_ORDER = ("ivf", "hnsw")
# Items of the sample graph built to predict the whole graph's build time.
GRAPH_PROBE_ITEMS = 2_000
# Rounds of the calibration queries timed per structure; the cheapest round counts (CPU time of
# this thread: what a server process pays, less the noise of other work on the machine).
COST_ROUNDS = 3
# Lists scanned by the calibration, fewest first (the widest is capped at nlist).
NPROBE_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096)
# The scan of an "auto" inverted file built without queries to calibrate on.
UNCALIBRATED_NPROBE = 32
# Items per list the k-means trains on (a sample of the catalogue; faiss warns below 39), and
# its iterations (faiss's default 25; the calibrated nprobe absorbs coarser lists).
IVF_TRAIN_PER_LIST = 40
IVF_KMEANS_ITERATIONS = 10
# Breadths tried by the calibration, narrowest first; the widest stays below _MAX_EF. Steps of
# about 1.5x: the walk's cost grows with its breadth, so a step too wide is paid on every call.
EF_LADDER = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
# The breadth of an "auto" index built without queries to calibrate on.
UNCALIBRATED_EF_SEARCH = 128
# Users the calibration measures recall on (three seeded samples of 200 spread 0.96-0.99 at one
# breadth at 10^6 planted items: docs/catalog.md).
CALIBRATION_QUERIES = 200
# With quantised storage the walk returns this many times n candidates for the exact re-score.
RERANK_FACTOR = 2
# The search breadth grows by this factor when a filtered search finds too few items ...
_GROWTH = 4
# ... up to this breadth; wider walks cost about what the exact pass does (docs/catalog.md).
_MAX_EF = 4096
# Search parameters each serving thread keeps (one per breadth it searched at; most calls
# search at the calibrated breadth or one widened by a few exclusions).
_PARAMS_KEPT_PER_THREAD = 32
# Exclusions above this fraction of the catalogue go straight to the exact pass: a graph
# search that must skip most of what it visits degrades towards a full scan anyway.
MAX_EXCLUDED_FRACTION = 0.05
# Below that, the build measures how many exclusions the index still answers as well as it answers
# an ordinary user (``max_excluded`` in the manifest): the calibration users' own best items
# excluded, first this many, then twice as many each step, up to MAX_EXCLUDED_FRACTION.
EXCLUDED_LADDER_START = 16
# Calibration users measured at each step of that ladder (the first of the calibration's users),
# and of them, those whose exact pass is timed (the ladder stops where the index costs more).
EXCLUSION_CALIBRATION_QUERIES = 100
EXACT_COST_QUERIES = 5
# The inverted file re-scores this many candidates per exclusion: the 4-bit codes blur the close
# scores deep in a user's ranking, where the exclusions push the wanted items.
RERANK_PER_EXCLUDED = 2
# Excluded rows scored per block when measuring how deep a long history pushes the answer (the
# count stops once past max_excluded: a history of the user's best stops in the first block).
DEPTH_BLOCK = 512
# Down to this share of eligible items a filtered walk keeps its breadth (service/indices/ann.py, search).
ELIGIBLE_SHARE_NOT_WIDENED = 0.5
# Below this share of eligible items (hidden or filtered out: service/indices/rules.py) the caller
# scores the eligible rows exactly; the graph walk would visit mostly blocked ones.
MIN_ELIGIBLE_FRACTION = 0.1

Ranked = tuple[np.ndarray, np.ndarray]


_loaded_faiss: Any = None


def _faiss():
    # Imported on first use: a server without a large catalogue never loads faiss. Its OpenMP
    # threads sleep when idle unless told otherwise (read when faiss's libgomp loads): spinning
    # threads on a busy machine made a PQ training 16x slower on 2 threads than on one. Kept
    # once loaded: every search asks for it, and the environment and import lookups cost
    # microseconds a call.
    global _loaded_faiss
    if _loaded_faiss is None:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        import faiss

        _loaded_faiss = faiss
    return _loaded_faiss


def build_params(params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Defaults of the chosen ``structure`` ("hnsw" unless given) overridden by ``params``;
    an unknown name or a bad value is a ValueError.

    A published index's parameters also hold ``calibrated_recall`` (what the
    calibration measured at the breadth it chose).
    """
    params = params or {}
    structure = params.get("structure", _default_structure(params))
    if structure == AUTO:
        return _auto_params(params)
    if structure not in STRUCTURES:
        raise ValueError(
            f"index parameter structure must be one of {', '.join([*STRUCTURES, AUTO])}, got {structure!r}"
        )
    kind = STRUCTURES[structure]
    merged = dict(kind.defaults)
    for key, value in params.items():
        if key not in kind.defaults and key not in _RECORDED:
            raise ValueError(
                f"unknown index parameter {key!r} for structure {structure} (known: {', '.join(kind.defaults)})"
            )
        merged[key] = value
    for key in kind.integer_params:
        value = merged[key]
        if key in kind.auto_params and value == "auto":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
            raise ValueError(f"index parameter {key} must be an integer >= 1, got {value!r}")
        merged[key] = int(value)
    if "storage" in kind.defaults and merged["storage"] not in STORAGES:
        raise ValueError(
            f"index parameter storage must be one of {', '.join(STORAGES)}, got {merged['storage']!r}"
        )
    for key in ("recall_target", "calibrated_recall", "max_excluded_recall"):
        value = merged.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
            raise ValueError(f"index parameter {key} must be in (0, 1], got {value!r}")
    for key in ("calibrated_excluded", "max_excluded"):
        value = merged.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
            raise ValueError(f"index parameter {key} must be an integer >= 0, got {value!r}")
        if key in merged:
            merged[key] = int(value)
    steps = merged.get("excluded_breadths", [])
    if not isinstance(steps, list) or not all(isinstance(s, list) and len(s) == 2 for s in steps):
        raise ValueError(
            f"index parameter excluded_breadths must be [[excluded, breadth], ...], got {steps!r}"
        )
    return merged


# What a published index's parameters record beside the structure's own: the recall the
# calibration measured, and with "auto" both structures' calibration figures.
_RECORDED = (
    "calibrated_recall",
    "calibrated_excluded",
    "max_excluded",
    "max_excluded_recall",
    "excluded_breadths",
    "compared",
    "build_seconds",
    "build_phases",
)
# The figures of an "auto" trial that name its breadth (the rest: recall, cost, seconds).
_BREADTH_FIGURES = ("ef_search", "nlist", "nprobe")


class Phases:
    """Wall and CPU seconds (all of this process's threads: faiss builds on every core) of the
    named phases of a build, in order, as the manifest records them (``build_phases``)."""

    def __init__(self) -> None:
        self.taken: dict[str, dict[str, float]] = {}

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.taken[name] = {
                "seconds": round(time.perf_counter() - wall, 2),
                "cpu_seconds": round(time.process_time() - cpu, 2),
            }


def _default_structure(params: dict[str, Any]) -> str:
    """ "auto" unless a structure's own parameter is given: graph parameters alone (``M``,
    ``ef_search``, ...) mean the graph, as before "auto" existed."""
    return AUTO if set(params) <= set(AUTO_DEFAULT_PARAMS) - {"structure"} else "hnsw"


def _auto_params(params: dict[str, Any]) -> dict[str, Any]:
    """The checked parameters of ``structure="auto"``: only ``recall_target`` besides it."""
    unknown = sorted(set(params) - set(AUTO_DEFAULT_PARAMS))
    if unknown:
        raise ValueError(
            f"unknown index parameter {unknown[0]!r} for structure {AUTO} (known:"
            f" {', '.join(AUTO_DEFAULT_PARAMS)}; name a structure to set its own parameters)"
        )
    merged = {**AUTO_DEFAULT_PARAMS, **params}
    target, budget = merged["recall_target"], merged["budget_seconds"]
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0.0 < target <= 1.0:
        raise ValueError(f"index parameter recall_target must be in (0, 1], got {target!r}")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        raise ValueError(f"index parameter budget_seconds must be a number > 0, got {budget!r}")
    merged["budget_seconds"] = float(budget)
    return merged


def _kind(params: dict[str, Any]) -> type[AnnSearch]:
    """The search class of an index of these (merged) parameters."""
    return STRUCTURES[params.get("structure", "hnsw")]


def library_of(params: dict[str, Any]) -> str:
    """The manifest's library name for an index of these parameters ("auto": the graph's until
    the build has chosen; :func:`write_index` returns the one written)."""
    return LIBRARY if params.get("structure") == AUTO else _kind(params).library


def breadth_key(params: dict[str, Any]) -> str:
    """The parameter the calibration chooses: the graph's ``ef_search`` or the lists'
    ``nprobe``."""
    return _kind(params).breadth_param


def auto_nlist(n_items: int) -> int:
    """About 4 sqrt(n) lists, a power of two, with enough items per list to train on."""
    wanted = 4 * np.sqrt(max(n_items, 1))
    trainable = max(1, n_items // 39)
    return int(2 ** np.floor(np.log2(max(1, min(wanted, trainable)))))


@dataclass(frozen=True)
class Queries:
    """What the calibration searches with: query vectors as served (e.g. DCR's folded user
    factors) and, per query, the item rows the server would exclude (or None)."""

    vectors: np.ndarray
    excludes: list[np.ndarray] | None = None


def write_index(
    vectors: np.ndarray,
    path: Path,
    params: dict[str, Any],
    queries: Queries | None = None,
    truth: list[np.ndarray] | None = None,
    phases: Phases | None = None,
) -> str:
    """Build the index over ``vectors`` (rows are ids), write it to ``path`` and, when its
    breadth (``ef_search`` or ``nprobe``) is ``"auto"``, calibrate it in ``params``; with
    ``structure="auto"`` choose the structure (:func:`write_cheaper`). Returns the library
    written.

    Parameters
    ----------
    vectors : ndarray, shape (n, d)
        Item factors; converted to C-contiguous float32.
    path : Path
        Where to write (faiss's own format, no pickle).
    params : dict
        :func:`build_params` output. Completed in place: an ``"auto"`` ``nlist`` becomes
        :func:`auto_nlist`, the breadth becomes the one chosen and ``calibrated_recall`` its
        measured recall (:data:`UNCALIBRATED_EF_SEARCH` or :data:`UNCALIBRATED_NPROBE` when
        there are no queries).
    queries : Queries or None, default None
        The calibration's queries.
    truth : list of ndarray or None, default None
        :func:`exact_tops` of ``queries`` at 10, when the caller has it already.
    phases : Phases or None, default None
        Where the build and the calibration record their seconds (``<structure> build``,
        ``<structure> calibration``).
    """
    if params.get("structure") == AUTO:
        return write_cheaper(vectors, path, params, queries)
    phases = phases or Phases()
    faiss = _faiss()
    _build_threads(faiss)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    kind = _kind(params)
    structure = params.get("structure", "hnsw")
    with phases.timed(f"{structure} build"):
        faiss.write_index(kind.build(faiss, vectors, params), str(path))
    key = kind.breadth_param
    choose_breadth = params[key] == "auto"
    if choose_breadth:
        params[key] = kind.uncalibrated
    if queries is None or not len(queries.vectors):
        return kind.library
    search = AnnSearch.open(SearchIndex(kind.library, params, path=path), vectors)
    if choose_breadth:
        with phases.timed(f"{structure} calibration"):
            truth = truth or exact_tops(vectors, queries, 10)
            params[key], params["calibrated_recall"] = calibrate(search, queries, truth=truth)
    with phases.timed(f"{structure} exclusions"):
        # A user with a long history is held to the recall an ordinary user gets.
        floor = min(float(params["recall_target"]), float(params.get("calibrated_recall", 1.0)))
        covered = search.params["calibrated_excluded"] = calibrated_exclusions(queries)
        measured = calibrate_exclusions(search, queries.vectors, floor, covered)
        params["calibrated_excluded"], params["excluded_breadths"] = covered, measured.breadths
        params["max_excluded"], params["max_excluded_recall"] = measured.max_excluded, measured.recall
        if choose_breadth and truth is not None:  # the recall recorded: the index's as it serves
            params["calibrated_recall"] = round(served_recall(search, queries, truth), 4)
    return kind.library


def write_cheaper(vectors: np.ndarray, path: Path, params: dict[str, Any], queries: Queries | None) -> str:
    """``structure="auto"``: build and calibrate both structures on ``queries``, write the one
    :func:`cheaper` picks to ``path`` and replace ``params`` by its parameters, with both
    structures' figures under ``compared``. Without queries nothing can be compared: the
    graph, uncalibrated."""
    target = params["recall_target"]
    if queries is None or not len(queries.vectors):
        graph = build_params({"structure": "hnsw", "recall_target": target})
        library = write_index(vectors, path, graph, queries)
        params.clear()
        params.update(graph)
        return library
    started = time.perf_counter()
    phases = Phases()
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    figures: dict[str, dict[str, Any]] = {}
    trial_params: dict[str, dict[str, Any]] = {}
    # Both structures are calibrated against the same exact answers: computed once.
    with phases.timed("exact tops"):
        truth = exact_tops(vectors, queries, 10)
    for structure in AUTO_BUILD_ORDER:
        if trial_params:  # the first structure is always built: nothing to compare it with yet
            with phases.timed(f"{structure} prediction"):
                predicted = STRUCTURES[structure].predicted_build_seconds(vectors, params)
            left = params["budget_seconds"] - (time.perf_counter() - started)
            if predicted > left:
                figures[structure] = {
                    "skipped": True,
                    "predicted_seconds": round(predicted, 1),
                    "left_seconds": round(left, 1),
                }
                continue
        trial_params[structure], figures[structure] = _trial(
            vectors, path, structure, target, queries, truth, phases
        )
    chosen = cheaper({s: figures[s] for s in trial_params}, target)
    for structure in trial_params:
        trial_path = _trial_path(path, structure)
        if structure == chosen:
            os.replace(trial_path, path)
        else:
            trial_path.unlink()
    params.clear()
    params.update(trial_params[chosen])
    params["compared"] = figures
    params["build_seconds"] = round(time.perf_counter() - started, 1)
    params["build_phases"] = phases.taken
    return STRUCTURES[chosen].library


def _trial_path(path: Path, structure: str) -> Path:
    return path.with_name(f"{path.name}.{structure}")


def _trial(
    vectors: np.ndarray,
    path: Path,
    structure: str,
    target: float,
    queries: Queries,
    truth: list[np.ndarray],
    phases: Phases,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One structure of an "auto" build, built and calibrated beside ``path``: its parameters
    and its :func:`calibration_figures`, with the seconds it took."""
    started = time.perf_counter()
    trial = build_params({"structure": structure, "recall_target": target})
    trial_path = _trial_path(path, structure)
    library = write_index(vectors, trial_path, trial, queries, truth, phases)
    with phases.timed(f"{structure} cost"):
        search = AnnSearch.open(SearchIndex(library, trial, path=trial_path), vectors)
        figures = calibration_figures(search, queries)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    return trial, figures


def _build_threads(faiss) -> None:
    """Build on every core unless OMP_NUM_THREADS says otherwise; set explicitly because opening
    or searching an index (AnnSearch) sets this thread's faiss to one thread."""
    faiss.omp_set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 0) or os.cpu_count() or 1)


def calibration_figures(search: AnnSearch, queries: Queries, n: int = 10) -> dict[str, Any]:
    """What the auto choice records of a calibrated structure: its breadth parameter and
    value, the recall@n calibration measured, and its CPU per query there (microseconds,
    the cheapest of :data:`COST_ROUNDS` passes over the queries)."""
    pairs = list(_with_excludes(queries))
    rounds = []
    for _ in range(COST_ROUNDS):
        start = time.thread_time()
        for query, exclude in pairs:
            search.search(query, n, exclude)
        rounds.append((time.thread_time() - start) / max(1, len(pairs)))
    key = search.breadth_param
    return {
        key: int(search.params[key]),
        "recall": float(search.params["calibrated_recall"]),
        "us_per_query": round(min(rounds) * 1e6, 1),
        **({"nlist": int(search.params["nlist"])} if "nlist" in search.params else {}),
    }


def describe_choice(library: str, params: dict[str, Any]) -> str:
    """One line for ``ordrec-train versions``: the structure serving, at what breadth and
    recall, and with "auto" both structures' calibration figures."""
    key = breadth_key(params) if library in _BY_LIBRARY else ""
    recall = params.get("calibrated_recall")
    text = library + (f" {key}={params[key]}" if key in params else "")
    text += f" recall@10={recall:.3f}" if isinstance(recall, (int, float)) else ""
    most = params.get("max_excluded")
    text += f" exact above {int(most):,} exclusions" if isinstance(most, (int, float)) else ""
    compared = params.get("compared")
    if isinstance(compared, dict) and compared:
        parts = []
        parts = [_describe_trial(structure, figures) for structure, figures in sorted(compared.items())]
        text += f" (chosen of: {'; '.join(parts)})"
    seconds = params.get("build_seconds")
    return text + (f" built in {seconds:.1f} s" if isinstance(seconds, (int, float)) else "")


def describe_params(params: dict[str, Any]) -> str:
    """The parameters an index is about to be built with, as ``key=value`` pairs."""
    return " ".join(f"{k}={v}" for k, v in params.items())


def _describe_trial(structure: str, figures: dict[str, Any]) -> str:
    """One structure of an "auto" choice: its breadth, recall, cost and build seconds, or why
    it was not built."""
    if figures.get("skipped"):
        return (
            f"{structure} not built: predicted {figures.get('predicted_seconds', 0.0):.1f} s,"
            f" {figures.get('left_seconds', 0.0):.1f} s of the budget left"
        )
    breadth = " ".join(f"{k}={int(v)}" for k, v in sorted(figures.items()) if k in _BREADTH_FIGURES)
    recall, cost = figures.get("recall", 0.0), figures.get("us_per_query", 0.0)
    text = f"{structure} {breadth} recall {recall:.3f} {cost:.1f} us/query"
    return text + (f" {figures['seconds']:.1f} s" if "seconds" in figures else "")


def predicted_graph_seconds(
    vectors: np.ndarray, params: dict[str, Any], sample: int = GRAPH_PROBE_ITEMS
) -> float:
    """The graph's build time over ``vectors`` (default parameters), predicted from a build over
    ``sample`` of its rows: an insertion walks about log(n) layers of the graph, so the time
    grows as n log n. 0 when the catalogue is no larger than the sample (building it is as cheap
    as predicting)."""
    n = vectors.shape[0]
    if n <= sample:
        return 0.0
    faiss = _faiss()
    _build_threads(faiss)
    rows = np.sort(np.random.default_rng(0).choice(n, sample, replace=False))
    graph = build_params({"structure": "hnsw", "recall_target": params["recall_target"]})
    started = time.perf_counter()
    _build_hnsw(faiss, np.ascontiguousarray(vectors[rows]), graph)
    took = time.perf_counter() - started
    return took * (n / sample) * (np.log(n) / np.log(sample))


def cheaper(figures: dict[str, dict[str, Any]], recall_target: float) -> str:
    """The structure to serve: the cheapest per query among those whose calibrated recall
    reaches ``recall_target``; when none does, the one with the highest recall."""
    meeting = [s for s, f in figures.items() if f["recall"] >= recall_target]
    if meeting:
        return min(meeting, key=lambda s: figures[s]["us_per_query"])
    return max(figures, key=lambda s: figures[s]["recall"])


def _build_hnsw(faiss, vectors: np.ndarray, params: dict[str, Any]):
    d, m = vectors.shape[1], int(params["M"])
    if params["storage"] == "sq8":
        index = faiss.IndexHNSWSQ(d, faiss.ScalarQuantizer.QT_8bit, m, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)  # per-dimension ranges of the codes
    else:
        index = faiss.IndexHNSWFlat(d, m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = int(params["ef_construction"])
    index.add(vectors)
    return index


def _build_ivf(faiss, vectors: np.ndarray, params: dict[str, Any]):
    n, d = vectors.shape
    if params["nlist"] == "auto":
        params["nlist"] = auto_nlist(n)
    nlist = int(params["nlist"])
    if nlist > n:
        raise ValueError(f"index parameter nlist {nlist} is above the {n} items")
    # The lists' centroids are found by a small graph (many lists: a flat scan of them would cost
    # more than the codes it selects); two dimensions per 4-bit code, or one when d is odd.
    quantizer = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
    index = faiss.IndexIVFPQFastScan(
        quantizer, d, nlist, d // 2 if d % 2 == 0 else d, 4, faiss.METRIC_INNER_PRODUCT
    )
    # k-means assigns its sample with exact products (BLAS), not through the lists' graph that
    # it would rebuild every iteration; the graph is built once over the final centroids.
    index.clustering_index = faiss.IndexFlatIP(d)
    index.cp.niter = IVF_KMEANS_ITERATIONS
    sample = min(n, IVF_TRAIN_PER_LIST * nlist)
    rows = np.sort(np.random.default_rng(0).choice(n, sample, replace=False))
    index.train(vectors[rows])
    index.add(vectors)
    return index


def _map_in(array: np.ndarray, page: int = 4096) -> None:
    """Touch every page of a mapped array once: the inverted file re-scores its candidates
    from the mapping, and a page first touched inside a request costs that request a fault."""
    flat = array.reshape(-1).view(np.uint8) if array.flags.c_contiguous else None
    if flat is not None:
        int(flat[::page].sum())


def _ivf_holds(faiss, index, rows: np.ndarray, wanted: np.ndarray) -> bool:
    """Whether the inverted file stores ``wanted`` as its ``rows``: each row scored against a
    seeded random query (never zero, unlike some items) through the file's codes and through
    codes made now in an empty copy of the file (same lists, same quantiser), which agree
    exactly when the codes do."""
    probe = faiss.clone_index(index)
    probe.reset()
    probe.add_with_ids(wanted, rows)
    queries = np.random.default_rng(0).standard_normal(wanted.shape).astype(np.float32)

    def own_scores(ivf) -> np.ndarray:
        params = faiss.SearchParametersIVF()
        params.nprobe, params.sel = ivf.nlist, faiss.IDSelectorArray(rows)
        walk = faiss.SearchParametersHNSW()  # wide enough to reach every list's centroid
        walk.efSearch = 2 * ivf.nlist
        params.quantizer_params = walk
        scores, found = ivf.search(queries, len(rows), params=params)
        hit = found == rows[:, None]
        return np.where(hit.any(axis=1), scores[np.arange(len(rows)), hit.argmax(axis=1)], np.nan)

    stored, made_now = own_scores(index), own_scores(probe)
    return not np.isnan(stored).any() and np.array_equal(stored, made_now)


def item_index(
    item_factors: np.ndarray, params: dict[str, Any] | None = None, queries: Queries | None = None
) -> SearchIndex:
    """The artifact entry for an item index, built (and calibrated on ``queries``) when the
    version is published."""
    merged = build_params(params)
    return SearchIndex(
        library=library_of(merged),
        params=merged,
        write=lambda path: write_index(item_factors, path, merged, queries),
    )


def calibrate(
    search: AnnSearch, queries: Queries, n: int = 10, truth: list[np.ndarray] | None = None
) -> tuple[int, float]:
    """The narrowest breadth of the index's ladder (:data:`EF_LADDER`, or
    :data:`NPROBE_LADDER` up to its lists) whose recall@n against exact scoring reaches the
    index's ``recall_target``, and that recall; the widest breadth when none does.
    ``truth``: :func:`exact_tops` of the queries at ``n``, when the caller has it already."""
    if truth is None:
        truth = exact_tops(search.vectors(), queries, n)
    target = float(search.params["recall_target"])
    recall = 0.0
    for breadth in search.ladder():
        search.breadth = breadth
        recall = served_recall(search, queries, truth, n)
        if recall >= target:
            break
    return search.breadth, round(recall, 4)


def served_recall(search: AnnSearch, queries: Queries, truth: list[np.ndarray], n: int = 10) -> float:
    """Recall@n of the index's answers to ``queries`` against ``truth`` (:func:`exact_tops`)."""
    found = [search.search(q, n, ex) for q, ex in _with_excludes(queries)]
    # None: the server's exact pass answers that user (too many exclusions), exactly.
    hits = [t.size if f is None else np.intersect1d(f[0], t).size for f, t in zip(found, truth)]
    return float(np.sum(hits) / max(1, sum(t.size for t in truth)))


def exclusion_ladder(n_items: int, covered: int = 0) -> list[int]:
    """The exclusion counts :func:`calibrate_exclusions` measures: from
    :data:`EXCLUDED_LADDER_START` doubling, up to :data:`MAX_EXCLUDED_FRACTION` of the items,
    those above ``covered`` (what the breadth's calibration measured already)."""
    cap = int(MAX_EXCLUDED_FRACTION * n_items)
    steps = [int(EXCLUDED_LADDER_START * 2**k) for k in range(64) if EXCLUDED_LADDER_START * 2**k < cap]
    return [e for e in [*steps, cap] if covered < e]


def calibrated_exclusions(queries: Queries) -> int:
    """How many exclusions the breadth's calibration measured users with: the median of its
    users' (their histories, as served)."""
    return int(np.median([ex.size for ex in queries.excludes])) if queries.excludes else 0


@dataclass(frozen=True)
class ExclusionCalibration:
    """What :func:`calibrate_exclusions` measured: the breadth each step of
    :func:`exclusion_ladder` needs (``[[excluded, breadth], ...]``, steps up to ``max_excluded``),
    the most exclusions the index answers (more: the exact pass; at least those the breadth's
    calibration measured), and the lowest recall of a step kept."""

    breadths: list[list[int]]
    max_excluded: int
    recall: float


def calibrate_exclusions(
    search: AnnSearch, vectors: np.ndarray, floor: float, covered: int = 0, n: int = 10
) -> ExclusionCalibration:
    """Per step of :func:`exclusion_ladder`, the narrowest breadth (from the previous step's up the
    index's ladder) whose recall@n reaches ``floor`` (within the measurement's standard error)
    with that many of the user's own best items
    excluded: the deepest those exclusions can push the wanted items (a long history is mostly
    what the model rates highest); the wanted answer is the next ``n`` of the exact ranking.

    The ladder stops at the first step no breadth holds, or whose search costs more CPU than
    scoring every item: from there on the exact pass answers, right and no dearer.
    """
    steps = exclusion_ladder(search.n_items, covered)
    users = np.ascontiguousarray(vectors[:EXCLUSION_CALIBRATION_QUERIES], dtype=np.float32)
    if not steps or not len(users):
        return ExclusionCalibration([], covered, 1.0)
    ranked = _ranked_rows(search.vectors(), users, steps[-1] + n)
    exact_seconds = _exact_seconds(search.vectors(), users[:EXACT_COST_QUERIES], n)
    kept: list[list[int]] = []
    # Held: a recall the measurement cannot tell below ``floor`` (one standard error of a recall
    # of ``floor`` over these users' answers; at 0.97 and 100 users, 0.005).
    held_from = floor - np.sqrt(floor * (1.0 - floor) / (n * len(users)))
    lowest = 1.0
    breadths = search.ladder()
    for excluded in steps:
        wanted = [(rows[:excluded], rows[excluded : excluded + n]) for rows in ranked]
        start = kept[-1][1] if kept else search.breadth
        held = None
        for breadth in (b for b in breadths if b >= start):
            search.params["excluded_breadths"] = [*kept, [excluded, breadth]]
            recall, seconds = _recall_and_cost(search, users, wanted, n)
            if seconds > exact_seconds:
                break  # wider is dearer still: the exact pass answers from here
            if recall >= held_from:
                held = (breadth, recall)
                break
        if held is None:
            break
        kept.append([excluded, held[0]])
        lowest = min(lowest, held[1])
    search.params["excluded_breadths"] = kept
    return ExclusionCalibration(kept, kept[-1][0] if kept else covered, round(lowest, 4))


def _recall_and_cost(
    search: AnnSearch, users: np.ndarray, wanted: list[tuple[np.ndarray, np.ndarray]], n: int
) -> tuple[float, float]:
    """Recall@n of the index against ``wanted`` (per user: its exclusions and the exact answer),
    and the CPU seconds per search (this process's threads, as :func:`_exact_seconds`)."""
    hits = 0
    started = time.process_time()
    for query, (exclude, truth) in zip(users, wanted):
        found = search.search(query, n, exclude)
        # None: the exact pass answers (too many exclusions for the index), exactly.
        hits += truth.size if found is None else np.intersect1d(found[0], truth).size
    seconds = (time.process_time() - started) / len(users)
    return hits / max(1, sum(t.size for _, t in wanted)), seconds


def _exact_seconds(vectors: np.ndarray, users: np.ndarray, n: int) -> float:
    """CPU seconds per user of scoring every item and keeping the best ``n`` (the exact pass; this
    process's threads, as the product may run on several)."""
    started = time.process_time()
    for query in users:
        top_k(np.ascontiguousarray(vectors @ query), n)
    return (time.process_time() - started) / max(1, len(users))


def _ranked_rows(vectors: np.ndarray, users: np.ndarray, depth: int, block: int = 32) -> list[np.ndarray]:
    """Per user, the rows of the ``depth`` largest inner products, best first (a block of users
    per pass over ``vectors``)."""
    depth = min(depth, vectors.shape[0])
    ranked = []
    for start in range(0, len(users), block):
        scores = vectors @ users[start : start + block].T
        for column in scores.T:
            top = np.argpartition(-column, depth - 1)[:depth]
            ranked.append(top[np.argsort(-column[top], kind="stable")])
    return ranked


def calibration_warnings(indexes: dict[str, SearchIndex]) -> list[str]:
    """For the operator publishing a version: each calibrated index that missed its
    ``recall_target`` even at the widest breadth (it serves, at that breadth and recall)."""
    warnings = []
    for name, entry in sorted(indexes.items()):
        recall, target = entry.params.get("calibrated_recall"), entry.params.get("recall_target")
        if entry.library in _BY_LIBRARY and recall is not None and target is not None and recall < target:
            key = breadth_key(entry.params)
            warnings.append(
                f"index {name!r} reaches recall@10 {recall:.3f} at its widest breadth"
                f" ({key} {entry.params[key]}), below its recall_target {target}: Recommend"
                " answers approximately; set ann_min_items above the catalogue's size to score it"
                " exactly (docs/catalog.md)"
            )
    return warnings


def _with_excludes(queries: Queries) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    if queries.excludes is None:
        return ((q, None) for q in queries.vectors)
    return zip(queries.vectors, queries.excludes)


def exact_tops(vectors: np.ndarray, queries: Queries, n: int, block: int = 32) -> list[np.ndarray]:
    """Per query, the rows of the n largest inner products with its exclusions left out (a block
    of queries per pass over ``vectors``)."""
    pairs = list(_with_excludes(queries))
    tops = []
    for start in range(0, len(pairs), block):
        chunk = pairs[start : start + block]
        scores = vectors @ np.stack([q for q, _ in chunk]).astype(np.float32).T
        tops += [top_k(np.ascontiguousarray(scores[:, i]), n, ex)[0] for i, (_, ex) in enumerate(chunk)]
    return tops


@dataclass
class AnnSearch:
    """An opened item index answering top-N by inner product with exclusions.

    :meth:`open` picks the structure's class (:class:`GraphSearch`,
    :class:`InvertedFileSearch`); what differs between them (breadths, candidates,
    re-score, load check) is theirs, the search loop is here. Read-only once
    opened, like every serving index: ``search`` allocates its own parameters
    per call, so threads share it without locks.
    """

    # What the structure is called in manifests, its parameters (defaults, integers, those that
    # may be "auto"), the one the calibration chooses and its value without calibration, the
    # storages its files may hold, and how it is built.
    library: ClassVar[str]
    defaults: ClassVar[dict[str, Any]]
    integer_params: ClassVar[tuple[str, ...]]
    auto_params: ClassVar[tuple[str, ...]]
    breadth_param: ClassVar[str]
    uncalibrated: ClassVar[int]
    storages: ClassVar[tuple[str, ...]]

    index: Any
    n_items: int
    # The search breadth: the graph walk's ef_search, or the inverted file's lists scanned.
    breadth: int
    params: dict[str, Any]
    # The float item vectors exact scoring reads: the graph's own storage when it is flat, else
    # the version's memory-mapped item factors ...
    item_vectors: np.ndarray
    # ... and the version's item factors as the graph's re-score reads them (file reads, not the
    # mapping: the graph itself is most of the memory, so the floats stay in the page cache).
    item_rows: FileRows
    # Each serving thread's faiss search parameters by breadth, made once and reused (only the
    # selector changes from call to call): making them costs more than scanning the lists.
    _thread_params: threading.local = field(default_factory=threading.local, init=False, repr=False)

    @staticmethod
    def build(faiss, vectors: np.ndarray, params: dict[str, Any]) -> Any:
        """The faiss index over ``vectors`` (completes ``"auto"`` build parameters in place)."""
        raise NotImplementedError

    @staticmethod
    def predicted_build_seconds(vectors: np.ndarray, params: dict[str, Any]) -> float:
        """What an "auto" build expects this structure's build to take (0: not predicted, cheap)."""
        return 0.0

    @property
    def structure(self) -> str:
        return str(self.params["structure"])

    @property
    def quantised(self) -> bool:
        raise NotImplementedError

    @property
    def max_breadth(self) -> int:
        raise NotImplementedError

    def ladder(self) -> tuple[int, ...]:
        """The breadths the calibration tries, narrowest first."""
        raise NotImplementedError

    @property
    def description(self) -> str:
        """What ListModels and the metrics show: the library, structure, breadth, storage and
        the recall the calibration measured."""
        recall = self.params.get("calibrated_recall")
        return self._what() if recall is None else f"{self._what()} recall@10={recall:.3f}"

    def _what(self) -> str:
        raise NotImplementedError

    @classmethod
    def open(cls, entry: SearchIndex, items: np.ndarray) -> AnnSearch:
        """Open a verified index file (memory-mapped) and check it holds ``items``, the
        version's float item factors, shape ``(n_items, d)``."""
        kind = _BY_LIBRARY.get(entry.library)
        if kind is None:
            raise ArtifactError(
                f"index library {entry.library!r} is not one of {', '.join(map(repr, _BY_LIBRARY))}"
            )
        if entry.path is None:
            raise ArtifactError("index has no file (not published)")
        faiss = _faiss()
        try:
            index = faiss.read_index(str(entry.path), faiss.IO_FLAG_MMAP_IFC)
        except RuntimeError as exc:
            raise ArtifactError(f"{entry.path}: not a faiss index: {str(exc).splitlines()[0]}") from None
        storage = _storage_of(faiss, index)
        if storage is None or index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise ArtifactError(
                f"{entry.path}: not an inner-product HNSW index over float or 8-bit vectors, nor an"
                " inner-product inverted file of 4-bit codes"
            )
        if storage not in kind.storages:
            raise ArtifactError(f"{entry.path}: the file is not a {entry.library} index")
        n_items, dim = items.shape
        if index.ntotal != n_items or index.d != dim:
            raise ArtifactError(
                f"{entry.path}: indexes {index.ntotal} x {index.d}, the items are {n_items} x {dim}"
            )
        # One thread per search (a request is one query; the server's processes are pinned
        # one per core), also where OMP_NUM_THREADS is not set, as in the trainer's evaluation;
        # for this thread: each thread that searches sets its own (_params_at).
        faiss.omp_set_num_threads(1)
        try:
            # The file says how it stores vectors (versions older than the storage parameter are flat).
            params = build_params(
                {**entry.params, "storage": storage} if "storage" in kind.defaults else entry.params
            )
        except ValueError as exc:
            raise ArtifactError(f"{entry.path}: {exc}") from None
        for key in kind.auto_params:
            if params[key] == "auto":
                raise ArtifactError(f"{entry.path}: {key} was never calibrated")
        held = _storage_view(faiss, index) if storage == "flat" else items
        search = kind(index, n_items, params[kind.breadth_param], params, held, FileRows(items))
        search.check_holds(entry.path)
        search._ready()
        return search

    def _ready(self) -> None:
        """What the structure does once its file is verified, before it serves."""

    def check_holds(self, path: Path | None, sample: int = 64) -> None:
        """The index must be built over the version's item factors: compare a spread of rows
        with the stored vectors, or with their stored codes."""
        n = self.n_items
        rows = np.unique(np.linspace(0, n - 1, num=min(sample, n), dtype=np.int64))
        wanted = np.ascontiguousarray(self.item_rows.take(rows), dtype=np.float32)
        same = self._stores(rows, wanted)
        if not same:
            raise ArtifactError(f"{path}: the item index does not hold the version's item factors")

    def _stores(self, rows: np.ndarray, wanted: np.ndarray) -> bool:
        """Whether the index stores ``wanted`` (float rows) as its ``rows``."""
        raise NotImplementedError

    def vectors(self) -> np.ndarray:
        """The float item vectors, read-only, shape ``(n_items, d)``: a flat graph's own
        memory-mapped storage (so the server holds the item factors once, not twice), else the
        version's item factors. Valid as long as this object lives."""
        return self.item_vectors

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
            Hidden and filtered-out items (``service/indices/rules.py``), skipped inside
            the search through a bitmap selector, like ``exclude``.

        Returns
        -------
        (rows, products) or None
            ``min(n, eligible)`` rows and their inner products; None when the index
            cannot give that many eligible items cheaply and the caller should score
            every item.
        """
        faiss = _faiss()
        if exclude is not None and exclude.size > 1 and not (exclude[1:] > exclude[:-1]).all():
            exclude = np.unique(exclude)  # the training items alone arrive sorted and distinct
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
        # faiss holds raw pointers: these locals keep every selector alive through the searches.
        selectors = _selectors(faiss, exclude, eligible) if excluded or blocked else [None]
        # Blocked items (hidden, filtered out) are spread over the catalogue: a search meets
        # about one eligible item per 1/share visited. While at least half are eligible the
        # breadth already holds enough of them (recall unchanged, docs/catalog.md); below that
        # it widens so the eligible candidates stay at half the breadth.
        widen = max(1.0, ELIGIBLE_SHARE_NOT_WIDENED / (left / self.n_items))
        covered = self.params.get("calibrated_excluded")
        if covered is None or exclude is None or excluded <= covered:  # as the calibration measured
            return self._search_deep(faiss, query, want, excluded, widen, left, selectors[-1])
        # A long history: first searched as an ordinary one; then how deep its exclusions really
        # push the answer (those scoring above it), searched at the breadth measured for that depth.
        found = self._search_deep(faiss, query, want, covered, widen, left, selectors[-1], grow=False)
        # Too few found at that breadth: the exclusions crowd the top, as deep as they are many.
        depth = excluded if found is None else self._depth(exclude, query[0], float(found[1][-1]))
        if found is not None and depth <= covered:
            return found
        if depth > self.max_excluded:
            return None  # deeper than the index holds the recall: the exact pass answers
        return self._search_deep(faiss, query, want, depth, widen, left, selectors[-1])

    def _search_deep(
        self,
        faiss,
        query: np.ndarray,
        want: int,
        depth: int,
        widen: float,
        left: int,
        selector,
        grow: bool = True,
    ) -> Ranked | None:
        """The search of ``want`` eligible items when ``depth`` excluded items rank above them,
        widened 4x while it finds too few (when ``grow``); None past the widest breadth."""
        fetch = self._candidates(want, depth, left)
        breadth = self._first_breadth(depth, widen, fetch, left)
        while breadth <= self.max_breadth:
            params = self._params_at(faiss, breadth)
            params.sel = selector  # None: no exclusions; faiss's wrapper holds the selector
            scores, rows = self.index.search(query, fetch, params=params)
            rows, scores = rows[0], scores[0]
            if (rows >= 0).all():  # faiss pads with -1 when the search found fewer eligible items
                return self._exact_order(rows, query[0], want) if self.quantised else (rows, scores)
            if breadth == self.max_breadth or not grow:
                break
            breadth = min(breadth * _GROWTH, self.max_breadth)
        return None

    def _depth(self, exclude: np.ndarray, query: np.ndarray, last: float) -> int:
        """How many excluded items score above ``last`` (the answer's lowest exact score): at
        least as many as outrank the exact answer, whose lowest score is no lower. Counted a block
        of rows at a time, and no further than :attr:`max_excluded` (deeper: the exact pass)."""
        depth = 0
        for start in range(0, exclude.size, DEPTH_BLOCK):
            depth += int((self._rescore_vectors(exclude[start : start + DEPTH_BLOCK]) @ query > last).sum())
            if depth > self.max_excluded:
                break
        return depth

    @property
    def max_excluded(self) -> int:
        """The most excluded items the index answers with above the answer (more: the exact
        pass): what the build measured (:func:`calibrate_exclusions`), else
        :data:`MAX_EXCLUDED_FRACTION` of the items."""
        cap = int(MAX_EXCLUDED_FRACTION * self.n_items)
        return min(cap, int(self.params.get("max_excluded", cap)))

    def _calibrated_breadth(self, excluded: int) -> int | None:
        """The breadth the build measured for this many exclusions (the first step of
        ``excluded_breadths`` holding at least as many), or None when it measured none or the
        breadth's own calibration covers them (``calibrated_excluded``)."""
        if excluded <= self.params.get("calibrated_excluded", 0):
            return None
        for most, breadth in self.params.get("excluded_breadths") or ():
            if excluded <= most:
                return int(breadth)
        return None

    def _params_at(self, faiss, breadth: int):
        """This thread's search parameters at ``breadth`` (a thread searches one query at a time,
        so its parameters are never shared with a search in flight)."""
        made: dict[int, Any] | None = getattr(self._thread_params, "by_breadth", None)
        if made is None:
            # This thread's first search: one faiss thread per search (a request is one query,
            # the server's processes one per core). OpenMP counts threads per calling thread, so
            # :meth:`open`'s setting reached only the thread that opened the index.
            faiss.omp_set_num_threads(1)
            made = self._thread_params.by_breadth = {}
        params = made.get(breadth)
        if params is None:
            if len(made) >= _PARAMS_KEPT_PER_THREAD:  # breadths widened by exclusions are many
                made.pop(next(iter(made)))  # the longest kept
            params = made[breadth] = self._search_params(faiss, breadth)
        return params

    def _candidates(self, want: int, excluded: int, left: int) -> int:
        """How many items the search returns (more than ``want`` for an exact re-score)."""
        raise NotImplementedError

    def _first_breadth(self, excluded: int, widen: float, fetch: int, left: int) -> int:
        raise NotImplementedError

    def _search_params(self, faiss, breadth: int):
        raise NotImplementedError

    def _rescore_vectors(self, rows: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _exact_order(self, rows: np.ndarray, query: np.ndarray, want: int) -> Ranked:
        """The ``want`` best of the search's candidates by their exact inner products."""
        rows = np.sort(rows)  # ascending rows read the factor file in order
        products = self._rescore_vectors(rows) @ query
        best = np.argsort(-products, kind="stable")[:want]
        return rows[best], products[best].astype(np.float32)


class GraphSearch(AnnSearch):
    """faiss HNSW: a walk over the graph, its vectors as floats or 8-bit codes."""

    library = LIBRARY
    defaults = DEFAULT_PARAMS
    integer_params = ("M", "ef_construction", "ef_search")
    auto_params = ("ef_search",)
    breadth_param = "ef_search"
    uncalibrated = UNCALIBRATED_EF_SEARCH
    storages = STORAGES

    @staticmethod
    def build(faiss, vectors: np.ndarray, params: dict[str, Any]):
        return _build_hnsw(faiss, vectors, params)

    @staticmethod
    def predicted_build_seconds(vectors: np.ndarray, params: dict[str, Any]) -> float:
        return predicted_graph_seconds(vectors, params)

    @property
    def quantised(self) -> bool:
        return self.params["storage"] != "flat"

    @property
    def max_breadth(self) -> int:
        return _MAX_EF

    def ladder(self) -> tuple[int, ...]:
        return EF_LADDER

    def _what(self) -> str:
        p = self.params
        return f"{LIBRARY} M={p['M']} ef_search={self.breadth} storage={p['storage']}"

    def _stores(self, rows: np.ndarray, wanted: np.ndarray) -> bool:
        if not self.quantised:
            return np.array_equal(wanted, self.item_vectors[rows])
        faiss = _faiss()
        storage = faiss.downcast_index(self.index.storage)
        codes = faiss.rev_swig_ptr(storage.codes.data(), storage.ntotal * storage.code_size)
        stored = codes.reshape(storage.ntotal, storage.code_size)[rows]
        return np.array_equal(storage.sa_encode(wanted), stored)

    def _candidates(self, want: int, excluded: int, left: int) -> int:
        return min(RERANK_FACTOR * want, left) if self.quantised else want

    def _first_breadth(self, excluded: int, widen: float, fetch: int, left: int) -> int:
        # Excluded items are mostly the user's own best (the training items the model fits), so
        # a filtered walk must step over them: the breadth the build measured for as many, else
        # widened by their number, as over-fetching would.
        measured = self._calibrated_breadth(excluded)
        base = self.breadth + excluded if measured is None else measured
        return min(max(int(base * widen), fetch), _MAX_EF)

    def _search_params(self, faiss, breadth: int):
        params = faiss.SearchParametersHNSW()
        params.efSearch = breadth
        return params

    def _rescore_vectors(self, rows: np.ndarray) -> np.ndarray:
        # File reads, not the mapping: the graph is most of the memory, the floats stay in the
        # page cache (see item_rows).
        return self.item_rows.take(rows)


class InvertedFileSearch(AnnSearch):
    """faiss IVF with 4-bit fast-scan codes: the lists nearest the query, scanned."""

    library = IVF_LIBRARY
    defaults = IVF_DEFAULT_PARAMS
    integer_params = ("nlist", "nprobe", "rerank")
    auto_params = ("nlist", "nprobe")
    breadth_param = "nprobe"
    uncalibrated = UNCALIBRATED_NPROBE
    storages = ("pq4",)

    @staticmethod
    def build(faiss, vectors: np.ndarray, params: dict[str, Any]):
        return _build_ivf(faiss, vectors, params)

    def check_holds(self, path: Path | None, sample: int = 64) -> None:
        if self.index.nlist != self.params["nlist"]:
            raise ArtifactError(
                f"{path}: the file has {self.index.nlist} lists, the manifest says {self.params['nlist']}"
            )
        super().check_holds(path, sample)

    @property
    def quantised(self) -> bool:
        return True

    @property
    def max_breadth(self) -> int:
        return int(self.params["nlist"])

    def ladder(self) -> tuple[int, ...]:
        return tuple(b for b in NPROBE_LADDER if b < self.max_breadth) + (self.max_breadth,)

    def _what(self) -> str:
        p = self.params
        return f"{IVF_LIBRARY} nlist={p['nlist']} nprobe={self.breadth} storage=pq4 rerank={p['rerank']}"

    def _ready(self) -> None:
        _map_in(self.item_vectors)

    def _stores(self, rows: np.ndarray, wanted: np.ndarray) -> bool:
        return _ivf_holds(_faiss(), self.index, rows, wanted)

    def _candidates(self, want: int, excluded: int, left: int) -> int:
        # The 4-bit codes blur the close scores below a user's excluded best items, so more
        # candidates are re-scored per exclusion.
        return min(int(self.params["rerank"]) * want + RERANK_PER_EXCLUDED * excluded, left)

    def _first_breadth(self, excluded: int, widen: float, fetch: int, left: int) -> int:
        per_list = self.n_items / self.max_breadth
        # Excluded items are mostly the user's best, so the candidates wanted rank deeper by
        # their number: scan lists in proportion to that depth; and enough lists to hold
        # twice the candidates (lists differ in size).
        measured = self._calibrated_breadth(excluded)
        crowded = (self.breadth * (fetch + excluded) / fetch if measured is None else measured) * widen
        holding = 2 * fetch / (per_list * left / self.n_items)
        return min(int(np.ceil(max(crowded, holding))), self.max_breadth)

    def _search_params(self, faiss, breadth: int):
        params = faiss.SearchParametersIVF()
        params.nprobe = breadth
        walk = faiss.SearchParametersHNSW()  # the walk over the lists' centroids
        walk.efSearch = max(2 * breadth, 16)
        params.quantizer_params = walk  # faiss's wrapper keeps a reference, as for sel
        return params

    def _rescore_vectors(self, rows: np.ndarray) -> np.ndarray:
        # The codes are small, so the floats stay mapped in memory (mapped in at load).
        return self.item_vectors[rows]


# The one place that names the structures: ``ann_params["structure"]`` and the manifest's library.
STRUCTURES: dict[str, type[AnnSearch]] = {"hnsw": GraphSearch, "ivf": InvertedFileSearch}
_BY_LIBRARY = {kind.library: kind for kind in STRUCTURES.values()}


def _storage_of(faiss, index) -> str | None:
    if isinstance(index, faiss.IndexIVFPQFastScan):
        return "pq4" if index.pq.nbits == 4 else None
    if isinstance(index, faiss.IndexHNSWFlat):
        return "flat"
    if isinstance(index, faiss.IndexHNSWSQ):
        quantizer = faiss.downcast_index(index.storage).sq
        return "sq8" if quantizer.qtype == faiss.ScalarQuantizer.QT_8bit else None
    return None


def _storage_view(faiss, index) -> np.ndarray:
    """A flat graph's float vectors as a read-only array over the index's own memory."""
    storage = faiss.downcast_index(index.storage)
    n, d = storage.ntotal, storage.d
    view = faiss.rev_swig_ptr(storage.get_xb(), n * d).reshape(n, d)
    view.flags.writeable = False
    return view


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
