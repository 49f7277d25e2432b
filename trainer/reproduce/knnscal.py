"""KNNSCAL: stress, within-list order agreement and neighbour recall of a graph embedding.

``ordrec-train reproduce knnscal --digits --n-neighbors 10 [--n-components 2] [--json OUT]`` builds
the directed k-NN graph of scikit-learn's bundled digits (1,797 points) and
embeds it (``--sklearn breast_cancer|wine|iris``: another bundled set, standardised);
``--data PATH`` reads ranked neighbour lists instead
(``source, neighbor, rank`` lines). Every map, ours and the reference
methods', is scored through the serving index (``service.indices.models.knnscal.KNNSCALIndex``
built from an in-memory artifact), by the same functions:

- ``stress``: Kruskal's stress-1, sqrt(sum (d - dhat)^2 / sum d^2) over a
  common E+ (the graph's edges plus 5q uniform non-edges per source, fixed
  seed), dhat being the per-source isotonic fit of the distances on the
  ranks (ties ordered by distance). Scale-free, so any map can be scored;
- ``order_agreement``: over pairs j, k of a source's list with r_ij < r_ik,
  the fraction with d_ij < d_ik in the map;
- ``recall@k``: the share of a vertex's k listed neighbours among its k
  nearest on the map (``KNNSCALIndex.neighbors``);
- ``recall@10`` whatever ``--k`` is, so graphs of different k compare: the
  share of a vertex's 10 nearest in the input among its 10 nearest on the
  map. "Nearest in the input" is the exact 10-NN of the features when there
  are features, else the first 10 listed (absent when lists are shorter);
- with labels: ``label_acc@10``, the majority label of the 10 map
  neighbours against the vertex's own; with features: sklearn's
  ``trustworthiness`` at k.

Three KNNSCAL rows unless a parameter flag picks the start
(``initial_disparities``, ``neighbor_embedding`` or ``keep_iterations``):
``knnscal`` (the defaults: neighbour-embedding start, validated
refinement), ``knnscal-geodesic-start`` (the previous default: geodesic
start, isotonic start disparities, every refinement kept) and
``knnscal-poster-start``, the poster's protocol (geodesic start, step 2's
disparities Delta = min(r_ij, q)).

Reference rows: sklearn SpectralEmbedding, Isomap and t-SNE on the features
(digits); on a graph without features, SpectralEmbedding on the symmetrised
graph only. The "paper" column holds the figures the issue measured for the
references (there is no accuracy table in the poster).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from ordrec.service.indices.models.knnscal import KNNSCALIndex
from ordrec.service.storage.artifact import Artifact
from ordrec.trainer.models import knnscal_kernels
from ordrec.trainer.models.knnscal import KnnScal, enlarged_edges, knn_lists, neighbor_csr, symmetric_graph
from ordrec.trainer.models.pipeline import RENAMED, configure, flat_constraints
from ordrec.trainer.reproduce.params import add_param_flags, given_params
from ordrec.trainer.reproduce.report import PaperFigure, Row, print_table, summarise

DATA_REQUIRED = False
# KnnScal's flat settings (its parameters, the solver's fields, the start selection's) as flags of
# the same names (--edge-weight, --max-iter, --polish-rounds, --neighbor-embedding-starts, ...); n_components and
# n_neighbors are the protocol's --n-components and --n-neighbors, random_state is --seed.
FLAT_CONSTRAINTS = {**flat_constraints("knnscal"), "solver": KnnScal._parameter_constraints["solver"]}
PARAM_FLAGS = tuple(
    name
    for name in FLAT_CONSTRAINTS
    if name not in ("n_components", "n_neighbors", "neighbor_embedding_rank_decay", "random_state", "verbose")
)
DEFAULT_RUNS = 3
METRICS = ("stress", "order_agreement", "recall@10", "label_acc@10", "trustworthiness")

# Measured for issue 7 with the same definitions on the digits 10-NN graph.
ISSUE_FIGURES = {
    "spectral": {"order_agreement": 0.588, "recall@10": 0.284},
    "isomap": {"order_agreement": 0.592, "recall@10": 0.182},
    "tsne": {"order_agreement": 0.710, "recall@10": 0.585},
    "umap": {"order_agreement": 0.669, "recall@10": 0.509},
}


def _rank_decay(text: str) -> float | str:
    """``--neighbor-embedding-rank-decay``: "auto" or a number (checked against KnnScal's
    constraint with the other flags)."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a number or "auto", got {text!r}') from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--digits",
        action="store_true",
        help="use the directed k-NN graph of sklearn's bundled digits (1,797 points)",
    )
    parser.add_argument(
        "--sklearn",
        choices=sorted(SKLEARN_SETS),
        default=None,
        help="another bundled sklearn set (standardised features), e.g. to choose"
        " hyperparameters on a graph other than digits",
    )
    parser.add_argument(
        "--n-neighbors", type=int, default=10, help="neighbours per list (digits) and k of recall@k"
    )
    parser.add_argument("--n-components", type=int, default=2, help="map dimension")
    parser.add_argument(
        "--references",
        default=None,
        help="comma-separated reference methods (spectral, isomap, tsne; '' for none);"
        " default: all three with features (--digits), spectral for a bare graph",
    )
    add_param_flags(parser, FLAT_CONSTRAINTS, PARAM_FLAGS, renamed=RENAMED["knnscal"])
    parser.add_argument(
        "--neighbor-embedding-rank-decay",
        "--ne-rank-decay",
        type=_rank_decay,
        default=None,
        help='the neighbor_embedding_rank_decay parameter: a number or "auto"',
    )


# ------------------------------------------------------------------ data
class Problem:
    """A ranked neighbour graph, its CSR and a common E+ for scoring, with optional labels/features."""

    def __init__(self, graph, name: str, k: int, features: np.ndarray | None = None, seed: int = 0):
        self.graph, self.name, self.k, self.features = graph, name, k, features
        self.n = len(graph.vertices)
        self.indptr, self.col, self.rnk = neighbor_csr(graph)
        # Uniform non-edges (the poster's), fixed seed: the same E+ scores every map.
        self.q, self.plus_indptr, self.plus_col, self.plus_rnk = enlarged_edges(
            self.indptr, self.col, self.rnk, self.n, 5.0, seed + 7919, 0.0
        )
        self.labels = None if graph.labels is None else np.asarray(graph.labels)
        self.ten_nearest = self._ten_nearest()

    def _ten_nearest(self) -> list[np.ndarray] | None:
        """Each vertex's 10 nearest in the input (features' exact 10-NN, else its first 10 listed)."""
        if self.features is not None and self.k != 10:
            ten = neighbor_csr(knn_lists(self.features, 10))
            return [ten[1][ten[0][i] : ten[0][i + 1]] for i in range(self.n)]
        if self.k < 10:
            return None
        return [self.col[self.indptr[i] : self.indptr[i + 1]][:10] for i in range(self.n)]


# Bundled sklearn data sets: loader name, and whether to standardise the
# features (digits are pixels on one scale; the others mix units).
SKLEARN_SETS = {
    "digits": ("load_digits", False),
    "breast_cancer": ("load_breast_cancer", True),
    "wine": ("load_wine", True),
    "iris": ("load_iris", True),
}


def load_problem(args) -> Problem:
    k = int(args.n_neighbors)
    name = getattr(args, "sklearn", None)
    if name and name != "digits":
        from sklearn import datasets

        loader, standardise = SKLEARN_SETS[name]
        features, labels = getattr(datasets, loader)(return_X_y=True)
        features = np.asarray(features, dtype=np.float64)
        if standardise:
            features = (features - features.mean(axis=0)) / np.where(
                features.std(axis=0) > 0, features.std(axis=0), 1.0
            )
        graph = knn_lists(features, k, labels=labels, path=f"sklearn:{name}")
        return Problem(graph, name, k, features=features, seed=args.seed)
    if args.digits or name == "digits":
        from sklearn.datasets import load_digits

        features, labels = load_digits(return_X_y=True)
        graph = knn_lists(features, k, labels=labels, path="sklearn:digits")
        return Problem(graph, "digits", k, features=np.asarray(features, dtype=np.float64), seed=args.seed)
    if not args.data:
        raise ValueError("give --data PATH (ranked neighbour lists), --digits or --sklearn NAME")
    from ordrec.trainer.data.readers import read_input

    graph = read_input("neighbors", args.data, args.format, skip_bad_lines=args.skip_bad_lines)
    if graph.skipped_lines:
        print(f"skipped {graph.skipped_lines} malformed line(s) of {args.data}", file=sys.stderr)
    return Problem(graph, os.path.basename(str(args.data).rstrip("/")), k, seed=args.seed)


# --------------------------------------------------------------- measures
def map_index(problem: Problem, coords: np.ndarray) -> KNNSCALIndex:
    """A serving index over any coordinates (reference maps have no placement table)."""
    artifact = Artifact(
        kind="knnscal",
        arrays={"coordinates": np.ascontiguousarray(coords, dtype=np.float64)},
        ids={"objects": problem.graph.vertices},
    )
    return KNNSCALIndex.from_artifact(artifact)


def kruskal_stress(problem: Problem, coords: np.ndarray) -> float:
    d = knnscal_kernels.entry_distances(coords, problem.plus_indptr, problem.plus_col)
    fit = np.empty_like(d)
    knnscal_kernels.isotonic_rows(
        problem.plus_indptr,
        problem.plus_rnk,
        problem.q,
        1.0,
        0.0,
        d,
        fit,
        knnscal_kernels.row_positions(problem.plus_indptr),
    )
    return float(np.sqrt(np.sum((d - fit) ** 2) / max(np.sum(d * d), 1e-300)))


def map_metrics(problem: Problem, index: KNNSCALIndex) -> dict[str, float]:
    """Every measure of one map, neighbour queries through ``index``."""
    coords = index.points.coords
    agree, pairs = knnscal_kernels.order_counts(coords, problem.indptr, problem.col, problem.rnk, problem.q)
    k = problem.k
    hits = listed = hits10 = listed10 = 0
    label_hits = 0
    for i in range(problem.n):
        rows, _ = index.neighbors("", "objects", i, "objects", max(k, 10))
        own = problem.col[problem.indptr[i] : problem.indptr[i + 1]]
        hits += np.intersect1d(rows[:k], own[:k]).size
        listed += min(k, own.size)
        if problem.ten_nearest is not None:
            hits10 += np.intersect1d(rows[:10], problem.ten_nearest[i]).size
            listed10 += problem.ten_nearest[i].size
        if problem.labels is not None:
            votes = np.unique(problem.labels[rows[:10]], return_counts=True)
            label_hits += int(votes[0][np.argmax(votes[1])] == problem.labels[i])
    out = {
        "stress": kruskal_stress(problem, coords),
        "order_agreement": agree / max(pairs, 1),
        f"recall@{k}": hits / max(listed, 1),
    }
    if problem.ten_nearest is not None:
        out["recall@10"] = hits10 / max(listed10, 1)
    if problem.labels is not None:
        out["label_acc@10"] = label_hits / problem.n
    if problem.features is not None:
        from sklearn.manifold import trustworthiness

        out["trustworthiness"] = float(trustworthiness(problem.features, coords, n_neighbors=k))
    return out


# ------------------------------------------------------------- reference maps
def reference_map(method: str, problem: Problem, dim: int, seed: int) -> np.ndarray:
    from sklearn import manifold

    if problem.features is None:
        if method != "spectral":
            raise ValueError(f"reference {method!r} needs features; a graph alone supports 'spectral'")
        adjacency = symmetric_graph(problem.indptr, problem.col, problem.rnk, problem.n)
        adjacency.data[:] = 1.0
        return manifold.SpectralEmbedding(
            n_components=dim, affinity="precomputed", random_state=seed
        ).fit_transform(adjacency)
    X = problem.features
    if method == "spectral":
        return manifold.SpectralEmbedding(
            n_components=dim, n_neighbors=problem.k, random_state=seed
        ).fit_transform(X)
    if method == "isomap":
        return manifold.Isomap(n_neighbors=problem.k, n_components=dim).fit_transform(X)
    if method == "tsne":
        return manifold.TSNE(n_components=dim, init="pca", random_state=seed).fit_transform(X)
    raise ValueError(f"unknown reference method {method!r} (spectral, isomap, tsne)")


# ------------------------------------------------------------------- run
POSTER_START = "knnscal-poster-start"
GEODESIC_START = "knnscal-geodesic-start"
PREVIOUS_DEFAULT = {"neighbor_embedding": "none", "keep_iterations": "always"}
# Parameters that pick the start; with any of them given only the asked-for fit runs.
START_PARAMETERS = {"initial_disparities", "neighbor_embedding", "keep_iterations"}


def fit_and_score(problem: Problem, method: str, params: dict, dim: int, seed: int, run: int, verbose: bool):
    """Fit KNNSCAL with ``params`` (flat, as a job table gives them) and score its map through the serving index."""
    t0 = time.perf_counter()
    pipeline = configure("knnscal", dict(params, n_components=dim, random_state=seed, verbose=verbose))
    est = pipeline.fit(problem.graph, check_memory=False).estimator.best_estimator_  # the served map
    fit_s = time.perf_counter() - t0
    index = KNNSCALIndex.from_artifact(pipeline.to_artifact())
    index.smoke()
    metrics = map_metrics(problem, index)
    if verbose:
        print(
            f"{method} run {run + 1}: {est.n_iter_} iterations in {fit_s:.1f}s"
            f" (converged={est.converged_}), fitted stress {est.stress_:.5f}, "
            + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()),
            file=sys.stderr,
        )
    return metrics


def run(args) -> list[Row]:
    problem = load_problem(args)
    dim = int(args.n_components)
    params = given_params(args, "KnnScal", FLAT_CONSTRAINTS, (*PARAM_FLAGS, "neighbor_embedding_rank_decay"))
    setting = {"k": problem.k, "dim": dim}
    per_method: dict[str, dict[str, list[float]]] = {}

    def record(method: str, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            per_method.setdefault(method, {}).setdefault(name, []).append(value)

    verbose = not args.quiet
    variants = {"knnscal": params}
    if not START_PARAMETERS & params.keys():
        # The previous default (geodesic start, every refinement kept) and the
        # poster's protocol (that start with step 2's Delta = min(r, q)) next to the default.
        variants[GEODESIC_START] = {**params, **PREVIOUS_DEFAULT}
        variants[POSTER_START] = {**params, **PREVIOUS_DEFAULT, "initial_disparities": "ranks"}
    for r in range(int(args.runs)):
        seed = int(args.seed) + r
        for method, variant in variants.items():
            record(method, fit_and_score(problem, method, variant, dim, seed, r, verbose))
        references = args.references
        if references is None:
            references = "spectral,isomap,tsne" if problem.features is not None else "spectral"
        for method in [m for m in references.split(",") if m]:
            t0 = time.perf_counter()
            coords = reference_map(method, problem, dim, seed)
            metrics = map_metrics(problem, map_index(problem, coords))
            record(method, metrics)
            if verbose:
                print(
                    f"{method} run {r + 1} ({time.perf_counter() - t0:.1f}s): "
                    + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()),
                    file=sys.stderr,
                )

    rows = [
        summarise(method, problem.name, setting, name, values)
        for method, by_metric in per_method.items()
        for name, values in by_metric.items()
    ]
    paper = []
    if problem.name == "digits" and problem.k == 10 and dim == 2:
        paper = [
            PaperFigure(method, setting, metric, value, note="measured for issue 7")
            for method, figures in ISSUE_FIGURES.items()
            if method in per_method or method == "umap"
            for metric, value in figures.items()
        ]
    print_table(
        rows,
        paper,
        title=f"KNNSCAL on {problem.name} (n={problem.n}, k={problem.k}, dim={dim});"
        " 'paper' column = reference figures quoted in issue 7; recall@10 = the input's 10 nearest"
        " (feature 10-NN, or the first 10 listed) among the map's 10 nearest, whatever k is",
    )
    return rows
