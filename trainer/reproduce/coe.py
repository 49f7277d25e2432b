"""COE protocol (Le & Lauw, SDM 2016, Section 5.1): preservation/prediction accuracy and k-NN ratings.

1. Filter (one pass, as the paper's counts imply): users with >= 20 ratings,
   then items with >= 4 ratings. ML-100K becomes 943 users, 1,413 items and
   99,543 ratings, the paper's Table 1.
2. Split each user's ratings 80/20 at random (``round(0.8 n)`` observed per
   user). Ratings are z-scored per user with the mean and standard deviation
   of the user's *observed* ratings; the same map is applied to the user's
   hidden ratings, so nothing about the hidden ratings reaches training and
   one value per rating defines every triple.
3. Observed triples: type A ``<u,i,j>`` for pairs of u's observed ratings
   with different z; type B ``<u,v,i>`` for pairs of i's observed ratings with
   different z. Hidden triples: pairs with at least one hidden rating.
4. Preservation (Eq. 5.5) / prediction (Eq. 5.6) accuracy: per user (type A)
   or per item (type B) the fraction of its observed / hidden triples whose
   direction the distances reproduce (strictly), averaged over users / items
   that have such triples; H-mean of A and B. Computed exactly over all
   triples per user and per item with sorts and a Fenwick tree
   (``concordant_pairs``); hidden = all pairs minus observed pairs.
5. k-NN average rating (k = 1, 5): per user the mean of the user's own
   ratings on the k nearest items among the items the user rated (observed
   and hidden); per item the mean rating given by the k nearest users among
   those who rated it; averaged over users / items; H-mean of the two.

Distances come from the serving index built from the in-memory artifact
(``COEIndex.from_artifact(estimator.to_artifact()).pair_scores``).

Hyperparameters: ``--tune`` searches a small grid, separately for every
split, on a validation split of that split's observed ratings only (each
user's observed ratings split 80/20 again; criterion: validation
preservation H, the paper's "first and main metric"), and fits the split's
model with the winner; no split's hidden ratings reach its tuning. Without
``--tune`` the module's ``DEFAULTS`` (found that way on the first split) are
used.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping

import numpy as np

from ordrec.service.indices.models.coe import COEIndex
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.models import coe_kernels
from ordrec.trainer.models.coe import COE, FUNCTIONS, COESolver, TripleSource, grouped, user_moments, zscore
from ordrec.trainer.models.pipeline import flat_constraints
from ordrec.trainer.models.selection import grid_points
from ordrec.trainer.reproduce.dcr import load_ratings
from ordrec.trainer.reproduce.params import add_param_flags, given_params
from ordrec.trainer.reproduce.report import PaperFigure, Row, print_table, summarise

DEFAULT_RUNS = 10
METRICS = (
    "preservation_a",
    "preservation_b",
    "preservation_h",
    "prediction_a",
    "prediction_b",
    "prediction_h",
    "knn1_users",
    "knn1_items",
    "knn1_h",
    "knn5_users",
    "knn5_items",
    "knn5_h",
)

# Table 3 of the paper (ML-100K, full observed triples, 2-D); accuracies as fractions.
_TABLE3 = {
    "COE-S": (0.750, 0.650, 0.696, 0.640, 0.590, 0.614, 4.48, 3.93, 4.19, 4.33, 3.58, 3.92),
    "COE-G": (0.750, 0.650, 0.696, 0.640, 0.590, 0.614, 4.48, 3.87, 4.15, 4.33, 3.55, 3.90),
    "CFEE": (0.672, 0.624, 0.647, 0.597, 0.603, 0.600, 4.07, 3.63, 3.84, 4.03, 3.50, 3.75),
    "BPR+": (0.684, 0.609, 0.645, 0.621, 0.591, 0.605, 4.14, 3.63, 3.87, 4.13, 3.40, 3.73),
}
# Settings chosen by ``--tune`` on ML-100K validation splits (docs/coe.md, "How the defaults were chosen").
# Found by: ordrec-train reproduce coe --data .../ml-100k/u.data --runs 1 --tune --no-references
DEFAULTS = {
    "sigmoid": dict(
        lam=4.0,
        reg=0.01,
        learning_rate=0.1,
        learning_rate_final_ratio=0.01,
        max_iter=40,
        type_a_share=None,
        group_power=0.0,
        unrated_share=0.0,
    ),
    "gompertz": dict(
        alpha=1.0,
        reg=0.01,
        learning_rate=0.1,
        learning_rate_final_ratio=0.01,
        max_iter=40,
        type_a_share=None,
        group_power=0.0,
        unrated_share=0.0,
    ),
}
GRID = {
    "lam": [1.0, 2.0, 4.0],  # sigmoid slope
    "alpha": [0.5, 1.0, 2.0],  # Gompertz rate: its penalty side is steep, so smaller values
    "reg": [0.0, 0.001, 0.01],
    "group_power": [1.0, 0.5, 0.0],
}


# ------------------------------------------------------------------ data
def paper_filter(data: Ratings, min_user: int = 20, min_item: int = 4) -> Ratings:
    """Users with >= min_user ratings, then items with >= min_item (one pass each), compacted."""
    keep = np.bincount(data.user, minlength=data.n_users)[data.user] >= min_user
    data = data.subset(keep)
    keep = np.bincount(data.item, minlength=data.n_items)[data.item] >= min_item
    return data.subset(keep).compact()


def split_per_user(user: np.ndarray, n_users: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask: ``round(fraction * n_u)`` random ratings of every user are True (observed)."""
    key = rng.random(len(user))
    order = np.lexsort((key, user))
    counts = np.bincount(user, minlength=n_users)
    starts = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    position = np.empty(user.shape[0], dtype=np.int64)
    position[order] = np.arange(user.shape[0]) - starts[user[order]]
    return position < np.rint(fraction * counts)[user]


# ------------------------------------------------------------- metrics
def _hmean(a: float, b: float) -> float:
    return 0.0 if a + b <= 0 else 2 * a * b / (a + b)


def _accuracies(
    group: np.ndarray,
    member: np.ndarray,
    values: np.ndarray,
    dist: np.ndarray,
    observed: np.ndarray,
    n_groups: int,
) -> tuple[float, float]:
    """(preservation, prediction) for one triple type, averaged over groups."""
    indptr, _, z_sorted, order = grouped(group, member, values, n_groups)
    pairs_all, good_all = coe_kernels.concordant_pairs(indptr, z_sorted, dist[order])
    o = observed
    indptr_o, _, z_o, order_o = grouped(group[o], member[o], values[o], n_groups)
    pairs_obs, good_obs = coe_kernels.concordant_pairs(indptr_o, z_o, dist[o][order_o])
    pairs_hid, good_hid = pairs_all - pairs_obs, good_all - good_obs
    has_obs, has_hid = pairs_obs > 0, pairs_hid > 0
    pres = float(np.mean(good_obs[has_obs] / pairs_obs[has_obs])) if has_obs.any() else float("nan")
    pred = float(np.mean(good_hid[has_hid] / pairs_hid[has_hid])) if has_hid.any() else float("nan")
    return pres, pred


def _knn(
    group: np.ndarray, member: np.ndarray, rating: np.ndarray, dist: np.ndarray, n_groups: int, k: int
) -> float:
    order = np.lexsort((member, group))  # fixed member order, so distance ties break the same way
    indptr = np.zeros(n_groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(group, minlength=n_groups), out=indptr[1:])
    means = coe_kernels.knn_mean_rating(indptr, rating[order].astype(np.float64), dist[order], k)
    return float(np.nanmean(means))


def evaluate_distances(
    data: Ratings, values: np.ndarray, observed: np.ndarray, dist: np.ndarray
) -> dict[str, float]:
    """All protocol metrics from one distance per rating (``dist[r]`` = |x_u - y_i| of rating r)."""
    pa, qa = _accuracies(data.user, data.item, values, dist, observed, data.n_users)
    pb, qb = _accuracies(data.item, data.user, values, dist, observed, data.n_items)
    out = {
        "preservation_a": pa,
        "preservation_b": pb,
        "preservation_h": _hmean(pa, pb),
        "prediction_a": qa,
        "prediction_b": qb,
        "prediction_h": _hmean(qa, qb),
    }
    for k in (1, 5):
        users = _knn(data.user, data.item, data.rating, dist, data.n_users, k)
        items = _knn(data.item, data.user, data.rating, dist, data.n_items, k)
        out.update({f"knn{k}_users": users, f"knn{k}_items": items, f"knn{k}_h": _hmean(users, items)})
    return out


def evaluate_index(
    index: COEIndex, data: Ratings, values: np.ndarray, observed: np.ndarray
) -> dict[str, float]:
    """Protocol metrics with distances answered by the serving index."""
    dist = -index.pair_scores(data.user.astype(np.int64), data.item.astype(np.int64))
    return evaluate_distances(data, values, observed, dist)


def protocol_values(data: Ratings, observed: np.ndarray) -> np.ndarray:
    """Per-rating z-scores with each user's observed moments (applied to hidden ratings too)."""
    mean, std = user_moments(data.user[observed], data.rating[observed].astype(np.float64), data.n_users)
    return zscore(data.user, data.rating.astype(np.float64), mean, std)


def fit_metrics(data, artifact) -> dict[str, float]:
    """Preservation and k-NN ratings of a published model on its own training
    ratings (every triple observed), through the serving index; recorded with
    the version and shown in its map report beside Table 3."""
    if not isinstance(data, Ratings):
        return {}
    observed = np.ones(len(data), dtype=bool)
    metrics = evaluate_index(
        COEIndex.from_artifact(artifact), data, protocol_values(data, observed), observed
    )
    keep = ("preservation_a", "preservation_b", "preservation_h", "knn1_h", "knn5_h")
    return {k: float(metrics[k]) for k in keep if np.isfinite(metrics[k])}


def fit_and_evaluate(
    params: dict, data: Ratings, values: np.ndarray, observed: np.ndarray
) -> tuple[dict[str, float], float]:
    """Fit COE on the observed triples, evaluate through the serving index; (metrics, fit seconds).

    The metrics include ``fit_cpu_seconds`` (process CPU time of the fit);
    the wall time returned beside them suffers from other processes on a
    shared machine, the CPU time much less.
    """
    train = data.subset(observed)
    triples = TripleSource.build(train.user, train.item, values[observed], data.n_users, data.n_items)
    model = COE.from_flat(**params)
    start, cpu = time.perf_counter(), time.process_time()
    model.fit_triples(train, triples)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    index = COEIndex.from_artifact(model.to_artifact())
    metrics = evaluate_index(index, data, values, observed)
    metrics["fit_cpu_seconds"] = cpu
    return metrics, seconds


def _warm_up(data: Ratings) -> None:
    """Load (or compile) the numba kernels once, so no run's fit time includes it."""
    head = data.subset(np.arange(min(len(data), 2000)))
    for function in FUNCTIONS:
        COE(function=function, max_iter=1, solver=COESolver(steps_per_epoch=100)).fit(head)
    coe_kernels.concordant_pairs(np.array([0, 2], np.int64), np.zeros(2, np.float32), np.zeros(2))
    coe_kernels.knn_mean_rating(np.array([0, 1], np.int64), np.zeros(1), np.zeros(1), 1)


def reference_distances(
    name: str, data: Ratings, observed: np.ndarray, rng: np.random.Generator, dim: int
) -> np.ndarray:
    """Floors: ``random`` coordinates; ``popularity``: items on rings by mean observed rating.

    The popularity layout puts every item at distance (best mean - its mean)
    from the origin at a random angle, and every user near the origin (a
    tiny jitter only breaks exact ties), so nearer means better rated.
    """
    if name == "random":
        X = rng.normal(size=(data.n_users, dim))
        Y = rng.normal(size=(data.n_items, dim))
    else:
        obs = data.subset(observed)
        count = np.bincount(obs.item, minlength=data.n_items)
        total = np.bincount(obs.item, weights=obs.rating, minlength=data.n_items)
        mean = np.where(count > 0, total / np.maximum(count, 1), np.nanmin(total / np.maximum(count, 1)))
        radius = mean.max() - mean + 1e-3
        direction = rng.normal(size=(data.n_items, dim))
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        Y = radius[:, None] * direction
        X = rng.normal(scale=1e-4, size=(data.n_users, dim))
    diff = X[data.user] - Y[data.item]
    return np.sqrt(np.einsum("nd,nd->n", diff, diff))


# ------------------------------------------------------------------ tuning
def tune(
    function: str, base: dict, data: Ratings, observed: np.ndarray, rng: np.random.Generator, log
) -> dict:
    """Grid search on a validation split carved from the observed ratings only."""
    obs_rows = np.flatnonzero(observed)
    sub = data.subset(obs_rows)
    inner = split_per_user(sub.user, data.n_users, 0.8, rng)
    values = protocol_values(sub, inner)
    scale_name = "lam" if function == "sigmoid" else "alpha"
    best: dict | None = None
    best_score = -1.0
    for point in grid_points(
        {scale_name: GRID[scale_name], "reg": GRID["reg"], "group_power": GRID["group_power"]}
    ):
        params = dict(base, **point)
        scale, reg, power = point[scale_name], point["reg"], point["group_power"]
        metrics, seconds = fit_and_evaluate(params, sub, values, inner)
        # the paper's "first and main metric" is preservation (Section 5.1)
        score = metrics["preservation_h"]
        log(
            f"  tune {function} {scale_name}={scale} reg={reg} group_power={power}: "
            f"val pres H {metrics['preservation_h']:.4f} pred H {metrics['prediction_h']:.4f} ({seconds:.1f}s)"
        )
        if score > best_score:
            best, best_score = params, score
    if best is None:
        raise ValueError(f"no {function} grid point scored a preservation (empty validation split?)")
    log(f"  tuned {function}: {best}")
    return best


# ------------------------------------------------------------------- CLI
def read_whitespace_ratings(path: str) -> Ratings:
    from ordrec.service.storage.idmap import IdMap

    cols = np.loadtxt(path, dtype=str, usecols=(0, 1, 2), ndmin=2)
    users, user = IdMap.from_values(cols[:, 0])
    items, item = IdMap.from_values(cols[:, 1])
    return Ratings(users, items, user, item, cols[:, 2].astype(np.float32), source=str(path))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--function", choices=("sigmoid", "gompertz", "both"), default="both")
    parser.add_argument("--dataset", help="data set name for the rows (default: from the path)")
    parser.add_argument(
        "--tune",
        action="store_true",
        help="per split, grid-search lambda/alpha, reg (L2 weight) and group_power on a validation"
        " split of that split's observed ratings",
    )
    add_param_flags(parser, flat_constraints("coe"), FLAG_HELP, FLAG_HELP)
    parser.add_argument("--no-references", action="store_true", help="skip the random/popularity rows")


# The COE parameters a flag may change (``--name-with-dashes``, named as the parameter).
FLAG_HELP = {
    "n_components": "dimension of the map (paper: 2; default 2)",
    "max_iter": "epochs (default: tuned)",
    "learning_rate": "initial learning rate (default: tuned)",
    "learning_rate_final_ratio": "final learning rate as a fraction of the initial one (default: tuned)",
    "reg": "L2 weight (default: tuned)",
    "lam": "the sigmoid's slope lambda (COE-S; default: tuned)",
    "alpha": "the Gompertz rate alpha (COE-G; default: tuned)",
    "type_a_share": "probability of drawing a type-A triple (default: uniform over triples)",
    "group_power": "draw users/items with weight (triples)**p; 1 = uniform over triples (paper)",
    "steps_per_epoch": "SGD steps per epoch (default 0: one per observed rating)",
}
PROTOCOL_DEFAULTS = {"n_components": 2, "steps_per_epoch": 0}


def _params(function: str, args: argparse.Namespace) -> dict:
    """The fit of ``function`` (COE-S or COE-G): the tuned defaults, then the flags given."""
    given = given_params(args, "COE", flat_constraints("coe"), FLAG_HELP)
    params = dict(DEFAULTS[function], **PROTOCOL_DEFAULTS, function=function)
    params.update({name: value for name, value in given.items() if name not in ("lam", "alpha")})
    scale = "lam" if function == "sigmoid" else "alpha"  # the other function's is not its parameter
    if scale in given:
        params[scale] = given[scale]
    return params


def map_paper_figures(hyperparameters: Mapping, attributes: Mapping) -> list[PaperFigure]:
    """The Table 3 row a published version is shown beside in its map report:
    its probability function's (COE-S for sigmoid, COE-G for Gompertz), on
    the metrics a version records (``fit_metrics``)."""
    function = str(hyperparameters.get("function", "sigmoid"))
    method = "COE-G" if function.startswith("gomp") else "COE-S"
    shown = (
        "preservation_a",
        "preservation_b",
        "preservation_h",
        "prediction_a",
        "prediction_b",
        "prediction_h",
        "knn1_h",
        "knn5_h",
    )
    setting = {"data": "ML-100K", "dim": 2, "triples": "full observed"}
    return [
        PaperFigure(method, setting, metric, value, "Table 3")
        for metric, value in zip(METRICS, _TABLE3[method])
        if metric in shown
    ]


def paper_figures(dataset: str) -> list[PaperFigure]:
    """Table 3 is 2-D only: with --dim 3 it is printed as rows we did not run."""
    setting = {"dim": 2}
    figures = []
    for method, values in _TABLE3.items():
        for metric, value in zip(METRICS, values):
            figures.append(PaperFigure(method, setting, metric, value, "Table 3"))
    return figures


def run(args: argparse.Namespace) -> list[Row]:
    data = paper_filter(load_ratings(args))
    dataset = args.dataset or os.path.basename(os.path.dirname(os.path.abspath(args.data))) or "data"
    verbose = not args.quiet
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if verbose else (lambda msg: None)
    log(f"{dataset}: {data.n_users} users, {data.n_items} items, {len(data)} ratings after the filter")
    functions = ["sigmoid", "gompertz"] if args.function == "both" else [args.function]
    names = {"sigmoid": "COE-S", "gompertz": "COE-G"}
    params = {f: _params(f, args) for f in functions}
    setting = {"dim": params[functions[0]]["n_components"]}
    per_run: dict[str, dict[str, list[float]]] = {}
    seconds: dict[str, list[float]] = {}
    chosen: dict[str, list[dict]] = {}
    _warm_up(data)
    for run_no in range(args.runs):
        rng = np.random.default_rng([args.seed, run_no])
        observed = split_per_user(data.user, data.n_users, 0.8, rng)
        values = protocol_values(data, observed)
        run_params = dict(params)
        if args.tune:
            for f in functions:
                run_params[f] = tune(
                    f, params[f], data, observed, np.random.default_rng([args.seed, 10_000 + run_no]), log
                )
                chosen.setdefault(names[f], []).append(run_params[f])
        for f in functions:
            run_seed = args.seed * 1000 + run_no
            metrics, secs = fit_and_evaluate(
                dict(run_params[f], random_state=run_seed), data, values, observed
            )
            seconds.setdefault(names[f], []).append(secs)
            for metric, value in metrics.items():
                per_run.setdefault(names[f], {}).setdefault(metric, []).append(value)
            log(
                f"run {run_no + 1}/{args.runs} {names[f]}: pres H {metrics['preservation_h']:.4f} "
                f"pred H {metrics['prediction_h']:.4f} knn1 H {metrics['knn1_h']:.3f} fit {secs:.2f}s"
            )
        if not args.no_references:
            for ref in ("random", "popularity"):
                dist = reference_distances(ref, data, observed, rng, setting["dim"])
                for metric, value in evaluate_distances(data, values, observed, dist).items():
                    per_run.setdefault(ref, {}).setdefault(metric, []).append(value)
    rows = []
    for method, figures in per_run.items():
        for metric in METRICS:
            rows.append(summarise(method, dataset, setting, metric, figures[metric]))
        if method in seconds:
            rows.append(summarise(method, dataset, setting, "fit_seconds", seconds[method]))
            rows.append(summarise(method, dataset, setting, "fit_cpu_seconds", figures["fit_cpu_seconds"]))
    print_table(
        rows,
        paper_figures(dataset),
        title=f"COE on {dataset} ({data.n_users} users, {data.n_items} items, {len(data)} ratings),"
        f" {args.runs} random 80/20 splits; paper: Table 3",
    )
    for f in functions:
        if args.tune:
            picks: dict[str, int] = {}
            for p in chosen[names[f]]:
                key = ", ".join(
                    f"{k}={p[k]}" for k in ("lam" if f == "sigmoid" else "alpha", "reg", "group_power")
                )
                picks[key] = picks.get(key, 0) + 1
            print(
                f"{names[f]} tuned per split: "
                + "; ".join(f"{k} ({n} of {args.runs})" for k, n in picks.items())
            )
        else:
            print(f"{names[f]} hyperparameters: {params[f]}")
    return rows
