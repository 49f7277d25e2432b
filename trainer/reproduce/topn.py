"""Top-N protocol: what ``Recommend`` serves, scored on held-out ratings.

The papers' protocols order the items a user rated; a shop asks for the top
N of *all* items the user has not rated. Per run (seed), each user's ratings
are split (``--test-fraction`` held out, ``split_ratings``): at random
(``--split random``), or each user's latest by timestamp (``--split time``).
The relevant items are the held-out ratings at or above ``--threshold``; on
interaction logs (``--feedback implicit``, ``--strength COLUMN``), every
held-out interaction. Every model is fitted on the training part with its
estimator defaults (what ``ordrec-train train KIND --set tune=false`` publishes; ``--set
MODEL.tune=true`` measures the settings tuner too), packed into its artifact and asked
through its serving index for the top N of all items, the user's training
items excluded (``index.recommend(row, n, exclude=index.seen(row))``).

Metrics per user with at least one relevant item, averaged over users:
recall@N = relevant items found / min(N, relevant), NDCG@N with binary gain;
beside them catalogue coverage (distinct items in all top-10 lists / items)
and the share of recommended items among the 10 % most popular.

References fitted on the same split: popularity (training rating counts),
EASE (Steck 2019; its L2 weight, 10 to 10^4 in :data:`EASE_GRID`, chosen on a
validation split carved from the training part only, the same way as the test
split) and, when the ``baselines`` extra is installed, implicit's ALS (factors,
regularization, confidence weight alpha and iterations chosen the same way, by
coordinate ascent over :data:`ALS_GRID`: 864 settings, at most 37 of them
fitted, each under one BLAS thread) and, on
request (``--references ...,bpr``), implicit's BPR (factors, learning rate,
regularization and iterations over :data:`BPR_GRID`, the same search). Each
per-run row of a tuned reference records its chosen settings (``setting.chosen``).

On interactions the models fit strength levels (``LevelMapping``): per run and
model, the mapping and its number of levels (:data:`LEVEL_GRID`; for COE also
``strength_power``, the weight of a stronger interaction's triples) are chosen
on the same kind of validation split of the training part, by recall@10
(``choose_levels``); ``--levels`` fixes the mapping instead.

``--fold-in`` adds the cold-start rows: a seeded share of users is left out
of the fit entirely and served as the server serves a user it has not seen:
folded in from their training ratings (``index.fold_in``) where the kind
can, else the kind's popularity fallback (``index.popular``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ordrec.service.indices.models import kinds
from ordrec.service.indices.models.base import RecommenderIndex
from ordrec.trainer.data.interactions import (
    DEFAULT_MAPPING,
    LEVEL_GRID,
    LevelMapping,
    distinct_mappings,
    ordinal_levels,
    strength_levels,
)
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.evaluation.holdout import SPLITS, split_ratings
from ordrec.trainer.evaluation.topn import TopN, topn_metrics
from ordrec.trainer.models.dcr import PAPER_PARAMS
from ordrec.trainer.models.pipeline import FitPipeline, accepted_params, configure
from ordrec.trainer.reproduce.coe import DEFAULTS as COE_PAPER
from ordrec.trainer.reproduce.params import parse_value
from ordrec.trainer.reproduce.report import Row, summarise

DEFAULT_RUNS = 5
DEFAULT_MODELS = ("dcr", "pairwise_dcr", "coe")
#: The references a run can add, and those it adds unless ``--references`` says otherwise.
REFERENCES = ("popularity", "ease", "als", "bpr")
DEFAULT_REFERENCES = ("popularity", "ease", "als")
#: The references implicit (the ``baselines`` extra) fits.
IMPLICIT_REFERENCES = ("als", "bpr")
METRICS = ("recall@10", "ndcg@10", "recall@20", "coverage@10", "popular_share@10")
#: Reads interaction logs: the CLI gives it ``--feedback`` and ``--strength``.
READS_INTERACTIONS = True


@dataclass(frozen=True)
class Grid:
    """A reference's settings: the values of each axis, and where the search starts."""

    axes: dict[str, tuple]
    start: dict[str, object]

    @property
    def size(self) -> int:
        return int(np.prod([len(values) for values in self.axes.values()]))


# One axis: the search fits each of its 10 values once. The ends lie beyond where the choice
# landed on ML-100K and Last.fm (between 100 and 1000 on both).
EASE_GRID = Grid(
    {"l2": (10.0, 20.0, 50.0, 100.0, 200.0, 300.0, 500.0, 1000.0, 3000.0, 10000.0)}, {"l2": 200.0}
)
# 6 x 6 x 6 x 4 = 864 settings; coordinate ascent fits at most 1 + 2 x (5 + 5 + 5 + 3) = 37.
# Confidence = 1 + alpha x strength level (Hu, Koren & Volinsky's c = 1 + alpha r).
ALS_GRID = Grid(
    {
        "factors": (16, 32, 64, 128, 256, 512),
        "regularization": (0.01, 0.1, 1.0, 10.0, 100.0, 1000.0),
        "alpha": (0.1, 0.3, 1.0, 3.0, 10.0, 40.0),
        "iterations": (15, 30, 60, 120),
    },
    {"factors": 128, "regularization": 1.0, "alpha": 1.0, "iterations": 15},
)
# 3 x 3 x 3 x 3 = 81 settings; coordinate ascent fits at most 1 + 2 x (2 + 2 + 2 + 2) = 17.
BPR_GRID = Grid(
    {
        "factors": (64, 128, 256),
        "learning_rate": (0.003, 0.01, 0.03),
        "regularization": (0.0001, 0.001, 0.01),
        "iterations": (25, 50, 100),
    },
    {"factors": 128, "learning_rate": 0.01, "regularization": 0.001, "iterations": 50},
)
SEARCH_SWEEPS = 2
#: COE's weight of a stronger interaction's triples (``strength_power``), chosen beside the mapping.
STRENGTH_POWERS = (0.0, 1.0)
# The models of the list: the registered kind each is fitted as, and its settings beyond the defaults.
MODELS = {
    "dcr": ("dcr", {}),
    "pairwise_dcr": ("dcr", {"pairwise": True}),
    "coe": ("coe", {}),
    "dcr_paper": ("dcr", PAPER_PARAMS),
    "pairwise_dcr_paper": ("dcr", {**PAPER_PARAMS, "pairwise": True}),
    "coe_paper": ("coe", {**COE_PAPER["sigmoid"], "n_components": 2}),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help=f"comma-separated, of {', '.join(MODELS)} (the _paper ones: the papers' objectives)",
    )
    parser.add_argument(
        "--references",
        default=",".join(DEFAULT_REFERENCES),
        help="comma-separated, of " + ", ".join(REFERENCES),
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=4.0,
        help="held-out ratings at or above are relevant (interactions: every held-out one)",
    )
    parser.add_argument(
        "--test-fraction", type=float, default=0.2, help="share of each user's ratings held out"
    )
    parser.add_argument(
        "--split",
        choices=SPLITS,
        default="random",
        help="which of each user's ratings are held out: random ones, or the latest by timestamp",
    )
    parser.add_argument(
        "--fold-in",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="also leave this share of users out of the fit and serve them as new users (fold-in / fallback)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="MODEL.KEY=VALUE",
        help="a hyperparameter of one model of the list, e.g. dcr.n_components=50",
    )
    parser.add_argument("--dataset", help="data set name for the rows (default: from the path)")


@dataclass
class Split:
    """One run's data: the fit part, the held-out part and the users served as new (if any)."""

    train: Ratings
    test: Ratings
    new_users: np.ndarray  # user rows left out of the fit (fold-in rows)

    @property
    def fit(self) -> Ratings:
        if self.new_users.size == 0:
            return self.train
        return self.train.subset(~np.isin(self.train.user, self.new_users))


def make_split(data: Ratings, test_fraction: float, new_share: float, seed: int, by: str = "random") -> Split:
    """The seeded split of one run (interactions keep their strengths: each model's levels are
    computed from the training part alone, ``choose_levels``)."""
    train, test = split_ratings(data, test_fraction, seed, by)
    rng = np.random.default_rng([seed, 7])
    users = np.unique(train.user)
    new = np.sort(rng.choice(users, int(round(new_share * users.size)), replace=False))
    return Split(train, test, new.astype(np.int64))


def model_settings(names: list[str], assignments: list[str]) -> dict[str, dict]:
    """Each listed model's estimator settings: the list's own, then ``--set MODEL.KEY=VALUE``
    (KEY one of the names a job table takes for that kind, ``accepted_params``)."""
    settings = {name: dict(MODELS[name][1]) for name in names}
    for text in assignments:
        target, eq, value = text.partition("=")
        model, dot, key = target.partition(".")
        if not (eq and dot and key):
            raise SystemExit(f"--set {text!r}: expected MODEL.KEY=VALUE")
        if model not in settings:
            raise SystemExit(f"--set {text!r}: {model!r} is not in --models ({', '.join(settings)})")
        known = accepted_params(MODELS[model][0])
        if key not in known:
            raise SystemExit(
                f"--set {text!r}: {key!r} is not a parameter of {model} (known: {', '.join(known)})"
            )
        settings[model][key] = parse_value(value)
    return settings


# ------------------------------------------------------------------ scorers
def served_lists(index: RecommenderIndex, users: np.ndarray, n: int) -> np.ndarray:
    """Each user's top ``n`` as Recommend serves it: the serving index, training items excluded."""
    lists = np.full((users.size, n), -1, dtype=np.int64)
    for k, (found, _) in enumerate(
        index.recommend_many(users, n, excludes=[index.seen(int(u)) for u in users])
    ):
        lists[k, : found.size] = found
    return lists


def folded_lists(
    index: RecommenderIndex, split: Split, users: np.ndarray, n: int, *, with_ratings: bool = True
) -> tuple[np.ndarray, str]:
    """Top ``n`` for users the fit never saw, from their training ratings (or, without
    ``with_ratings``, only which items they interacted with), as the server answers such a
    user: folded in where the kind can, else its popularity fallback."""
    lists = np.full((users.size, n), -1, dtype=np.int64)
    by_user = _rows_by_user(split.train, users)
    folds = index.folds_in and (with_ratings or index.folds_in_picks)
    for k, u in enumerate(users):
        items, values = by_user[int(u)]
        values = values if with_ratings else np.full(values.shape, np.nan)
        vector = index.fold_in(items, values) if folds else None
        found, _ = (
            index.recommend_for(vector, n, exclude=items)
            if vector is not None
            else index.popular(n, exclude=items)
        )
        lists[k, : found.size] = found
    how = "fold-in" if folds else "fallback"
    return lists, how if with_ratings else f"{how} from interactions"


def _rows_by_user(data: Ratings, users: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    keep = np.isin(data.user, users)
    user, item, rating = data.user[keep], data.item[keep].astype(np.int64), data.rating[keep]
    order = np.argsort(user, kind="stable")
    user, item, rating = user[order], item[order], rating[order]
    bounds = np.searchsorted(user, users), np.searchsorted(user, users, side="right")
    return {int(u): (item[lo:hi], rating[lo:hi]) for u, lo, hi in zip(users, *bounds)}


def score_lists(scores: np.ndarray, train: Ratings, users: np.ndarray, n: int) -> np.ndarray:
    """Top ``n`` of dense reference scores (users x items), the users' training items excluded."""
    scores = np.array(scores, dtype=np.float64)
    rated = sp.csr_matrix(
        (np.ones(len(train)), (train.user, train.item)), shape=(train.n_users, train.n_items)
    )[users]
    scores[rated.nonzero()] = -np.inf
    top = np.argpartition(-scores, n, axis=1)[:, :n]
    order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
    return np.take_along_axis(top, order, axis=1)


# --------------------------------------------------------------- references
def interactions(data: Ratings) -> sp.csr_matrix:
    """The users x items matrix of training ratings as ones (what was picked)."""
    x = sp.csr_matrix(
        (np.ones(len(data), np.float64), (data.user, data.item)), shape=(data.n_users, data.n_items)
    )
    x.data[:] = 1.0
    return x


def popularity_scores(train: Ratings) -> Callable[[np.ndarray], np.ndarray]:
    counts = np.bincount(train.item, minlength=train.n_items).astype(np.float64)
    return lambda users: np.tile(counts, (users.size, 1))


def ease_scores(train: Ratings, l2: float) -> Callable[[np.ndarray], np.ndarray]:
    """EASE (Steck, WWW 2019): B = I - P diagMat(1 / diag(P)), P = (X'X + l2 I)^-1, diag(B) = 0.

    Only the items with a training row enter the inverse: any other item's row and column of
    X'X + l2 I are l2 on the diagonal alone, so its row and column of B are zero (score 0)."""
    x = interactions(train)
    picked = np.flatnonzero(x.getnnz(axis=0))
    x_picked = x[:, picked].tocsr()
    b = ease_weights(x_picked, l2)

    def scores(users: np.ndarray) -> np.ndarray:
        out = np.zeros((users.size, train.n_items))
        out[:, picked] = x_picked[users] @ b
        return out

    return scores


def ease_weights(x: sp.csr_matrix, l2: float) -> np.ndarray:
    """EASE's item-item weights B of the users x items matrix ``x`` (float64)."""
    p = ridge_gram_inverse(x, l2)
    p /= -np.diag(p).copy()
    p[np.diag_indices_from(p)] = 0.0
    return p


def ridge_gram_inverse(x: sp.csr_matrix, l2: float) -> np.ndarray:
    """(X'X + l2 I)^-1, items x items. With fewer users than items, by Woodbury's identity
    (I - X'(XX' + l2 I)^-1 X) / l2: the matrix inverted is users x users, the cheaper one."""
    n_users, n_items = x.shape
    small = (x @ x.T if n_users < n_items else x.T @ x).toarray()
    small[np.diag_indices_from(small)] += l2
    inverse = np.linalg.inv(small)
    if n_users >= n_items:
        return inverse
    p = x.T @ (x.T @ inverse).T  # X' (XX' + l2 I)^-1 X, dense; the inverse is symmetric
    p *= -1.0 / l2
    p[np.diag_indices_from(p)] += 1.0 / l2
    return p


def als_scores(
    train: Ratings, seed: int, factors: int, regularization: float, alpha: float, iterations: int
) -> Callable[[np.ndarray], np.ndarray]:
    """implicit's ALS (Hu, Koren & Volinsky 2008; the ``baselines`` extra): confidence
    1 + ``alpha`` x the strength level (1 a rating) on what was picked, 1 elsewhere.

    Fitted under one BLAS thread: implicit solves on its own threads, and BLAS threads inside
    them oversubscribe the cores (implicit warns; ``threadpoolctl`` is one of its requirements)."""
    from implicit.cpu.als import AlternatingLeastSquares
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):
        model = AlternatingLeastSquares(
            factors=factors,
            regularization=regularization,
            iterations=iterations,
            random_state=seed,
            calculate_training_loss=False,
        )
        model.fit(als_confidence(train, alpha), show_progress=False)
    user_factors, item_factors = np.asarray(model.user_factors), np.asarray(model.item_factors)
    return lambda users: user_factors[users] @ item_factors.T


def als_confidence(train: Ratings, alpha: float) -> sp.csr_matrix:
    """The users x items confidences ALS is given: 1 + ``alpha`` x level where picked (the
    pair's strength level on interactions, 1 on ratings); implicit takes 1 where nothing is."""
    if train.implicit:  # one row per (user, item) pair: the readers fold repeats into a strength
        shape = (train.n_users, train.n_items)
        confidence = sp.csr_matrix((train.rating.astype(np.float64), (train.user, train.item)), shape)
    else:
        confidence = interactions(train)
    confidence.data = 1.0 + alpha * confidence.data
    return confidence.astype(np.float32)


def bpr_scores(
    train: Ratings, seed: int, factors: int, learning_rate: float, regularization: float, iterations: int
) -> Callable[[np.ndarray], np.ndarray]:
    """implicit's BPR (Rendle et al. 2009; the ``baselines`` extra): every pick above a sampled
    item the user did not pick, whatever its strength; one thread, so a seed gives one model."""
    from implicit.cpu.bpr import BayesianPersonalizedRanking

    model = BayesianPersonalizedRanking(
        factors=factors,
        learning_rate=learning_rate,
        regularization=regularization,
        iterations=iterations,
        num_threads=1,
        random_state=seed,
    )
    model.fit(interactions(train).astype(np.float32), show_progress=False)
    # The item factors carry a bias column and the user factors a matching 1: a plain product.
    user_factors, item_factors = np.asarray(model.user_factors), np.asarray(model.item_factors)
    return lambda users: user_factors[users] @ item_factors.T


def implicit_available() -> bool:
    """Whether implicit (the ``baselines`` extra, for ALS and BPR) is installed."""
    return importlib.util.find_spec("implicit") is not None


# The tuned references: their grid and how one setting is fitted (settings chosen on validation).
TUNED = {
    "ease": (EASE_GRID, lambda data, setting, seed: ease_scores(data, setting["l2"])),
    "als": (ALS_GRID, lambda data, setting, seed: als_scores(data, seed, **setting)),
    "bpr": (BPR_GRID, lambda data, setting, seed: bpr_scores(data, seed, **setting)),
}


def coordinate_search(
    grid: Grid, score: Callable[[dict], float], sweeps: int = SEARCH_SWEEPS
) -> tuple[dict, int]:
    """The best setting coordinate ascent finds on ``grid``: each axis in turn moved to its best
    value with the others held, until a sweep changes nothing (at most ``sweeps``); also the
    number of settings scored (each once)."""
    scored: dict[tuple, float] = {}

    def value(setting: dict) -> float:
        key = tuple(setting.items())
        if key not in scored:
            scored[key] = score(setting)
        return scored[key]

    best = dict(grid.start)
    for _ in range(sweeps):
        before = dict(best)
        for axis, values in grid.axes.items():
            best[axis] = max(values, key=lambda v: value({**best, axis: v}))  # noqa: B023 (used at once)
        if best == before:
            break
    return best, len(scored)


def reference_scorer(
    name: str, train: Ratings, threshold: float, seed: int, log, by: str = "random"
) -> tuple[Callable, dict] | None:
    """The reference's scorer and the settings it was fitted with, chosen on a validation split
    of ``train`` only (carved as the test split was: ``by``); None if it cannot be fitted."""
    if name == "popularity":
        return popularity_scores(train), {}
    if name in IMPLICIT_REFERENCES and not implicit_available():
        log(f"{name}: implicit is not installed (pip install 'ordrec[baselines]'); row skipped")
        return None
    grid, fit_one = TUNED[name]
    fit, val = split_ratings(train, 0.2, seed + 100, by)
    truth = TopN.from_ratings(val, threshold)

    def validation_recall(setting: dict) -> float:
        lists = score_lists(fit_one(fit, setting, seed)(truth.users), fit, truth.users, 10)
        return topn_metrics(lists, truth, fit)["recall@10"]

    chosen, fitted = coordinate_search(grid, validation_recall)
    log(f"{name}: chosen on validation {chosen} ({fitted} of {grid.size} settings fitted)")
    return fit_one(train, chosen, seed), chosen


# ------------------------------------------------------------------ levels
def choose_levels(
    kind: str, params: dict, train: Ratings, seed: int, log, by: str = "random"
) -> tuple[LevelMapping, dict]:
    """The level mapping (and, for COE, ``strength_power``) with the best recall@10 on a
    validation split of ``train`` (carved as the test split was: ``by``), by coordinate ascent
    over :data:`LEVEL_GRID` x :data:`STRENGTH_POWERS`; the test part is never read."""
    fit, val = split_ratings(train, 0.2, seed + 100, by)
    axes: dict[str, tuple] = {"levels": distinct_mappings(fit, LEVEL_GRID)}
    several_levels = any(
        np.unique(strength_levels(fit, LevelMapping.parse(m))).size > 1 for m in axes["levels"]
    )
    if kind == "coe" and "strength_power" not in params and several_levels:
        axes["strength_power"] = STRENGTH_POWERS
    grid = Grid(axes, {axis: values[0] for axis, values in axes.items()})
    if grid.size == 1:
        return LevelMapping.parse(axes["levels"][0]), {}
    truth = TopN.from_ratings(val, 0.0)

    def validation_recall(setting: dict) -> float:
        extra = {k: v for k, v in setting.items() if k != "levels"}
        levels = ordinal_levels(fit, LevelMapping.parse(setting["levels"]))
        index = fit_index(kind, {**params, **extra}, levels, seed).index
        return topn_metrics(served_lists(index, truth.users, 10), truth, levels)["recall@10"]

    chosen, fitted = coordinate_search(grid, validation_recall)
    log(f"{kind}: levels chosen on validation {chosen} ({fitted} of {grid.size} settings fitted)")
    return LevelMapping.parse(chosen.pop("levels")), chosen


def model_levels(
    kind: str, params: dict, split: Split, seed: int, log, args: argparse.Namespace, known: dict
) -> tuple[Split, dict, str]:
    """The run's split with interactions as the model's levels (``--levels``, else chosen on
    validation once per kind and run, ``known``: Pairwise DCR takes DCR's levels), its settings
    with what was chosen beside them, and the choice as text."""
    if not split.train.implicit:
        return split, params, ""
    fixed = getattr(args, "levels", None)
    if fixed is None and configure(kind, params).chooses_levels:
        return split, params, ""  # the settings tuner chooses them with its other settings
    if fixed is None and kind not in known:
        known[kind] = choose_levels(kind, params, split.fit, seed, log, args.split)
    mapping, extra = (fixed, {}) if fixed else known[kind]
    chosen = " ".join([str(mapping), *(f"{k}={v:g}" for k, v in extra.items())])
    levelled = Split(ordinal_levels(split.train, mapping), split.test, split.new_users)
    return levelled, {**params, **extra}, chosen


# ---------------------------------------------------------------------- run
class Fitted(NamedTuple):
    """A model of the run: its serving index, the fit's seconds, what the fit chose (the
    settings tuner's line with ``tune=true``; empty otherwise) and the fitted pipeline."""

    index: RecommenderIndex
    seconds: float
    note: str
    pipeline: FitPipeline


def fit_index(kind_name: str, params: dict, data: Ratings, seed: int) -> Fitted:
    """``kind_name`` fitted on ``data`` as a job configures it (DCR's pairwise refinement kept
    only where it wins on validation)."""
    kind = kinds.get(kind_name)
    started = time.perf_counter()
    estimator = configure(kind_name, dict(params, random_state=seed)).fit(data)
    index = kind.index_class().from_artifact(estimator.to_artifact())
    return Fitted(index, time.perf_counter() - started, estimator.fit_note() or "", estimator)


def run(args: argparse.Namespace) -> list[Row]:
    from ordrec.trainer.reproduce.dcr import load_ratings

    data = load_ratings(args)
    dataset = args.dataset or os.path.basename(os.path.dirname(os.path.abspath(args.data))) or "data"
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown {', '.join(unknown)} (known: {', '.join(MODELS)})")
    references = [r for r in args.references.split(",") if r]
    if any(r not in REFERENCES for r in references):
        raise SystemExit(f"--references: known are {', '.join(REFERENCES)}")
    settings = model_settings(models, args.set)
    for params in settings.values():  # the tuner validates as the references do: carved like the test
        if params.get("tune"):
            params.setdefault("tune_split", args.split)
    if args.split == "time" and data.time is None:
        raise SystemExit(
            f"--split time: {args.data} has no timestamps (a timestamp column, or a MovieLens file);"
            " use --split random"
        )
    setting = {
        "threshold": None if data.implicit else args.threshold,
        "test_fraction": args.test_fraction,
        "split": args.split,
        "feedback": data.feedback,
    }
    values: dict[str, dict[str, list[float]]] = {}
    chosen: dict[tuple[str, int], str] = {}  # (model, run): the levels chosen on validation
    tuned: dict[tuple[str, int], dict] = {}  # (reference, run): its settings chosen on validation

    def record(method: str, metrics: dict[str, float]) -> None:
        for metric, value in metrics.items():
            values.setdefault(method, {}).setdefault(metric, []).append(value)

    for run_no in range(args.runs):
        seed = args.seed + run_no
        split = make_split(data, args.test_fraction, args.fold_in, seed, args.split)
        truth = TopN.from_ratings(split.test, args.threshold)
        known = truth.without(split.new_users)
        new = truth.only(split.new_users)
        # The references see interactions as the default levels (ALS's confidence is the level).
        default = Split(ordinal_levels(split.train, DEFAULT_MAPPING), split.test, split.new_users)
        for name in references:
            fitted = reference_scorer(name, default.fit, args.threshold, seed, log, args.split)
            if fitted is None:
                continue
            scorer, tuned[name, run_no] = fitted
            record(
                name,
                topn_metrics(
                    score_lists(scorer(known.users), default.fit, known.users, 20), known, default.fit
                ),
            )
            if new.users.size and name == "popularity":
                record(
                    f"{name} (new users)",
                    topn_metrics(
                        score_lists(scorer(new.users), default.train, new.users, 20), new, default.fit
                    ),
                )
        levels_of_kind: dict[str, tuple] = {}
        for name in models:
            kind = MODELS[name][0]
            levelled, params, chosen[name, run_no] = model_levels(
                kind, settings[name], split, seed, log, args, levels_of_kind
            )
            index, seconds, note, pipeline = fit_index(kind, params, levelled.fit, seed)
            # The levels the model saw, when its fit chose them (the tuner): fold-in reads them.
            levelled = Split(pipeline.fitted_data(levelled.train), split.test, split.new_users)
            metrics = topn_metrics(served_lists(index, known.users, 20), known, levelled.fit)
            record(name, dict(metrics, fit_seconds=seconds))
            log(
                f"run {run_no + 1}/{args.runs} {name}: recall@10 {metrics['recall@10']:.4f} fit {seconds:.1f}s"
                + (f" levels {chosen[name, run_no]}" if chosen[name, run_no] else "")
                + (f"; {note}" if note else "")
            )
            for with_ratings in (True, False) if new.users.size else ():
                lists, how = folded_lists(index, levelled, new.users, 20, with_ratings=with_ratings)
                record(f"{name} ({how}, new users)", topn_metrics(lists, new, levelled.fit))
    # The mean over runs, then each run alone (its seed in the setting): claims hold per seed.
    rows = [
        summarise(method, dataset, setting, metric, per_run)
        for method, by_metric in values.items()
        for metric, per_run in by_metric.items()
    ] + [
        summarise(
            method,
            dataset,
            run_setting(
                setting, args.seed + run_no, chosen.get((method, run_no)), tuned.get((method, run_no))
            ),
            metric,
            [value],
        )
        for method, by_metric in values.items()
        for metric, per_run in by_metric.items()
        for run_no, value in enumerate(per_run)
    ]
    print_topn(rows, values, dataset)
    return rows


def run_setting(setting: dict, seed: int, levels: str | None, chosen: dict | None = None) -> dict:
    """A per-run row's setting: the run's seed, the levels chosen for it (interactions) and a
    tuned reference's settings chosen on validation (``chosen``)."""
    extra = {"levels": levels, "chosen": chosen}
    return dict(setting, seed=seed, **{key: value for key, value in extra.items() if value})


def print_topn(rows: list[Row], values: dict[str, dict[str, list[float]]], dataset: str) -> None:
    """One line per method: each metric's mean over runs (and recall@10's lowest run)."""
    metrics = [m for m in METRICS if any(m in v for v in values.values())]
    ease = values.get("ease", {}).get("recall@10")
    print(f"\nTop-N on {dataset} (mean over {len(next(iter(values.values()))['recall@10'])} runs)")
    header = f"{'method':<46}" + "".join(f"{m:>18}" for m in metrics) + f"{'min recall@10':>15}"
    header += f"{'/ EASE':>8}" if ease else ""
    print(header)
    for method, by_metric in values.items():
        line = f"{method:<46}" + "".join(
            f"{np.mean(by_metric[m]):>11.4f} ±{np.std(by_metric[m]):.3f}" if m in by_metric else f"{'-':>18}"
            for m in metrics
        )
        line += f"{min(by_metric['recall@10']):>15.4f}"
        if ease and len(by_metric["recall@10"]) == len(ease):
            line += f"{np.mean(by_metric['recall@10']) / np.mean(ease):>8.2f}"
        print(line)
