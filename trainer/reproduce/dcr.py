"""DCR protocol (Hu & Li, WWW 2017, Section 5): NDCG@10 with N training ratings per user.

For each user with at least N + 10 ratings, N ratings chosen at random are
the training set and all the user's other ratings the test set; users with
fewer are dropped. NDCG@10 per user over that user's test items only (gain
``2^r - 1``, discount ``log2(1 + position)``, normalised by the ideal order of
the same items), averaged over users; mean and standard deviation over runs.

DCR and Pairwise DCR are scored through the serving index built from the
in-memory artifact (``DCRIndex.from_artifact(estimator.to_artifact())``) and its
``score_items``, so the figures come from the code that answers queries.
Reference rows are computed the same way from fixed scores: random, item mean
rating, and the damped item mean ``(sum r + beta * mean) / (count + beta)``.

By default each level's epochs are chosen by early stopping on the
log-likelihood of validation hold-outs carved from each user's N training
ratings (``--stop validation``, a gain counting above ``--val-tol``; the
per-level median over ``--select-folds`` hold-outs); the final model is
then refitted on all N ratings for those per-level epochs. The starting
point, rank, noise and learning rate for each N are ``protocol_fit``'s:
the item-marginal start (ours) at rank 40 where each user holds out fewer
than 10 ratings (N < 40), the random start at rank 320 from there on, as
chosen by the validation-only sweep ``--sweep`` (docs/dcr.md).
``--init-grid``/``--rank-grid`` choose start and rank per run instead, by
validation NDCG@10 over the hold-outs where >= 10 ratings per user are
held out (``select``). ``--init random --stop tol --rank 40 --lr 0.05``
is the estimator's default training at rank 40 (random start,
training-likelihood rule).

Hyperparameters (``--tune``: lr x reg, then the pairwise learning rate) are
chosen on a validation split carved from each user's N training ratings (a
quarter of them, at least two, held out), never from the test ratings; the
final model is then fitted on all N. The damped mean's ``beta`` is chosen
the same way, averaged over five such hold-outs, and is also the
``item_shrinkage`` of the ``-shrunk`` variants under ``--tune``.
``--grid-on-test`` adds a diagnostic row only: the paper's grid judged on
the test ratings, as the paper reports its figures.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from dataclasses import dataclass
from functools import partial

import numpy as np

from ordrec.service.indices.models.dcr import DCRIndex
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.evaluation.metrics import ndcg_at_k, ndcg_values
from ordrec.trainer.models.dcr import (
    DCR,
    PAPER_PARAMS,
    DCRVariants,
    PairwiseDCR,
    ValidationStopping,
    holdouts,
    stopped_level_epochs,
    validation_split,
)
from ordrec.trainer.models.pipeline import configure, flat_constraints, wrapper
from ordrec.trainer.models.protocol_selection import OneStandardErrorChoice
from ordrec.trainer.models.selection import ValidatedGrid, grid_points, standard_error
from ordrec.trainer.reproduce.params import add_param_flags, given_params, parse_value
from ordrec.trainer.reproduce.report import PaperFigure, Row, print_table, summarise

DEFAULT_RUNS = 5
METRIC = "ndcg@10"
K = 10

# Table 2 (DCR) and Section 5.6 (Pairwise DCR) of the paper, NDCG@10.
PAPER_DCR = {
    "ml-100k": {10: 0.6901, 20: 0.7082, 50: 0.7241},
    "ml-1m": {10: 0.7261, 20: 0.7431, 50: 0.7622},
    "ml-10m": {10: 0.7132, 20: 0.7251, 50: 0.7421},
    "netflix1m": {10: 0.7351, 20: 0.7381, 50: 0.7522},
}
PAPER_PAIRWISE = {
    "ml-1m": {10: 0.7471, 20: 0.7596},
    "netflix1m": {10: 0.7495, 20: 0.7552},
}
# The paper's grid (Section 5.3): initial learning rate and regularisation.
LR_GRID = (0.05, 0.04, 0.03, 0.02, 0.01)
REG_GRID = (0.01, 0.001)
SHRINKAGE_GRID = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)


# ----------------------------------------------------------------- splits
def per_user_split(
    data: Ratings, n_train: int, rng: np.random.Generator, min_rest: int = 10
) -> tuple[Ratings, Ratings]:
    """``n_train`` random ratings of each user for training, the rest for test.

    Users with fewer than ``n_train + min_rest`` ratings are dropped from
    both. Id maps are kept, so rows agree between the two parts.
    """
    order = np.lexsort((rng.random(len(data)), data.user))
    user_sorted = data.user[order]
    counts = np.bincount(data.user, minlength=data.n_users)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    position = np.arange(len(data)) - starts[user_sorted]
    keep = counts[user_sorted] >= n_train + min_rest
    train_rows = order[keep & (position < n_train)]
    test_rows = order[keep & (position >= n_train)]
    return data.subset(np.sort(train_rows)), data.subset(np.sort(test_rows))


def serving_scorer(estimator: DCR, item_shrinkage: float = 0.0):
    """``score_items`` of the serving index built from the in-memory artifact."""
    return DCRIndex.from_artifact(estimator.to_artifact(item_shrinkage=item_shrinkage)).score_items


def index_ndcg(estimator: DCR, test: Ratings, item_shrinkage: float = 0.0) -> float:
    """NDCG@10 scored by the serving index built from the in-memory artifact (its items'
    factors shrunk by ``item_shrinkage``, the -shrunk rows)."""
    return ndcg_at_k(serving_scorer(estimator, item_shrinkage), test)


# ----------------------------------------------------------- references
def item_means(train: Ratings, beta: float) -> np.ndarray:
    """Damped item mean ``(sum r + beta * mu) / (count + beta)``; unrated items get ``mu``."""
    mu = float(train.rating.mean())
    counts = np.bincount(train.item, minlength=train.n_items).astype(np.float64)
    sums = np.bincount(train.item, weights=train.rating.astype(np.float64), minlength=train.n_items)
    denom = counts + beta
    return np.where(denom > 0, (sums + beta * mu) / np.where(denom > 0, denom, 1.0), mu)


def fixed_scorer(scores: np.ndarray):
    return lambda user_row, item_rows: scores[item_rows]


def tune_shrinkage(train: Ratings, rng: np.random.Generator, folds: int = 5) -> float:
    """The damped mean's ``beta`` by mean validation NDCG@10 over ``folds`` random hold-outs.

    One hold-out of two ratings per user (N = 10) is too noisy to choose
    ``beta`` (it swings between 0 and 50 from run to run); the mean over
    several costs nothing since the damped mean needs no fitting.
    """
    splits = holdouts(train, rng, folds)

    def mean_ndcg(point: dict) -> tuple[float, dict, None]:
        scores = [ndcg_at_k(fixed_scorer(item_means(fit, point["beta"])), val) for fit, val in splits]
        return float(np.mean(scores)), point, None

    return ValidatedGrid(mean_ndcg, {"beta": SHRINKAGE_GRID}).fit().best_params_["beta"]


# ----------------------------------------------------------------- tuning
@dataclass
class Family:
    """One DCR fit per run and the rows read off it.

    ``prefix`` names the rows: ``prefix`` (as fitted), ``prefix-shrunk``
    (served with ``item_shrinkage``), ``Pairwise prefix`` and
    ``Pairwise prefix-shrunk`` (refined). With ``--tune`` the shrinkage is
    the damped item mean's ``beta`` chosen on validation folds (the amount
    of shrinkage toward "no evidence" the data supports for item means).
    """

    prefix: str
    params: dict


STOPPING = {"patience": "patience", "val_tol": "tol"}  # protocol setting -> ValidationStopping field


def split_params(params: dict) -> tuple[dict, DCRVariants, ValidationStopping]:
    """The protocol's mixed settings (over ``PAPER_PARAMS``, flat names) as the fit pipeline's
    flat settings (``pipeline.configure``: DCR's parameters, ``pairwise`` and its settings),
    DCR's variants (``DCRVariants``: order, projection, item_bias, level_epochs, ...) and the
    validation stopping rule (``patience``, ``val_tol``), the research options ``DCR.fit`` takes."""
    mixed = dict(PAPER_PARAMS, **params)
    stopping = ValidationStopping(
        **{field: mixed.pop(name) for name, field in STOPPING.items() if name in mixed}
    )
    flat, variants = DCRVariants.split(mixed)
    return flat, variants, stopping


def pointwise_params(params: dict) -> dict:
    """The parameters of the pointwise DCR the protocol's ``params`` configure (what the hold-out
    fits of :func:`stopped_level_epochs` are made with)."""
    flat, _, _ = split_params(params)
    return configure("dcr", dict(flat, pairwise=False)).estimator.get_params()


def refinement_for(params: dict, model: DCR, **overrides) -> PairwiseDCR:
    """The pipeline's pairwise step around the fitted ``model``, with the settings among the
    protocol's ``params`` and ``overrides`` (flat names: ``pairwise_learning_rate``, ...)."""
    return wrapper("dcr", "pairwise").wrap(model, dict(params, **overrides))


def fit_dcr(params: dict, data: Ratings, validation: Ratings | None = None) -> DCR:
    """DCR fitted on ``data`` through the fit pipeline from the protocol's mixed settings
    (``split_params``), refined in place (on the refinement's own random stream) when
    ``pairwise`` is among them; the protocol judges the refinement itself (``_pairwise``),
    so the pipeline's validation of it is off."""
    flat, variants, stopping = split_params(params)
    pipeline = configure("dcr", dict(flat, pairwise_validation=False))
    pipeline.fit(data, check_memory=False, validation=validation, variants=variants, stopping=stopping)
    return pipeline.best_estimator_


def fit_stopped(params: dict, fit: Ratings, val: Ratings) -> tuple[DCR, float]:
    """DCR fitted on ``fit`` with per-level early stopping on ``val``; its validation
    log-likelihood per rating (the stopping criterion, summed over levels)."""
    model = fit_dcr(params, fit, val)
    return model, float(sum(model.validation_loglik_)) / len(val)


def tune(
    train: Ratings,
    rng: np.random.Generator,
    base: dict,
    grid: dict,
    pairwise_grid: dict | None,
    log,
    stop: str = "tol",
    split: tuple[Ratings, Ratings] | None = None,
) -> tuple[dict, dict]:
    """Hyperparameters on a validation split of the training ratings.

    First the fit grid (lr x reg, the paper's Section 5.3 grid), then (for
    Pairwise DCR) the refinement grid on the best fit. With ``stop="tol"``
    the fit grid is judged by validation NDCG@10; with
    ``stop="validation"`` every grid point is early-stopped per level on the
    validation log-likelihood and judged by that likelihood (NDCG@10 over
    the two ratings per user held out at N = 10 cannot tell the grid points
    apart: 0.951-0.952 for fits whose test NDCG spans 0.70-0.71).
    With ``stop="validation"`` the returned parameters carry the chosen
    ``level_epochs``. The pairwise rate is judged by validation NDCG@10.
    """
    fit, val = split if split is not None else validation_split(train, rng)
    keys = sorted(grid)
    criterion, evaluate = TUNE_CRITERIA[stop]
    fits = ValidatedGrid(partial(evaluate, fit=fit, val=val), {k: grid[k] for k in keys}).fit(base)
    for result in fits.cv_results_:
        params = result["params"]
        epochs = f" (level epochs {params['level_epochs']})" if stop == "validation" else ""
        log(f"    tune {params_text(params, keys)}: {criterion} {result['score']:.4f}{epochs}")
    if not pairwise_grid:
        return fits.best_params_, {}
    if fits.best_model_ is None:
        raise ValueError("the fit grid is empty: no model to refine")
    pkeys = sorted(pairwise_grid)
    pairs = ValidatedGrid(
        partial(refined_ndcg, fits.best_params_, fits.best_model_, val), {k: pairwise_grid[k] for k in pkeys}
    ).fit()
    for result in pairs.cv_results_:
        log(f"    tune pairwise {params_text(result['params'], pkeys)}: val ndcg@10 {result['score']:.4f}")
    return fits.best_params_, pairs.best_params_


def stopped_loglik(params: dict, fit: Ratings, val: Ratings) -> tuple[float, dict, DCR]:
    """A grid point judged by its validation log-likelihood per rating, every level early-stopped
    on it; the point stands for the per-level epochs it stopped at."""
    model, score = fit_stopped(params, fit, val)
    return score, dict(params, level_epochs=model.best_epochs_), model


def fitted_ndcg(params: dict, fit: Ratings, val: Ratings) -> tuple[float, dict, DCR]:
    """A grid point judged by the validation NDCG@10 of its fit (training-likelihood stopping)."""
    model = fit_dcr(params, fit)
    return index_ndcg(model, val), params, model


def refined_ndcg(params: dict, model: DCR, val: Ratings, overrides: dict) -> tuple[float, dict, None]:
    """A refinement setting judged by the validation NDCG@10 of ``model`` refined with it."""
    return index_ndcg(refinement_for(params, model, **overrides).refined(model), val), overrides, None


# ``tune``'s validation criterion of the fit grid for each ``--stop`` (its name in the log).
TUNE_CRITERIA = {"validation": ("val loglik", stopped_loglik), "tol": ("val ndcg@10", fitted_ndcg)}


def grid_best_on_test(
    base: dict, train: Ratings, test: Ratings, stop: str, rng: np.random.Generator
) -> float:
    """Diagnostic: the best test NDCG@10 over the paper's whole lr x reg grid.

    The paper reports "the best ranking performance" over this grid, i.e. a
    choice made on the test ratings; this row measures how much such a
    choice can add. It is printed as its own row and chooses nothing else.
    """
    split = validation_split(train, rng) if stop == "validation" else None

    def test_ndcg(params: dict) -> tuple[float, dict, None]:
        if split is not None:
            params = dict(params, level_epochs=fit_stopped(params, *split)[0].best_epochs_)
        return index_ndcg(fit_dcr(params, train), test), params, None

    return ValidatedGrid(test_ndcg, {"learning_rate": LR_GRID, "reg": REG_GRID}).fit(base).best_score_


# The protocol's settings a flag may change (``--name-with-dashes``, named as the parameter):
# its help, and the value taken when the flag is not given (None: the protocol's for each N).
FLAG_HELP = {
    "n_components": "rank per level (paper's Table 2: 40); default: the protocol's for each N"
    " (40 for N < 40, 320 from N = 40; chosen by --sweep)",
    "learning_rate": "initial learning rate (without --tune); default: the protocol's for each N"
    " (0.01 for N < 40, 0.02 from N = 40; chosen by --sweep)",
    "reg": "L2 weight (without --tune; default 0.001)",
    "max_iter": "most epochs (all of them with --tol 0; default 100)",
    "tol": "stop once an epoch gains less than this relative training log-likelihood"
    " (0: fixed epochs; default 0.002)",
    "init": "initial factors: every level at its damped item marginals plus small noise"
    " (ours) or small random factors (zero mean); default: the protocol's for each N"
    " (marginal for N < 40, random from N = 40; chosen by --sweep)",
    "init_std": "noise of the initial factors (default: the protocol's, 0.05 marginal for N < 40,"
    " 0.1 random from N = 40; 0.02 marginal / 0.1 random with --init)",
    "val_tol": "with --stop validation: a level's validation log-likelihood must rise by more"
    " than this (relative) to count as an improvement (default 0.01; 0: any rise)",
    "order": "SGA order: ratings grouped by user (default, faster) or one random permutation",
    "learning_rate_decay": "learning rate of epoch e is learning_rate / (1 + decay * e) (default 0.02)",
    "pairwise_learning_rate": "(without --tune) default: the protocol's for each N (0.005 / 0.01 / 0.02"
    " at N = 10 / 20 / 50, nearest for other N; chosen by --sweep --sweep-pairwise-lr)",
    "pairwise_max_iter": "passes of the pairwise refinement (default 20)",
}
FLAG_CONSTRAINTS = {
    **flat_constraints("dcr"),
    **DCRVariants._parameter_constraints,
    "val_tol": ValidationStopping._parameter_constraints["tol"],
}
PROTOCOL_DEFAULTS = {
    "reg": 0.001,
    "max_iter": 100,
    "tol": 0.002,
    "val_tol": 0.01,
    "order": "user",
    "learning_rate_decay": 0.02,
    "pairwise_max_iter": 20,
}
# Settings of the protocol no flag changes (the paper's, or the variants' own).
FIXED = dict(relevance="linear", projection="ball", init_shrinkage=10.0, pairwise_reg=0.001)
ITEM_BIAS = 0.7  # s of the DCR-bias variant
TUNE_LR_GRID = (0.05, 0.03, 0.01)
TUNE_PAIRWISE_LR_GRID = (0.05, 0.02, 0.01)

INIT_STD = {"marginal": 0.02, "random": 0.1}  # the default noise for each starting point (--init given)

# The protocol's fit for each N, every value chosen by a validation-only sweep (``--sweep``:
# validation NDCG@10 over three hold-outs carved from each run's training ratings, pooled over
# the five runs of --seed 0 and of --seed 1; test ratings never computed; docs/dcr.md, "Reproduce the paper").
# Where each user holds out fewer than 10 ratings (N < 40) the sweep ranked the item-marginal
# start at rank 40 first (N = 10 and 20; lr and noise flat within 0.001, the argmax kept); where
# 10 or more are held out, the random start at rank 320 (N = 50; rank 640 tied, the smaller kept).
SMALL_N_FIT = dict(init="marginal", n_components=40, init_std=0.05, learning_rate=0.01)
LARGE_N_FIT = dict(init="random", n_components=320, init_std=0.1, learning_rate=0.02)
# The pairwise refinement's learning rate by the same sweep (--sweep-pairwise-lr) at each swept N;
# other N take the nearest swept one. (At N = 10 the sweep prefers no refinement at all.)
PAIRWISE_LR = {10: 0.005, 20: 0.01, 50: 0.02}


def protocol_fit(n_train: int) -> dict:
    """The starting point, rank, noise, learning rate and pairwise learning rate the protocol
    fits at ``n_train``."""
    nearest = min(PAIRWISE_LR, key=lambda swept: (abs(swept - n_train), swept))
    return dict(
        LARGE_N_FIT if held_out(n_train) >= K else SMALL_N_FIT, pairwise_learning_rate=PAIRWISE_LR[nearest]
    )


def held_out(n_train: int, fraction: float = 0.25, minimum: int = 2) -> int:
    """Ratings per user that ``validation_split`` holds out of ``n_train``.

    The protocol chooses among starting points and ranks by validation
    NDCG@10 only where this is at least 10 (N >= 40): over a shorter list
    NDCG@10 is a different measure from the test's (every test user has at
    least 10 test items); at N = 10 (two held-out ratings) it ranked a
    random-start fit above the item-marginal one on splits where the random
    start was 0.05 worse on the test ratings. Below that the first
    candidate is fitted. ``protocol_fit`` switches its start and rank at
    the same point (where the validation sweep at N = 10, 20 and 50 ranks
    them differently; no N between 20 and 50 was swept).
    """
    return max(minimum, int(np.floor(fraction * n_train)))


def stopped_model(params: dict, fit: Ratings, val: Ratings) -> DCR:
    """A candidate fitted on ``fit``, every level early-stopped on ``val``."""
    return fit_stopped(params, fit, val)[0]


def serving_values(model: DCR, val: Ratings) -> np.ndarray:
    """Per-user NDCG@10 on ``val`` through the serving index built from ``model``'s artifact."""
    return ndcg_values(serving_scorer(model), val)


def refined_values(params: dict, model: DCR, val: Ratings) -> np.ndarray:
    """:func:`serving_values` of a refined copy of ``model`` (the refinement's settings from ``params``)."""
    return serving_values(refinement_for(params, model).refined(model), val)


def select(
    params: dict,
    choices: list[dict],
    train: Ratings,
    rng: np.random.Generator,
    folds: int,
    log,
    rule: str = "best",
) -> dict:
    """A candidate (starting point, rank) by validation NDCG@10, one-standard-error rule.

    Every candidate is fitted on ``folds`` hold-outs of the training ratings
    (the same hold-outs for every candidate), each level early-stopped on
    the hold-out's log-likelihood, and scored by NDCG@10 over the held-out
    ratings of every user of every fold. The likelihood chooses the epochs
    but not the candidate: it prefers the item-marginal start at every N,
    while the held-out ranking tracks what the protocol measures.
    ``rule="best"`` takes the best mean (ties: the first); ``rule="one-se"``
    (``choices`` listed simplest first) the first whose mean is within one
    standard error of the best mean, the error being that of the per-user
    paired differences to the best (Breiman's one-SE rule). Returns the chosen parameters with ``level_epochs``
    (the per-level median over the folds) for the refit on all the
    training ratings.
    """
    chooser = OneStandardErrorChoice(
        stopped_model,
        choices,
        serving_values,
        folds=folds,
        rule=rule,
        random_state=rng,
    ).fit(train, params)
    for choice, result in zip(choices, chooser.cv_results_):
        log(
            f"    select {params_text(choice, sorted(choice))}: val ndcg@10 {result['mean_score']:.4f}"
            f" (level epochs {result['level_epochs']})"
        )
    return chooser.best_params_


def sweep(args: argparse.Namespace, data: Ratings, name: str, n_values, log) -> list[Row]:
    """Validation-only sweep (``--sweep``): how the protocol's fit for each N was chosen.

    For every N and run, the protocol's split and its ``--select-folds``
    hold-outs of the training ratings (the same random streams as the
    protocol, so the folds are those whose median epochs the protocol
    refits with); every candidate is fitted on each hold-out's rest,
    early-stopped per level on it, and scored by NDCG@10 over the held-out
    ratings. The test ratings are split off but never scored. Rows: metric
    ``val_ndcg@10``, one value per run (pooled over its folds' users);
    ``--sweep-seeds 0,1`` pools the runs of several split seeds.
    Note that the runs' splits overlap (a rating held out for test in one
    run can be a training, hence validation, rating in another), so a
    choice read off the pooled figure is a data-set-level choice, like a
    development split's, not a per-run one.
    """
    seeds = _grid(args.sweep_seeds, int) if args.sweep_seeds else (args.seed,)
    extra = [_sweep_setting(text) for text in args.sweep_set or ()]
    results = _Results(log)
    for n in n_values:
        candidates = _sweep_candidates(args, fit_for(n, args), extra)
        for split_seed, run_index in itertools.product(seeds, range(args.runs)):
            _sweep_run(args, data, n, split_seed, run_index, candidates, [k for k, _ in extra], results)
    rows = results.rows(name, "val_ndcg@10")
    rows.sort(key=lambda r: (r.setting["N"], -r.mean))
    print_table(
        rows,
        [],
        out=sys.stdout,
        title=f"DCR validation sweep on {name}: validation NDCG@10 over"
        f" {args.select_folds} hold-outs per run ({args.runs} runs x seeds"
        f" {','.join(map(str, seeds))}; no test"
        " ratings scored); best first",
    )
    _print_paired_differences(rows, results.values, n_values)
    return rows


def _base_params(args: argparse.Namespace) -> dict:
    """The fit settings every candidate shares (the command line's)."""
    return dict(
        FIXED,
        **{
            name: setting(args, name)
            for name in ("reg", "max_iter", "tol", "order", "learning_rate_decay", "val_tol")
        },
    )


def setting(args: argparse.Namespace, name: str):
    """A protocol setting: its flag's value when given, else the protocol's default."""
    given = getattr(args, name)
    return PROTOCOL_DEFAULTS[name] if given is None else given


def _sweep_candidates(args: argparse.Namespace, fit_n: dict, extra: list[tuple[str, tuple]]) -> list[dict]:
    """Every start x rank x lr x init_std (x ``--sweep-set``) the sweep scores at one N."""
    inits = _grid(args.init_grid, str) if args.init_grid else (fit_n["init"],)
    ranks = _grid(args.rank_grid, int) if args.rank_grid else (fit_n["n_components"],)
    lrs = _grid(args.sweep_lr) if args.sweep_lr else (fit_n["learning_rate"],)
    stds = _grid(args.sweep_init_std) if args.sweep_init_std else None
    candidates = []
    for init in inits:
        default_std = fit_n["init_std"] if init == fit_n["init"] else INIT_STD[init]
        grid = {
            "n_components": ranks,
            "learning_rate": lrs,
            "init_std": stds or (default_std,),
            **dict(extra),
        }
        for point in grid_points(grid):
            candidates.append(
                dict(
                    {"init": init, **point},
                    n_components=int(point["n_components"]),
                    learning_rate=float(point["learning_rate"]),
                    init_std=float(point["init_std"]),
                )
            )
    return candidates


def _sweep_run(
    args: argparse.Namespace,
    data: Ratings,
    n: int,
    split_seed: int,
    run_index: int,
    candidates: list[dict],
    extra_keys: list[str],
    results: _Results,
) -> None:
    """One run of the sweep: every candidate on the run's hold-outs of its training ratings."""
    rng = np.random.default_rng([split_seed, n, run_index])
    train, _ = per_user_split(data, n, rng)
    seed = int(rng.integers(2**31 - 1))
    pair_lrs = _grid(args.sweep_pairwise_lr) if args.sweep_pairwise_lr else ()
    base = _base_params(args)
    # The refinement as the protocol runs it (on each hold-out's fitted DCR), scored on the hold-out.
    refined = {
        f"pairwise_learning_rate={plr}": partial(
            refined_values,
            dict(base, pairwise_learning_rate=plr, pairwise_max_iter=setting(args, "pairwise_max_iter")),
        )
        for plr in pair_lrs
    }
    scored = OneStandardErrorChoice(
        stopped_model,
        candidates,
        {"pointwise": serving_values, **refined},
        folds=args.select_folds,
        random_state=np.random.default_rng([split_seed, n, run_index, 2]),
    ).fit(train, dict(base, random_state=seed))
    shown = ["init", "n_components", "learning_rate", "init_std", *extra_keys]
    for candidate, result in zip(candidates, scored.cv_results_):
        method = "DCR " + params_text(candidate, shown)
        for name, mean in result["mean_scores"].items():
            label = method if name == "pointwise" else f"Pairwise {method} {name}"
            results.record(label, n, float(mean), log=False)
            results.log(f"N={n} seed {split_seed} run {run_index}: {label}: val ndcg@10 {float(mean):.5f}")


def _print_paired_differences(rows: list[Row], values: dict, n_values) -> None:
    """Paired over runs (same splits and hold-outs for every candidate): the difference to the
    N's best and its standard error, to tell a real preference from a tie."""
    for n in n_values:
        ranked = [r for r in rows if r.setting["N"] == n]
        best = np.asarray(values[(ranked[0].method, n)])
        for r in ranked[1:]:
            diff = np.asarray(values[(r.method, n)]) - best
            se = standard_error(diff)
            print(f"N={n}: {r.method}: {diff.mean():+.5f} ± {se:.5f} (paired SE) vs {ranked[0].method}")


def _sweep_setting(text: str) -> tuple[str, tuple]:
    """``--sweep-set KEY=V1,V2``: a DCR parameter and its candidate values, each read as ``--set`` reads one."""
    key, sep, values = text.partition("=")
    if not sep or not values or key not in [*flat_constraints("dcr"), *DCRVariants.field_names(), *STOPPING]:
        raise SystemExit(f"--sweep-set {text!r}: expected KEY=V1,V2,... with KEY a DCR parameter or variant")
    return key, tuple(parse_value(v) for v in values.split(","))


def params_text(params: dict, keys) -> str:
    return " ".join(f"{k}={params[k]}" for k in keys)


def _grid(text: str, cast=float) -> tuple:
    return tuple(cast(x) for x in text.split(",") if x.strip())


# ------------------------------------------------------------------- I/O
def load_ratings(args: argparse.Namespace) -> Ratings:
    from ordrec.trainer.data.readers import read_input

    data = read_input(
        "ratings",
        args.data,
        args.format,
        skip_bad_lines=args.skip_bad_lines,
        rating_scale=getattr(args, "rating_scale", None),
        feedback=getattr(args, "feedback", "auto"),  # protocols that read interaction logs (topn)
        strength=getattr(args, "strength", None),
    )
    if getattr(data, "skipped_lines", 0):
        print(f"skipped {data.skipped_lines} malformed line(s) of {args.data}", file=sys.stderr)
    return data


def dataset_name(path: str, explicit: str | None) -> str:
    if explicit:
        return explicit
    lowered = os.path.abspath(path).lower()
    for name in ("ml-100k", "ml-10m", "ml-1m", "netflix1m"):
        if name in lowered:
            return name
    return os.path.basename(os.path.dirname(os.path.abspath(path))) or os.path.basename(path)


# ------------------------------------------------------------------ entry
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n-train", default="10,20,50", help="training ratings per user (comma list)")
    parser.add_argument("--pairwise", action="store_true", help="also refine DCR pairwise (Pairwise DCR)")
    parser.add_argument(
        "--variants",
        default="",
        help="named variants beyond the paper, comma list: 'shrunk' (DCR-shrunk: rare items'"
        " factors shrunk when served), 'bias' (DCR-bias: a per-level item bias coordinate)",
    )
    parser.add_argument("--dataset", help="data set name for the rows (default: from the path)")
    add_param_flags(parser, FLAG_CONSTRAINTS, FLAG_HELP, FLAG_HELP)
    parser.add_argument(
        "--stop",
        default="validation",
        choices=("validation", "tol"),
        help="validation: per-level early stopping on the log-likelihood of a validation split"
        " carved from the training ratings, then a refit on all of them for those epoch"
        " counts (default); tol: the training-likelihood rule --tol",
    )
    parser.add_argument(
        "--init-grid",
        default=None,
        help="with --stop validation: starting points to choose from per run by validation"
        " NDCG@10 where >= 10 ratings per user are held out (comma list; default: none,"
        " the protocol's fit for each N); with --sweep: the starting points swept",
    )
    parser.add_argument("--rank-grid", default=None, help="as --init-grid, for the rank (e.g. 40,160,320)")
    parser.add_argument(
        "--select-rule",
        default="best",
        choices=("best", "one-se"),
        help="best validation NDCG@10, or the first candidate within one standard error of it",
    )
    parser.add_argument(
        "--select-folds",
        type=int,
        default=3,
        help="hold-outs of the training ratings: per-level epochs are the median over them,"
        " and the --init-grid/--rank-grid choice averages over them",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="validation-only sweep: for every N and run, fit every candidate of --init-grid x"
        " --rank-grid x --sweep-lr x --sweep-init-std on the --select-folds hold-outs and"
        " print its validation NDCG@10 pooled over runs and folds (test ratings unused)",
    )
    parser.add_argument(
        "--sweep-seeds",
        default=None,
        help="with --sweep: split seeds pooled (comma list; default --seed), e.g. 0,1",
    )
    parser.add_argument(
        "--sweep-pairwise-lr",
        default=None,
        help="with --sweep: also refine every candidate pairwise with these learning rates"
        " (rows 'Pairwise DCR ... pairwise_learning_rate=...')",
    )
    parser.add_argument(
        "--sweep-set",
        action="append",
        metavar="KEY=V1,V2",
        help="with --sweep: another DCR parameter to sweep (repeatable), e.g. order=user,random",
    )
    parser.add_argument(
        "--sweep-lr", default=None, help="with --sweep: learning rates (default: the protocol's)"
    )
    parser.add_argument(
        "--sweep-init-std",
        default=None,
        help="with --sweep: initial noise values (default: the protocol's for each start)",
    )
    parser.add_argument(
        "--pairwise-folds",
        type=int,
        default=5,
        help="with --pairwise: hold-outs of the training ratings on which the refinement must win",
    )
    parser.add_argument(
        "--pairwise-always",
        action="store_true",
        help="with --pairwise: refine unconditionally (the paper's Pairwise DCR) instead of keeping"
        " the refinement only where it raises validation NDCG@10 on hold-outs of the training ratings",
    )
    parser.add_argument(
        "--item-shrinkage",
        type=float,
        default=5.0,
        help="beta of the -shrunk variants (with --tune: the damped mean's tuned beta)",
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="choose lr x reg, the pairwise lr and the shrinkage per run on a validation"
        " split of the training ratings",
    )
    parser.add_argument("--no-references", action="store_true", help="skip the random / item mean rows")
    parser.add_argument(
        "--grid-on-test",
        action="store_true",
        help="diagnostic only: also a row 'DCR (grid best on test)', the best of the paper's"
        " full lr x reg grid judged on the TEST ratings (as the paper reports its figures);"
        " never used to choose anything else",
    )


def fit_for(n: int, args: argparse.Namespace) -> dict:
    """The protocol's fit at ``n`` (``protocol_fit``) with any explicit ``--init``,
    ``--n-components``, ``--init-std``, ``--learning-rate`` or ``--pairwise-learning-rate``."""
    fit = protocol_fit(n)
    if args.init:
        fit["init"] = args.init
        fit["init_std"] = INIT_STD[args.init]
    for key in ("n_components", "init_std", "learning_rate", "pairwise_learning_rate"):
        if getattr(args, key) is not None:
            fit[key] = getattr(args, key)
    return fit


def median_epochs(params: dict, train: Ratings, rng: np.random.Generator, folds: int) -> dict:
    """``params`` with ``level_epochs``: each level's median over ``folds`` hold-outs of the
    validation-stopped epoch (the folds are drawn as ``select`` draws them)."""
    _, variants, stopping = split_params(params)
    epochs = stopped_level_epochs(
        pointwise_params(params), train, rng, folds, variants=variants, stopping=stopping
    )
    return dict(params, level_epochs=epochs)


class _Results:
    """Per-run values by (method, N), logged as they come."""

    def __init__(self, log):
        self.log = log
        self.values: dict[tuple[str, int], list[float]] = {}
        # Per (method, N): whether each run kept its pairwise refinement.
        self.kept: dict[tuple[str, int], list[bool]] = {}

    def record(self, method: str, n: int, value: float, note: str = "", log: bool = True) -> None:
        self.values.setdefault((method, n), []).append(value)
        if log:
            self.log(f"N={n} run {len(self.values[(method, n)]) - 1}: {method} {value:.4f} {note}")

    def rows(self, dataset: str, metric: str = METRIC) -> list[Row]:
        return [
            summarise(method, dataset, {"N": n}, metric, values)
            for (method, n), values in self.values.items()
        ]


@dataclass
class _Plan:
    """What every run fits: the shared settings, the model families, the grids."""

    base: dict
    families: list[Family]
    shrunk: bool
    inits: tuple
    ranks: tuple
    grid: dict
    pair_grid: dict | None


def _plan(args: argparse.Namespace) -> _Plan:
    inits = _grid(args.init_grid, str) if args.init_grid else ()
    unknown_init = set(inits) - set(INIT_STD)
    if unknown_init:
        raise ValueError(f"unknown starting point(s) {sorted(unknown_init)} (known: marginal, random)")
    variants = set(_grid(args.variants, str))
    unknown = variants - {"shrunk", "bias"}
    if unknown:
        raise ValueError(f"unknown variant(s) {sorted(unknown)} (known: shrunk, bias)")
    families = [Family("DCR", {})] + (
        [Family("DCR-bias", {"item_bias": ITEM_BIAS})] if "bias" in variants else []
    )
    return _Plan(
        base=dict(_base_params(args), pairwise_max_iter=setting(args, "pairwise_max_iter")),
        families=families,
        shrunk="shrunk" in variants,
        inits=inits,
        ranks=_grid(args.rank_grid, int) if args.rank_grid else (),
        grid={"learning_rate": TUNE_LR_GRID, "reg": REG_GRID},
        pair_grid=({"pairwise_learning_rate": TUNE_PAIRWISE_LR_GRID} if args.pairwise else None),
    )


def _choices(args: argparse.Namespace, plan: _Plan, fit_n: dict) -> list[dict]:
    """The start x rank candidates at one N (one, the protocol's, without grids)."""

    def std_of(init: str) -> float:
        if args.init_std is not None:
            return args.init_std
        return fit_n["init_std"] if init == fit_n["init"] else INIT_STD[init]

    return [
        dict(init=i, n_components=r, init_std=std_of(i))
        for i in (plan.inits or (fit_n["init"],))
        for r in (plan.ranks or (fit_n["n_components"],))
    ]


def _record_references(
    args: argparse.Namespace,
    results: _Results,
    n: int,
    run_index: int,
    n_items: int,
    train: Ratings,
    test: Ratings,
    beta: float,
) -> None:
    results.record(
        "Random",
        n,
        ndcg_at_k(fixed_scorer(np.random.default_rng([args.seed, n, run_index, 7]).random(n_items)), test),
    )
    results.record("Item mean", n, ndcg_at_k(fixed_scorer(item_means(train, 0.0)), test))
    results.record(
        "Damped item mean", n, ndcg_at_k(fixed_scorer(item_means(train, beta)), test), f"(beta={beta:g})"
    )


def _chosen_params(
    args: argparse.Namespace,
    plan: _Plan,
    choices: list[dict],
    n: int,
    params: dict,
    pair_params: dict,
    train: Ratings,
    val_rng: np.random.Generator,
    log,
) -> tuple[dict, dict]:
    """The family's fit for this run: tuned, selected, or with validation-chosen epochs."""
    if args.tune:
        return tune(train, val_rng, params, plan.grid, plan.pair_grid, log, stop=args.stop)
    if args.stop == "validation" and len(choices) > 1 and held_out(n) >= K:
        # Starting point and rank chosen per run by validation NDCG@10; each
        # candidate's per-level epochs by validation log-likelihood.
        return select(params, choices, train, val_rng, args.select_folds, log, args.select_rule), pair_params
    if args.stop == "validation":
        # Per-level epoch counts chosen on hold-outs of the training ratings (the
        # median over --select-folds of them), then a refit on all N.
        return median_epochs(params, train, val_rng, args.select_folds), pair_params
    return params, pair_params


def _record_family(
    args: argparse.Namespace,
    plan: _Plan,
    results: _Results,
    prefix: str,
    n: int,
    params: dict,
    pair_params: dict,
    shrinkage: float,
    train: Ratings,
    test: Ratings,
) -> None:
    """Fit one family and record it, its shrunk serving and its pairwise refinement."""
    model = fit_dcr(params, train)
    epochs = params.get("level_epochs") or model.epochs_run_
    results.record(
        prefix,
        n,
        index_ndcg(model, test),
        f"({params_text(params, ['init', 'learning_rate', 'reg', 'n_components'])} epochs={epochs})",
    )
    if plan.shrunk:
        results.record(
            prefix + "-shrunk",
            n,
            index_ndcg(model, test, item_shrinkage=shrinkage),
            f"(item_shrinkage={shrinkage:g})",
        )
    if args.pairwise:
        refined = _pairwise(
            args, results, prefix, n, model, refinement_for(params, model, **pair_params), train, test
        )
        if plan.shrunk:
            results.record(
                "Pairwise " + prefix + "-shrunk",
                n,
                index_ndcg(refined, test, item_shrinkage=shrinkage),
                f"(item_shrinkage={shrinkage:g})",
            )


def _pairwise(
    args: argparse.Namespace,
    results: _Results,
    prefix: str,
    n: int,
    model: DCR,
    refinement: PairwiseDCR,
    train: Ratings,
    test: Ratings,
) -> DCR:
    """The ``Pairwise prefix`` row: the ``refinement`` kept only where it raises validation
    NDCG@10 on hold-outs of the training ratings (``ValidatedRefinement.refine``), else the
    pointwise model; ``--pairwise-always`` refines unconditionally (the paper's). With
    validation, the unconditional refinement is also recorded (``... (always refined)``)."""
    note = f"pairwise_learning_rate={refinement.learning_rate}"
    always = refinement.refined(model)
    if args.pairwise_always:
        results.record("Pairwise " + prefix, n, index_ndcg(always, test), f"({note})")
        return always
    validated = wrapper("dcr", "pairwise_validation").wrap(
        refinement, {"validation_folds": args.pairwise_folds}
    )
    chosen = validated.refine(model, train)
    point, pair, se = chosen.val_scores_
    verdict = "kept" if chosen.kept_ else "dropped, pointwise model served"
    results.record(
        "Pairwise " + prefix,
        n,
        index_ndcg(always if chosen.kept_ else model, test),
        f"({note}; refinement {verdict}: val ndcg@10 {point:.4f} -> {pair:.4f}, gain SE {se:.4f})",
    )
    results.kept.setdefault(("Pairwise " + prefix, n), []).append(bool(chosen.kept_))
    results.record(f"Pairwise {prefix} (always refined)", n, index_ndcg(always, test), f"({note})")
    return always if chosen.kept_ else model


def _protocol_run(
    args: argparse.Namespace,
    plan: _Plan,
    results: _Results,
    data: Ratings,
    n: int,
    run_index: int,
    choices: list[dict],
    n_base: dict,
) -> None:
    """One run at one N: its split, the references, and every family."""
    rng = np.random.default_rng([args.seed, n, run_index])
    train, test = per_user_split(data, n, rng)
    started = time.perf_counter()
    beta = tune_shrinkage(train, np.random.default_rng([args.seed, n, run_index, 1]))
    shrinkage = beta if args.tune else args.item_shrinkage
    if not args.no_references:
        _record_references(args, results, n, run_index, data.n_items, train, test, beta)
    for family in plan.families:
        seed = int(rng.integers(2**31 - 1))
        val_rng = np.random.default_rng([args.seed, n, run_index, 2])
        params, pair_params = _chosen_params(
            args,
            plan,
            choices,
            n,
            dict(n_base, **family.params, random_state=seed),
            {"pairwise_learning_rate": n_base["pairwise_learning_rate"]},
            train,
            val_rng,
            results.log,
        )
        if args.grid_on_test and family.prefix == "DCR":
            results.record(
                "DCR (grid best on test)",
                n,
                grid_best_on_test(dict(n_base, random_state=seed), train, test, args.stop, val_rng),
                "(diagnostic: chosen on test)",
            )
        _record_family(args, plan, results, family.prefix, n, params, pair_params, shrinkage, train, test)
    results.log(f"N={n} run {run_index}: {time.perf_counter() - started:.1f} s")


def _paper_figures(name: str, n_values) -> list[PaperFigure]:
    paper = [
        PaperFigure("DCR", {"N": n}, METRIC, v) for n, v in PAPER_DCR.get(name, {}).items() if n in n_values
    ]
    return paper + [
        PaperFigure("Pairwise DCR", {"N": n}, METRIC, v)
        for n, v in PAPER_PAIRWISE.get(name, {}).items()
        if n in n_values
    ]


def run(args: argparse.Namespace) -> list[Row]:
    given_params(args, "DCR", FLAG_CONSTRAINTS, FLAG_HELP)  # a bad value names its parameter
    data = load_ratings(args)
    name = dataset_name(args.data, args.dataset)
    n_values = _grid(args.n_train, int)
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if not args.quiet else (lambda msg: None)
    if args.sweep:
        return sweep(args, data, name, n_values, log)
    plan = _plan(args)
    results = _Results(log)
    for n in n_values:
        fit_n = fit_for(n, args)
        choices = _choices(args, plan, fit_n)
        # With explicit grids, the first candidate is fitted where no choice is made.
        n_base = dict(dict(plan.base, **fit_n), **choices[0])
        log(
            f"N={n}: {params_text(fit_n, sorted(fit_n))}"
            + (f"; start x rank chosen per run from {len(choices)} candidates" if len(choices) > 1 else "")
        )
        for run_index in range(args.runs):
            _protocol_run(args, plan, results, data, n, run_index, choices, n_base)
    for (method, n), kept in results.kept.items():
        print(f"N={n}: {method}: refinement kept in {sum(kept)} of {len(kept)} runs (validation NDCG@10)")
    rows = results.rows(name)
    rows.sort(key=lambda r: (r.setting["N"], r.method))
    print_table(
        rows,
        _paper_figures(name, n_values),
        out=sys.stdout,
        title=f"DCR protocol on {name}: NDCG@10, N training ratings per user"
        f" ({args.runs} runs; paper: Hu & Li 2017, Table 2). The paper's objective"
        " (unrated_share=0: only the rated items are ordered); the top-N model Recommend"
        " serves by default is measured by `reproduce topn`",
    )
    return rows
